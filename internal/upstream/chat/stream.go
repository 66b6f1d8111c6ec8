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

	buf  []byte      // the data of the events of the current call, one after the other
	mark int         // where the event being written starts in buf
	out  []sse.Event // the events of the current call
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
	idLit  []byte // id as a JSON string, for the events that name the item
	index  int
	opened bool // output_item.added was sent
	sealed bool // no more deltas will come
	closed bool // output_item.done was sent
	final  []byte

	parts []*streamPart // reasoning, message

	callID, name string // function_call
	args         strings.Builder
	argsSent     int
	cut          bool // the arguments went past maxArgs: nothing more of them is kept
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
	logprobs []byte
	lpSent   int
	opened   bool // content_part.added was sent
	closed   bool // no more deltas will come
	doneSent bool
}

// NewStream returns the translator for the upstream's stream of this request. id is the
// Response's id; createdAt its created_at (0: the first chunk's created).
func (r *Request) NewStream(id string, createdAt int64) *Stream {
	return &Stream{r: r, id: id, createdAt: createdAt, calls: map[int64]*streamItem{}, lastCall: -1}
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
	s.buf, s.out = make([]byte, 0, len(data)+128), nil
	data = ValidUTF8(data) // text deltas are copied as they came
	if d := bytes.TrimSpace(data); string(d) == "[DONE]" {
		if !s.finished {
			return s.fail(cutError())
		}
		s.terminal()
		return s.out, s.err
	}
	if !gjson.ValidBytes(data) {
		return s.fail(shapeError(errors.New("a chunk is not JSON")))
	}
	root := gjson.ParseBytes(data)
	if !root.IsObject() {
		return s.fail(shapeError(errors.New("a chunk is not a JSON object")))
	}
	// One pass over the chunk, each value parsed only when it is read: every event of a long
	// stream pays for this.
	var delta, logprobs, finish, usage, errObj, object, created, model, tier string
	found := false
	c := rawCursor{s: root.Raw}
	c.each(func(k string) {
		switch k {
		case "choices":
			// The choice with index 0, the only one the translation asks for. A later
			// "choices" replaces an earlier one, as a later value of any key does.
			delta, logprobs, finish, found = "", "", "", false
			c.each(func(string) {
				if found {
					return
				}
				var index string
				delta, logprobs, finish = "", "", ""
				c.each(func(k string) {
					switch k {
					case "index":
						index = c.raw()
					case "delta":
						delta = c.raw()
					case "logprobs":
						logprobs = c.raw()
					case "finish_reason":
						finish = c.raw()
					}
				})
				found = index == "0" || gjson.Parse(index).Int() == 0
			})
			if !found {
				delta, logprobs, finish = "", "", ""
			}
		case "usage":
			usage = c.raw()
		case "error":
			errObj = c.raw()
		case "object":
			object = c.raw()
		case "created":
			created = c.raw()
		case "model":
			model = c.raw()
		case "service_tier":
			tier = c.raw()
		}
	})
	if (errObj != "" && errObj != "null") || gjson.Parse(object).Str == "error" {
		e := bodyError(root, http.StatusBadGateway)
		e.Err = fmt.Errorf("%w: the upstream sent an error: %s", ErrStream, e.Message)
		return s.fail(e)
	}
	if s.createdAt == 0 {
		s.createdAt = gjson.Parse(created).Int()
	}
	if s.model == "" {
		s.model = gjson.Parse(model).String()
	}
	if t := gjson.Parse(tier); t.Type == gjson.String {
		s.tier = t
	}
	s.announce()
	if u := gjson.Parse(usage); u.IsObject() {
		s.usage = chatUsage(u) // in the last chunk, or (vLLM's continuous stats) in each
	}
	if !found {
		return s.out, nil
	}
	if err := s.delta(delta, logprobs); err != nil {
		return s.fail(err)
	}
	if f := gjson.Parse(finish); f.Type == gjson.String && f.Str != "" && !s.finished {
		if err := s.finishWith(f.Str); err != nil {
			return s.fail(err)
		}
	}
	return s.out, nil
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
	s.buf, s.out = nil, nil
	if !s.finished {
		return s.fail(cutError())
	}
	s.terminal()
	return s.out, s.err
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
	s.buf, s.out = nil, nil
	if s.done {
		return nil
	}
	s.announce()
	code, msg := "server_error", "The upstream's response ended early."
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
	s.begin("error")
	s.buf = append(s.buf, `,"error":{"type":`...)
	s.buf = appendString(s.buf, code)
	s.buf = append(s.buf, `,"code":`...)
	s.buf = appendString(s.buf, code)
	s.buf = append(s.buf, `,"message":`...)
	s.buf = appendString(s.buf, msg)
	s.buf = append(s.buf, `,"param":null}`...)
	s.end("error")
	s.responseEvent("response.failed", responseState{status: "failed", err: &responseError{code: code, message: msg}, output: s.doneItems()})
	s.done = true
	if s.err == nil {
		s.err = err
	}
	return s.out
}

