package argstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// oracle returns what json.Unmarshal makes of args' top-level "code" field, and whether the
// streaming property applies: args is a JSON object, code is a string, and it appears once.
func oracle(t testing.TB, args, field string) (string, bool) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(args), &m); err != nil {
		return "", false
	}
	if countKey(t, args, field) > 1 {
		return "", false
	}
	v, ok := m[field]
	if !ok {
		return "", true // absent: no deltas
	}
	s, ok := v.(string)
	if !ok {
		return "", true // not a string: no deltas
	}
	return s, true
}

// countKey counts the top-level occurrences of field in a valid JSON object.
func countKey(t testing.TB, args, field string) int {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(args))
	if _, err := dec.Token(); err != nil {
		t.Fatalf("countKey: %v", err)
	}
	n := 0
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("countKey: %v", err)
		}
		if tok.(string) == field {
			n++
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatalf("countKey: %v", err)
		}
	}
	return n
}

// feed writes chunks to a new Decoder and checks each delta is valid UTF-8 when the input is.
func feed(t testing.TB, field string, chunks []string) (string, *Decoder) {
	t.Helper()
	d := New(field)
	var b strings.Builder
	for _, c := range chunks {
		delta := d.Write(c)
		if !utf8.ValidString(delta) {
			t.Fatalf("Write(%q) = %q: invalid UTF-8 (chunks %q)", c, delta, chunks)
		}
		b.WriteString(delta)
	}
	return b.String(), d
}

// splitAt cuts s at the given byte positions.
func splitAt(s string, cuts ...int) []string {
	var out []string
	prev := 0
	for _, c := range cuts {
		out = append(out, s[prev:c])
		prev = c
	}
	return append(out, s[prev:])
}

// everySplit checks the property for every way of cutting args in two and in three pieces.
func everySplit(t *testing.T, args, want string) {
	t.Helper()
	for i := 0; i <= len(args); i++ {
		if got, _ := feed(t, "code", splitAt(args, i)); got != want {
			t.Fatalf("split at %d: got %q, want %q", i, got, want)
		}
		for j := i; j <= len(args) && len(args) <= 200; j++ {
			if got, _ := feed(t, "code", splitAt(args, i, j)); got != want {
				t.Fatalf("split at %d,%d: got %q, want %q", i, j, got, want)
			}
		}
	}
}

