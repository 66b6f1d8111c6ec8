package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
)

func TestNewChatRequest(t *testing.T) {
	const fnTool = `{"type":"function","name":"python","description":"Run <code> & more","parameters":{"type":"object","properties":{"code":{"type":"string"}},"required":["code"],"additionalProperties":false},"strict":true}`
	const fnChat = `{"type":"function","function":{"name":"python","description":"Run <code> & more","parameters":{"type":"object","properties":{"code":{"type":"string"}},"required":["code"],"additionalProperties":false},"strict":true}}`
	tests := []struct {
		name string
		body string
		opts Options
		want string
	}{
		{"a string input after instructions becomes a system and a user message",
			`{"model":"m","instructions":"Be brief.","input":"hi <b>"}`,
			Options{}, `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi <b>"}]}`},
		{"null fields are not set",
			`{"model":"m","input":"hi","instructions":null,"temperature":null,"tools":null,"tool_choice":null,"background":null,"previous_response_id":null,"conversation":null}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{"one text part is a string, several stay parts, developer becomes system",
			`{"model":"m","input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"Rules."}]},` +
				`{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]}]}`,
			Options{}, `{"model":"m","messages":[{"role":"system","content":"Rules."},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`},
		{"images and files become image_url and file parts",
			`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"What is it?"},` +
				`{"type":"input_image","image_url":"data:image/png;base64,iVBOR","detail":"high"},{"type":"input_image","image_url":"https://x/y.png"},` +
				`{"type":"input_file","filename":"a.pdf","file_data":"data:application/pdf;base64,JVBER"}]}]}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"What is it?"},` +
				`{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBOR","detail":"high"}},{"type":"image_url","image_url":{"url":"https://x/y.png"}},` +
				`{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,JVBER"}}]}]}`},
		{"consecutive calls are one assistant message, each output a tool message",
			`{"model":"m","input":[{"role":"user","content":"go"},` +
				`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"python","arguments":"{\"code\":\"1\"}","status":"completed"},` +
				`{"type":"function_call","call_id":"call_2","name":"lookup","arguments":"{}"},` +
				`{"type":"function_call_output","call_id":"call_1","output":"1"},` +
				`{"type":"function_call_output","call_id":"call_2","output":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},` +
				`{"type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Done.","annotations":[]}]}]}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"go"},` +
				`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"python","arguments":"{\"code\":\"1\"}"}},{"id":"call_2","type":"function","function":{"name":"lookup","arguments":"{}"}}]},` +
				`{"role":"tool","content":"1","tool_call_id":"call_1"},{"role":"tool","content":"ab","tool_call_id":"call_2"},` +
				`{"role":"assistant","content":"Done."}]}`},
		{"calls after the model's text join its message; sequential turns stay apart",
			`{"model":"m","input":[{"role":"assistant","content":"Let me run it."},` +
				`{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"a","output":"x"},` +
				`{"type":"function_call","call_id":"b","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"b","output":"y"}]}`,
			Options{}, `{"model":"m","messages":[{"role":"assistant","content":"Let me run it.","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
				`{"role":"tool","content":"x","tool_call_id":"a"},` +
				`{"role":"assistant","content":null,"tool_calls":[{"id":"b","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
				`{"role":"tool","content":"y","tool_call_id":"b"}]}`},
		// OpenAI pairs calls and outputs by call_id; a chat server needs each assistant message's
		// tool messages right after it, in the order of its calls.
		{"an output after a message still answers its call, right after it",
			`{"model":"m","input":[{"role":"user","content":"go"},{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},` +
				`{"role":"user","content":"and hurry"},{"type":"function_call_output","call_id":"a","output":"x"}]}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"go"},` +
				`{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
				`{"role":"tool","content":"x","tool_call_id":"a"},{"role":"user","content":"and hurry"}]}`},
		{"outputs in another order than their calls follow the calls' order",
			`{"model":"m","input":[{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},{"type":"function_call","call_id":"b","name":"g","arguments":"{}"},` +
				`{"type":"function_call_output","call_id":"b","output":"y"},{"role":"assistant","content":"half done"},{"type":"function_call_output","call_id":"a","output":"x"}]}`,
			Options{}, `{"model":"m","messages":[` +
				`{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]},` +
				`{"role":"tool","content":"x","tool_call_id":"a"},{"role":"tool","content":"y","tool_call_id":"b"},{"role":"assistant","content":"half done"}]}`},
		{"outputs of two turns, given after both",
			`{"model":"m","input":[{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},{"role":"user","content":"next"},` +
				`{"type":"function_call","call_id":"b","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"b","output":"y"},{"type":"function_call_output","call_id":"a","output":"x"}]}`,
			Options{}, `{"model":"m","messages":[` +
				`{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"x","tool_call_id":"a"},` +
				`{"role":"user","content":"next"},` +
				`{"role":"assistant","content":null,"tool_calls":[{"id":"b","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"y","tool_call_id":"b"}]}`},
		{"reasoning is dropped by default",
			`{"model":"m","input":[{"role":"user","content":"q"},{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"think"}]},{"role":"assistant","content":"a"}]}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}`},
		{"reasoning rides on the next assistant message as reasoning_content",
			`{"model":"m","input":[{"role":"user","content":"q"},{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"think"}]},` +
				`{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},{"type":"reasoning","id":"rs_2","summary":[],"content":[{"type":"reasoning_text","text":"more"}]},` +
				`{"type":"function_call","call_id":"b","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"a","output":"x"},{"type":"function_call_output","call_id":"b","output":"y"},` +
				`{"type":"reasoning","id":"rs_3","summary":[{"type":"summary_text","text":"only a summary"}],"encrypted_content":"gAAA"},{"role":"assistant","content":"a"}]}`,
			Options{ReasoningField: "reasoning_content"},
			`{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":null,"reasoning_content":"think\n\nmore","tool_calls":[` +
				`{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"b","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
				`{"role":"tool","content":"x","tool_call_id":"a"},{"role":"tool","content":"y","tool_call_id":"b"},{"role":"assistant","content":"a"}]}`},
		{"reasoning as reasoning, and none for a user message",
			`{"model":"m","input":[{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"lost"}]},{"role":"user","content":"q"},` +
				`{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"kept"}]},{"role":"assistant","content":[{"type":"output_text","text":"a"},{"type":"refusal","refusal":"no"}]}]}`,
			Options{ReasoningField: "reasoning"},
			`{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a","refusal":"no","reasoning":"kept"}]}`},
		{"function tools keep strict; tool_choice, parallel_tool_calls and sampling pass",
			`{"model":"m","input":"x","tools":[` + fnTool + `,{"type":"function","name":"f"}],"tool_choice":"required","parallel_tool_calls":false,"temperature":0.5,"top_p":0.9,"max_output_tokens":100}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[` + fnChat + `,{"type":"function","function":{"name":"f"}}],` +
				`"tool_choice":"required","parallel_tool_calls":false,"max_tokens":100,"temperature":0.5,"top_p":0.9}`},
		{"a named function",
			`{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"f"}}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}}`},
		{"allowed_tools cuts the tools list down and keeps its mode",
			`{"model":"m","input":"x","tools":[{"type":"function","name":"a"},{"type":"function","name":"b"},{"type":"function","name":"c"}],` +
				`"tool_choice":{"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"c"},{"type":"function","name":"a"}]}}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"c"}},{"type":"function","function":{"name":"a"}}],"tool_choice":"required"}`},
		{"auto, none and parallel_tool_calls without tools are left out",
			`{"model":"m","input":"x","tool_choice":"none","parallel_tool_calls":true}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"x"}]}`},
		{"max_completion_tokens when the deployment wants it",
			`{"model":"m","input":"x","max_output_tokens":64}`,
			Options{MaxCompletionTokens: true}, `{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":64}`},
		{"json_schema, verbosity and reasoning effort",
			`{"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"out","description":"d","schema":{"type":"object"},"strict":true},"verbosity":"low"},"reasoning":{"effort":"high","summary":"auto"}}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"out","description":"d","schema":{"type":"object"},"strict":true}},"reasoning_effort":"high","verbosity":"low"}`},
		{"json_object, and text format text is the default",
			`{"model":"m","input":"x","text":{"format":{"type":"json_object"}}}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}`},
		{"a stream asks for usage",
			`{"model":"m","input":"x","stream":true,"stream_options":{"include_obfuscation":false}}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}`},
		{"identity and caching fields pass; store, metadata, include and truncation are the proxy's",
			`{"model":"m","input":"x","user":"u","safety_identifier":"s","prompt_cache_key":"k","prompt_cache_retention":"24h","service_tier":"flex",` +
				`"store":false,"metadata":{"a":"b"},"include":["reasoning.encrypted_content"],"truncation":"auto","max_tool_calls":3,"top_logprobs":2,"background":false}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"x"}],"user":"u","safety_identifier":"s","prompt_cache_key":"k","prompt_cache_retention":"24h","service_tier":"flex"}`},
		{"logprobs when included",
			`{"model":"m","input":"x","include":["message.output_text.logprobs"],"top_logprobs":2}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":2}`},
		{"fields Responses does not define pass through",
			`{"model":"m","input":"x","top_k":20,"chat_template_kwargs":{"enable_thinking":false},"top_k":40}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"x"}],"top_k":40,"chat_template_kwargs":{"enable_thinking":false}}`},
		{"calls at the end may stay unanswered",
			`{"model":"m","input":[{"role":"user","content":"x"},{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},{"type":"function_call","call_id":"b","name":"f","arguments":"{}"}]}`,
			Options{}, `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"b","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := []byte(tt.body)
			orig := bytes.Clone(in)
			r, err := NewRequest(in, tt.opts)
			if err != nil {
				t.Fatalf("NewRequest() error = %v", err)
			}
			if !bytes.Equal(in, orig) {
				t.Error("NewRequest modified its input")
			}
			if string(r.Body) != tt.want {
				t.Errorf("NewRequest(%s).Body =\n%s\nwant\n%s", tt.body, r.Body, tt.want)
			}
			if r.Stream != gjson.Get(tt.body, "stream").Bool() {
				t.Errorf("Stream = %v", r.Stream)
			}
		})
	}
}

func TestNewChatRequestRefuses(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		sentinel error
		param    string
		code     string
	}{
		{"a body that is not JSON", `{"model":`, ErrInvalid, "", ""},
		{"a body that is not an object", `["model"]`, ErrInvalid, "", ""},
		{"no model", `{"input":"x"}`, ErrInvalid, "model", "missing_required_parameter"},
		{"a model that is not a string", `{"model":1,"input":"x"}`, ErrInvalid, "model", "invalid_type"},
		{"background mode", `{"model":"m","input":"x","background":true}`, ErrUnsupported, "background", "unsupported_parameter"},
		{"an unresolved previous_response_id", `{"model":"m","input":"x","previous_response_id":"resp_1"}`, ErrUnsupported, "previous_response_id", "unsupported_parameter"},
		{"a conversation", `{"model":"m","input":"x","conversation":"conv_1"}`, ErrUnsupported, "conversation", "unsupported_parameter"},
		{"a stored prompt", `{"model":"m","prompt":{"id":"pmpt_1"}}`, ErrUnsupported, "prompt", "unsupported_parameter"},
		{"context management", `{"model":"m","input":"x","context_management":[{"type":"compaction"}]}`, ErrUnsupported, "context_management", "unsupported_parameter"},
		{"a built-in tool", `{"model":"m","input":"x","tools":[{"type":"function","name":"f"},{"type":"web_search"}]}`, ErrUnsupported, "tools[1].type", "unsupported_value"},
		{"code_interpreter left in", `{"model":"m","input":"x","tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`, ErrUnsupported, "tools[0].type", "unsupported_value"},
		{"a custom tool", `{"model":"m","input":"x","tools":[{"type":"custom","name":"c"}]}`, ErrUnsupported, "tools[0].type", "unsupported_value"},
		{"a function without a name", `{"model":"m","input":"x","tools":[{"type":"function","parameters":{}}]}`, ErrInvalid, "tools[0].name", "missing_required_parameter"},
		{"parameters that are not an object", `{"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":[]}]}`, ErrInvalid, "tools[0].parameters", "invalid_type"},
		{"a tool_choice naming no tool", `{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"g"}}`, ErrInvalid, "tool_choice", "invalid_value"},
		{"required without tools", `{"model":"m","input":"x","tool_choice":"required"}`, ErrInvalid, "tool_choice", "invalid_value"},
		{"an unknown tool_choice", `{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":"any"}`, ErrInvalid, "tool_choice", "invalid_value"},
		{"allowed_tools with a hosted tool", `{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"allowed_tools","mode":"auto","tools":[{"type":"file_search"}]}}`, ErrUnsupported, "tool_choice.tools[0].type", "unsupported_value"},
		{"allowed_tools naming no tool", `{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"allowed_tools","mode":"auto","tools":[{"type":"function","name":"g"}]}}`, ErrInvalid, "tool_choice.tools[0]", "invalid_value"},
		{"allowed_tools with a bad mode", `{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"allowed_tools","mode":"any","tools":[]}}`, ErrInvalid, "tool_choice.mode", "invalid_value"},
		{"an item reference", `{"model":"m","input":[{"type":"item_reference","id":"msg_1"}]}`, ErrUnsupported, "input[0]", "unsupported_value"},
		{"a code_interpreter_call item", `{"model":"m","input":[{"role":"user","content":"x"},{"type":"code_interpreter_call","id":"ci_1","code":"1","outputs":null}]}`, ErrUnsupported, "input[1].type", "unsupported_value"},
		{"an image by file id", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","file_id":"file-1"}]}]}`, ErrUnsupported, "input[0].content[0].file_id", "unsupported_parameter"},
		{"a file by url", `{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_url":"https://x/a.pdf"}]}]}`, ErrUnsupported, "input[0].content[0].file_url", "unsupported_parameter"},
		{"an image in a system message", `{"model":"m","input":[{"role":"system","content":[{"type":"input_image","image_url":"https://x"}]}]}`, ErrInvalid, "input[0].content[0].type", "invalid_value"},
		{"an unknown content part", `{"model":"m","input":[{"role":"user","content":[{"type":"input_audio"}]}]}`, ErrUnsupported, "input[0].content[0].type", "unsupported_value"},
		{"an unknown role", `{"model":"m","input":[{"role":"critic","content":"x"}]}`, ErrInvalid, "input[0].role", "invalid_value"},
		{"a call without call_id", `{"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}"}]}`, ErrInvalid, "input[0].call_id", "missing_required_parameter"},
		{"arguments that are not a string", `{"model":"m","input":[{"type":"function_call","call_id":"a","name":"f","arguments":{}}]}`, ErrInvalid, "input[0].arguments", "invalid_type"},
		{"an image in a function output", `{"model":"m","input":[{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"a","output":[{"type":"input_image","image_url":"https://x"}]}]}`, ErrUnsupported, "input[1].output[0].type", "unsupported_value"},
		// OpenAI's own errors for what a chat server would refuse in its terms (messages[...]).
		{"no input", `{"model":"m","instructions":"be brief"}`, ErrInvalid, "input", "missing_required_parameter"},
		{"an empty input", `{"model":"m","input":[]}`, ErrInvalid, "input", "empty_array"},
		{"an output answering no call", `{"model":"m","input":[{"role":"user","content":"x"},{"type":"function_call_output","call_id":"a","output":"1"}]}`, ErrInvalid, "input", ""},
		{"a call unanswered before more input", `{"model":"m","input":[{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},{"type":"function_call","call_id":"b","name":"f","arguments":"{}"},` +
			`{"type":"function_call_output","call_id":"b","output":"1"}]}`, ErrInvalid, "input", ""},
		{"an item that is not an object", `{"model":"m","input":["x"]}`, ErrInvalid, "input[0]", "invalid_type"},
		{"input that is a number", `{"model":"m","input":1}`, ErrInvalid, "input", "invalid_type"},
		{"a temperature that is a string", `{"model":"m","input":"x","temperature":"hot"}`, ErrInvalid, "temperature", "invalid_type"},
		{"max_output_tokens that is not an integer", `{"model":"m","input":"x","max_output_tokens":1.5}`, ErrInvalid, "max_output_tokens", "invalid_type"},
		{"an unknown text format", `{"model":"m","input":"x","text":{"format":{"type":"grammar"}}}`, ErrUnsupported, "text.format.type", "unsupported_value"},
		{"a json_schema without a name", `{"model":"m","input":"x","text":{"format":{"type":"json_schema","schema":{}}}}`, ErrInvalid, "text.format.name", "missing_required_parameter"},
		{"a Chat Completions field", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, ErrUnsupported, "messages", "unsupported_parameter"},
		{"max_tokens", `{"model":"m","input":"x","max_tokens":5}`, ErrUnsupported, "max_tokens", "unsupported_parameter"},
		{"a hosted tool_choice without its tool", `{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"code_interpreter"}}`, ErrInvalid, "tool_choice", ""},
		{"an unknown tool_choice type", `{"model":"m","input":"x","tool_choice":{"type":"telepathy"}}`, ErrUnsupported, "tool_choice.type", "unsupported_value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewRequest([]byte(tt.body), Options{})
			if !errors.Is(err, tt.sentinel) {
				t.Fatalf("NewRequest(%s) error = %v; want %v", tt.body, err, tt.sentinel)
			}
			var ae *apierror.Error
			if !errors.As(err, &ae) {
				t.Fatalf("error %T is not an *apierror.Error", err)
			}
			if ae.Status != http.StatusBadRequest || ae.Type != "invalid_request_error" || ae.Param != tt.param || ae.Code != tt.code || ae.Message == "" {
				t.Errorf("error = %d %s param %q code %q (%s); want 400 invalid_request_error param %q code %q",
					ae.Status, ae.Type, ae.Param, ae.Code, ae.Message, tt.param, tt.code)
			}
		})
	}
}

// TestChatResponse covers the JSON translation beyond what TestChatStreamMatchesJSON compares.
func TestChatResponse(t *testing.T) {
	req := `{"model":"alias","input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"f"},"temperature":0.3,"top_p":0.8,"text":{"format":{"type":"json_object"}},"reasoning":{"effort":"low"},"user":"u","truncation":"auto","max_tool_calls":2}`
	tests := []struct {
		name  string
		chat  string
		check map[string]string // gjson path → raw JSON
	}{
		{"a vLLM answer with reasoning and calls",
			`{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"message":{"role":"assistant","reasoning_content":"hmm","content":null,` +
				`"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},{"id":"","type":"function","function":{"name":"f","arguments":{"b":2}}}]},` +
				`"logprobs":null,"finish_reason":"tool_calls","stop_reason":null}],"usage":{"prompt_tokens":10,"total_tokens":15,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":4}},"prompt_logprobs":null}`,
			map[string]string{
				"id": `"resp_x"`, "object": `"response"`, "created_at": "1700000000", "status": `"completed"`, "model": `"Qwen/Qwen3-8B"`,
				"output.#": "3", "output.0": `{"id":"rs_0001","type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"hmm"}]}`,
				"output.1":    `{"id":"fc_0002","type":"function_call","status":"completed","arguments":"{\"a\":1}","call_id":"chatcmpl-tool-1","name":"f"}`,
				"output.2":    `{"id":"fc_0003","type":"function_call","status":"completed","arguments":"{\"b\":2}","call_id":"call_0004","name":"f"}`,
				"usage":       `{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":15}`,
				"tool_choice": `{"type":"function","name":"f"}`, "tools": `[{"type":"function","name":"f"}]`, "temperature": "0.3", "top_p": "0.8",
				"text": `{"format":{"type":"json_object"}}`, "reasoning": `{"effort":"low"}`, "user": `"u"`, "truncation": `"auto"`, "max_tool_calls": "2",
				"incomplete_details": "null", "error": "null", "previous_response_id": "null",
			}},
		{"a llama.cpp answer cut by length, with DeepSeek's cache field",
			`{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"Once"}}],"created":1700000001,"model":"gpt-3.5-turbo","object":"chat.completion",` +
				`"usage":{"completion_tokens":16,"prompt_tokens":5,"total_tokens":21,"prompt_cache_hit_tokens":3},"id":"chatcmpl-2","timings":{}}`,
			map[string]string{
				"status": `"incomplete"`, "incomplete_details": `{"reason":"max_output_tokens"}`,
				"output.0": `{"id":"msg_0001","type":"message","status":"incomplete","content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"Once"}],"role":"assistant"}`,
				"usage.input_tokens_details.cached_tokens": "3",
			}},
		{"content as parts, the reasoning field, no usage, the request's model",
			`{"choices":[{"index":0,"message":{"role":"assistant","reasoning":"r","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},"finish_reason":"stop"}]}`,
			map[string]string{"model": `"alias"`, "usage": "null", "output.1.content.0.text": `"ab"`, "output.0.content.0.text": `"r"`, "created_at": "0"},
		},
		{"content_filter",
			`{"choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"content_filter"}]}`,
			map[string]string{"status": `"incomplete"`, "incomplete_details": `{"reason":"content_filter"}`, "output": "[]"},
		},
		{"the first choice only",
			`{"choices":[{"index":1,"message":{"role":"assistant","content":"second"},"finish_reason":"stop"},{"index":0,"message":{"role":"assistant","content":"first"},"finish_reason":"stop"}]}`,
			map[string]string{"output.#": "1", "output.0.content.0.text": `"first"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newTestChatRequest(t, req, Options{})
			in := []byte(tt.chat)
			orig := bytes.Clone(in)
			out, err := r.Response(in, "resp_x", 0)
			if err != nil {
				t.Fatalf("Response() error = %v", err)
			}
			if !bytes.Equal(in, orig) {
				t.Error("Response modified its input")
			}
			if !json.Valid(out) {
				t.Fatalf("Response() = %s; not JSON", out)
			}
			for path, want := range tt.check {
				if got := gjson.GetBytes(out, path).Raw; got != want {
					t.Errorf("%s = %s; want %s", path, got, want)
				}
			}
		})
	}
}

func TestChatResponseErrors(t *testing.T) {
	tests := []struct {
		name     string
		chat     string
		sentinel error // nil: an upstream error, mapped
		status   int
		message  string
	}{
		{"not JSON", `{"choices":[`, ErrShape, 502, "could not be read"},
		{"no choices", `{"id":"x","choices":[]}`, ErrShape, 502, "could not be read"},
		{"a call without a name", `{"choices":[{"index":0,"message":{"tool_calls":[{"id":"a","function":{"arguments":"{}"}}]}}]}`, ErrShape, 502, "could not be read"},
		{"an error object answered with 200", `{"error":{"message":"quota","type":"insufficient_quota","code":"insufficient_quota"}}`, nil, 502, "quota"},
		{"a vLLM error answered with 200", `{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}`, nil, 400, "bad"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := newTestChatRequest(t, `{"model":"m","input":"x"}`, Options{}).Response([]byte(tt.chat), "resp_x", 1)
			var ae *apierror.Error
			if !errors.As(err, &ae) {
				t.Fatalf("error = %v; want an *apierror.Error", err)
			}
			if tt.sentinel != nil && !errors.Is(err, tt.sentinel) {
				t.Errorf("error = %v; want %v", err, tt.sentinel)
			}
			if ae.Status != tt.status || !strings.Contains(ae.Message, tt.message) {
				t.Errorf("error = %d %q; want %d with %q", ae.Status, ae.Message, tt.status, tt.message)
			}
		})
	}
}

func TestChatError(t *testing.T) {
	tests := []struct {
		name                      string
		status                    int
		body                      string
		wantStatus                int
		message, typ, param, code string
	}{
		{"OpenAI's shape is kept", 400, `{"error":{"message":"Unsupported value: 'x'.","type":"invalid_request_error","param":"temperature","code":"unsupported_value"}}`,
			400, "Unsupported value: 'x'.", "invalid_request_error", "temperature", "unsupported_value"},
		{"llama.cpp", 400, `{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":9000,"n_ctx":4096}}`,
			400, "the request exceeds the available context size", "exceed_context_size_error", "", ""},
		{"vLLM before 0.10", 400, `{"object":"error","message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","param":null,"code":400}`,
			400, "This model's maximum context length is 4096 tokens.", "invalid_request_error", "", ""},
		{"vLLM 0.10", 404, `{"error":{"message":"The model ` + "`x`" + ` does not exist.","type":"NotFoundError","param":"model","code":404}}`,
			404, "The model `x` does not exist.", "invalid_request_error", "model", ""},
		{"Mistral", 401, `{"object":"error","message":"Unauthorized","type":"invalid_request_error","param":null,"code":null}`,
			401, "Unauthorized", "invalid_request_error", "", ""},
		{"Gemini", 400, `[{"error":{"code":400,"message":"API key not valid.","status":"INVALID_ARGUMENT"}}]`,
			400, "API key not valid.", "invalid_request_error", "", ""},
		{"Anthropic", 529, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
			529, "Overloaded", "overloaded_error", "", ""},
		{"Ollama", 404, `{"error":"model \"llama3\" not found, try pulling it first"}`,
			404, `model "llama3" not found, try pulling it first`, "invalid_request_error", "", ""},
		{"FastAPI validation", 422, `{"detail":[{"loc":["body","messages",0,"role"],"msg":"field required","type":"missing"}]}`,
			422, "body.messages.0.role: field required", "invalid_request_error", "", ""},
		{"a rate limit", 429, `{"error":{"message":"slow down"}}`, 429, "slow down", "requests", "", "rate_limit_exceeded"},
		{"plain text", 503, "  upstream connect error\n or disconnect  ", 503, "upstream connect error or disconnect", "server_error", "", ""},
		{"an empty body", 500, "", 500, "The upstream answered 500 Internal Server Error.", "server_error", "", ""},
		{"JSON of no known shape", 500, `{"ok":false}`, 500, `{"ok":false}`, "server_error", "", ""},
		{"a status that is not an error", 200, `{"error":{"message":"x"}}`, 502, "x", "server_error", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{"Retry-After": {"7"}, "X-Other": {"y"}}
			e := UpstreamError(tt.status, h, []byte(tt.body))
			if e.Status != tt.wantStatus || e.Message != tt.message || e.Type != tt.typ || e.Param != tt.param || e.Code != tt.code {
				t.Errorf("UpstreamError() = %d %q %q %q %q; want %d %q %q %q %q", e.Status, e.Message, e.Type, e.Param, e.Code,
					tt.wantStatus, tt.message, tt.typ, tt.param, tt.code)
			}
			if e.Header.Get("Retry-After") != "7" || e.Header.Get("X-Other") != "" {
				t.Errorf("headers = %v; want Retry-After only", e.Header)
			}
			var body struct {
				Error struct {
					Message *string `json:"message"`
					Type    *string `json:"type"`
				} `json:"error"`
			}
			if err := json.Unmarshal(e.JSON(), &body); err != nil || body.Error.Message == nil || body.Error.Type == nil {
				t.Errorf("JSON() = %s; want OpenAI's shape", e.JSON())
			}
		})
	}
	long := strings.Repeat("é", 2000)
	if e := UpstreamError(500, nil, []byte(long)); len(e.Message) > maxErrorMessage+len("…") || !strings.HasSuffix(e.Message, "…") || !json.Valid(e.JSON()) {
		t.Errorf("long message not cut on a character boundary: %d bytes", len(e.Message))
	}
}

// TestChatErrorTooDeep: an error body nested past jsondepth.Max is never read as JSON (gjson's
// validator and reads recurse once per level): it is relayed as text, as a body of no known shape.
func TestChatErrorTooDeep(t *testing.T) {
	n := jsondepth.Max + 1
	body := `{"error":{"message":"deep","type":"invalid_request_error","param":null,"code":"c","x":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}}`
	e := UpstreamError(400, nil, []byte(body))
	if e.Message == "deep" || e.Code != "" || !strings.HasPrefix(e.Message, `{"error":{"message":"deep"`) {
		t.Errorf("UpstreamError() = %q (code %q); want the body as text, not read as JSON", e.Message, e.Code)
	}
	if !json.Valid(e.JSON()) {
		t.Errorf("JSON() = %s", e.JSON())
	}
}
