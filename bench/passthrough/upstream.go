package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
)

// upstream is an in-process OpenAI-like server whose answers are prepared once, so that it costs
// as little as possible on both sides of the comparison.
type upstream struct {
	Addr string
	srv  *http.Server
}

func (u *upstream) Close() { _ = u.srv.Close() }

func startUpstream() (*upstream, error) {
	respJSON := []byte(`{"id":"resp_bench","object":"response","created_at":1757600000,"status":"completed","error":null,"incomplete_details":null,"instructions":null,"model":"bench-upstream","output":[{"id":"msg_bench","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello there, nice to meet.","annotations":[],"logprobs":[]}]}],"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"temperature":1.0,"top_p":1.0,"metadata":{},"usage":{"input_tokens":12,"output_tokens":7,"total_tokens":19}}`)
	chatJSON := []byte(`{"id":"chatcmpl-bench","object":"chat.completion","created":1757600000,"model":"bench-upstream","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, nice to meet.","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}`)
	var events [][]byte
	seq := 0
	add := func(typ, rest string) {
		events = append(events, fmt.Appendf(nil, "event: %s\ndata: {\"type\":%q,\"sequence_number\":%d,%s}\n\n", typ, typ, seq, rest))
		seq++
	}
	add("response.created", `"response":{"id":"resp_bench","object":"response","status":"in_progress","model":"bench-upstream","output":[]}`)
	add("response.in_progress", `"response":{"id":"resp_bench","object":"response","status":"in_progress","model":"bench-upstream","output":[]}`)
	add("response.output_item.added", `"output_index":0,"item":{"id":"msg_bench","type":"message","status":"in_progress","content":[],"role":"assistant"}`)
	add("response.content_part.added", `"item_id":"msg_bench","output_index":0,"content_index":0,"part":{"type":"output_text","annotations":[],"logprobs":[],"text":""}`)
	for i := 0; len(events) < 17; i++ {
		add("response.output_text.delta", fmt.Sprintf(`"item_id":"msg_bench","output_index":0,"content_index":0,"delta":"word%d ","logprobs":[],"obfuscation":"Xy12"`, i))
	}
	add("response.output_text.done", `"item_id":"msg_bench","output_index":0,"content_index":0,"text":"...","logprobs":[]`)
	add("response.output_item.done", `"output_index":0,"item":{"id":"msg_bench","type":"message","status":"completed","content":[],"role":"assistant"}`)
	add("response.completed", `"response":{"id":"resp_bench","object":"response","status":"completed","model":"bench-upstream","output":[]}`)
	if len(events) != 20 {
		panic(fmt.Sprintf("%d events; want 20", len(events)))
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/responses", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !bytes.Contains(body, []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(respJSON)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for _, ev := range events {
			_, _ = w.Write(ev)
			_ = rc.Flush()
		}
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(chatJSON)
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, strings.TrimSpace("no such path "+r.URL.Path), http.StatusNotFound)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	return &upstream{Addr: ln.Addr().String(), srv: srv}, nil
}
