package upstreamtest

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// Turn is one scripted answer of the upstream model: the output items it produces, or an error.
type Turn struct {
	// Items are the output items, in order.
	Items []Item
	// Usage is reported as given; nil: estimated from the request and the items.
	Usage *Usage
	// Incomplete, when set, ends the response with status "incomplete" and this reason
	// ("max_output_tokens", "content_filter"); the stream's terminal event is response.incomplete.
	// A chat completion ends with finish_reason "content_filter" for that reason, "length" for
	// any other.
	Incomplete string

	// Error, when set, is the whole answer: an HTTP status and body instead of a response.
	Error *HTTPError
	// Fail, when set, makes the response fail after Fail.After items: a stream sends the error
	// event and response.failed; a JSON answer is a Response with status "failed". A chat
	// completion fails as the flavour's server does: a JSON answer is a 500 error, a stream sends
	// the first Fail.After items, then an error chunk.
	Fail *Failure
	// Cut drops the connection: for a stream after CutAfter events (0: right after the headers),
	// for a JSON answer after CutAfter bytes of the body.
	Cut      bool
	CutAfter int

	// ArgsChunk is the size in bytes of each function_call_arguments.delta (0: the server's
	// default, 3). Deltas split the JSON text anywhere, escapes and UTF-8 sequences included.
	ArgsChunk int
	// TextChunk is the size in bytes of each output_text.delta and reasoning summary delta
	// (0: the server's default, 4); text deltas never split a UTF-8 sequence.
	TextChunk int

	// ChatInterleave makes a chat stream send the deltas of parallel tool calls round by round,
	// one chunk holding the next delta of every call, as some servers do, instead of one call
	// after the other.
	ChatInterleave bool

	// Hold, when set, delays the answer (JSON or stream) until it is closed or the request's
	// context ends.
	Hold <-chan struct{}
	// BeforeEvent, when set, is called before each stream event is written, on the handler's
	// goroutine, with the event's sequence number and type. It may block to pace the stream; ctx
	// ends when the client goes away. An error drops the connection before that event.
	BeforeEvent func(ctx context.Context, seq int, typ string) error
	// Delay is waited before each stream event.
	Delay time.Duration

	// Model is the model named in the response; "": the request's.
	Model string
	// ID is the response id; "": a fresh resp_<hex>.
	ID string
}

// Item is one output item of a Turn. Build it with Text, FunctionCall or Reasoning.
type Item struct {
	Type string // "message", "function_call" or "reasoning"
	// ID is the item id; "": a fresh msg_, fc_ or rs_ id.
	ID string
	// Status is the item's final status; "": "completed".
	Status string

	Text string // message: the output_text

	Name      string // function_call
	Arguments string // function_call: the JSON text of the arguments, sent as is
	CallID    string // function_call; "": a fresh call_ id

	Summary string // reasoning: one summary_text part; "": summary []

	// Raw, when set, is the whole item as JSON, sent as is in output_item.added and .done and in
	// the response's output (no delta events): for item types the server does not model.
	Raw json.RawMessage
}

// RawItem is an item sent exactly as the JSON object raw (for example a web_search_call).
func RawItem(raw string) Item {
	return Item{Type: itemType(json.RawMessage(raw)), ID: itemField(json.RawMessage(raw), "id"), Raw: json.RawMessage(raw)}
}

// Text is an assistant message with one output_text part.
func Text(s string) Item { return Item{Type: "message", Text: s} }

// FunctionCall is a call of the function name with args, the JSON text of its arguments. args is
// not checked: a test can send what a model should not.
func FunctionCall(name, args string) Item {
	return Item{Type: "function_call", Name: name, Arguments: args}
}

// Reasoning is a reasoning item with one summary part (none when summary is ""). It carries
// encrypted_content when the request includes "reasoning.encrypted_content".
func Reasoning(summary string) Item { return Item{Type: "reasoning", Summary: summary} }

// Usage is the token usage of a Turn.
type Usage struct {
	InputTokens     int
	CachedTokens    int
	OutputTokens    int
	ReasoningTokens int
}

// HTTPError is an answer with a status other than 200.
type HTTPError struct {
	Status int
	Body   string // sent as is, with Content-Type application/json
	Header http.Header
}

// APIError is an HTTPError with OpenAI's error body {"error":{"message","type","param","code"}}.
// The type follows the status as OpenAI's does: invalid_request_error for 4xx, server_error for
// 5xx; code and param are null when empty.
func APIError(status int, code, message, param string) *HTTPError {
	typ := "invalid_request_error"
	switch {
	case status == http.StatusTooManyRequests && code == "insufficient_quota":
		typ = "insufficient_quota"
	case status == http.StatusTooManyRequests:
		typ = "requests"
	case status >= 500:
		typ = "server_error"
	}
	return &HTTPError{Status: status, Body: errorBody(message, typ, param, code)}
}

func errorBody(message, typ, param, code string) string {
	b, _ := json.Marshal(map[string]any{"error": obj{
		{"message", message}, {"type", typ}, {"param", nullable(param)}, {"code", nullable(code)},
	}})
	return string(b)
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Failure makes a response fail part way.
type Failure struct {
	// After is the number of output items produced in full before the failure.
	After int
	// Code and Message go into the error event and the response's error; "": server_error and
	// OpenAI's generic message.
	Code    string
	Message string
	// NoErrorEvent sends response.failed alone, as OpenAI does for some failures (rate limits).
	NoErrorEvent bool
}
