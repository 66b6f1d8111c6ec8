// Package streamcheck validates a Responses API event stream as a client receives it, against
// what OpenAI sends: it is the conformance oracle for the proxy's streams in tests.
//
// API:
//
//	type Event struct{ Name string; Data []byte }          // one SSE event: event: line, data: lines
//	func Parse(raw []byte) ([]Event, error)                 // SSE framing; rejects data: [DONE]
//	func Check(raw []byte) (Report, error)                  // Parse, then Validate
//	func Must(tb testing.TB, raw []byte) Report             // Check, failing tb on an error
//	func Validate(events []Event) (Report, error)
//	type Report struct{ Events []Event; ResponseID, Terminal string; Response json.RawMessage; Items []json.RawMessage }
//
// Validate checks, and returns the first violation as "event N (type): what, want what":
//   - every event has an event: line equal to its data's "type", and sequence_number counts from 0
//     without gaps;
//   - response.created comes first and response.in_progress second, each exactly once, with the
//     same response id as the terminal event;
//   - exactly one terminal event (response.completed, response.failed or response.incomplete) comes
//     last, and its response's status matches it; response.failed carries a response error and
//     follows an error event in the nested form {"type":"error","error":{"message",...}}; an error
//     event appears nowhere else;
//   - output_item.added events number output_index contiguously from 0; every event about an item
//     comes after its output_item.added and before its output_item.done, and names its item_id;
//   - a code_interpreter_call item follows OpenAI's sequence exactly: output_item.added (status
//     in_progress, code "", outputs [], id ci_..., container_id cntr_...) →
//     code_interpreter_call.in_progress → code_interpreter_call_code.delta* →
//     code_interpreter_call_code.done (code = the deltas joined) → code_interpreter_call.interpreting
//     → code_interpreter_call.completed → output_item.done (same code and container_id, outputs
//     null or logs/image entries);
//   - text and refusal deltas join to their .done text, which content_part.done and the item's
//     content repeat; output_text.annotation.added events come before the part's .done, number
//     annotation_index from 0, and content_part.done and the item's content carry exactly those
//     annotations; function_call_arguments deltas join to .done's arguments and the item's;
//     reasoning summary deltas join to their .done text;
//   - a completed response has every item done; the terminal response's output equals the items of
//     the output_item.done events, in output_index order (compared as JSON values).
package streamcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Event is one server-sent event.
type Event struct {
	Name string // the event: line; "" when absent
	Data []byte // the data: lines, joined with "\n"
}

// Report describes a valid stream.
type Report struct {
	Events     []Event
	ResponseID string
	Terminal   string          // the last event's type
	Response   json.RawMessage // the terminal event's response
	Items      []json.RawMessage
}

// Check parses raw SSE bytes and validates the events.
func Check(raw []byte) (Report, error) {
	events, err := Parse(raw)
	if err != nil {
		return Report{Events: events}, err
	}
	return Validate(events)
}

// Must is Check for tests: it fails tb, showing the stream, when raw is not valid.
func Must(tb testing.TB, raw []byte) Report {
	tb.Helper()
	rep, err := Check(raw)
	if err != nil {
		tb.Fatalf("streamcheck: %v\nstream:\n%s", err, raw)
	}
	return rep
}