func TestDecoder(t *testing.T) {
	tests := []struct {
		name     string
		args     string
		want     string
		complete bool
		syntax   bool // Err wraps ErrSyntax at the end
	}{
		{name: "plain", args: `{"code":"print(1)"}`, want: "print(1)", complete: true},
		{name: "empty value", args: `{"code":""}`, want: "", complete: true},
		{name: "whitespace everywhere", args: " \n{ \t\"code\"\r\n :\n \"x = 1\" \n}\n ", want: "x = 1", complete: true},
		{name: "simple escapes", args: `{"code":"a\nb\tc\\d\"e\/f\bg\fh\ri"}`, want: "a\nb\tc\\d\"e/f\bg\fh\ri", complete: true},
		{name: "unicode escape", args: `{"code":"caf\u00e9 \u20AC"}`, want: "café €", complete: true},
		{name: "surrogate pair", args: `{"code":"\ud83d\ude00!"}`, want: "😀!", complete: true},
		{name: "lone high surrogate then text", args: `{"code":"\ud83dx"}`, want: "\uFFFDx", complete: true},
		{name: "lone high surrogate at end", args: `{"code":"\ud83d"}`, want: "\uFFFD", complete: true},
		{name: "high surrogate then escape", args: `{"code":"\ud83d\n"}`, want: "\uFFFD\n", complete: true},
		{name: "two high surrogates", args: `{"code":"\ud83d\ud83d\ude00"}`, want: "\uFFFD😀", complete: true},
		{name: "lone low surrogate", args: `{"code":"\ude00a"}`, want: "\uFFFDa", complete: true},
		{name: "raw multibyte", args: `{"code":"é€😀"}`, want: "é€😀", complete: true},
		{name: "invalid utf8 byte", args: "{\"code\":\"a\xffb\"}", want: "a\uFFFDb", complete: true},
		{name: "truncated utf8 before quote", args: "{\"code\":\"a\xe2\x82\"}", want: "a\uFFFD\uFFFD", complete: true},
		{name: "field not first", args: `{"other":1,"code":"x"}`, want: "x", complete: true},
		{name: "nested values before", args: `{"a":{"code":"no","b":[1,{"c":"}"}],"d":"]\"{"},"e":[[],{}],"f":true,"g":null,"h":-1.5e+3,"code":"yes"}`, want: "yes", complete: true},
		{name: "field after", args: `{"code":"x","other":{"a":[1,2]}}`, want: "x", complete: true},
		{name: "escaped key", args: `{"\u0063ode":"k"}`, want: "k", complete: true},
		{name: "similar keys", args: `{"cod":"1","codes":"2","Code":"3","code":"4"}`, want: "4", complete: true},
		{name: "key containing quote", args: `{"co\"de":"1","code":"2"}`, want: "2", complete: true},
		{name: "value not a string", args: `{"code":123}`, want: ""},
		{name: "value null", args: `{"code":null}`, want: ""},
		{name: "value object", args: `{"code":{"code":"inner"}}`, want: ""},
		{name: "absent", args: `{"language":"python"}`, want: ""},
		{name: "empty object", args: `{}`, want: ""},
		{name: "duplicate keeps first", args: `{"code":"a","code":"b"}`, want: "a", complete: true},
		{name: "raw python", args: "print('hi')\n", want: "", syntax: true},
		{name: "python starting with brace", args: `{1, 2}`, want: "", syntax: true},
		{name: "array", args: `["code"]`, want: "", syntax: true},
		{name: "markdown fence", args: "```python\nprint(1)\n```", want: "", syntax: true},
		{name: "truncated", args: `{"code":"print(1`, want: "print(1"},
		{name: "bad escape stops", args: `{"code":"a\qb"}`, want: "a", syntax: true},
		{name: "bad unicode escape stops", args: `{"code":"a\u12x4b"}`, want: "a", syntax: true},
		{name: "garbage after object", args: `{"code":"a"} x`, want: "a", complete: true, syntax: true},
		{name: "mismatched bracket before", args: `{"a":[1},"code":"x"}`, want: "", syntax: true},
		{name: "missing colon", args: `{"code" "x"}`, want: "", syntax: true},
		{name: "raw newline in value", args: "{\"code\":\"a\nb\"}", want: "a\nb", complete: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, d := feed(t, "code", []string{tt.args})
			if got != tt.want {
				t.Errorf("Write(%q) = %q; want %q", tt.args, got, tt.want)
			}
			if d.Complete() != tt.complete {
				t.Errorf("Complete() = %v; want %v", d.Complete(), tt.complete)
			}
			if err := d.Err(); errors.Is(err, ErrSyntax) != tt.syntax {
				t.Errorf("Err() = %v; want syntax error %v", err, tt.syntax)
			}
			// Every chunking gives the same result.
			everySplit(t, tt.args, tt.want)
			// Byte by byte too.
			var chunks []string
			for i := range len(tt.args) {
				chunks = append(chunks, tt.args[i:i+1])
			}
			if got, _ := feed(t, "code", chunks); got != tt.want {
				t.Errorf("byte by byte: got %q; want %q", got, tt.want)
			}
			// Where json.Unmarshal accepts the input, the result is what it decodes.
			if w, ok := oracle(t, tt.args, "code"); ok && w != got && countKey(t, tt.args, "code") < 2 {
				t.Errorf("json.Unmarshal gives %q; Decoder gave %q", w, got)
			}
		})
	}
}

