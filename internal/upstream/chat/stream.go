package chat

// Responses ⇄ Chat Completions, the answer side for streams: chat.completion.chunk events in,
// the Responses event sequence out, as OpenAI's Responses API streams it.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/sse"
)

var (
	// ErrStream marks a Chat Completions stream that failed: the upstream sent an error
	// object in it, or the stream ended before the completion finished (ErrStreamCut).
	ErrStream = errors.New("the Chat Completions stream failed")
	// ErrStreamCut is a stream that ended (EOF, or [DONE]) before any chunk carried a
	// finish_reason.
	ErrStreamCut = fmt.Errorf("%w: it ended before the completion finished", ErrStream)
)

// Stream translates the stream of one chat completion into the events a Responses upstream
// streams for the same answer: response.created and response.in_progress first, then each output
// item in turn (output_item.added, its content parts and deltas, its .done events,
// output_item.done), and response.completed or response.incomplete with the whole Response,
// usage included. A reasoning item holds reasoning_content (or reasoning) as one reasoning_text
// part; a message item holds content as output_text and refusal as a refusal part; each tool call
// index becomes its own function_call item, with the upstream's call id.
//
// Items follow each other as in a Responses stream: one is open at a time. Chat servers stream
// parallel tool calls one after the other (vLLM, llama.cpp, OpenAI) or interleaved; the item of
// a later call, or text after a call, waits (its deltas kept) until the open item is complete,
// which is known when a later item starts and the open call's arguments are a whole JSON object,
// or at finish_reason. Interleaved calls therefore stream the first call live and the others at
// the end, in one delta each.
//
// What the stream keeps is bounded, whatever the upstream sends: one call's arguments at
// Options.MaxCodeSize plus ArgsSlack, past which the call is cut (no more of its arguments
// are kept or sent; its item is done with status "incomplete" and the arguments so far, which
// a caller enforcing max_code_size sees are over it), and the whole answer's text, refusal,
// reasoning, arguments and logprobs at maxAnswerKept, past which the answer fails (502
// upstream_error, wrapping ErrShape).
//
// Events carry sequence_number from 0. Delta events carry no obfuscation padding (there is
// nothing to hide: the client does not see these bytes' sizes anyway through the proxy).
//
// One Stream serves one upstream call; it does no I/O and is not safe for concurrent use.
type Stream struct {
	r         *Request
	id        string
	createdAt int64

	seq       int
	announced bool
	finished  bool // a finish_reason arrived; every item is closed
	done      bool // the terminal event was returned
	err       error
	finish    string
	model     string
	tier      gjson.Result
	usage     *responseUsage

	items     []*streamItem
	head      int                   // the first item not yet closed: the open one
	reasoning *streamItem           // the item reasoning deltas extend, nil when none or sealed
	message   *streamItem           // the item content and refusal deltas extend
	calls     map[int64]*streamItem // tool call index → item
	lastCall  int64
	kept      int // bytes of text, arguments and logprobs kept over the answer

	enc    *encoder    // its buf holds the data of the events of the current call, one after the other
	encErr error       // the first event that could not be encoded
	out    []sse.Event // the events of the current call

	// A delta event's text and logprobs as the encoder reads them (a field, so that passing its
	// address does not allocate).
	deltaText string
	lps       []json.RawMessage
}

type itemKind uint8

const (
	reasoningItem itemKind = iota
	messageItem
	callItemKind
)

type streamItem struct {
	kind   itemKind
	id     string
	index  int
	opened bool // output_item.added was sent
	sealed bool // no more deltas will come
	closed bool // output_item.done was sent
	final  any  // the item as output_item.done and the Response carry it

	parts []*streamPart // reasoning, message

	callID, name string // function_call
	args         strings.Builder
	argsSent     int
	cut          bool // the arguments went past maxArgs: nothing more of them is kept
	frame        deltaFrame
}

type partKind uint8

const (
	reasoningPart partKind = iota
	textPart
	refusalPart
)

