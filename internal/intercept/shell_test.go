package intercept

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/testutil/streamcheck"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

func shellCall(commands ...string) upstreamtest.Item { return shellCallWith(nil, commands...) }

// shellCallWith is a call with timeout_ms (nil: null).
func shellCallWith(timeoutMS any, commands ...string) upstreamtest.Item {
	args, _ := json.Marshal(map[string]any{"commands": commands, "timeout_ms": timeoutMS, "max_output_length": nil})
	return upstreamtest.FunctionCall("shell", string(args))
}

func shellBody(env, extra string) string {
	b := `{"model":"gpt-test","input":"run it","tools":[{"type":"shell"` + env + `}]`
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

const containerAuto = `,"environment":{"type":"container_auto"}`

// TestShellHosted: a hosted shell call runs each command in the container and answers with the
// shell_call and its shell_call_output, streamed with the five shell events in order, the model
// told the entries; the same items whether streamed or not.
func TestShellHosted(t *testing.T) { forEachAPI(t, testShellHosted) }

func testShellHosted(t *testing.T, api upstreamAPI) {
	for _, stream := range []bool{true, false} {
		name := "json"
		if stream {
			name = "stream"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, onAPI(api))
			h.up.Enqueue(
				upstreamtest.Turn{Items: []upstreamtest.Item{shellCallWith(50, "echo hi; echoerr oops; exit 3", "write out.txt data; echo done", "hang")}},
				text("Done: [out](sandbox:/mnt/data/out.txt)"),
			)
			extra := `"stream":false`
			if stream {
				extra = `"stream":true`
			}
			status, raw := h.post(shellBody(containerAuto, extra+`,"tool_choice":{"type":"shell"}`), "k1")
			if status != 200 {
				t.Fatalf("status %d: %s", status, raw)
			}
			resp := raw
			if stream {
				if _, err := streamcheck.Check(raw); err != nil {
					t.Errorf("the stream breaks OpenAI's event grammar: %v", err)
				}
				evs := parseSSE(t, raw)
				resp = finalResponse(t, evs)
				var seq []string
				for _, ev := range evs {
					// Arguments come in as many deltas as the upstream sends: one stands for them all.
					name := strings.TrimPrefix(ev.Name, "response.")
					if (strings.Contains(name, "shell") || strings.HasPrefix(name, "output_item.")) &&
						!(name == "shell_call_command.delta" && len(seq) > 0 && seq[len(seq)-1] == name) {
						seq = append(seq, name)
					}
					if ev.Name == evShellCommandDelta && (!gjson.GetBytes(ev.Data, "obfuscation").Exists() || gjson.GetBytes(ev.Data, "item_id").Exists()) {
						t.Errorf("command delta %s: want obfuscation and no item_id", ev.Data)
					}
					if ev.Name == evShellOutputDelta && gjson.GetBytes(ev.Data, "command_index").Int() == 0 &&
						gjson.GetBytes(ev.Data, "delta").Raw != `{"stdout":"hi\n"}` && gjson.GetBytes(ev.Data, "delta").Raw != `{"stderr":"oops\n"}` {
						t.Errorf("output delta %s", ev.Data)
					}
				}
				want := "output_item.added,shell_call_command.added,shell_call_command.delta,shell_call_command.done," +
					"shell_call_command.added,shell_call_command.delta,shell_call_command.done," +
					"shell_call_command.added,shell_call_command.delta,shell_call_command.done,output_item.done," +
					"output_item.added,shell_call_output_content.delta,shell_call_output_content.delta,shell_call_output_content.done," +
					"shell_call_output_content.delta,shell_call_output_content.done,shell_call_output_content.done,output_item.done," +
					"output_item.added,output_item.done"
				if got := strings.Join(seq, ","); got != want {
					t.Errorf("events:\n%s\nwant\n%s", got, want)
				}
			}
			if got := strings.Join(types(resp), ","); got != "shell_call,shell_call_output,message" {
				t.Fatalf("output types %s\n%s", got, resp)
			}
			call, out := gjson.GetBytes(resp, "output.0"), gjson.GetBytes(resp, "output.1")
			cid := call.Get("environment.container_id").String()
			if !strings.HasPrefix(call.Get("id").String(), "sh_") || call.Get("status").String() != "completed" ||
				call.Get("environment.type").String() != "container_reference" || !strings.HasPrefix(cid, "cntr_") ||
				call.Get("action.commands.#").Int() != 3 || call.Get("action.timeout_ms").Int() != 50 {
				t.Errorf("shell_call %s", call.Raw)
			}
			if !strings.HasPrefix(out.Get("id").String(), "sho_") || out.Get("call_id").String() != call.Get("call_id").String() ||
				out.Get("status").String() != "completed" || out.Get("max_output_length").Type != gjson.Null {
				t.Errorf("shell_call_output %s", out.Raw)
			}
			wantOut := `[{"outcome":{"type":"exit","exit_code":3},"stderr":"oops\n","stdout":"hi\n"},` +
				`{"outcome":{"type":"exit","exit_code":0},"stderr":"","stdout":"done\n"},{"outcome":{"type":"timeout"},"stderr":"","stdout":""}]`
			if got := out.Get("output").Raw; got != wantOut {
				t.Errorf("output\n%s\nwant\n%s", got, wantOut)
			}
			// The file the commands wrote is a container file, cited in the answer.
			if ann := gjson.GetBytes(resp, "output.2.content.0.annotations.0"); ann.Get("type").String() != "container_file_citation" || ann.Get("container_id").String() != cid {
				t.Errorf("annotation %s; want a container_file_citation in %s", ann.Raw, cid)
			}
			reqs := h.up.Requests()
			if len(reqs) != 2 {
				t.Fatalf("upstream requests %d", len(reqs))
			}
			if tc := gjson.GetBytes(reqs[0].Body, "tool_choice"); api.name == "responses" && tc.Get("name").String() != "shell" {
				t.Errorf("first tool_choice %s; want the stand-in forced", tc.Raw)
			}
			outs := fcOutputs(reqs[1])
			if len(outs) != 1 || !strings.HasPrefix(outs[0], wantOut) || !strings.Contains(outs[0], "sandbox:/mnt/data/out.txt") {
				t.Errorf("the model was told %q", outs)
			}
		})
	}
}

