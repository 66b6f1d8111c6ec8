package intercept

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// statuses returns the status of each code_interpreter_call of a response.
func statuses(resp []byte) []string {
	var out []string
	gjson.GetBytes(resp, `output.#(type=="code_interpreter_call")#.status`).ForEach(func(_, s gjson.Result) bool {
		out = append(out, s.String())
		return true
	})
	return out
}

// post sends body, streamed or not, and returns the final Response.
func (h *harness) final(t *testing.T, b string, stream bool) []byte {
	t.Helper()
	if stream {
		b = strings.Replace(b, `{"model"`, `{"stream":true,"model"`, 1)
	}
	status, resp := h.post(b, "k")
	if status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	if stream {
		return checkStream(t, resp).Response
	}
	return resp
}

func TestLimitCallsPerTurn(t *testing.T) {
	for _, stream := range []bool{false, true} {
		h := newHarness(t, withConfig(func(c *config.Config) { c.Interception.MaxCallsPerTurn = 2 }))
		h.up.Enqueue(calls("1", "2", "3"), text("done"))
		resp := h.final(t, body(""), stream)
		if got := h.fake.Codes(); len(got) != 2 {
			t.Errorf("ran %q; want the first 2", got)
		}
		if st := statuses(resp); strings.Join(st, ",") != "completed,completed,incomplete" {
			t.Errorf("statuses = %v", st)
		}
		outs := fcOutputs(h.up.Requests()[1])
		if len(outs) != 3 || !strings.Contains(outs[2], "max_calls_per_turn") {
			t.Errorf("the model saw %q; want the third call refused, naming the limit", outs)
		}
	}
}

// TestManyCallsBoundRecords: a model turn with thousands of calls writes a call record for the
// calls run (max_calls_per_turn a turn), not one per call, while the client still sees every call.
func TestManyCallsBoundRecords(t *testing.T) {
	const many, turns, perTurn = 3000, 3, 4
	h := newHarness(t, withConfig(func(c *config.Config) { c.Interception.MaxCallsPerTurn = perTurn }))
	st := &countingStore{Responses: h.eng.store}
	h.eng.store = st
	codes := make([]string, many)
	for i := range codes {
		codes[i] = "x = 1"
	}
	for range turns {
		h.up.Enqueue(calls(codes...))
	}
	h.up.Enqueue(text("done"))
	resp := h.final(t, body(""), false)
	if got := len(statuses(resp)); got != many*turns {
		t.Errorf("the response shows %d calls; want %d", got, many*turns)
	}
	if got := len(h.fake.Codes()); got != perTurn*turns {
		t.Errorf("ran %d calls; want %d", got, perTurn*turns)
	}
	if recs := st.calls.Load(); recs > perTurn*turns {
		t.Errorf("%d call records for one response; want at most %d (max_calls_per_turn a turn)", recs, perTurn*turns)
	}
}

func TestLimitExecutionsPerResponse(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
		max, want   int
		note        string
	}{
		{"max_executions without max_tool_calls", "", 3, 3, "max_executions"},
		{"max_tool_calls below it", `"max_tool_calls":2`, 3, 2, ""}, // spent at a turn's end: no call was refused
		{"max_executions below max_tool_calls", `"max_tool_calls":10`, 3, 3, "max_executions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, withConfig(func(c *config.Config) { c.Interception.MaxExecutions = tc.max }))
			h.up.Enqueue(calls("a", "b"))
			h.up.Script(func(r upstreamtest.Request) upstreamtest.Turn {
				if string(r.ToolChoice) == `"none"` {
					return text("Final answer.")
				}
				return calls("c", "d")
			})
			resp := h.final(t, body(tc.extra), false)
			if got := len(h.fake.Codes()); got != tc.want {
				t.Errorf("ran %d; want %d", got, tc.want)
			}
			reqs := h.up.Requests()
			last := reqs[len(reqs)-1]
			if string(last.ToolChoice) != `"none"` {
				t.Errorf("the last upstream call has tool_choice %s; want none", last.ToolChoice)
			}
			outs := fcOutputs(last)
			if tc.note != "" && (len(outs) == 0 || !strings.Contains(outs[len(outs)-1], tc.note)) {
				t.Errorf("the model saw %q; want %q", outs, tc.note)
			}
			if ts := types(resp); ts[len(ts)-1] != "message" {
				t.Errorf("output = %v", ts)
			}
		})
	}
}

func TestLimitCodeSize(t *testing.T) {
	big := strings.Repeat("x = 1\n", 200) // 1200 bytes of code
	for _, stream := range []bool{false, true} {
		h := newHarness(t, withConfig(func(c *config.Config) { c.Interception.MaxCodeSize = 100 }))
		h.up.Enqueue(calls(big, "print(1)"), text("done"))
		b := strings.Replace(body(""), `"input"`, `"include":["code_interpreter_call.outputs"],"input"`, 1)
		resp := h.final(t, b, stream)
		if got := h.fake.Codes(); len(got) != 1 || got[0] != "print(1)" {
			t.Errorf("ran %q; want only the small call", got)
		}
		if st := statuses(resp); strings.Join(st, ",") != "failed,completed" {
			t.Errorf("statuses = %v", st)
		}
		if code := gjson.GetBytes(resp, "output.0.code").String(); len(code) > 100 {
			t.Errorf("the client was shown %d bytes of code; want at most the limit", len(code))
		}
		second := h.up.Requests()[1]
		outs := fcOutputs(second)
		if len(outs) != 2 || !strings.Contains(outs[0], "max_code_size") {
			t.Errorf("the model saw %q", outs)
		}
		if strings.Contains(string(second.Body), "x = 1\\nx = 1") {
			t.Error("the oversized arguments were carried into the next upstream call")
		}
	}
}

