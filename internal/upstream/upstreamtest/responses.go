package upstreamtest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
	"unicode/utf8"
)

// obj is a JSON object that keeps its keys in order, as OpenAI's wire format does.
type obj []kv

type kv struct {
	k string
	v any
}

// MarshalJSON implements json.Marshaler.
func (o obj) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(f.k)
		b.Write(k)
		b.WriteByte(':')
		v, err := marshal(f.v)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// marshal encodes v without escaping <, > and &, as OpenAI does.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

func mustMarshal(v any) []byte {
	b, err := marshal(v)
	if err != nil {
		panic(fmt.Sprintf("upstreamtest: %v", err))
	}
	return b
}

func readAll(r *http.Request) ([]byte, error) {
	defer r.Body.Close()
	return io.ReadAll(r.Body)
}

// item is an output item with its ids assigned.
type item struct {
	Item
	enc string // encrypted_content, for reasoning items when requested
}

// prepare assigns ids and statuses to the turn's items.
func (s *Server) prepare(req Request, t Turn) []item {
	out := make([]item, len(t.Items))
	for i, it := range t.Items {
		if it.Status == "" {
			it.Status = "completed"
		}
		switch {
		case it.Raw != nil:
		case it.Type == "message":
			if it.ID == "" {
				it.ID = s.id("msg_")
			}
		case it.Type == "function_call":
			if it.ID == "" {
				it.ID = s.id("fc_")
			}
			if it.CallID == "" {
				it.CallID = "call_" + s.token(24)
			}
		case it.Type == "reasoning":
			if it.ID == "" {
				it.ID = s.id("rs_")
			}
		}
		out[i] = item{Item: it}
		if it.Type == "reasoning" && it.Raw == nil && req.Includes("reasoning.encrypted_content") {
			s.mu.Lock()
			raw := make([]byte, 48)
			for j := range raw {
				raw[j] = byte(s.rng.Uint32())
			}
			enc := "gAAAAA" + base64.URLEncoding.EncodeToString(raw)
			s.encrypted[enc] = true
			s.mu.Unlock()
			out[i].enc = enc
		}
	}
	return out
}

// json returns the item as output_item.added (final false) or output_item.done and the
// response's output show it.
func (it item) json(final bool) any {
	if it.Raw != nil {
		return it.Raw
	}
	switch it.Type {
	case "message":
		if !final {
			return obj{{"id", it.ID}, {"type", "message"}, {"status", "in_progress"}, {"content", []any{}}, {"role", "assistant"}}
		}
		return obj{{"id", it.ID}, {"type", "message"}, {"status", it.Status}, {"content", []any{textPart(it.Text)}}, {"role", "assistant"}}
	case "function_call":
		status, args := it.Status, it.Arguments
		if !final {
			status, args = "in_progress", ""
		}
		return obj{{"id", it.ID}, {"type", "function_call"}, {"status", status}, {"arguments", args}, {"call_id", it.CallID}, {"name", it.Name}}
	case "reasoning":
		o := obj{{"id", it.ID}, {"type", "reasoning"}}
		if it.enc != "" {
			o = append(o, kv{"encrypted_content", it.enc})
		}
		summary := []any{}
		if final && it.Summary != "" {
			summary = append(summary, obj{{"type", "summary_text"}, {"text", it.Summary}})
		}
		return append(o, kv{"summary", summary})
	}
	return obj{{"id", it.ID}, {"type", it.Type}}
}

func textPart(text string) obj {
	return obj{{"type", "output_text"}, {"annotations", []any{}}, {"logprobs", []any{}}, {"text", text}}
}

// echo returns the request's field key as sent, or def when absent.
func echo(req Request, key, def string) json.RawMessage {
	if raw, ok := req.Fields[key]; ok {
		return raw
	}
	return json.RawMessage(def)
}

// response builds the Response object in OpenAI's key order.
func (s *Server) response(req Request, t Turn, id string, created int64, status string, output []any, usage, errObj any) obj {
	model := t.Model
	if model == "" {
		model = req.Model
	}
	var incomplete any
	if status == "incomplete" {
		incomplete = obj{{"reason", t.Incomplete}}
	}
	tier := "auto"
	if status != "in_progress" {
		tier = "default"
	}
	if raw, ok := req.Fields["service_tier"]; ok {
		var v string
		if json.Unmarshal(raw, &v) == nil && v != "auto" {
			tier = v
		}
	}
	if output == nil {
		output = []any{}
	}
	var completed any // OpenAI's completed responses say when they completed; others have null
	if status == "completed" {
		completed = s.now().Unix()
	}
	return obj{
		{"id", id},
		{"object", "response"},
		{"created_at", created},
		{"status", status},
		{"completed_at", completed},
		{"background", false},
		{"error", errObj},
		{"incomplete_details", incomplete},
		{"instructions", echo(req, "instructions", "null")},
		{"max_output_tokens", echo(req, "max_output_tokens", "null")},
		{"max_tool_calls", echo(req, "max_tool_calls", "null")},
		{"model", model},
		{"output", output},
		{"parallel_tool_calls", echo(req, "parallel_tool_calls", "true")},
		{"previous_response_id", nullable(req.PreviousResponseID)},
		{"prompt_cache_key", echo(req, "prompt_cache_key", "null")},
		{"reasoning", echo(req, "reasoning", `{"effort":null,"summary":null}`)},
		{"safety_identifier", echo(req, "safety_identifier", "null")},
		{"service_tier", tier},
		{"store", req.Store},
		{"temperature", echo(req, "temperature", "1.0")},
		{"text", echo(req, "text", `{"format":{"type":"text"},"verbosity":"medium"}`)},
		{"tool_choice", echo(req, "tool_choice", `"auto"`)},
		{"tools", echo(req, "tools", "[]")},
		{"top_logprobs", echo(req, "top_logprobs", "0")},
		{"top_p", echo(req, "top_p", "1.0")},
		{"truncation", echo(req, "truncation", `"disabled"`)},
		{"usage", usage},
		{"user", echo(req, "user", "null")},
		{"metadata", echo(req, "metadata", "{}")},
	}
}