type streamPart struct {
	kind     partKind
	text     strings.Builder
	sent     int // bytes of text already in delta events
	logprobs []json.RawMessage
	lpSent   int  // elements of logprobs already in delta events
	opened   bool // content_part.added was sent
	closed   bool // no more deltas will come
	doneSent bool
	frame    deltaFrame
}

// NewStream returns the translator for the upstream's stream of this request. id is the
// Response's id; createdAt its created_at (0: the first chunk's created).
func (r *Request) NewStream(id string, createdAt int64) *Stream {
	return &Stream{r: r, id: id, createdAt: createdAt, calls: map[int64]*streamItem{}, lastCall: -1, enc: newEncoder()}
}

// Next translates the data of one server-sent event of the upstream's stream ("[DONE]"
// included) into zero or more Responses events. The events' Data are fresh JSON objects the
// caller owns.
//
// An error chunk from the upstream is returned as a *apierror.Error wrapping ErrStream (with
// the upstream's status, type, code and message); a chunk that is not a chat.completion.chunk,
// or a delta after finish_reason, as a 502 *apierror.Error wrapping ErrShape; [DONE] before
// any finish_reason as one wrapping ErrStreamCut. Events produced before the error are
// returned with it; after an error, Next and End return it again. Fail renders it as a
// Responses upstream would.
func (s *Stream) Next(data []byte) ([]sse.Event, error) {
	if s.err != nil {
		return nil, s.err
	}
	if s.done {
		return nil, nil
	}
	// Most chunks give one event, of about their own size, or none; a fresh buffer each call,
	// as the caller owns the events' data.
	s.enc.buf, s.out = make([]byte, 0, len(data)+128), nil
	data = ValidUTF8(data) // text deltas are copied as they came
	if d := bytes.TrimSpace(data); string(d) == "[DONE]" {
		if !s.finished {
			return s.fail(cutError())
		}
		s.terminal()
		return s.events()
	}
	if !gjson.ValidBytes(data) {
		return s.fail(shapeError(errors.New("a chunk is not JSON")))
	}
	root := gjson.ParseBytes(data)
	if !root.IsObject() {
		return s.fail(shapeError(errors.New("a chunk is not a JSON object")))
	}
	// Every event of a long stream pays for reading its chunk: one pass over each object, a
	// switch on the key (readFields compares each key with every field).
	var choices, usage, errObj, object, created, model, tier gjson.Result
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "choices":
			setFirst(&choices, v)
		case "usage":
			setFirst(&usage, v)
		case "error":
			setFirst(&errObj, v)
		case "object":
			setFirst(&object, v)
		case "created":
			setFirst(&created, v)
		case "model":
			setFirst(&model, v)
		case "service_tier":
			setFirst(&tier, v)
		}
		return true
	})
	// The choice with index 0, the only one the translation asks for.
	var delta, logprobs, finish gjson.Result
	found := false
	choices.ForEach(func(_, c gjson.Result) bool {
		var index gjson.Result
		c.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "index":
				setFirst(&index, v)
			case "delta":
				setFirst(&delta, v)
			case "logprobs":
				setFirst(&logprobs, v)
			case "finish_reason":
				setFirst(&finish, v)
			}
			return true
		})
		if found = index.Int() == 0; found {
			return false
		}
		delta, logprobs, finish = gjson.Result{}, gjson.Result{}, gjson.Result{}
		return true
	})
	if present(errObj) || object.Str == "error" {
		e := bodyError(root, http.StatusBadGateway)
		e.Err = fmt.Errorf("%w: the upstream sent an error: %s", ErrStream, e.Message)
		return s.fail(e)
	}
	if s.createdAt == 0 {
		s.createdAt = created.Int()
	}
	if s.model == "" {
		s.model = model.String()
	}
	if tier.Type == gjson.String {
		s.tier = tier
	}
	s.announce()
	if usage.IsObject() {
		s.usage = chatUsage(usage) // in the last chunk, or (vLLM's continuous stats) in each
	}
	if !found {
		return s.events()
	}
	if err := s.delta(delta, logprobs); err != nil {
		return s.fail(err)
	}
	if finish.Type == gjson.String && finish.Str != "" && !s.finished {
		if err := s.finishWith(finish.Str); err != nil {
			return s.fail(err)
		}
	}
	return s.events()
}

