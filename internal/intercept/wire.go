package intercept

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// This file holds the wire objects the proxy mints, as Go structs whose fields are in the order
// OpenAI sends them (docs/wire-openai.md), written with encoding/json. Upstream bytes that travel
// inside them (an item, a Response, an error object) are spliced in as they came, never
// re-encoded: encoding/json would re-escape them.

// Event is one client-visible stream event, produced by the translator and consumed by both
// renderers (render_sse.go writes it, render_json.go keeps only the final Response). An event is
// either one the upstream sent, passed on with its output_index shifted, or one the proxy minted.
// Neither carries its sequence_number: the SSE renderer numbers events as it writes them, so
// numbering happens in one place.
type Event struct {
	// Type is the JSON "type" (also the SSE "event:" line).
	Type string
	// Response is set on the terminal events (response.completed, response.incomplete,
	// response.failed): the final Response object, as the JSON rendering returns it.
	Response []byte

	passed []byte      // an upstream event's JSON object; nil for a minted event
	minted mintedEvent // an event the proxy created; nil for a passed one
}

// mintedEvent is an event the proxy creates.
type mintedEvent interface {
	// appendJSON appends the event's JSON object, numbered seq, to dst.
	appendJSON(dst []byte, seq int) []byte
}

// appendJSON appends the event's JSON object with sequence_number seq to dst.
func (ev Event) appendJSON(dst []byte, seq int) []byte {
	if ev.minted != nil {
		return ev.minted.appendJSON(dst, seq)
	}
	return appendNumbered(dst, ev.passed, seq)
}

// terminal reports whether ev ends the client stream.
func (ev Event) terminal() bool {
	_, ok := terminalOutcome(ev.Type)
	return ok
}

// appendNumbered appends an upstream event's data to dst with its sequence_number set to n.
func appendNumbered(dst, data []byte, n int) []byte {
	r := gjson.GetBytes(data, "sequence_number")
	if !r.Exists() || r.Index <= 0 {
		out, err := sjson.SetBytes(data, "sequence_number", n)
		if err != nil {
			return append(dst, data...)
		}
		return append(dst, out...)
	}
	dst = append(dst, data[:r.Index]...)
	dst = strconv.AppendInt(dst, int64(n), 10)
	return append(dst, data[r.Index+len(r.Raw):]...)
}

// Event types the proxy mints.
const (
	evItemAdded        = "response.output_item.added"
	evItemDone         = "response.output_item.done"
	evCallInProgress   = "response.code_interpreter_call.in_progress"
	evCallCodeDelta    = "response.code_interpreter_call_code.delta"
	evCallCodeDone     = "response.code_interpreter_call_code.done"
	evCallInterpreting = "response.code_interpreter_call.interpreting"
	evCallCompleted    = "response.code_interpreter_call.completed"
	evCreated          = "response.created"
	evInProgress       = "response.in_progress"
	evError            = "error"
)

// head is the start every event shares.
type head struct {
	Type           string `json:"type"`
	SequenceNumber int    `json:"sequence_number"`
}

// itemEvent is response.output_item.added or .done; the item is spliced in.
type itemEvent struct {
	head
	OutputIndex int `json:"output_index"`
	item        []byte
}

func (e itemEvent) appendJSON(dst []byte, seq int) []byte {
	e.SequenceNumber = seq
	return appendWithRaw(dst, e, "item", e.item)
}

func newItemEvent(typ string, index int, item []byte) Event {
	return Event{Type: typ, minted: itemEvent{head: head{Type: typ}, OutputIndex: index, item: item}}
}

// callEvent is one of the code_interpreter_call events that name the item only: .in_progress,
// .interpreting, .completed.
type callEvent struct {
	head
	OutputIndex int    `json:"output_index"`
	ItemID      string `json:"item_id"`
}

func (e callEvent) appendJSON(dst []byte, seq int) []byte {
	e.SequenceNumber = seq
	return appendMarshalled(dst, e)
}

func newCallEvent(typ string, index int, itemID string) Event {
	return Event{Type: typ, minted: callEvent{head{Type: typ}, index, itemID}}
}

// codeDeltaEvent is response.code_interpreter_call_code.delta.
type codeDeltaEvent struct {
	callEvent
	Delta string `json:"delta"`
}

func (e codeDeltaEvent) appendJSON(dst []byte, seq int) []byte {
	e.SequenceNumber = seq
	return appendMarshalled(dst, e)
}

// codeDoneEvent is response.code_interpreter_call_code.done.
type codeDoneEvent struct {
	callEvent
	Code string `json:"code"`
}

func (e codeDoneEvent) appendJSON(dst []byte, seq int) []byte {
	e.SequenceNumber = seq
	return appendMarshalled(dst, e)
}

// responseEvent is one of the events that carry the whole Response (response.created,
// response.in_progress and the terminal ones); the Response is spliced in.
type responseEvent struct {
	head
	response []byte
}

func (e responseEvent) appendJSON(dst []byte, seq int) []byte {
	e.SequenceNumber = seq
	return appendWithRaw(dst, e, "response", e.response)
}

