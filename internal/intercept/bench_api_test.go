package intercept

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/upstream"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// The cost of serving /v1/responses over a Chat Completions upstream, against the native
// Responses path in the same run: both go through the engine and a real *upstream.Target whose
// transport answers from recorded bodies at once (no sockets), so the difference between the two
// is the chat seam's translation, request and answer.

// cannedTransport answers each round trip with the next recorded body.
type cannedTransport struct {
	mu     sync.Mutex
	bodies [][]byte
	n      int
	ct     string
}

func (c *cannedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	c.mu.Lock()
	b := c.bodies[c.n%len(c.bodies)]
	c.n++
	c.mu.Unlock()
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {c.ct}}, Body: io.NopCloser(bytes.NewReader(b)), Request: r}, nil
}

// recordChat returns a scripted chat server's answer (vLLM's shapes) to one turn.
func recordChat(b testing.TB, stream bool, turn upstreamtest.Turn) []byte {
	b.Helper()
	up := upstreamtest.New(b, upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM))
	up.Enqueue(turn)
	body := `{"model":"m","messages":[{"role":"user","content":"x"}]}`
	if stream {
		body = `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}`
	}
	resp, err := http.Post(up.URL()+"/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	up.Close()
	return out
}

// apiBench is one side of the comparison: the seam over a canned transport, and the request
// the router would hand over.
type apiBench struct {
	name string
	chat bool
}

var apiBenches = []apiBench{{"responses", false}, {"chat", true}}

// request returns the engine's Request for body, its upstream answering the recorded bodies.
func (a apiBench) request(cfg *config.Config, body []byte, bodies [][]byte, stream bool) (*Request, func()) {
	ct := "application/json"
	if stream {
		ct = "text/event-stream"
	}
	client := upstream.NewClient(upstream.ClientOptions{Transport: &cannedTransport{bodies: bodies, ct: ct}})
	dep := config.Deployment{ModelName: "m", Provider: "hosted_vllm", UpstreamModel: "m-up", APIBase: "http://upstream.invalid/v1", API: config.APIResponses}
	if a.chat {
		dep.API = config.APIChatCompletions
	}
	target := client.Target([]config.Deployment{dep})
	req := &Request{Config: cfg, Body: body, Upstream: target, Provider: "hosted_vllm", Caller: "bench"}
	if a.chat {
		req.Upstream, req.Stateless = upstream.NewChatAPI(target, upstream.ChatOptionsFor(dep)), true
	}
	return req, client.CloseIdleConnections
}

// BenchmarkRequestByAPI measures one intercepted request through the engine: a turn that calls
// the stand-in (with reasoning), the code run in an instant sandbox, and a text answer; two
// upstream calls. The chat side's extra ns/op is the translation's cost per request.
func BenchmarkRequestByAPI(b *testing.B) {
	callTurn := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Reasoning("thinking"), call("import math\nprint(math.pi * 2)\nresult = [i * i for i in range(10)]\nresult")}}
	textTurn := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("The answer is 42, as computed above.")}}
	for _, stream := range []bool{false, true} {
		for _, a := range apiBenches {
			b.Run(a.name+"/"+map[bool]string{false: "json", true: "stream"}[stream], func(b *testing.B) {
				var bodies [][]byte
				if a.chat {
					bodies = [][]byte{recordChat(b, stream, callTurn), recordChat(b, stream, textTurn)}
				} else {
					bodies = [][]byte{record(b, stream, callTurn), record(b, stream, textTurn)}
				}
				e, cfg, done := benchEngine(b)
				defer done()
				reqBody := []byte(`{"model":"m","instructions":"Use python for arithmetic.","input":"compute","tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"include":["code_interpreter_call.outputs"],"stream":` + map[bool]string{false: "false", true: "true"}[stream] + `}`)
				req, closeIdle := a.request(cfg, reqBody, bodies, stream)
				defer closeIdle()
				events := 0
				for _, body := range bodies {
					events += max(bytes.Count(body, []byte("\n\n")), 1) // a JSON answer is one
				}
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					w := httptest.NewRecorder()
					r := httptest.NewRequest(http.MethodPost, "/v1/responses", nil)
					if err := serveResponses(e, w, r, req); err != nil || w.Code != 200 {
						b.Fatalf("serve = %v, %d: %s", err, w.Code, w.Body.Bytes())
					}
				}
				b.ReportMetric(float64(events), "upstream-events/op")
			})
		}
	}
}

// BenchmarkStreamEventByAPI measures each streamed upstream event of a long text answer through
// the engine to the client: a Responses upstream's events, or a chat upstream's chunks through
// the translation. ns/event is per upstream event (a chat chunk, or a Responses event); the
// chat side's extra ns/event is the translation's cost per streamed event.
func BenchmarkStreamEventByAPI(b *testing.B) {
	text := strings.Repeat("All work and no play makes a dull proxy. ", 100)
	turn := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text(text)}, TextChunk: 8}
	for _, a := range apiBenches {
		b.Run(a.name, func(b *testing.B) {
			answer := record(b, true, turn)
			if a.chat {
				answer = recordChat(b, true, turn)
			}
			events := bytes.Count(answer, []byte("\n\n"))
			e, cfg, done := benchEngine(b)
			defer done()
			// No code_interpreter tool: the request is served by the engine only for the stateless
			// upstream, so both sides carry one, which the model does not call.
			reqBody := []byte(`{"model":"m","input":"write","tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"stream":true}`)
			req, closeIdle := a.request(cfg, reqBody, [][]byte{answer}, true)
			defer closeIdle()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				w := httptest.NewRecorder()
				r := httptest.NewRequest(http.MethodPost, "/v1/responses", nil)
				if err := serveResponses(e, w, r, req); err != nil || w.Code != 200 {
					b.Fatalf("serve = %v, %d", err, w.Code)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
			b.ReportMetric(float64(events), "events/op")
		})
	}
}
