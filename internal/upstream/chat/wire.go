package chat

// The JSON this package writes, as structs in the key order of OpenAI's own traffic, encoded by
// one encoder: encoding/json with HTML left alone, as OpenAI's servers and the intercept
// renderer write it. Values taken from the request or the upstream as they came are
// json.RawMessage.

import (
	"encoding/json"
)

// encoder appends JSON to buf. One serves one request translation or one stream; it is not safe
// for concurrent use.
type encoder struct {
	buf []byte
	enc *json.Encoder
}

func newEncoder() *encoder {
	e := &encoder{}
	e.enc = json.NewEncoder(e)
	e.enc.SetEscapeHTML(false)
	return e
}

// Write is the json.Encoder's output: it appends to buf.
func (e *encoder) Write(p []byte) (int, error) {
	e.buf = append(e.buf, p...)
	return len(p), nil
}

// encode appends v's JSON to buf, without the newline json.Encoder ends a value with. On error
// nothing is appended.
func (e *encoder) encode(v any) error {
	if err := e.enc.Encode(v); err != nil {
		return err
	}
	e.buf = e.buf[:len(e.buf)-1]
	return nil
}

// appendJSON appends v's JSON to dst, leaving buf as it was.
func (e *encoder) appendJSON(dst []byte, v any) ([]byte, error) {
	buf := e.buf
	e.buf = dst
	err := e.encode(v)
	dst, e.buf = e.buf, buf
	return dst, err
}

// rawOr is a value taken from the request as it came, or def (OpenAI's default) when it was
// absent or null. The defaults are Go values: encoding/json validates a json.RawMessage again
// each time it encodes one.
func rawOr(v json.RawMessage, def any) any {
	if v == nil {
		return def
	}
	return v
}

// The defaults of a Response's fields that are objects.
type (
	defaultReasoning struct {
		Effort  *string `json:"effort"`
		Summary *string `json:"summary"`
	}
	defaultText struct {
		Format struct {
			Type string `json:"type"`
		} `json:"format"`
		Verbosity string `json:"verbosity"`
	}
)

// response is the Response object. A field of type any holds the request's value (json.RawMessage)
// or OpenAI's default as a Go value (rawOr). The groups of fields that every Response of one
// request repeats are structs of their own (encoding/json writes an embedded struct's fields in
// place), so that a stream encodes them once (responseFrame).
type response struct {
	responseHead
	echoBeforeModel
	Model  string `json:"model"`
	Output []any  `json:"output"`
	echoBeforeTier
	ServiceTier any `json:"service_tier"` // json.RawMessage from the request, or the upstream's string
	echoBeforeUsage
	Usage *responseUsage `json:"usage"`
	echoAfterUsage
}

type responseHead struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	CreatedAt         int64              `json:"created_at"`
	Status            string             `json:"status"`
	CompletedAt       *int64             `json:"completed_at"`
	Background        bool               `json:"background"`
	Error             *responseError     `json:"error"`
	IncompleteDetails *incompleteDetails `json:"incomplete_details"`
}

type echoBeforeModel struct {
	Instructions    any `json:"instructions"`
	MaxOutputTokens any `json:"max_output_tokens"`
	MaxToolCalls    any `json:"max_tool_calls"`
}

type echoBeforeTier struct {
	ParallelToolCalls  any     `json:"parallel_tool_calls"`
	PreviousResponseID *string `json:"previous_response_id"`
	PromptCacheKey     any     `json:"prompt_cache_key"`
	Reasoning          any     `json:"reasoning"`
	SafetyIdentifier   any     `json:"safety_identifier"`
}

type echoBeforeUsage struct {
	Store       any `json:"store"`
	Temperature any `json:"temperature"`
	Text        any `json:"text"`
	ToolChoice  any `json:"tool_choice"`
	Tools       any `json:"tools"`
	TopLogprobs any `json:"top_logprobs"`
	TopP        any `json:"top_p"`
	Truncation  any `json:"truncation"`
}

type echoAfterUsage struct {
	User     any `json:"user"`
	Metadata any `json:"metadata"`
}

// responseFrame is the JSON of a request's echo groups, each as its keys follow a value in the
// Response (a comma, the group's object without its braces). A stream's three snapshots of the
// Response cost most of a short stream's translation when encoded whole each time; framed, each
// encodes only its head, model, output, service tier and usage. TestResponseFrame holds it to
// encoding the response struct.
type responseFrame struct {
	beforeModel, beforeTier, beforeUsage, afterUsage []byte
}