// TestShellSharesTheContainer: code_interpreter and the shell tool of one request run in one
// container.
func TestShellSharesTheContainer(t *testing.T) {
	h := newHarness(t)
	h.up.Enqueue(
		upstreamtest.Turn{Items: []upstreamtest.Item{call("print(1)"), shellCall("echo 2")}},
		text("ok"),
	)
	status, resp := h.post(`{"model":"gpt-test","input":"x","tools":[{"type":"code_interpreter","container":{"type":"auto"}},{"type":"shell","environment":{"type":"container_auto"}}]}`, "k1")
	if status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	if got := strings.Join(types(resp), ","); got != "code_interpreter_call,shell_call,shell_call_output,message" {
		t.Fatalf("output types %s", got)
	}
	ci, sh := gjson.GetBytes(resp, "output.0.container_id").String(), gjson.GetBytes(resp, "output.1.environment.container_id").String()
	if ci == "" || ci != sh || h.fake.Created() != 1 {
		t.Errorf("code_interpreter in %q, shell in %q, %d containers created; want one", ci, sh, h.fake.Created())
	}
}

// TestShellLocal: a shell tool without a container is the client's to run: the response ends
// with the shell_call, and the client's shell_call_output goes upstream as the stand-in's output.
func TestShellLocal(t *testing.T) { forEachAPI(t, testShellLocal) }