// Parse splits raw SSE bytes into events. Comment lines are skipped; LF and CRLF line ends are
// accepted. It fails on "data: [DONE]" (OpenAI's Responses streams have none), on an event block
// without data, and on bytes after the last blank line.
func Parse(raw []byte) ([]Event, error) {
	var events []Event
	var cur Event
	var data [][]byte
	inBlock := false
	line := 0
	for len(raw) > 0 {
		i := bytes.IndexByte(raw, '\n')
		if i < 0 {
			return events, fmt.Errorf("line %d: stream ends inside an event (no newline)", line+1)
		}
		l := bytes.TrimSuffix(raw[:i], []byte("\r"))
		raw = raw[i+1:]
		line++
		if len(l) == 0 {
			if inBlock {
				if data == nil {
					return events, fmt.Errorf("line %d: event %d (%s) has no data: line", line, len(events), cur.Name)
				}
				cur.Data = bytes.Join(data, []byte("\n"))
				if string(cur.Data) == "[DONE]" {
					return events, fmt.Errorf("line %d: data: [DONE] after event %d; Responses streams end without it", line, len(events)-1)
				}
				events = append(events, cur)
			}
			cur, data, inBlock = Event{}, nil, false
			continue
		}
		if l[0] == ':' {
			continue
		}
		inBlock = true
		field, value, _ := bytes.Cut(l, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			cur.Name = string(value)
		case "data":
			data = append(data, slices.Clone(value))
		}
	}
	if inBlock {
		return events, fmt.Errorf("line %d: stream ends inside an event (no blank line after it)", line)
	}
	return events, nil
}

// payload holds the fields of any event that the checks read.
type payload struct {
	Type           string          `json:"type"`
	SequenceNumber *int            `json:"sequence_number"`
	OutputIndex    *int            `json:"output_index"`
	ContentIndex   *int            `json:"content_index"`
	SummaryIndex   *int            `json:"summary_index"`
	ItemID         *string         `json:"item_id"`
	Delta          *string         `json:"-"` // a string delta
	RawDelta       json.RawMessage `json:"delta"`
	Text           *string         `json:"text"`
	Refusal        *string         `json:"refusal"`
	Code           *string         `json:"code"`
	Message        json.RawMessage `json:"message"`
	Arguments      *string         `json:"arguments"`
	Item           json.RawMessage `json:"item"`
	Part           json.RawMessage `json:"part"`
	AnnotationIdx  *int            `json:"annotation_index"`
	Annotation     json.RawMessage `json:"annotation"`
	Response       json.RawMessage `json:"response"`
	Error          json.RawMessage `json:"error"`
}

type response struct {
	ID     string            `json:"id"`
	Status string            `json:"status"`
	Error  json.RawMessage   `json:"error"`
	Output []json.RawMessage `json:"output"`
}

type outItem struct {
	ID          string            `json:"id"`
	Type        string            `json:"type"`
	Status      string            `json:"status"`
	Code        *string           `json:"code"`
	ContainerID *string           `json:"container_id"`
	Outputs     json.RawMessage   `json:"outputs"`
	Arguments   *string           `json:"arguments"`
	Content     []json.RawMessage `json:"content"`
	Summary     []json.RawMessage `json:"summary"`
}

type part struct {
	Type        string            `json:"type"`
	Text        *string           `json:"text"`
	Refusal     *string           `json:"refusal"`
	Annotations []json.RawMessage `json:"annotations"`
}

// code_interpreter_call stages, in order.
const (
	ciAdded = iota
	ciInProgress
	ciCode
	ciCodeDone
	ciInterpreting
	ciCompleted
)

var ciStageNames = []string{"output_item.added", "code_interpreter_call.in_progress", "code_interpreter_call_code.delta",
	"code_interpreter_call_code.done", "code_interpreter_call.interpreting", "code_interpreter_call.completed"}

type partState struct {
	typ      string
	deltas   strings.Builder
	doneText *string
	done     bool
	anns     []json.RawMessage // announced by output_text.annotation.added
}

type itemState struct {
	idx   int
	id    string
	typ   string
	added outItem
	done  bool
	raw   json.RawMessage // from output_item.done

	stage    int
	code     strings.Builder
	codeDone *string

	args     strings.Builder
	argsDone *string

	parts   []*partState
	summary map[int]*partState
}

type checker struct {
	events   []Event
	i        int
	p        payload
	items    []*itemState
	respID   string
	terminal string
	resp     json.RawMessage
}

func (c *checker) errf(format string, args ...any) error {
	return fmt.Errorf("event %d (%s): %s", c.i, c.p.Type, fmt.Sprintf(format, args...))
}

