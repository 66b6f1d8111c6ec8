package intercept

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/intercept/argstream"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

// outcome is how an upstream call, and so the response, ended.
type outcome uint8

const (
	outcomePending    outcome = iota // no final Response yet
	outcomeCompleted                 // response.completed
	outcomeIncomplete                // response.incomplete, or a Response whose status is incomplete
	outcomeFailed                    // response.failed, or an error event that ended the stream
)

// terminalOutcome returns the outcome a terminal event type stands for.
func terminalOutcome(typ string) (outcome, bool) {
	for _, o := range []outcome{outcomeCompleted, outcomeIncomplete, outcomeFailed} {
		if typ == o.eventType() {
			return o, true
		}
	}
	return outcomePending, false
}

// eventType is the terminal event type for o, as the upstream sends it and the client gets it.
func (o outcome) eventType() string {
	switch o {
	case outcomeIncomplete:
		return "response.incomplete"
	case outcomeFailed:
		return "response.failed"
	}
	return "response.completed"
}

// status is the Response status for o.
func (o outcome) status() string {
	switch o {
	case outcomeIncomplete:
		return "incomplete"
	case outcomeFailed:
		return "failed"
	}
	return "completed"
}

// translator is the pure state machine between the upstream's Responses events and the client's:
// upstream events go in (event), client events come out, and each upstream call ends with a typed
// outcome. Calls of the stand-in function become code_interpreter_call items with their native
// events; everything else passes with output_index shifted, so indexes run on across the loop's
// iterations. The translator does no I/O and never waits: when an event would start a stand-in
// call before it knows the container, it takes nothing and says so (errNeedContainer); the loop
// resolves the container, hands its id over (setContainer) and feeds the event again. The loop
// reports each execution back to it (interpreting, executed). One translator serves one request;
// it is not safe for concurrent use.
//
// A non-streaming upstream answer arrives as one terminal event carrying the whole Response
// (upstream.ResponseEvents); its items go through the same code as streamed ones, so both
// renderings get the same items and the same final Response. The Response the client sees is
// assembled in response.go.
type translator struct {
	req       *parsedRequest
	id        string // the client-visible response id
	createdAt int64
	// mint returns a new id with the given prefix (newID; tests make ids predictable).
	mint func(prefix string) string
	// container is the cntr_ id shown in call items; "" until the loop hands it over.
	container string
	// The container's files as far as known, by path, for citations (citations.go); filesKnown:
	// they are all of them. uncited are images the code wrote that no message cited yet.
	files      map[string]store.ContainerFile
	filesKnown bool
	uncited    []store.ContainerFile
	// maxArgs bounds the bytes of one call's arguments kept and decoded (max_code_size; 0: none).
	maxArgs int

	out [][]byte // client-visible items by output_index (nil while in progress)
	// withOutputs holds call items with their outputs, by output_index, when the client's
	// items have none (outputs not included), for the stored Response.
	withOutputs map[int][]byte
	announced   bool   // response.created and response.in_progress were sent
	skeleton    []byte // the latest upstream Response object (fields other than ours come from it)
	usage       usage
	started     int // stand-in calls started over the request

	// The current upstream call.
	base      int              // output_index of the call's first item
	slots     []*slot          // its items, by upstream output_index
	byID      map[string]*slot // upstream item id → slot
	final     []byte           // its final Response (completed, incomplete or failed)
	end       outcome          // how it ended
	errDetail []byte           // the error event's detail, if the upstream sent one
	strip     bool             // remove encrypted_content the proxy asked for on its own behalf
	// holdFrom is the upstream output_index of its first call that runs in the container (-1:
	// none yet). The events of the items after it are held until that call has run and its
	// output is shown, so the client sees each call followed by its output (release).
	holdFrom  int
	held      []heldEvent
	heldBytes int
	maxHeld   int // bytes of held events at most (defaultMaxHeld)
}

