package intercept

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

const weatherTool = `{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}`

func TestClientFunctionBesideOurs(t *testing.T) { forEachAPI(t, testClientFunctionBesideOurs) }

func testClientFunctionBesideOurs(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api), withLocal(), withConfig(func(c *config.Config) { c.Interception.ContainerIdleTimeout = 600e9 }))
	h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{
		call("t = 21"),
		{Type: "function_call", Name: "get_weather", Arguments: `{"city":"Paris"}`, CallID: "call_weather"},
	}})
	tools := `"tools":[{"type":"code_interpreter","container":{"type":"auto"}},` + weatherTool + `]`
	status, resp := h.post(`{"model":"gpt-test","input":"weather and math",`+tools+`}`, "k")
	if status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	if got := strings.Join(types(resp), ","); got != "code_interpreter_call,function_call" {
		t.Fatalf("output = %s", got)
	}
	if n := gjson.GetBytes(resp, "output.1.name").String(); n != "get_weather" {
		t.Errorf("client call = %s", gjson.GetBytes(resp, "output.1").Raw)
	}
	if len(h.up.Requests()) != 1 {
		t.Fatalf("upstream calls = %d; want 1 (the client's call returns at once)", len(h.up.Requests()))
	}

	// The client answers its call; the upstream must also get the output of ours, which the
	// client never saw as a function call (the scripted upstream rejects a call without output).
	id := gjson.GetBytes(resp, "id").String()
	h.up.Enqueue(calls("t * 2"), text("Sunny, and 42."))
	status, resp = h.post(`{"model":"gpt-test","previous_response_id":"`+id+`","input":[{"type":"function_call_output","call_id":"call_weather","output":"sunny"}],`+tools+`}`, "k")
	if status != 200 {
		t.Fatalf("second turn: %d %s", status, resp)
	}
	reqs := h.up.Requests()
	switch {
	case api.chat:
		// The upstream keeps nothing: the proxy resends the conversation, both calls answered.
		if outs := fcOutputs(reqs[1]); len(outs) != 2 || outs[1] != "sunny" {
			t.Errorf("outputs sent upstream = %q; want ours then the client's", outs)
		}
	case reqs[1].PreviousResponseID == id || reqs[1].PreviousResponseID == "":
		t.Errorf("previous_response_id sent upstream = %q; want the upstream's id", reqs[1].PreviousResponseID)
	}
	if gjson.GetBytes(resp, "previous_response_id").String() != id {
		t.Errorf("response previous_response_id = %s; want ours", gjson.GetBytes(resp, "previous_response_id").Raw)
	}
	// The chain kept its container: t is still defined.
	if out := fcOutputs(reqs[2]); len(out) == 0 || out[len(out)-1] != "42" {
		t.Errorf("model saw %q; want 42 from the same container", out)
	}
}

func TestStatelessReplay(t *testing.T) { forEachAPI(t, testStatelessReplay) }

func testStatelessReplay(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api), withLocal())
	h.up.Enqueue(calls("print('first')"), text("Printed."))
	status, resp := h.post(body(`"store":false,"include":["code_interpreter_call.outputs"]`), "k")
	if status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	prior := gjson.GetBytes(resp, "output").Array()
	tests := []struct {
		name  string
		items []string
		want  string // the function_call_output the upstream gets
	}{
		{"items sent back verbatim", []string{prior[0].Raw, prior[1].Raw}, "first\n"},
		{"code and outputs absent", []string{`{"type":"code_interpreter_call","id":"ci_unknown","status":"completed","container_id":"cntr_x"}`}, "[no output]"},
		{"outputs null falls back to what the model saw", []string{`{"type":"code_interpreter_call","id":"` + prior[0].Get("id").String() + `","code":null,"outputs":null}`}, "first\n"},
		{"an item_reference to a minted call", []string{`{"type":"item_reference","id":"` + prior[0].Get("id").String() + `"}`}, "first\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h.up.Enqueue(text("ok"))
			in := `[{"role":"user","content":"compute"},` + strings.Join(tt.items, ",") + `,{"role":"user","content":"again"}]`
			status, resp := h.post(`{"model":"gpt-test","store":false,"input":`+in+`,"tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`, "k")
			if status != 200 {
				t.Fatalf("status %d: %s", status, resp)
			}
			reqs := h.up.Requests()
			last := reqs[len(reqs)-1]
			if n := len(inputItems(last, "code_interpreter_call")); n != 0 {
				t.Errorf("code_interpreter_call items sent upstream: %d", n)
			}
			fc := inputItems(last, "function_call")
			outs := fcOutputs(last)
			if len(fc) != 1 || len(outs) != 1 || gjson.GetBytes(fc[0], "name").String() != "python" {
				t.Fatalf("upstream input = %s", last.Body)
			}
			if outs[0] != tt.want {
				t.Errorf("function_call_output = %q; want %q", outs[0], tt.want)
			}
		})
	}
}