func isTerminal(t string) bool {
	return t == "response.completed" || t == "response.failed" || t == "response.incomplete"
}

// Validate checks a stream's events; see the package comment for the rules.
func Validate(events []Event) (Report, error) {
	c := &checker{events: events}
	rep := Report{Events: events}
	if len(events) == 0 {
		return rep, errors.New("no events")
	}
	for c.i = range events {
		if err := c.event(); err != nil {
			return rep, err
		}
	}
	if !isTerminal(c.p.Type) {
		return rep, fmt.Errorf("stream ends with event %d (%s); want a terminal event (response.completed, response.failed or response.incomplete)", c.i, c.p.Type)
	}
	rep.ResponseID, rep.Terminal, rep.Response = c.respID, c.terminal, c.resp
	for _, it := range c.items {
		if it.done {
			rep.Items = append(rep.Items, it.raw)
		}
	}
	return rep, nil
}

func (c *checker) event() error {
	ev := c.events[c.i]
	c.p = payload{}
	err := json.Unmarshal(ev.Data, &c.p)
	if err == nil && len(c.p.RawDelta) > 0 && c.p.RawDelta[0] == '"' {
		// The shell tool's output deltas are objects; every other delta is a string.
		c.p.Delta = new(string)
		err = json.Unmarshal(c.p.RawDelta, c.p.Delta)
	}
	if err != nil {
		return fmt.Errorf("event %d (%s): data is not a JSON object: %v", c.i, ev.Name, err)
	}
	p := &c.p
	if p.Type == "" {
		return c.errf("data has no type")
	}
	if ev.Name != p.Type {
		return c.errf("event: line %q, want %q (the data's type)", ev.Name, p.Type)
	}
	if p.SequenceNumber == nil {
		return c.errf("no sequence_number, want %d", c.i)
	}
	if *p.SequenceNumber != c.i {
		return c.errf("sequence_number %d, want %d", *p.SequenceNumber, c.i)
	}
	last := c.i == len(c.events)-1

	switch {
	case c.i == 0 && p.Type != "response.created":
		return c.errf("first event, want response.created")
	case c.i == 1 && p.Type != "response.in_progress":
		return c.errf("second event, want response.in_progress")
	case c.i > 0 && p.Type == "response.created":
		return c.errf("response.created again (first at event 0)")
	case c.i != 1 && p.Type == "response.in_progress":
		return c.errf("response.in_progress at event %d, want it once, at event 1", c.i)
	case isTerminal(p.Type) && !last:
		return c.errf("terminal event before the end (%d events follow)", len(c.events)-1-c.i)
	}

	switch p.Type {
	case "response.created", "response.in_progress":
		var r response
		if err := json.Unmarshal(p.Response, &r); err != nil || r.ID == "" {
			return c.errf("no response with an id")
		}
		if c.i == 0 {
			c.respID = r.ID
		} else if r.ID != c.respID {
			return c.errf("response id %q, want %q (from response.created)", r.ID, c.respID)
		}
		return nil
	case "response.completed", "response.failed", "response.incomplete":
		return c.terminalEvent()
	case "error":
		return c.errorEvent()
	case "response.output_item.added":
		return c.added()
	}

	// Every other event that names an output_index is about an open item.
	if p.OutputIndex == nil {
		return nil
	}
	it, err := c.open()
	if err != nil {
		return err
	}
	if p.Type == "response.output_item.done" {
		return c.itemDone(it)
	}
	if strings.HasPrefix(p.Type, "response.shell_call_command.") {
		// As OpenAI sends them, these name the call by output_index only.
		if it.typ != "shell_call" || p.ItemID != nil {
			return c.errf("in a %s item, or with an item_id: want a shell_call named by output_index only", it.typ)
		}
		return nil
	}
	if p.ItemID == nil || *p.ItemID != it.id {
		return c.errf("item_id %s, want %q (output_index %d)", quoteOrNone(p.ItemID), it.id, it.idx)
	}
	switch it.typ {
	case "code_interpreter_call":
		return c.codeInterpreter(it)
	case "function_call":
		return c.functionCall(it)
	case "message":
		return c.message(it)
	case "reasoning":
		return c.reasoning(it)
	}
	return nil
}

