package chat

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sse"
)

// The translation's cost against the native path, in the same run: a Responses upstream's
// events pass through the SSE reader and the engine reads each one's type; a chat upstream's
// chunks pass through the same reader and then the translator. ns/event is per upstream event.

// benchChatText is a 20-chunk chat stream shaped like benchSSE's answer: a role chunk, 17 text
// deltas, the finish chunk and the usage chunk, then [DONE].
func benchChatText() string {
	var b strings.Builder
	head := `data: {"id":"chatcmpl-8f1c","object":"chat.completion.chunk","created":1767225600,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":`
	b.WriteString(head + `{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	for i := 1; i < 18; i++ {
		fmt.Fprintf(&b, head+`{"content":"word%d "},"logprobs":null,"finish_reason":null}]}`+"\n\n", i)
	}
	b.WriteString(head + `{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}` + "\n\n")
	b.WriteString(`data: {"id":"chatcmpl-8f1c","object":"chat.completion.chunk","created":1767225600,"model":"Qwen/Qwen3-8B","choices":[],"usage":{"prompt_tokens":12,"total_tokens":30,"completion_tokens":18}}` + "\n\n")
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// benchChatCalls is a chat stream of two calls of 8 argument pieces each, as vLLM streams them.
func benchChatCalls() string {
	var b strings.Builder
	head := `data: {"id":"chatcmpl-b2","object":"chat.completion.chunk","created":1767225600,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":`
	b.WriteString(head + `{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	for call := range 2 {
		fmt.Fprintf(&b, head+`{"tool_calls":[{"id":"chatcmpl-tool-%d","type":"function","index":%d,"function":{"name":"python"}}]},"logprobs":null,"finish_reason":null}]}`+"\n\n", call, call)
		pieces := []string{`{\"code\": \"`, `import `, `math\\n`, `print(`, `math.`, `sqrt(`, `2))`, `\"}`}
		for _, p := range pieces {
			fmt.Fprintf(&b, head+`{"tool_calls":[{"index":%d,"function":{"arguments":"%s"}}]},"logprobs":null,"finish_reason":null}]}`+"\n\n", call, p)
		}
	}
	b.WriteString(head + `{},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null}]}` + "\n\n")
	b.WriteString(`data: {"id":"chatcmpl-b2","object":"chat.completion.chunk","created":1767225600,"model":"Qwen/Qwen3-8B","choices":[],"usage":{"prompt_tokens":300,"total_tokens":340,"completion_tokens":40}}` + "\n\n")
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

const benchChatRequestBody = `{"model":"qwen","instructions":"You are a helpful assistant. Use the python tool for any calculation.",` +
	`"input":[{"role":"user","content":[{"type":"input_text","text":"What is the square root of two, to ten places?"}]},` +
	`{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"I should compute it."}]},` +
	`{"type":"function_call","call_id":"call_1","name":"python","arguments":"{\"code\":\"import math\\nprint(math.sqrt(2))\"}"},` +
	`{"type":"function_call_output","call_id":"call_1","output":"1.4142135623730951\n"},` +
	`{"role":"assistant","content":[{"type":"output_text","text":"It is 1.4142135624.","annotations":[]}]},` +
	`{"role":"user","content":"And of three?"}],` +
	`"tools":[{"type":"function","name":"python","description":"Run Python code in a stateful Jupyter-like kernel. Variables, imports and files persist between calls in this conversation. The value of the last expression is shown, as in a notebook cell, together with anything printed to stdout or stderr and the traceback of an exception. matplotlib figures are rendered and returned to the user as images. Files are read from and written to /mnt/data. There is no internet access.",` +
	`"parameters":{"type":"object","properties":{"code":{"type":"string","description":"The Python code to run in the kernel."}},"required":["code"],"additionalProperties":false},"strict":true},` +
	`{"type":"function","name":"get_weather","description":"Weather for a city.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}],` +
	`"tool_choice":"auto","parallel_tool_calls":true,"max_output_tokens":2048,"temperature":0.2,"store":false,"include":["reasoning.encrypted_content"],"reasoning":{"effort":"medium"},"stream":true}`

const benchChatCompletion = `{"id":"chatcmpl-1","object":"chat.completion","created":1767225600,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"message":{"role":"assistant",` +
	`"reasoning_content":"The user wants sqrt(3). I will run it.","content":"Let me compute that.","tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"python","arguments":"{\"code\": \"import math\\nprint(math.sqrt(3))\"}"}}]},` +
	`"logprobs":null,"finish_reason":"tool_calls","stop_reason":null}],"usage":{"prompt_tokens":420,"total_tokens":470,"completion_tokens":50,"prompt_tokens_details":{"cached_tokens":256}},"prompt_logprobs":null}`

