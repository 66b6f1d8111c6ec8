package chat

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestDeltaEvents holds the delta events, written from frames, to what encoding/json writes for
// the event structs in OpenAI's key order.
func TestDeltaEvents(t *testing.T) {
	type textDelta struct {
		Type           string            `json:"type"`
		SequenceNumber int               `json:"sequence_number"`
		ItemID         string            `json:"item_id"`
		OutputIndex    int               `json:"output_index"`
		ContentIndex   int               `json:"content_index"`
		Delta          string            `json:"delta"`
		Logprobs       []json.RawMessage `json:"logprobs,omitempty"`
	}
	type argsDelta struct {
		Type           string `json:"type"`
		SequenceNumber int    `json:"sequence_number"`
		ItemID         string `json:"item_id"`
		OutputIndex    int    `json:"output_index"`
		Delta          string `json:"delta"`
	}
	encode := func(v any) string {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		return string(bytes.TrimSuffix(b.Bytes(), []byte("\n")))
	}
	lp := []json.RawMessage{json.RawMessage(`{"token":"a","logprob":-0.5,"bytes":[97],"top_logprobs":[]}`)}
	for _, tc := range []struct {
		name     string
		kind     partKind
		call     bool
		delta    string
		logprobs []json.RawMessage
	}{
		{name: "text", kind: textPart, delta: "word "},
		{name: "text with logprobs", kind: textPart, delta: "a", logprobs: lp},
		{name: "escapes", kind: textPart, delta: "<a href=\"x\">&</a>\\\n\t\x01\u2028\u2029é😀\uFFFD"},
		{name: "empty", kind: textPart, delta: ""},
		{name: "reasoning", kind: reasoningPart, delta: "think <b>"},
		{name: "refusal", kind: refusalPart, delta: "no & no"},
		{name: "arguments", call: true, delta: `{"code": "print(\"<&>\")\n"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Stream{enc: newEncoder(), seq: 41}
			it := &streamItem{id: "msg_0123456789abcdef", index: 3}
			var want string
			if tc.call {
				s.argsDelta(it, tc.delta)
				want = encode(argsDelta{"response.function_call_arguments.delta", 41, it.id, 3, tc.delta})
			} else {
				p := &streamPart{kind: tc.kind}
				s.textDelta(it, 2, p, tc.delta, tc.logprobs)
				typ := map[partKind]string{textPart: "response.output_text.delta", reasoningPart: "response.reasoning_text.delta", refusalPart: "response.refusal.delta"}[tc.kind]
				want = encode(textDelta{typ, 41, it.id, 3, 2, tc.delta, tc.logprobs})
				if tc.kind == textPart && tc.logprobs == nil {
					want = want[:len(want)-1] + `,"logprobs":[]}`
				}
			}
			if s.encErr != nil {
				t.Fatal(s.encErr)
			}
			if len(s.out) != 1 {
				t.Fatalf("%d events, want 1", len(s.out))
			}
			if got := string(s.out[0].Data); got != want {
				t.Errorf("got  %s\nwant %s", got, want)
			}
			if s.seq != 42 {
				t.Errorf("seq %d after the event, want 42", s.seq)
			}
		})
	}
}