func quoteOrNone(s *string) string {
	if s == nil {
		return "missing"
	}
	return fmt.Sprintf("%q", *s)
}

func (c *checker) terminalEvent() error {
	p := &c.p
	var r response
	if err := json.Unmarshal(p.Response, &r); err != nil || r.ID == "" {
		return c.errf("no response with an id")
	}
	if r.ID != c.respID {
		return c.errf("response id %q, want %q (from response.created)", r.ID, c.respID)
	}
	want := strings.TrimPrefix(p.Type, "response.")
	if r.Status != want {
		return c.errf("response status %q, want %q", r.Status, want)
	}
	if p.Type == "response.failed" {
		if len(r.Error) == 0 || string(r.Error) == "null" {
			return c.errf("response.error is null, want the failure")
		}
		if c.i == 0 || c.typeOf(c.i-1) != "error" {
			return c.errf("not preceded by an error event")
		}
	}
	if p.Type == "response.completed" {
		for _, it := range c.items {
			if !it.done {
				return c.errf("item %d (%s %s) has no output_item.done", it.idx, it.typ, it.id)
			}
		}
	}
	var done []json.RawMessage
	for _, it := range c.items {
		if it.done {
			done = append(done, it.raw)
		}
	}
	if len(r.Output) != len(done) {
		return c.errf("response.output has %d items, want %d (from output_item.done)", len(r.Output), len(done))
	}
	for k := range done {
		if !jsonEqual(r.Output[k], done[k]) {
			return c.errf("response.output[%d] = %s, want %s (from output_item.done)", k, clip(r.Output[k]), clip(done[k]))
		}
	}
	c.terminal, c.resp = p.Type, p.Response
	return nil
}

func (c *checker) typeOf(i int) string {
	var v struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(c.events[i].Data, &v)
	return v.Type
}

func (c *checker) errorEvent() error {
	p := &c.p
	var e struct {
		Message *string `json:"message"`
	}
	if len(p.Error) == 0 || json.Unmarshal(p.Error, &e) != nil || e.Message == nil {
		return c.errf(`want the nested form {"type":"error","error":{"message":...}}`)
	}
	if p.Message != nil || p.Code != nil {
		return c.errf("message or code at the top level, want them only inside error")
	}
	if c.i+1 >= len(c.events) || c.typeOf(c.i+1) != "response.failed" {
		return c.errf("not followed by response.failed")
	}
	return nil
}

func (c *checker) added() error {
	p := &c.p
	if p.OutputIndex == nil || *p.OutputIndex != len(c.items) {
		return c.errf("output_index %s, want %d", intOrNone(p.OutputIndex), len(c.items))
	}
	var it outItem
	if err := json.Unmarshal(p.Item, &it); err != nil || it.Type == "" {
		return c.errf("no item with a type")
	}
	if it.ID == "" {
		return c.errf("item has no id")
	}
	for _, o := range c.items {
		if o.id == it.ID {
			return c.errf("item id %q already used by output_index %d", it.ID, o.idx)
		}
	}
	if it.Type == "code_interpreter_call" {
		switch {
		case !strings.HasPrefix(it.ID, "ci_"):
			return c.errf("code_interpreter_call id %q, want a ci_ prefix", it.ID)
		case it.Status != "in_progress":
			return c.errf("item status %q, want in_progress", it.Status)
		case it.Code == nil || *it.Code != "":
			return c.errf(`item code %s, want ""`, quoteOrNone(it.Code))
		case string(it.Outputs) != "[]":
			return c.errf("item outputs %s, want []", orNone(it.Outputs))
		case it.ContainerID == nil || !strings.HasPrefix(*it.ContainerID, "cntr_"):
			return c.errf("item container_id %s, want a cntr_ prefix", quoteOrNone(it.ContainerID))
		}
	}
	c.items = append(c.items, &itemState{idx: len(c.items), id: it.ID, typ: it.Type, added: it, summary: map[int]*partState{}})
	return nil
}