// heldEvent is a client event of the item at upstream output_index at, held back (holdFrom).
type heldEvent struct {
	at int
	ev Event
}

// slot is one item of the current upstream call.
type slot struct {
	at     int    // upstream output_index
	index  int    // client output_index
	upID   string // upstream item id
	upItem []byte // the upstream item once done (carried into the next iteration)
	done   bool

	// Stand-in calls only.
	ours     bool
	shell    bool   // a call of the shell tool's stand-in (else code_interpreter's)
	ciID     string // the client's item id: ci_… or sh_…
	callID   string
	dec      *argstream.Decoder
	args     strings.Builder // the arguments so far
	streamed strings.Builder // the code deltas sent so far
	code     string
	codeDone bool
	parseErr error
	tooBig   bool // the arguments are over maxArgs: nothing more of them is kept (limits.go)

	// Shell calls only: the commands as streamed (command events sent for each), and the action
	// from the complete arguments. outIndex is the client output_index of a hosted call's
	// shell_call_output, right after the call (-1: after every item so far).
	outIndex int
	commands []string
	cmdDone  int // commands whose .done was sent
	action   shellAction

	// Passed messages only: their output_text parts, by content index.
	parts []*citedPart
}

// standIn is one stand-in call of the current upstream call, as the loop runs it.
type standIn struct {
	ref      int    // the call's handle for interpreting and executed
	ciID     string // the item id the client sees (code_interpreter_call or shell_call)
	callID   string // the upstream's call_id
	code     string
	parseErr error // the arguments could not be read: nothing runs
	shell    bool
	action   shellAction // a shell call's
}

func newTranslator(req *parsedRequest, id string, createdAt int64, mint func(string) string) *translator {
	if mint == nil {
		mint = newID
	}
	// Without a code_interpreter tool there is no container, and no file to cite.
	return &translator{req: req, id: id, createdAt: createdAt, mint: mint, byID: map[string]*slot{}, filesKnown: !req.sandboxed(), maxHeld: defaultMaxHeld}
}

// begin starts the next upstream call. stripEncrypted: the call asks for reasoning's encrypted
// content on the proxy's behalf, so the client must not see it.
func (t *translator) begin(stripEncrypted bool) {
	t.base = len(t.out)
	t.holdFrom = -1
	t.held, t.heldBytes = t.held[:0], 0
	t.slots = t.slots[:0]
	clear(t.byID)
	t.final = nil
	t.end = outcomePending
	t.errDetail = nil
	t.strip = stripEncrypted
}

// errNeedContainer is event's answer to an event that would start a stand-in call before the
// container id was handed over. Nothing of the event was taken: the loop hands the id over
// (setContainer) and feeds the same event again.
var errNeedContainer = errors.New("intercept: a stand-in call starts; the container id is needed")

// setContainer hands over the container's cntr_ id, for the call items.
func (t *translator) setContainer(id string) { t.container = id }

// needsContainer reports whether an event of type typ would start a stand-in call while the
// container id is not known yet.
func (t *translator) needsContainer(typ string, data []byte) bool {
	if t.container != "" {
		return false
	}
	switch typ {
	case "response.output_item.added":
		return t.runsInContainer(gjson.GetBytes(data, "item"))
	case "response.output_item.done":
		return t.startsCall(int(gjson.GetBytes(data, "output_index").Int()), gjson.GetBytes(data, "item"))
	default:
		if _, ok := terminalOutcome(typ); !ok {
			return false
		}
		needs := false
		gjson.GetBytes(data, "response.output").ForEach(func(k, item gjson.Result) bool {
			needs = t.startsCall(int(k.Int()), item)
			return !needs
		})
		return needs
	}
}

// startsCall reports whether a finished item at upstream output_index i is a stand-in call not
// started yet.
func (t *translator) startsCall(i int, item gjson.Result) bool {
	if !t.runsInContainer(item) {
		return false
	}
	return i < 0 || i >= len(t.slots) || t.slots[i] == nil || !t.slots[i].ours
}

