package intercept

// The code_interpreter_call items the translator makes of the stand-in's function calls, and
// their events.

import (
	"encoding/json"
	"errors"

	"github.com/ciproxy/ciproxy/internal/intercept/argstream"
)

// startCall announces a stand-in call as a code_interpreter_call, in the container handed over.
func (t *translator) startCall(s *slot) []Event {
	s.ours = true
	if t.holdFrom < 0 && t.inContainer(s) {
		t.holdFrom = s.at
	}
	if s.shell {
		return t.startShellCall(s)
	}
	s.dec = argstream.New("code")
	s.ciID = t.mint("ci_")
	t.started++
	return []Event{
		newItemEvent(evItemAdded, s.index, ciItem(s.ciID, "in_progress", "", t.container, nil, false)),
		newCallEvent(evCallInProgress, s.index, s.ciID),
	}
}

// feedArgs streams a chunk of the call's arguments as code deltas.
func (t *translator) feedArgs(s *slot, chunk string) []Event {
	if t.argsOver(s, len(chunk)) {
		return nil
	}
	s.args.WriteString(chunk)
	if s.shell {
		return t.feedCommands(s, chunk)
	}
	if d := s.dec.Write(chunk); d != "" {
		s.streamed.WriteString(d)
		return []Event{{Type: evCallCodeDelta, minted: codeDeltaEvent{callEvent{head{Type: evCallCodeDelta}, s.index, s.ciID}, d}}}
	}
	return nil
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
	if s.shell {
		return append(evs, t.commandsDone(s, args)...)
	}
	var m map[string]any
	if s.parseErr = t.sizeErr(s, len(args)); s.parseErr != nil {
		// Over max_code_size: not decoded, not run.
	} else if err := json.Unmarshal([]byte(args), &m); err != nil {
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
	return append(evs, Event{Type: evCallCodeDone, minted: codeDoneEvent{callEvent{head{Type: evCallCodeDone}, s.index, s.ciID}, s.code}})
}

// interpreting returns the event sent before call ref runs (or is skipped).
func (t *translator) interpreting(ref int) Event {
	s := t.slots[ref]
	return newCallEvent(evCallInterpreting, s.index, s.ciID)
}

// executed records call ref's execution and returns its closing events.
func (t *translator) executed(ref int, ex execution) []Event {
	s := t.slots[ref]
	item := ciItem(s.ciID, ex.status, s.code, t.container, &ex, t.req.includeOutputs)
	t.out[s.index] = item
	if !t.req.includeOutputs {
		// Kept for a GET of the stored response that includes code_interpreter_call.outputs.
		if t.withOutputs == nil {
			t.withOutputs = map[int][]byte{}
		}
		t.withOutputs[s.index] = ciItem(s.ciID, ex.status, s.code, t.container, &ex, true)
	}
	return []Event{
		newCallEvent(evCallCompleted, s.index, s.ciID),
		newItemEvent(evItemDone, s.index, item),
	}
}