func newResponseFrame(enc *encoder, tmpl *response) (*responseFrame, error) {
	var f responseFrame
	for _, g := range []struct {
		dst *[]byte
		v   any
	}{{&f.beforeModel, &tmpl.echoBeforeModel}, {&f.beforeTier, &tmpl.echoBeforeTier}, {&f.beforeUsage, &tmpl.echoBeforeUsage}, {&f.afterUsage, &tmpl.echoAfterUsage}} {
		b, err := enc.appendJSON([]byte{','}, g.v)
		if err != nil {
			return nil, err
		}
		*g.dst = append(b[:1], b[2:len(b)-1]...) // the comma, then the object without its braces
	}
	return &f, nil
}

// appendResponse appends resp's JSON, its echo groups taken from f. On error nothing is appended.
func (e *encoder) appendResponse(f *responseFrame, resp *response) error {
	mark := len(e.buf)
	err := e.encode(&resp.responseHead)
	if err == nil {
		e.buf = append(e.buf[:len(e.buf)-1], f.beforeModel...) // the head without its closing brace
		e.buf = append(e.buf, `,"model":`...)
		err = e.encode(resp.Model)
	}
	if err == nil {
		e.buf = append(e.buf, `,"output":`...)
		err = e.appendOutput(resp.Output)
	}
	if err == nil {
		e.buf = append(append(e.buf, f.beforeTier...), `,"service_tier":`...)
		err = e.encode(resp.ServiceTier)
	}
	if err == nil {
		e.buf = append(append(e.buf, f.beforeUsage...), `,"usage":`...)
		err = e.encode(resp.Usage)
	}
	if err != nil {
		e.buf = e.buf[:mark]
		return err
	}
	e.buf = append(append(e.buf, f.afterUsage...), '}')
	return nil
}

// size is the length of f's groups together.
func (f *responseFrame) size() int {
	return len(f.beforeModel) + len(f.beforeTier) + len(f.beforeUsage) + len(f.afterUsage)
}

// appendOutput appends a Response's output array: each item encoded, or copied when it is an
// encodedItem.
func (e *encoder) appendOutput(items []any) error {
	e.buf = append(e.buf, '[')
	for i, it := range items {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		if b, ok := it.(encodedItem); ok {
			e.buf = append(e.buf, b...)
			continue
		}
		if err := e.encode(it); err != nil {
			return err
		}
	}
	e.buf = append(e.buf, ']')
	return nil
}

// encodedItem is an output item as this package's encoder wrote it, for a stream whose Responses
// carry again the items its output_item.done events carried. The encoder copies it; MarshalJSON
// is for encoding/json elsewhere (tests), which writes the same bytes.
type encodedItem []byte

func (b encodedItem) MarshalJSON() ([]byte, error) { return b, nil }

type responseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

// responseUsage is token usage in the Responses API's terms.
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

// Output items, shared by both renderings.

type messageOut struct {
	ID      string `json:"id"`
	Type    string `json:"type"` // message
	Status  string `json:"status"`
	Content []any  `json:"content"` // *textOut, *refusalOut
	Role    string `json:"role"`
}

func newMessageOut(id, status string, parts []any) *messageOut {
	if parts == nil {
		parts = []any{}
	}
	return &messageOut{ID: id, Type: "message", Status: status, Content: parts, Role: "assistant"}
}

// textOut is an output_text part; Logprobs are the logprob objects as the upstream sent them.
type textOut struct {
	Type        string            `json:"type"` // output_text
	Annotations []struct{}        `json:"annotations"`
	Logprobs    []json.RawMessage `json:"logprobs"`
	Text        string            `json:"text"`
}

func newTextOut(text string, logprobs []json.RawMessage) *textOut {
	if logprobs == nil {
		logprobs = []json.RawMessage{}
	}
	return &textOut{Type: "output_text", Annotations: []struct{}{}, Logprobs: logprobs, Text: text}
}

type refusalOut struct {
	Type    string `json:"type"` // refusal
	Refusal string `json:"refusal"`
}

type reasoningTextOut struct {
	Type string `json:"type"` // reasoning_text
	Text string `json:"text"`
}

// reasoningOut holds the reasoning text as one reasoning_text part, or no content yet (for
// output_item.added).
type reasoningOut struct {
	ID      string             `json:"id"`
	Type    string             `json:"type"` // reasoning
	Summary []struct{}         `json:"summary"`
	Content []reasoningTextOut `json:"content"`
}

func newReasoningOut(id, text string, done bool) *reasoningOut {
	it := &reasoningOut{ID: id, Type: "reasoning", Summary: []struct{}{}, Content: []reasoningTextOut{}}
	if done {
		it.Content = append(it.Content, reasoningTextOut{Type: "reasoning_text", Text: text})
	}
	return it
}

type callOut struct {
	ID        string `json:"id"`
	Type      string `json:"type"` // function_call
	Status    string `json:"status"`
	Arguments string `json:"arguments"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
}

func newCallOut(id, status, args, callID, name string) *callOut {
	return &callOut{ID: id, Type: "function_call", Status: status, Arguments: args, CallID: callID, Name: name}
}
