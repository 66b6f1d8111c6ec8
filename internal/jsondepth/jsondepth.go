// Package jsondepth bounds how deeply a JSON text nests, in one pass and without recursion, and
// finds the duplicate keys of a request body in the same pass ([Scan]).
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
	"encoding/json"
	"slices"
	"strconv"
	"unicode/utf8"

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

// Scan reads b once and reports the first reason to refuse it as a request body: nesting deeper
// than max (deep), or an object that names one key twice, at any depth (dup, with that key's path,
// such as "tools[1].type"). Readers disagree on duplicate keys: gjson, and so the proxy,
// takes the first, OpenAI and encoding/json the last; a body with them could be read one way here
// and another upstream, so it is refused whole, wherever they are. Keys are compared as
// encoding/json decodes them (escapes resolved, invalid UTF-8 as U+FFFD), so "type" and
// "typ\u0065" are one key. Like [Within], Scan does not validate: the caller validates b next,
// and trusts what Scan found only if b is valid.
//
// Scan keeps one frame per open level and one entry per key of the open objects, so its memory
// is bounded by max and len(b); it allocates only for keys that hold escapes or non-UTF-8 bytes,
// and for objects of more than a few keys checked at their end.
func Scan(b []byte, max int) (path string, dup, deep bool) {
	// Backed by arrays on the stack: an ordinary request allocates nothing here.
	var frames [32]frame
	var names [128][]byte
	stack, keys := frames[:0], names[:0]
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			end := stringEnd(b, i+1)
			if end < 0 {
				return "", false, false // an unterminated string: nothing after it counts
			}
			if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].keyNext {
				stack[n-1].keyNext = false
				keys = append(keys, decodedKey(b[i+1:end]))
			}
			i = end
		case '[', '{':
			if len(stack) >= max {
				return "", false, true
			}
			f := frame{object: b[i] == '{', keyNext: b[i] == '{', keys: len(keys)}
			if n := len(stack); n > 0 {
				if p := &stack[n-1]; p.object {
					if len(keys) > p.keys {
						f.key = keys[len(keys)-1]
					}
				} else {
					f.at = p.elems
				}
			}
			stack = append(stack, f)
		case ',':
			if n := len(stack); n > 0 {
				if p := &stack[n-1]; p.object {
					p.keyNext = true
				} else {
					p.elems++
				}
			}
		case ']', '}':
			// Clamped at zero, as in Within: stray closers earn no credit.
			n := len(stack)
			if n == 0 {
				continue
			}
			if f := stack[n-1]; f.object {
				if k, ok := repeated(keys[f.keys:]); ok {
					return keyPath(stack, k), true, false
				}
				keys = keys[:f.keys]
			}
			stack = stack[:n-1]
		}
	}
	// What is left open is malformed, and the caller's validator refuses it.
	return "", false, false
}

// frame is one open array or object.
type frame struct {
	object bool
	// keyNext: in an object, the next string is a key (after '{' or ',').
	keyNext bool
	// key or at is where this value sits in its parent: the parent object's key, or the index
	// in the parent array.
	key []byte
	at  int
	// elems counts the commas of an array so far: the index of its current element.
	elems int
	// keys is where this object's keys start in Scan's list of the open objects' keys.
	keys int
}

// repeated returns a key that keys holds twice. A few keys are compared pairwise; more are
// sorted in place (the frames hold copies of their names), so an object of many keys costs
// n log n, not n².
func repeated(keys [][]byte) ([]byte, bool) {
	if len(keys) <= 8 {
		for i := 1; i < len(keys); i++ {
			for j := range i {
				if bytes.Equal(keys[i], keys[j]) {
					return keys[i], true
				}
			}
		}
		return nil, false
	}
	slices.SortFunc(keys, bytes.Compare)
	for i := 1; i < len(keys); i++ {
		if bytes.Equal(keys[i], keys[i-1]) {
			return keys[i], true
		}
	}
	return nil, false
}

// keyPath names key inside the innermost open object of stack, from the root: "tools[1].type".
func keyPath(stack []frame, key []byte) string {
	var p []byte
	for i := 1; i < len(stack); i++ { // the root has no name
		if stack[i-1].object {
			if len(p) > 0 {
				p = append(p, '.')
			}
			p = append(p, stack[i].key...)
		} else {
			p = strconv.AppendInt(append(p, '['), int64(stack[i].at), 10)
			p = append(p, ']')
		}
	}
	if len(p) > 0 {
		p = append(p, '.')
	}
	return string(append(p, key...))
}

// decodedKey is the key whose quoted content is raw, as encoding/json decodes it. Most keys are
// plain ASCII or valid UTF-8 without escapes, and are their own bytes.
func decodedKey(raw []byte) []byte {
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return raw
	}
	var s string
	if err := json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &s); err != nil {
		return raw // malformed: the caller's validator refuses the text
	}
	return []byte(s)
}
