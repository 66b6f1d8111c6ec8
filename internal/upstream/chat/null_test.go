package chat

import (
	"bytes"
	"strings"
	"testing"
)

// TestChatNullsAreAbsent: real servers send null for every field they have no value for (OpenAI
// and Azure "refusal":null and "usage":null on each chunk but the last, proxies re-serialising
// through the openai SDK's models "function_call":null and "tool_calls":null in every delta,
// vLLM null reasoning_content and logprobs, "content":null beside tool calls, "id":null and
// "name":null in a tool call's later deltas). Each case is translated with its nulls and again
// with those keys left out: both must give the same Responses output, byte for byte.
func TestChatNullsAreAbsent(t *testing.T) {
	streams := []struct{ name, withNulls, without string }{
		{"text, as the openai SDK dumps a delta",
			chunk(`{"content":"","function_call":null,"refusal":null,"role":"assistant","tool_calls":null}`, `null`, `"usage":null,"service_tier":null,"system_fingerprint":null`) +
				chunk(`{"content":"Hi","function_call":null,"refusal":null,"role":null,"tool_calls":null,"reasoning_content":null,"reasoning":null,"audio":null}`, `null`, `"usage":null`) +
				chunk(`{"content":null,"function_call":null,"refusal":null,"role":null,"tool_calls":null}`, `"stop"`, `"usage":null`) +
				`data: {"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4,"prompt_tokens_details":null,"completion_tokens_details":null}}` + "\n\n" +
				"data: [DONE]\n\n",
			chunk(`{"content":"","role":"assistant"}`, ``, ``) +
				chunk(`{"content":"Hi"}`, ``, ``) +
				chunk(`{}`, `"stop"`, ``) +
				`data: {"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}` + "\n\n" +
				"data: [DONE]\n\n"},
		{"tool calls, their later deltas naming nothing",
			chunk(`{"role":"assistant","content":null,"refusal":null,"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":""}}]}`, `null`, `"usage":null`) +
				chunk(`{"content":null,"tool_calls":[{"index":0,"id":null,"type":null,"function":{"name":null,"arguments":"{\"x\":"}}]}`, `null`, `"usage":null`) +
				chunk(`{"content":null,"reasoning_content":null,"tool_calls":[{"index":0,"id":null,"function":{"arguments":"1}","name":null}}]}`, `null`, `"usage":null`) +
				chunk(`{"role":"assistant","content":null,"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"g","arguments":null}}]}`, `null`, `"usage":null`) +
				chunk(`{"tool_calls":[{"index":1,"id":null,"type":null,"function":null}]}`, `null`, `"usage":null`) +
				chunk(`{"tool_calls":[{"index":1,"function":{"arguments":"{}"}}]}`, `null`, `"usage":null`) +
				chunk(`{"content":null,"function_call":null,"tool_calls":null}`, `"tool_calls"`, `"usage":null`) +
				"data: [DONE]\n\n",
			chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":""}}]}`, ``, ``) +
				chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"x\":"}}]}`, ``, ``) +
				chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}`, ``, ``) +
				chunk(`{"role":"assistant","tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"g"}}]}`, ``, ``) +
				chunk(`{"tool_calls":[{"index":1}]}`, ``, ``) +
				chunk(`{"tool_calls":[{"index":1,"function":{"arguments":"{}"}}]}`, ``, ``) +
				chunk(`{}`, `"tool_calls"`, ``) +
				"data: [DONE]\n\n"},
		{"a null delta, a null choice index, null logprobs content",
			`data: {"choices":[{"index":0,"delta":null,"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n" +
				`data: {"choices":[{"index":null,"delta":{"content":"a"},"logprobs":{"content":null,"refusal":null},"finish_reason":null}],"usage":null}` + "\n\n" +
				`data: {"choices":[{"index":0,"delta":{"refusal":null},"finish_reason":"stop"}],"usage":null,"error":null}` + "\n\n" +
				"data: [DONE]\n\n",
			`data: {"choices":[{"index":0}]}` + "\n\n" +
				`data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n" +
				`data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n" +
				"data: [DONE]\n\n"},
	}
	for _, tt := range streams {
		t.Run("stream/"+tt.name, func(t *testing.T) {
			for _, body := range []string{defaultStreamRequest, `{"model":"m","input":"hi","stream":true,"include":["message.output_text.logprobs"]}`} {
				want, err := translateStream(t, newTestChatRequest(t, body, Options{}), []byte(tt.without))
				if err != nil {
					t.Fatalf("without nulls: %v\n%s", err, want)
				}
				got, err := translateStream(t, newTestChatRequest(t, body, Options{}), []byte(tt.withNulls))
				if err != nil {
					t.Fatalf("with nulls: %v\n%s", err, got)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("with nulls:\n%s\nwithout:\n%s", got, want)
				}
			}
		})
	}

	completions := []struct{ name, withNulls, without string }{
		{"text, with every null OpenAI and vLLM send",
			`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi","refusal":null,` +
				`"annotations":null,"audio":null,"function_call":null,"tool_calls":null,"reasoning_content":null,"reasoning":null},"logprobs":null,"finish_reason":"stop","stop_reason":null}],` +
				`"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4,"prompt_tokens_details":null,"completion_tokens_details":null},"service_tier":null,"system_fingerprint":null,"prompt_logprobs":null}`,
			`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],` +
				`"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`},
		{"tool calls beside null content",
			`{"choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,"tool_calls":[{"id":"call_a","type":"function","function":{"name":"f","arguments":"{}"}}],"function_call":null},` +
				`"logprobs":{"content":null,"refusal":null},"finish_reason":"tool_calls"}],"usage":null,"error":null}`,
			`{"choices":[{"index":0,"message":{"role":"assistant","tool_calls":[{"id":"call_a","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`},
		{"a null finish_reason, index and total_tokens",
			`{"choices":[{"index":null,"message":{"role":"assistant","content":"x"},"logprobs":{"content":null,"refusal":null},"finish_reason":null}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":null,"prompt_tokens_details":null,"prompt_cache_hit_tokens":1}}`,
			`{"choices":[{"message":{"role":"assistant","content":"x"}}],"usage":{"prompt_tokens":2,"completion_tokens":1,"prompt_cache_hit_tokens":1}}`},
	}
	for _, tt := range completions {
		t.Run("json/"+tt.name, func(t *testing.T) {
			for _, body := range []string{`{"model":"m","input":"hi"}`, `{"model":"m","input":"hi","include":["message.output_text.logprobs"]}`} {
				want, err := newTestChatRequest(t, body, Options{}).Response([]byte(tt.without), "resp_x", 0)
				if err != nil {
					t.Fatalf("without nulls: %v", err)
				}
				got, err := newTestChatRequest(t, body, Options{}).Response([]byte(tt.withNulls), "resp_x", 0)
				if err != nil {
					t.Fatalf("with nulls: %v", err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("with nulls:\n%s\nwithout:\n%s", got, want)
				}
			}
		})
	}
}

// chunk is one data line of a chat stream with one choice: delta, finish_reason (raw JSON, ""
// for none) and more top-level members (raw, "" for none).
func chunk(delta, finish, more string) string {
	var b strings.Builder
	b.WriteString(`data: {"object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":`)
	b.WriteString(delta)
	if finish != "" {
		b.WriteString(`,"logprobs":null,"finish_reason":`)
		b.WriteString(finish)
	}
	b.WriteString("}]")
	if more != "" {
		b.WriteString(",")
		b.WriteString(more)
	}
	b.WriteString("}\n\n")
	return b.String()
}
