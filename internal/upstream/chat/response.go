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
	"strconv"
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

	var items [][]byte
	kept := 0 // as Stream counts what it keeps
	if text := reasoningText(reasoningContent, reasoning); text != "" {
		kept += len(text)
		items = append(items, appendReasoningItem(nil, r.newID("rs_"), text, true))
	}
	var parts []outputPart
	if text := contentText(content); text != "" {
		p := outputPart{text: text}
		kept += len(text)
		if r.logprobs {
			var err error
			if p.logprobs, err = logprobElems(nil, logprobs.Get("content")); err != nil {
				return nil, err
			}
			kept += len(p.logprobs)
		}
		parts = append(parts, p)
	}
	if refusal.Type == gjson.String && refusal.Str != "" {
		parts = append(parts, outputPart{refusal: true, text: refusal.Str})
		kept += len(refusal.Str)
	}
	msgID := ""
	if len(parts) > 0 {
		msgID = r.newID("msg_") // ids are minted in output order, as the stream mints them
	}
	var calls []callItem
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
		c := callItem{id: r.newID("fc_"), callID: id.String(), name: name.String(), args: args}
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
		items = append(items, appendMessageItem(nil, msgID, itemStatus(len(items)), parts))
	}
	for _, c := range calls {
		st := itemStatus(len(items))
		if c.cut {
			st = "incomplete"
		}
		items = append(items, appendCallItem(nil, c.id, st, c.args, c.callID, c.name))
	}

	if createdAt == 0 {
		createdAt = created.Int()
	}
	return r.appendResponse(nil, responseState{
		id: id, createdAt: createdAt, completedAt: r.completedAt(status), status: status, incomplete: reason,
		model: model.String(), serviceTier: tier, output: items, usage: chatUsage(usage),
	}), nil
}

type callItem struct {
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
// Responses uses: token, logprob, bytes, top_logprobs) to dst, comma-separated and compacted.
func logprobElems(dst []byte, content gjson.Result) ([]byte, error) {
	if !content.IsArray() {
		return dst, nil // absent, or null as OpenAI sends it beside a refusal
	}
	var err error
	content.ForEach(func(_, lp gjson.Result) bool {
		if len(dst) > 0 {
			dst = append(dst, ',')
		}
		dst, err = appendCompact(dst, lp.Raw)
		return err == nil
	})
	return dst, err
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
	out := &responseUsage{input: u.Get("prompt_tokens").Int(), output: u.Get("completion_tokens").Int()}
	if c := u.Get("prompt_tokens_details.cached_tokens"); present(c) {
		out.cached = c.Int()
	} else {
		out.cached = u.Get("prompt_cache_hit_tokens").Int() // DeepSeek
	}
	out.reasoning = u.Get("completion_tokens_details.reasoning_tokens").Int()
	if t := u.Get("total_tokens"); present(t) {
		out.total = t.Int()
	} else {
		out.total = out.input + out.output
	}
	return out
}

func shapeError(cause error) error {
	return apierror.BadGateway("The upstream's response could not be read.", "upstream_error", fmt.Errorf("%w: %w", ErrShape, cause))
}

// The Response object, in the key order of OpenAI's live traffic. It is rendered by appends
// from segments prepared once per request (responseTemplate): a stream renders it three times
// and encoding/json would compact every echoed value again each time.

// responseTemplate holds what every Response of one request repeats from the request, as
// compacted JSON ready to append.
type responseTemplate struct {
	model                  string // the request's model, for an upstream that names none
	seg1, seg2, seg3, seg4 []byte
	tier                   string // the request's service_tier, or "auto"
}

// maxClientDepth is encoding/json's nesting limit, which clients' decoders share.
const maxClientDepth = 10000

// template compacts the echoed values (which also checks them against encoding/json's depth
// limit, as clients decode them with such parsers).
func (e *responseEcho) template() (responseTemplate, error) {
	var t responseTemplate
	var err error
	field := func(dst []byte, key, raw, def string) []byte {
		if err != nil {
			return dst
		}
		dst = append(dst, '"')
		dst = append(dst, key...)
		dst = append(dst, `":`...)
		if raw == "" {
			return append(dst, def...)
		}
		var ok bool
		if dst, ok = appendCompacted(dst, raw, maxClientDepth); !ok {
			err = fmt.Errorf("%s: nested deeper than %d levels", key, maxClientDepth)
		}
		return dst
	}
	t.model = gjson.Parse(e.model).String()
	// The segments share one array (each capped where it ends); when the guess is short, append
	// moves on to another and the earlier segments keep theirs.
	b := make([]byte, 0, 640+len(e.instructions)+len(e.promptCacheKey)+len(e.reasoning)+len(e.safetyIdentifier)+
		len(e.text)+len(e.toolChoice)+len(e.tools)+len(e.user)+len(e.metadata))
	from := 0
	segment := func() []byte {
		s := b[from:len(b):len(b)]
		from = len(b)
		return s
	}
	b = field(b, "instructions", e.instructions, "null")
	b = field(append(b, ','), "max_output_tokens", e.maxOutputTokens, "null")
	b = field(append(b, ','), "max_tool_calls", e.maxToolCalls, "null")
	t.seg1 = segment()
	b = field(b, "parallel_tool_calls", e.parallelToolCalls, "true")
	b = append(b, `,"previous_response_id":null,`...)
	b = field(b, "prompt_cache_key", e.promptCacheKey, "null")
	b = field(append(b, ','), "reasoning", e.reasoning, `{"effort":null,"summary":null}`)
	b = field(append(b, ','), "safety_identifier", e.safetyIdentifier, "null")
	t.seg2 = segment()
	b = field(b, "store", e.store, "true")
	b = field(append(b, ','), "temperature", e.temperature, "1.0")
	b = field(append(b, ','), "text", e.text, `{"format":{"type":"text"},"verbosity":"medium"}`)
	b = field(append(b, ','), "tool_choice", e.toolChoice, `"auto"`)
	b = field(append(b, ','), "tools", e.tools, "[]")
	b = field(append(b, ','), "top_logprobs", e.topLogprobs, "0")
	b = field(append(b, ','), "top_p", e.topP, "1.0")
	b = field(append(b, ','), "truncation", e.truncation, `"disabled"`)
	t.seg3 = segment()
	b = field(b, "user", e.user, "null")
	b = field(append(b, ','), "metadata", e.metadata, "{}")
	t.seg4 = segment()
	t.tier = `"auto"`
	if e.serviceTier != "" {
		t.tier = e.serviceTier // a string literal, already compact
	}
	return t, err
}

type responseError struct{ code, message string }

// responseUsage is token usage in the Responses API's terms.
type responseUsage struct {
	input, cached, output, reasoning, total int64
}

func (u *responseUsage) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"input_tokens":`...)
	dst = strconv.AppendInt(dst, u.input, 10)
	dst = append(dst, `,"input_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, u.cached, 10)
	dst = append(dst, `},"output_tokens":`...)
	dst = strconv.AppendInt(dst, u.output, 10)
	dst = append(dst, `,"output_tokens_details":{"reasoning_tokens":`...)
	dst = strconv.AppendInt(dst, u.reasoning, 10)
	dst = append(dst, `},"total_tokens":`...)
	dst = strconv.AppendInt(dst, u.total, 10)
	return append(dst, '}')
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
	output      [][]byte
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

// appendResponse appends the Response object in state st.
func (r *Request) appendResponse(dst []byte, st responseState) []byte {
	t := &r.tmpl
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, st.id)
	dst = append(dst, `,"object":"response","created_at":`...)
	dst = strconv.AppendInt(dst, st.createdAt, 10)
	dst = append(dst, `,"status":`...)
	dst = appendString(dst, st.status)
	dst = append(dst, `,"completed_at":`...)
	if st.completedAt != 0 {
		dst = strconv.AppendInt(dst, st.completedAt, 10)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"background":false,"error":`...)
	if st.err != nil {
		dst = append(dst, `{"code":`...)
		dst = appendString(dst, st.err.code)
		dst = append(dst, `,"message":`...)
		dst = appendString(dst, st.err.message)
		dst = append(dst, '}')
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"incomplete_details":`...)
	if st.incomplete != "" {
		dst = append(dst, `{"reason":`...)
		dst = appendString(dst, st.incomplete)
		dst = append(dst, '}')
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, ',')
	dst = append(dst, t.seg1...)
	dst = append(dst, `,"model":`...)
	model := st.model
	if model == "" {
		model = t.model
	}
	dst = appendString(dst, model)
	dst = append(dst, `,"output":[`...)
	for i, it := range st.output {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, it...)
	}
	dst = append(dst, "],"...)
	dst = append(dst, t.seg2...)
	dst = append(dst, `,"service_tier":`...)
	if st.serviceTier.Type == gjson.String && st.serviceTier.Str != "" {
		dst = appendString(dst, st.serviceTier.Str)
	} else {
		dst = append(dst, t.tier...)
	}
	dst = append(dst, ',')
	dst = append(dst, t.seg3...)
	dst = append(dst, `,"usage":`...)
	if st.usage != nil {
		dst = st.usage.appendJSON(dst)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, ',')
	dst = append(dst, t.seg4...)
	return append(dst, '}')
}

