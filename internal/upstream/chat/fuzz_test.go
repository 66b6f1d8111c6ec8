package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/sse"
	"github.com/ciproxy/ciproxy/internal/testutil/streamcheck"
)

// deeplyNested returns a Responses body whose key sits under n levels of objects and arrays.
func deeplyNested(key string, n int) []byte {
	return []byte(`{"model":"m","input":"x","` + key + `":` + strings.Repeat(`{"a":[`, n) + "1" + strings.Repeat("]}", n) + `}`)
}

// FuzzNewChatRequest feeds any body to the request translation. It must not panic or modify its
// input; a body it refuses gives a 400 that wraps ErrInvalid or ErrUnsupported; a body it
// accepts gives a JSON object with messages, whose Response renders.
func FuzzNewChatRequest(f *testing.F) {
	for _, seed := range []string{
		`{}`, `[]`, `null`, `"x"`, `{"model":"m"}`, `{"model":"m","input":"hi","stream":true}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"https://x"}]},` +
			`{"type":"reasoning","content":[{"type":"reasoning_text","text":"r"}]},{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},` +
			`{"type":"function_call_output","call_id":"a","output":[{"type":"input_text","text":"o"}]}],"tools":[{"type":"function","name":"f","strict":true}],` +
			`"tool_choice":{"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"f"}]},"text":{"format":{"type":"json_schema","name":"n","schema":{}}},` +
			`"reasoning":{"effort":"low"},"include":["message.output_text.logprobs"],"top_logprobs":2,"metadata":{"k":"v"},"top_k":3}`,
		`{"model":"m","input":"x","background":true}`, `{"model":"m","input":"x","tools":[{"type":"web_search"}]}`,
	} {
		f.Add([]byte(seed))
	}
	for _, key := range []string{"metadata", "reasoning", "tools", "input", "text", "top_k"} {
		f.Add(deeplyNested(key, 12000))
	}
	chat := []byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"a","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1}}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := bytes.Clone(body)
		for _, opts := range []Options{{}, {ReasoningField: "reasoning_content", MaxCompletionTokens: true}} {
			r, err := NewRequest(body, opts)
			if !bytes.Equal(body, orig) {
				t.Fatal("NewRequest modified its input")
			}
			if err != nil {
				var ae *apierror.Error
				if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !(errors.Is(err, ErrInvalid) || errors.Is(err, ErrUnsupported)) {
					t.Fatalf("NewRequest(%q) error = %#v; want a 400 wrapping a sentinel", clipBytes(body), err)
				}
				continue
			}
			var out struct {
				Messages []json.RawMessage `json:"messages"`
			}
			if err := json.Unmarshal(r.Body, &out); err != nil || out.Messages == nil {
				t.Fatalf("Body = %q (%v) for accepted input %q", clipBytes(r.Body), err, clipBytes(body))
			}
			resp, err := r.Response(chat, "resp_f", 1)
			if err != nil || !json.Valid(resp) {
				t.Fatalf("Response() = %q, %v for accepted input %q", clipBytes(resp), err, clipBytes(body))
			}
		}
	})
}