// events returns the events of the current call, or the error of one that could not be encoded
// (the values it carries were all checked on the way in, so none should be).
func (s *Stream) events() ([]sse.Event, error) {
	if s.encErr != nil {
		return s.fail(shapeError(s.encErr))
	}
	return s.out, s.err
}

// End is called when the upstream's body ends. A stream that finished but sent no [DONE]
// (some servers omit it) gets its terminal event now; one that never finished is
// ErrStreamCut. After the terminal event End returns nothing.
func (s *Stream) End() ([]sse.Event, error) {
	if s.err != nil {
		return nil, s.err
	}
	if s.done {
		return nil, nil
	}
	s.enc.buf, s.out = nil, nil
	if !s.finished {
		return s.fail(cutError())
	}
	s.terminal()
	return s.events()
}

// Done reports whether the terminal event was returned.
func (s *Stream) Done() bool { return s.done }

// Fail returns the events a Responses upstream ends a failed stream with: response.created and
// response.in_progress if they were not sent yet, the nested error event
// {"type":"error","error":{"type","code","message","param"}}, and response.failed with the items
// completed so far. err is what Next or End returned, or the caller's own (a read error); the
// code and message of an *apierror.Error in it are shown, anything else is a server_error.
// After Fail the stream is done.
func (s *Stream) Fail(err error) []sse.Event {
	s.enc.buf, s.out = nil, nil
	if s.done {
		return nil
	}
	s.announce()
	code, msg := apierror.CodeServer, "The upstream's response ended early."
	var ae *apierror.Error
	if errors.As(err, &ae) {
		msg = ae.Message
		switch {
		case ae.Code != "":
			code = ae.Code
		case ae.Status < 500 && ae.Type != "":
			code = ae.Type
		}
	}
	s.emit("error", &errorEvent{head: s.next("error"), Error: streamError{Type: code, Code: code, Message: msg}})
	s.responseEvent("response.failed", responseState{status: "failed", err: &responseError{Code: code, Message: msg}, output: s.doneItems()})
	s.done = true
	if s.err == nil {
		s.err = err
	}
	return s.out
}

func cutError() error {
	return apierror.BadGateway("The upstream's response ended early.", apierror.CodeUpstreamError, ErrStreamCut)
}

// fail records err and returns the events so far with it.
func (s *Stream) fail(err error) ([]sse.Event, error) {
	s.err = err
	return s.out, err
}

// delta applies one choice delta with the choice's logprobs: reasoning first, then content,
// refusal and tool calls, the order in which a model produces them.
func (s *Stream) delta(d, logprobs gjson.Result) error {
	if !present(d) {
		return nil
	}
	if !d.IsObject() {
		return shapeError(errors.New("a delta is not an object"))
	}
	var reasoningContent, reasoning, content, refusal, calls gjson.Result
	d.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "content":
			setFirst(&content, v)
		case "tool_calls":
			setFirst(&calls, v)
		case "reasoning_content":
			setFirst(&reasoningContent, v)
		case "reasoning":
			setFirst(&reasoning, v)
		case "refusal":
			setFirst(&refusal, v)
		}
		return true
	})
	reasoning, content, refusal = text(reasoning), text(content), text(refusal)
	if t := text(reasoningContent); t.Exists() {
		reasoning = t // the same text as reasoning where a server sends both
	}
	if s.finished && (reasoning.Exists() || content.Exists() || refusal.Exists() || hasElements(calls)) {
		return shapeError(errors.New("a delta after finish_reason"))
	}
	if reasoning.Exists() {
		if s.reasoning == nil || s.reasoning.sealed {
			s.reasoning = s.newItem(reasoningItem)
		}
		if err := s.addText(s.reasoning, reasoningPart, reasoning, gjson.Result{}); err != nil {
			return err
		}
	}
	if content.Exists() {
		if s.message == nil || s.message.sealed {
			s.message = s.newItem(messageItem)
		}
		lp := gjson.Result{}
		if s.r.logprobs {
			lp = logprobs.Get("content")
		}
		if err := s.addText(s.message, textPart, content, lp); err != nil {
			return err
		}
	}
	if refusal.Exists() {
		if s.message == nil || s.message.sealed {
			s.message = s.newItem(messageItem)
		}
		if err := s.addText(s.message, refusalPart, refusal, gjson.Result{}); err != nil {
			return err
		}
	}
	var err error
	if present(calls) { // null: no calls, as OpenAI's SDK models dump a text delta
		calls.ForEach(func(_, tc gjson.Result) bool {
			err = s.toolCall(tc)
			return err == nil
		})
	}
	return err
}

