package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestNoE2BSandboxLeakWhenUpstreamFails: an intercepted request starts its e2b sandbox beside the
// first upstream call. When the upstream fails first (a 429, a 401...), the request ends while the
// create is on its way; e2b creates the sandbox anyway (a create does not stop because its client
// went away), so the proxy must still learn its id and delete it. Here the control plane is reached
// through a forwarder that completes every create at the emulator and answers only once the proxy
// has given up on it (or after 5s): after the proxy stopped, no sandbox may be left in e2b.
func TestNoE2BSandboxLeakWhenUpstreamFails(t *testing.T) {
	t.Parallel()
	emu, _ := newEmulator(t)
	createSeen := make(chan struct{}, 16)
	fwd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		// The emulator finishes the request even when the proxy cancels it, as e2b does.
		out, _ := http.NewRequestWithContext(context.WithoutCancel(r.Context()), r.Method, emu.URL()+r.URL.RequestURI(), bytes.NewReader(body))
		out.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		rb, _ := io.ReadAll(resp.Body)
		if r.Method == http.MethodPost && r.URL.Path == "/sandboxes" {
			createSeen <- struct{}{}
			// Network latency: the answer arrives after the proxy has stopped waiting for it.
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}
		for k, vs := range resp.Header {
			w.Header()[k] = vs
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(rb)
	}))
	t.Cleanup(fwd.Close)

	up := upstreamtest.New(t)
	up.Script(func(req upstreamtest.Request) upstreamtest.Turn {
		// Answer once the sandbox create is under way, as a rate limit answers quickly.
		select {
		case <-createSeen:
		case <-time.After(10 * time.Second):
		}
		return upstreamtest.Turn{Error: upstreamtest.APIError(http.StatusTooManyRequests, "rate_limit_exceeded", "Rate limit reached.", "")}
	})
	cfg := setup{Upstream: up.URL(), Tool: "e2b", E2B: emu, E2BKey: emu.APIKey()}.yaml()
	// The control plane through the forwarder; the data plane directly.
	cfg = string(bytes.Replace([]byte(cfg), []byte("api_base: "+emu.URL()+"\n"), []byte("api_base: "+fwd.URL+"\n"), 1))
	p := startProxy(t, cfg)

	body, _ := json.Marshal(map[string]any{
		"model": clientModel, "input": "print(1)",
		"tools": []any{map[string]any{"type": "code_interpreter", "container": map[string]any{"type": "auto"}}},
	})
	const requests = 3
	for range requests {
		if resp := do(t, "POST", p.URL+"/v1/responses", body); resp.Status != http.StatusTooManyRequests {
			t.Errorf("status %d, want the upstream's 429: %.200s", resp.Status, resp.Body)
		}
	}
	p.Stop()
	if emu.Creates() == 0 {
		t.Fatal("no sandbox was created: the test proves nothing")
	}
	if n := emu.Live(); n != 0 {
		var asked struct {
			Timeout int `json:"timeout"`
		}
		if req, ok := emu.LastRequest("POST /sandboxes"); ok {
			_ = json.Unmarshal(req.Body, &asked)
		}
		t.Errorf("%d of %d e2b sandboxes created for failed requests are still running after the proxy stopped: "+
			"nobody deletes them before e2b's timeout (%ds asked at create)", n, emu.Creates(), asked.Timeout)
	}
}
