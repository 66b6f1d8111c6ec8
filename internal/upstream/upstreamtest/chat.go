package upstreamtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"
)

// ChatFlavour is the server whose Chat Completions answers the scripted upstream imitates.
// Requests are validated as OpenAI validates them whatever the flavour; the flavours differ in
// the shape of answers, chunks and ids, and in whether assistant messages may carry reasoning.
type ChatFlavour int

const (
	// ChatOpenAI answers as OpenAI's API does: no reasoning text (reasoning items are dropped),
	// a role chunk with content "" and refusal null (for an answer that is calls only, the role
	// comes in the first call's chunk, with content and refusal null), a tool call's first delta
	// with id, type, name and empty arguments, finish_reason in a chunk with an empty delta,
	// usage in a last chunk with no choices ("usage":null on the others), obfuscation padding on
	// chunks. Assistant messages that carry
	// reasoning_content or reasoning are refused.
	ChatOpenAI ChatFlavour = iota
	// ChatVLLM answers as vLLM's OpenAI server does: reasoning as reasoning_content (see
	// WithChatReasoningField), a role chunk with content "", a tool call's first delta with id
	// (chatcmpl-tool-...), type and name but no arguments key, the last piece of the arguments
	// in the chunk that carries finish_reason, a text's finish_reason with delta {"content":""},
	// stop_reason null beside it, usage with prompt_tokens_details null.
	ChatVLLM
	// ChatLlamaCpp answers as llama.cpp's server does: keys in its order, a role chunk with
	// content null, reasoning_content deltas, a tool call's first delta carrying the first piece
	// of the arguments, 32-letter call ids, finish_reason with delta {}, timings beside usage, and
	// a failure sent as an "error:" line that SSE clients ignore, so the stream just ends.
	ChatLlamaCpp
)

// WithChatFlavour sets the server /v1/chat/completions imitates (default ChatOpenAI).
func WithChatFlavour(f ChatFlavour) Option { return func(s *Server) { s.flavour = f } }

// WithChatReasoningField names the message and delta field of reasoning text for ChatVLLM and
// ChatLlamaCpp: "reasoning_content" (the default) or "reasoning", as vLLM 0.10 and later send it.
func WithChatReasoningField(name string) Option { return func(s *Server) { s.reasoningField = name } }

// responsesOnly are Responses API fields; OpenAI's Chat Completions API refuses them.
var responsesOnly = []string{"input", "instructions", "max_output_tokens", "text", "reasoning", "previous_response_id",
	"include", "conversation", "background", "truncation", "max_tool_calls", "prompt", "context_management"}

