// Package argstream decodes one string field of a JSON object while the object arrives in chunks,
// as function-call arguments do in response.function_call_arguments.delta events. It lets the
// proxy stream a python call's code to the client as code_interpreter_call_code.delta events
// before the arguments are complete.
//
// API:
//
//	func New(field string) *Decoder
//	func (d *Decoder) Write(chunk string) string // the newly decoded part of the field's value
//	func (d *Decoder) Started() bool              // the field's string value has begun
//	func (d *Decoder) Complete() bool             // its closing quote was seen
//	func (d *Decoder) Duplicate() bool            // the field appeared a second time
//	func (d *Decoder) Err() error                 // wraps ErrSyntax once the input cannot be a JSON object
//
// Chunks may split the input anywhere: inside a key, an escape (\n, \", \u00e9), a surrogate pair
// (\ud83d\ude00) or a multi-byte UTF-8 sequence. Write never returns part of an escape or a broken
// UTF-8 sequence; it holds those bytes back until the next chunk completes them. Decoding follows
// encoding/json exactly (invalid UTF-8 bytes and unpaired surrogates become U+FFFD), so for any
// input that json.Unmarshal accepts as an object whose field is a string and whose top level holds
// the field once, the concatenated results of Write equal that string, whatever the chunking.
//
// The Decoder only streams. The final value should come from json.Unmarshal of the complete
// arguments into a map (exact key match; a struct would also match the key case-insensitively),
// which also decides what happens with input that is not JSON: for such input Write returns ""
// from the point where it stops being a JSON object, and never panics.
//
// Values before the field (objects, arrays, strings, numbers, literals, at any depth) are skipped.
// A field value that is not a string yields nothing. Only the first occurrence of the field at the
// top level is streamed; a later one sets Duplicate, since json.Unmarshal keeps the last.
//
// NewStrings decodes a field whose value is an array of strings instead (the shell tool's
// "commands"): Pieces returns what each chunk added to each element, by element index, and when
// an element ended. An element that is not a string ends the streaming of the array.
//
// A Decoder is not safe for concurrent use.
package argstream

