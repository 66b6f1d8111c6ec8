package upstream

// Responses ⇄ Chat Completions, the answer side for JSON: a chat.completion becomes a Response.
// The items and the Response object are built by the same functions the stream translator
// (responses_chat_stream.go) uses, so both renderings agree byte for byte.

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

// ErrChatShape marks a Chat Completions answer the translation cannot read: not JSON, no
// choices, a chunk of the wrong shape, a tool call without a name.
var ErrChatShape = errors.New("unexpected Chat Completions answer")

// Response translates a chat.completion (the body of a 2xx JSON answer) into the Response a
// Responses upstream would have answered, with the given id and created_at (0: the completion's
// created). chat is neither modified nor retained.
//
// A body that is an error object (some servers answer 200 with one) is returned as the mapped
// *apierror.Error (see ChatError); a body that cannot be read is a 502 *apierror.Error wrapping
// ErrChatShape.
func (r *ChatRequest) Response(chat []byte, id string, createdAt int64) ([]byte, error) {
	if !gjson.ValidBytes(chat) {
		return nil, shapeError(errors.New("the body is not JSON"))
	}
	root := gjson.ParseBytes(chat)
	if !root.IsObject() {
		return nil, shapeError(errors.New("the body is not a JSON object"))
	}
	if isErrorObject(root) {
		return nil, bodyError(root, http.StatusBadGateway)
	}
	choice := firstChoice(root)
	if !choice.IsObject() {
		return nil, shapeError(errors.New("no choices"))
	}
	msg := choice.Get("message")
	finish := choice.Get("finish_reason").String()
	status, reason := finishStatus(finish)

	var items [][]byte
	if text := reasoningText(msg); text != "" {
		items = append(items, appendReasoningItem(nil, r.newID("rs_"), text, true))
	}
	var parts []outputPart
	if text := contentText(msg.Get("content")); text != "" {
		p := outputPart{text: text}
		if r.logprobs {
			p.logprobs = logprobElems(nil, choice.Get("logprobs.content"))
		}
		parts = append(parts, p)
	}
	if ref := msg.Get("refusal"); ref.Type == gjson.String && ref.Str != "" {
		parts = append(parts, outputPart{refusal: true, text: ref.Str})
	}
	msgID := ""
	if len(parts) > 0 {
		msgID = r.newID("msg_") // ids are minted in output order, as the stream mints them
	}
	var calls []callItem
	var err error
	msg.Get("tool_calls").ForEach(func(_, tc gjson.Result) bool {
		fn := tc.Get("function")
		name := fn.Get("name").String()
		if name == "" {
			err = shapeError(errors.New("a tool call without a function name"))
			return false
		}
		c := callItem{id: r.newID("fc_"), callID: tc.Get("id").String(), name: name, args: argumentsText(fn.Get("arguments"))}
		if c.callID == "" {
			c.callID = r.newID("call_")
		}
		calls = append(calls, c)
		return true
	})
	if err != nil {
		return nil, err
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
		items = append(items, appendCallItem(nil, c.id, itemStatus(len(items)), c.args, c.callID, c.name))
	}

	if createdAt == 0 {
		createdAt = root.Get("created").Int()
	}
	out, err := r.response(responseState{
		id: id, createdAt: createdAt, status: status, incomplete: reason,
		model: root.Get("model").String(), serviceTier: root.Get("service_tier"),
		output: items, usage: chatUsage(root.Get("usage")),
	})
	if err != nil {
		return nil, shapeError(err)
	}
	return out, nil
}

type callItem struct{ id, callID, name, args string }

