package intercept

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/intercept/argstream"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
)

// errUpstreamShape marks an upstream event or response the translator cannot read.
var errUpstreamShape = errors.New("unexpected upstream response")

// errTooDeep is an upstream event or response nesting deeper than jsondepth.Max: read no further,
// since gjson's validator recurses once per level (see package jsondepth).
var errTooDeep = fmt.Errorf("%w: JSON nested deeper than %d levels", errUpstreamShape, jsondepth.Max)

// translator turns the upstream's output, over every iteration of one request's loop, into the
// client-visible events and Response: calls of the stand-in function become
// code_interpreter_call items, everything else passes with output_index shifted so indexes run
// on across iterations. One translator serves one request; it is not safe for concurrent use.
//
// Streaming upstream events enter through upstream; a non-streaming upstream response enters
// through response, which feeds its items through the same code, so both renderings get the same
// items and the same final Response.
type translator struct {
	req       *request
	id        string // the client-visible response id
	createdAt int64

	// containerID returns the cntr_ id to show in a call item, waiting for the container if it is
	// still starting. It is called from the loop's goroutine.
	containerID func() (string, error)
	// mint returns a new id with the given prefix (newID; tests make ids predictable).
	mint func(prefix string) string

	out       [][]byte // client-visible items by output_index (nil while in progress)
	announced bool     // response.created and response.in_progress were sent
	skeleton  []byte   // the latest upstream Response object (fields other than ours come from it)
	usage     usage
	calls     []*slot // every stand-in call of the request, in order

	// The current upstream call.
	base      int              // output_index of the call's first item
	slots     []*slot          // its items, by upstream output_index
	byID      map[string]*slot // upstream item id → slot
	final     []byte           // its final Response (completed, incomplete or failed)
	finalType string           // the upstream event type that carried final
	errDetail []byte           // the error event's detail, if the upstream sent one
}

// slot is one item of the current upstream call.
type slot struct {
	index  int    // client output_index
	upID   string // upstream item id
	upItem []byte // the upstream item once done (carried into the next iteration)
	done   bool

	// Stand-in calls only.
	ours      bool
	added     bool // output_item.added was sent
	ciID      string
	callID    string
	container string
	dec       *argstream.Decoder
	args      strings.Builder // the arguments so far
	streamed  strings.Builder // the code deltas sent so far
	code      string
	codeDone  bool
	parseErr  error
	exec      *execution
}

func newTranslator(req *request, id string, createdAt int64, containerID func() (string, error)) *translator {
	return &translator{req: req, id: id, createdAt: createdAt, containerID: containerID, mint: newID, byID: map[string]*slot{}}
}

// begin starts a new upstream call.
func (t *translator) begin() {
	t.base = len(t.out)
	t.slots = t.slots[:0]
	clear(t.byID)
	t.final = nil
	t.finalType = ""
	t.errDetail = nil
}

// upstream translates one upstream stream event into zero or more client events.
func (t *translator) upstream(data []byte) ([]Event, error) {
	if !jsondepth.Within(data, jsondepth.Max) {
		return nil, errTooDeep
	}
	typ := gjson.GetBytes(data, "type").String()
	switch typ {
	case "response.created", "response.in_progress", "response.queued":
		resp := gjson.GetBytes(data, "response")
		if resp.IsObject() {
			t.skeleton = []byte(resp.Raw)
		}
		return t.announce(), nil
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
			return t.argsEvent(s, typ, data)
		}
	case "response.completed", "response.incomplete", "response.failed":
		resp := gjson.GetBytes(data, "response")
		if !resp.IsObject() {
			return nil, fmt.Errorf("%w: %s without a response", errUpstreamShape, typ)
		}
		// Items the stream never finished (a server that skips output_item.done) are finished
		// from the final response, so no stand-in call is left unrun or shown raw.
		var evs []Event
		var err error
		resp.Get("output").ForEach(func(k, item gjson.Result) bool {
			i := int(k.Int())
			if i < len(t.slots) && t.slots[i] != nil && t.slots[i].done {
				return true
			}
			var more []Event
			more, err = t.itemDone(i, []byte(item.Raw))
			evs = append(evs, more...)
			return err == nil
		})
		t.finish(typ, []byte(resp.Raw))
		return evs, err
	case "error":
		t.errDetail = errorDetail(data)
		return append(t.announce(), errorEvent(t.errDetail)), nil
	}
	return append(t.announce(), t.pass(data)), nil
}

