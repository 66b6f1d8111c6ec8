package upstream

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"unicode/utf8"
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
func appendString(dst []byte, s string) []byte {
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
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
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
