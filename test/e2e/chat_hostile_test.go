package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

// chatServer is an upstream whose answers the test writes: the nth POST (from 0) is answered by
// answer, as an event stream unless it sets another Content-Type.
func chatServer(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *httptest.Server {
	t.Helper()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		answer(int(calls.Add(1)-1), w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// chatChunk is one event of a chat stream with one choice.
func chatChunk(delta, finish string) string {
	if finish == "" {
		finish = "null"
	}
	return `data: {"object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + "}]}\n\n"
}

// TestChatHugeArguments: a chat upstream streams one call of the code interpreter's function
// with 150 MiB of arguments. The proxy keeps no more of them than max_code_size and a slack, so
// its peak memory grows by far less than the bytes streamed (it grew by 2.85 GB before the fix),
// and the call is answered as any call over max_code_size: not run, the model told, the
// response completed.
func TestChatHugeArguments(t *testing.T) {
	t.Parallel()
	piece := strings.Repeat("a", 64<<10)
	call := func(args string) string {
		return chatChunk(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"python","arguments":`+args+`}}]}`, "")
	}
	srv := chatServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n > 0 {
			_, _ = io.WriteString(w, chatChunk(`{"content":"too large"}`, `"stop"`)+"data: [DONE]\n\n")
			return
		}
		_, _ = io.WriteString(w, call(`"{\"code\":\""`))
		for range 150 << 20 / len(piece) {
			if _, err := io.WriteString(w, call(`"`+piece+`"`)); err != nil {
				return
			}
		}
		_, _ = io.WriteString(w, call(`"\"}"`)+chatChunk(`{}`, `"tool_calls"`)+"data: [DONE]\n\n")
	})
	p := startProxy(t, setup{Upstream: srv.URL + "/v1", ChatOnly: true}.yaml())
	before := peakRSS(t, p.cmd.Process.Pid)

	body := `{"model":"` + clientModel + `","input":"run it","tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"include":["code_interpreter_call.outputs"]}`
	resp := do(t, "POST", p.URL+"/v1/responses", []byte(body))
	if resp.Status != http.StatusOK {
		t.Fatalf("status %d: %.300s", resp.Status, resp.Body)
	}
	growth := peakRSS(t, p.cmd.Process.Pid) - before
	t.Logf("peak RSS grew by %d MiB", growth>>20)
	if growth > 128<<20 {
		t.Errorf("the proxy's peak memory grew by %d MiB for 150 MiB of arguments; want O(max_code_size), under 128 MiB", growth>>20)
	}
	var r struct {
		Status string
		Output []struct {
			Type, Status string
			Code         string
			Outputs      []struct{ Logs string }
		}
	}
	if err := json.Unmarshal(resp.Body, &r); err != nil {
		t.Fatal(err)
	}
	if r.Status != "completed" || len(r.Output) == 0 || r.Output[0].Type != "code_interpreter_call" || r.Output[0].Status != "failed" {
		t.Fatalf("response %.500s; want completed, with a failed code_interpreter_call first", resp.Body)
	}
	if o := r.Output[0].Outputs; len(o) != 1 || !strings.Contains(o[0].Logs, "max_code_size") {
		t.Errorf("call outputs %+v; want the code size limit named", o)
	}
}

