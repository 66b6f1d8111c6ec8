package router

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/intercept"
)

// panicking is an interceptor that panics with value, after writing a partial response if partial.
type panicking struct {
	value   any
	partial bool
}

func (p panicking) Prepare(ctx context.Context, req *intercept.Request) (*intercept.Plan, error) {
	return planned(ctx, nil, req, true, p.Minted)
}
func (panicking) Minted(context.Context, string) (bool, error)                         { return false, nil }
func (panicking) ServeStored(http.ResponseWriter, *http.Request, string, string) error { return nil }
func (panicking) ServeInputItems(http.ResponseWriter, *http.Request, string, string) error {
	return nil
}
func (panicking) ServeCancel(http.ResponseWriter, *http.Request, string, string) error { return nil }

func (p panicking) Serve(w http.ResponseWriter, _ *http.Request, _ *intercept.Plan) error {
	if p.partial {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: response.created\ndata: {}\n\n")
		http.NewResponseController(w).Flush()
	}
	panic(p.value)
}

func TestRecover(t *testing.T) {
	cases := []struct {
		name      string
		value     any
		partial   bool
		want500   bool
		wantPanic bool // a "panic serving request" log line
	}{
		{"panic before writing is a generic 500", "boom: secret-panic-text", false, true, true},
		{"panic with an error value is a generic 500", errors.New("secret-panic-text"), false, true, true},
		{"panic after the response started aborts the connection", "boom: secret-panic-text", true, false, true},
		{"ErrAbortHandler aborts silently", http.ErrAbortHandler, false, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newProxy(t, testConfig("http://127.0.0.1:1/v1"), func(o *Options) { o.Interceptor = panicking{tc.value, tc.partial} })
			resp, err := p.Client().Post(p.URL+"/v1/responses", "application/json", strings.NewReader(`{"model":"gpt-test"}`))
			var body []byte
			if err == nil {
				body, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if tc.want500 {
				if err != nil || resp.StatusCode != http.StatusInternalServerError {
					t.Fatalf("got %v, %v; want a 500", resp, err)
				}
				if _, typ, _, _ := decodeError(t, body); typ != "server_error" || strings.Contains(string(body), "secret-panic-text") {
					t.Errorf("500 body = %s; want a generic server_error", body)
				}
			} else if err == nil {
				t.Fatalf("request succeeded with %d %q; want the connection aborted", resp.StatusCode, body)
			}
			panics := p.logs.FilterMessage("panic serving request").All()
			if got := len(panics) == 1; got != tc.wantPanic {
				t.Errorf("panic log lines = %d; want logged %v", len(panics), tc.wantPanic)
			}
			if tc.wantPanic && panics[0].ContextMap()["stack"] == "" {
				t.Errorf("panic log has no stack")
			}
		})
	}
}