// maxIndexGap is how far past the items so far an upstream event's output_index may go: servers
// number items from 0 without gaps, and a few skipped are tolerated.
const maxIndexGap = 64

// errTooDeep is an upstream event (or a non-streaming answer's Response, which arrives as one)
// nesting deeper than jsondepth.Max: read no further, since gjson's validator recurses once per
// level (see package jsondepth).
var errTooDeep = fmt.Errorf("%w: JSON nested deeper than %d levels", upstream.ErrMalformed, jsondepth.Max)

// event translates one upstream event into zero or more client events. An error wraps
// upstream.ErrMalformed (the event cannot be read), or is errNeedContainer. Every event's depth
// is bounded here, whichever implementation of the Responses seam delivered it, before anything
// recursive sees it, and its invalid UTF-8 replaced (U+FFFD).
func (t *translator) event(data []byte) ([]Event, error) {
	if !jsondepth.Within(data, jsondepth.Max) {
		return nil, errTooDeep
	}
	// Passed and copied as it came: the client must get valid UTF-8 whatever the upstream sent.
	data = upstream.ValidUTF8(data)
	typ := gjson.GetBytes(data, "type").String()
	if oi := gjson.GetBytes(data, "output_index"); oi.Exists() && (oi.Int() < 0 || oi.Int() > int64(len(t.slots)+maxIndexGap)) {
		// Items are numbered from 0 in order: an index far past them would have every slot up
		// to it allocated.
		return nil, fmt.Errorf("%w: output_index %s with %d items so far", upstream.ErrMalformed, oi.Raw, len(t.slots))
	}
	if t.needsContainer(typ, data) {
		return nil, errNeedContainer
	}
	if t.needsFiles(typ, data) {
		return nil, errNeedFiles
	}
	if o, ok := terminalOutcome(typ); ok {
		return t.terminal(o, data)
	}
	evs := t.hold(t.itemOf(data), t.translate(typ, data))
	if t.heldBytes > t.maxHeld {
		return nil, fmt.Errorf("%w: over %d bytes of events after a call in one turn", upstream.ErrMalformed, t.maxHeld)
	}
	return evs, nil
}

// defaultMaxHeld bounds the events held back in one upstream call (hold): as much as a
// non-streaming answer may hold.
const defaultMaxHeld = 64 << 20

// translate translates an upstream event other than the terminal one.
func (t *translator) translate(typ string, data []byte) []Event {
	switch typ {
	case "response.created", "response.in_progress", "response.queued":
		resp := gjson.GetBytes(data, "response")
		if resp.IsObject() {
			t.skeleton = []byte(resp.Raw)
		}
		return t.announce()
	case "response.output_item.added":
		return t.itemAdded(data)
	case "response.output_item.done":
		item := gjson.GetBytes(data, "item")
		return t.itemDone(int(gjson.GetBytes(data, "output_index").Int()), []byte(item.Raw))
	case "response.function_call_arguments.delta", "response.function_call_arguments.done":
		s := t.byID[gjson.GetBytes(data, "item_id").String()]
		if oi := gjson.GetBytes(data, "output_index"); s == nil && oi.Exists() && int(oi.Int()) < len(t.slots) {
			s = t.slots[oi.Int()] // an upstream that names items by index only
		}
		if s != nil && s.ours {
			if typ == "response.function_call_arguments.delta" {
				return t.feedArgs(s, gjson.GetBytes(data, "delta").String())
			}
			return t.codeDone(s, gjson.GetBytes(data, "arguments").String())
		}
	case "response.output_text.done", "response.content_part.done", evAnnotationAdded:
		if evs, ok := t.textEvent(typ, data); ok {
			return evs
		}
	case "error":
		t.errDetail = errorEventDetail(data)
		return append(t.announce(), newErrorEvent(t.errDetail))
	}
	return append(t.announce(), t.pass(data))
}