// response feeds a complete (non-streaming) upstream Response through the same path as events.
func (t *translator) response(body []byte) ([]Event, error) {
	if !jsondepth.Within(body, jsondepth.Max) {
		return nil, errTooDeep
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() || !root.Get("output").IsArray() {
		return nil, fmt.Errorf("%w: no output in the response", errUpstreamShape)
	}
	t.skeleton = body
	evs := t.announce()
	var err error
	root.Get("output").ForEach(func(k, item gjson.Result) bool {
		var more []Event
		more, err = t.itemDone(int(k.Int()), []byte(item.Raw))
		evs = append(evs, more...)
		return err == nil
	})
	if err != nil {
		return evs, err
	}
	typ := "response.completed"
	switch root.Get("status").String() {
	case "incomplete":
		typ = "response.incomplete"
	case "failed":
		typ = "response.failed"
	}
	t.finish(typ, body)
	return evs, nil
}

func (t *translator) finish(typ string, resp []byte) {
	t.final = resp
	t.finalType = typ
	t.skeleton = resp
	t.usage.add(gjson.GetBytes(resp, "usage"))
}

// announce returns response.created and response.in_progress the first time it is called.
func (t *translator) announce() []Event {
	if t.announced {
		return nil
	}
	t.announced = true
	resp := t.patch(t.skeleton, "in_progress", []byte("[]"), false)
	return []Event{responseEvent("response.created", resp), responseEvent("response.in_progress", resp)}
}

// slotAt returns the slot of upstream output_index i, creating it.
func (t *translator) slotAt(i int, upID string) *slot {
	for len(t.slots) <= i {
		t.slots = append(t.slots, nil)
	}
	s := t.slots[i]
	if s == nil {
		s = &slot{index: t.base + i, upID: upID}
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

func (t *translator) isOurs(item gjson.Result) bool {
	return item.Get("type").String() == "function_call" && item.Get("name").String() == t.req.fn
}

func (t *translator) itemAdded(data []byte) ([]Event, error) {
	evs := t.announce()
	item := gjson.GetBytes(data, "item")
	i := int(gjson.GetBytes(data, "output_index").Int())
	s := t.slotAt(i, item.Get("id").String())
	if !t.isOurs(item) {
		if t.req.addedEncrypted && item.Get("type").String() == "reasoning" && item.Get("encrypted_content").Exists() {
			data, _ = sjson.SetRawBytes(data, "item", stripEncrypted([]byte(item.Raw)))
		}
		return append(evs, t.pass(data)), nil
	}
	s.ours = true
	s.callID = item.Get("call_id").String()
	s.dec = argstream.New("code")
	more, err := t.startCall(s)
	evs = append(evs, more...)
	if err != nil {
		return evs, err
	}
	if a := item.Get("arguments").String(); a != "" {
		evs = append(evs, t.feedArgs(s, a)...)
	}
	return evs, nil
}

// startCall announces a stand-in call as a code_interpreter_call.
func (t *translator) startCall(s *slot) ([]Event, error) {
	cid, err := t.containerID()
	if err != nil {
		return nil, err
	}
	s.container = cid
	s.ciID = t.mint("ci_")
	s.added = true
	t.calls = append(t.calls, s)
	return []Event{
		itemEvent("response.output_item.added", s.index, ciItem(s.ciID, "in_progress", "", cid, nil, false)),
		ciEvent("response.code_interpreter_call.in_progress", s.index, s.ciID, "", nil),
	}, nil
}

// feedArgs streams a chunk of the call's arguments as code deltas.
func (t *translator) feedArgs(s *slot, chunk string) []Event {
	s.args.WriteString(chunk)
	if d := s.dec.Write(chunk); d != "" {
		s.streamed.WriteString(d)
		return []Event{ciEvent("response.code_interpreter_call_code.delta", s.index, s.ciID, "delta", jsonString(d))}
	}
	return nil
}

func (t *translator) argsEvent(s *slot, typ string, data []byte) ([]Event, error) {
	if typ == "response.function_call_arguments.delta" {
		return t.feedArgs(s, gjson.GetBytes(data, "delta").String()), nil
	}
	return t.codeDone(s, gjson.GetBytes(data, "arguments").String()), nil
}

// codeDone fixes the call's code from its complete arguments. Arguments that were not streamed
// (a non-streaming upstream, or one that sends only the done event) are decoded now, so both
// renderings show the same code deltas.
func (t *translator) codeDone(s *slot, args string) []Event {
	if s.codeDone {
		return nil
	}
	var evs []Event
	if s.args.Len() == 0 && args != "" {
		evs = t.feedArgs(s, args)
	}
	s.codeDone = true
	var m map[string]any
	if err := json.Unmarshal([]byte(args), &m); err != nil {
		s.parseErr = err
	} else if c, ok := m["code"].(string); ok {
		s.code = c
	} else {
		s.parseErr = errors.New(`the "code" field is missing or not a string`)
	}
	if s.parseErr != nil {
		// Nothing runs; the client sees the code as far as it could be read.
		s.code = s.streamed.String()
	}
	return append(evs, ciEvent("response.code_interpreter_call_code.done", s.index, s.ciID, "code", jsonString(s.code)))
}

func (t *translator) itemDone(i int, item []byte) ([]Event, error) {
	evs := t.announce()
	it := gjson.ParseBytes(item)
	s := t.slotAt(i, it.Get("id").String())
	s.done = true
	s.upItem = item
	if !t.isOurs(it) {
		client := item
		if t.req.addedEncrypted && it.Get("type").String() == "reasoning" {
			client = stripEncrypted(item)
		}
		t.out[s.index] = client
		return append(evs, itemEvent("response.output_item.done", s.index, client)), nil
	}
	if !s.ours {
		s.ours = true
		s.callID = it.Get("call_id").String()
		s.dec = argstream.New("code")
		more, err := t.startCall(s)
		evs = append(evs, more...)
		if err != nil {
			return evs, err
		}
	}
	if id := it.Get("call_id").String(); id != "" {
		s.callID = id
	}
	args := it.Get("arguments").String()
	if !it.Get("arguments").Exists() {
		args = s.args.String()
	}
	return append(evs, t.codeDone(s, args)...), nil
}

// pass forwards an upstream event with its output_index shifted.
func (t *translator) pass(data []byte) Event {
	typ := gjson.GetBytes(data, "type").String()
	if t.base != 0 {
		if oi := gjson.GetBytes(data, "output_index"); oi.Exists() {
			data, _ = sjson.SetBytes(data, "output_index", t.base+int(oi.Int()))
		}
	}
	return Event{Type: typ, Data: data}
}

// ended reports whether the current upstream call delivered its final Response.
func (t *translator) ended() bool { return t.final != nil }

// pending returns the stand-in calls of the current upstream call, in output order.
func (t *translator) pending() []*slot {
	var out []*slot
	for _, s := range t.slots {
		if s != nil && s.ours {
			out = append(out, s)
		}
	}
	return out
}

// clientCalls reports whether the current upstream call asked for a client's own function.
func (t *translator) clientCalls() bool {
	for _, s := range t.slots {
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
// with its encrypted content.
func (t *translator) turn() [][]byte {
	out := make([][]byte, 0, len(t.slots))
	for _, s := range t.slots {
		if s == nil || s.upItem == nil {
			continue
		}
		if !t.req.store {
			it := gjson.ParseBytes(s.upItem)
			if it.Get("type").String() == "reasoning" && !it.Get("encrypted_content").Exists() {
				continue
			}
		}
		out = append(out, s.upItem)
	}
	return out
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

// interpreting returns the event sent before a call runs.
func (t *translator) interpreting(s *slot) Event {
	return ciEvent("response.code_interpreter_call.interpreting", s.index, s.ciID, "", nil)
}

// executed records a call's execution and returns its closing events.
func (t *translator) executed(s *slot, ex execution) []Event {
	s.exec = &ex
	item := ciItem(s.ciID, ex.status, s.code, s.container, &ex, t.req.includeOutputs)
	t.out[s.index] = item
	return []Event{
		ciEvent("response.code_interpreter_call.completed", s.index, s.ciID, "", nil),
		itemEvent("response.output_item.done", s.index, item),
	}
}

// completed returns the terminal event for a loop that ended normally.
func (t *translator) completed() Event {
	typ, status := "response.completed", "completed"
	if gjson.GetBytes(t.final, "status").String() == "incomplete" || t.finalType == "response.incomplete" {
		typ, status = "response.incomplete", "incomplete"
	}
	if t.finalType == "response.failed" {
		return t.failed(nil)
	}
	return responseEvent(typ, t.patch(t.final, status, t.output(), true))
}

// failed returns the terminal event of a failed loop. detail is the error event's detail (nil:
// the upstream's own error, if any).
func (t *translator) failed(detail []byte) Event {
	resp := t.patch(t.skeleton, "failed", t.output(), true)
	var code, msg string
	if detail != nil {
		d := gjson.ParseBytes(detail)
		code, msg = d.Get("code").String(), d.Get("message").String()
		if code == "" {
			code = d.Get("type").String()
		}
	} else if e := gjson.GetBytes(t.skeleton, "error"); e.IsObject() {
		code, msg = e.Get("code").String(), e.Get("message").String()
	}
	if code == "" {
		code = "server_error"
	}
	if msg == "" {
		msg = "The response failed."
	}
	e := []byte(`{"code":` + string(jsonString(code)) + `,"message":` + string(jsonString(msg)) + `}`)
	resp, _ = sjson.SetRawBytes(resp, "error", e)
	return responseEvent("response.failed", resp)
}

// upstreamError returns the error of the upstream's failed Response as an error event detail.
func (t *translator) upstreamError() []byte {
	e := gjson.GetBytes(t.final, "error")
	code := e.Get("code").String()
	if code == "" {
		code = "server_error"
	}
	msg := e.Get("message").String()
	if msg == "" {
		msg = "The response failed."
	}
	return []byte(`{"type":` + string(jsonString(code)) + `,"code":` + string(jsonString(code)) + `,"message":` + string(jsonString(msg)) + `,"param":null}`)
}

// output renders the client-visible output list. Items still in progress (a failure cut them
// short) are left out.
func (t *translator) output() []byte {
	size := 2
	for _, it := range t.out {
		size += len(it) + 1
	}
	b := make([]byte, 0, size)
	b = append(b, '[')
	for _, it := range t.out {
		if it != nil {
			b = appendElem(b, it)
		}
	}
	return append(b, ']')
}

// patch returns resp (an upstream Response, possibly nil) as the client's Response: the proxy's
// id, the client's model, tools and tool_choice, the given status and output, and (when
// withUsage) the usage summed over the loop.
func (t *translator) patch(resp []byte, status string, output []byte, withUsage bool) []byte {
	if !jsondepth.Valid(resp) || !gjson.ParseBytes(resp).IsObject() {
		resp = []byte(`{"id":"","object":"response","created_at":0,"status":"","error":null,"incomplete_details":null,"output":[],"usage":null}`)
	}
	set := func(path string, raw []byte) {
		if raw == nil {
			return
		}
		if out, err := sjson.SetRawBytes(resp, path, raw); err == nil {
			resp = out
		}
	}
	set("id", jsonString(t.id))
	if t.createdAt == 0 {
		t.createdAt = gjson.GetBytes(resp, "created_at").Int()
	}
	set("created_at", []byte(strconv.FormatInt(t.createdAt, 10)))
	set("status", jsonString(status))
	if status != "failed" && gjson.GetBytes(resp, "error").Exists() {
		set("error", []byte("null"))
	}
	set("model", t.req.model)
	set("tools", t.req.tools)
	if t.req.toolChoice != nil {
		set("tool_choice", t.req.toolChoice)
	} else {
		set("tool_choice", []byte(`"auto"`))
	}
	if t.req.previousID != nil {
		set("previous_response_id", t.req.previousID)
	} else if gjson.GetBytes(resp, "previous_response_id").Exists() {
		set("previous_response_id", []byte("null"))
	}
	set("max_tool_calls", t.req.maxToolCallsRaw)
	set("output", output)
	switch {
	case withUsage && t.usage.seen:
		set("usage", t.usage.json())
	case !withUsage && gjson.GetBytes(resp, "usage").Exists():
		// An in-progress response has no usage yet, even when its skeleton came from an
		// upstream's finished (JSON) answer.
		set("usage", []byte("null"))
	}
	return resp
}

// stripEncrypted removes encrypted_content that the proxy asked for on its own behalf.
func stripEncrypted(item []byte) []byte {
	out, err := sjson.DeleteBytes(item, "encrypted_content")
	if err != nil {
		return item
	}
	return out
}

// errorDetail returns the detail of an upstream error event in the nested shape.
func errorDetail(data []byte) []byte {
	if e := gjson.GetBytes(data, "error"); e.IsObject() {
		return []byte(e.Raw)
	}
	ev := gjson.ParseBytes(data)
	code := ev.Get("code")
	typ := code.String()
	if typ == "" {
		typ = "server_error"
	}
	b := []byte(`{"type":` + string(jsonString(typ)) + `,"code":`)
	if code.Exists() {
		b = append(b, code.Raw...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"message":`...)
	b = appendJSONString(b, ev.Get("message").String())
	b = append(b, `,"param":`...)
	if p := ev.Get("param"); p.Exists() {
		b = append(b, p.Raw...)
	} else {
		b = append(b, "null"...)
	}
	return append(b, '}')
}

// usage is token usage summed over the loop's upstream calls.
type usage struct {
	seen                   bool
	in, cached, cacheWrite int64
	out, reasoning, total  int64
	hasCacheWrite          bool
}

func (u *usage) add(r gjson.Result) {
	if !r.IsObject() {
		return
	}
	u.seen = true
	u.in += r.Get("input_tokens").Int()
	u.cached += r.Get("input_tokens_details.cached_tokens").Int()
	if cw := r.Get("input_tokens_details.cache_write_tokens"); cw.Exists() {
		u.hasCacheWrite = true
		u.cacheWrite += cw.Int()
	}
	u.out += r.Get("output_tokens").Int()
	u.reasoning += r.Get("output_tokens_details.reasoning_tokens").Int()
	if tt := r.Get("total_tokens"); tt.Exists() {
		u.total += tt.Int()
	} else {
		u.total += r.Get("input_tokens").Int() + r.Get("output_tokens").Int()
	}
}

func (u *usage) json() []byte {
	b := make([]byte, 0, 192)
	b = append(b, `{"input_tokens":`...)
	b = strconv.AppendInt(b, u.in, 10)
	b = append(b, `,"input_tokens_details":{"cached_tokens":`...)
	b = strconv.AppendInt(b, u.cached, 10)
	if u.hasCacheWrite {
		b = append(b, `,"cache_write_tokens":`...)
		b = strconv.AppendInt(b, u.cacheWrite, 10)
	}
	b = append(b, `},"output_tokens":`...)
	b = strconv.AppendInt(b, u.out, 10)
	b = append(b, `,"output_tokens_details":{"reasoning_tokens":`...)
	b = strconv.AppendInt(b, u.reasoning, 10)
	b = append(b, `},"total_tokens":`...)
	b = strconv.AppendInt(b, u.total, 10)
	return append(b, '}')
}
