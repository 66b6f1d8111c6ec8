package upstreamtest_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestChatRefuses: requests OpenAI's Chat Completions API refuses are refused, in OpenAI's shape,
// and take no turn.
func TestChatRefuses(t *testing.T) {
	const fn = `{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}`
	tests := []struct {
		name    string
		body    string
		flavour upstreamtest.ChatFlavour
		param   string
		message string
	}{
		{"a Responses field", `{"model":"m","messages":[{"role":"user","content":"x"}],"max_output_tokens":5}`, upstreamtest.ChatOpenAI, "", "Unrecognized request argument supplied: max_output_tokens"},
		{"input instead of messages", `{"model":"m","input":"x"}`, upstreamtest.ChatOpenAI, "", "Unrecognized request argument supplied: input"},
		{"a reasoning object", `{"model":"m","messages":[{"role":"user","content":"x"}],"reasoning":{"effort":"low"}}`, upstreamtest.ChatVLLM, "", "reasoning"},
		{"no messages", `{"model":"m"}`, upstreamtest.ChatOpenAI, "messages", "Missing required parameter: 'messages'."},
		{"empty messages", `{"model":"m","messages":[]}`, upstreamtest.ChatOpenAI, "messages", "empty array"},
		{"an unknown role", `{"model":"m","messages":[{"role":"critic","content":"x"}]}`, upstreamtest.ChatOpenAI, "messages[0].role", "Invalid value: 'critic'"},
		{"a Responses content part", `{"model":"m","messages":[{"role":"user","content":[{"type":"input_text","text":"x"}]}]}`, upstreamtest.ChatOpenAI, "messages[0].content[0].type", "Invalid value: 'input_text'"},
		{"an unanswered tool call", `{"model":"m","tools":[` + fn + `],"messages":[{"role":"user","content":"x"},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"call_2","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"call_1","content":"ok"},{"role":"user","content":"and?"}]}`, upstreamtest.ChatOpenAI, "messages.[1].role", "did not have response messages: call_2"},
		{"a tool call left open at the end", `{"model":"m","tools":[` + fn + `],"messages":[{"role":"user","content":"x"},` +
			`{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`, upstreamtest.ChatOpenAI, "messages.[1].role", "call_1"},
		{"an orphan tool message", `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"tool","tool_call_id":"call_9","content":"ok"}]}`, upstreamtest.ChatOpenAI, "messages.[1].role", "must be a response to a preceeding message with 'tool_calls'"},
		{"a tool message after the answer was given", `{"model":"m","tools":[` + fn + `],"messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"a","content":"1"},{"role":"tool","tool_call_id":"a","content":"2"}]}`, upstreamtest.ChatOpenAI, "messages.[2].role", "preceeding"},
		{"arguments that are an object", `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":{}}}]},{"role":"tool","tool_call_id":"a","content":"1"}]}`, upstreamtest.ChatOpenAI, "messages[0].tool_calls[0].function.arguments", "expected a string"},
		{"reasoning_content at OpenAI", `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y","reasoning_content":"r"},{"role":"user","content":"z"}]}`, upstreamtest.ChatOpenAI, "", "'reasoning_content' was unexpected"},
		{"reasoning on a user message at vLLM", `{"model":"m","messages":[{"role":"user","content":"x","reasoning":"r"}]}`, upstreamtest.ChatVLLM, "", "'reasoning' was unexpected"},
		{"a Responses function tool", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","name":"f"}]}`, upstreamtest.ChatOpenAI, "tools[0].function", "Missing required parameter: 'tools[0].function'."},
		{"a built-in tool", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"code_interpreter"}]}`, upstreamtest.ChatLlamaCpp, "tools[0].type", "Invalid value: 'code_interpreter'"},
		{"a bad function name", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]}`, upstreamtest.ChatOpenAI, "tools[0].function.name", "does not match pattern"},
		{"tool_choice without tools", `{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"auto"}`, upstreamtest.ChatOpenAI, "tool_choice", "only allowed when 'tools' are specified"},
		{"parallel_tool_calls without tools", `{"model":"m","messages":[{"role":"user","content":"x"}],"parallel_tool_calls":true}`, upstreamtest.ChatOpenAI, "parallel_tool_calls", "only allowed when 'tools' are specified"},
		{"a Responses tool_choice", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[` + fn + `],"tool_choice":{"type":"function","name":"f"}}`, upstreamtest.ChatOpenAI, "tool_choice.function", "Missing required parameter: 'tool_choice.function'."},
		{"a tool_choice naming no tool", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[` + fn + `],"tool_choice":{"type":"function","function":{"name":"g"}}}`, upstreamtest.ChatOpenAI, "tool_choice", "function 'g' not found"},
		{"stream_options without stream", `{"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}`, upstreamtest.ChatOpenAI, "stream_options", "only allowed when 'stream' is enabled"},
		{"a json_schema without its schema object", `{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","name":"x","schema":{}}}`, upstreamtest.ChatOpenAI, "response_format.json_schema", "Missing required parameter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := upstreamtest.New(t, upstreamtest.WithChatFlavour(tt.flavour))
			s.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("x")}})
			code, body := post(t, s.URL()+"/chat/completions", tt.body)
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || code != http.StatusBadRequest || e.Error.Type != "invalid_request_error" {
				t.Fatalf("status %d, body %s; want a 400 invalid_request_error", code, body)
			}
			if p := derefOr(e.Error.Param); p != tt.param || !strings.Contains(e.Error.Message, tt.message) {
				t.Errorf("param %q, message %q; want %q and a message with %q", p, e.Error.Message, tt.param, tt.message)
			}
			if s.Pending() != 1 {
				t.Error("a refused request took a turn")
			}
		})
	}
}

