package e2btest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// The code-interpreter server writes each /execute line with Python's json.dumps(...) defaults:
// ", " and ": " separators, ensure_ascii (every non-ASCII character as a lowercase \uXXXX escape,
// astral ones as surrogate pairs), no HTML escaping, and fields in the pydantic model's declaration
// order with None fields left out. pyLine reproduces that text byte for byte.

// pyObject builds one JSON object in Python's json.dumps format.
type pyObject struct {
	b     bytes.Buffer
	first bool
}

func newPyObject() *pyObject {
	o := &pyObject{first: true}
	o.b.WriteByte('{')
	return o
}

func (o *pyObject) key(k string) {
	if !o.first {
		o.b.WriteString(", ")
	}
	o.first = false
	writePyString(&o.b, k)
	o.b.WriteString(": ")
}

func (o *pyObject) str(k, v string) {
	o.key(k)
	writePyString(&o.b, v)
}

func (o *pyObject) int(k string, v int) {
	o.key(k)
	fmt.Fprintf(&o.b, "%d", v)
}

func (o *pyObject) bool(k string, v bool) {
	o.key(k)
	if v {
		o.b.WriteString("true")
	} else {
		o.b.WriteString("false")
	}
}

// raw writes an arbitrary JSON value re-rendered in Python's format, keys in their original order.
func (o *pyObject) raw(k string, v json.RawMessage) error {
	o.key(k)
	return writePyRaw(&o.b, v)
}

// line closes the object and returns it with its "\n".
func (o *pyObject) line() []byte {
	o.b.WriteString("}\n")
	return o.b.Bytes()
}

// writePyString writes s as json.dumps(s) with ensure_ascii=True does.
func writePyString(b *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch c {
			case '"':
				b.WriteString(`\"`)
			case '\\':
				b.WriteString(`\\`)
			case '\n':
				b.WriteString(`\n`)
			case '\r':
				b.WriteString(`\r`)
			case '\t':
				b.WriteString(`\t`)
			case '\b':
				b.WriteString(`\b`)
			case '\f':
				b.WriteString(`\f`)
			default:
				if c < 0x20 || c == 0x7f {
					b.WriteString(`\u00`)
					b.WriteByte(hex[c>>4])
					b.WriteByte(hex[c&0xf])
				} else {
					b.WriteByte(c)
				}
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		writeU := func(u rune) {
			b.WriteString(`\u`)
			b.WriteByte(hex[(u>>12)&0xf])
			b.WriteByte(hex[(u>>8)&0xf])
			b.WriteByte(hex[(u>>4)&0xf])
			b.WriteByte(hex[u&0xf])
		}
		if r >= 0x10000 {
			r -= 0x10000
			writeU(0xd800 | (r>>10)&0x3ff)
			writeU(0xdc00 | r&0x3ff)
		} else {
			writeU(r)
		}
	}
	b.WriteByte('"')
}

// writePyRaw re-renders a JSON value in Python's format. Numbers keep their literal text.
func writePyRaw(b *bytes.Buffer, v json.RawMessage) error {
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	return writePyValue(b, dec)
}

func writePyValue(b *bytes.Buffer, dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			b.WriteByte('{')
			for first := true; dec.More(); first = false {
				if !first {
					b.WriteString(", ")
				}
				k, err := dec.Token()
				if err != nil {
					return err
				}
				ks, ok := k.(string)
				if !ok {
					return errors.New("object key is not a string")
				}
				writePyString(b, ks)
				b.WriteString(": ")
				if err := writePyValue(b, dec); err != nil {
					return err
				}
			}
			b.WriteByte('}')
		case '[':
			b.WriteByte('[')
			for first := true; dec.More(); first = false {
				if !first {
					b.WriteString(", ")
				}
				if err := writePyValue(b, dec); err != nil {
					return err
				}
			}
			b.WriteByte(']')
		default:
			return fmt.Errorf("unexpected %v", t)
		}
		_, err := dec.Token() // the closing delimiter
		return err
	case string:
		writePyString(b, t)
	case json.Number:
		b.WriteString(pyNumber(t.String()))
	case bool:
		if t {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case nil:
		b.WriteString("null")
	}
	return nil
}