import (
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrSyntax is wrapped by Err when the input cannot be the start of a JSON object.
var ErrSyntax = errors.New("argstream: arguments are not a JSON object")

// maxDepth bounds the nesting of skipped values, like encoding/json's limit.
const maxDepth = 10000

type state uint8

const (
	stStart      state = iota // before '{'
	stFirstKey                // after '{': a key or '}'
	stNextKey                 // after ',': a key
	stKey                     // inside a key string
	stColon                   // after a key
	stValue                   // after ':'
	stSkip                    // inside a value that is skipped
	stString                  // inside the field's string value: streaming
	stAfterValue              // after a value: ',' or '}'
	stElem                    // inside the field's array (NewStrings): an element or ']'
	stAfterElem               // after an element: ',' or ']'
	stEnd                     // after the closing '}'
	stFailed                  // not JSON: nothing more is decoded
)

// Decoder decodes the string value of one top-level field of a streamed JSON object.
type Decoder struct {
	field string
	st    state
	off   int // bytes consumed so far, for error messages
	err   error

	// Key matching: the raw bytes of the current key, as long as it can still equal field.
	key      []byte
	keyEsc   bool
	keyLong  bool
	keyMatch bool

	// Skipping a value.
	stack    []byte // expected closing brackets
	skipStr  bool
	skipEsc  bool
	skipLit  bool
	started  bool
	complete bool
	dup      bool

	// NewStrings only: the array's elements.
	strings bool
	elems   int    // elements begun
	marks   []mark // where each element's text starts in out, for Pieces

	// Streaming the value: pend holds raw bytes of an escape or UTF-8 sequence not yet complete.
	pend []byte
	in   []byte // scratch: pend + chunk
	out  []byte // scratch: the decoded delta
}

// New returns a Decoder for the top-level field named field (for example "code").
func New(field string) *Decoder {
	return &Decoder{field: field}
}

// NewStrings returns a Decoder for the top-level field named field whose value is an array of
// strings (for example "commands").
func NewStrings(field string) *Decoder {
	return &Decoder{field: field, strings: true}
}

// Piece is what one chunk added to one element of a NewStrings field.
type Piece struct {
	Elem int    // the element's index in the array
	Text string // the newly decoded part of its value, "" when it only began or ended
	Done bool   // its closing quote was seen
}

type mark struct {
	elem, from int
	done       bool
}

// Pieces consumes the next chunk of the arguments of a NewStrings decoder and returns, in order,
// a piece for every element the chunk began, added to or ended.
func (d *Decoder) Pieces(chunk string) []Piece {
	d.marks = d.marks[:0]
	if d.st == stString {
		d.marks = append(d.marks, mark{elem: d.elems - 1})
	}
	text := d.Write(chunk)
	ps := make([]Piece, len(d.marks))
	for i, m := range d.marks {
		end := len(text)
		if i+1 < len(d.marks) {
			end = d.marks[i+1].from
		}
		ps[i] = Piece{Elem: m.elem, Text: text[m.from:end], Done: m.done}
	}
	return ps
}

// Started reports whether the field's string value has begun (its opening quote was seen).
func (d *Decoder) Started() bool { return d.started }

// Complete reports whether the field's string value has ended (its closing quote was seen).
func (d *Decoder) Complete() bool { return d.complete }

// Duplicate reports whether the field appeared again at the top level after its first value.
// json.Unmarshal keeps the last occurrence, so the streamed value may then differ from it.
func (d *Decoder) Duplicate() bool { return d.dup }

// Err returns nil while the input seen so far can be (a prefix of) a JSON object, and an error
// wrapping ErrSyntax after the first byte that rules it out.
func (d *Decoder) Err() error { return d.err }

// Write consumes the next chunk of the arguments and returns the part of the field's value that
// it completed: "" when the chunk adds nothing decodable.
func (d *Decoder) Write(chunk string) string {
	if d.st == stFailed {
		return ""
	}
	d.out = d.out[:0]
	if cap(d.out) < len(chunk) {
		// The decoded text is about as long as the input (escapes shrink, U+FFFD grows).
		d.out = make([]byte, 0, len(chunk)+len(d.pend))
	}
	in := chunk
	if len(d.pend) > 0 {
		d.in = append(append(d.in[:0], d.pend...), chunk...)
		d.pend = d.pend[:0]
		in = string(d.in)
		// The bytes in pend were already counted in off.
		d.off -= len(d.in) - len(chunk)
	}
	d.scan(in)
	if len(d.out) == 0 {
		return ""
	}
	return string(d.out)
}

func (d *Decoder) fail(c byte, what string) {
	d.err = fmt.Errorf("%w: byte %d (%q): %s", ErrSyntax, d.off, c, what)
	d.st = stFailed
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// scan runs the state machine over in.
func (d *Decoder) scan(in string) {
	i := 0
	for i < len(in) {
		if d.st == stString {
			n, ended := d.decodeString(in[i:])
			if d.st == stFailed {
				return
			}
			i += n
			d.off += n
			if !ended {
				// Keep the incomplete tail for the next chunk.
				d.pend = append(d.pend, in[i:]...)
				d.off += len(in) - i
				return
			}
			if d.strings {
				d.marks[len(d.marks)-1].done = true
				d.st = stAfterElem
				continue
			}
			d.complete = true
			d.st = stAfterValue
			continue
		}
		c := in[i]
		switch d.st {
		case stStart:
			switch {
			case isSpace(c):
			case c == '{':
				d.st = stFirstKey
			default:
				d.fail(c, "want '{'")
				return
			}
		case stFirstKey, stNextKey:
			switch {
			case isSpace(c):
			case c == '"':
				d.st = stKey
				d.key = d.key[:0]
				d.keyEsc, d.keyLong = false, false
			case c == '}' && d.st == stFirstKey:
				d.st = stEnd
			default:
				d.fail(c, "want a key")
				return
			}
		case stKey:
			switch {
			case d.keyEsc:
				d.keyEsc = false
				d.addKey(c)
			case c == '\\':
				d.keyEsc = true
				d.addKey(c)
			case c == '"':
				d.keyMatch = !d.keyLong && unquote(d.key) == d.field
				d.st = stColon
			default:
				d.addKey(c)
			}
		case stColon:
			switch {
			case isSpace(c):
			case c == ':':
				d.st = stValue
			default:
				d.fail(c, "want ':'")
				return
			}
		case stValue:
			if isSpace(c) {
				break
			}
			if d.keyMatch {
				switch {
				case d.started:
					d.dup = true
				case c == '"' && !d.strings:
					d.started = true
					d.st = stString
				case c == '[' && d.strings:
					d.started = true
					d.st = stElem
				}
				if d.st != stValue {
					break
				}
			}
			d.st = stSkip
			d.stack = d.stack[:0]
			d.skipStr, d.skipEsc, d.skipLit = false, false, false
			if !d.skip(c) {
				return
			}
		case stSkip:
			if !d.skip(c) {
				return
			}
		case stAfterValue:
			switch {
			case isSpace(c):
			case c == ',':
				d.st = stNextKey
			case c == '}':
				d.st = stEnd
			default:
				d.fail(c, "want ',' or '}'")
				return
			}
		case stElem, stAfterElem:
			switch {
			case isSpace(c):
			case c == '"' && d.st == stElem:
				d.marks = append(d.marks, mark{elem: d.elems, from: len(d.out)})
				d.elems++
				d.st = stString
			case c == ']' && (d.st == stAfterElem || d.elems == 0):
				d.complete = true
				d.st = stAfterValue
			case c == ',' && d.st == stAfterElem:
				d.st = stElem
			default:
				// Not a string element: what is left of the array is skipped, unstreamed.
				d.st = stSkip
				d.stack = append(d.stack[:0], ']')
				d.skipStr, d.skipEsc, d.skipLit = false, false, false
				if !d.skip(c) {
					return
				}
			}
		case stEnd:
			if !isSpace(c) {
				d.fail(c, "data after the object")
				return
			}
		case stFailed:
			return
		}
		i++
		d.off++
	}
}

// addKey records a raw key byte while the key can still equal the field: its raw form is at
// most 12 bytes per decoded byte (a surrogate pair escape per 4-byte rune, 6 per byte otherwise).
func (d *Decoder) addKey(c byte) {
	if d.keyLong {
		return
	}
	if len(d.key) >= 6*len(d.field)+6 {
		d.keyLong = true
		return
	}
	d.key = append(d.key, c)
}

// skip consumes one byte of a skipped value. It reports false when the input failed.
// When the value ends, the state becomes stAfterValue; a literal ends at the byte after it,
// which is then handled as the byte after the value.
func (d *Decoder) skip(c byte) bool {
	if d.skipStr {
		switch {
		case d.skipEsc:
			d.skipEsc = false
		case c == '\\':
			d.skipEsc = true
		case c == '"':
			d.skipStr = false
			if len(d.stack) == 0 {
				d.st = stAfterValue
			}
		}
		return true
	}
	if d.skipLit {
		if !isSpace(c) && c != ',' && c != '}' && c != ']' {
			if !isLiteralByte(c) {
				d.fail(c, "bad literal")
				return false
			}
			return true
		}
		d.skipLit = false
		if len(d.stack) == 0 {
			d.st = stAfterValue
			return d.afterValue(c)
		}
	}
	switch {
	case isSpace(c):
	case c == '"':
		d.skipStr = true
	case c == '{' || c == '[':
		if len(d.stack) >= maxDepth {
			d.fail(c, "nested too deeply")
			return false
		}
		if c == '{' {
			d.stack = append(d.stack, '}')
		} else {
			d.stack = append(d.stack, ']')
		}
	case c == '}' || c == ']':
		if len(d.stack) == 0 || d.stack[len(d.stack)-1] != c {
			d.fail(c, "mismatched bracket")
			return false
		}
		d.stack = d.stack[:len(d.stack)-1]
		if len(d.stack) == 0 {
			d.st = stAfterValue
		}
	case c == ',' || c == ':':
		if len(d.stack) == 0 {
			d.fail(c, "want a value")
			return false
		}
	case c == '-' || c >= '0' && c <= '9' || c == 't' || c == 'f' || c == 'n':
		d.skipLit = true
	default:
		d.fail(c, "want a value")
		return false
	}
	return true
}

func isLiteralByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c == '-' || c == '+' || c == '.' || c == 'E'
}

// afterValue handles the byte that ended a top-level literal.
func (d *Decoder) afterValue(c byte) bool {
	switch {
	case isSpace(c):
	case c == ',':
		d.st = stNextKey
	case c == '}':
		d.st = stEnd
	default:
		d.fail(c, "want ',' or '}'")
		return false
	}
	return true
}

// decodeString decodes the field's string content at the start of in into d.out. It returns the
// bytes consumed and whether the closing quote was consumed. When it stops early, in[n:] is an
// escape or a UTF-8 sequence that the next chunk may complete.
func (d *Decoder) decodeString(in string) (n int, ended bool) {
	i := 0
	for i < len(in) {
		c := in[i]
		switch {
		case c == '"':
			return i + 1, true
		case c == '\\':
			if i+1 >= len(in) {
				return i, false
			}
			switch e := in[i+1]; e {
			case '"', '\\', '/':
				d.out = append(d.out, e)
				i += 2
			case 'b':
				d.out = append(d.out, '\b')
				i += 2
			case 'f':
				d.out = append(d.out, '\f')
				i += 2
			case 'n':
				d.out = append(d.out, '\n')
				i += 2
			case 'r':
				d.out = append(d.out, '\r')
				i += 2
			case 't':
				d.out = append(d.out, '\t')
				i += 2
			case 'u':
				if i+6 > len(in) {
					if !hexPrefix(in[i+2:]) {
						d.off += i
						d.fail(in[i+2], "bad \\u escape")
						return len(in), true
					}
					return i, false
				}
				rr := getu4(in[i:])
				if rr < 0 {
					d.off += i
					d.fail(in[i+1], "bad \\u escape")
					return len(in), true
				}
				if utf16.IsSurrogate(rr) {
					// As encoding/json: a valid pair decodes to one rune; anything else makes this
					// escape U+FFFD and leaves the next bytes to be decoded on their own.
					rest := in[i+6:]
					if len(rest) < 6 && u4Prefix(rest) {
						return i, false
					}
					if dec := utf16.DecodeRune(rr, getu4(rest)); dec != utf8.RuneError {
						d.out = utf8.AppendRune(d.out, dec)
						i += 12
						break
					}
					rr = utf8.RuneError
				}
				d.out = utf8.AppendRune(d.out, rr)
				i += 6
			default:
				d.off += i
				d.fail(e, "bad escape")
				return len(in), true
			}
		case c < utf8.RuneSelf:
			// A run of plain bytes is copied at once.
			j := i + 1
			for j < len(in) && in[j] < utf8.RuneSelf && in[j] != '"' && in[j] != '\\' {
				j++
			}
			d.out = append(d.out, in[i:j]...)
			i = j
		default:
			if !utf8.FullRuneInString(in[i:]) {
				return i, false
			}
			r, size := utf8.DecodeRuneInString(in[i:])
			if r == utf8.RuneError && size == 1 {
				d.out = utf8.AppendRune(d.out, utf8.RuneError)
			} else {
				d.out = append(d.out, in[i:i+size]...)
			}
			i += size
		}
	}
	return i, false
}

// getu4 decodes \uXXXX at the start of s, or returns -1 (as encoding/json's getu4).
func getu4(s string) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range []byte(s[2:6]) {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// hexPrefix reports whether s can begin four hex digits.
func hexPrefix(s string) bool {
	for i := 0; i < len(s) && i < 4; i++ {
		if !isHex(s[i]) {
			return false
		}
	}
	return true
}

// u4Prefix reports whether s, shorter than 6 bytes, can begin a \uXXXX escape.
func u4Prefix(s string) bool {
	if len(s) >= 1 && s[0] != '\\' {
		return false
	}
	if len(s) >= 2 && s[1] != 'u' {
		return false
	}
	if len(s) > 2 {
		return hexPrefix(s[2:])
	}
	return true
}

// unquote decodes a complete raw key (without its quotes) the way encoding/json does.
func unquote(raw []byte) string {
	// Keys are short; decode with the same string decoder on a scratch Decoder.
	var k Decoder
	n, _ := k.decodeString(string(raw) + `"`)
	if k.err != nil || n != len(raw)+1 {
		return "\x00invalid"
	}
	return string(k.out)
}