// itemOf returns the upstream output_index of the item an event is about (-1: none).
func (t *translator) itemOf(data []byte) int {
	if oi := gjson.GetBytes(data, "output_index"); oi.Exists() {
		return int(oi.Int())
	}
	if s := t.byID[gjson.GetBytes(data, "item_id").String()]; s != nil {
		return s.at
	}
	return -1
}

// hold keeps back the events of the item at upstream output_index at when a call before it in
// the turn is still to run (holdFrom), and returns the others.
func (t *translator) hold(at int, evs []Event) []Event {
	if t.holdFrom < 0 || at <= t.holdFrom {
		return evs
	}
	for _, ev := range evs {
		t.held = append(t.held, heldEvent{at, ev})
		if ev.passed != nil {
			t.heldBytes += len(ev.passed)
		} else {
			t.heldBytes += len(ev.appendJSON(nil, 0))
		}
	}
	return nil
}

// release returns the held events that come after call ref's output: those of the items up to
// and including the next call that runs in the container, or all of them when there is none
// (ref -1: all of them).
func (t *translator) release(ref int) []Event {
	upTo := -1
	if ref >= 0 {
		for _, s := range t.slots[ref+1:] {
			if s != nil && s.ours && t.inContainer(s) {
				upTo = s.at
				break
			}
		}
	}
	var out []Event
	kept := t.held[:0]
	for _, h := range t.held {
		if upTo < 0 || h.at <= upTo {
			out = append(out, h.ev)
		} else {
			kept = append(kept, h)
		}
	}
	clear(t.held[len(kept):])
	t.held = kept
	if upTo < 0 {
		t.holdFrom, t.heldBytes = -1, 0
	}
	return out
}

// terminal handles the event that ends an upstream call. Items the stream never finished (a
// server that skips output_item.done, or a non-streaming answer, which has no other events) are
// finished from the final Response, so no stand-in call is left unrun or shown raw.
func (t *translator) terminal(o outcome, data []byte) ([]Event, error) {
	resp := gjson.GetBytes(data, "response")
	if !resp.IsObject() {
		return nil, fmt.Errorf("%w: %s without a response", upstream.ErrMalformed, o.eventType())
	}
	raw := []byte(resp.Raw)
	if !t.announced {
		// Nothing came before it (a non-streaming answer): its Response is the skeleton.
		t.skeleton = raw
	}
	evs := t.announce()
	resp.Get("output").ForEach(func(k, item gjson.Result) bool {
		i := int(k.Int())
		if i < len(t.slots) && t.slots[i] != nil && t.slots[i].done {
			return true
		}
		evs = append(evs, t.hold(i, t.itemDone(i, []byte(item.Raw)))...)
		return true
	})
	if o != outcomeFailed && resp.Get("status").String() == "incomplete" {
		o = outcomeIncomplete
	}
	t.final = raw
	t.end = o
	t.skeleton = raw
	t.usage.add(resp.Get("usage"))
	return evs, nil
}

// ended reports whether the current upstream call delivered its final Response.
func (t *translator) ended() bool { return t.final != nil }

// answerEnded is told that the upstream's answer ended. It reports whether the call is complete:
// it delivered its final Response, or an error event that the client has seen already (a stream
// that ends after it fails).
func (t *translator) answerEnded() bool {
	if t.final != nil {
		return true
	}
	if t.errDetail != nil {
		t.end = outcomeFailed
		return true
	}
	return false
}

// outcome returns how the current upstream call ended.
func (t *translator) outcome() outcome { return t.end }

// upstreamID returns the id of the current call's final upstream Response.
func (t *translator) upstreamID() string { return gjson.GetBytes(t.final, "id").String() }

// startedCalls reports whether a call item, and so the container id, reached the client.
func (t *translator) startedCalls() bool { return t.started > 0 }

// announce returns response.created and response.in_progress the first time it is called.
func (t *translator) announce() []Event {
	if t.announced {
		return nil
	}
	t.announced = true
	resp := t.patch(t.skeleton, "in_progress", []byte("[]"), false)
	return []Event{newResponseEvent(evCreated, resp), newResponseEvent(evInProgress, resp)}
}

