package jsondepth

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func TestWithin(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	tests := []struct {
		name string
		in   string
		max  int
		want bool
	}{
		{"empty text is within any bound", "", 0, true},
		{"a scalar nests zero levels", `"x"`, 0, true},
		{"one object is one level", `{"a":1}`, 1, true},
		{"one object is over a zero bound", `{"a":1}`, 0, false},
		{"exactly max levels pass", deep(512), 512, true},
		{"max plus one fails", deep(513), 512, false},
		{"mixed objects and arrays count alike", `{"a":[{"b":[1]}]}`, 3, false},
		{"siblings do not add up", `[[1],[2],[3],{"a":[]}]`, 3, true},
		{"brackets inside strings do not count", `["[[[[{{{{"]`, 1, true},
		{"an escaped quote does not end the string", `["\"[[[[["]`, 1, true},
		{"an escaped backslash before a quote ends the string", `["\\",[[1]]]`, 2, false},
		{"an unterminated string hides nothing", `[["` + strings.Repeat("[", 1000), 2, true},
		{"unclosed openers count", strings.Repeat("[", 10), 9, false},
		{"stray closers earn no credit", strings.Repeat("]", 100) + strings.Repeat("[", 10), 9, false},
		{"a deep value after valid fields", `{"model":"m","input":` + deep(600) + `}`, 512, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Within([]byte(tt.in), tt.max); got != tt.want {
				t.Errorf("Within(%.40q, %d) = %v; want %v", tt.in, tt.max, got, tt.want)
			}
		})
	}
}

// TestValidTenMillionLevels is the regression for the crash: gjson's validator alone overflows the
// stack (a fatal error, not a panic) on this input.
func TestValidTenMillionLevels(t *testing.T) {
	for _, b := range [][]byte{
		bytes.Repeat([]byte("["), 10_000_000),
		append(append([]byte(`{"type":"response.completed","response":`), bytes.Repeat([]byte(`{"a":`), 2_000_000)...), '1'),
	} {
		if Valid(b) {
			t.Errorf("Valid(%.30q...) = true; want false", b)
		}
	}
	if !Valid([]byte(`{"model":"gpt","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}]}`)) {
		t.Error("Valid(an ordinary request) = false; want true")
	}
}

// maxDepth is the reference: encoding/json's tokenizer, for valid texts only.
func maxDepth(b []byte) (int, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	depth, most := 0, 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return most, true
		}
		if err != nil {
			return 0, false
		}
		if d, ok := tok.(json.Delim); ok {
			if d == '[' || d == '{' {
				depth++
				most = max(most, depth)
			} else {
				depth--
			}
		}
	}
}

// FuzzWithin checks Within against encoding/json's tokenizer on every valid text, and that Valid
// never crashes on anything.
func FuzzWithin(f *testing.F) {
	for _, s := range []string{
		`{"a":[1,2,{"b":"[\"{"}]}`, `[[[[[[[[]]]]]]]]`, `"\\\""`, `{"x":"\\"}`, `[`,
		strings.Repeat("[", 600), strings.Repeat(`{"a":`, 300) + "1" + strings.Repeat("}", 300),
	} {
		f.Add([]byte(s), 4)
	}
	f.Fuzz(func(t *testing.T, b []byte, limit int) {
		if limit < 0 || limit > 1000 {
			return
		}
		got := Within(b, limit)
		_ = Valid(b)
		if d, ok := maxDepth(b); ok && json.Valid(b) {
			if want := d <= limit; got != want {
				t.Fatalf("Within(%q, %d) = %v; depth is %d", b, limit, got, d)
			}
		}
	})
}

// body4K is an ordinary Responses request of about 4 KiB.
func body4K() []byte {
	var b strings.Builder
	b.WriteString(`{"model":"gpt-4.1","stream":true,"tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"input":[`)
	for i := 0; b.Len() < 4000; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":[{"type":"input_text","text":"Plot the \"sum\" of [1, 2, 3] and {x}."}]}`)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// BenchmarkWithin4K is the cost the depth check adds per request; BenchmarkGjsonValid4K is the
// validation every request already paid before the check existed, measured in the same run as the
// baseline, and BenchmarkValid4K both together, as requests now pay.
func BenchmarkWithin4K(b *testing.B) {
	body := body4K()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if !Within(body, Max) {
			b.Fatal("ordinary body refused")
		}
	}
}

func BenchmarkGjsonValid4K(b *testing.B) {
	body := body4K()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if !gjson.ValidBytes(body) {
			b.Fatal("ordinary body refused")
		}
	}
}

func BenchmarkValid4K(b *testing.B) {
	body := body4K()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if !Valid(body) {
			b.Fatal("ordinary body refused")
		}
	}
}