// benchEvents runs fn once per op over a stream of n events and reports ns/event.
func benchEvents(b *testing.B, stream string, fn func(r *sse.Reader) int) {
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	rd := strings.NewReader(stream)
	events := 0
	for b.Loop() {
		rd.Reset(stream)
		events += fn(sse.NewReader(rd))
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
}

// benchResponsesSSE is a 20-event stream shaped like a short Responses API answer (the stream of
// upstream's pass-through benchmarks).
func benchResponsesSSE() string {
	var b strings.Builder
	b.WriteString("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n")
	for i := 1; i < 19; i++ {
		fmt.Fprintf(&b, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":%d,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"word%d \"}\n\n", i, i)
	}
	b.WriteString("event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":19,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\"}}\n\n")
	return b.String()
}

// BenchmarkResponsesSSEBaseline is the native path: a Responses upstream's 20 events read and
// typed, as the engine does before translating them.
func BenchmarkResponsesSSEBaseline(b *testing.B) {
	stream := benchResponsesSSE()
	benchEvents(b, stream, func(r *sse.Reader) int {
		n := 0
		for {
			ev, err := r.Next()
			if err != nil {
				break
			}
			if gjson.GetBytes(ev.Data, "type").String() == "" {
				b.Fatal("no type")
			}
			n++
		}
		return n
	})
}

// BenchmarkChatStream is the chat path: the same reader, then Stream, for a text answer and
// for two streamed calls. Each op builds the translator too, so response.created and the final
// Response are counted in.
func BenchmarkChatStream(b *testing.B) {
	req, err := NewRequest([]byte(`{"model":"m","input":"hi","stream":true}`), Options{})
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct{ name, stream string }{{"text", benchChatText()}, {"calls", benchChatCalls()}} {
		b.Run(tc.name, func(b *testing.B) {
			benchEvents(b, tc.stream, func(r *sse.Reader) int {
				s := req.NewStream("resp_bench", 1767225600)
				n := 0
				for {
					ev, err := r.Next()
					if err == io.EOF {
						break
					}
					if _, err := s.Next(ev.Data); err != nil {
						b.Fatal(err)
					}
					n++
				}
				if !s.Done() {
					b.Fatal("stream not done")
				}
				return n
			})
		})
	}
}

// BenchmarkChatStreamDelta is the steady state: one text delta chunk, translated.
func BenchmarkChatStreamDelta(b *testing.B) {
	req, err := NewRequest([]byte(`{"model":"m","input":"hi","stream":true}`), Options{})
	if err != nil {
		b.Fatal(err)
	}
	chunk := []byte(`{"id":"chatcmpl-8f1c","object":"chat.completion.chunk","created":1767225600,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"word "},"logprobs":null,"finish_reason":null}]}`)
	args := []byte(`{"id":"chatcmpl-b2","object":"chat.completion.chunk","created":1767225600,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"print("}}]},"logprobs":null,"finish_reason":null}]}`)
	first := []byte(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"python"}}]}}]}`)
	for _, tc := range []struct {
		name         string
		start, chunk []byte
	}{{"text", chunk, chunk}, {"arguments", first, args}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			var s *Stream
			i := 0
			for b.Loop() {
				if i%256 == 0 {
					// A fresh stream now and then, so the text does not grow without end; its
					// response.created is counted in, spread over 256 chunks.
					s = req.NewStream("resp_bench", 1)
					if _, err := s.Next(tc.start); err != nil {
						b.Fatal(err)
					}
				}
				i++
				if _, err := s.Next(tc.chunk); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkChatRequest is the per-request cost of a JSON exchange: the request translated, and
// the completion translated back.
func BenchmarkChatRequest(b *testing.B) {
	body := []byte(benchChatRequestBody)
	chat := []byte(benchChatCompletion)
	opts := Options{ReasoningField: "reasoning_content"}
	b.Run("request", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := NewRequest(body, opts); err != nil {
				b.Fatal(err)
			}
		}
	})
	// A request carrying a file inline (4 MiB of base64 file_data): what its bytes cost.
	file := []byte(`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"Summarise the file."},` +
		`{"type":"input_file","filename":"f.pdf","file_data":"data:application/pdf;base64,` + strings.Repeat("QUJDRA", 4<<20/6) + `"}]}]}`)
	b.Run("file", func(b *testing.B) {
		b.SetBytes(int64(len(file)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := NewRequest(file, opts); err != nil {
				b.Fatal(err)
			}
		}
	})
	r, err := NewRequest(body, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("response", func(b *testing.B) {
		b.SetBytes(int64(len(chat)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Response(chat, "resp_bench", 1767225600); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("both", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r, err := NewRequest(body, opts)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := r.Response(chat, "resp_bench", 1767225600); err != nil {
				b.Fatal(err)
			}
		}
	})
}
