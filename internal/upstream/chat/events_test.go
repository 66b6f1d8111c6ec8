package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/tidwall/gjson"
)

// TestDeltaEvents holds the delta events, written from frames, to what encoding/json writes for
// the event structs in OpenAI's key order.
func TestDeltaEvents(t *testing.T) {
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
		{name: "line separator", kind: textPart, delta: "a\u2028b é <&>"},
		{name: "paragraph separator", kind: textPart, delta: "a\u2029b"},
		{name: "reasoning", kind: reasoningPart, delta: "think <b>"},
		{name: "refusal", kind: refusalPart, delta: "no & no"},
		{name: "arguments", call: true, delta: `{"code": "print(\"<&>\")\n"}`},
	} {
		// The delta as upstreams write it: no JSON of theirs, encoding/json's with and without
		// HTML escaped, and every character escaped. Each gives the same event.
		raws := map[string]string{"none": "", "plain": encode(tc.delta), "html": string(must(json.Marshal(tc.delta))), "escaped": escapeAll(tc.delta)}
		if !strings.ContainsFunc(tc.delta, func(r rune) bool { return r < ' ' || r == '"' || r == '\\' }) {
			raws["literal"] = `"` + tc.delta + `"` // U+2028 and U+2029 too, unescaped
		}
		for form, raw := range raws {
			t.Run(tc.name+"/"+form, func(t *testing.T) {
				if raw != "" {
					if v := gjson.Parse(raw); v.Str != tc.delta {
						t.Fatalf("raw %s reads as %q, not the delta", raw, v.Str)
					}
				}
				testDeltaEvent(t, tc.kind, tc.call, tc.delta, raw, tc.logprobs, encode)
			})
		}
	}
}

// testDeltaEvent sends one delta event (raw as deltaEvent takes it) and compares it with the
// event struct's encoding.
func testDeltaEvent(t *testing.T, kind partKind, call bool, delta, raw string, logprobs []json.RawMessage, encode func(any) string) {
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
	s := &Stream{enc: newEncoder(), seq: 41}
	it := &streamItem{id: "msg_0123456789abcdef", index: 3}
	var want string
	if call {
		s.argsDelta(it, delta, raw)
		want = encode(argsDelta{"response.function_call_arguments.delta", 41, it.id, 3, delta})
	} else {
		p := &streamPart{kind: kind}
		s.textDelta(it, 2, p, delta, raw, logprobs)
		typ := map[partKind]string{textPart: "response.output_text.delta", reasoningPart: "response.reasoning_text.delta", refusalPart: "response.refusal.delta"}[kind]
		want = encode(textDelta{typ, 41, it.id, 3, 2, delta, logprobs})
		if kind == textPart && logprobs == nil {
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
}

// escapeAll writes s as a JSON string with every character escaped (\uXXXX, surrogate pairs
// above the BMP), as some servers write non-ASCII text.
func escapeAll(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		if r > 0xFFFF {
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, hi, lo)
			continue
		}
		fmt.Fprintf(&b, `\u%04x`, r)
	}
	b.WriteByte('"')
	return b.String()
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestResponseFrame holds a Response written with its request's echo groups framed to the bytes
// encoding/json writes for the whole response struct, for requests that echo nothing and
// everything, and for each state a stream's snapshots take.
func TestResponseFrame(t *testing.T) {
	completed := int64(1767225700)
	states := []responseState{
		{id: "resp_1", createdAt: 1767225600, status: "in_progress"},
		{id: "resp_1", createdAt: 1767225600, completedAt: completed, status: "completed", model: "Qwen/Qwen3-8B",
			serviceTier: gjson.Parse(`"flex"`), output: []any{newTextOut("hi <&>", nil)}, usage: &responseUsage{InputTokens: 3, OutputTokens: 2, TotalTokens: 5}},
		{id: "resp_1", status: "incomplete", incomplete: "max_output_tokens"},
		{id: "resp_1", status: "failed", err: &responseError{Code: "server_error", Message: "cut \"here\""}},
	}
	for _, body := range []string{
		`{"model":"m","input":"hi","stream":true}`,
		`{"model":"m","input":"hi","instructions":"be <brief>","max_output_tokens":50,"max_tool_calls":2,"parallel_tool_calls":false,` +
			`"prompt_cache_key":"k","reasoning":{"effort":"low"},"safety_identifier":"u1","service_tier":"priority","store":false,` +
			`"temperature":0.2,"text":{"format":{"type":"json_object"}},"tool_choice":"none","top_logprobs":2,"top_p":0.9,` +
			`"truncation":"auto","user":"u","metadata":{"a":"b"},` +
			`"tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"model":{"type":"string"}}}}]}`,
	} {
		req := newTestChatRequest(t, body, Options{})
		for _, st := range states {
			enc := newEncoder()
			if err := enc.appendResponse(req.frame, req.response(st)); err != nil {
				t.Fatal(err)
			}
			var direct bytes.Buffer
			std := json.NewEncoder(&direct)
			std.SetEscapeHTML(false)
			if err := std.Encode(req.response(st)); err != nil {
				t.Fatal(err)
			}
			if got := string(enc.buf); got != strings.TrimSuffix(direct.String(), "\n") {
				t.Errorf("%s, %s:\nframed %s\nwhole  %s", body, st.status, got, direct.String())
			}
			if !json.Valid(enc.buf) {
				t.Errorf("framed Response is not JSON: %s", enc.buf)
			}
		}
	}
}