var functionName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// checkChat validates a chat completions request as OpenAI does, and fills req.History with the
// conversation as Responses items, so one script serves both APIs.
func (s *Server) checkChat(req *Request) *HTTPError {
	unrecognized := func(key string) *HTTPError {
		return APIError(http.StatusBadRequest, "", "Unrecognized request argument supplied: "+key, "")
	}
	for _, k := range responsesOnly {
		if _, ok := req.Fields[k]; ok {
			return unrecognized(k)
		}
	}
	raw, ok := req.Fields["messages"]
	if !ok {
		return APIError(http.StatusBadRequest, "missing_required_parameter", "Missing required parameter: 'messages'.", "messages")
	}
	var msgs []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return APIError(http.StatusBadRequest, "invalid_type", "Invalid type for 'messages': expected an array of objects.", "messages")
	}
	if len(msgs) == 0 {
		return APIError(http.StatusBadRequest, "empty_array",
			"Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.", "messages")
	}
	if e := s.checkTools(req); e != nil {
		return e
	}
	if _, ok := req.Fields["stream_options"]; ok && !req.Stream {
		return APIError(http.StatusBadRequest, "", "The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
	}
	if e := checkResponseFormat(req.Fields["response_format"]); e != nil {
		return e
	}

	var hist []json.RawMessage
	open := map[string]bool{} // tool_call_ids of the last assistant message not yet answered
	openAt := -1
	answered := func(at int) *HTTPError {
		if len(open) == 0 {
			return nil
		}
		var ids []string
		for id := range open {
			ids = append(ids, id)
		}
		return APIError(http.StatusBadRequest, "", "An assistant message with 'tool_calls' must be followed by tool messages responding to "+
			"each 'tool_call_id'. The following tool_call_ids did not have response messages: "+strings.Join(ids, ", "), fmt.Sprintf("messages.[%d].role", at))
	}
	for i, m := range msgs {
		var role string
		_ = json.Unmarshal(m["role"], &role)
		if role != "tool" {
			if e := answered(openAt); e != nil {
				return e
			}
		}
		param := fmt.Sprintf("messages[%d]", i)
		switch role {
		case "system", "developer", "user", "assistant", "tool", "function":
		case "":
			return APIError(http.StatusBadRequest, "missing_required_parameter", "Missing required parameter: '"+param+".role'.", param+".role")
		default:
			return APIError(http.StatusBadRequest, "invalid_value", fmt.Sprintf("Invalid value: '%s'. Supported values are: 'system', "+
				"'assistant', 'user', 'function', 'tool', and 'developer'.", role), param+".role")
		}
		if e := checkContent(param, role, m["content"]); e != nil {
			return e
		}
		for _, f := range []string{"reasoning_content", "reasoning"} {
			if _, ok := m[f]; ok && (s.flavour == ChatOpenAI || role != "assistant") {
				return APIError(http.StatusBadRequest, "", fmt.Sprintf("Additional properties are not allowed ('%s' was unexpected) - 'messages.%d'", f, i), "")
			}
		}
		switch role {
		case "assistant":
			var calls []struct {
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function *struct {
					Name      string           `json:"name"`
					Arguments *json.RawMessage `json:"arguments"`
				} `json:"function"`
			}
			if raw, ok := m["tool_calls"]; ok {
				if err := json.Unmarshal(raw, &calls); err != nil {
					return APIError(http.StatusBadRequest, "invalid_type", "Invalid type for '"+param+".tool_calls': expected an array of objects.", param+".tool_calls")
				}
			}
			if reasoning := firstString(m, s.reasoningField, "reasoning_content", "reasoning"); reasoning != "" {
				hist = append(hist, mustMarshal(obj{{"type", "reasoning"}, {"summary", []any{}},
					{"content", []any{obj{{"type", "reasoning_text"}, {"text", reasoning}}}}}))
			}
			if text := contentText(m["content"]); text != "" {
				hist = append(hist, mustMarshal(obj{{"type", "message"}, {"role", "assistant"}, {"content", []any{textPart(text)}}}))
			}
			for k, c := range calls {
				cp := fmt.Sprintf("%s.tool_calls[%d]", param, k)
				switch {
				case c.ID == "":
					return APIError(http.StatusBadRequest, "missing_required_parameter", "Missing required parameter: '"+cp+".id'.", cp+".id")
				case c.Type != "function":
					return APIError(http.StatusBadRequest, "invalid_value", "Invalid value: '"+c.Type+"'. Supported values are: 'function'.", cp+".type")
				case c.Function == nil || c.Function.Arguments == nil:
					return APIError(http.StatusBadRequest, "missing_required_parameter", "Missing required parameter: '"+cp+".function'.", cp+".function")
				}
				var args string
				if json.Unmarshal(*c.Function.Arguments, &args) != nil {
					return APIError(http.StatusBadRequest, "invalid_type", "Invalid type for '"+cp+".function.arguments': expected a string.", cp+".function.arguments")
				}
				open[c.ID] = true
				hist = append(hist, mustMarshal(obj{{"type", "function_call"}, {"call_id", c.ID}, {"name", c.Function.Name}, {"arguments", args}}))
			}
			if len(calls) > 0 {
				openAt = i
			}
		case "tool":
			var id string
			_ = json.Unmarshal(m["tool_call_id"], &id)
			if !open[id] {
				return APIError(http.StatusBadRequest, "", "Invalid parameter: messages with role 'tool' must be a response to a preceeding "+
					"message with 'tool_calls'.", fmt.Sprintf("messages.[%d].role", i))
			}
			delete(open, id)
			out := contentText(m["content"])
			hist = append(hist, mustMarshal(obj{{"type", "function_call_output"}, {"call_id", id}, {"output", out}}))
		default:
			hist = append(hist, mustMarshal(obj{{"type", "message"}, {"role", role}, {"content", m["content"]}}))
		}
	}
	if e := answered(openAt); e != nil {
		return e
	}
	req.History = hist
	return nil
}