func newResponseEvent(typ string, resp []byte) Event {
	ev := Event{Type: typ, minted: responseEvent{head{Type: typ}, resp}}
	if ev.terminal() {
		ev.Response = resp
	}
	return ev
}

// errorEvent is the nested error event OpenAI sends mid-stream,
// {"type":"error","sequence_number":n,"error":{"type","code","message","param"}}; the detail is
// spliced in (it may be the upstream's own error object).
type errorEvent struct {
	head
	detail []byte
}

func (e errorEvent) appendJSON(dst []byte, seq int) []byte {
	e.SequenceNumber = seq
	return appendWithRaw(dst, e, "error", e.detail)
}

func newErrorEvent(detail []byte) Event {
	return Event{Type: evError, minted: errorEvent{head{Type: evError}, detail}}
}

// errorDetail is the inner object of the error event, the proxy's own or built from an
// upstream's flat error event. Code and Param are null when absent.
type errorDetail struct {
	Type    string          `json:"type"`
	Code    json.RawMessage `json:"code"`
	Message string          `json:"message"`
	Param   json.RawMessage `json:"param"`
}

// responseError is a failed Response's "error": {"code","message"}.
type responseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// codeInterpreterCall is the code_interpreter_call output item. Outputs nil is written null (the
// client did not include code_interpreter_call.outputs); empty, [].
type codeInterpreterCall struct {
	ID          string       `json:"id"`
	Type        string       `json:"type"`
	Status      string       `json:"status"`
	Code        string       `json:"code"`
	ContainerID string       `json:"container_id"`
	Outputs     []callOutput `json:"outputs"`
}

// callOutput is one entry of a code_interpreter_call's outputs: {"type":"logs","logs"} or
// {"type":"image","url"}.
type callOutput struct {
	Type string `json:"type"`
	Logs string `json:"logs,omitempty"`
	URL  string `json:"url,omitempty"`
}

// ciItem renders a code_interpreter_call item. ex nil is a call in progress (outputs []);
// otherwise outputs are null unless the client included code_interpreter_call.outputs.
func ciItem(id, status, code, containerID string, ex *execution, withOutputs bool) []byte {
	it := codeInterpreterCall{ID: id, Type: "code_interpreter_call", Status: status, Code: code, ContainerID: containerID}
	switch {
	case ex == nil:
		it.Outputs = []callOutput{}
	case withOutputs:
		it.Outputs = make([]callOutput, 0, 1+len(ex.images))
		if ex.logs != "" {
			it.Outputs = append(it.Outputs, callOutput{Type: "logs", Logs: ex.logs})
		}
		for _, u := range ex.images {
			it.Outputs = append(it.Outputs, callOutput{Type: "image", URL: u})
		}
	}
	return marshal(it)
}

// deletedResponse answers DELETE /v1/responses/{id}.
type deletedResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Deleted bool   `json:"deleted"`
}

// emptyResponse is the Response skeleton used when the upstream sent none the proxy can patch.
type emptyResponse struct {
	ID                string   `json:"id"`
	Object            string   `json:"object"`
	CreatedAt         int64    `json:"created_at"`
	Status            string   `json:"status"`
	Error             *string  `json:"error"`
	IncompleteDetails *string  `json:"incomplete_details"`
	Output            []string `json:"output"`
	Usage             *string  `json:"usage"`
}

// marshal is json.Marshal for the proxy's own types, which always marshal.
func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("intercept: marshalling a wire type: " + err.Error())
	}
	return b
}

func appendMarshalled(dst []byte, v any) []byte { return append(dst, marshal(v)...) }

// appendWithRaw appends v's JSON object with one more key, whose value is raw JSON kept as it is.
func appendWithRaw(dst []byte, v any, key string, raw []byte) []byte {
	b := marshal(v)
	dst = append(dst, b[:len(b)-1]...) // without the closing brace
	dst = append(dst, `,"`...)
	dst = append(dst, key...)
	dst = append(dst, `":`...)
	dst = append(dst, raw...)
	return append(dst, '}')
}

// jsonString returns s as a JSON string literal.
func jsonString(s string) []byte { return marshal(s) }

// nullable returns s as a JSON string, or null when it is empty.
func nullable(s string) json.RawMessage {
	if s == "" {
		return json.RawMessage("null")
	}
	return jsonString(s)
}

// rawOrNull returns an upstream value as raw JSON, or null when it is absent or not valid JSON.
func rawOrNull(r gjson.Result) json.RawMessage {
	if !r.Exists() || !json.Valid([]byte(r.Raw)) {
		return json.RawMessage("null")
	}
	return json.RawMessage(r.Raw)
}

// newID returns prefix followed by 48 random hex digits, the shape of OpenAI's ids.
func newID(prefix string) string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// compactJSON returns b without insignificant whitespace when it holds a line break (an SSE data
// line cannot); otherwise b itself.
func compactJSON(b []byte) []byte {
	if bytes.IndexByte(b, '\n') < 0 {
		return b
	}
	var c bytes.Buffer
	if json.Compact(&c, b) != nil {
		return b
	}
	return c.Bytes()
}
