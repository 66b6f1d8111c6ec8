package chat

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// Helpers shared by the Responses ⇄ Chat Completions translation.

// newRandomID returns prefix followed by 48 random hex digits, the shape of OpenAI's ids.
func newRandomID(prefix string) string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string literal. Like OpenAI's encoder, and unlike
// encoding/json's default, it leaves <, > and & alone; invalid UTF-8 becomes U+FFFD, and U+2028
// and U+2029 are escaped so the text is safe inside JavaScript too.
func appendString(dst []byte, s string) []byte { return appendQuoted(dst, s, false) }

// appendGoString appends s as encoding/json with SetEscapeHTML(false) does: as appendString,
// with \b and \f in their short forms. The chat request body is written so, as it always was.
func appendGoString(dst []byte, s string) []byte { return appendQuoted(dst, s, true) }

func appendQuoted(dst []byte, s string, shortBF bool) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch {
			case c == '"', c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c == '\b' && shortBF:
				dst = append(dst, '\\', 'b')
			case c == '\f' && shortBF:
				dst = append(dst, '\\', 'f')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// ValidUTF8 returns b with each run of bytes that is not UTF-8 replaced by U+FFFD (b itself when
// it is valid). Upstream text is made valid so where it enters, because the proxy copies JSON
// strings as they came and a client's strict decoder refuses invalid UTF-8: inside a JSON string
// the replacement keeps the text valid JSON; outside one the text was no JSON anyway.
func ValidUTF8(b []byte) []byte {
	if utf8.Valid(b) {
		return b
	}
	return bytes.ToValidUTF8(b, []byte("\uFFFD"))
}

// appendInt appends n in decimal.
func appendInt(dst []byte, n int) []byte { return strconv.AppendInt(dst, int64(n), 10) }

// orDefault returns raw, or def when raw is empty (the field was absent or null).
func orDefault(raw []byte, def string) []byte {
	if len(raw) == 0 {
		return []byte(def)
	}
	return raw
}

// appendCompacted appends raw, a JSON value from a text already validated, without the spaces
// and line breaks between its tokens: what json.Compact makes of it, with no second validation.
// It reports false, having appended nothing, when raw nests deeper than maxDepth levels (which
// json.Compact refuses past encoding/json's limit).
func appendCompacted(dst []byte, raw string, maxDepth int) ([]byte, bool) {
	start, from, depth := len(dst), 0, 0
	for i := 0; i < len(raw); i++ {
		switch raw[i] {
		case ' ', '\t', '\r', '\n':
			dst = append(dst, raw[from:i]...)
			from = i + 1
		case '"':
			i = stringEnd(raw, i+1)
		case '[', '{':
			depth++
			if depth > maxDepth {
				return dst[:start], false
			}
		case ']', '}':
			depth--
		}
	}
	return append(dst, raw[from:]...), true
}

// stringEnd returns the index of the quote that ends the JSON string whose content starts at
// from (len(s) when none does): the first quote after an even number of backslashes. It suits
// long strings (a request's texts); stringEndEscaped, short ones (a chunk's).
func stringEnd(s string, from int) int {
	for {
		q := strings.IndexByte(s[from:], '"')
		if q < 0 {
			return len(s)
		}
		q += from
		n := 0
		for j := q - 1; j >= from && s[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return q
		}
		from = q + 1
	}
}

// stringEndEscaped is stringEnd by a loop, cheaper for the few bytes of a chunk's keys and
// values, which also reports whether the string holds an escape.
func stringEndEscaped(s string, from int) (end int, escaped bool) {
	for i := from; i < len(s); i++ {
		switch s[i] {
		case '"':
			return i, escaped
		case '\\':
			escaped = true
			i++ // the escaped byte, a quote maybe
		}
	}
	return len(s), escaped
}

// rawCursor walks JSON text already validated, in one pass: each value on the way is either
// walked into (each) or taken whole as raw text (raw), never scanned twice, and parsed (with
// gjson.Parse) only where it is read. It reads a stream's chunks, three levels deep, where
// Result.ForEach would parse every value it passes (created as a float, every string) and have
// each level scan again what the level above skipped over. The values it hands over are not
// checked: the text must have been validated whole.
type rawCursor struct {
	s string
	i int
}

// each walks the value at the cursor as gjson's Result.ForEach walks it: fn is called for each
// member of an object (with its key, unescaped), for each element of an array (key ""), or once
// for a value that is neither (key ""), with the cursor at that value, for fn to take (raw), walk
// (each) or leave: what fn leaves is skipped.
func (c *rawCursor) each(fn func(key string)) {
	c.i = skipSpace(c.s, c.i)
	if c.i >= len(c.s) {
		return
	}
	open := c.s[c.i]
	if open != '{' && open != '[' {
		c.visit("", fn)
		return
	}
	c.i++
	for {
		c.i = skipSpace(c.s, c.i)
		if c.i < len(c.s) && c.s[c.i] == ',' {
			c.i = skipSpace(c.s, c.i+1)
		}
		if c.i >= len(c.s) {
			return
		}
		if c.s[c.i] == '}' || c.s[c.i] == ']' {
			c.i++
			return
		}
		key := ""
		if open == '{' {
			end, escaped := stringEndEscaped(c.s, c.i+1)
			if end >= len(c.s) {
				c.i = end
				return
			}
			key = c.s[c.i+1 : end]
			if escaped {
				key = gjson.Parse(c.s[c.i : end+1]).Str
			}
			c.i = skipSpace(c.s, skipSpace(c.s, end+1)+1) // past the colon
		}
		c.visit(key, fn)
	}
}

// visit calls fn with the cursor at a value, then skips the value if fn left it.
func (c *rawCursor) visit(key string, fn func(key string)) {
	start := c.i
	fn(key)
	if c.i == start {
		c.i = valueEnd(c.s, c.i)
	}
}

// raw returns the value at the cursor as raw JSON text, and moves past it.
func (c *rawCursor) raw() string {
	start := c.i
	c.i = valueEnd(c.s, c.i)
	return c.s[start:c.i]
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// valueEnd returns where the JSON value starting at s[i] ends.
func valueEnd(s string, i int) int {
	if i >= len(s) {
		return len(s)
	}
	switch s[i] {
	case '"':
		end, _ := stringEndEscaped(s, i+1)
		return min(end+1, len(s))
	case '{', '[':
		depth := 0
		for ; i < len(s); i++ {
			switch s[i] {
			case '"':
				i, _ = stringEndEscaped(s, i+1)
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return len(s)
	}
	for i++; i < len(s); i++ { // a number or a literal, one byte at least
		switch s[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return i
}

// escapesSurrogate reports whether a JSON string literal may escape a UTF-16 surrogate (\uD800 to
// \uDFFF), paired or not: decoders differ on a lone one, so such a literal is written again
// from its decoded text.
func escapesSurrogate(lit string) bool {
	for i := 0; i+5 < len(lit); i++ {
		if lit[i] == '\\' {
			if lit[i+1] == 'u' && (lit[i+2] == 'd' || lit[i+2] == 'D') && strings.IndexByte("89abcdefABCDEF", lit[i+3]) >= 0 {
				return true
			}
			i++ // the escaped byte
		}
	}
	return false
}