func cutError() error {
	return apierror.BadGateway("The upstream's response ended early.", "upstream_error", ErrStreamCut)
}

// fail records err and returns the events so far with it.
func (s *Stream) fail(err error) ([]sse.Event, error) {
	s.err = err
	return s.out, err
}

// delta applies one choice delta (raw JSON, "" for none) with the choice's logprobs: reasoning
// first, then content, refusal and tool calls, the order in which a model produces them.
func (s *Stream) delta(d, logprobs string) error {
	if d == "" || d == "null" {
		return nil
	}
	if d[0] != '{' {
		return shapeError(errors.New("a delta is not an object"))
	}
	var reasoning, content, refusal gjson.Result
	var calls string
	text := func(v string) gjson.Result {
		if t := gjson.Parse(v); t.Type == gjson.String && t.Str != "" {
			return t
		}
		return gjson.Result{}
	}
	c := rawCursor{s: d}
	c.each(func(k string) {
		switch k {
		case "reasoning_content":
			if t := text(c.raw()); t.Exists() {
				reasoning = t
			}
		case "reasoning":
			if t := text(c.raw()); t.Exists() && !reasoning.Exists() {
				reasoning = t // the same text as reasoning_content where a server sends both
			}
		case "content":
			if t := text(c.raw()); t.Exists() {
				content = t
			}
		case "refusal":
			if t := text(c.raw()); t.Exists() {
				refusal = t
			}
		case "tool_calls":
			if v := c.raw(); v != "null" { // null: no calls, as OpenAI's SDK models dump a text delta
				calls = v
			}
		}
	})
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
			lp = gjson.Parse(logprobs).Get("content")
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
	c = rawCursor{s: calls}
	c.each(func(string) {
		if err == nil {
			err = s.toolCall(c.raw())
		}
	})
	return err
}

// hasElements reports whether raw JSON is a non-empty array.
func hasElements(raw string) bool {
	n := 0
	if raw != "" && raw[0] == '[' {
		c := rawCursor{s: raw}
		c.each(func(string) { n++ })
	}
	return n > 0
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
	it.idLit = appendString(nil, it.id)
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
		n := len(p.logprobs)
		var err error
		if p.logprobs, err = logprobElems(p.logprobs, logprobs); err != nil {
			return err
		}
		if err := s.keep(len(p.logprobs) - n); err != nil {
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
		// The delta's own JSON literal, as the upstream wrote it: nothing to decode or encode,
		// unless it escapes a surrogate, which may be a lone one that strict decoders refuse
		// (decoded, it is U+FFFD).
		lit := v.Raw
		if escapesSurrogate(lit) {
			lit = string(appendString(nil, v.Str))
		}
		var lp []byte
		if hasLP {
			lp = p.logprobs[p.lpSent:]
		}
		s.textDelta(it, k, p, lit, lp)
		p.sent = p.text.Len()
		p.lpSent = len(p.logprobs)
	}
	return nil
}