func derefOr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// TestChatAccepts: what a correct chat client sends passes, and the scripts see it as items.
func TestChatAccepts(t *testing.T) {
	s := upstreamtest.New(t, upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM))
	s.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("ok")}})
	body := `{"model":"m","tools":[{"type":"function","function":{"name":"python","parameters":{"type":"object"}}}],"tool_choice":{"type":"function","function":{"name":"python"}},` +
		`"parallel_tool_calls":true,"stream":false,"messages":[{"role":"system","content":"sys"},{"role":"user","content":[{"type":"text","text":"run"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]},` +
		`{"role":"assistant","content":null,"reasoning_content":"think","tool_calls":[{"id":"a","type":"function","function":{"name":"python","arguments":"{\"code\":\"1\"}"}},{"id":"b","type":"function","function":{"name":"python","arguments":"{}"}}]},` +
		`{"role":"tool","tool_call_id":"b","content":"2"},{"role":"tool","tool_call_id":"a","content":[{"type":"text","text":"1"}]},{"role":"assistant","content":"done"},{"role":"user","content":"more"}],` +
		`"top_k":20,"chat_template_kwargs":{"enable_thinking":true}}`
	if code, b := post(t, s.URL()+"/chat/completions", body); code != http.StatusOK {
		t.Fatalf("status %d: %s", code, b)
	}
	req := s.Requests()[0]
	var types []string
	for _, it := range req.History {
		var v struct{ Type, Role string }
		_ = json.Unmarshal(it, &v)
		types = append(types, v.Type+":"+v.Role)
	}
	want := []string{"message:system", "message:user", "reasoning:", "function_call:", "function_call:", "function_call_output:", "function_call_output:", "message:assistant", "message:user"}
	if !slices.Equal(types, want) {
		t.Errorf("History types %v; want %v", types, want)
	}
	if out, ok := req.FunctionOutput("a"); !ok || out != "1" {
		t.Errorf("FunctionOutput(a) = %q, %v", out, ok)
	}
	if req.Tool("python") == nil || !slices.Equal(req.ToolNames(), []string{"python"}) {
		t.Errorf("ToolNames() = %v", req.ToolNames())
	}
	if !strings.Contains(string(req.History[2]), `"text":"think"`) {
		t.Errorf("reasoning item %s", req.History[2])
	}
}