func intOrNone(n *int) string {
	if n == nil {
		return "missing"
	}
	return fmt.Sprint(*n)
}

func orNone(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "missing"
	}
	return string(raw)
}

// open returns the item the event's output_index names, which must be added and not done.
func (c *checker) open() (*itemState, error) {
	k := *c.p.OutputIndex
	if k < 0 || k >= len(c.items) {
		return nil, c.errf("output_index %d before its output_item.added", k)
	}
	it := c.items[k]
	if it.done {
		return nil, c.errf("output_index %d after its output_item.done", k)
	}
	return it, nil
}

func (c *checker) itemDone(st *itemState) error {
	var it outItem
	if err := json.Unmarshal(c.p.Item, &it); err != nil {
		return c.errf("no item")
	}
	if it.ID != st.id || it.Type != st.typ {
		return c.errf("item %s %q, want %s %q (from output_item.added)", it.Type, it.ID, st.typ, st.id)
	}
	switch st.typ {
	case "code_interpreter_call":
		if st.stage != ciCompleted {
			return c.errf("output_item.done after %s, want it after code_interpreter_call.completed", ciStageNames[st.stage])
		}
		switch {
		case it.Code == nil || *it.Code != *st.codeDone:
			return c.errf("item code %s, want %q (from code_interpreter_call_code.done)", quoteOrNone(it.Code), *st.codeDone)
		case it.ContainerID == nil || *it.ContainerID != *st.added.ContainerID:
			return c.errf("item container_id %s, want %q (from output_item.added)", quoteOrNone(it.ContainerID), *st.added.ContainerID)
		case it.Status != "completed" && it.Status != "failed" && it.Status != "incomplete":
			return c.errf("item status %q, want completed, failed or incomplete", it.Status)
		}
		if err := checkOutputs(it.Outputs); err != nil {
			return c.errf("item outputs: %v", err)
		}
	case "function_call":
		if st.argsDone == nil {
			return c.errf("output_item.done before function_call_arguments.done")
		}
		if it.Arguments == nil || *it.Arguments != *st.argsDone {
			return c.errf("item arguments %s, want %q (from function_call_arguments.done)", quoteOrNone(it.Arguments), *st.argsDone)
		}
	case "message":
		if len(it.Content) != len(st.parts) {
			return c.errf("item has %d content parts, want %d (from content_part.added)", len(it.Content), len(st.parts))
		}
		for k, ps := range st.parts {
			if !ps.done {
				return c.errf("content part %d has no content_part.done", k)
			}
			var pt part
			_ = json.Unmarshal(it.Content[k], &pt)
			if got := partText(pt); pt.Type != ps.typ || got == nil || *got != *ps.doneText {
				return c.errf("item content[%d] %s %s, want %s %q", k, pt.Type, quoteOrNone(got), ps.typ, *ps.doneText)
			}
			if !sameJSONList(pt.Annotations, ps.anns) {
				return c.errf("item content[%d] annotations %s, want those announced: %s", k, pt.Annotations, ps.anns)
			}
		}
	}
	st.done = true
	st.raw = slices.Clone(c.p.Item)
	return nil
}

func checkOutputs(raw json.RawMessage) error {
	if len(raw) == 0 {
		return errors.New("missing, want null or an array")
	}
	if string(raw) == "null" {
		return nil
	}
	var outs []struct {
		Type string  `json:"type"`
		Logs *string `json:"logs"`
		URL  *string `json:"url"`
	}
	if err := json.Unmarshal(raw, &outs); err != nil {
		return fmt.Errorf("%s, want null or an array of logs and image entries", clip(raw))
	}
	for k, o := range outs {
		switch {
		case o.Type == "logs" && o.Logs != nil:
		case o.Type == "image" && o.URL != nil:
		default:
			return fmt.Errorf("entry %d is not {type:logs,logs} or {type:image,url}", k)
		}
	}
	return nil
}