func TestPreviousResponseChain(t *testing.T) { forEachAPI(t, testPreviousResponseChain) }

func testPreviousResponseChain(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api), withLocal(), withConfig(func(c *config.Config) { c.Interception.ContainerIdleTimeout = 600e9 }))
	h.up.Enqueue(calls("n = 1"), text("Set."))
	_, resp := h.post(body(""), "alice")
	id := gjson.GetBytes(resp, "id").String()
	cid := gjson.GetBytes(resp, "output.0.container_id").String()

	h.up.Enqueue(calls("n + 1"), text("Two."))
	status, resp := h.post(body(`"previous_response_id":"`+id+`"`), "alice")
	if status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	if got := gjson.GetBytes(resp, "output.0.container_id").String(); got != cid {
		t.Errorf("container = %s; want the chain's %s", got, cid)
	}
	reqs := h.up.Requests()
	if out := fcOutputs(reqs[len(reqs)-1]); len(out) == 0 || out[len(out)-1] != "2" {
		t.Errorf("model saw %q; want 2", out)
	}

	// Another caller cannot continue alice's chain: the id is passed through unknown, or, for an
	// upstream that keeps nothing, is not found by the proxy.
	before := len(h.up.Requests())
	if !api.chat {
		h.up.Enqueue(upstreamtest.Turn{Error: upstreamtest.APIError(400, "previous_response_not_found", "Previous response with id '"+id+"' not found.", "previous_response_id")})
	}
	status, raw := h.post(body(`"previous_response_id":"`+id+`"`), "mallory")
	if status != 400 || gjson.GetBytes(raw, "error.code").String() != "previous_response_not_found" {
		t.Errorf("mallory's answer = %d %s; want 400 previous_response_not_found", status, raw)
	}
	if api.chat && len(h.up.Requests()) != before {
		t.Error("mallory's request went upstream")
	}
}

// TestChainKeepsContainerAcrossTurnWithoutTool: a turn without the code_interpreter tool in the
// middle of a previous_response_id chain does not lose the conversation's container: the next
// turn with the tool runs in it again, as OpenAI reuses the context's container.
func TestChainKeepsContainerAcrossTurnWithoutTool(t *testing.T) {
	forEachAPI(t, testChainKeepsContainerAcrossTurnWithoutTool)
}

func testChainKeepsContainerAcrossTurnWithoutTool(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api), withConfig(func(c *config.Config) { c.Interception.ContainerIdleTimeout = 600e9 }))
	h.up.Enqueue(calls("n = 1"), text("Set."))
	_, resp := h.post(body(""), "alice")
	id := gjson.GetBytes(resp, "id").String()
	cid := gjson.GetBytes(resp, "output.0.container_id").String()

	h.up.Enqueue(text("Summed up."))
	status, resp := h.post(`{"model":"gpt-test","input":"sum up","previous_response_id":"`+id+`"}`, "alice")
	if status != 200 {
		t.Fatalf("the turn without the tool = %d %s", status, resp)
	}
	id = gjson.GetBytes(resp, "id").String()

	h.up.Enqueue(calls("n + 1"), text("Two."))
	status, resp = h.post(body(`"previous_response_id":"`+id+`"`), "alice")
	if got := gjson.GetBytes(resp, "output.0.container_id").String(); status != 200 || got != cid {
		t.Errorf("third turn = %d, container %s; want the conversation's %s", status, got, cid)
	}
}

func TestUpstreamErrors(t *testing.T) { forEachAPI(t, testUpstreamErrors) }

