package chat

// Responses ⇄ Chat Completions, the answer side for JSON: a chat.completion becomes a Response.
// The items and the Response object are built by the same functions the stream translator
// (stream.go) uses, so both renderings agree byte for byte.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
)

// ErrShape marks a Chat Completions answer the translation cannot read: not JSON, no
// choices, a chunk of the wrong shape, a tool call without a name.
var ErrShape = errors.New("unexpected Chat Completions answer")

// Response translates a chat.completion (the body of a 2xx JSON answer) into the Response a
// Responses upstream would have answered, with the given id and created_at (0: the completion's
// created). chat is neither modified nor retained.
//
// A body that is an error object (some servers answer 200 with one) is returned as the mapped
// *apierror.Error (see UpstreamError); a body that cannot be read is a 502 *apierror.Error wrapping
// ErrShape.
func (r *Request) Response(chat []byte, id string, createdAt int64) ([]byte, error) {
	chat = ValidUTF8(chat)
	if !gjson.ValidBytes(chat) {
		return nil, shapeError(errors.New("the body is not JSON"))
	}
	root := gjson.ParseBytes(chat)
	if !root.IsObject() {
		return nil, shapeError(errors.New("the body is not a JSON object"))
	}
	// One pass over each level, as root.Get(key) reads each key (the first of duplicates).
	var errObj, object, choices, created, model, tier, usage gjson.Result
	readFields(root, field{"error", &errObj}, field{"object", &object}, field{"choices", &choices}, field{"created", &created},
		field{"model", &model}, field{"service_tier", &tier}, field{"usage", &usage})
	if present(errObj) || object.String() == "error" {
		return nil, bodyError(root, http.StatusBadGateway)
	}
	var choice, message, finishReason, logprobs gjson.Result
	choices.ForEach(func(_, c gjson.Result) bool {
		var index gjson.Result
		readFields(c, field{"index", &index}, field{"message", &message}, field{"finish_reason", &finishReason}, field{"logprobs", &logprobs})
		if index.Int() == 0 { // the only choice the translation asks for
			choice = c
			return false
		}
		message, finishReason, logprobs = gjson.Result{}, gjson.Result{}, gjson.Result{}
		return true
	})
	if !choice.IsObject() {
		return nil, shapeError(errors.New("no choices"))
	}
	var reasoningContent, reasoning, content, refusal, toolCalls gjson.Result
	readFields(message, field{"reasoning_content", &reasoningContent}, field{"reasoning", &reasoning}, field{"content", &content},
		field{"refusal", &refusal}, field{"tool_calls", &toolCalls})
	status, reason := finishStatus(finishReason.String())

	var items []any
	kept := 0 // as Stream counts what it keeps
	if text := reasoningText(reasoningContent, reasoning); text != "" {
		kept += len(text)
		items = append(items, newReasoningOut(r.newID("rs_"), text, true))
	}
	var parts []any
	if text := contentText(content); text != "" {
		var lps []json.RawMessage
		kept += len(text)
		if r.logprobs {
			n := 0
			var err error
			if lps, n, err = logprobElems(nil, logprobs.Get("content")); err != nil {
				return nil, err
			}
			kept += n
		}
		parts = append(parts, newTextOut(text, lps))
	}
	if refusal.Type == gjson.String && refusal.Str != "" {
		parts = append(parts, &refusalOut{Type: "refusal", Refusal: refusal.Str})
		kept += len(refusal.Str)
	}
	msgID := ""
	if len(parts) > 0 {
		msgID = r.newID("msg_") // ids are minted in output order, as the stream mints them
	}
	var calls []chatCall
	var err error
	if !present(toolCalls) {
		toolCalls = gjson.Result{} // null beside text, as OpenAI and vLLM send it: no calls
	}
	toolCalls.ForEach(func(_, tc gjson.Result) bool {
		var id, fn, name, arguments gjson.Result
		readFields(tc, field{"id", &id}, field{"function", &fn})
		readFields(fn, field{"name", &name}, field{"arguments", &arguments})
		if name.String() == "" {
			err = shapeError(errors.New("a tool call without a function name"))
			return false
		}
		args, aerr := argumentsText(arguments)
		if aerr != nil {
			err = aerr
			return false
		}
		c := chatCall{id: r.newID("fc_"), callID: id.String(), name: name.String(), args: args}
		if len(args) > r.maxArgs {
			c.args, c.cut = cutUTF8(args, r.maxArgs), true
		}
		kept += len(c.args)
		if c.callID == "" {
			c.callID = r.newID("call_")
		}
		calls = append(calls, c)
		return true
	})
	if err != nil {
		return nil, err
	}
	if kept > maxAnswerKept {
		return nil, answerTooLarge()
	}
	last := len(items) + len(calls) - 1
	if len(parts) > 0 {
		last++
	}
	itemStatus := func(i int) string {
		if i == last && status == "incomplete" {
			return "incomplete"
		}
		return "completed"
	}
	if len(parts) > 0 {
		items = append(items, newMessageOut(msgID, itemStatus(len(items)), parts))
	}
	for _, c := range calls {
		st := itemStatus(len(items))
		if c.cut {
			st = "incomplete"
		}
		items = append(items, newCallOut(c.id, st, c.args, c.callID, c.name))
	}

	if createdAt == 0 {
		createdAt = created.Int()
	}
	enc := newEncoder()
	if err := enc.appendResponse(r.frame, r.response(responseState{
		id: id, createdAt: createdAt, completedAt: r.completedAt(status), status: status, incomplete: reason,
		model: model.String(), serviceTier: tier, output: items, usage: chatUsage(usage),
	})); err != nil {
		return nil, shapeError(err)
	}
	return enc.buf, nil
}