func (c *checker) codeInterpreter(it *itemState) error {
	p := &c.p
	next := map[string][]int{ // event → the stages it may follow
		"response.code_interpreter_call.in_progress":  {ciAdded},
		"response.code_interpreter_call_code.delta":   {ciInProgress, ciCode},
		"response.code_interpreter_call_code.done":    {ciInProgress, ciCode},
		"response.code_interpreter_call.interpreting": {ciCodeDone},
		"response.code_interpreter_call.completed":    {ciInterpreting},
	}
	from, ok := next[p.Type]
	if !ok {
		return c.errf("unexpected in a code_interpreter_call item")
	}
	if !slices.Contains(from, it.stage) {
		return c.errf("after %s, want %s", ciStageNames[it.stage], ciStageNames[min(it.stage+1, ciCompleted)])
	}
	switch p.Type {
	case "response.code_interpreter_call.in_progress":
		it.stage = ciInProgress
	case "response.code_interpreter_call_code.delta":
		if p.Delta == nil {
			return c.errf("no delta")
		}
		it.code.WriteString(*p.Delta)
		it.stage = ciCode
	case "response.code_interpreter_call_code.done":
		if p.Code == nil {
			return c.errf("no code")
		}
		if *p.Code != it.code.String() {
			return c.errf("code %q, want %q (the deltas joined)", *p.Code, it.code.String())
		}
		it.codeDone = p.Code
		it.stage = ciCodeDone
	case "response.code_interpreter_call.interpreting":
		it.stage = ciInterpreting
	case "response.code_interpreter_call.completed":
		it.stage = ciCompleted
	}
	return nil
}

func (c *checker) functionCall(it *itemState) error {
	p := &c.p
	switch p.Type {
	case "response.function_call_arguments.delta":
		if it.argsDone != nil {
			return c.errf("delta after function_call_arguments.done")
		}
		if p.Delta == nil {
			return c.errf("no delta")
		}
		it.args.WriteString(*p.Delta)
	case "response.function_call_arguments.done":
		if it.argsDone != nil {
			return c.errf("function_call_arguments.done again")
		}
		if p.Arguments == nil || *p.Arguments != it.args.String() {
			return c.errf("arguments %s, want %q (the deltas joined)", quoteOrNone(p.Arguments), it.args.String())
		}
		it.argsDone = p.Arguments
	default:
		return c.errf("unexpected in a function_call item")
	}
	return nil
}

// sameJSONList reports whether two lists hold the same JSON values (a missing list is empty).
func sameJSONList(a, b []json.RawMessage) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		var x, y any
		if json.Unmarshal(a[i], &x) != nil || json.Unmarshal(b[i], &y) != nil || !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

func partText(pt part) *string {
	if pt.Type == "refusal" {
		return pt.Refusal
	}
	return pt.Text
}