// chatStream posts a streamed chat request and returns the data of each event, "[DONE]"
// included, and any other lines.
func chatStream(t *testing.T, s *upstreamtest.Server, body string) (data []string, other []string) {
	t.Helper()
	code, raw := post(t, s.URL()+"/chat/completions", body)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, raw)
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		default:
			other = append(other, line)
		}
	}
	return data, other
}

// TestChatFlavours: each flavour streams the same turn with its own quirks, and the official
// client assembles the same completion from every one.
func TestChatFlavours(t *testing.T) {
	turn := upstreamtest.Turn{Items: []upstreamtest.Item{
		upstreamtest.Reasoning("Let me think."),
		upstreamtest.Text("Running it."),
		upstreamtest.FunctionCall("python", `{"code":"print(\"é\")"}`),
		upstreamtest.FunctionCall("lookup", `{"q":"x"}`),
	}, Usage: &upstreamtest.Usage{InputTokens: 10, OutputTokens: 5, CachedTokens: 2}}
	body := `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}`
	tests := []struct {
		name    string
		opts    []upstreamtest.Option
		reason  string // the field of reasoning deltas; "" for none
		check   func(t *testing.T, data []string)
		callIDs func(id string) bool
	}{
		{"OpenAI", nil, "", func(t *testing.T, data []string) {
			if !strings.Contains(data[0], `"delta":{"role":"assistant","content":"","refusal":null}`) {
				t.Errorf("role chunk %s", data[0])
			}
			if !strings.Contains(strings.Join(data, "\n"), `"function":{"name":"python","arguments":""}`) {
				t.Error("first tool delta without empty arguments")
			}
			for _, d := range data[:len(data)-2] {
				if !strings.Contains(d, `"usage":null`) {
					t.Errorf("chunk %s without usage null", d)
				}
			}
		}, func(id string) bool { return strings.HasPrefix(id, "call_") }},
		{"vLLM with the SDK's nulls", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM), upstreamtest.WithChatNulls()}, "reasoning_content", func(t *testing.T, data []string) {
			for _, want := range []string{`"delta":{"role":"assistant","content":"","function_call":null,"refusal":null,"tool_calls":null,"reasoning_content":null}`,
				`"function_call":null,"refusal":null,"role":null,"tool_calls":null,"reasoning_content":null}`,
				`"function":{"arguments":"{\"c","name":null},"id":null,"type":null}`, `"service_tier":null,"system_fingerprint":null,"usage":null}`} {
				if !strings.Contains(strings.Join(data, "\n"), want) {
					t.Errorf("no %s in the stream:\n%s", want, strings.Join(data, "\n"))
				}
			}
		}, func(id string) bool { return strings.HasPrefix(id, "chatcmpl-tool-") }},
		{"vLLM", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM)}, "reasoning_content", func(t *testing.T, data []string) {
			if !strings.Contains(data[0], `"delta":{"role":"assistant","content":""}`) {
				t.Errorf("role chunk %s", data[0])
			}
			all := strings.Join(data, "\n")
			if !strings.Contains(all, `"index":0,"function":{"name":"python"}}`) {
				t.Error("first tool delta carries arguments; vLLM's does not")
			}
			finish := data[len(data)-3]
			if !strings.Contains(finish, `"finish_reason":"tool_calls","stop_reason":null`) || !strings.Contains(finish, `"arguments":`) {
				t.Errorf("finish chunk %s; want the last piece of the arguments in it", finish)
			}
		}, func(id string) bool { return strings.HasPrefix(id, "chatcmpl-tool-") }},
		{"vLLM with the reasoning field", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM), upstreamtest.WithChatReasoningField("reasoning")},
			"reasoning", func(t *testing.T, data []string) {}, func(id string) bool { return strings.HasPrefix(id, "chatcmpl-tool-") }},
		{"llama.cpp", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatLlamaCpp)}, "reasoning_content", func(t *testing.T, data []string) {
			if !strings.HasPrefix(data[0], `{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}]`) {
				t.Errorf("role chunk %s", data[0])
			}
			if !strings.Contains(strings.Join(data, "\n"), `"function":{"name":"python","arguments":"{\"c"}`) {
				t.Error("first tool delta without the first piece of the arguments")
			}
			if !strings.Contains(data[len(data)-2], `"timings":`) {
				t.Errorf("usage chunk %s", data[len(data)-2])
			}
		}, func(id string) bool { return len(id) == 32 && !strings.Contains(id, "_") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := upstreamtest.New(t, tt.opts...)
			s.Enqueue(turn)
			data, other := chatStream(t, s, body)
			if len(other) != 0 || data[len(data)-1] != "[DONE]" {
				t.Fatalf("stream ends %q; other lines %q", data[len(data)-1], other)
			}
			usage := data[len(data)-2]
			if !strings.Contains(usage, `"choices":[]`) || !strings.Contains(usage, `"prompt_tokens":10`) {
				t.Errorf("usage chunk %s", usage)
			}
			var acc openai.ChatCompletionAccumulator
			var reasoning strings.Builder
			for _, d := range data[:len(data)-1] {
				var c openai.ChatCompletionChunk
				if err := json.Unmarshal([]byte(d), &c); err != nil {
					t.Fatal(err)
				}
				acc.AddChunk(c)
				var raw struct {
					Choices []struct {
						Delta map[string]json.RawMessage `json:"delta"`
					} `json:"choices"`
				}
				_ = json.Unmarshal([]byte(d), &raw)
				if len(raw.Choices) > 0 && tt.reason != "" {
					var r string
					_ = json.Unmarshal(raw.Choices[0].Delta[tt.reason], &r)
					reasoning.WriteString(r)
				}
			}
			if tt.reason != "" && reasoning.String() != "Let me think." {
				t.Errorf("reasoning deltas %q", reasoning.String())
			}
			if tt.reason == "" && strings.Contains(strings.Join(data, ""), "Let me think") {
				t.Error("OpenAI streamed reasoning text")
			}
			m := acc.Choices[0].Message
			if m.Content != "Running it." || len(m.ToolCalls) != 2 || m.ToolCalls[0].Function.Arguments != `{"code":"print(\"é\")"}` ||
				m.ToolCalls[1].Function.Name != "lookup" || acc.Choices[0].FinishReason != "tool_calls" || acc.Usage.TotalTokens != 15 {
				t.Errorf("assembled %+v, finish %q, usage %+v", m, acc.Choices[0].FinishReason, acc.Usage)
			}
			for _, c := range m.ToolCalls {
				if !tt.callIDs(c.ID) {
					t.Errorf("call id %q not in the flavour's shape", c.ID)
				}
			}
			tt.check(t, data)
		})
	}
}