// pyNumber renders a JSON number as Python does after a round trip: integers as they are, floats
// as repr(float) (shortest digits; exponent form below 1e-4 or from 1e16 on).
func pyNumber(n string) string {
	if !strings.ContainsAny(n, ".eE") {
		return n
	}
	f, err := strconv.ParseFloat(n, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return n
	}
	sign := ""
	if math.Signbit(f) {
		sign = "-"
		f = -f
	}
	if f == 0 {
		return sign + "0.0"
	}
	// Shortest digits d.ddd and exponent e, so f = 0.dddd x 10^(e+1).
	es := strconv.FormatFloat(f, 'e', -1, 64)
	mant, exp, _ := strings.Cut(es, "e")
	digits := strings.Replace(mant, ".", "", 1)
	e, _ := strconv.Atoi(exp)
	decpt := e + 1
	if decpt <= -4 || decpt > 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if e < 0 {
			es, e = "-", -e
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, e)
	}
	switch {
	case decpt <= 0:
		return sign + "0." + strings.Repeat("0", -decpt) + digits
	case decpt >= len(digits):
		return sign + digits + strings.Repeat("0", decpt-len(digits)) + ".0"
	default:
		return sign + digits[:decpt] + "." + digits[decpt:]
	}
}

// pyLine renders one exec message as the code-interpreter server sends it. ok is false for
// messages the server never forwards (keepalive and end_of_execution are written by the stream
// itself; unknown types are dropped).
func pyLine(m sandbox.Message, now time.Time) (line []byte, ok bool, err error) {
	o := newPyObject()
	switch m.Type {
	case sandbox.MessageNumberOfExecutions:
		o.str("type", m.Type)
		o.int("execution_count", m.ExecutionCount)
	case sandbox.MessageStdout, sandbox.MessageStderr:
		o.str("type", m.Type)
		o.str("text", m.Text)
		o.str("timestamp", pyTimestamp(m.Timestamp, now))
	case sandbox.MessageResult:
		r := m.Output
		o.str("type", m.Type)
		for _, f := range []struct{ k, v string }{
			{"text", r.Text}, {"html", r.HTML}, {"markdown", r.Markdown}, {"svg", r.SVG},
			{"png", r.PNG}, {"jpeg", r.JPEG}, {"pdf", r.PDF}, {"latex", r.LaTeX},
		} {
			if f.v != "" {
				o.str(f.k, f.v)
			}
		}
		if len(r.JSON) > 0 {
			if err := o.raw("json", r.JSON); err != nil {
				return nil, false, fmt.Errorf("result json: %w", err)
			}
		}
		if r.JavaScript != "" {
			o.str("javascript", r.JavaScript)
		}
		for _, f := range []struct {
			k string
			v json.RawMessage
		}{{"data", r.Data}, {"chart", r.Chart}} {
			if len(f.v) > 0 && string(f.v) != "null" {
				if err := o.raw(f.k, f.v); err != nil {
					return nil, false, fmt.Errorf("result %s: %w", f.k, err)
				}
			}
		}
		extra := r.Extra
		if len(extra) == 0 || string(extra) == "null" {
			extra = json.RawMessage("{}")
		}
		if err := o.raw("extra", extra); err != nil {
			return nil, false, fmt.Errorf("result extra: %w", err)
		}
		o.bool("is_main_result", r.IsMainResult)
	case sandbox.MessageError:
		o.str("type", m.Type)
		o.str("name", m.Name)
		o.str("value", m.Value)
		o.str("traceback", m.Traceback)
	default:
		return nil, false, nil
	}
	return o.line(), true, nil
}

// errorLine is a synthetic error the server sends when an execution breaks off (traceback "").
func errorLine(name, value string) []byte {
	o := newPyObject()
	o.str("type", sandbox.MessageError)
	o.str("name", name)
	o.str("value", value)
	o.str("traceback", "")
	return o.line()
}

var (
	keepaliveLine       = []byte(`{"type": "keepalive"}` + "\n")
	endOfExecutionLine  = []byte(`{"type": "end_of_execution"}` + "\n")
	pyTimestampLayout   = "2006-01-02T15:04:05.000000-07:00"
	pyTimestampNoMicros = "2006-01-02T15:04:05-07:00"
)

// pyTimestamp renders a message time as pydantic renders a datetime (Python's isoformat: microseconds
// unless zero, "+00:00" rather than "Z"). A timestamp the exec sandbox did not give is taken from now.
func pyTimestamp(ts string, now time.Time) string {
	t := now.UTC()
	if ts != "" {
		if p, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			t = p
		}
	}
	t = t.Truncate(time.Microsecond)
	if t.Nanosecond() == 0 {
		return t.Format(pyTimestampNoMicros)
	}
	return t.Format(pyTimestampLayout)
}