func testShellLocal(t *testing.T, api upstreamAPI) {
	for _, env := range []string{`,"environment":{"type":"local"}`, ""} {
		t.Run("env"+env, func(t *testing.T) {
			h := newHarness(t, onAPI(api))
			h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{shellCall("ls -la")}}, text("listed"))
			status, resp := h.post(shellBody(env, ""), "k1")
			if status != 200 {
				t.Fatalf("status %d: %s", status, resp)
			}
			if got := strings.Join(types(resp), ","); got != "shell_call" || gjson.GetBytes(resp, "status").String() != "completed" {
				t.Fatalf("output types %s, status %s", got, gjson.GetBytes(resp, "status"))
			}
			call := gjson.GetBytes(resp, "output.0")
			if env == "" && call.Get("environment").Exists() || env != "" && call.Get("environment").Raw != `{"type":"local"}` {
				t.Errorf("environment %s", call.Get("environment").Raw)
			}
			if h.fake.Created() != 0 {
				t.Errorf("%d containers created for a local shell", h.fake.Created())
			}
			callID := call.Get("call_id").String()
			next := `{"model":"gpt-test","previous_response_id":"` + gjson.GetBytes(resp, "id").String() + `","tools":[{"type":"shell"` + env + `}],` +
				`"input":[{"type":"shell_call_output","call_id":"` + callID + `","output":[{"stdout":"a.txt\n","stderr":"","outcome":{"type":"exit","exit_code":0}}]}]}`
			status, resp = h.post(next, "k1")
			if status != 200 || strings.Join(types(resp), ",") != "message" {
				t.Fatalf("second turn %d: %s", status, resp)
			}
			reqs := h.up.Requests()
			outs := fcOutputs(reqs[len(reqs)-1])
			if len(outs) != 1 || outs[0] != `[{"outcome":{"type":"exit","exit_code":0},"stderr":"","stdout":"a.txt\n"}]` {
				t.Errorf("the model was told %q", outs)
			}
		})
	}
}

// TestShellPairing: an output without its call, or a call without its output, is OpenAI's 400
// before anything goes upstream.
func TestShellPairing(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct{ name, input, msg string }{
		{"output without call", `[{"type":"shell_call_output","call_id":"call_x","output":[]}]`, "No tool call found for shell call output with call_id call_x."},
		{"call without output", `[{"type":"shell_call","call_id":"call_y","action":{"commands":["ls"]}},{"type":"message","role":"user","content":"go on"}]`, "No tool output found for shell call call_y."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, resp := h.post(`{"model":"gpt-test","tools":[{"type":"shell","environment":{"type":"local"}}],"input":`+tc.input+`}`, "k1")
			if status != 400 || gjson.GetBytes(resp, "error.message").String() != tc.msg || gjson.GetBytes(resp, "error.param").String() != "input" {
				t.Errorf("answer %d %s; want 400 %q", status, resp, tc.msg)
			}
		})
	}
	if n := len(h.up.Requests()); n != 0 {
		t.Errorf("%d upstream requests; want none", n)
	}
}

// TestShellReplay: a stateless client sends the hosted call and its output back; the upstream
// gets the stand-in's call and output, and container_auto reuses the container they name.
func TestShellReplay(t *testing.T) {
	h := newHarness(t)
	h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{shellCall("echo one")}}, text("first"))
	_, resp := h.post(shellBody(containerAuto, `"store":false`), "k1")
	out := gjson.GetBytes(resp, "output")
	cid := out.Get("0.environment.container_id").String()
	h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{shellCall("echo two")}}, text("second"))
	status, resp := h.post(`{"model":"gpt-test","store":false,"tools":[{"type":"shell","environment":{"type":"container_auto"}}],"input":[`+
		out.Get("0").Raw+`,`+out.Get("1").Raw+`,{"type":"message","role":"user","content":"again"}]}`, "k1")
	if status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	if got := gjson.GetBytes(resp, "output.0.environment.container_id").String(); got != cid || h.fake.Created() != 1 {
		t.Errorf("second turn in %q (%d created); want the first's %q", got, h.fake.Created(), cid)
	}
	reqs := h.up.Requests()
	calls := inputItems(reqs[2], "function_call")
	outs := fcOutputs(reqs[2])
	if len(calls) != 1 || gjson.GetBytes(calls[0], "name").String() != "shell" || !strings.Contains(gjson.GetBytes(calls[0], "arguments").String(), `"echo one"`) ||
		len(outs) != 1 || !strings.Contains(outs[0], `"stdout":"one\n"`) {
		t.Errorf("replayed as %s and %q", calls, outs)
	}
}

