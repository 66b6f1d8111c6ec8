package chat

// The Responses streaming events a Stream writes, in the key order of OpenAI's own streams.

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	"github.com/ciproxy/ciproxy/internal/sse"
)

// head begins every event.
type head struct {
	Type           string `json:"type"`
	SequenceNumber int    `json:"sequence_number"`
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

// partEvent is content_part.added and content_part.done.
type partEvent struct {
	head
	ItemID       string `json:"item_id"`
	OutputIndex  int    `json:"output_index"`
	ContentIndex int    `json:"content_index"`
	Part         any    `json:"part"`
}

// The delta events (output_text.delta, reasoning_text.delta, refusal.delta and
// function_call_arguments.delta) are most of a stream's events. Encoding each one's struct cost
// several times what the rest of its translation does, so what every delta of a part or call
// repeats is encoded once (deltaFrame) and each delta adds its sequence number (strconv) and
// its text (the stream's encoder) between. TestDeltaEvents holds them to the bytes
// encoding/json writes for the event structs in OpenAI's key order.

// partRef is the keys after sequence_number of a content part's delta events.
type partRef struct {
	ItemID       string `json:"item_id"`
	OutputIndex  int    `json:"output_index"`
	ContentIndex int    `json:"content_index"`
}

// callRef is the keys after sequence_number of a call's function_call_arguments.delta.
type callRef struct {
	ItemID      string `json:"item_id"`
	OutputIndex int    `json:"output_index"`
}

// deltaFrame is the JSON around a delta event's sequence number and delta:
// {"type":…,"sequence_number": (head), ,"item_id":…,"output_index":…[,"content_index":…],"delta": (ref).
type deltaFrame struct {
	typ       string
	head, ref []byte
}

// frame returns f, encoding it first if it is new. ref gives the *partRef or *callRef its
// keys after sequence_number encode (a func, so that a frame already encoded costs nothing).
func (s *Stream) frame(f *deltaFrame, typ string, ref func() any) (*deltaFrame, error) {
	if f.head != nil {
		return f, nil
	}
	t, err := s.enc.appendJSON(nil, typ)
	if err != nil {
		return nil, err
	}
	r, err := s.enc.appendJSON(nil, ref())
	if err != nil {
		return nil, err
	}
	f.typ = typ
	f.head = append(append([]byte(`{"type":`), t...), `,"sequence_number":`...)
	f.ref = append(append([]byte{','}, r[1:len(r)-1]...), `,"delta":`...) // r without its braces
	return f, nil
}

// deltaEvent sends the delta event of frame f with this delta, and for output_text.delta the
// logprobs that came with it (nil: the event has none). raw is the upstream's own JSON string for
// delta, or "" when delta is not one string of the upstream's (a part's text gathered while its
// item waited, arguments cut short, arguments sent as an object).
func (s *Stream) deltaEvent(f *deltaFrame, err error, delta, raw string, logprobs *[]json.RawMessage) {
	mark := len(s.enc.buf)
	if err == nil {
		b := append(s.enc.buf, f.head...)
		b = strconv.AppendInt(b, int64(s.seq), 10)
		s.seq++
		b = append(b, f.ref...)
		if verbatim(raw) {
			s.enc.buf = append(b, raw...)
		} else {
			s.enc.buf = b
			s.deltaText = delta
			err = s.enc.encode(&s.deltaText)
		}
	}
	switch {
	case err != nil || logprobs == nil:
	case len(*logprobs) == 0:
		s.enc.buf = append(s.enc.buf, `,"logprobs":[]`...) // most text deltas: no logprobs asked for
	default:
		s.enc.buf = append(s.enc.buf, `,"logprobs":`...)
		err = s.enc.encode(logprobs)
	}
	s.closeEvent(f.typ, mark, err)
}

// verbatim reports whether raw, a JSON string from a chunk that was valid JSON and valid UTF-8,
// is byte for byte what the encoder writes for its text, so that it can be copied rather than
// decoded and encoded again: with no escape in it, its text is its bytes between the quotes (a
// valid JSON string holds no control character or bare quote), and the encoder then escapes only
// U+2028 and U+2029 (HTML is left alone). Most deltas are such strings. TestDeltaEvents and
// FuzzVerbatim hold it to encoding/json.
func verbatim(raw string) bool {
	return len(raw) >= 2 && raw[0] == '"' && !strings.Contains(raw, `\`) &&
		!strings.Contains(raw, "\u2028") && !strings.Contains(raw, "\u2029")
}

// closeEvent ends the event written from mark on in the encoder's buffer with its closing
// brace and sends it; after err it takes the event back and records the error instead.
func (s *Stream) closeEvent(typ string, mark int, err error) {
	if err != nil {
		s.enc.buf = s.enc.buf[:mark]
		if s.encErr == nil {
			s.encErr = err
		}
		return
	}
	s.enc.buf = append(s.enc.buf, '}')
	n := len(s.enc.buf)
	s.out = append(s.out, sse.Event{Name: typ, Data: s.enc.buf[mark:n:n]})
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
// filled in). It returns the Response's JSON within the event (nil if it could not be encoded),
// for an event that carries the same Response.
func (s *Stream) responseEvent(typ string, st responseState) []byte {
	st.id, st.createdAt, st.model, st.serviceTier = s.id, s.createdAt, s.model, s.tier
	// Room for the whole event at once: a Response is mostly its request's echo groups.
	s.enc.buf = slices.Grow(s.enc.buf, s.r.frame.size()+512)
	mark, err := s.openEvent(typ, `,"response":`)
	at := len(s.enc.buf)
	if err == nil {
		err = s.enc.appendResponse(s.r.frame, s.r.response(st))
	}
	return s.closeValue(typ, mark, at, err)
}

// openEvent begins the event typ in the encoder's buffer: its head, then key (a comma and the
// event's last key, quoted, with its colon), for the caller to append that key's value. It
// returns where the event begins, for closeEvent.
func (s *Stream) openEvent(typ, key string) (mark int, err error) {
	mark = len(s.enc.buf)
	if err = s.enc.encode(s.next(typ)); err == nil {
		s.enc.buf = append(s.enc.buf[:len(s.enc.buf)-1], key...) // the head without its closing brace
	}
	return mark, err
}

// closeValue closes an event opened at mark whose last value begins at at, and returns that
// value's JSON (nil after err).
func (s *Stream) closeValue(typ string, mark, at int, err error) []byte {
	s.closeEvent(typ, mark, err)
	if err != nil {
		return nil
	}
	end := len(s.enc.buf) - 1 // before the event's closing brace
	return s.enc.buf[at:end:end]
}

// itemEvent sends output_item.added or output_item.done for the item at index. It returns the
// item's JSON within the event (nil if it could not be encoded), which the Responses after it
// carry in their output as it is (encodedItem).
func (s *Stream) itemEvent(typ string, index int, item any) encodedItem {
	mark, err := s.openEvent(typ, `,"output_index":`)
	s.enc.buf = append(strconv.AppendInt(s.enc.buf, int64(index), 10), `,"item":`...)
	at := len(s.enc.buf)
	if err == nil {
		err = s.enc.encode(item)
	}
	return s.closeValue(typ, mark, at, err)
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

// textDelta sends a delta (raw as deltaEvent takes it) with the logprobs that came with it.
func (s *Stream) textDelta(it *streamItem, k int, p *streamPart, delta, raw string, logprobs []json.RawMessage) {
	ref := func() any { return &partRef{ItemID: it.id, OutputIndex: it.index, ContentIndex: k} }
	switch p.kind {
	case textPart:
		f, err := s.frame(&p.frame, "response.output_text.delta", ref)
		s.lps = nonNil(logprobs)
		s.deltaEvent(f, err, delta, raw, &s.lps)
		s.lps = nil
	case reasoningPart:
		f, err := s.frame(&p.frame, "response.reasoning_text.delta", ref)
		s.deltaEvent(f, err, delta, raw, nil)
	default:
		f, err := s.frame(&p.frame, "response.refusal.delta", ref)
		s.deltaEvent(f, err, delta, raw, nil)
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

// argsDelta sends a piece of arguments (raw as deltaEvent takes it).
func (s *Stream) argsDelta(it *streamItem, delta, raw string) {
	f, err := s.frame(&it.frame, "response.function_call_arguments.delta", func() any { return &callRef{ItemID: it.id, OutputIndex: it.index} })
	s.deltaEvent(f, err, delta, raw, nil)
}

// nonNil is lps, written [] when there are none.
func nonNil(lps []json.RawMessage) []json.RawMessage {
	if lps == nil {
		return []json.RawMessage{}
	}
	return lps
}