func testUpstreamErrors(t *testing.T, api upstreamAPI) {
	rate := upstreamtest.APIError(429, "rate_limit_exceeded", "Slow down.", "")
	tests := []struct {
		name   string
		stream bool
		turns  []upstreamtest.Turn
		// JSON (and streams failing before the first event): status and error code.
		status int
		code   string
		// Streams failing later: the error event's code.
		eventCode string
	}{
		{"first call json", false, []upstreamtest.Turn{{Error: rate}}, 429, "rate_limit_exceeded", ""},
		{"first call stream", true, []upstreamtest.Turn{{Error: rate}}, 429, "rate_limit_exceeded", ""},
		{"second call json", false, []upstreamtest.Turn{calls("1"), {Error: rate}}, 429, "rate_limit_exceeded", ""},
		{"second call stream", true, []upstreamtest.Turn{calls("1"), {Error: rate}}, 200, "", "rate_limit_exceeded"},
		{"failed mid-stream", true, []upstreamtest.Turn{calls("1"), {Items: []upstreamtest.Item{upstreamtest.Text("x")}, Fail: &upstreamtest.Failure{After: 0, Code: "server_error", Message: "boom"}}}, 200, "", "server_error"},
		{"cut mid-stream", true, []upstreamtest.Turn{{Items: []upstreamtest.Item{upstreamtest.Text("hello there")}, Cut: true, CutAfter: 4}}, 200, "", "upstream_error"},
		// A JSON answer whose body breaks off, or is not JSON: the upstream was reached.
		{"json cut after the headers", false, []upstreamtest.Turn{{Items: []upstreamtest.Item{upstreamtest.Text("hello there")}, Cut: true}}, 502, "upstream_error", ""},
		{"json cut mid-body", false, []upstreamtest.Turn{calls("1"), {Items: []upstreamtest.Item{upstreamtest.Text("hello there")}, Cut: true, CutAfter: 30}}, 502, "upstream_error", ""},
		{"json not JSON", false, []upstreamtest.Turn{{Error: &upstreamtest.HTTPError{Status: 200, Body: "<html>busy</html>"}}}, 502, "upstream_error", ""},
	}
	messages := map[string]string{
		"json cut after the headers": "The upstream's response ended early.",
		"json cut mid-body":          "The upstream's response ended early.",
		"json not JSON":              "The upstream's response could not be read.",
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, onAPI(api))
			h.up.Enqueue(tt.turns...)
			if api.name == llamaCppAPI.name && tt.eventCode == "server_error" {
				// llama.cpp reports the failure on an "error:" line SSE readers skip: a cut stream.
				tt.eventCode = "upstream_error"
			}
			extra := ""
			if tt.stream {
				extra = `"stream":true`
			}
			status, raw := h.post(body(extra), "k")
			if status != tt.status {
				t.Fatalf("status = %d; want %d: %s", status, tt.status, raw)
			}
			if tt.code != "" {
				if c := gjson.GetBytes(raw, "error.code").String(); c != tt.code {
					t.Errorf("error code = %q; want %q (%s)", c, tt.code, raw)
				}
				if m, ok := messages[tt.name]; ok && gjson.GetBytes(raw, "error.message").String() != m {
					t.Errorf("error message = %s; want %q", gjson.GetBytes(raw, "error.message").Raw, m)
				}
				return
			}
			checkStream(t, raw)
			evs := parseSSE(t, raw)
			n := len(evs)
			if n < 2 || evs[n-1].Name != "response.failed" || evs[n-2].Name != "error" {
				t.Fatalf("stream ends with %v", eventTypes(evs))
			}
			if c := gjson.GetBytes(evs[n-2].Data, "error.code").String(); c != tt.eventCode {
				t.Errorf("error event code = %q; want %q", c, tt.eventCode)
			}
			if strings.Count(string(raw), "event: error\n") != 1 {
				t.Errorf("error events = %d; want 1", strings.Count(string(raw), "event: error\n"))
			}
			if strings.Contains(string(raw), `"name":"python"`) {
				t.Errorf("the stand-in leaked")
			}
		})
	}
}

func TestUnstoredReasoningIsCarriedEncrypted(t *testing.T) {
	tests := []struct {
		name      string
		extra     string
		firstAsks bool // the first call already asks for encrypted reasoning
	}{
		{"a reasoning field asks from the first call", `"store":false,"reasoning":{"effort":"low"}`, true},
		{"reasoning items ask from the next call", `"store":false`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.up.Enqueue(
				upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Reasoning("plan"), call("1")}},
				upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Reasoning("check"), call("2")}},
				upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Reasoning(""), upstreamtest.Text("done")}},
			)
			status, resp := h.post(body(tt.extra), "k")
			if status != 200 {
				t.Fatalf("status %d: %s", status, resp)
			}
			reqs := h.up.Requests()
			if got := reqs[0].Includes(includeEncrypted); got != tt.firstAsks {
				t.Errorf("first call asks for encrypted reasoning = %v; want %v", got, tt.firstAsks)
			}
			for _, r := range reqs[1:] {
				if !r.Includes(includeEncrypted) {
					t.Errorf("call %d does not ask for encrypted reasoning", r.N)
				}
			}
			// The third call carries the second turn's reasoning, encrypted.
			if rs := reqs[2].InputItems("reasoning"); len(rs) == 0 || !gjson.GetBytes(rs[len(rs)-1], "encrypted_content").Exists() {
				t.Errorf("reasoning carried into the third call: %d items", len(rs))
			}
			if strings.Contains(string(resp), "encrypted_content") {
				t.Errorf("the client got encrypted_content it did not ask for")
			}
		})
	}
}