func TestChatJSONFlavours(t *testing.T) {
	turn := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Reasoning("hm"), upstreamtest.Text("a"), upstreamtest.FunctionCall("f", `{}`)},
		Usage: &upstreamtest.Usage{InputTokens: 3, OutputTokens: 4, CachedTokens: 1}}
	for _, tt := range []struct {
		name   string
		opts   []upstreamtest.Option
		want   []string
		absent string
	}{
		{"OpenAI", nil, []string{`"object":"chat.completion"`, `"refusal":null`, `"service_tier":"default"`, `"cached_tokens":1`}, "hm"},
		{"vLLM", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM)},
			[]string{`"reasoning_content":"hm","content":"a"`, `"stop_reason":null`, `"prompt_logprobs":null`, `"prompt_tokens_details":{"cached_tokens":1}`}, `"refusal"`},
		{"vLLM with the SDK's nulls", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM), upstreamtest.WithChatNulls()},
			[]string{`"refusal":null,"annotations":null,"audio":null,"function_call":null}`, `"service_tier":null,"system_fingerprint":null}`}, `"refusal":"`},
		{"llama.cpp", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatLlamaCpp)},
			[]string{`{"choices":[{"finish_reason":"tool_calls","index":0,"message":{"role":"assistant","content":"a","reasoning_content":"hm"`, `"timings":`}, `"refusal"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := upstreamtest.New(t, tt.opts...)
			s.Enqueue(turn)
			code, b := post(t, s.URL()+"/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
			if code != 200 {
				t.Fatalf("%d %s", code, b)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(b), w) {
					t.Errorf("answer %s; want %s in it", b, w)
				}
			}
			if strings.Contains(string(b), tt.absent) {
				t.Errorf("answer %s has %s", b, tt.absent)
			}
			var c openai.ChatCompletion
			if err := json.Unmarshal(b, &c); err != nil || c.Choices[0].Message.ToolCalls[0].Function.Name != "f" || c.Usage.TotalTokens != 7 {
				t.Errorf("decoded %+v, %v", c, err)
			}
		})
	}
}

func TestChatInterleaveAndFailures(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`
	t.Run("interleaved calls", func(t *testing.T) {
		s := upstreamtest.New(t)
		s.Enqueue(upstreamtest.Turn{ChatInterleave: true, Items: []upstreamtest.Item{upstreamtest.FunctionCall("a", `{"x":1}`), upstreamtest.FunctionCall("b", `{"y":2}`)}})
		data, _ := chatStream(t, s, body)
		both := 0
		for _, d := range data {
			if strings.Contains(d, `"index":0`) && strings.Contains(d, `"index":1`) {
				both++
			}
		}
		if both < 2 {
			t.Errorf("%d chunks carry both calls; want the calls interleaved:\n%s", both, strings.Join(data, "\n"))
		}
	})
	t.Run("incomplete", func(t *testing.T) {
		for reason, finish := range map[string]string{"max_output_tokens": "length", "content_filter": "content_filter"} {
			s := upstreamtest.New(t)
			s.Enqueue(upstreamtest.Turn{Incomplete: reason, Items: []upstreamtest.Item{upstreamtest.Text("a")}})
			data, _ := chatStream(t, s, body)
			if !strings.Contains(data[len(data)-2], `"finish_reason":"`+finish+`"`) {
				t.Errorf("%s: finish chunk %s", reason, data[len(data)-2])
			}
		}
	})
	t.Run("a failing stream", func(t *testing.T) {
		for _, tt := range []struct {
			name    string
			flavour upstreamtest.ChatFlavour
			data    string // the last data before [DONE]
			other   string
		}{
			{"OpenAI", upstreamtest.ChatOpenAI, `{"error":{"message":"boom","type":"server_error","param":null,"code":"server_error"}}`, ""},
			{"vLLM", upstreamtest.ChatVLLM, `{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}`, ""},
			{"llama.cpp", upstreamtest.ChatLlamaCpp, "", `error: {"code":500,"message":"boom","type":"server_error"}`},
		} {
			s := upstreamtest.New(t, upstreamtest.WithChatFlavour(tt.flavour))
			s.Enqueue(upstreamtest.Turn{TextChunk: 100, Fail: &upstreamtest.Failure{After: 1, Message: "boom"}, Items: []upstreamtest.Item{upstreamtest.Text("first"), upstreamtest.Text("never")}})
			data, other := chatStream(t, s, body)
			all := strings.Join(data, "\n")
			if !strings.Contains(all, `"first"`) || strings.Contains(all, "never") || strings.Contains(all, "finish_reason\":\"") {
				t.Errorf("%s: stream %s", tt.name, all)
			}
			if tt.data != "" && (data[len(data)-1] != "[DONE]" || data[len(data)-2] != tt.data) {
				t.Errorf("%s: stream ends %q", tt.name, data[len(data)-2:])
			}
			if tt.other != "" && (len(other) != 1 || other[0] != tt.other || data[len(data)-1] == "[DONE]") {
				t.Errorf("%s: other lines %q, last data %q", tt.name, other, data[len(data)-1])
			}
		}
	})
	t.Run("a failing JSON answer", func(t *testing.T) {
		s := upstreamtest.New(t)
		s.Enqueue(upstreamtest.Turn{Fail: &upstreamtest.Failure{}})
		if code, b := post(t, s.URL()+"/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`); code != 500 || !strings.Contains(string(b), `"type":"server_error"`) {
			t.Errorf("%d %s", code, b)
		}
	})
}