func firstString(m map[string]json.RawMessage, keys ...string) string {
	for _, k := range keys {
		var s string
		if json.Unmarshal(m[k], &s) == nil && s != "" {
			return s
		}
	}
	return ""
}

// contentText returns a message's content as text: the string, or its text parts joined.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct{ Type, Text string }
	_ = json.Unmarshal(raw, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// checkContent checks the part types of a message's content as OpenAI does.
func checkContent(param, role string, raw json.RawMessage) *HTTPError {
	if len(raw) == 0 || raw[0] != '[' {
		return nil
	}
	var parts []struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return APIError(http.StatusBadRequest, "invalid_type", "Invalid type for '"+param+".content': expected a string or an array of content parts.", param+".content")
	}
	allowed := map[string][]string{
		"user":      {"text", "image_url", "input_audio", "file"},
		"system":    {"text"},
		"developer": {"text"},
		"assistant": {"text", "refusal"},
		"tool":      {"text"},
	}[role]
	for k, p := range parts {
		ok := false
		for _, a := range allowed {
			ok = ok || p.Type == a
		}
		if !ok {
			return APIError(http.StatusBadRequest, "invalid_value", fmt.Sprintf("Invalid value: '%s'. Supported values are: '%s'.",
				p.Type, strings.Join(allowed, "', '")), fmt.Sprintf("%s.content[%d].type", param, k))
		}
	}
	return nil
}

// checkTools checks tools, tool_choice and parallel_tool_calls as OpenAI does.
func (s *Server) checkTools(req *Request) *HTTPError {
	names := map[string]bool{}
	for i, raw := range req.Tools {
		var t struct {
			Type     string `json:"type"`
			Function *struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		_ = json.Unmarshal(raw, &t)
		param := fmt.Sprintf("tools[%d]", i)
		switch {
		case t.Type != "function":
			return APIError(http.StatusBadRequest, "invalid_value", "Invalid value: '"+t.Type+"'. Supported values are: 'function' and 'custom'.", param+".type")
		case t.Function == nil:
			return APIError(http.StatusBadRequest, "missing_required_parameter", "Missing required parameter: '"+param+".function'.", param+".function")
		case !functionName.MatchString(t.Function.Name):
			return APIError(http.StatusBadRequest, "invalid_value", fmt.Sprintf("Invalid '%s.function.name': string does not match pattern. "+
				"Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.", param), param+".function.name")
		}
		names[t.Function.Name] = true
	}
	for _, f := range []string{"tool_choice", "parallel_tool_calls"} {
		if _, ok := req.Fields[f]; ok && len(req.Tools) == 0 {
			return APIError(http.StatusBadRequest, "", fmt.Sprintf("Invalid value for '%s': '%s' is only allowed when 'tools' are specified.", f, f), f)
		}
	}
	tc := req.ToolChoice
	if len(tc) == 0 {
		return nil
	}
	var mode string
	if json.Unmarshal(tc, &mode) == nil {
		if mode != "none" && mode != "auto" && mode != "required" {
			return APIError(http.StatusBadRequest, "invalid_value", "Invalid value: '"+mode+"'. Supported values are: 'none', 'auto', and 'required'.", "tool_choice")
		}
		return nil
	}
	var choice struct {
		Type     string `json:"type"`
		Function *struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	_ = json.Unmarshal(tc, &choice)
	switch {
	case choice.Type != "function" && choice.Type != "allowed_tools" && choice.Type != "custom":
		return APIError(http.StatusBadRequest, "invalid_value", "Invalid value: '"+choice.Type+"'. Supported values are: 'function', 'allowed_tools' and 'custom'.", "tool_choice.type")
	case choice.Type == "function" && choice.Function == nil:
		return APIError(http.StatusBadRequest, "missing_required_parameter", "Missing required parameter: 'tool_choice.function'.", "tool_choice.function")
	case choice.Type == "function" && !names[choice.Function.Name]:
		return APIError(http.StatusBadRequest, "", fmt.Sprintf("Invalid value for 'tool_choice': function '%s' not found in 'tools'.", choice.Function.Name), "tool_choice")
	}
	return nil
}

func checkResponseFormat(raw json.RawMessage) *HTTPError {
	if len(raw) == 0 {
		return nil
	}
	var rf struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name string `json:"name"`
		} `json:"json_schema"`
	}
	_ = json.Unmarshal(raw, &rf)
	switch rf.Type {
	case "text", "json_object":
	case "json_schema":
		if rf.JSONSchema == nil || rf.JSONSchema.Name == "" {
			return APIError(http.StatusBadRequest, "missing_required_parameter", "Missing required parameter: 'response_format.json_schema'.", "response_format.json_schema")
		}
	default:
		return APIError(http.StatusBadRequest, "invalid_value", "Invalid value: '"+rf.Type+"'. Supported values are: 'text', 'json_object' and 'json_schema'.", "response_format.type")
	}
	return nil
}