func TestDecoderStates(t *testing.T) {
	d := New("code")
	steps := []struct {
		chunk             string
		want              string
		started, complete bool
	}{
		{`{"language":"py`, "", false, false},
		{`thon","co`, "", false, false},
		{`de": "`, "", true, false},
		{`x\u00`, "x", true, false},
		{`e9\ud83d`, "é", true, false},
		{`\ude`, "", true, false},
		{`00y"`, "😀y", true, true},
		{`}`, "", true, true},
	}
	for i, s := range steps {
		if got := d.Write(s.chunk); got != s.want {
			t.Errorf("step %d: Write(%q) = %q; want %q", i, s.chunk, got, s.want)
		}
		if d.Started() != s.started || d.Complete() != s.complete {
			t.Errorf("step %d: Started, Complete = %v, %v; want %v, %v", i, d.Started(), d.Complete(), s.started, s.complete)
		}
	}
	if d.Err() != nil {
		t.Errorf("Err() = %v; want nil", d.Err())
	}
	if d.Duplicate() {
		t.Error("Duplicate() = true; want false")
	}
	// Writes after a syntax error return nothing.
	if got := d.Write(`,"code":"z"`); got != "" || d.Err() == nil {
		t.Errorf("Write after end = %q, Err %v; want \"\" and a syntax error", got, d.Err())
	}
}

func TestDecoderDuplicate(t *testing.T) {
	got, d := feed(t, "code", []string{`{"code":"a",`, `"code":"b"}`})
	if got != "a" || !d.Duplicate() {
		t.Errorf("got %q, Duplicate %v; want \"a\", true", got, d.Duplicate())
	}
}

func TestDecoderOtherField(t *testing.T) {
	got, _ := feed(t, "input", []string{`{"code":"no","input":"yes"}`})
	if got != "yes" {
		t.Errorf("field input: got %q; want \"yes\"", got)
	}
}