// TestUnstoredReasoningIsCarriedAsText: a Chat Completions upstream's reasoning has no encrypted
// form; its items carry the text, which goes back to the model with each turn (as
// reasoning_content), stored or not.
func TestUnstoredReasoningIsCarriedAsText(t *testing.T) {
	for _, api := range []upstreamAPI{vllmAPI, llamaCppAPI} {
		for _, store := range []string{"true", "false"} {
			t.Run(api.name+" store "+store, func(t *testing.T) {
				h := newHarness(t, onAPI(api))
				h.up.Enqueue(
					upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Reasoning("plan"), call("1")}},
					upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Reasoning("check"), call("2")}},
					upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("done")}},
				)
				status, resp := h.post(body(`"store":`+store+`,"reasoning":{"effort":"low"}`), "k")
				if status != 200 {
					t.Fatalf("status %d: %s", status, resp)
				}
				var carried []string
				for _, it := range inputItems(h.up.Requests()[2], "reasoning") {
					carried = append(carried, gjson.GetBytes(it, "content.0.text").String())
				}
				if strings.Join(carried, ",") != "plan,check" {
					t.Errorf("reasoning carried into the third call = %q; want plan, check", carried)
				}
				if got := strings.Join(types(resp), ","); got != "reasoning,code_interpreter_call,reasoning,code_interpreter_call,message" {
					t.Errorf("output = %s", got)
				}
				if rs := gjson.GetBytes(resp, "output.0.content.0.text").String(); rs != "plan" {
					t.Errorf("the client's reasoning item = %s", gjson.GetBytes(resp, "output.0").Raw)
				}
			})
		}
	}
}

// TestKeptConversation: for an upstream that keeps nothing, the proxy keeps each stored
// response's conversation: a chain resends it all, references to its items resolve, and what was
// not kept (store false) cannot be continued.
func TestKeptConversation(t *testing.T) {
	for _, api := range []upstreamAPI{vllmAPI, llamaCppAPI} {
		t.Run(api.name, func(t *testing.T) {
			h := newHarness(t, onAPI(api))
			h.up.Enqueue(calls("n = 1"), text("Set."))
			_, resp := h.post(body(""), "alice")
			first := gjson.GetBytes(resp, "id").String()
			msg := gjson.GetBytes(resp, `output.#(type=="message").id`).String()

			h.up.Enqueue(text("Two."))
			status, resp := h.post(body(`"previous_response_id":"`+first+`"`), "alice")
			if status != 200 {
				t.Fatalf("second: %d %s", status, resp)
			}
			second := gjson.GetBytes(resp, "id").String()
			h.up.Enqueue(text("Three."))
			in := `[{"type":"item_reference","id":"` + msg + `"},{"role":"user","content":"and?"}]`
			status, resp = h.post(`{"model":"gpt-test","previous_response_id":"`+second+`","input":`+in+`,"tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`, "alice")
			if status != 200 {
				t.Fatalf("third: %d %s", status, resp)
			}
			reqs := h.up.Requests()
			last := reqs[len(reqs)-1]
			var seen []string
			for _, it := range last.History {
				s := gjson.GetBytes(it, "type").String()
				if s == "message" {
					c := gjson.GetBytes(it, "content")
					if c.IsArray() {
						c = c.Get("0.text")
					}
					s = gjson.GetBytes(it, "role").String() + ":" + c.String()
				}
				seen = append(seen, s)
			}
			want := "user:compute,function_call,function_call_output,assistant:Set.,user:compute,assistant:Two.,assistant:Set.,user:and?"
			if got := strings.Join(seen, ","); got != want {
				t.Errorf("the third call saw\n%s\nwant\n%s", got, want)
			}
			if _, ok := last.Fields["previous_response_id"]; ok {
				t.Error("previous_response_id went upstream")
			}

			h.up.Enqueue(text("Unstored."))
			_, resp = h.post(body(`"store":false`), "alice")
			before := len(h.up.Requests())
			status, raw := h.post(body(`"previous_response_id":"`+gjson.GetBytes(resp, "id").String()+`"`), "alice")
			if status != 400 || gjson.GetBytes(raw, "error.code").String() != "previous_response_not_found" || len(h.up.Requests()) != before {
				t.Errorf("continuing a store:false response = %d %s; want 400 previous_response_not_found, nothing sent", status, raw)
			}

			// A reference to an item the proxy does not hold is OpenAI's 404, nothing sent.
			status, raw = h.post(`{"model":"gpt-test","previous_response_id":"`+second+`","input":[{"type":"item_reference","id":"msg_unknown"}]}`, "alice")
			if status != 404 || gjson.GetBytes(raw, "error.message").String() != "Item with id 'msg_unknown' not found." ||
				gjson.GetBytes(raw, "error.param").String() != "input" || len(h.up.Requests()) != before {
				t.Errorf("an unknown item_reference = %d %s; want 404 naming the item, nothing sent", status, raw)
			}
		})
	}
}