// setFirst stores v in dst unless dst holds a value already: of duplicate keys the first counts,
// as o.Get(key) reads it.
func setFirst(dst *gjson.Result, v gjson.Result) {
	if !dst.Exists() {
		*dst = v
	}
}

// text is v when it is a non-empty string, else nothing.
func text(v gjson.Result) gjson.Result {
	if v.Type == gjson.String && v.Str != "" {
		return v
	}
	return gjson.Result{}
}

// hasElements reports whether v is a non-empty array.
func hasElements(v gjson.Result) bool {
	n := false
	if v.IsArray() {
		v.ForEach(func(_, _ gjson.Result) bool { n = true; return false })
	}
	return n
}

// newItem starts an item after the others. What came before is complete if it is text (a model
// does not go back to it) or a call whose arguments already form a JSON object.
func (s *Stream) newItem(kind itemKind) *streamItem {
	for _, it := range s.items[s.head:] {
		if it.sealed {
			continue
		}
		if it.kind != callItemKind || it.cut || wholeObject(it.args.String()) {
			s.seal(it)
		}
	}
	prefix := "msg_"
	switch kind {
	case reasoningItem:
		prefix = "rs_"
	case callItemKind:
		prefix = "fc_"
	}
	it := &streamItem{kind: kind, id: s.r.newID(prefix), index: len(s.items)}
	s.items = append(s.items, it)
	s.pump()
	return it
}

// wholeObject reports whether args is a complete JSON object: anything more but spaces would
// make it invalid, so no more arguments can follow.
func wholeObject(args string) bool {
	a := strings.TrimSpace(args)
	return len(a) > 1 && a[0] == '{' && json.Valid([]byte(a))
}

func (s *Stream) seal(it *streamItem) {
	it.sealed = true
	for _, p := range it.parts {
		p.closed = true
	}
	if s.reasoning == it {
		s.reasoning = nil
	}
	if s.message == it {
		s.message = nil
	}
}

// live reports whether an item's deltas go out as they come.
func (s *Stream) live(it *streamItem) bool {
	return it.opened && !it.closed && s.items[s.head] == it
}

// addText appends a text delta (v, a JSON string) to the item's current part of that kind.
func (s *Stream) addText(it *streamItem, kind partKind, v, logprobs gjson.Result) error {
	var p *streamPart
	if n := len(it.parts); n > 0 && it.parts[n-1].kind == kind {
		p = it.parts[n-1]
	} else {
		if n > 0 {
			prev := it.parts[n-1]
			prev.closed = true
			if s.live(it) {
				s.partDone(it, n-1, prev)
			}
		}
		p = &streamPart{kind: kind}
		it.parts = append(it.parts, p)
	}
	if err := s.keep(len(v.Str)); err != nil {
		return err
	}
	p.text.WriteString(v.Str)
	hasLP := logprobs.IsArray()
	if hasLP {
		var n int
		var err error
		if p.logprobs, n, err = logprobElems(p.logprobs, logprobs); err != nil {
			return err
		}
		if err := s.keep(n); err != nil {
			return err
		}
	}
	if !s.live(it) {
		return nil
	}
	k := len(it.parts) - 1
	if !p.opened {
		s.partAdded(it, k, p)
	}
	if p.sent < p.text.Len() {
		var lp []json.RawMessage
		if hasLP {
			lp = p.logprobs[p.lpSent:]
		}
		delta, raw := p.text.String()[p.sent:], ""
		if len(delta) == len(v.Str) {
			raw = v.Raw // the delta is this chunk's string
		}
		s.textDelta(it, k, p, delta, raw, lp)
		p.sent = p.text.Len()
		p.lpSent = len(p.logprobs)
	}
	return nil
}