// randString makes a string rich in what breaks streaming decoders.
func randString(r *rand.Rand) string {
	pieces := []string{"a", "print(x)", " ", "\n", "\r\n", "\t", "\"", "\\", "/", "é", "€", "😀", "\u2028", "<>&", "\x00", "\x1f", "{", "}", "[", "]", ":", ","}
	var b strings.Builder
	for range r.IntN(40) {
		if r.IntN(8) == 0 {
			b.WriteRune(rune(r.IntN(0x10FFFF)))
		} else {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
	}
	return b.String()
}

// quote encodes s as a JSON string, escaping at random: \uXXXX (with surrogate pairs) or the
// short escapes, so that every escape form appears in the input.
func quote(r *rand.Rand, s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteRune(c)
		case c == '\n' && r.IntN(2) == 0:
			b.WriteString(`\n`)
		case c == '/' && r.IntN(2) == 0:
			b.WriteString(`\/`)
		case c < 0x20 || r.IntN(4) == 0:
			if c >= 0x10000 {
				hi, lo := (c-0x10000)>>10+0xD800, (c-0x10000)&0x3FF+0xDC00
				fmt.Fprintf(&b, `\u%04x\u%04X`, hi, lo)
			} else if c >= 0xD800 && c < 0xE000 || c == utf8.RuneError {
				b.WriteString(`\ufffd`)
			} else {
				fmt.Fprintf(&b, `\u%04x`, c)
			}
		default:
			b.WriteRune(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func randValue(r *rand.Rand, depth int) string {
	switch n := r.IntN(7); {
	case n == 0 && depth < 4:
		var parts []string
		for range r.IntN(4) {
			parts = append(parts, quote(r, randString(r))+":"+randValue(r, depth+1))
		}
		return "{" + strings.Join(parts, ",") + "}"
	case n == 1 && depth < 4:
		var parts []string
		for range r.IntN(4) {
			parts = append(parts, randValue(r, depth+1))
		}
		return "[ " + strings.Join(parts, " , ") + "]"
	case n == 2:
		return []string{"true", "false", "null", "0", "-12.5e+3", "1E2"}[r.IntN(6)]
	default:
		return quote(r, randString(r))
	}
}

func randArgs(r *rand.Rand) string {
	var parts []string
	code := false
	for range r.IntN(5) {
		parts = append(parts, quote(r, []string{"language", "x", "cod", "codes"}[r.IntN(4)])+":"+randValue(r, 0))
	}
	if r.IntN(8) != 0 {
		parts = append(parts, quote(r, "code")+": "+quote(r, randString(r)))
		code = true
	}
	for range r.IntN(3) {
		parts = append(parts, `"after"`+":"+randValue(r, 0))
	}
	r.Shuffle(len(parts), func(i, j int) { parts[i], parts[j] = parts[j], parts[i] })
	_ = code
	ws := []string{"", " ", "\n", "\t ", "\r\n"}
	return ws[r.IntN(len(ws))] + "{" + ws[r.IntN(len(ws))] + strings.Join(parts, ","+ws[r.IntN(len(ws))]) + "}" + ws[r.IntN(len(ws))]
}

// chunk cuts s into pieces of random small lengths, as an upstream's deltas are.
func chunk(r *rand.Rand, s string) []string {
	var out []string
	for len(s) > 0 {
		n := 1 + r.IntN(min(len(s), 1+r.IntN(12)))
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}

func TestDecoderProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	checked := 0
	// The fuzz target explores further; this keeps the default run quick, also under -race.
	for range 800 {
		args := randArgs(r)
		want, ok := oracle(t, args, "code")
		if !ok {
			continue
		}
		checked++
		for range 4 {
			chunks := chunk(r, args)
			got, d := feed(t, "code", chunks)
			if got != want {
				t.Fatalf("chunks %q:\ngot  %q\nwant %q", chunks, got, want)
			}
			if d.Err() != nil {
				t.Fatalf("chunks %q: Err() = %v for valid JSON", chunks, d.Err())
			}
		}
	}
	if checked < 500 {
		t.Fatalf("only %d generated inputs were valid; the generator is broken", checked)
	}
}

func FuzzDecoder(f *testing.F) {
	f.Add(`{"code":"print(1)"}`, []byte{1, 2, 3})
	f.Add(`{"other":{"a":["}",1]},"code":"\ud83d\ude00\u00e9\n\"x\""}`, []byte{0, 5, 7, 1, 1, 1})
	f.Add(`print("hi")`, []byte{})
	f.Fuzz(func(t *testing.T, args string, cuts []byte) {
		var chunks []string
		rest := args
		for _, c := range cuts {
			if rest == "" {
				break
			}
			n := min(int(c%16), len(rest))
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		chunks = append(chunks, rest)
		d := New("code")
		var b bytes.Buffer
		for _, c := range chunks {
			b.WriteString(d.Write(c))
		}
		want, ok := oracle(t, args, "code")
		if !ok {
			return
		}
		if got := b.String(); got != want {
			t.Fatalf("chunks %q:\ngot  %q\nwant %q", chunks, got, want)
		}
	})
}

func BenchmarkDecoder(b *testing.B) {
	code := strings.Repeat("for i in range(10):\n    print(\"caf\u00e9\", i)  # 😀\n", 400)
	raw, err := json.Marshal(map[string]string{"code": code})
	if err != nil {
		b.Fatal(err)
	}
	args := string(raw)
	for _, size := range []int{4, 64, len(args)} {
		b.Run(fmt.Sprintf("chunk=%d", size), func(b *testing.B) {
			var chunks []string
			for s := args; len(s) > 0; {
				n := min(size, len(s))
				chunks = append(chunks, s[:n])
				s = s[n:]
			}
			b.SetBytes(int64(len(args)))
			b.ReportAllocs()
			for b.Loop() {
				d := New("code")
				n := 0
				for _, c := range chunks {
					n += len(d.Write(c))
				}
				if n != len(code) {
					b.Fatalf("decoded %d bytes; want %d", n, len(code))
				}
			}
		})
	}
}
