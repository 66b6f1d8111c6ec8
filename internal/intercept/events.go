package intercept

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strconv"
)

// Event is one client-visible stream event, produced by the translator and consumed by both
// renderers (render_sse.go writes it, render_json.go keeps only the final Response).
//
// Data is the complete JSON object. It holds a "sequence_number" key that the SSE renderer
// overwrites; the translator never numbers events itself, so numbering happens in one place.
type Event struct {
	// Type is the JSON "type" (also the SSE "event:" line).
	Type string
	// Data is the event's JSON object.
	Data []byte
	// Response is set on the terminal events (response.completed, response.incomplete,
	// response.failed): the final Response object, as the JSON rendering returns it.
	Response []byte
}

// terminal reports whether ev ends the client stream.
func (ev Event) terminal() bool {
	switch ev.Type {
	case "response.completed", "response.incomplete", "response.failed":
		return true
	}
	return false
}

// newID returns prefix followed by 48 random hex digits, the shape of OpenAI's ids.
func newID(prefix string) string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// jsonString returns s as a JSON string literal.
func jsonString(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}

// appendJSONString appends s as a JSON string literal.
func appendJSONString(dst []byte, s string) []byte {
	return append(dst, jsonString(s)...)
}

// itemEvent builds {"type":T,"sequence_number":0,"output_index":I,"item":ITEM}.
func itemEvent(typ string, index int, item []byte) Event {
	b := make([]byte, 0, len(item)+96)
	b = append(b, `{"type":"`...)
	b = append(b, typ...)
	b = append(b, `","sequence_number":0,"output_index":`...)
	b = strconv.AppendInt(b, int64(index), 10)
	b = append(b, `,"item":`...)
	b = append(b, item...)
	b = append(b, '}')
	return Event{Type: typ, Data: b}
}

// ciEvent builds the code_interpreter_call events that carry only item_id and output_index, plus
// an optional extra field (key and raw JSON value).
func ciEvent(typ string, index int, itemID string, key string, value []byte) Event {
	b := make([]byte, 0, 128+len(value))
	b = append(b, `{"type":"`...)
	b = append(b, typ...)
	b = append(b, `","sequence_number":0,"output_index":`...)
	b = strconv.AppendInt(b, int64(index), 10)
	b = append(b, `,"item_id":`...)
	b = appendJSONString(b, itemID)
	if key != "" {
		b = append(b, `,"`...)
		b = append(b, key...)
		b = append(b, `":`...)
		b = append(b, value...)
	}
	b = append(b, '}')
	return Event{Type: typ, Data: b}
}

// responseEvent builds {"type":T,"sequence_number":0,"response":RESP}.
func responseEvent(typ string, resp []byte) Event {
	b := make([]byte, 0, len(resp)+64)
	b = append(b, `{"type":"`...)
	b = append(b, typ...)
	b = append(b, `","sequence_number":0,"response":`...)
	b = append(b, resp...)
	b = append(b, '}')
	ev := Event{Type: typ, Data: b}
	if ev.terminal() {
		ev.Response = resp
	}
	return ev
}

// errorEvent builds the nested error event that OpenAI sends mid-stream:
// {"type":"error","sequence_number":n,"error":{"type","code","message","param"}}.
func errorEvent(detail []byte) Event {
	b := make([]byte, 0, len(detail)+64)
	b = append(b, `{"type":"error","sequence_number":0,"error":`...)
	b = append(b, detail...)
	b = append(b, '}')
	return Event{Type: "error", Data: b}
}
