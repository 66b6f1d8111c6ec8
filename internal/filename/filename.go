// Package filename turns the name a client gave a file into one that is safe to show and to use as
// a single path element (in the store, in a sandbox's /mnt/data).
package filename

import (
	"errors"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxLen is the longest name accepted, in bytes: Linux's NAME_MAX.
const MaxLen = 255

// Errors, each saying what is wrong with the name.
var (
	ErrEmpty    = errors.New("the filename is empty")
	ErrTooLong  = errors.New("the filename is longer than 255 bytes")
	ErrEncoding = errors.New("the filename is not valid UTF-8")
	ErrControl  = errors.New("the filename contains a NUL or control character")
	ErrDots     = errors.New(`the filename is "." or ".."`)
)

// Clean returns the name to keep for a file the client called name. A name with a directory part
// ("reports/q1.csv", or "C:\Users\me\q1.csv" as some clients send) keeps only its last element; a
// name that is already one element is kept exactly as given. Names that cannot be shown or used
// safely are refused: empty (or only spaces), ".", "..", longer than MaxLen, not UTF-8, or holding
// NUL, a control character, or a bidirectional override that would make it display as another name.
func Clean(name string) (string, error) {
	if !utf8.ValidString(name) {
		return "", ErrEncoding
	}
	for _, r := range name {
		if unicode.IsControl(r) || isBidiControl(r) {
			return "", ErrControl
		}
	}
	if i := strings.LastIndexAny(name, `/\`); i >= 0 {
		name = name[i+1:]
	}
	switch {
	case strings.TrimSpace(name) == "":
		return "", ErrEmpty
	case name == "." || name == "..":
		return "", ErrDots
	case len(name) > MaxLen:
		return "", ErrTooLong
	}
	return name, nil
}

// isBidiControl reports whether r reorders the text around it (embeddings, overrides, isolates):
// "evil\u202Efdp.exe" displays as "evilexe.pdf".
func isBidiControl(r rune) bool {
	return (r >= 0x202A && r <= 0x202E) || (r >= 0x2066 && r <= 0x2069) || r == 0x200E || r == 0x200F || r == 0x061C
}