type chatCall struct {
	id, callID, name, args string
	cut                    bool // the arguments were cut at maxArgs
}

// finishStatus maps a finish_reason to the Response's status and incomplete reason.
func finishStatus(finish string) (status, reason string) {
	switch finish {
	case "length":
		return "incomplete", "max_output_tokens"
	case "content_filter":
		return "incomplete", "content_filter"
	}
	return "completed", ""
}

// reasoningText returns a message's reasoning: reasoning_content (vLLM until 0.10, DeepSeek,
// SGLang, llama.cpp), or reasoning (vLLM from 0.10, OpenRouter, Groq).
func reasoningText(reasoningContent, reasoning gjson.Result) string {
	if reasoningContent.Type == gjson.String && reasoningContent.Str != "" {
		return reasoningContent.Str
	}
	if reasoning.Type == gjson.String {
		return reasoning.Str
	}
	return ""
}

// contentText returns message content: a string, or the text of an array of text parts (some
// servers answer with parts).
func contentText(c gjson.Result) string {
	if c.Type == gjson.String {
		return c.Str
	}
	var b strings.Builder
	c.ForEach(func(_, p gjson.Result) bool {
		if t := p.Get("text"); t.Type == gjson.String {
			b.WriteString(t.Str)
		}
		return true
	})
	return b.String()
}

// argumentsText returns a tool call's arguments as the JSON text Responses carries: the string
// itself, or the compacted JSON of an object some servers send in its place.
func argumentsText(a gjson.Result) (string, error) {
	switch {
	case a.Type == gjson.String:
		return a.Str, nil
	case a.IsObject(), a.IsArray():
		b, err := appendCompact(nil, a.Raw)
		return string(b), err
	}
	return "", nil
}

// logprobElems appends the elements of a chat logprobs.content array (the same objects
// Responses uses: token, logprob, bytes, top_logprobs) to dst, compacted, and reports their
// bytes.
func logprobElems(dst []json.RawMessage, content gjson.Result) ([]json.RawMessage, int, error) {
	if !content.IsArray() {
		return dst, 0, nil // absent, or null as OpenAI sends it beside a refusal
	}
	var err error
	n := 0
	content.ForEach(func(_, lp gjson.Result) bool {
		var b []byte
		if b, err = appendCompact(nil, lp.Raw); err == nil {
			dst = append(dst, b)
			n += len(b) + 1
		}
		return err == nil
	})
	return dst, n, err
}

// appendCompact appends raw JSON without its spaces and line breaks (an event's data is one
// line), failing where encoding/json would (nesting past its depth limit).
func appendCompact(dst []byte, raw string) ([]byte, error) {
	b := bytes.NewBuffer(dst)
	if err := json.Compact(b, []byte(raw)); err != nil {
		return dst, shapeError(err)
	}
	return b.Bytes(), nil
}

// chatUsage maps a chat usage object; nil when there is none.
func chatUsage(u gjson.Result) *responseUsage {
	if !u.IsObject() {
		return nil
	}
	out := &responseUsage{InputTokens: u.Get("prompt_tokens").Int(), OutputTokens: u.Get("completion_tokens").Int()}
	if c := u.Get("prompt_tokens_details.cached_tokens"); present(c) {
		out.InputTokensDetails.CachedTokens = c.Int()
	} else {
		out.InputTokensDetails.CachedTokens = u.Get("prompt_cache_hit_tokens").Int() // DeepSeek
	}
	out.OutputTokensDetails.ReasoningTokens = u.Get("completion_tokens_details.reasoning_tokens").Int()
	if t := u.Get("total_tokens"); present(t) {
		out.TotalTokens = t.Int()
	} else {
		out.TotalTokens = out.InputTokens + out.OutputTokens
	}
	return out
}