// FuzzChatStream feeds any byte stream, read as server-sent events, to the stream translation.
// It must not panic; its errors wrap ErrStream or ErrShape; each event's data is JSON
// on one line; and what it emits, ended by Fail on an error, is always a valid Responses stream.
func FuzzChatStream(f *testing.F) {
	cases, _ := filepath.Glob("testdata/*.chat.sse")
	for _, c := range cases {
		b, err := os.ReadFile(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("data: " + string(deeplyNested("choices", 12000)) + "\n\n"))
	f.Add([]byte(`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":{"a":[1]}}}]},"finish_reason":"tool_calls"}]}` + "\n\n"))
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\n" + `data: "delta":{"content":"a"},"logprobs":{"content":[{"token":"a",` + "\ndata: " + `"logprob":0}]},"finish_reason":"stop"}]}` + "\n\n"))
	req, err := NewRequest([]byte(`{"model":"m","input":"x","stream":true,"include":["message.output_text.logprobs"]}`), Options{NewID: counterIDs()})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		s := req.NewStream("resp_f", 1)
		var out bytes.Buffer
		write := func(evs []sse.Event) {
			for _, ev := range evs {
				if !json.Valid(ev.Data) || bytes.ContainsAny(ev.Data, "\r\n") {
					t.Fatalf("event %s data %q is not JSON on one line", ev.Name, clipBytes(ev.Data))
				}
				fmt.Fprintf(&out, "event: %s\ndata: %s\n\n", ev.Name, ev.Data)
			}
		}
		rd := sse.NewReader(bytes.NewReader(stream))
		for !s.Done() {
			ev, rerr := rd.Next()
			var evs []sse.Event
			var err error
			switch {
			case rerr == io.EOF:
				evs, err = s.End()
			case rerr != nil:
				write(s.Fail(rerr))
				continue
			default:
				evs, err = s.Next(ev.Data)
			}
			write(evs)
			if err != nil {
				if !errors.Is(err, ErrStream) && !errors.Is(err, ErrShape) {
					t.Fatalf("error %v wraps no sentinel", err)
				}
				write(s.Fail(err))
			}
		}
		if _, err := streamcheck.Check(out.Bytes()); err != nil {
			t.Fatalf("invalid Responses stream: %v\ninput %q\noutput:\n%s", err, clipBytes(stream), clipBytes(out.Bytes()))
		}
	})
}

// FuzzChatResponse feeds any body to the JSON answer translation: no panic, a typed error or a
// JSON Response.
func FuzzChatResponse(f *testing.F) {
	for _, seed := range []string{
		`{"choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"stop"}]}`,
		`{"choices":[{"index":0,"message":{"reasoning_content":"r","tool_calls":[{"id":"c","function":{"name":"f","arguments":{}}}]},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":1}}}`,
		`{"error":{"message":"x","code":400}}`, `{"object":"error","message":"x"}`, `[]`, `{"choices":[]}`,
		`{"choices":[{"index":0,"message":{"content":[{"type":"text","text":"a"}]},"logprobs":{"content":[{"token":"a","logprob":0}]}}]}`,
		string(deeplyNested("choices", 12000)),
	} {
		f.Add([]byte(seed))
	}
	req, err := NewRequest([]byte(`{"model":"m","input":"x","include":["message.output_text.logprobs"]}`), Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := bytes.Clone(body)
		resp, err := req.Response(body, "resp_f", 1)
		if !bytes.Equal(body, orig) {
			t.Fatal("Response modified its input")
		}
		if err != nil {
			var ae *apierror.Error
			if !errors.As(err, &ae) || ae.Status < 400 || ae.Message == "" {
				t.Fatalf("Response(%q) error = %#v; want an *apierror.Error", clipBytes(body), err)
			}
			return
		}
		if !json.Valid(resp) {
			t.Fatalf("Response(%q) = %q; not JSON", clipBytes(body), clipBytes(resp))
		}
	})
}

// clipBytes shortens b for a failure message.
func clipBytes(b []byte) []byte {
	if len(b) > 2000 {
		return append(bytes.Clone(b[:2000]), "…"...)
	}
	return b
}

// FuzzVerbatim holds verbatim to its promise: a JSON string it lets through (from a chunk that is
// valid JSON and valid UTF-8, as Next sees it) is exactly what the encoder writes for its text.
func FuzzVerbatim(f *testing.F) {
	for _, s := range []string{`"word "`, `"a\u2028b"`, "\"a\u2028b\"", "\"\u2029\"", `"<&>"`, `"é😀"`, `""`, `"\\"`, `"a\"b"`, "\"\xe2\x80\"", "\"\xe2\""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if !utf8.ValidString(raw) || !gjson.Valid(raw) {
			return
		}
		v := gjson.Parse(raw)
		raw = v.Raw // as Next reads it: without the spaces around it
		if v.Type != gjson.String || !verbatim(raw) {
			return
		}
		enc := newEncoder()
		if err := enc.encode(v.Str); err != nil {
			t.Fatal(err)
		}
		if string(enc.buf) != raw {
			t.Fatalf("verbatim(%q), but the encoder writes %q", raw, enc.buf)
		}
	})
}
