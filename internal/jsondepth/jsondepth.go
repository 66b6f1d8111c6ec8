// Package jsondepth bounds how deeply a JSON text nests, in one pass and without recursion.
//
// The proxy parses JSON it did not write: client bodies, upstream responses and events. gjson's
// validator recurses once per level of nesting, and a Go stack overflow is not a panic that can be
// recovered: a body of ten million '[' ends the whole process. Every JSON text from outside goes
// through [Valid] (or [Within] first), whose scan is a loop with a counter, before anything
// recursive sees it. encoding/json and yaml.v3 bound their own depth (10,000) and fail cleanly, so
// they need no guard.
package jsondepth

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// Max is the deepest nesting the proxy accepts in a JSON text it did not write: 512 levels of
// arrays and objects. Real requests nest a few dozen levels at most (a Responses input item holds
// content parts inside a message inside the input array; OpenAI caps structured-output schemas at
// 10 levels of schema, about 30 of JSON), and 512 frames of gjson's validator need a few tens of
// KiB of stack, nothing a goroutine notices.
const Max = 512

// Within reports whether b nests arrays and objects no deeper than max. It does not validate: a
// malformed text may pass, and the caller's validator then rejects it cheaply, since no prefix of
// b opens more than max levels. Brackets inside strings do not count.
func Within(b []byte, max int) bool {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			end := stringEnd(b, i+1)
			if end < 0 {
				return true // an unterminated string: nothing after it can nest
			}
			i = end
		case '[', '{':
			depth++
			if depth > max {
				return false
			}
		case ']', '}':
			// Clamped at zero, so stray closers cannot earn credit for later openers: depth is
			// then an upper bound on what any prefix parse of b recurses through.
			if depth > 0 {
				depth--
			}
		}
	}
	return true
}

// stringEnd returns the index of the quote that closes the string whose content starts at from,
// or -1 when the string does not end. A quote is escaped when an odd number of backslashes stands
// right before it.
func stringEnd(b []byte, from int) int {
	for from < len(b) {
		q := bytes.IndexByte(b[from:], '"')
		if q < 0 {
			return -1
		}
		q += from
		n := 0
		for j := q - 1; j >= from && b[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return q
		}
		from = q + 1
	}
	return -1
}

// Valid reports whether b is valid JSON that nests no deeper than [Max]. It is the only way the
// proxy validates JSON from outside: the depth check runs first, so gjson's recursive validator
// never sees a text that could exhaust the stack.
func Valid(b []byte) bool {
	return Within(b, Max) && gjson.ValidBytes(b)
}