// Output items, shared by both renderings.

// outputPart is one content part of a message item.
type outputPart struct {
	refusal  bool
	text     string
	logprobs []byte // output_text: the logprob objects, comma-separated, without brackets
}

func appendPart(dst []byte, p outputPart) []byte {
	if p.refusal {
		dst = append(dst, `{"type":"refusal","refusal":`...)
		dst = appendString(dst, p.text)
		return append(dst, '}')
	}
	dst = append(dst, `{"type":"output_text","annotations":[],"logprobs":[`...)
	dst = append(dst, p.logprobs...)
	dst = append(dst, `],"text":`...)
	dst = appendString(dst, p.text)
	return append(dst, '}')
}

// appendMessageItem appends an assistant message item; parts nil gives the in-progress item of
// output_item.added.
func appendMessageItem(dst []byte, id, status string, parts []outputPart) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, id)
	dst = append(dst, `,"type":"message","status":"`...)
	dst = append(dst, status...)
	dst = append(dst, `","content":[`...)
	for i, p := range parts {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendPart(dst, p)
	}
	return append(dst, `],"role":"assistant"}`...)
}

// appendReasoningItem appends a reasoning item holding the reasoning text as one reasoning_text
// part (done), or with no content yet (for output_item.added).
func appendReasoningItem(dst []byte, id, text string, done bool) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, id)
	dst = append(dst, `,"type":"reasoning","summary":[],"content":[`...)
	if done {
		dst = append(dst, `{"type":"reasoning_text","text":`...)
		dst = appendString(dst, text)
		dst = append(dst, '}')
	}
	return append(dst, "]}"...)
}

func appendCallItem(dst []byte, id, status, args, callID, name string) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, id)
	dst = append(dst, `,"type":"function_call","status":"`...)
	dst = append(dst, status...)
	dst = append(dst, `","arguments":`...)
	dst = appendString(dst, args)
	dst = append(dst, `,"call_id":`...)
	dst = appendString(dst, callID)
	dst = append(dst, `,"name":`...)
	dst = appendString(dst, name)
	return append(dst, '}')
}