// TestShellContainerReference: a container_reference that names no container of the caller is a
// 404 naming the parameter; two tools naming different containers are refused.
func TestShellContainerReference(t *testing.T) {
	h := newHarness(t)
	status, resp := h.post(shellBody(`,"environment":{"type":"container_reference","container_id":"cntr_nope"}`, ""), "k1")
	if status != 404 || gjson.GetBytes(resp, "error.param").String() != "tools[0].environment.container_id" {
		t.Errorf("answer %d %s; want 404 naming tools[0].environment.container_id", status, resp)
	}
	status, resp = h.post(`{"model":"gpt-test","input":"x","tools":[{"type":"code_interpreter","container":"cntr_a"},{"type":"shell","environment":{"type":"container_reference","container_id":"cntr_b"}}]}`, "k1")
	if status != 400 {
		t.Errorf("two containers: %d %s; want 400", status, resp)
	}
}

// TestShellOutputBound: a command's output keeps, per stream, its start and its end within the
// bound (stdout and stderr together), with a line saying how much was left out; the client's
// deltas stop at the bound.
func TestShellOutputBound(t *testing.T) {
	long := strings.Repeat("é", 30) + "MIDDLE" + strings.Repeat("z", 30)
	for _, tc := range []struct {
		name           string
		limit          int
		stdout, stderr []string
		want           shellEntry
		streamed       string
	}{
		{"both fit", 20, []string{"hello\n"}, []string{"oops\n"}, shellEntry{Stdout: "hello\n", Stderr: "oops\n"}, "hello\n"},
		{"stdout cut, in pieces", 20, []string{long[:8], long[8:]}, nil,
			shellEntry{Stdout: "éééééééééé\n[… 46 characters omitted …]\nzzzzzzzzzz"}, "éééééééééééééééééééé"},
		{"stderr short: stdout gets the rest", 20, []string{strings.Repeat("a", 40)}, []string{"err\n"},
			shellEntry{Stdout: "aaaaaaaa\n[… 24 characters omitted …]\naaaaaaaa", Stderr: "err\n"}, "aaaaaaaaaaaaaaaaaaaa"},
		{"both cut", 10, []string{strings.Repeat("o", 20)}, []string{strings.Repeat("e", 20)},
			shellEntry{Stdout: "oo\n[… 15 characters omitted …]\nooo", Stderr: "ee\n[… 15 characters omitted …]\neee"}, "oooooooooo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newShellOutput(tc.limit)
			var streamed strings.Builder
			for _, p := range tc.stdout {
				streamed.WriteString(o.add(0, p))
			}
			for _, p := range tc.stderr {
				streamed.WriteString(o.add(1, p))
			}
			got := o.entry(shellOutcome{})
			if got.Stdout != tc.want.Stdout || got.Stderr != tc.want.Stderr {
				t.Errorf("entry stdout %q stderr %q;\nwant stdout %q stderr %q", got.Stdout, got.Stderr, tc.want.Stdout, tc.want.Stderr)
			}
			if !strings.HasPrefix(streamed.String(), tc.streamed) || utf8.RuneCountInString(streamed.String()) > tc.limit {
				t.Errorf("streamed %q; want %q, at most %d characters", streamed.String(), tc.streamed, tc.limit)
			}
		})
	}
	// A stream far past the bound is held in memory bounded by it.
	o := newShellOutput(100)
	for range 10000 {
		o.add(0, strings.Repeat("x", 1000))
	}
	if n := o.streams[0].head.Len() + len(o.streams[0].tail); n > 1000 {
		t.Errorf("%d bytes held for 10 MB of output with a bound of 100 characters", n)
	}
	if e := o.entry(shellOutcome{}); !strings.Contains(e.Stdout, "[… 9999900 characters omitted …]") {
		t.Errorf("entry %q", e.Stdout)
	}
}

