package upstream

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// Helpers shared by the Responses ⇄ Chat Completions translation (responses_chat*.go).

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
// from (len(s) when none does).
func stringEnd(s string, from int) int {
	for i := from; i < len(s); i++ {
		switch s[i] {
		case '"':
			return i
		case '\\':
			i++ // the escaped byte, a quote maybe
		}
	}
	return len(s)
}

// forEachRaw walks the JSON value v as gjson's Result.ForEach walks the Result of v, handing
// over raw JSON text instead of parsed Results: each member of an object (its key unescaped),
// each element of an array (key ""), or once a value that is neither; nothing for "". v must come
// from a text already validated: values are skipped over, not checked. A caller parses only the
// values it reads (gjson.Parse), which a stream's chunks, walked three levels deep, cost half
// as much as Result.ForEach parsing every value on the way.
func forEachRaw(v string, fn func(key, value string) bool) {
	if v == "" {
		return
	}
	if v[0] != '{' && v[0] != '[' {
		fn("", v)
		return
	}
	object := v[0] == '{'
	for i := 1; i < len(v); {
		i = skipSpace(v, i)
		if i < len(v) && v[i] == ',' {
			i = skipSpace(v, i+1)
		}
		if i >= len(v) || v[i] == '}' || v[i] == ']' {
			return
		}
		key := ""
		if object {
			end := stringEnd(v, i+1)
			if end >= len(v) {
				return
			}
			key = v[i+1 : end]
			if strings.IndexByte(key, '\\') >= 0 {
				key = gjson.Parse(v[i : end+1]).Str
			}
			i = skipSpace(v, skipSpace(v, end+1)+1) // past the colon
		}
		end := valueEnd(v, i)
		if !fn(key, v[i:end]) {
			return
		}
		i = end
	}
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
		return min(stringEnd(s, i+1)+1, len(s))
	case '{', '[':
		depth := 0
		for ; i < len(s); i++ {
			switch s[i] {
			case '"':
				i = stringEnd(s, i+1)
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
	for ; i < len(s); i++ {
		switch s[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return i
}