// firstChoice returns the choice with index 0 (the only one the translation asks for).
func firstChoice(root gjson.Result) gjson.Result {
	var found gjson.Result
	root.Get("choices").ForEach(func(_, c gjson.Result) bool {
		if c.Get("index").Int() == 0 {
			found = c
			return false
		}
		return true
	})
	return found
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
func reasoningText(msg gjson.Result) string {
	if r := msg.Get("reasoning_content"); r.Type == gjson.String && r.Str != "" {
		return r.Str
	}
	if r := msg.Get("reasoning"); r.Type == gjson.String {
		return r.Str
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
// itself, or the JSON of an object some servers send in its place.
func argumentsText(a gjson.Result) string {
	switch {
	case a.Type == gjson.String:
		return a.Str
	case a.IsObject(), a.IsArray():
		return a.Raw
	}
	return ""
}

// logprobElems appends the elements of a chat logprobs.content array (the same objects
// Responses uses: token, logprob, bytes, top_logprobs) to dst, comma-separated.
func logprobElems(dst []byte, content gjson.Result) []byte {
	content.ForEach(func(_, lp gjson.Result) bool {
		if len(dst) > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, lp.Raw...)
		return true
	})
	return dst
}

// chatUsage maps a chat usage object; nil when there is none.
func chatUsage(u gjson.Result) *responseUsage {
	if !u.IsObject() {
		return nil
	}
	out := &responseUsage{
		InputTokens:  u.Get("prompt_tokens").Int(),
		OutputTokens: u.Get("completion_tokens").Int(),
	}
	if c := u.Get("prompt_tokens_details.cached_tokens"); c.Exists() {
		out.InputTokensDetails.CachedTokens = c.Int()
	} else {
		out.InputTokensDetails.CachedTokens = u.Get("prompt_cache_hit_tokens").Int() // DeepSeek
	}
	out.OutputTokensDetails.ReasoningTokens = u.Get("completion_tokens_details.reasoning_tokens").Int()
	if t := u.Get("total_tokens"); t.Exists() {
		out.TotalTokens = t.Int()
	} else {
		out.TotalTokens = out.InputTokens + out.OutputTokens
	}
	return out
}

func shapeError(cause error) error {
	return apierror.BadGateway("The upstream's response could not be read.", "upstream_error", fmt.Errorf("%w: %w", ErrChatShape, cause))
}

// The Response object, in the key order of OpenAI's live traffic.

type responseObject struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	CreatedAt          int64             `json:"created_at"`
	Status             string            `json:"status"`
	Background         bool              `json:"background"`
	Error              *responseError    `json:"error"`
	IncompleteDetails  *incompleteDetail `json:"incomplete_details"`
	Instructions       json.RawMessage   `json:"instructions"`
	MaxOutputTokens    json.RawMessage   `json:"max_output_tokens"`
	MaxToolCalls       json.RawMessage   `json:"max_tool_calls"`
	Model              string            `json:"model"`
	Output             []json.RawMessage `json:"output"`
	ParallelToolCalls  json.RawMessage   `json:"parallel_tool_calls"`
	PreviousResponseID json.RawMessage   `json:"previous_response_id"`
	PromptCacheKey     json.RawMessage   `json:"prompt_cache_key"`
	Reasoning          json.RawMessage   `json:"reasoning"`
	SafetyIdentifier   json.RawMessage   `json:"safety_identifier"`
	ServiceTier        json.RawMessage   `json:"service_tier"`
	Store              json.RawMessage   `json:"store"`
	Temperature        json.RawMessage   `json:"temperature"`
	Text               json.RawMessage   `json:"text"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	Tools              json.RawMessage   `json:"tools"`
	TopLogprobs        json.RawMessage   `json:"top_logprobs"`
	TopP               json.RawMessage   `json:"top_p"`
	Truncation         json.RawMessage   `json:"truncation"`
	Usage              *responseUsage    `json:"usage"`
	User               json.RawMessage   `json:"user"`
	Metadata           json.RawMessage   `json:"metadata"`
}

type responseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type incompleteDetail struct {
	Reason string `json:"reason"`
}

type responseUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int64 `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int64 `json:"total_tokens"`
}

// responseState is what differs between the Responses built for one request.
type responseState struct {
	id          string
	createdAt   int64
	status      string
	incomplete  string // incomplete_details.reason
	err         *responseError
	model       string       // the upstream's; "": the request's
	serviceTier gjson.Result // the upstream's service_tier, if it named one
	output      [][]byte
	usage       *responseUsage
}

// response renders a Response object. It fails only on raw JSON that encoding/json refuses
// (nested beyond its depth limit); NewChatRequest renders one first, so the request's parts
// never do.
func (r *ChatRequest) response(st responseState) ([]byte, error) {
	e := &r.echo
	o := responseObject{
		ID: st.id, Object: "response", CreatedAt: st.createdAt, Status: st.status, Error: st.err,
		Instructions:       orDefault(e.instructions, "null"),
		MaxOutputTokens:    orDefault(e.maxOutputTokens, "null"),
		MaxToolCalls:       orDefault(e.maxToolCalls, "null"),
		Model:              st.model,
		Output:             make([]json.RawMessage, len(st.output)),
		ParallelToolCalls:  orDefault(e.parallelToolCalls, "true"),
		PreviousResponseID: json.RawMessage("null"),
		PromptCacheKey:     orDefault(e.promptCacheKey, "null"),
		Reasoning:          orDefault(e.reasoning, `{"effort":null,"summary":null}`),
		SafetyIdentifier:   orDefault(e.safetyIdentifier, "null"),
		ServiceTier:        orDefault(e.serviceTier, `"auto"`),
		Store:              orDefault(e.store, "true"),
		Temperature:        orDefault(e.temperature, "1.0"),
		Text:               orDefault(e.text, `{"format":{"type":"text"},"verbosity":"medium"}`),
		ToolChoice:         orDefault(e.toolChoice, `"auto"`),
		Tools:              orDefault(e.tools, "[]"),
		TopLogprobs:        orDefault(e.topLogprobs, "0"),
		TopP:               orDefault(e.topP, "1.0"),
		Truncation:         orDefault(e.truncation, `"disabled"`),
		Usage:              st.usage,
		User:               orDefault(e.user, "null"),
		Metadata:           orDefault(e.metadata, "{}"),
	}
	if o.Model == "" {
		o.Model = gjson.ParseBytes(e.model).String()
	}
	if st.serviceTier.Type == gjson.String && st.serviceTier.Str != "" {
		o.ServiceTier = json.RawMessage(st.serviceTier.Raw)
	}
	if st.incomplete != "" {
		o.IncompleteDetails = &incompleteDetail{Reason: st.incomplete}
	}
	for i, it := range st.output {
		o.Output[i] = it
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&o); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
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
