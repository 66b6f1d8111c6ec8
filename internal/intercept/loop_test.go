package intercept

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/testutil/localsandbox"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

func TestSingleCallJSON(t *testing.T) { forEachAPI(t, testSingleCallJSON) }

func testSingleCallJSON(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api), withLocal())
	h.up.Enqueue(
		upstreamtest.Turn{Items: []upstreamtest.Item{call("x = 6 * 7\nprint('hi')\nx")}},
		upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("The answer is 42.")}},
	)
	status, resp := h.post(body(`"include":["code_interpreter_call.outputs"]`), "k1")
	if status != 200 {
		t.Fatalf("status = %d; body %s", status, resp)
	}
	if got := strings.Join(types(resp), ","); got != "code_interpreter_call,message" {
		t.Fatalf("output types = %s; want code_interpreter_call,message\n%s", got, resp)
	}
	ci := gjson.GetBytes(resp, "output.0")
	if ci.Get("status").String() != "completed" || !strings.HasPrefix(ci.Get("id").String(), "ci_") || !strings.HasPrefix(ci.Get("container_id").String(), "cntr_") {
		t.Errorf("ci item = %s", ci.Raw)
	}
	if logs := ci.Get("outputs.0.logs").String(); logs != "hi\n42" {
		t.Errorf("logs = %q; want %q", logs, "hi\n42")
	}
	reqs := h.up.Requests()
	if len(reqs) != 2 {
		t.Fatalf("upstream requests = %d; want 2", len(reqs))
	}
	if got := fcOutputs(reqs[1]); len(got) != 1 || got[0] != "hi\n42" {
		t.Errorf("function_call_output = %q", got)
	}
	if gjson.GetBytes(resp, "model").String() != "gpt-test" || !strings.HasPrefix(gjson.GetBytes(resp, "id").String(), "resp_") {
		t.Errorf("response = %s", resp)
	}
	if tt := gjson.GetBytes(resp, "tools.0.type").String(); tt != "code_interpreter" {
		t.Errorf("tools echoed = %s", gjson.GetBytes(resp, "tools").Raw)
	}
}

func text(s string) upstreamtest.Turn {
	return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text(s)}}
}

func calls(codes ...string) upstreamtest.Turn {
	var items []upstreamtest.Item
	for _, c := range codes {
		items = append(items, call(c))
	}
	return upstreamtest.Turn{Items: items}
}

func TestLoopTellsTheModel(t *testing.T) { forEachAPI(t, testLoopTellsTheModel) }

func testLoopTellsTheModel(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api), withLocal(), withConfig(func(c *config.Config) { c.Interception.ExecutionTimeout = 1e9; c.Interception.ModelOutputLimit = 64 }))
	tests := []struct {
		name       string
		turn       upstreamtest.Turn
		wantStatus []string
		wantModel  []string // substrings of each function_call_output
	}{
		{"state persists across iterations and parallel calls run in order", calls("x = 5", "x * 2", "x + 1"),
			[]string{"completed", "completed", "completed"}, []string{"[no output]", "10", "6"}},
		{"an exception is a failed call with its traceback", calls("1/0"),
			[]string{"failed"}, []string{"division by zero"}},
		{"stderr is shown", calls("import sys; sys.stderr.write('warn\\n')"),
			[]string{"completed"}, []string{"warn"}},
		{"unparseable arguments", upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", `{"code": 1`)}},
			[]string{"failed"}, []string{"could not parse the arguments"}},
		{"a missing code field", upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", `{"src":"1"}`)}},
			[]string{"failed"}, []string{`"code" field is missing`}},
		{"long output is truncated with a note", calls("print('y' * 500)"),
			[]string{"completed"}, []string{"[output truncated: 64 of 501 bytes shown]\nyyyyy"}},
		{"a timeout is incomplete", calls("import time; time.sleep(10)"),
			[]string{"incomplete"}, []string{"Execution timed out after 1 s"}},
	}
	cid := h.container("k")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(h.up.Requests())
			h.up.Enqueue(tt.turn, text("done"))
			status, resp := h.post(bodyIn(cid, `"include":["code_interpreter_call.outputs"]`), "k")
			if status != 200 {
				t.Fatalf("status %d: %s", status, resp)
			}
			reqs := h.up.Requests()[before:]
			if len(reqs) != 2 {
				t.Fatalf("upstream calls = %d; want 2", len(reqs))
			}
			outs := fcOutputs(reqs[1])
			if len(outs) != len(tt.wantModel) {
				t.Fatalf("function_call_outputs = %q", outs)
			}
			for i, want := range tt.wantModel {
				if !strings.Contains(outs[i], want) || strings.Contains(outs[i], "\x1b") {
					t.Errorf("output %d = %q; want it to contain %q (no ANSI)", i, outs[i], want)
				}
				if st := gjson.GetBytes(resp, "output."+strconv.Itoa(i)+".status").String(); st != tt.wantStatus[i] {
					t.Errorf("item %d status = %s; want %s", i, st, tt.wantStatus[i])
				}
			}
			if last := types(resp); last[len(last)-1] != "message" {
				t.Errorf("output types = %v", last)
			}
		})
	}
}