func shapeError(cause error) error {
	return apierror.BadGateway("The upstream's response could not be read.", apierror.CodeUpstreamError, fmt.Errorf("%w: %w", ErrShape, cause))
}

// The Response object: what every Response of one request repeats from the request is set once
// (Request.tmpl), what differs between them (responseState) on a copy.

// newTemplate returns the Response fields the request's values fill, each the request's value as
// it came or OpenAI's default. The values nested past what encoding/json (and clients' decoders
// like it) accept are refused here, so that every Response of the request encodes.
func (e *responseEcho) newTemplate() (response, error) {
	for _, v := range []struct {
		key string
		raw json.RawMessage
	}{{"reasoning", e.reasoning}, {"text", e.text}, {"tool_choice", e.toolChoice}, {"tools", e.tools}, {"metadata", e.metadata}} {
		if v.raw != nil && !json.Valid(v.raw) {
			return response{}, fmt.Errorf("%s: nested too deeply", v.key)
		}
	}
	text := defaultText{Verbosity: "medium"}
	text.Format.Type = "text"
	return response{
		responseHead: responseHead{Object: "response"},
		echoBeforeModel: echoBeforeModel{
			Instructions:    rawOr(e.instructions, nil),
			MaxOutputTokens: rawOr(e.maxOutputTokens, nil),
			MaxToolCalls:    rawOr(e.maxToolCalls, nil),
		},
		Model: gjson.ParseBytes(e.model).String(),
		echoBeforeTier: echoBeforeTier{
			ParallelToolCalls: rawOr(e.parallelToolCalls, true),
			PromptCacheKey:    rawOr(e.promptCacheKey, nil),
			Reasoning:         rawOr(e.reasoning, defaultReasoning{}),
			SafetyIdentifier:  rawOr(e.safetyIdentifier, nil),
		},
		ServiceTier: rawOr(e.serviceTier, "auto"),
		echoBeforeUsage: echoBeforeUsage{
			Store:       rawOr(e.store, true),
			Temperature: rawOr(e.temperature, json.RawMessage("1.0")), // as OpenAI writes it; Go would write 1
			Text:        rawOr(e.text, text),
			ToolChoice:  rawOr(e.toolChoice, "auto"),
			Tools:       rawOr(e.tools, []struct{}{}),
			TopLogprobs: rawOr(e.topLogprobs, 0),
			TopP:        rawOr(e.topP, json.RawMessage("1.0")),
			Truncation:  rawOr(e.truncation, "disabled"),
		},
		echoAfterUsage: echoAfterUsage{
			User:     rawOr(e.user, nil),
			Metadata: rawOr(e.metadata, struct{}{}),
		},
	}, nil
}

// responseState is what differs between the Responses built for one request.
type responseState struct {
	id          string
	createdAt   int64
	completedAt int64 // 0: null (the response is not finished)
	status      string
	incomplete  string // incomplete_details.reason
	err         *responseError
	model       string       // the upstream's; "": the request's
	serviceTier gjson.Result // the upstream's service_tier, if it named one
	output      []any
	usage       *responseUsage
}

// completedAt is the completed_at of a Response of the given status: now for a completed one,
// none (null) otherwise, as OpenAI sets it.
func (r *Request) completedAt(status string) int64 {
	if status != "completed" {
		return 0
	}
	return r.now().Unix()
}

// response returns the Response in state st.
func (r *Request) response(st responseState) *response {
	resp := r.tmpl
	resp.ID, resp.CreatedAt, resp.Status, resp.Error, resp.Usage = st.id, st.createdAt, st.status, st.err, st.usage
	if st.completedAt != 0 {
		resp.CompletedAt = &st.completedAt
	}
	if st.incomplete != "" {
		resp.IncompleteDetails = &incompleteDetails{Reason: st.incomplete}
	}
	if st.model != "" {
		resp.Model = st.model
	}
	resp.Output = st.output
	if resp.Output == nil {
		resp.Output = []any{}
	}
	if st.serviceTier.Type == gjson.String && st.serviceTier.Str != "" {
		resp.ServiceTier = st.serviceTier.Str
	}
	return &resp
}