// TestShellCallsOneTurn: the calls of one model turn each get their output right after them, in
// the stream and in the JSON response alike, whatever else the turn holds; the items the model
// made after a call reach the client once that call's output has; the model is told every
// output.
func TestShellCallsOneTurn(t *testing.T) {
	both := `{"model":"gpt-test","input":"x","tools":[{"type":"code_interpreter","container":{"type":"auto"}},{"type":"shell","environment":{"type":"container_auto"}}]`
	for _, tc := range []struct {
		name  string
		turn  []upstreamtest.Item
		body  string
		types string
		told  []string
	}{
		{"two shell calls", []upstreamtest.Item{shellCall("echo one"), shellCall("echo two")}, shellBody(containerAuto, `"stream":true`),
			"shell_call,shell_call_output,shell_call,shell_call_output,message", []string{"one", "two"}},
		{"shell, code, shell", []upstreamtest.Item{shellCall("echo one"), call("print(2)"), shellCall("echo three")}, both + `,"stream":true}`,
			"shell_call,shell_call_output,code_interpreter_call,shell_call,shell_call_output,message", []string{"one", "[no output]", "three"}},
		{"text around a call", []upstreamtest.Item{upstreamtest.Text("First:"), shellCall("echo one"), upstreamtest.Text("then")}, shellBody(containerAuto, `"stream":true`),
			"message,shell_call,shell_call_output,message,message", []string{"one"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.up.Enqueue(upstreamtest.Turn{Items: tc.turn}, text("both"), upstreamtest.Turn{Items: tc.turn}, text("both"))
			status, resp := h.post(tc.body, "k1")
			if status != 200 {
				t.Fatalf("status %d: %s", status, resp)
			}
			if _, err := streamcheck.Check(resp); err != nil {
				t.Errorf("the stream breaks OpenAI's event grammar: %v\n%s", err, resp)
			}
			final := finalResponse(t, parseSSE(t, resp))
			if got := strings.Join(types(final), ","); got != tc.types {
				t.Fatalf("output types %s; want %s", got, tc.types)
			}
			var calls []string
			for _, it := range gjson.GetBytes(final, "output").Array() {
				switch it.Get("type").String() {
				case "shell_call":
					calls = append(calls, it.Get("call_id").String())
				case "shell_call_output":
					if n := len(calls); n == 0 || it.Get("call_id").String() != calls[n-1] {
						t.Errorf("output %s does not follow its call (calls so far %q)", it.Raw, calls)
					}
				}
			}
			outs := fcOutputs(h.up.Requests()[1])
			if len(outs) != len(tc.told) {
				t.Fatalf("the model was told %q", outs)
			}
			for i, want := range tc.told {
				if !strings.Contains(outs[i], want) {
					t.Errorf("output %d to the model %q; want %q in it", i, outs[i], want)
				}
			}
			_, plain := h.post(strings.Replace(tc.body, `,"stream":true`, "", 1), "k1")
			if got := strings.Join(types(plain), ","); got != tc.types {
				t.Errorf("the JSON response's output types %s; want %s", got, tc.types)
			}
		})
	}
}

// TestCheckShellPairs: an output needs a call before it in the input or in the conversation
// previous_response_id continues; a call of the input needs its output.
func TestCheckShellPairs(t *testing.T) {
	call := func(id string) string {
		return `{"type":"shell_call","call_id":"` + id + `","action":{"commands":["ls"]}}`
	}
	out := func(id string) string { return `{"type":"shell_call_output","call_id":"` + id + `","output":[]}` }
	known := func(ids ...string) func(string) bool {
		return func(id string) bool { return slices.Contains(ids, id) }
	}
	unknowable := func(string) bool { return true }
	for _, tc := range []struct {
		name  string
		items []string
		prior func(string) bool
		msg   string // "": accepted
	}{
		{"pair in the input", []string{call("call_a"), out("call_a")}, nil, ""},
		{"output without call", []string{out("call_a")}, nil, "No tool call found for shell call output with call_id call_a."},
		{"output before its call", []string{out("call_a"), call("call_a")}, nil, "No tool call found for shell call output with call_id call_a."},
		{"call without output", []string{call("call_a")}, nil, "No tool output found for shell call call_a."},
		{"output of a prior call", []string{out("call_p")}, known("call_p"), ""},
		{"output of no prior call", []string{out("call_x")}, known("call_p"), "No tool call found for shell call output with call_id call_x."},
		{"prior and input", []string{call("call_a"), out("call_a"), out("call_p")}, known("call_p"), ""},
		{"a context that cannot be told", []string{out("call_x")}, unknowable, ""},
		{"a call without output whatever the context", []string{call("call_a")}, unknowable, "No tool output found for shell call call_a."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items := gjson.Parse("[" + strings.Join(tc.items, ",") + "]").Array()
			bad := checkShellPairs(items, tc.prior)
			switch {
			case tc.msg == "" && bad != nil:
				t.Errorf("refused: %v", bad.Message)
			case tc.msg != "" && (bad == nil || bad.Message != tc.msg || bad.Param != "input" || bad.Status != 400):
				t.Errorf("got %+v; want 400 %q at input", bad, tc.msg)
			}
		})
	}
}