func TestOutputsOnlyWhenIncluded(t *testing.T) { forEachAPI(t, testOutputsOnlyWhenIncluded) }

func testOutputsOnlyWhenIncluded(t *testing.T, api upstreamAPI) {
	localsandbox.PythonModules(t, "", "matplotlib")
	h := newHarness(t, onAPI(api), withLocal())
	plot := "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nprint('plotted')"
	h.up.Enqueue(calls(plot), text("A chart."))
	status, resp := h.post(body(`"include":["code_interpreter_call.outputs"]`), "k")
	if status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	outs := gjson.GetBytes(resp, "output.0.outputs")
	if outs.Get("0.type").String() != "logs" || !strings.HasPrefix(outs.Get("1.url").String(), "data:image/png;base64,") || outs.Get("1.type").String() != "image" {
		t.Errorf("outputs = %.300s", outs.Raw)
	}
	if out := fcOutputs(h.up.Requests()[1]); len(out) != 1 || !strings.Contains(out[0], "[image/png produced: shown to the user]") {
		t.Errorf("model saw %q", out)
	}
	for _, r := range h.up.Requests() {
		if r.Includes(includeOutputs) {
			t.Errorf("include %s was sent upstream", includeOutputs)
		}
	}

	h.up.Enqueue(calls("print(1)"), text("One."))
	_, resp = h.post(body(""), "k")
	if o := gjson.GetBytes(resp, "output.0.outputs"); o.Type != gjson.Null {
		t.Errorf("outputs without include = %s; want null", o.Raw)
	}
}

func TestLimitsEndInText(t *testing.T) { forEachAPI(t, testLimitsEndInText) }

func testLimitsEndInText(t *testing.T, api upstreamAPI) {
	tests := []struct {
		name     string
		maxIter  int
		extra    string
		first    upstreamtest.Turn
		wantReqs int
		wantRun  int // executed calls
	}{
		{"max_iterations", 2, "", calls("1"), 3, 2},
		{"max_tool_calls", 20, `"max_tool_calls":1,`, calls("1", "2"), 2, 1},
	}
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			t.Run(tt.name+map[bool]string{false: " json", true: " stream"}[stream], func(t *testing.T) {
				h := newHarness(t, onAPI(api), withConfig(func(c *config.Config) { c.Interception.MaxIterations = tt.maxIter }))
				h.up.Enqueue(tt.first)
				h.up.Script(func(r upstreamtest.Request) upstreamtest.Turn {
					if string(r.ToolChoice) == `"none"` {
						return text("Final answer.")
					}
					return calls("2")
				})
				extra := ""
				if stream {
					extra = `"stream":true,`
				}
				status, resp := h.post(body(extra+`"include":["code_interpreter_call.outputs"],`+tt.extra+`"tool_choice":"required"`), "k")
				if status != 200 {
					t.Fatalf("status %d: %s", status, resp)
				}
				if stream {
					resp = checkStream(t, resp).Response
				}
				reqs := h.up.Requests()
				if len(reqs) != tt.wantReqs {
					t.Fatalf("upstream calls = %d; want %d", len(reqs), tt.wantReqs)
				}
				if tc := string(reqs[len(reqs)-1].ToolChoice); tc != `"none"` {
					t.Errorf("last tool_choice = %s; want \"none\"", tc)
				}
				if tc := string(reqs[0].ToolChoice); tc != `"required"` {
					t.Errorf("first tool_choice = %s", tc)
				}
				if len(reqs) > 2 {
					if tc := string(reqs[1].ToolChoice); tc != `"auto"` {
						t.Errorf("second tool_choice = %s; want \"auto\"", tc)
					}
				}
				ts := types(resp)
				if ts[len(ts)-1] != "message" || strings.Contains(string(resp), `"function_call"`) {
					t.Errorf("output = %v", ts)
				}
				ran := 0
				gjson.GetBytes(resp, "output.#(type==\"code_interpreter_call\")#.status").ForEach(func(_, s gjson.Result) bool {
					if s.String() == "completed" {
						ran++
					}
					return true
				})
				if ran != tt.wantRun {
					t.Errorf("executed = %d; want %d\n%s", ran, tt.wantRun, resp)
				}
				if tc := gjson.GetBytes(resp, "tool_choice").String(); tc != "required" {
					t.Errorf("response tool_choice = %s; want the client's", tc)
				}
			})
		}
	}
}