// usage returns the turn's usage, estimated when the turn gives none: about 4 bytes a token.
func usage(req Request, t Turn, items []item) obj {
	u := Usage{}
	if t.Usage != nil {
		u = *t.Usage
	} else {
		u.InputTokens = 1 + len(req.Body)/4
		for _, it := range items {
			u.OutputTokens += 1 + (len(it.Text)+len(it.Arguments)+len(it.Summary))/4
			if it.Type == "reasoning" {
				u.ReasoningTokens += 16
				u.OutputTokens += 16
			}
		}
	}
	return obj{
		{"input_tokens", u.InputTokens},
		{"input_tokens_details", obj{{"cached_tokens", u.CachedTokens}}},
		{"output_tokens", u.OutputTokens},
		{"output_tokens_details", obj{{"reasoning_tokens", u.ReasoningTokens}}},
		{"total_tokens", u.InputTokens + u.OutputTokens},
	}
}

func failure(f *Failure) (code, message string) {
	code, message = f.Code, f.Message
	if code == "" {
		code = "server_error"
	}
	if message == "" {
		message = "The server had an error processing your request. Sorry about that! You can retry your request, " +
			"or contact us through our help center at help.openai.com if you keep seeing this error."
	}
	return code, message
}

// hold waits for t.Hold; it reports false when the request ended first.
func hold(ctx context.Context, t Turn) bool {
	if t.Hold == nil {
		return true
	}
	select {
	case <-t.Hold:
		return true
	case <-ctx.Done():
		return false
	}
}

// serveResponses answers a POST /v1/responses with the turn.
func (s *Server) serveResponses(w http.ResponseWriter, r *http.Request, req Request, t Turn) {
	ctx := r.Context()
	if !hold(ctx, t) {
		return
	}
	if t.Error != nil {
		writeError(w, t.Error)
		return
	}
	items := s.prepare(req, t)
	id := t.ID
	if id == "" {
		id = s.id("resp_")
	}
	created := s.now().Unix()

	// The final state.
	n := len(items)
	status := "completed"
	var errObj any
	var u any = usage(req, t, items)
	if t.Fail != nil {
		n = min(max(t.Fail.After, 0), len(items))
		status = "failed"
		code, msg := failure(t.Fail)
		errObj = obj{{"code", code}, {"message", msg}}
		u = nil
	} else if t.Incomplete != "" {
		status = "incomplete"
	}
	output := make([]any, n)
	outRaw := make([]json.RawMessage, n)
	for i := range n {
		output[i] = items[i].json(true)
		outRaw[i] = mustMarshal(output[i])
	}
	final := s.response(req, t, id, created, status, output, u, errObj)
	finalJSON := mustMarshal(final)

	w.Header().Set("X-Request-Id", "req_"+s.id("")[:32])
	if !req.Stream {
		if !t.Cut {
			s.store(req, id, finalJSON, outRaw)
		}
		w.Header().Set("Content-Type", "application/json")
		if t.Cut {
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(finalJSON[:min(max(t.CutAfter, 0), len(finalJSON))])
			flush(w)
			panic(http.ErrAbortHandler)
		}
		_, _ = w.Write(finalJSON)
		return
	}

	e := &events{}
	start := s.response(req, t, id, created, "in_progress", nil, nil, nil)
	e.add("response.created", kv{"response", start})
	e.add("response.in_progress", kv{"response", start})
	obf := true
	var so struct {
		IncludeObfuscation *bool `json:"include_obfuscation"`
	}
	if json.Unmarshal(req.Fields["stream_options"], &so) == nil && so.IncludeObfuscation != nil {
		obf = *so.IncludeObfuscation
	}
	for i := range n {
		s.itemEvents(e, i, items[i], t, obf)
	}
	if t.Fail != nil {
		if !t.Fail.NoErrorEvent {
			// Live traffic names the error type after its code (insufficient_quota, server_error).
			code, msg := failure(t.Fail)
			e.add("error", kv{"error", obj{{"type", code}, {"code", code}, {"message", msg}, {"param", nil}}})
		}
		e.add("response.failed", kv{"response", final})
	} else if status == "incomplete" {
		e.add("response.incomplete", kv{"response", final})
	} else {
		e.add("response.completed", kv{"response", final})
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flush(w)
	for seq, ev := range e.list {
		if t.Cut && seq == t.CutAfter {
			panic(http.ErrAbortHandler)
		}
		if t.Delay > 0 {
			timer := time.NewTimer(t.Delay)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				return
			}
		}
		if t.BeforeEvent != nil {
			if err := t.BeforeEvent(ctx, seq, ev.typ); err != nil {
				panic(http.ErrAbortHandler)
			}
		}
		if seq == len(e.list)-1 {
			// Stored before the terminal event, so a client that follows up at once finds it.
			s.store(req, id, finalJSON, outRaw)
		}
		data := append(obj{{"type", ev.typ}, {"sequence_number", seq}}, ev.fields...)
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.typ, mustMarshal(data)); err != nil {
			return
		}
		flush(w)
	}
	if t.Cut {
		panic(http.ErrAbortHandler)
	}
}