// chatTurn is a Turn as a chat completion: what the model says, in the order it says it.
type chatTurn struct {
	reasoning string
	text      *string
	calls     []item
	finish    string
}

func (s *Server) chatTurn(t Turn, n int) chatTurn {
	items := s.prepare(Request{}, t)
	var ct chatTurn
	for i, it := range items[:min(n, len(items))] {
		switch it.Type {
		case "reasoning":
			ct.reasoning += it.Summary
		case "message":
			if ct.text == nil {
				ct.text = new(string)
			}
			*ct.text += it.Text
		case "function_call":
			if t.Items[i].CallID == "" {
				it.CallID = s.callID()
			}
			ct.calls = append(ct.calls, it)
		}
	}
	ct.finish = "stop"
	switch {
	case t.Incomplete == "content_filter":
		ct.finish = "content_filter"
	case t.Incomplete != "":
		ct.finish = "length"
	case len(ct.calls) > 0:
		ct.finish = "tool_calls"
	}
	return ct
}

// callID returns a fresh tool call id in the flavour's shape.
func (s *Server) callID() string {
	switch s.flavour {
	case ChatVLLM:
		return "chatcmpl-tool-" + s.id("")[:32]
	case ChatLlamaCpp:
		return s.token(32)
	}
	return "call_" + s.token(24)
}

func (s *Server) reasoningKey() string {
	if s.reasoningField != "" {
		return s.reasoningField
	}
	return "reasoning_content"
}