// slotAt returns the slot of upstream output_index i, creating it.
func (t *translator) slotAt(i int, upID string) *slot {
	for len(t.slots) <= i {
		t.slots = append(t.slots, nil)
	}
	s := t.slots[i]
	if s == nil {
		s = &slot{at: i, index: t.indexOf(i), upID: upID, outIndex: -1}
		t.slots[i] = s
		for len(t.out) <= s.index {
			t.out = append(t.out, nil)
		}
	}
	if upID != "" && s.upID == "" {
		s.upID = upID
	}
	if s.upID != "" {
		t.byID[s.upID] = s
	}
	return s
}

// indexOf returns the client output_index of upstream output_index i of the current call:
// shifted by the items before the call, and by the shell_call_output that follows each hosted
// shell call before i.
func (t *translator) indexOf(i int) int {
	if i >= 0 && i < len(t.slots) && t.slots[i] != nil {
		return t.slots[i].index
	}
	n := t.base + i
	for _, s := range t.slots[:min(max(i, 0), len(t.slots))] {
		if s != nil && s.ours && s.shell && t.req.shell.hosted {
			n++
		}
	}
	return n
}

// inContainer reports whether stand-in call s runs in the container: code, or a hosted shell
// call (a local one is the client's).
func (t *translator) inContainer(s *slot) bool { return !s.shell || t.req.shell.hosted }

// isOurs reports whether item calls a stand-in function. Without the tool it stands for in the
// request, a function of that name is the client's own.
func (t *translator) isOurs(item gjson.Result) bool {
	if item.Get("type").String() != "function_call" {
		return false
	}
	name := item.Get("name").String()
	return t.req.code && name == t.req.fn || t.req.shell.fn != "" && name == t.req.shell.fn
}

// runsInContainer reports whether item is a stand-in call that runs in the container: code, or
// a hosted shell call (a local one is the client's).
func (t *translator) runsInContainer(item gjson.Result) bool {
	return t.isOurs(item) && (t.req.shell.hosted || !t.isShell(item))
}

// isShell reports whether item, one of ours, calls the shell tool's stand-in.
func (t *translator) isShell(item gjson.Result) bool {
	return t.req.shell.fn != "" && item.Get("name").String() == t.req.shell.fn
}

func (t *translator) itemAdded(data []byte) []Event {
	evs := t.announce()
	item := gjson.GetBytes(data, "item")
	i := int(gjson.GetBytes(data, "output_index").Int())
	s := t.slotAt(i, item.Get("id").String())
	if !t.isOurs(item) {
		if t.strip && item.Get("type").String() == "reasoning" && item.Get("encrypted_content").Exists() {
			data, _ = sjson.SetRawBytes(data, "item", stripEncrypted([]byte(item.Raw)))
		}
		return append(evs, t.pass(data))
	}
	s.callID = item.Get("call_id").String()
	s.shell = t.isShell(item)
	evs = append(evs, t.startCall(s)...)
	if a := item.Get("arguments").String(); a != "" {
		evs = append(evs, t.feedArgs(s, a)...)
	}
	return evs
}

func (t *translator) itemDone(i int, item []byte) []Event {
	evs := t.announce()
	it := gjson.ParseBytes(item)
	s := t.slotAt(i, it.Get("id").String())
	s.done = true
	s.upItem = item
	if !t.isOurs(it) {
		client := item
		switch it.Get("type").String() {
		case "reasoning":
			if t.strip {
				client = stripEncrypted(item)
			}
		case "message":
			var cited []Event
			client, cited = t.citeMessage(s, item)
			evs = append(evs, cited...)
		}
		t.out[s.index] = client
		return append(evs, newItemEvent(evItemDone, s.index, client))
	}
	if !s.ours {
		s.callID = it.Get("call_id").String()
		s.shell = t.isShell(it)
		evs = append(evs, t.startCall(s)...)
	}
	if id := it.Get("call_id").String(); id != "" {
		s.callID = id
	}
	args := it.Get("arguments").String()
	if !it.Get("arguments").Exists() {
		args = s.args.String()
	}
	evs = append(evs, t.codeDone(s, args)...)
	t.dropArgs(s)
	if s.shell {
		evs = append(evs, t.shellCallDone(s)...)
	}
	return evs
}