func flush(w http.ResponseWriter) {
	_ = http.NewResponseController(w).Flush()
}

func (s *Server) store(req Request, id string, body []byte, output []json.RawMessage) {
	if !req.Store {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.responses[id] = &stored{body: body, history: req.History, output: output}
	for _, it := range output {
		s.items[itemField(it, "id")] = it
	}
}

// events collects stream events; sequence numbers are given when written.
type events struct{ list []event }

type event struct {
	typ    string
	fields []kv
}

func (e *events) add(typ string, fields ...kv) { e.list = append(e.list, event{typ, fields}) }

// itemEvents adds the events that stream one output item.
// Delta events carry obfuscation padding unless obf is false (stream_options.include_obfuscation).
func (s *Server) itemEvents(e *events, idx int, it item, t Turn, obf bool) {
	pad := func(fields ...kv) []kv {
		if obf {
			fields = append(fields, kv{"obfuscation", s.obfuscation()})
		}
		return fields
	}
	e.add("response.output_item.added", kv{"output_index", idx}, kv{"item", it.json(false)})
	if it.Raw != nil {
		e.add("response.output_item.done", kv{"output_index", idx}, kv{"item", it.json(true)})
		return
	}
	textChunk := t.TextChunk
	if textChunk <= 0 {
		textChunk = s.text
	}
	switch it.Type {
	case "message":
		head := []kv{{"item_id", it.ID}, {"output_index", idx}, {"content_index", 0}}
		e.add("response.content_part.added", append(head, kv{"part", textPart("")})...)
		for _, d := range split(it.Text, textChunk) {
			e.add("response.output_text.delta", append(head, pad(kv{"delta", d}, kv{"logprobs", []any{}})...)...)
		}
		e.add("response.output_text.done", append(head, kv{"text", it.Text}, kv{"logprobs", []any{}})...)
		e.add("response.content_part.done", append(head, kv{"part", textPart(it.Text)})...)
	case "function_call":
		argsChunk := t.ArgsChunk
		if argsChunk <= 0 {
			argsChunk = s.args
		}
		head := []kv{{"item_id", it.ID}, {"output_index", idx}}
		for _, d := range split(it.Arguments, argsChunk) {
			e.add("response.function_call_arguments.delta", append(head, pad(kv{"delta", d})...)...)
		}
		e.add("response.function_call_arguments.done", append(head, kv{"arguments", it.Arguments})...)
	case "reasoning":
		if it.Summary != "" {
			head := []kv{{"item_id", it.ID}, {"output_index", idx}, {"summary_index", 0}}
			e.add("response.reasoning_summary_part.added", append(head, kv{"part", obj{{"type", "summary_text"}, {"text", ""}}})...)
			for _, d := range split(it.Summary, textChunk) {
				e.add("response.reasoning_summary_text.delta", append(head, pad(kv{"delta", d})...)...)
			}
			e.add("response.reasoning_summary_text.done", append(head, kv{"text", it.Summary})...)
			e.add("response.reasoning_summary_part.done", append(head, kv{"part", obj{{"type", "summary_text"}, {"text", it.Summary}}})...)
		}
	}
	e.add("response.output_item.done", kv{"output_index", idx}, kv{"item", it.json(true)})
}

// split cuts s into pieces of about n bytes, never inside a UTF-8 sequence (a JSON string
// cannot carry half of one). Escapes in JSON text are ASCII, so they are split anywhere.
func split(s string, n int) []string {
	var out []string
	for len(s) > 0 {
		end := min(n, len(s))
		for end < len(s) && !utf8.RuneStart(s[end]) {
			end++
		}
		out = append(out, s[:end])
		s = s[end:]
	}
	return out
}
