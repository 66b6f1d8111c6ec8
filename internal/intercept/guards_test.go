package intercept

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestUnseenContainerIsDeleted: a request that fails before any code ran leaves no sandbox behind,
// even with an idle timeout: its id never reached anyone, so nobody could reuse it.
func TestUnseenContainerIsDeleted(t *testing.T) { forEachAPI(t, testUnseenContainerIsDeleted) }

func testUnseenContainerIsDeleted(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api), withConfig(func(c *config.Config) { c.Interception.ContainerIdleTimeout = 20 * time.Minute }))
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
func TestToolChoiceNoneRunsNoCode(t *testing.T) { forEachAPI(t, testToolChoiceNoneRunsNoCode) }

func testToolChoiceNoneRunsNoCode(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api))
	for _, choice := range []string{`"none"`, `{"type":"allowed_tools","mode":"auto","tools":[{"type":"function","name":"f"}]}`} {
		t.Run(choice, func(t *testing.T) {
			before := len(h.up.Requests())
			h.up.Enqueue(calls("open('/mnt/data/ran', 'w').write('x'); print('RAN')"))
			// f is among the tools: a choice naming a tool that is not there is a 400 (OpenAI's and
			// the chat translation's).
			b := `{"model":"gpt-test","input":"compute","tools":[{"type":"code_interpreter","container":{"type":"auto"}},{"type":"function","name":"f","parameters":{}}],` +
				`"tool_choice":` + choice + `,"include":["code_interpreter_call.outputs"]}`
			status, resp := h.post(b, "alice")
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
func TestConversationRefused(t *testing.T) { forEachAPI(t, testConversationRefused) }

func testConversationRefused(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api))
	status, resp := h.post(body(`"conversation":"conv_1"`), "alice")
	if status != http.StatusBadRequest || gjson.GetBytes(resp, "error.param").String() != "conversation" {
		t.Errorf("status %d %s; want 400 naming conversation", status, resp)
	}
}

// TestTooDeepUpstreamJSON: an upstream Response or event nesting deeper than jsondepth.Max is an
// upstream error (a 502 before the first byte, the error event and response.failed after it),
// never handed to gjson's recursive validator.
func TestTooDeepUpstreamJSON(t *testing.T) {
	deep := strings.Repeat("[", jsondepth.Max+1) + strings.Repeat("]", jsondepth.Max+1)
	created := `{"type":"response.created","response":{"id":"up_1","object":"response","status":"in_progress","output":[]}}`
	tests := []struct {
		name   string
		stream bool
		answer string
		status int
	}{
		{"a JSON Response", false, `{"id":"up_1","output":[],"x":` + deep + `}`, http.StatusBadGateway},
		{"the first event", true, "data: " + `{"type":"response.created","x":` + deep + "}\n\n", http.StatusBadGateway},
		{"a later event", true, "data: " + created + "\n\ndata: " + `{"type":"response.output_item.added","x":` + deep + "}\n\n", http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/v1/responses", nil)
			up := &cannedUpstream{bodies: [][]byte{[]byte(tt.answer)}, stream: tt.stream}
			extra := ""
			if tt.stream {
				extra = `"stream":true`
			}
			serveLikeRouter(w, r, func() error {
				return serveResponses(h.eng, w, r, &Request{Config: h.cfg, Upstream: up, Body: []byte(body(extra)), Caller: "k"})
			})
			if w.Code != tt.status {
				t.Fatalf("status = %d %s; want %d", w.Code, w.Body.String(), tt.status)
			}
			if tt.status != http.StatusOK {
				if c := gjson.GetBytes(w.Body.Bytes(), "error.code").String(); c != "upstream_error" {
					t.Errorf("error = %s; want upstream_error", w.Body.String())
				}
				return
			}
			rep := checkStream(t, w.Body.Bytes())
			if n := len(rep.Events); n < 2 || rep.Events[n-2].Name != "error" || gjson.GetBytes(rep.Events[n-2].Data, "error.code").String() != "upstream_error" || rep.Terminal != "response.failed" {
				t.Errorf("stream = %s; want the error event and response.failed", w.Body.String())
			}
		})
	}
}
