package intercept

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestUnseenContainerIsDeleted: a request that fails before any code ran leaves no sandbox behind,
// even with an idle timeout: its id never reached anyone, so nobody could reuse it.
func TestUnseenContainerIsDeleted(t *testing.T) {
	h := newHarness(t, withConfig(func(c *config.Config) { c.Interception.ContainerIdleTimeout = 20 * time.Minute }))
	ready := make(chan struct{})
	// The upstream answers only once the early sandbox exists, so that the release has one.
	h.up.Enqueue(upstreamtest.Turn{Error: upstreamtest.APIError(400, "invalid_value", "Bad input.", "input"), Hold: ready})
	type answer struct {
		status int
		resp   []byte
	}
	done := make(chan answer, 1)
	go func() {
		status, resp := h.post(body(""), "alice")
		done <- answer{status, resp}
	}()
	testutil.Eventually(t, "the early container", func() bool { return h.live() == 1 })
	close(ready)
	a := <-done
	status, resp := a.status, a.resp
	if status != http.StatusBadRequest {
		t.Fatalf("status %d: %s", status, resp)
	}
	testutil.Eventually(t, "the unseen container to be deleted", func() bool { return h.live() == 0 })
}

// TestToolChoiceNoneRunsNoCode: with tool_choice "none" (or allowed_tools without
// code_interpreter) a model that calls the stand-in anyway gets its call shown, not run.
func TestToolChoiceNoneRunsNoCode(t *testing.T) {
	h := newHarness(t)
	for _, choice := range []string{`"none"`, `{"type":"allowed_tools","mode":"auto","tools":[{"type":"function","name":"f"}]}`} {
		t.Run(choice, func(t *testing.T) {
			before := len(h.up.Requests())
			h.up.Enqueue(calls("open('/mnt/data/ran', 'w').write('x'); print('RAN')"))
			status, resp := h.post(body(`"tool_choice":`+choice+`,"include":["code_interpreter_call.outputs"]`), "alice")
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, resp)
			}
			if logs := gjson.GetBytes(resp, "output.0.outputs.#.logs").String(); gjson.GetBytes(resp, "output.0.status").String() == "completed" || strings.Contains(logs, "RAN") {
				t.Errorf("the call ran: %s", gjson.GetBytes(resp, "output.0").Raw)
			}
			if n := len(h.up.Requests()) - before; n != 1 {
				t.Errorf("%d upstream calls; want 1 (the loop stops)", n)
			}
			if ran := h.fake.Codes(); len(ran) != 0 {
				t.Errorf("executed %q; want nothing run", ran)
			}
		})
	}
}

// TestClientOnlyCallsEndTheLoop: an item only the client can answer (a computer call) beside our
// call returns to the client, instead of continuing without its output.
func TestClientOnlyCallsEndTheLoop(t *testing.T) {
	h := newHarness(t)
	before := len(h.up.Requests())
	computer := upstreamtest.RawItem(`{"type":"computer_call","id":"cu_1","call_id":"call_cu","action":{"type":"screenshot"},"pending_safety_checks":[],"status":"completed"}`)
	h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{call("1 + 1"), computer}})
	status, resp := h.post(body(""), "alice")
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, resp)
	}
	if n := len(h.up.Requests()) - before; n != 1 {
		t.Errorf("%d upstream calls; want 1", n)
	}
	if got := types(resp); len(got) != 2 || got[0] != "code_interpreter_call" || got[1] != "computer_call" {
		t.Errorf("output types = %v; want our call and the client's computer_call", got)
	}
}

// TestConversationRefused: the loop cannot run inside a server-side conversation.
func TestConversationRefused(t *testing.T) {
	h := newHarness(t)
	status, resp := h.post(body(`"conversation":"conv_1"`), "alice")
	if status != http.StatusBadRequest || gjson.GetBytes(resp, "error.param").String() != "conversation" {
		t.Errorf("status %d %s; want 400 naming conversation", status, resp)
	}
}