// serveChat answers a POST /v1/chat/completions with the turn, as the server's flavour would.
func (s *Server) serveChat(w http.ResponseWriter, r *http.Request, req Request, t Turn) {
	ctx := r.Context()
	if !hold(ctx, t) {
		return
	}
	if t.Error != nil {
		writeError(w, t.Error)
		return
	}
	if t.Fail != nil && !req.Stream {
		code, msg := failure(t.Fail)
		writeError(w, APIError(http.StatusInternalServerError, code, msg, ""))
		return
	}
	n := len(t.Items)
	if t.Fail != nil {
		n = max(t.Fail.After, 0)
	}
	ct := s.chatTurn(t, n)
	id := "chatcmpl-" + s.token(29)
	if s.flavour == ChatVLLM {
		id = "chatcmpl-" + s.id("")[:32]
	}
	created := s.now().Unix()
	model := t.Model
	if model == "" {
		model = req.Model
	}
	var in, out, cached, reasoning int
	if t.Usage != nil {
		in, out, cached, reasoning = t.Usage.InputTokens, t.Usage.OutputTokens, t.Usage.CachedTokens, t.Usage.ReasoningTokens
	} else {
		u := usage(req, t, s.prepare(Request{}, t))
		in, out = u[0].v.(int), u[2].v.(int)
	}
	var chatUsage obj
	switch s.flavour {
	case ChatVLLM:
		chatUsage = obj{{"prompt_tokens", in}, {"total_tokens", in + out}, {"completion_tokens", out}, {"prompt_tokens_details", nil}}
		if cached > 0 {
			chatUsage[3].v = obj{{"cached_tokens", cached}}
		}
	case ChatLlamaCpp:
		chatUsage = obj{{"completion_tokens", out}, {"prompt_tokens", in}, {"total_tokens", in + out}}
	default:
		chatUsage = obj{
			{"prompt_tokens", in}, {"completion_tokens", out}, {"total_tokens", in + out},
			{"prompt_tokens_details", obj{{"cached_tokens", cached}, {"audio_tokens", 0}}},
			{"completion_tokens_details", obj{{"reasoning_tokens", reasoning}, {"audio_tokens", 0},
				{"accepted_prediction_tokens", 0}, {"rejected_prediction_tokens", 0}}},
		}
	}
	if !req.Stream {
		completion := s.chatCompletion(ct, id, created, model, chatUsage)
		if s.nulls {
			completion = nullChunk(completion, true, s.reasoningKey())
		}
		body := mustMarshal(completion)
		w.Header().Set("Content-Type", "application/json")
		if t.Cut {
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(body[:min(max(t.CutAfter, 0), len(body))])
			flush(w)
			panic(http.ErrAbortHandler)
		}
		_, _ = w.Write(body)
		return
	}

	var opts struct {
		IncludeUsage bool `json:"include_usage"`
	}
	_ = json.Unmarshal(req.Fields["stream_options"], &opts)
	lines := s.chatChunks(ct, t, id, created, model, chatUsage, opts.IncludeUsage)
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	flush(w)
	for i, line := range lines {
		if t.Cut && i == t.CutAfter {
			panic(http.ErrAbortHandler)
		}
		if !pace(ctx, t, i) {
			panic(http.ErrAbortHandler)
		}
		if _, err := fmt.Fprintf(w, "%s\n\n", line); err != nil {
			return
		}
		flush(w)
	}
	if t.Cut {
		panic(http.ErrAbortHandler)
	}
}

// pace applies the turn's Delay and BeforeEvent before event seq; it reports false when the
// stream must stop.
func pace(ctx context.Context, t Turn, seq int) bool {
	if t.Delay > 0 {
		timer := time.NewTimer(t.Delay)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return false
		}
	}
	if t.BeforeEvent != nil {
		return t.BeforeEvent(ctx, seq, "chat.completion.chunk") == nil
	}
	return true
}

// chatCompletion is the JSON answer.
func (s *Server) chatCompletion(ct chatTurn, id string, created int64, model string, u obj) obj {
	var toolCalls []any
	for _, c := range ct.calls {
		toolCalls = append(toolCalls, obj{{"id", c.CallID}, {"type", "function"}, {"function", obj{{"name", c.Name}, {"arguments", c.Arguments}}}})
	}
	var reasoning any
	if ct.reasoning != "" {
		reasoning = ct.reasoning
	}
	switch s.flavour {
	case ChatVLLM:
		msg := obj{{"role", "assistant"}, {s.reasoningKey(), reasoning}, {"content", ct.text}}
		if toolCalls == nil {
			toolCalls = []any{}
		}
		msg = append(msg, kv{"tool_calls", toolCalls})
		return obj{{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model},
			{"choices", []any{obj{{"index", 0}, {"message", msg}, {"logprobs", nil}, {"finish_reason", ct.finish}, {"stop_reason", nil}}}},
			{"usage", u}, {"prompt_logprobs", nil}}
	case ChatLlamaCpp:
		msg := obj{{"role", "assistant"}, {"content", ct.text}}
		if reasoning != nil {
			msg = append(msg, kv{s.reasoningKey(), reasoning})
		}
		if toolCalls != nil {
			msg = append(msg, kv{"tool_calls", toolCalls})
		}
		return obj{{"choices", []any{obj{{"finish_reason", ct.finish}, {"index", 0}, {"message", msg}}}},
			{"created", created}, {"model", model}, {"system_fingerprint", "b6000-ciproxy"}, {"object", "chat.completion"},
			{"usage", u}, {"id", id}, {"timings", llamaTimings(u)}}
	}
	msg := obj{{"role", "assistant"}, {"content", ct.text}, {"refusal", nil}}
	if toolCalls != nil {
		msg = append(msg, kv{"tool_calls", toolCalls})
	}
	msg = append(msg, kv{"annotations", []any{}})
	return obj{{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model},
		{"choices", []any{obj{{"index", 0}, {"message", msg}, {"logprobs", nil}, {"finish_reason", ct.finish}}}},
		{"usage", u}, {"service_tier", "default"}, {"system_fingerprint", nil}}
}

