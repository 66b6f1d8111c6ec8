package intercept

import (
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestChatDeploymentRefusesAsOpenAI: a request a Chat Completions upstream would refuse in its
// own terms (messages[...], tool_call_id) is refused before anything goes upstream, with the
// error OpenAI's Responses API gives for it.
func TestChatDeploymentRefusesAsOpenAI(t *testing.T) {
	const ci = `"tools":[{"type":"code_interpreter","container":{"type":"auto"}}]`
	const fn = `{"type":"function","name":"f","parameters":{"type":"object","properties":{}}}`
	call := func(id string) string {
		return `{"type":"function_call","call_id":"` + id + `","name":"f","arguments":"{}"}`
	}
	output := func(id string) string {
		return `{"type":"function_call_output","call_id":"` + id + `","output":"ok"}`
	}
	user := `{"role":"user","content":"and?"}`
	tests := []struct {
		name, body          string
		param, code, substr string // code "" wants null
	}{
		{"a call without its output, then more input",
			`{"model":"gpt-test","input":[` + user + `,` + call("call_1") + `,` + user + `],"tools":[` + fn + `,{"type":"code_interpreter","container":{"type":"auto"}}]}`,
			"input", "", "No tool output found for function call call_1."},
		{"one of two calls answered",
			`{"model":"gpt-test","input":[` + user + `,` + call("call_1") + `,` + call("call_2") + `,` + output("call_2") + `],"tools":[` + fn + `,{"type":"code_interpreter","container":{"type":"auto"}}]}`,
			"input", "", "No tool output found for function call call_1."},
		{"an output answering no call",
			`{"model":"gpt-test","input":[` + user + `,` + output("call_9") + `],` + ci + `}`,
			"input", "", "No tool call found for function call output with call_id call_9."},
		{"an output before its call",
			`{"model":"gpt-test","input":[` + user + `,` + output("call_1") + `,` + call("call_1") + `],"tools":[` + fn + `,{"type":"code_interpreter","container":{"type":"auto"}}]}`,
			"input", "", "No tool call found for function call output with call_id call_1."},
		{"no input", `{"model":"gpt-test",` + ci + `}`, "input", "missing_required_parameter", "Missing required parameter: 'input'."},
		{"null input", `{"model":"gpt-test","input":null,` + ci + `}`, "input", "missing_required_parameter", "Missing required parameter: 'input'."},
		{"an empty input", `{"model":"gpt-test","input":[],` + ci + `}`, "input", "empty_array", "Invalid 'input': empty array."},
		{"instructions without input", `{"model":"gpt-test","instructions":"be brief",` + ci + `}`, "input", "missing_required_parameter", "Missing required parameter: 'input'."},
		{"input of the wrong type", `{"model":"gpt-test","input":5,` + ci + `}`, "input", "invalid_type", "Invalid type for 'input'"},
		{"tools of the wrong type", `{"model":"gpt-test","input":"x","tools":{"type":"code_interpreter","container":{"type":"auto"}}}`, "tools", "invalid_type", "Invalid type for 'tools'"},
		{"tool_choice code_interpreter without the tool",
			`{"model":"gpt-test","input":"x","tools":[` + fn + `],"tool_choice":{"type":"code_interpreter"}}`,
			"tool_choice", "", "Tool choice 'code_interpreter' not found in 'tools' parameter."},
		{"tool_choice web_search_preview without the tool",
			`{"model":"gpt-test","input":"x","tool_choice":{"type":"web_search_preview"}}`,
			"tool_choice", "", "Tool choice 'web_search_preview' not found in 'tools' parameter."},
	}
	for _, api := range []upstreamAPI{vllmAPI, llamaCppAPI} {
		for _, tt := range tests {
			t.Run(api.name+"/"+tt.name, func(t *testing.T) {
				h := newHarness(t, onAPI(api))
				status, resp := h.post(tt.body, "k")
				e := gjson.GetBytes(resp, "error")
				if status != 400 || e.Get("type").String() != "invalid_request_error" || e.Get("param").String() != tt.param ||
					e.Get("code").String() != tt.code || !gjson.GetBytes(resp, "error.message").Exists() {
					t.Errorf("answer %d %s; want 400 invalid_request_error, param %q, code %q", status, resp, tt.param, tt.code)
				}
				if msg := e.Get("message").String(); len(msg) < len(tt.substr) || msg[:len(tt.substr)] != tt.substr {
					t.Errorf("message %q; want it to start %q", msg, tt.substr)
				}
				if tt.code == "" && e.Get("code").Type.String() != "Null" {
					t.Errorf("code %s; want null", e.Get("code").Raw)
				}
				if n := len(h.up.Requests()); n != 0 {
					t.Errorf("%d requests went upstream; want none", n)
				}
			})
		}
	}
}

// TestChatDeploymentUnansweredStoredCall: a client function call kept in the stored
// conversation, continued with previous_response_id by anything but its output, is OpenAI's
// 400 for it, and nothing goes upstream.
func TestChatDeploymentUnansweredStoredCall(t *testing.T) {
	for _, api := range []upstreamAPI{vllmAPI, llamaCppAPI} {
		t.Run(api.name, func(t *testing.T) {
			h := newHarness(t, onAPI(api))
			h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("f", `{}`)}})
			const tools = `"tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{}}},{"type":"code_interpreter","container":{"type":"auto"}}]`
			status, resp := h.post(`{"model":"gpt-test","input":"call f",`+tools+`}`, "k")
			callID := gjson.GetBytes(resp, `output.#(type=="function_call").call_id`).String()
			if status != 200 || callID == "" {
				t.Fatalf("first turn: %d %s", status, resp)
			}
			before := len(h.up.Requests())
			status, resp = h.post(`{"model":"gpt-test","previous_response_id":"`+gjson.GetBytes(resp, "id").String()+`","input":"and?",`+tools+`}`, "k")
			want := "No tool output found for function call " + callID + "."
			if status != 400 || gjson.GetBytes(resp, "error.message").String() != want || gjson.GetBytes(resp, "error.param").String() != "input" {
				t.Errorf("answer %d %s; want 400 %q, param input", status, resp, want)
			}
			if n := len(h.up.Requests()); n != before {
				t.Errorf("%d more requests went upstream; want none", n-before)
			}
		})
	}
}
