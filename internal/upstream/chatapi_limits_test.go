package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/upstream/chat"
)

// hostileChat is a chat server whose answer is written piece by piece, never held whole: head,
// then n times piece, then tail.
func hostileChat(t *testing.T, ct, head, piece, tail string, n int) *ChatAPI {
	t.Helper()
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", ct)
		_, _ = io.WriteString(w, head)
		for range n {
			if _, err := io.WriteString(w, piece); err != nil {
				return
			}
		}
		_, _ = io.WriteString(w, tail)
	})
	d := config.Deployment{ModelName: "m", UpstreamModel: "m-up", APIBase: up.URL + "/v1", API: config.APIChatCompletions}
	return NewChatAPI(newTestClient(t, nil).Target([]config.Deployment{d}), chat.Options{MaxCodeSize: 1 << 20})
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestChatAnswerBounded: whatever a chat server streams, the translation keeps O(limit) bytes:
// a call's arguments past max_code_size plus the slack are cut (the call done "incomplete",
// with no more arguments than the limit, in its deltas and its item), and an answer whose text,
// refusal or reasoning goes past maxAnswerKept fails. Tens of MiB go through; what the answer
// holds once read (its state and the events kept) stays far below them.
func TestChatAnswerBounded(t *testing.T) {
	const (
		maxCode = 1 << 20
		limit   = maxCode + chat.ArgsSlack
		mib     = 1 << 20
	)
	piece := strings.Repeat("a", 64<<10)
	call := func(args string) string {
		return `{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"python","arguments":` + args + `}}]}`
	}
	textDelta := func(field string) string { return `{"` + field + `":"` + piece + `"}` }
	for _, tt := range []struct {
		name   string
		stream bool
		head   string // before the pieces
		piece  string // repeated
		n      int
		tail   string
		// The outcome: the call cut (a completed answer), or the answer failed.
		cut bool
	}{
		{name: "streamed arguments", stream: true,
			head: chunk(call(`"{\"code\":\""`), "", ""), piece: chunk(call(`"`+piece+`"`), "", ""), n: 32 * mib / len(piece),
			tail: chunk(call(`"\"}"`), "", "") + chunk(`{}`, `"tool_calls"`, "") + "data: [DONE]\n\n", cut: true},
		{name: "streamed text", stream: true, piece: chunk(textDelta("content"), "", ""), n: 20 * mib / len(piece),
			tail: chunk(`{}`, `"stop"`, "") + "data: [DONE]\n\n"},
		{name: "streamed refusal", stream: true, piece: chunk(textDelta("refusal"), "", ""), n: 20 * mib / len(piece),
			tail: chunk(`{}`, `"stop"`, "") + "data: [DONE]\n\n"},
		{name: "streamed reasoning", stream: true, piece: chunk(textDelta("reasoning_content"), "", ""), n: 20 * mib / len(piece),
			tail: chunk(`{}`, `"stop"`, "") + "data: [DONE]\n\n"},
		{name: "JSON arguments",
			head:  `{"object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","function":{"name":"python","arguments":"{\"code\":\"`,
			piece: piece, n: 32 * mib / len(piece), tail: `\"}"}}]}}]}`, cut: true},
		{name: "JSON text",
			head:  `{"object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"`,
			piece: piece, n: 20 * mib / len(piece), tail: `"}}]}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ct := "application/json"
			if tt.stream {
				ct = "text/event-stream"
			}
			api := hostileChat(t, ct, tt.head, tt.piece, tt.tail, tt.n)
			before := heapInUse()
			body := fmt.Sprintf(`{"model":"m","input":"x","tools":[{"type":"function","name":"python"}],"stream":%v}`, tt.stream)
			ev, err := api.Responses(context.Background(), []byte(body), http.Header{})
			if err == nil {
				defer ev.Close()
			}
			var last []byte
			argDeltas, types := 0, map[string]int{}
			for err == nil {
				var data []byte
				if data, err = ev.Next(); err == nil {
					typ := gjson.GetBytes(data, "type").String()
					types[typ]++
					if typ == "response.function_call_arguments.delta" {
						argDeltas += len(gjson.GetBytes(data, "delta").Str)
					}
					last = data
				}
			}
			held := heapInUse()
			runtime.KeepAlive(ev)
			if growth := int64(held) - int64(before); growth > 16*mib {
				t.Errorf("the answer holds %d MiB once read; want O(limit), under 16 MiB", growth/mib)
			}
			if !tt.cut {
				// The intercept engine renders the error: before any event a 502, else the error
				// event and response.failed.
				if ae := apiErr(err); ae == nil || ae.Status != http.StatusBadGateway || !strings.Contains(ae.Message, "larger than") {
					t.Fatalf("err = %v (events %v); want a 502 naming the answer's size", err, types)
				}
				return
			}
			if !errors.Is(err, io.EOF) {
				t.Fatalf("err = %v; want the answer read to its end", err)
			}
			if typ := gjson.GetBytes(last, "type").String(); typ != "response.completed" {
				t.Fatalf("last event %s; want response.completed", typ)
			}
			item := gjson.GetBytes(last, "response.output.0")
			if item.Get("type").String() != "function_call" || item.Get("status").String() != "incomplete" {
				t.Errorf("call item %.200s; want a function_call with status incomplete", item.Raw)
			}
			if n := len(item.Get("arguments").Str); n <= maxCode || n > limit {
				t.Errorf("the item's arguments are %d bytes; want over max_code_size (%d) and at most %d", n, maxCode, limit)
			}
			if argDeltas > limit {
				t.Errorf("argument deltas carry %d bytes; want at most %d", argDeltas, limit)
			}
		})
	}
}

// surrogateEscape matches a JSON escape of a UTF-16 surrogate, which strict decoders refuse when
// it is lone.
var surrogateEscape = regexp.MustCompile(`\\u[dD][89a-fA-F]`)

// TestChatInvalidUTF8: a chat server's invalid UTF-8 (and escaped lone surrogates) in content,
// refusal, reasoning, tool arguments and an error body never reaches the client: every event and
// error body is valid UTF-8 and valid JSON, the bad bytes turned into U+FFFD.
func TestChatInvalidUTF8(t *testing.T) {
	const bad = "ok\xff\xfe\xc3(end"
	call := func(args string) string {
		return `{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":` + args + `}}]}`
	}
	jsonAnswer := func(message string) string {
		return `{"object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":` + message + `}]}`
	}
	for _, tt := range []struct {
		name, ct, body string
		status         int
	}{
		{"streamed content", "text/event-stream", chunk(`{"content":"`+bad+`"}`, "", "") + chunk(`{"content":"\ud800 lone"}`, `"stop"`, ""), 200},
		{"streamed refusal", "text/event-stream", chunk(`{"refusal":"`+bad+`"}`, `"stop"`, ""), 200},
		{"streamed reasoning", "text/event-stream", chunk(`{"reasoning_content":"`+bad+`"}`, "", "") + chunk(`{"content":"x"}`, `"stop"`, ""), 200},
		{"streamed arguments", "text/event-stream", chunk(call(`"{\"a\":\"`+bad+`\udc00"`), "", "") + chunk(call(`"\"}"`), `"tool_calls"`, ""), 200},
		{"streamed error", "text/event-stream", chunk(`{"content":"x"}`, "", "") + `data: {"error":{"message":"` + bad + `","type":"server_error","param":null,"code":null}}` + "\n\n", 200},
		{"JSON content", "application/json", jsonAnswer(`{"role":"assistant","content":"` + bad + `","reasoning_content":"` + bad + `"}`), 200},
		{"JSON arguments", "application/json", jsonAnswer(`{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":\"` + bad + `\"}"}}]}`), 200},
		{"error body", "application/json", `{"error":{"message":"` + bad + `","type":"invalid_request_error","param":null,"code":null}}`, 400},
		{"error body of another shape", "application/json", `{"object":"error","message":"` + bad + `","type":"BadRequestError","code":400}`, 400},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", tt.ct)
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			})
			d := config.Deployment{ModelName: "m", UpstreamModel: "m-up", APIBase: up.URL + "/v1", API: config.APIChatCompletions}
			api := NewChatAPI(newTestClient(t, nil).Target([]config.Deployment{d}), chat.Options{})
			ev, err := api.Responses(context.Background(), []byte(`{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"stream":true}`), http.Header{})
			var out [][]byte
			if err == nil {
				defer ev.Close()
				for {
					data, err := ev.Next()
					if err != nil {
						break
					}
					out = append(out, data)
				}
			}
			var se *StatusError
			if errors.As(err, &se) {
				out = append(out, se.Body)
			}
			if len(out) == 0 {
				t.Fatalf("nothing to check: err = %v", err)
			}
			replaced := false
			for _, b := range out {
				if !utf8.Valid(b) || !json.Valid(b) || surrogateEscape.Match(b) {
					t.Errorf("not valid UTF-8 JSON: %q", b)
				}
				replaced = replaced || bytes.Contains(b, []byte("ok\uFFFD")) || bytes.Contains(b, []byte(`ok\ufffd`))
			}
			if !replaced {
				t.Errorf("no U+FFFD in place of the bad bytes: %q", out)
			}
		})
	}
}