// localShell is a local shell tool's request body after the first: input, and the fields extra.
func localShell(input, extra string) string {
	b := `{"model":"gpt-test","tools":[{"type":"shell","environment":{"type":"local"}}],"input":` + input
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

func shellOutputOf(callID string) string {
	return `{"type":"shell_call_output","call_id":"` + callID + `","output":[{"stdout":"a.txt\n","stderr":"","outcome":{"type":"exit","exit_code":0}}]}`
}

// TestShellPairingPrevious: continuing a response the proxy stored, an output is checked against
// the calls of its conversation: the previous response's and those of its chain. An output that
// answers none is OpenAI's 400 before anything goes upstream; one that answers a call is sent.
func TestShellPairingPrevious(t *testing.T) { forEachAPI(t, testShellPairingPrevious) }

func testShellPairingPrevious(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api))
	h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{shellCall("ls")}})
	status, resp := h.post(shellBody(`,"environment":{"type":"local"}`, ""), "k1")
	if status != 200 || strings.Join(types(resp), ",") != "shell_call" {
		t.Fatalf("first turn %d: %s", status, resp)
	}
	first, callA := gjson.GetBytes(resp, "id").String(), gjson.GetBytes(resp, "output.0.call_id").String()
	// The second response answers it, and the model makes another call.
	h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{shellCall("cat a.txt")}})
	status, resp = h.post(localShell("["+shellOutputOf(callA)+"]", `"previous_response_id":"`+first+`"`), "k1")
	if status != 200 || strings.Join(types(resp), ",") != "shell_call" {
		t.Fatalf("second turn %d: %s", status, resp)
	}
	second, callB := gjson.GetBytes(resp, "id").String(), gjson.GetBytes(resp, "output.0.call_id").String()
	for _, tc := range []struct {
		name, prev string
		callIDs    []string // the outputs sent, the last one checked
		status     int      // 0: sent upstream, whatever it answers
	}{
		{"wrong call_id on the previous response", first, []string{"call_wrong"}, 400},
		{"wrong call_id along the chain", second, []string{callB, "call_wrong"}, 400},
		{"the previous response's call", second, []string{callB}, 200},
		{"a call further back in the chain", second, []string{callB, callA}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(h.up.Requests())
			if tc.status != 400 {
				h.up.Enqueue(text("listed"))
			}
			var outs []string
			for _, id := range tc.callIDs {
				outs = append(outs, shellOutputOf(id))
			}
			status, resp := h.post(localShell("["+strings.Join(outs, ",")+"]", `"previous_response_id":"`+tc.prev+`"`), "k1")
			sent := len(h.up.Requests()) - before
			if tc.status == 400 {
				want := "No tool call found for shell call output with call_id " + tc.callIDs[len(tc.callIDs)-1] + "."
				if status != 400 || gjson.GetBytes(resp, "error.message").String() != want || gjson.GetBytes(resp, "error.param").String() != "input" ||
					gjson.GetBytes(resp, "error.type").String() != "invalid_request_error" || sent != 0 {
					t.Errorf("answer %d %s, %d upstream requests; want 400 %q, none sent", status, resp, sent, want)
				}
				return
			}
			if (tc.status == 200 && status != 200) || sent != 1 {
				t.Fatalf("answer %d %s, %d upstream requests; want it sent", status, resp, sent)
			}
			if tc.status == 0 {
				return // what an upstream makes of an output answered twice is its own business
			}
			reqs := h.up.Requests()
			if outs := fcOutputs(reqs[len(reqs)-1]); len(outs) == 0 || !strings.Contains(outs[len(outs)-1], `"stdout":"a.txt\n"`) {
				t.Errorf("the model was told %q", outs)
			}
		})
	}
}