// The streamed argument decoder keeps nothing past the cap, whatever the chunking.
func TestTranslatorStopsAccumulatingArgs(t *testing.T) {
	tr := newTranslator(&parsedRequest{code: true, fn: "python"}, "resp_1", 0, nil)
	tr.maxArgs = 64
	s := &slot{}
	tr.startCall(s)
	var streamed int
	for _, chunk := range append([]string{`{"code":"`}, strings.Split(strings.Repeat("a", 10000), "")...) {
		for _, ev := range tr.feedArgs(s, chunk) {
			streamed += len(ev.minted.(codeDeltaEvent).Delta)
		}
		if s.args.Len() > 64 {
			t.Fatalf("holding %d bytes of arguments; the cap is 64", s.args.Len())
		}
	}
	if streamed > 64 || !s.tooBig {
		t.Errorf("streamed %d bytes, tooBig %v", streamed, s.tooBig)
	}
	tr.codeDone(s, "")
	if _, ok := tooLargeExecution(s.parseErr); !ok {
		t.Errorf("parseErr = %v; want the size limit", s.parseErr)
	}
}

func TestLimitOutputBudget(t *testing.T) {
	h := newHarness(t, withConfig(func(c *config.Config) { c.Interception.MaxResponseOutput = 1000 }))
	h.fake.setRun(func(context.Context, string) (sandbox.Result, error) {
		return sandbox.Result{Stdout: strings.Repeat("o", 600)}, nil
	})
	h.up.Enqueue(calls("1", "2", "3"))
	h.up.Script(func(r upstreamtest.Request) upstreamtest.Turn {
		if string(r.ToolChoice) == `"none"` {
			return text("Final answer.")
		}
		return calls("4")
	})
	b := strings.Replace(body(""), `"input"`, `"include":["code_interpreter_call.outputs"],"input"`, 1)
	resp := h.final(t, b, false)
	if got := len(h.fake.Codes()); got != 2 {
		t.Errorf("ran %d; want 2 (the second spends the budget)", got)
	}
	total := 0
	gjson.GetBytes(resp, `output.#(type=="code_interpreter_call")#.outputs.0.logs`).ForEach(func(_, l gjson.Result) bool {
		total += len(l.String())
		return true
	})
	if total > 1000 {
		t.Errorf("outputs total %d bytes; the budget is 1000", total)
	}
	if logs := gjson.GetBytes(resp, "output.1.outputs.0.logs").String(); !strings.Contains(logs, "max_response_output") {
		t.Errorf("second call's logs = %q; want the truncation note", logs)
	}
	if st := statuses(resp); strings.Join(st, ",") != "completed,completed,incomplete" {
		t.Errorf("statuses = %v", st)
	}
	reqs := h.up.Requests()
	if len(reqs) != 2 || string(reqs[1].ToolChoice) != `"none"` {
		t.Errorf("upstream calls = %d; want 2, the second with tools off", len(reqs))
	}
}

// quotaContainers refuses every create with a container quota.
type quotaContainers struct{ *fakeContainers }

func (quotaContainers) Create(context.Context, string, string, sandbox.CreateOptions, time.Duration) (heldContainer, error) {
	return nil, &containers.QuotaError{Limit: "max_containers_per_key", Message: "Rate limit reached for containers per API key (max_containers_per_key)."}
}

func TestContainerQuotaIs429(t *testing.T) {
	h := newHarness(t)
	h.eng.sessions = quotaContainers{h.fake}
	h.up.Enqueue(calls("1"))
	status, resp := h.post(body(""), "k")
	if status != 429 || gjson.GetBytes(resp, "error.code").String() != "rate_limit_exceeded" ||
		gjson.GetBytes(resp, "error.type").String() != "requests" || !strings.Contains(string(resp), "max_containers_per_key") {
		t.Errorf("json: %d %s", status, resp)
	}
	h.up.Enqueue(calls("1"))
	status, resp = h.post(body(`"stream":true`), "k")
	evs := parseSSE(t, resp)
	var errEv []byte
	for _, ev := range evs {
		if gjson.GetBytes(ev.Data, "type").String() == "error" {
			errEv = ev.Data
		}
	}
	if status != 200 || gjson.GetBytes(errEv, "error.code").String() != "rate_limit_exceeded" || !strings.Contains(string(errEv), "max_containers_per_key") {
		t.Errorf("stream: %d, error event %s", status, errEv)
	}
}