// toolCall applies one tool_calls[] delta.
func (s *Stream) toolCall(tc gjson.Result) error {
	if !tc.IsObject() {
		return shapeError(errors.New("a tool call delta is not an object"))
	}
	var id, index, fn, name, args gjson.Result
	tc.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "index":
			setFirst(&index, v)
		case "function":
			setFirst(&fn, v)
		case "id":
			setFirst(&id, v)
		}
		return true
	})
	fn.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "arguments":
			setFirst(&args, v)
		case "name":
			setFirst(&name, v)
		}
		return true
	})
	idx := int64(0)
	switch {
	case index.Type == gjson.Number:
		idx = index.Int()
	case s.lastCall >= 0 && (id.Str == "" || id.Str == s.calls[s.lastCall].callID):
		idx = s.lastCall // no index: the call so far, unless a new id starts another
	case s.lastCall >= 0:
		idx = s.lastCall + 1
	}
	it := s.calls[idx]
	if it == nil {
		if s.finished {
			return shapeError(errors.New("a tool call after finish_reason"))
		}
		it = s.newItem(callItemKind)
		s.calls[idx] = it
	}
	s.lastCall = max(s.lastCall, idx)
	if it.callID == "" && id.Type == gjson.String && id.Str != "" {
		it.callID = id.Str
	}
	if it.name == "" && name.Type == gjson.String && name.Str != "" {
		it.name = name.Str
		s.pump()
	}
	piece := ""
	switch {
	case args.Type == gjson.String:
		piece = args.Str
	case args.IsObject():
		// A server that sends the arguments as an object, whole.
		b, err := appendCompact(nil, args.Raw)
		if err != nil {
			return err
		}
		piece = string(b)
	}
	if piece == "" || it.cut {
		return nil
	}
	if it.sealed {
		if strings.TrimSpace(piece) == "" {
			return nil
		}
		return shapeError(fmt.Errorf("arguments for tool call %d after its arguments were complete", idx))
	}
	if room := s.r.maxArgs - it.args.Len(); len(piece) > room {
		it.cut = true
		piece = cutUTF8(piece, room)
	}
	if err := s.keep(len(piece)); err != nil {
		return err
	}
	it.args.WriteString(piece)
	if s.live(it) && piece != "" {
		raw := ""
		if args.Type == gjson.String && piece == args.Str {
			raw = args.Raw
		}
		s.argsDelta(it, piece, raw)
		it.argsSent = it.args.Len()
	}
	return nil
}

// keep counts n more bytes kept for the answer: an error past maxAnswerKept.
func (s *Stream) keep(n int) error {
	s.kept += n
	if s.kept <= maxAnswerKept {
		return nil
	}
	// The answer fails: what the open items gathered will never be sent (Fail sends the items
	// completed so far), so it is let go now rather than held until the caller is done.
	for _, it := range s.items {
		if !it.closed {
			it.parts, it.args = nil, strings.Builder{}
		}
	}
	return answerTooLarge()
}

// answerTooLarge is the error of an answer that would keep more than maxAnswerKept bytes.
func answerTooLarge() error {
	return apierror.BadGateway(fmt.Sprintf("The upstream's response is larger than %d bytes, more than this proxy relays.", maxAnswerKept),
		apierror.CodeUpstreamError, fmt.Errorf("%w: the answer holds more than %d bytes", ErrShape, maxAnswerKept))
}

// cutUTF8 returns the longest prefix of s of at most n bytes that does not split a character.
func cutUTF8(s string, n int) string {
	if n >= len(s) {
		return s
	}
	n = max(n, 0)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
