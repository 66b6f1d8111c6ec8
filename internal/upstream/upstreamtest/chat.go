package upstreamtest

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// serveChat answers a POST /v1/chat/completions with the turn: message text becomes the
// assistant's content, function calls its tool_calls; reasoning items are dropped.
func (s *Server) serveChat(w http.ResponseWriter, r *http.Request, req Request, t Turn) {
	if !hold(r.Context(), t) {
		return
	}
	if t.Error != nil {
		writeError(w, t.Error)
		return
	}
	if t.Fail != nil {
		code, msg := failure(t.Fail)
		writeError(w, APIError(http.StatusInternalServerError, code, msg, ""))
		return
	}
	items := s.prepare(Request{}, t)
	id := "chatcmpl-" + s.token(29)
	created := s.now().Unix()
	model := t.Model
	if model == "" {
		model = req.Model
	}
	var text *string
	var calls []item
	for _, it := range items {
		switch it.Type {
		case "message":
			if text == nil {
				text = new(string)
			}
			*text += it.Text
		case "function_call":
			calls = append(calls, it)
		}
	}
	finish := "stop"
	switch {
	case t.Incomplete != "":
		finish = "length"
	case len(calls) > 0:
		finish = "tool_calls"
	}
	u := usage(req, t, items)
	var in, out, cached, reasoning int
	if t.Usage != nil {
		in, out, cached, reasoning = t.Usage.InputTokens, t.Usage.OutputTokens, t.Usage.CachedTokens, t.Usage.ReasoningTokens
	} else {
		in, out = u[0].v.(int), u[2].v.(int)
	}
	chatUsage := obj{
		{"prompt_tokens", in}, {"completion_tokens", out}, {"total_tokens", in + out},
		{"prompt_tokens_details", obj{{"cached_tokens", cached}, {"audio_tokens", 0}}},
		{"completion_tokens_details", obj{{"reasoning_tokens", reasoning}, {"audio_tokens", 0},
			{"accepted_prediction_tokens", 0}, {"rejected_prediction_tokens", 0}}},
	}

	if !req.Stream {
		msg := obj{{"role", "assistant"}, {"content", text}, {"refusal", nil}}
		if len(calls) > 0 {
			var tc []any
			for _, c := range calls {
				tc = append(tc, obj{{"id", c.CallID}, {"type", "function"}, {"function", obj{{"name", c.Name}, {"arguments", c.Arguments}}}})
			}
			msg = append(msg, kv{"tool_calls", tc})
		}
		msg = append(msg, kv{"annotations", []any{}})
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(mustMarshal(obj{
			{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model},
			{"choices", []any{obj{{"index", 0}, {"message", msg}, {"logprobs", nil}, {"finish_reason", finish}}}},
			{"usage", chatUsage}, {"service_tier", "default"}, {"system_fingerprint", nil},
		}))
		return
	}

	textChunk := t.TextChunk
	if textChunk <= 0 {
		textChunk = s.text
	}
	argsChunk := t.ArgsChunk
	if argsChunk <= 0 {
		argsChunk = s.args
	}
	var chunks []obj
	chunk := func(delta obj, finish any) {
		chunks = append(chunks, obj{
			{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
			{"service_tier", "default"}, {"system_fingerprint", nil},
			{"choices", []any{obj{{"index", 0}, {"delta", delta}, {"logprobs", nil}, {"finish_reason", finish}}}},
			{"obfuscation", s.obfuscation()},
		})
	}
	chunk(obj{{"role", "assistant"}, {"content", ""}, {"refusal", nil}}, nil)
	if text != nil {
		for _, d := range split(*text, textChunk) {
			chunk(obj{{"content", d}}, nil)
		}
	}
	for i, c := range calls {
		chunk(obj{{"tool_calls", []any{obj{{"index", i}, {"id", c.CallID}, {"type", "function"},
			{"function", obj{{"name", c.Name}, {"arguments", ""}}}}}}}, nil)
		for _, d := range split(c.Arguments, argsChunk) {
			chunk(obj{{"tool_calls", []any{obj{{"index", i}, {"function", obj{{"arguments", d}}}}}}}, nil)
		}
	}
	chunk(obj{}, finish)
	var opts struct {
		IncludeUsage bool `json:"include_usage"`
	}
	_ = json.Unmarshal(req.Fields["stream_options"], &opts)
	if opts.IncludeUsage {
		chunks = append(chunks, obj{
			{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
			{"service_tier", "default"}, {"system_fingerprint", nil}, {"choices", []any{}}, {"usage", chatUsage},
			{"obfuscation", s.obfuscation()},
		})
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	flush(w)
	for i, c := range chunks {
		if t.Cut && i == t.CutAfter {
			panic(http.ErrAbortHandler)
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", mustMarshal(c)); err != nil {
			return
		}
		flush(w)
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	flush(w)
}