// TestShellPairingForeignPrevious: a previous_response_id the proxy did not mint is the
// upstream's conversation, which the proxy cannot see: the output goes upstream unchecked.
func TestShellPairingForeignPrevious(t *testing.T) {
	h := newHarness(t)
	// The scripted upstream knows no such response either, and says so: what matters is that
	// the request reached it.
	status, resp := h.post(localShell("["+shellOutputOf("call_upstreams")+"]", `"previous_response_id":"resp_upstreams0123"`), "k1")
	reqs := h.up.Requests()
	if len(reqs) != 1 || gjson.GetBytes(reqs[0].Body, "previous_response_id").String() != "resp_upstreams0123" ||
		strings.HasPrefix(gjson.GetBytes(resp, "error.message").String(), "No tool call found") {
		t.Fatalf("answer %d %s, %d upstream requests; want it passed on", status, resp, len(reqs))
	}
	if outs := fcOutputs(reqs[0]); len(outs) != 1 {
		t.Errorf("the upstream got outputs %q", outs)
	}
}

// TestShellItemReference: a stateless replay may name the shell items the proxy minted by id:
// they resolve to the items themselves, for the pairing check and for the upstream; an id the
// proxy does not hold for the caller is an unknown item, as any other reference.
func TestShellItemReference(t *testing.T) { forEachAPI(t, testShellItemReference) }

func testShellItemReference(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api))
	// A local call, and a hosted call with its output, each in a response stored or not.
	h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{shellCall("ls -la")}})
	_, resp := h.post(shellBody(`,"environment":{"type":"local"}`, `"store":false`), "k1")
	local := gjson.GetBytes(resp, "output.0")
	h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{shellCall("echo one")}}, text("first"))
	_, resp = h.post(shellBody(containerAuto, ""), "k1")
	hostedCall, hostedOut := gjson.GetBytes(resp, "output.0"), gjson.GetBytes(resp, "output.1")
	if local.Get("type").String() != "shell_call" || hostedCall.Get("type").String() != "shell_call" || hostedOut.Get("type").String() != "shell_call_output" {
		t.Fatalf("first turns: %s / %s", local.Raw, resp)
	}
	ref := func(id string) string { return `{"type":"item_reference","id":"` + id + `"}` }
	user := `{"role":"user","content":"go on"}`
	// What went upstream: the stand-in's call with these commands, and the output with this text.
	type sent struct{ commands, output string }
	for _, tc := range []struct {
		name   string
		tool   string // the shell tool's environment
		items  []string
		caller string
		status int
		msg    string
		want   sent
	}{
		{"a local call and the client's output", `{"type":"local"}`, []string{ref(local.Get("id").String()), shellOutputOf(local.Get("call_id").String()), user}, "k1", 200, "",
			sent{`"ls -la"`, `"stdout":"a.txt\n"`}},
		{"a local call without its output", `{"type":"local"}`, []string{ref(local.Get("id").String()), user}, "k1", 400,
			"No tool output found for shell call " + local.Get("call_id").String() + ".", sent{}},
		{"a hosted call and its output", `{"type":"container_auto"}`, []string{ref(hostedCall.Get("id").String()), ref(hostedOut.Get("id").String()), user}, "k1", 200, "",
			sent{`"echo one"`, `"stdout":"one\n"`}},
		{"a hosted output without its call", `{"type":"container_auto"}`, []string{ref(hostedOut.Get("id").String()), user}, "k1", 400,
			"No tool call found for shell call output with call_id " + hostedCall.Get("call_id").String() + ".", sent{}},
		{"another caller's call", `{"type":"local"}`, []string{ref(local.Get("id").String()), shellOutputOf(local.Get("call_id").String()), user}, "k2", 0, "", sent{}},
		{"an unknown id", `{"type":"local"}`, []string{ref("sh_unknown"), shellOutputOf(local.Get("call_id").String()), user}, "k1", 0, "", sent{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(h.up.Requests())
			unknown := tc.status == 0
			if tc.status == 200 {
				h.up.Enqueue(text("ok"))
			}
			body := `{"model":"gpt-test","store":false,"tools":[{"type":"shell","environment":` + tc.tool + `}],"input":[` + strings.Join(tc.items, ",") + `]}`
			status, resp := h.post(body, tc.caller)
			reqs := h.up.Requests()
			switch {
			case unknown && api.chat:
				// Nobody upstream could resolve it: OpenAI's 404 for an item it does not hold.
				id := gjson.Get(tc.items[0], "id").String()
				if status != 404 || gjson.GetBytes(resp, "error.message").String() != "Item with id '"+id+"' not found." || len(reqs) != before {
					t.Errorf("answer %d %s, %d sent; want 404 for %s, nothing sent", status, resp, len(reqs)-before, id)
				}
			case unknown:
				// The upstream may hold it: the reference goes on as sent, and the output with it
				// (the scripted upstream holds nothing, and answers OpenAI's 404).
				if len(reqs) != before+1 || len(inputItems(reqs[before], "item_reference")) != 1 ||
					len(inputItems(reqs[before], "function_call")) != 0 || len(fcOutputs(reqs[before])) != 1 || status != 404 {
					t.Errorf("answer %d %s, %d sent; want the reference passed on", status, resp, len(reqs)-before)
				}
			case tc.status == 400:
				if status != 400 || gjson.GetBytes(resp, "error.message").String() != tc.msg || gjson.GetBytes(resp, "error.param").String() != "input" || len(reqs) != before {
					t.Errorf("answer %d %s, %d sent; want 400 %q, nothing sent", status, resp, len(reqs)-before, tc.msg)
				}
			default:
				if status != 200 || len(reqs) != before+1 {
					t.Fatalf("answer %d %s, %d sent", status, resp, len(reqs)-before)
				}
				last := reqs[len(reqs)-1]
				calls, outs := inputItems(last, "function_call"), fcOutputs(last)
				if n := len(inputItems(last, "item_reference")); n != 0 {
					t.Errorf("%d item_reference items went upstream", n)
				}
				if len(calls) != 1 || gjson.GetBytes(calls[0], "name").String() != "shell" || !strings.Contains(gjson.GetBytes(calls[0], "arguments").String(), tc.want.commands) ||
					len(outs) != 1 || !strings.Contains(outs[0], tc.want.output) {
					t.Errorf("upstream got calls %s and outputs %q; want %s and %s", calls, outs, tc.want.commands, tc.want.output)
				}
			}
		})
	}
}

