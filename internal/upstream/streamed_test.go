package upstream

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ciproxy/ciproxy/internal/config"
)

// A streamed body reaches each deployment tried whole, with that deployment's model, and each
// attempt opens its holes again (a failover replays the body from its source, never from a copy).
func TestProxyStreamedReplaysPerAttempt(t *testing.T) {
	failing := newUpstream(t, status(502, `{"error":{"message":"down"}}`))
	ok := newUpstream(t, status(200, `{"id":"resp_1"}`))
	var opens atomic.Int32
	hole := strings.Repeat("0123456789", 10_000)
	body := Streamed{
		JSON: []byte(`{"model":"alias","input":[{"type":"input_file","file_data":"data:text/plain;base64,@A@"},{"text":"@B@"}]}`),
		Holes: []Hole{
			{Mark: "@A@", Size: int64(len(hole)), Open: func(context.Context) (io.ReadCloser, error) {
				opens.Add(1)
				return io.NopCloser(strings.NewReader(hole)), nil
			}},
			{Mark: "@B@", Size: 2, Open: func(context.Context) (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("hi")), nil }},
		},
	}
	c := newTestClient(t, nil)
	deps := []config.Deployment{dep("first-up", failing.URL, ""), dep("second-up", ok.URL, "")}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.Target(deps).ProxyStreamed(w, r, body)
	}))
	defer srv.Close()
	resp, err := plainClient(t).Post(srv.URL+"/v1/responses", "application/json", strings.NewReader("ignored"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for _, u := range []struct {
		up    *testUpstream
		model string
	}{{failing, "first-up"}, {ok, "second-up"}} {
		want := `{"model":"` + u.model + `","input":[{"type":"input_file","file_data":"data:text/plain;base64,` + hole + `"},{"text":"hi"}]}`
		if got := u.up.last(t); string(got.Body) != want {
			t.Errorf("%s got %.120s...; want the body with its holes", u.model, got.Body)
		}
	}
	if n := opens.Load(); n != 2 {
		t.Errorf("the hole was opened %d times; want once per attempt (2)", n)
	}
}

// A mark the body does not hold is an error before anything is sent, not a body without its part.
func TestProxyStreamedMissingMark(t *testing.T) {
	up := newUpstream(t, status(200, `{}`))
	c := newTestClient(t, nil)
	body := Streamed{JSON: []byte(`{"model":"alias"}`), Holes: []Hole{{Mark: "@A@", Size: 1, Open: func(context.Context) (io.ReadCloser, error) {
		return io.NopCloser(strings.NewReader("x")), nil
	}}}}
	rec := httptest.NewRecorder()
	c.Target([]config.Deployment{dep("m", up.URL, "")}).ProxyStreamed(rec, httptest.NewRequest("POST", "/v1/responses", nil), body)
	if rec.Code < 500 || up.hits() != 0 {
		t.Errorf("status %d, %d upstream requests; want an error and none sent", rec.Code, up.hits())
	}
}