// toolCall applies one tool_calls[] delta (raw JSON).
func (s *Stream) toolCall(tc string) error {
	if tc[0] != '{' {
		return shapeError(errors.New("a tool call delta is not an object"))
	}
	var rawID, rawIndex, rawName, rawArgs string
	c := rawCursor{s: tc}
	c.each(func(k string) {
		switch k {
		case "id":
			rawID = c.raw()
		case "index":
			rawIndex = c.raw()
		case "function":
			c.each(func(k string) {
				switch k {
				case "name":
					rawName = c.raw()
				case "arguments":
					rawArgs = c.raw()
				}
			})
		}
	})
	id, index, name, args := gjson.Parse(rawID), gjson.Parse(rawIndex), gjson.Parse(rawName), gjson.Parse(rawArgs)
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
	lit := args.Raw
	if escapesSurrogate(lit) {
		lit = ""
	}
	if room := s.r.maxArgs - it.args.Len(); len(piece) > room {
		it.cut = true
		piece = cutUTF8(piece, room)
		lit = ""
	}
	if err := s.keep(len(piece)); err != nil {
		return err
	}
	it.args.WriteString(piece)
	if s.live(it) && piece != "" {
		if args.Type != gjson.String || lit == "" {
			lit = string(appendString(nil, piece))
		}
		s.argsDelta(it, lit)
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
		"upstream_error", fmt.Errorf("%w: the answer holds more than %d bytes", ErrShape, maxAnswerKept))
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

// finishWith ends the completion: every item is complete.
func (s *Stream) finishWith(reason string) error {
	s.finished = true
	s.finish = reason
	for _, it := range s.items {
		if it.kind == callItemKind && it.name == "" {
			return shapeError(errors.New("a tool call without a function name"))
		}
		if !it.sealed {
			s.seal(it)
		}
	}
	s.pump()
	return nil
}

// pump opens and closes items in order, as far as they are ready.
func (s *Stream) pump() {
	for s.head < len(s.items) {
		it := s.items[s.head]
		if !it.opened {
			if it.kind == callItemKind && it.name == "" {
				return // output_item.added names the function
			}
			s.open(it)
		}
		if !it.sealed {
			return
		}
		s.close(it)
		s.head++
	}
}

// open sends an item's output_item.added, then what it gathered while it waited.
func (s *Stream) open(it *streamItem) {
	it.opened = true
	if it.kind == callItemKind && it.callID == "" {
		it.callID = s.r.newID("call_")
	}
	s.begin("response.output_item.added")
	s.buf = append(s.buf, `,"output_index":`...)
	s.buf = appendInt(s.buf, it.index)
	s.buf = append(s.buf, `,"item":`...)
	switch it.kind {
	case reasoningItem:
		s.buf = appendReasoningItem(s.buf, it.id, "", false)
	case messageItem:
		s.buf = appendMessageItem(s.buf, it.id, "in_progress", nil)
	case callItemKind:
		s.buf = appendCallItem(s.buf, it.id, "in_progress", "", it.callID, it.name)
	}
	s.end("response.output_item.added")
	for k, p := range it.parts {
		s.partAdded(it, k, p)
		if p.sent < p.text.Len() {
			s.textDelta(it, k, p, string(appendString(nil, p.text.String()[p.sent:])), p.logprobs[p.lpSent:])
			p.sent, p.lpSent = p.text.Len(), len(p.logprobs)
		}
		if p.closed && k < len(it.parts)-1 {
			s.partDone(it, k, p)
		}
	}
	if it.kind == callItemKind && it.argsSent < it.args.Len() {
		s.argsDelta(it, string(appendString(nil, it.args.String()[it.argsSent:])))
		it.argsSent = it.args.Len()
	}
}

// close sends an item's .done events and output_item.done.
func (s *Stream) close(it *streamItem) {
	it.closed = true
	status := "completed"
	if s.finished && it.index == len(s.items)-1 {
		if st, _ := finishStatus(s.finish); st == "incomplete" {
			status = "incomplete"
		}
	}
	switch it.kind {
	case reasoningItem:
		s.partDone(it, 0, it.parts[0])
		it.final = appendReasoningItem(nil, it.id, it.parts[0].text.String(), true)
	case messageItem:
		parts := make([]outputPart, len(it.parts))
		for k, p := range it.parts {
			s.partDone(it, k, p)
			parts[k] = outputPart{refusal: p.kind == refusalPart, text: p.text.String(), logprobs: p.logprobs}
		}
		it.final = appendMessageItem(nil, it.id, status, parts)
	case callItemKind:
		args := it.args.String()
		if it.cut {
			status = "incomplete"
		}
		s.begin("response.function_call_arguments.done")
		s.itemRef(it)
		s.buf = append(s.buf, `,"name":`...)
		s.buf = appendString(s.buf, it.name)
		s.buf = append(s.buf, `,"arguments":`...)
		s.buf = appendString(s.buf, args)
		s.end("response.function_call_arguments.done")
		it.final = appendCallItem(nil, it.id, status, args, it.callID, it.name)
	}
	s.begin("response.output_item.done")
	s.buf = append(s.buf, `,"output_index":`...)
	s.buf = appendInt(s.buf, it.index)
	s.buf = append(s.buf, `,"item":`...)
	s.buf = append(s.buf, it.final...)
	s.end("response.output_item.done")
}

// terminal sends response.completed or response.incomplete.
func (s *Stream) terminal() {
	status, reason := finishStatus(s.finish)
	s.responseEvent("response."+status, responseState{status: status, completedAt: s.r.completedAt(status), incomplete: reason, output: s.doneItems(), usage: s.usage})
	s.done = true
}

func (s *Stream) doneItems() [][]byte {
	out := make([][]byte, 0, len(s.items))
	for _, it := range s.items {
		if it.closed {
			out = append(out, it.final)
		}
	}
	return out
}

// announce sends response.created and response.in_progress, once.
func (s *Stream) announce() {
	if s.announced {
		return
	}
	s.announced = true
	s.responseEvent("response.created", responseState{status: "in_progress"})
	s.responseEvent("response.in_progress", responseState{status: "in_progress"})
}

// responseEvent sends {"type":typ,"sequence_number":n,"response":{...}} with the Response in
// state st (the stream's id, created_at and model filled in).
func (s *Stream) responseEvent(typ string, st responseState) {
	st.id, st.createdAt, st.model, st.serviceTier = s.id, s.createdAt, s.model, s.tier
	size := 1024
	for _, it := range st.output {
		size += len(it)
	}
	if cap(s.buf)-len(s.buf) < size {
		s.buf = make([]byte, 0, size) // earlier events keep the old array; nothing points into the rest
	}
	s.begin(typ)
	s.buf = append(s.buf, `,"response":`...)
	s.buf = s.r.appendResponse(s.buf, st)
	s.end(typ)
}

// Event writers. Each event's data is appended to s.buf between begin and end.

func (s *Stream) begin(typ string) {
	s.mark = len(s.buf)
	s.buf = append(s.buf, `{"type":"`...)
	s.buf = append(s.buf, typ...)
	s.buf = append(s.buf, `","sequence_number":`...)
	s.buf = appendInt(s.buf, s.seq)
	s.seq++
}

// end closes the event begun last. Its Data is capped where it ends, so neither later events
// nor a caller's append can write into it.
func (s *Stream) end(typ string) {
	s.buf = append(s.buf, '}')
	n := len(s.buf)
	s.out = append(s.out, sse.Event{Name: typ, Data: s.buf[s.mark:n:n]})
}

func (s *Stream) itemRef(it *streamItem) {
	s.buf = append(s.buf, `,"item_id":`...)
	s.buf = append(s.buf, it.idLit...)
	s.buf = append(s.buf, `,"output_index":`...)
	s.buf = appendInt(s.buf, it.index)
}

func (s *Stream) partRef(it *streamItem, k int) {
	s.itemRef(it)
	s.buf = append(s.buf, `,"content_index":`...)
	s.buf = appendInt(s.buf, k)
}

func (s *Stream) emptyPart(p *streamPart) {
	switch p.kind {
	case reasoningPart:
		s.buf = append(s.buf, `{"type":"reasoning_text","text":""}`...)
	case textPart:
		s.buf = append(s.buf, `{"type":"output_text","annotations":[],"logprobs":[],"text":""}`...)
	case refusalPart:
		s.buf = append(s.buf, `{"type":"refusal","refusal":""}`...)
	}
}

func (s *Stream) partAdded(it *streamItem, k int, p *streamPart) {
	p.opened = true
	s.begin("response.content_part.added")
	s.partRef(it, k)
	s.buf = append(s.buf, `,"part":`...)
	s.emptyPart(p)
	s.end("response.content_part.added")
}

// textDelta sends a delta; lit is the JSON string literal of the new text.
func (s *Stream) textDelta(it *streamItem, k int, p *streamPart, lit string, logprobs []byte) {
	typ := "response.output_text.delta"
	switch p.kind {
	case reasoningPart:
		typ = "response.reasoning_text.delta"
	case refusalPart:
		typ = "response.refusal.delta"
	}
	s.begin(typ)
	s.partRef(it, k)
	s.buf = append(s.buf, `,"delta":`...)
	s.buf = append(s.buf, lit...)
	if p.kind == textPart {
		s.buf = append(s.buf, `,"logprobs":[`...)
		s.buf = append(s.buf, bytes.TrimPrefix(logprobs, []byte(","))...) // the elements after those sent
		s.buf = append(s.buf, ']')
	}
	s.end(typ)
}

// partDone sends a part's .done event and content_part.done, once.
func (s *Stream) partDone(it *streamItem, k int, p *streamPart) {
	if p.doneSent {
		return
	}
	p.doneSent = true
	text := p.text.String()
	typ := "response.output_text.done"
	switch p.kind {
	case reasoningPart:
		typ = "response.reasoning_text.done"
	case refusalPart:
		typ = "response.refusal.done"
	}
	s.begin(typ)
	s.partRef(it, k)
	switch p.kind {
	case refusalPart:
		s.buf = append(s.buf, `,"refusal":`...)
		s.buf = appendString(s.buf, text)
	default:
		s.buf = append(s.buf, `,"text":`...)
		s.buf = appendString(s.buf, text)
	}
	if p.kind == textPart {
		s.buf = append(s.buf, `,"logprobs":[`...)
		s.buf = append(s.buf, p.logprobs...)
		s.buf = append(s.buf, ']')
	}
	s.end(typ)
	s.begin("response.content_part.done")
	s.partRef(it, k)
	s.buf = append(s.buf, `,"part":`...)
	if p.kind == reasoningPart {
		s.buf = append(s.buf, `{"type":"reasoning_text","text":`...)
		s.buf = appendString(s.buf, text)
		s.buf = append(s.buf, '}')
	} else {
		s.buf = appendPart(s.buf, outputPart{refusal: p.kind == refusalPart, text: text, logprobs: p.logprobs})
	}
	s.end("response.content_part.done")
}

func (s *Stream) argsDelta(it *streamItem, lit string) {
	s.begin("response.function_call_arguments.delta")
	s.itemRef(it)
	s.buf = append(s.buf, `,"delta":`...)
	s.buf = append(s.buf, lit...)
	s.end("response.function_call_arguments.delta")
}
