package chat

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"unicode/utf8"
)

// Helpers shared by the Responses ⇄ Chat Completions translation.

// newRandomID returns prefix followed by 48 random hex digits, the shape of OpenAI's ids.
func newRandomID(prefix string) string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
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