func (c *checker) message(it *itemState) error {
	p := &c.p
	if p.ContentIndex == nil {
		return c.errf("no content_index")
	}
	k := *p.ContentIndex
	if p.Type == "response.content_part.added" {
		if k != len(it.parts) {
			return c.errf("content_index %d, want %d", k, len(it.parts))
		}
		var pt part
		if err := json.Unmarshal(p.Part, &pt); err != nil || pt.Type == "" {
			return c.errf("no part with a type")
		}
		if t := partText(pt); t == nil || *t != "" {
			return c.errf(`part text %s, want ""`, quoteOrNone(t))
		}
		it.parts = append(it.parts, &partState{typ: pt.Type})
		return nil
	}
	if k < 0 || k >= len(it.parts) {
		return c.errf("content_index %d before its content_part.added", k)
	}
	ps := it.parts[k]
	if ps.done {
		return c.errf("content_index %d after its content_part.done", k)
	}
	kind := "output_text"
	if strings.HasPrefix(p.Type, "response.refusal.") {
		kind = "refusal"
	}
	switch p.Type {
	case "response.output_text.delta", "response.refusal.delta":
		if ps.typ != kind {
			return c.errf("in a %s part", ps.typ)
		}
		if ps.doneText != nil {
			return c.errf("delta after its .done")
		}
		if p.Delta == nil {
			return c.errf("no delta")
		}
		ps.deltas.WriteString(*p.Delta)
	case "response.output_text.annotation.added":
		if ps.typ != "output_text" || ps.doneText != nil {
			return c.errf("annotation outside an open output_text part")
		}
		if p.AnnotationIdx == nil || *p.AnnotationIdx != len(ps.anns) {
			return c.errf("annotation_index %s, want %d", intOrNone(p.AnnotationIdx), len(ps.anns))
		}
		var a struct{ Type string }
		if json.Unmarshal(p.Annotation, &a) != nil || a.Type == "" {
			return c.errf("no annotation object with a type")
		}
		ps.anns = append(ps.anns, slices.Clone(p.Annotation))
	case "response.output_text.done", "response.refusal.done":
		if ps.typ != kind {
			return c.errf("in a %s part", ps.typ)
		}
		if ps.doneText != nil {
			return c.errf("%s again", p.Type)
		}
		got := p.Text
		if kind == "refusal" {
			got = p.Refusal
		}
		if got == nil || *got != ps.deltas.String() {
			return c.errf("text %s, want %q (the deltas joined)", quoteOrNone(got), ps.deltas.String())
		}
		ps.doneText = got
	case "response.content_part.done":
		if ps.doneText == nil {
			return c.errf("content_part.done before the part's .done event")
		}
		var pt part
		_ = json.Unmarshal(p.Part, &pt)
		if got := partText(pt); pt.Type != ps.typ || got == nil || *got != *ps.doneText {
			return c.errf("part %s %s, want %s %q", pt.Type, quoteOrNone(got), ps.typ, *ps.doneText)
		}
		if !sameJSONList(pt.Annotations, ps.anns) {
			return c.errf("part annotations %s, want those announced: %s", pt.Annotations, ps.anns)
		}
		ps.done = true
	default:
		return c.errf("unexpected in a message item")
	}
	return nil
}

func (c *checker) reasoning(it *itemState) error {
	p := &c.p
	if !strings.HasPrefix(p.Type, "response.reasoning_summary_") {
		return nil // reasoning_text events and newer kinds are not checked
	}
	if p.SummaryIndex == nil {
		return c.errf("no summary_index")
	}
	k := *p.SummaryIndex
	ps := it.summary[k]
	switch p.Type {
	case "response.reasoning_summary_part.added":
		if ps != nil {
			return c.errf("summary_index %d added again", k)
		}
		it.summary[k] = &partState{typ: "summary_text"}
		return nil
	case "response.reasoning_summary_text.delta":
		if ps == nil || ps.doneText != nil || p.Delta == nil {
			return c.errf("delta outside an open summary part %d", k)
		}
		ps.deltas.WriteString(*p.Delta)
	case "response.reasoning_summary_text.done":
		if ps == nil || ps.doneText != nil {
			return c.errf("done outside an open summary part %d", k)
		}
		if p.Text == nil || *p.Text != ps.deltas.String() {
			return c.errf("text %s, want %q (the deltas joined)", quoteOrNone(p.Text), ps.deltas.String())
		}
		ps.doneText = p.Text
	case "response.reasoning_summary_part.done":
		if ps == nil || ps.done {
			return c.errf("summary part %d not open", k)
		}
		ps.done = true
	}
	return nil
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func clip(raw json.RawMessage) string {
	const max = 300
	if len(raw) > max {
		return string(raw[:max]) + "…"
	}
	return string(raw)
}
