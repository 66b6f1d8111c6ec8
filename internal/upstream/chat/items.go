package chat

import "errors"

// A stream's items in order: one open at a time, each opened (output_item.added, with what it
// gathered while it waited) and closed (its .done events, output_item.done) as far as they are
// ready, then the Response's own events.

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
	var item any
	switch it.kind {
	case reasoningItem:
		item = newReasoningOut(it.id, "", false)
	case messageItem:
		item = newMessageOut(it.id, "in_progress", nil)
	case callItemKind:
		item = newCallOut(it.id, "in_progress", "", it.callID, it.name)
	}
	s.itemEvent("response.output_item.added", it.index, item)
	for k, p := range it.parts {
		s.partAdded(it, k, p)
		if p.sent < p.text.Len() {
			s.textDelta(it, k, p, p.text.String()[p.sent:], "", p.logprobs[p.lpSent:])
			p.sent, p.lpSent = p.text.Len(), len(p.logprobs)
		}
		if p.closed && k < len(it.parts)-1 {
			s.partDone(it, k, p)
		}
	}
	if it.kind == callItemKind && it.argsSent < it.args.Len() {
		s.argsDelta(it, it.args.String()[it.argsSent:], "")
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
		it.final = newReasoningOut(it.id, it.parts[0].text.String(), true)
	case messageItem:
		parts := make([]any, len(it.parts))
		for k, p := range it.parts {
			s.partDone(it, k, p)
			parts[k] = p.done()
		}
		it.final = newMessageOut(it.id, status, parts)
	case callItemKind:
		args := it.args.String()
		if it.cut {
			status = "incomplete"
		}
		s.emit("response.function_call_arguments.done", &argsDoneEvent{head: s.next("response.function_call_arguments.done"), ItemID: it.id, OutputIndex: it.index, Name: it.name, Arguments: args})
		it.final = newCallOut(it.id, status, args, it.callID, it.name)
	}
	// The Responses after this event carry the item as it encoded here.
	if b := s.itemEvent("response.output_item.done", it.index, it.final); b != nil {
		it.final = b
	}
}

// terminal sends response.completed or response.incomplete.
func (s *Stream) terminal() {
	status, reason := finishStatus(s.finish)
	s.responseEvent("response."+status, responseState{status: status, completedAt: s.r.completedAt(status), incomplete: reason, output: s.doneItems(), usage: s.usage})
	s.done = true
}

func (s *Stream) doneItems() []any {
	out := make([]any, 0, len(s.items))
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
	resp := s.responseEvent("response.created", responseState{status: "in_progress"})
	if resp == nil {
		return // the error is recorded
	}
	mark, err := s.openEvent("response.in_progress", `,"response":`)
	s.enc.buf = append(s.enc.buf, resp...) // the same Response
	s.closeEvent("response.in_progress", mark, err)
}