func llamaTimings(u obj) obj {
	return obj{{"prompt_n", u[1].v}, {"prompt_ms", 12.5}, {"predicted_n", u[0].v}, {"predicted_ms", 80.25}}
}

// chatChunks returns the lines of the stream ("data: ..." or, for llama.cpp's failures,
// "error: ..."), in order.
func (s *Server) chatChunks(ct chatTurn, t Turn, id string, created int64, model string, u obj, includeUsage bool) []string {
	var lines []string
	add := func(o obj) {
		if s.nulls {
			o = nullChunk(o, false, s.reasoningKey())
		}
		lines = append(lines, "data: "+string(mustMarshal(o)))
	}
	chunk := func(delta obj, finish any) {
		switch s.flavour {
		case ChatVLLM:
			ch := obj{{"index", 0}, {"delta", delta}, {"logprobs", nil}, {"finish_reason", finish}}
			if finish != nil {
				ch = append(ch, kv{"stop_reason", nil})
			}
			add(obj{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model}, {"choices", []any{ch}}})
		case ChatLlamaCpp:
			add(obj{{"choices", []any{obj{{"finish_reason", finish}, {"index", 0}, {"delta", delta}}}}, {"created", created},
				{"id", id}, {"model", model}, {"system_fingerprint", "b6000-ciproxy"}, {"object", "chat.completion.chunk"}})
		default:
			o := obj{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
				{"service_tier", "default"}, {"system_fingerprint", nil},
				{"choices", []any{obj{{"index", 0}, {"delta", delta}, {"logprobs", nil}, {"finish_reason", finish}}}}}
			if includeUsage {
				o = append(o, kv{"usage", nil}) // on every chunk but the usage chunk
			}
			add(append(o, kv{"obfuscation", s.obfuscation()}))
		}
	}
	textChunk := t.TextChunk
	if textChunk <= 0 {
		textChunk = s.text
	}
	argsChunk := t.ArgsChunk
	if argsChunk <= 0 {
		argsChunk = s.args
	}

	switch s.flavour {
	case ChatVLLM:
		chunk(obj{{"role", "assistant"}, {"content", ""}}, nil)
	case ChatLlamaCpp:
		chunk(obj{{"role", "assistant"}, {"content", nil}}, nil)
	default:
		// An answer that is calls only starts with its first call, beside content and refusal null.
		if ct.text != nil || len(ct.calls) == 0 {
			chunk(obj{{"role", "assistant"}, {"content", ""}, {"refusal", nil}}, nil)
		}
	}
	callsFirst := s.flavour == ChatOpenAI && ct.text == nil && len(ct.calls) > 0
	callChunk := func(tcs []any) {
		if callsFirst {
			callsFirst = false
			chunk(obj{{"role", "assistant"}, {"content", nil}, {"tool_calls", tcs}, {"refusal", nil}}, nil)
			return
		}
		chunk(obj{{"tool_calls", tcs}}, nil)
	}
	if ct.reasoning != "" && s.flavour != ChatOpenAI {
		for _, d := range split(ct.reasoning, textChunk) {
			chunk(obj{{s.reasoningKey(), d}}, nil)
		}
	}
	if ct.text != nil {
		for _, d := range split(*ct.text, textChunk) {
			chunk(obj{{"content", d}}, nil)
		}
	}

	// Each call's deltas: the first names it, the rest carry pieces of the arguments.
	perCall := make([][]obj, len(ct.calls))
	for i, c := range ct.calls {
		pieces := split(c.Arguments, argsChunk)
		var first obj
		switch s.flavour {
		case ChatVLLM:
			first = obj{{"id", c.CallID}, {"type", "function"}, {"index", i}, {"function", obj{{"name", c.Name}}}}
		case ChatLlamaCpp:
			p0 := ""
			if len(pieces) > 0 {
				p0, pieces = pieces[0], pieces[1:]
			}
			first = obj{{"index", i}, {"id", c.CallID}, {"type", "function"}, {"function", obj{{"name", c.Name}, {"arguments", p0}}}}
		default:
			first = obj{{"index", i}, {"id", c.CallID}, {"type", "function"}, {"function", obj{{"name", c.Name}, {"arguments", ""}}}}
		}
		perCall[i] = append(perCall[i], first)
		for _, p := range pieces {
			perCall[i] = append(perCall[i], obj{{"index", i}, {"function", obj{{"arguments", p}}}})
		}
	}
	// vLLM sends the last piece of the arguments together with finish_reason.
	var lastPiece obj
	if s.flavour == ChatVLLM && t.Fail == nil && len(perCall) > 0 {
		if l := perCall[len(perCall)-1]; len(l) > 1 {
			lastPiece = l[len(l)-1]
			perCall[len(perCall)-1] = l[:len(l)-1]
		}
	}
	if t.ChatInterleave {
		// Round by round, one chunk holds the next delta of every call that has one.
		for round := 0; ; round++ {
			var tcs []any
			for _, l := range perCall {
				if round < len(l) {
					tcs = append(tcs, l[round])
				}
			}
			if tcs == nil {
				break
			}
			callChunk(tcs)
		}
	} else {
		for _, l := range perCall {
			for _, d := range l {
				callChunk([]any{d})
			}
		}
	}

	if t.Fail != nil {
		code, msg := failure(t.Fail)
		switch s.flavour {
		case ChatVLLM:
			add(obj{{"error", obj{{"message", msg}, {"type", "InternalServerError"}, {"param", nil}, {"code", 500}}}})
		case ChatLlamaCpp:
			lines = append(lines, "error: "+string(mustMarshal(obj{{"code", 500}, {"message", msg}, {"type", "server_error"}})))
			return lines // and the connection closes: no [DONE]
		default:
			add(obj{{"error", obj{{"message", msg}, {"type", "server_error"}, {"param", nil}, {"code", code}}}})
		}
		return append(lines, "data: [DONE]")
	}

	switch {
	case lastPiece != nil:
		chunk(obj{{"tool_calls", []any{lastPiece}}}, ct.finish)
	case s.flavour == ChatVLLM && len(ct.calls) == 0:
		chunk(obj{{"content", ""}}, ct.finish)
	default:
		chunk(obj{}, ct.finish)
	}
	if includeUsage {
		switch s.flavour {
		case ChatVLLM:
			add(obj{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model}, {"choices", []any{}}, {"usage", u}})
		case ChatLlamaCpp:
			add(obj{{"choices", []any{}}, {"created", created}, {"id", id}, {"model", model}, {"system_fingerprint", "b6000-ciproxy"},
				{"object", "chat.completion.chunk"}, {"usage", u}, {"timings", llamaTimings(u)}})
		default:
			add(obj{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
				{"service_tier", "default"}, {"system_fingerprint", nil}, {"choices", []any{}}, {"usage", u},
				{"obfuscation", s.obfuscation()}})
		}
	}
	return append(lines, "data: [DONE]")
}