// TestUpstreamInvalidUTF8: invalid UTF-8 from an upstream (a chat server's content, reasoning and
// arguments, JSON and streamed; a Responses server's events on the intercepted path) reaches the
// client as U+FFFD: every byte the client gets is valid UTF-8, and every answer and event valid
// JSON.
func TestUpstreamInvalidUTF8(t *testing.T) {
	t.Parallel()
	const bad = "ok\xff\xfe\xc3(end"
	chatStream := chatChunk(`{"reasoning_content":"`+bad+`"}`, "") + chatChunk(`{"content":"`+bad+`"}`, "") +
		chatChunk(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"lookup","arguments":"{\"q\":\"`+bad+`\"}"}}]}`, `"tool_calls"`) +
		"data: [DONE]\n\n"
	chatJSON := `{"object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"` + bad + `","reasoning_content":"` + bad + `"}}]}`
	native := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"" + bad + "\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"id\":\"msg_1\",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"annotations\":[],\"text\":\"" + bad + "\"}]}]}}\n\n"
	for _, tt := range []struct {
		name     string
		chatOnly bool
		ct, body string
	}{
		{"chat stream", true, "text/event-stream", chatStream},
		{"chat JSON", true, "application/json", chatJSON},
		{"Responses stream, intercepted", false, "text/event-stream", native},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := chatServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", tt.ct)
				_, _ = io.WriteString(w, tt.body)
			})
			p := startProxy(t, setup{Upstream: srv.URL + "/v1", ChatOnly: tt.chatOnly}.yaml())
			for _, stream := range []bool{false, true} {
				body := fmt.Sprintf(`{"model":"%s","input":"hi","stream":%v,"tools":[{"type":"code_interpreter","container":{"type":"auto"}},{"type":"function","name":"lookup","parameters":{}}]}`, clientModel, stream)
				resp := do(t, "POST", p.URL+"/v1/responses", []byte(body))
				if resp.Status != http.StatusOK {
					t.Fatalf("stream %v: status %d: %.300s", stream, resp.Status, resp.Body)
				}
				if !utf8.Valid(resp.Body) {
					t.Errorf("stream %v: the client got invalid UTF-8: %q", stream, resp.Body)
				}
				if !bytes.Contains(resp.Body, []byte("ok\uFFFD")) && !bytes.Contains(resp.Body, []byte(`ok\ufffd`)) {
					t.Errorf("stream %v: no U+FFFD in place of the bad bytes: %.500s", stream, resp.Body)
				}
				docs := [][]byte{resp.Body}
				if stream {
					docs = nil
					for line := range bytes.SplitSeq(resp.Body, []byte("\n")) {
						if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
							docs = append(docs, d)
						}
					}
				}
				for _, d := range docs {
					if !json.Valid(d) {
						t.Errorf("stream %v: not JSON: %.300s", stream, d)
					}
				}
			}
		})
	}
}

// TestStalledUpstream: an upstream that stalls after its headers is given up after
// router_settings.stream_idle_timeout, instead of holding the request, its container lease and
// its concurrency slot until the client gives up: an intercepted or translated request gets a
// 504 upstream_timeout before its first byte, or the error event and response.failed once its
// stream started. The guard is the client's own deadline, far beyond the idle timeout.
func TestStalledUpstream(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		chatOnly bool
		sent     string // before the stall
	}{
		{"chat", true, chatChunk(`{"content":"thinking"}`, "")},
		{"Responses, intercepted", false, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := chatServer(t, func(_ int, w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, tt.sent)
				w.(http.Flusher).Flush()
				<-r.Context().Done() // never more, until the proxy gives the call up
			})
			p := startProxy(t, setup{Upstream: srv.URL + "/v1", ChatOnly: tt.chatOnly}.yaml()+"router_settings:\n  stream_idle_timeout: 200ms\n")
			c := ctx(t, 60*time.Second)
			for _, stream := range []bool{false, true} {
				body := fmt.Sprintf(`{"model":"%s","input":"hi","stream":%v,"tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`, clientModel, stream)
				req, err := http.NewRequestWithContext(c, "POST", p.URL+"/v1/responses", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatalf("stream %v: %v", stream, err)
				}
				b, err := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if err != nil {
					t.Fatalf("stream %v: reading: %v (the client's deadline: %v)", stream, err, c.Err())
				}
				if !stream {
					if resp.StatusCode != http.StatusGatewayTimeout {
						t.Errorf("status %d: %.300s; want 504", resp.StatusCode, b)
					} else if _, code, _ := apiError(t, b); code != "upstream_timeout" {
						t.Errorf("code %q; want upstream_timeout", code)
					}
					continue
				}
				if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte("event: error")) || !bytes.Contains(b, []byte("event: response.failed")) ||
					!bytes.Contains(b, []byte(`"upstream_timeout"`)) {
					t.Errorf("stream: status %d: %.1000s; want the error event (upstream_timeout) and response.failed", resp.StatusCode, b)
				}
			}
		})
	}
}
