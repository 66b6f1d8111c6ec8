package intercept

import (
	"context"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/testutil"
)

func TestE2BBackend(t *testing.T) { forEachAPI(t, testE2BBackend) }

func testE2BBackend(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api), withE2B(), withConfig(func(c *config.Config) { c.Interception.ContainerIdleTimeout = 0 }))
	h.up.Enqueue(calls("v = 20", "v + 22"), text("42"))
	status, raw := h.post(body(`"stream":true,"include":["code_interpreter_call.outputs"]`), "k")
	if status != 200 {
		t.Fatalf("status %d: %s", status, raw)
	}
	resp := checkStream(t, raw).Response
	if logs := gjson.GetBytes(resp, "output.1.outputs.0.logs").String(); logs != "42" {
		t.Errorf("logs = %q; want 42", logs)
	}
	testutil.Eventually(t, "the e2b sandbox to be deleted", func() bool { return h.e2b.Live() == 0 && h.live() == 0 })

	t.Run("a client that leaves mid-execution leaves no sandbox", func(t *testing.T) {
		h.up.Enqueue(calls("import time; time.sleep(60)"))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		resp := h.do(ctx, body(`"stream":true`), "k")
		readUntil(t, resp.Body, "response.code_interpreter_call.interpreting")
		if n := h.e2b.Live(); n != 1 {
			t.Errorf("e2b sandboxes during the run = %d; want 1", n)
		}
		cancel()
		resp.Body.Close()
		testutil.Eventually(t, "the e2b sandbox to be deleted", func() bool { return h.e2b.Live() == 0 })
	})

	t.Run("a sandbox that cannot be created is sandbox_unavailable", func(t *testing.T) {
		h.e2b.FailNextCreates(3, 500, 0)
		h.up.Enqueue(calls("1"))
		status, raw := h.post(body(""), "k")
		if status != 502 || gjson.GetBytes(raw, "error.code").String() != "sandbox_unavailable" || strings.Contains(string(raw), "python") {
			t.Errorf("answer = %d %s", status, raw)
		}
	})
}
