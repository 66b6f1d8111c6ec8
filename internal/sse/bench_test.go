package sse

import (
	"fmt"
	"strings"
	"testing"
)

// benchStream is a 20-event stream shaped like a short Responses API answer.
func benchStream() string {
	var b strings.Builder
	b.WriteString("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n")
	for i := 1; i < 19; i++ {
		fmt.Fprintf(&b, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":%d,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"word%d \"}\n\n", i, i)
	}
	b.WriteString("event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":19,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\"}}\n\n")
	return b.String()
}

func BenchmarkSSEReader(b *testing.B) {
	stream := benchStream()
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	rd := strings.NewReader(stream)
	for b.Loop() {
		rd.Reset(stream)
		r := NewReader(rd)
		n := 0
		for {
			_, err := r.Next()
			if err != nil {
				break
			}
			n++
		}
		if n != 20 {
			b.Fatalf("%d events; want 20", n)
		}
	}
}
