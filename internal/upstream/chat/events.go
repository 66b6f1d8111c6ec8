package chat

// The Responses streaming events a Stream writes, in the key order of OpenAI's own streams.

import (
	"encoding/json"

	"github.com/ciproxy/ciproxy/internal/sse"
)

// head begins every event.
type head struct {
	Type           string `json:"type"`
	SequenceNumber int    `json:"sequence_number"`
}

type responseEvent struct {
	head
	Response *response `json:"response"`
}

// errorEvent is the error event of a failed stream, with its error nested as OpenAI sends it.
type errorEvent struct {
	head
	Error streamError `json:"error"`
}

type streamError struct {
	Type    string  `json:"type"`
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"` // always null
}

// itemEvent is output_item.added and output_item.done.
type itemEvent struct {
	head
	OutputIndex int `json:"output_index"`
	Item        any `json:"item"`
}

// partEvent is content_part.added and content_part.done.
type partEvent struct {
	head
	ItemID       string `json:"item_id"`
	OutputIndex  int    `json:"output_index"`
	ContentIndex int    `json:"content_index"`
	Part         any    `json:"part"`
}

// outputTextDeltaEvent is output_text.delta. Delta is the text as decoded: encoded again, it is
// escaped as every other string of the stream, whatever escapes the upstream chose.
type outputTextDeltaEvent struct {
	head
	ItemID       string            `json:"item_id"`
	OutputIndex  int               `json:"output_index"`
	ContentIndex int               `json:"content_index"`
	Delta        string            `json:"delta"`
	Logprobs     []json.RawMessage `json:"logprobs"`
}

// textDeltaEvent is reasoning_text.delta and refusal.delta.
type textDeltaEvent struct {
	head
	ItemID       string `json:"item_id"`
	OutputIndex  int    `json:"output_index"`
	ContentIndex int    `json:"content_index"`
	Delta        string `json:"delta"`
}

// textDoneEvent is output_text.done, reasoning_text.done (Text) and refusal.done (Refusal).
type textDoneEvent struct {
	head
	ItemID       string  `json:"item_id"`
	OutputIndex  int     `json:"output_index"`
	ContentIndex int     `json:"content_index"`
	Text         *string `json:"text,omitempty"`
	Refusal      *string `json:"refusal,omitempty"`
	Logprobs     any     `json:"logprobs,omitempty"`
}

type argsDeltaEvent struct {
	head
	ItemID      string `json:"item_id"`
	OutputIndex int    `json:"output_index"`
	Delta       string `json:"delta"`
}

type argsDoneEvent struct {
	head
	ItemID      string `json:"item_id"`
	OutputIndex int    `json:"output_index"`
	Name        string `json:"name"`
	Arguments   string `json:"arguments"`
}

// next numbers the next event.
func (s *Stream) next(typ string) head {
	h := head{Type: typ, SequenceNumber: s.seq}
	s.seq++
	return h
}

// emit encodes ev, a pointer to an event struct beginning with its head, after the events of
// the current call. Its Data is capped where it ends, so neither later events nor a caller's
// append can write into it.
func (s *Stream) emit(typ string, ev any) {
	mark := len(s.enc.buf)
	if err := s.enc.encode(ev); err != nil {
		if s.encErr == nil {
			s.encErr = err
		}
		return
	}
	n := len(s.enc.buf)
	s.out = append(s.out, sse.Event{Name: typ, Data: s.enc.buf[mark:n:n]})
}

// responseEvent sends typ with the Response in state st (the stream's id, created_at and model
// filled in).
func (s *Stream) responseEvent(typ string, st responseState) {
	st.id, st.createdAt, st.model, st.serviceTier = s.id, s.createdAt, s.model, s.tier
	s.emit(typ, &responseEvent{head: s.next(typ), Response: s.r.response(st)})
}

// empty is the part as content_part.added announces it.
func (p *streamPart) empty() any {
	switch p.kind {
	case reasoningPart:
		return reasoningTextOut{Type: "reasoning_text"}
	case refusalPart:
		return &refusalOut{Type: "refusal"}
	}
	return newTextOut("", nil)
}

// done is the part as content_part.done and the item carry it.
func (p *streamPart) done() any {
	text := p.text.String()
	switch p.kind {
	case reasoningPart:
		return reasoningTextOut{Type: "reasoning_text", Text: text}
	case refusalPart:
		return &refusalOut{Type: "refusal", Refusal: text}
	}
	return newTextOut(text, p.logprobs)
}

func (s *Stream) partAdded(it *streamItem, k int, p *streamPart) {
	p.opened = true
	s.emit("response.content_part.added", &partEvent{head: s.next("response.content_part.added"), ItemID: it.id, OutputIndex: it.index, ContentIndex: k, Part: p.empty()})
}

// textDelta sends a delta with the logprobs that came with it. The event
// structs are the stream's own, reused: a delta is the event of a long stream.
func (s *Stream) textDelta(it *streamItem, k int, p *streamPart, delta string, logprobs []json.RawMessage) {
	switch p.kind {
	case textPart:
		s.textEv = outputTextDeltaEvent{head: s.next("response.output_text.delta"), ItemID: it.id, OutputIndex: it.index, ContentIndex: k,
			Delta: delta, Logprobs: nonNil(logprobs)}
		s.emit(s.textEv.Type, &s.textEv)
	default:
		typ := "response.reasoning_text.delta"
		if p.kind == refusalPart {
			typ = "response.refusal.delta"
		}
		s.otherEv = textDeltaEvent{head: s.next(typ), ItemID: it.id, OutputIndex: it.index, ContentIndex: k, Delta: delta}
		s.emit(typ, &s.otherEv)
	}
}

// partDone sends a part's .done event and content_part.done, once.
func (s *Stream) partDone(it *streamItem, k int, p *streamPart) {
	if p.doneSent {
		return
	}
	p.doneSent = true
	text := p.text.String()
	ev := &textDoneEvent{ItemID: it.id, OutputIndex: it.index, ContentIndex: k}
	switch p.kind {
	case reasoningPart:
		ev.head, ev.Text = s.next("response.reasoning_text.done"), &text
	case refusalPart:
		ev.head, ev.Refusal = s.next("response.refusal.done"), &text
	default:
		ev.head, ev.Text, ev.Logprobs = s.next("response.output_text.done"), &text, nonNil(p.logprobs)
	}
	s.emit(ev.Type, ev)
	s.emit("response.content_part.done", &partEvent{head: s.next("response.content_part.done"), ItemID: it.id, OutputIndex: it.index, ContentIndex: k, Part: p.done()})
}

// argsDelta sends a piece of arguments.
func (s *Stream) argsDelta(it *streamItem, delta string) {
	s.argsEv = argsDeltaEvent{head: s.next("response.function_call_arguments.delta"), ItemID: it.id, OutputIndex: it.index, Delta: delta}
	s.emit(s.argsEv.Type, &s.argsEv)
}

// nonNil is lps, written [] when there are none.
func nonNil(lps []json.RawMessage) []json.RawMessage {
	if lps == nil {
		return []json.RawMessage{}
	}
	return lps
}
