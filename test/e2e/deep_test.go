package e2e

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// tenMillion is the nesting of the regression bodies: 8 million levels crashed the process
// (gjson's validator recursed once per level; a Go stack overflow cannot be recovered).
const tenMillion = 10_000_000

// TestDeeplyNestedJSON: a client body or an upstream answer nested ten million levels deep gets an
// OpenAI-shaped error, and the same process serves the next request. Before the fix, each of these
// ended the proxy with "fatal error: stack overflow".
func TestDeeplyNestedJSON(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(t)
	up.Script(runUserCode)
	target, err := url.Parse(up.URL())
	if err != nil {
		t.Fatal(err)
	}
	target.Path = "" // the proxy already asks for /v1/...
	normal := httputil.NewSingleHostReverseProxy(target)
	deep := bytes.Repeat([]byte("["), tenMillion)

	// The upstream answers the next intercepted call according to mode, then behaves again.
	var mode atomic.Value
	mode.Store("")
	hostile := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Swap("").(string) {
		case "json":
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"id":"resp_1","object":"response","status":"completed","output":`))
			_, _ = w.Write(deep)
		case "sse first":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte("event: response.created\ndata: {\"type\":\"response.created\",\"response\":"))
			_, _ = w.Write(deep)
			_, _ = w.Write([]byte("\n\n"))
		case "sse later":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n"))
			_, _ = w.Write([]byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":"))
			_, _ = w.Write(deep)
			_, _ = w.Write([]byte("}\n\n"))
		default:
			normal.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(hostile.Close)
	p := startProxy(t, setup{Upstream: hostile.URL + "/v1"}.yaml())

	ci := `"tools":[{"type":"code_interpreter","container":{"type":"auto"}}]`
	ordinary := map[string]string{
		"/v1/responses":        `{"model":"` + clientModel + `",` + ci + `,"input":"print(6*7)"}`,
		"/v1/chat/completions": `{"model":"` + clientModel + `","messages":[{"role":"user","content":"hi"}]}`,
	}
	servesNext := func(t *testing.T, path string) {
		t.Helper()
		if !p.Alive(t) {
			t.FailNow()
		}
		if resp := do(t, "POST", p.URL+path, []byte(ordinary[path])); resp.Status != http.StatusOK {
			t.Errorf("the next request to %s: status %d: %.300s", path, resp.Status, resp.Body)
		}
	}

	t.Run("client body", func(t *testing.T) {
		for _, path := range []string{"/v1/responses", "/v1/chat/completions"} {
			for name, prefix := range map[string]string{
				"bare":      "",
				"json":      `{"model":"` + clientModel + `","input":`,
				"streamed":  `{"model":"` + clientModel + `","stream":true,` + ci + `,"input":`,
				"in a tool": `{"model":"` + clientModel + `","input":"hi","tools":[{"type":"code_interpreter","container":`,
			} {
				body := append([]byte(prefix), deep...)
				resp := do(t, "POST", p.URL+path, body)
				if resp.Status != http.StatusBadRequest {
					t.Errorf("%s %s: status %d, want 400: %.200s", path, name, resp.Status, resp.Body)
				}
				typ, _, msg := apiError(t, resp.Body)
				if typ != "invalid_request_error" || !strings.Contains(msg, "nests deeper than") {
					t.Errorf("%s %s: error %q %q, want invalid_request_error about nesting", path, name, typ, msg)
				}
				servesNext(t, path)
			}
		}
	})

	t.Run("client body sent chunked", func(t *testing.T) {
		// No declared length: the body arrives in chunks and is read to the limit first.
		body := io.MultiReader(strings.NewReader(`{"model":"`+clientModel+`","stream":true,`+ci+`,"input":`), bytes.NewReader(deep))
		req, err := http.NewRequestWithContext(ctx(t, time.Minute), "POST", p.URL+"/v1/responses", body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = -1
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("status %d, want 400: %.200s", resp.StatusCode, b)
		}
		apiError(t, b)
		servesNext(t, "/v1/responses")
	})

	t.Run("upstream answer", func(t *testing.T) {
		for _, tc := range []struct {
			mode, stream string
			status       int
		}{
			{"json", "false", http.StatusBadGateway},
			{"sse first", "true", http.StatusBadGateway},
			// The stream has begun when the deep event arrives: the error event and
			// response.failed end it.
			{"sse later", "true", http.StatusOK},
		} {
			mode.Store(tc.mode)
			body := `{"model":"` + clientModel + `","stream":` + tc.stream + `,` + ci + `,"input":"print(1)"}`
			resp := do(t, "POST", p.URL+"/v1/responses", []byte(body))
			if resp.Status != tc.status {
				t.Errorf("%s: status %d, want %d: %.300s", tc.mode, resp.Status, tc.status, resp.Body)
			}
			if tc.status == http.StatusOK {
				for _, want := range []string{"event: error", "event: response.failed", `"code":"upstream_error"`} {
					if !bytes.Contains(resp.Body, []byte(want)) {
						t.Errorf("%s: the stream lacks %s:\n%.1000s", tc.mode, want, resp.Body)
					}
				}
			} else if typ, code, _ := apiError(t, resp.Body); code != "upstream_error" {
				t.Errorf("%s: error %q %q, want code upstream_error", tc.mode, typ, code)
			}
			servesNext(t, "/v1/responses")
		}
	})
}