func TestUsageIsSummed(t *testing.T) { forEachAPI(t, testUsageIsSummed) }

func testUsageIsSummed(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api))
	u := func(in, cached, out, reasoning int) *upstreamtest.Usage {
		return &upstreamtest.Usage{InputTokens: in, CachedTokens: cached, OutputTokens: out, ReasoningTokens: reasoning}
	}
	h.up.Enqueue(
		upstreamtest.Turn{Items: []upstreamtest.Item{call("1")}, Usage: u(100, 10, 20, 5)},
		upstreamtest.Turn{Items: []upstreamtest.Item{call("2")}, Usage: u(200, 50, 30, 7)},
		upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("ok")}, Usage: u(300, 60, 40, 0)},
	)
	_, resp := h.post(body(""), "k")
	us := gjson.GetBytes(resp, "usage")
	want := map[string]int64{"input_tokens": 600, "input_tokens_details.cached_tokens": 120, "output_tokens": 90, "output_tokens_details.reasoning_tokens": 12, "total_tokens": 690}
	// What each chat server reports: vLLM no reasoning tokens, llama.cpp no details at all.
	switch api.name {
	case vllmAPI.name, nullsAPI.name:
		want["output_tokens_details.reasoning_tokens"] = 0
	case llamaCppAPI.name:
		want["output_tokens_details.reasoning_tokens"], want["input_tokens_details.cached_tokens"] = 0, 0
	}
	for path, want := range want {
		if got := us.Get(path).Int(); got != want {
			t.Errorf("usage.%s = %d; want %d", path, got, want)
		}
	}
}

// TestForcedToolChoice: a tool_choice that forces code_interpreter (by itself or in
// allowed_tools, mode required) forces the stand-in function on the first upstream call only.
func TestForcedToolChoice(t *testing.T) { forEachAPI(t, testForcedToolChoice) }

func testForcedToolChoice(t *testing.T, api upstreamAPI) {
	for _, choice := range []string{`{"type":"code_interpreter"}`, `{"type":"allowed_tools","mode":"required","tools":[{"type":"code_interpreter"}]}`} {
		t.Run(choice, func(t *testing.T) {
			h := newHarness(t, onAPI(api))
			h.up.Enqueue(calls("1"), text("done"))
			status, resp := h.post(body(`"tool_choice":`+choice), "k")
			if status != 200 {
				t.Fatalf("status %d: %s", status, resp)
			}
			reqs := h.up.Requests()
			first := gjson.ParseBytes(reqs[0].ToolChoice)
			forced := first.Get("name").String() == "python" || first.Get("function.name").String() == "python" || // a named function
				(first.Get("mode").String() == "required" && first.Get("tools.0.name").String() == "python") || // allowed_tools (Responses)
				(first.String() == "required" && strings.Join(reqs[0].ToolNames(), ",") == "python") // tools cut down (chat)
			if !forced {
				t.Errorf("first tool_choice = %s with tools %v; want the stand-in forced", reqs[0].ToolChoice, reqs[0].ToolNames())
			}
			if later := gjson.ParseBytes(reqs[1].ToolChoice); later.String() != "auto" && later.Get("mode").String() != "auto" {
				t.Errorf("second tool_choice = %s; want auto", reqs[1].ToolChoice)
			}
			if tc := gjson.GetBytes(resp, "tool_choice").Raw; tc != choice {
				t.Errorf("response tool_choice = %s; want the client's", tc)
			}
		})
	}
}

// TestInterleavedParallelCalls: a chat server that interleaves the deltas of parallel calls
// still gives two code_interpreter_calls, run in order, streamed as OpenAI's grammar requires.
func TestInterleavedParallelCalls(t *testing.T) {
	for _, api := range []upstreamAPI{vllmAPI, llamaCppAPI} {
		t.Run(api.name, func(t *testing.T) {
			h := newHarness(t, onAPI(api))
			turn := calls("a = 'first'", "b = 'second'")
			turn.ChatInterleave = true
			h.up.Enqueue(turn, text("both"))
			status, raw := h.post(body(`"stream":true`), "k")
			if status != 200 {
				t.Fatalf("status %d: %s", status, raw)
			}
			resp := checkStream(t, raw).Response
			if got := strings.Join(types(resp), ","); got != "code_interpreter_call,code_interpreter_call,message" {
				t.Errorf("output = %s", got)
			}
			if got := h.fake.Codes(); strings.Join(got, ";") != "a = 'first';b = 'second'" {
				t.Errorf("ran %q; want both calls in order", got)
			}
			if outs := fcOutputs(h.up.Requests()[1]); len(outs) != 2 {
				t.Errorf("outputs sent back = %q; want one per call", outs)
			}
		})
	}
}