// pass forwards an upstream event with its output_index shifted.
func (t *translator) pass(data []byte) Event {
	typ := gjson.GetBytes(data, "type").String()
	if oi := gjson.GetBytes(data, "output_index"); oi.Exists() {
		if i := t.indexOf(int(oi.Int())); i != int(oi.Int()) {
			data, _ = sjson.SetBytes(data, "output_index", i)
		}
	}
	return Event{Type: typ, passed: data}
}

// calls returns the stand-in calls of the current upstream call, in output order.
func (t *translator) calls() []standIn {
	var out []standIn
	for i, s := range t.slots {
		if s != nil && s.ours {
			out = append(out, standIn{ref: i, ciID: s.ciID, callID: s.callID, code: s.code, parseErr: s.parseErr, shell: s.shell, action: s.action})
		}
	}
	return out
}

// shownItem is the client's item of call ref as shown so far (nil when it is not done).
func (t *translator) shownItem(ref int) []byte {
	if ref < 0 || ref >= len(t.slots) || t.slots[ref] == nil {
		return nil
	}
	if i := t.slots[ref].index; i < len(t.out) {
		return t.out[i]
	}
	return nil
}

// clientCalls reports whether the current upstream call asked for a client's own function, or
// for a shell command the client runs (a shell tool without a container).
func (t *translator) clientCalls() bool {
	for _, s := range t.slots {
		if s != nil && s.shell && !t.req.shell.hosted {
			return true
		}
		if s != nil && !s.ours && s.upItem != nil {
			switch gjson.GetBytes(s.upItem, "type").String() {
			case "function_call", "custom_tool_call", "computer_call", "local_shell_call", "shell_call",
				"apply_patch_call", "mcp_approval_request":
				// Items only the client can answer: continuing without its output would be refused.
				return true
			}
		}
	}
	return false
}

// turn returns the model's items of the current upstream call, as the upstream sent them, to
// carry into the next iteration. Without upstream storage a reasoning item can only be carried
// with what lets the model read it again: its encrypted content, or its own text (content), as
// a Chat Completions upstream's reasoning and servers such as vLLM give it.
func (t *translator) turn() [][]byte {
	out := make([][]byte, 0, len(t.slots))
	for _, s := range t.slots {
		if s == nil || s.upItem == nil {
			continue
		}
		if !t.req.store {
			it := gjson.ParseBytes(s.upItem)
			if it.Get("type").String() == "reasoning" && !it.Get("encrypted_content").Exists() && !hasReasoningText(it) {
				continue
			}
		}
		out = append(out, s.upItem)
	}
	return out
}

// hasReasoningText reports whether a reasoning item carries reasoning text in its content.
func hasReasoningText(item gjson.Result) bool {
	found := false
	item.Get("content").ForEach(func(_, p gjson.Result) bool {
		found = p.Get("type").String() == "reasoning_text" && p.Get("text").String() != ""
		return !found
	})
	return found
}

// reasoned reports whether the current upstream call produced reasoning items.
func (t *translator) reasoned() bool {
	for _, s := range t.slots {
		if s != nil && s.upItem != nil && gjson.GetBytes(s.upItem, "type").String() == "reasoning" {
			return true
		}
	}
	return false
}

// stripEncrypted removes encrypted_content that the proxy asked for on its own behalf.
func stripEncrypted(item []byte) []byte {
	out, err := sjson.DeleteBytes(item, "encrypted_content")
	if err != nil {
		return item
	}
	return out
}