// TestShellBudgets: shell calls count in the response's budgets as code calls do: past
// max_executions or max_response_output a call is shown, not run, the model is told which limit
// stopped it, and its next turn has tools off.
func TestShellBudgets(t *testing.T) {
	long := strings.Repeat("o", 600)
	for _, tc := range []struct {
		name string
		cfg  func(*config.Config)
		note string
	}{
		{"max_executions", func(c *config.Config) { c.Interception.MaxExecutions = 2 }, "max_executions"},
		{"max_response_output", func(c *config.Config) { c.Interception.MaxResponseOutput = 1000 }, "max_response_output"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, withConfig(tc.cfg))
			h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{shellCall("echo " + long), shellCall("echo " + long), shellCall("echo " + long)}})
			h.up.Script(func(r upstreamtest.Request) upstreamtest.Turn {
				if string(r.ToolChoice) == `"none"` {
					return text("Final answer.")
				}
				return upstreamtest.Turn{Items: []upstreamtest.Item{shellCall("echo again")}}
			})
			status, resp := h.post(shellBody(containerAuto, ""), "k1")
			if status != 200 {
				t.Fatalf("status %d: %s", status, resp)
			}
			if ran := len(h.fake.Codes()); ran != 2 {
				t.Errorf("ran %d commands; want 2", ran)
			}
			outs := gjson.GetBytes(resp, `output.#(type=="shell_call_output")#.status`).Array()
			if len(outs) != 3 || outs[0].String() != "completed" || outs[1].String() != "completed" || outs[2].String() != "incomplete" {
				t.Errorf("output statuses %v", outs)
			}
			reqs := h.up.Requests()
			last := reqs[len(reqs)-1]
			if len(reqs) != 2 || string(last.ToolChoice) != `"none"` {
				t.Fatalf("%d upstream calls, the last with tool_choice %s; want 2, the second with tools off", len(reqs), last.ToolChoice)
			}
			if told := fcOutputs(last); len(told) != 3 || !strings.Contains(told[2], tc.note) || strings.Contains(told[2], long) {
				t.Errorf("the model was told %q; want the third call stopped by %s", told, tc.note)
			}
		})
	}
}
