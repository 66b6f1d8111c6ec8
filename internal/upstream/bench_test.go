package upstream

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ciproxy/ciproxy/internal/config"
)

const benchResponse = `{"id":"resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b","object":"response","created_at":1741476542,` +
	`"status":"completed","error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,` +
	`"model":"gpt-4.1-2025-04-14","output":[{"type":"message","id":"msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b",` +
	`"status":"completed","role":"assistant","content":[{"type":"output_text","text":"In a peaceful grove beneath a silver moon, ` +
	`a unicorn named Lumina discovered a hidden pool that reflected the stars. As she dipped her horn into the water, the pool ` +
	`began to shimmer, revealing a pathway to a magical realm of endless night skies. Filled with wonder, Lumina whispered a ` +
	`wish for all who dream to find their own hidden magic, and as she glanced back, her hoofprints sparkled like stardust.",` +
	`"annotations":[]}]}],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},` +
	`"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1.0,` +
	`"truncation":"disabled","usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,` +
	`"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123},"user":null,"metadata":{}}`

const benchRequest = `{"model":"alias","input":"Tell me a three sentence bedtime story about a unicorn.","stream":false}`

// benchSSE is a 20-event stream shaped like a short Responses API answer.
func benchSSE() []string {
	evs := []string{"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n"}
	for i := 1; i < 19; i++ {
		evs = append(evs, fmt.Sprintf("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":%d,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"word%d \"}\n\n", i, i))
	}
	return append(evs, "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":19,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\"}}\n\n")
}

// benchPair runs the same request against the upstream directly and through Target.Proxy.
func benchPair(b *testing.B, handler http.HandlerFunc) {
	up := httptest.NewServer(handler)
	defer up.Close()
	c := NewClient(ClientOptions{})
	defer c.CloseIdleConnections()
	proxy := proxyServer(b, c, []config.Deployment{dep("gpt-up", up.URL, "sk-up")})
	client := plainClient(b)
	body := []byte(benchRequest)
	for _, tc := range []struct{ name, url string }{
		{"direct", up.URL + "/v1/responses"},
		{"proxy", proxy.URL + "/v1/responses"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Post(tc.url, "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, resp.Body); err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}

func BenchmarkProxyJSON(b *testing.B) {
	benchPair(b, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, benchResponse)
	})
}

func BenchmarkProxySSE20(b *testing.B) {
	events := benchSSE()
	benchPair(b, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for _, ev := range events {
			_, _ = io.WriteString(w, ev)
			_ = rc.Flush()
		}
	})
}

func BenchmarkRewriteModel(b *testing.B) {
	body := []byte(benchRequest)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		_ = rewriteModel(body, "gpt-4.1")
	}
}
