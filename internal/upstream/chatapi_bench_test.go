package upstream

import (
	"bytes"
	"testing"
)

// The native baseline of chat's BenchmarkChatRequest, with the same body: the native path of a
// JSON exchange does no translation, only the model rewrite.

const benchChatRequestBody = `{"model":"qwen","instructions":"You are a helpful assistant. Use the python tool for any calculation.",` +
	`"input":[{"role":"user","content":[{"type":"input_text","text":"What is the square root of two, to ten places?"}]},` +
	`{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"I should compute it."}]},` +
	`{"type":"function_call","call_id":"call_1","name":"python","arguments":"{\"code\":\"import math\\nprint(math.sqrt(2))\"}"},` +
	`{"type":"function_call_output","call_id":"call_1","output":"1.4142135623730951\n"},` +
	`{"role":"assistant","content":[{"type":"output_text","text":"It is 1.4142135624.","annotations":[]}]},` +
	`{"role":"user","content":"And of three?"}],` +
	`"tools":[{"type":"function","name":"python","description":"Run Python code in a stateful Jupyter-like kernel. Variables, imports and files persist between calls in this conversation. The value of the last expression is shown, as in a notebook cell, together with anything printed to stdout or stderr and the traceback of an exception. matplotlib figures are rendered and returned to the user as images. Files are read from and written to /mnt/data. There is no internet access.",` +
	`"parameters":{"type":"object","properties":{"code":{"type":"string","description":"The Python code to run in the kernel."}},"required":["code"],"additionalProperties":false},"strict":true},` +
	`{"type":"function","name":"get_weather","description":"Weather for a city.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}],` +
	`"tool_choice":"auto","parallel_tool_calls":true,"max_output_tokens":2048,"temperature":0.2,"store":false,"include":["reasoning.encrypted_content"],"reasoning":{"effort":"medium"},"stream":true}`

func BenchmarkChatRequest(b *testing.B) {
	body := []byte(benchChatRequestBody)
	b.Run("native-baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			out := rewriteModel(body, "Qwen/Qwen3-8B")
			if bytes.Equal(out, body) {
				b.Fatal("not rewritten")
			}
		}
	})
}
