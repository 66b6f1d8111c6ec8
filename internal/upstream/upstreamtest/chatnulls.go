package upstreamtest

// WithChatNulls makes the Chat Completions answers carry null for every field of the openai
// Python SDK's models that the flavour leaves out, as servers and proxies that build their
// answers from those models and serialise them whole send them (OpenAI's SDK types dumped with
// every unset field: "function_call":null,"refusal":null,"role":null,"tool_calls":null in each
// delta, "usage":null on each chunk but the last, "id":null,"type":null and "name":null in a tool
// call's later deltas, "logprobs":null and "finish_reason":null on each choice, null
// reasoning_content beside content). A client must read null as absent.
func WithChatNulls() Option { return func(s *Server) { s.nulls = true } }

// The fields of the SDK's models, in their order (ChatCompletionChunk, ChatCompletion and the
// types inside them).
var (
	sdkChunk        = []string{"id", "choices", "created", "model", "object", "service_tier", "system_fingerprint", "usage"}
	sdkChunkChoice  = []string{"delta", "finish_reason", "index", "logprobs"}
	sdkDelta        = []string{"content", "function_call", "refusal", "role", "tool_calls"}
	sdkDeltaCall    = []string{"index", "id", "function", "type"}
	sdkCallFunction = []string{"arguments", "name"}
	sdkChoice       = []string{"finish_reason", "index", "logprobs", "message"}
	sdkMessage      = []string{"content", "refusal", "role", "annotations", "audio", "function_call", "tool_calls"}
	sdkUsage        = []string{"completion_tokens", "prompt_tokens", "total_tokens", "completion_tokens_details", "prompt_tokens_details"}
)

// withNulls returns o with null for each key of keys it lacks, added after its own keys.
func withNulls(o obj, keys []string) obj {
	out := append(obj(nil), o...)
	for _, k := range keys {
		if !o.has(k) {
			out = append(out, kv{k, nil})
		}
	}
	return out
}

func (o obj) has(k string) bool {
	for _, f := range o {
		if f.k == k {
			return true
		}
	}
	return false
}

// nullChunk is a chat.completion.chunk (or completion: message instead of delta) with the SDK's
// nulls; reasoningKey is also null in a delta or message that lacks it. Error objects are left
// alone.
func nullChunk(o obj, completion bool, reasoningKey string) obj {
	if o.has("error") {
		return o
	}
	o = withNulls(o, sdkChunk)
	for i, f := range o {
		switch f.k {
		case "usage":
			if u, ok := f.v.(obj); ok {
				o[i].v = withNulls(u, sdkUsage)
			}
		case "choices":
			choices, _ := f.v.([]any)
			out := make([]any, len(choices))
			for j, c := range choices {
				out[j] = nullChoice(c.(obj), completion, reasoningKey)
			}
			o[i].v = out
		}
	}
	return o
}

func nullChoice(c obj, completion bool, reasoningKey string) obj {
	keys, inner, innerKeys := sdkChunkChoice, "delta", sdkDelta
	if completion {
		keys, inner, innerKeys = sdkChoice, "message", sdkMessage
	}
	c = withNulls(c, keys)
	for i, f := range c {
		if f.k != inner {
			continue
		}
		m := withNulls(withNulls(f.v.(obj), innerKeys), []string{reasoningKey})
		for j, g := range m {
			calls, ok := g.v.([]any)
			if g.k != "tool_calls" || !ok {
				continue
			}
			if len(calls) == 0 {
				m[j].v = nil // the SDK's models hold no empty list: vLLM's [] is null after them
				continue
			}
			out := make([]any, len(calls))
			for k, tc := range calls {
				tc := tc.(obj)
				if !completion {
					tc = withNulls(tc, sdkDeltaCall)
				}
				for l, h := range tc {
					if fn, ok := h.v.(obj); ok && h.k == "function" {
						tc[l].v = withNulls(fn, sdkCallFunction)
					}
				}
				out[k] = tc
			}
			m[j].v = out
		}
		c[i].v = m
	}
	return c
}
