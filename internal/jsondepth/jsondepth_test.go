package jsondepth

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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

// BenchmarkScan4K is what the request check (depth and duplicate keys at every depth) costs per
// request, to compare with BenchmarkWithin4K and BenchmarkGjsonValid4K.
func BenchmarkScan4K(b *testing.B) {
	body := body4K()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, dup, deep := Scan(body, Max); dup || deep {
			b.Fatal("ordinary body refused")
		}
	}
}

func TestScan(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	tests := []struct {
		name     string
		in       string
		max      int
		wantPath string
		wantDup  bool
		wantDeep bool
	}{
		{"an ordinary request", `{"model":"m","tools":[{"type":"function","name":"f"}],"input":[{"type":"message","content":[{"type":"input_text","text":"hi"}]}]}`, 512, "", false, false},
		{"an empty key twice", `{"":0,"":{}}`, 512, "", true, false},
		{"a top-level key twice", `{"tools":[],"input":"x","tools":[1]}`, 512, "tools", true, false},
		{"a key twice inside an array element", `{"tools":[{"type":"function"},{"type":"function","name":"f","type":"code_interpreter"}]}`, 512, "tools[1].type", true, false},
		{"once escaped", `{"a":{"type":1,"typ\u0065":2}}`, 512, "a.type", true, false},
		{"an escaped slash", `{"a\/b":1,"a/b":2}`, 512, "a/b", true, false},
		{"invalid UTF-8 decodes to one replacement", "{\"a\xff\":1,\"a\xfe\":2}", 512, "a\uFFFD", true, false},
		{"siblings may share keys", `[{"a":1},{"a":2}]`, 512, "", false, false},
		{"a parent and its child may share keys", `{"a":{"a":{"a":1}}}`, 512, "", false, false},
		{"a value equal to a key is no key", `{"a":"b","b":"a"}`, 512, "", false, false},
		{"keys in strings do not count", `{"a":"{\"a\":1,\"a\":2}"}`, 512, "", false, false},
		{"deep in arrays of arrays", `{"x":[[1],[2,{"k":1,"k":2}]]}`, 512, "x[1][1].k", true, false},
		{"many keys, one repeated", `{` + manyKeys(500) + `,"k7":0}`, 512, "k7", true, false},
		{"many distinct keys", `{` + manyKeys(500) + `}`, 512, "", false, false},
		{"exactly max levels pass", deep(512), 512, "", false, false},
		{"max plus one is deep", deep(513), 512, "", false, true},
		{"stray closers earn no credit", strings.Repeat("]", 100) + strings.Repeat("[", 10), 9, "", false, true},
		{"an unterminated string hides nothing", `{"a":1,"a` + strings.Repeat("[", 1000), 2, "", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, dup, deep := Scan([]byte(tt.in), tt.max)
			if path != tt.wantPath || dup != tt.wantDup || deep != tt.wantDeep {
				t.Errorf("Scan(%.60q, %d) = %q, %v, %v; want %q, %v, %v", tt.in, tt.max, path, dup, deep, tt.wantPath, tt.wantDup, tt.wantDeep)
			}
		})
	}
}

func manyKeys(n int) string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf(`"k%d":%d`, i, i)
	}
	return strings.Join(keys, ",")
}

// hasDuplicate is the reference: encoding/json's decoder, a map of the decoded keys per object.
func hasDuplicate(dec *json.Decoder) (bool, error) {
	tok, err := dec.Token()
	if err != nil {
		return false, err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return false, nil
	}
	found := false
	seen := map[string]bool{}
	for dec.More() {
		if d == '{' {
			k, err := dec.Token()
			if err != nil {
				return false, err
			}
			found = found || seen[k.(string)]
			seen[k.(string)] = true
		}
		f, err := hasDuplicate(dec)
		if err != nil {
			return false, err
		}
		found = found || f
	}
	_, err = dec.Token() // the closer
	return found, err
}

// FuzzScan checks Scan against encoding/json on every valid text: a duplicate key wherever
// encoding/json decodes two equal keys in one object, none elsewhere, and the depth as Within.
func FuzzScan(f *testing.F) {
	for _, s := range []string{
		`{"a":1,"a":2}`, `{"a":{"b":1,"c":{"b":2}},"d":[{"e":1,"e":2}]}`, `{"t\u0079pe":1,"type":2}`,
		"{\"\xff\":1,\"\xfe\":2}", `[{"a":[{"a":1}]},{"a":1}]`, `{"a":"\"a\":1"}`, `{` + manyKeys(20) + `,"k3":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		path, dup, deep := Scan(b, Max)
		if deep != !Within(b, Max) {
			t.Fatalf("Scan(%q) deep = %v; Within disagrees", b, deep)
		}
		if deep || !json.Valid(b) {
			return
		}
		// UseNumber: a valid number need not fit a float64 ("1E700").
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		want, err := hasDuplicate(dec)
		if err != nil {
			t.Fatalf("reference on valid %q: %v", b, err)
		}
		if dup != want {
			t.Fatalf("Scan(%q) = %q, %v; encoding/json finds a duplicate: %v", b, path, dup, want)
		}
	})
}
