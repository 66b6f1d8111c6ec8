package intercept

// The bound on what one shell command's output keeps, and how it is cut.

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// shellOutput gathers one command's output under its bound: the first and the last characters
// of each stream are kept, whatever the command writes, in memory bounded by the limit.
type shellOutput struct {
	limit    int // characters of stdout and stderr together
	streamed int // characters streamed to the client so far
	streams  [2]boundedText
}

func newShellOutput(limit int) *shellOutput {
	o := &shellOutput{limit: limit}
	o.streams[sandbox.Stdout].keep = limit
	o.streams[sandbox.Stderr].keep = limit
	return o
}

// add takes a piece of output and returns the part of it to stream: none once the command has
// streamed its bound.
func (o *shellOutput) add(s sandbox.Stream, text string) string {
	o.streams[s].add(text)
	left := o.limit - o.streamed
	if left <= 0 {
		return ""
	}
	n := utf8.RuneCountInString(text)
	if n > left {
		text = cutRunes(text, left)
		n = left
	}
	o.streamed += n
	return text
}

// entry returns the command's output entry: each stream whole when both fit the bound together,
// else each cut to its share (half the bound, and what the other leaves unused) with its head and
// tail kept around a line that says how much was left out.
func (o *shellOutput) entry(outcome shellOutcome) shellEntry {
	out, errs := &o.streams[sandbox.Stdout], &o.streams[sandbox.Stderr]
	if out.n+errs.n <= o.limit {
		return shellEntry{Outcome: outcome, Stdout: out.head.String(), Stderr: errs.head.String()}
	}
	outShare, errShare := o.limit/2, o.limit-o.limit/2
	switch {
	case out.n < outShare:
		errShare = o.limit - out.n
	case errs.n < errShare:
		outShare = o.limit - errs.n
	}
	return shellEntry{Outcome: outcome, Stdout: out.text(outShare), Stderr: errs.text(errShare)}
}

// boundedText keeps the first keep characters of a stream and its last ones (up to keep).
type boundedText struct {
	keep int
	n    int // characters seen
	head strings.Builder
	tail []byte // the stream's end, at most about 4 bytes per kept character
}

func (b *boundedText) add(text string) {
	for text != "" {
		if room := b.keep - b.n; room > 0 {
			part := cutRunes(text, room)
			b.head.WriteString(part)
			b.n += utf8.RuneCountInString(part)
			text = text[len(part):]
			continue
		}
		b.n += utf8.RuneCountInString(text)
		b.tail = append(b.tail, text...)
		if max := 8 * b.keep; len(b.tail) > max {
			cut := len(b.tail) - 4*b.keep
			for cut < len(b.tail) && !utf8.RuneStart(b.tail[cut]) {
				cut++
			}
			b.tail = append(b.tail[:0], b.tail[cut:]...)
		}
		return
	}
}

// text is the stream in at most share characters, its middle replaced by a line saying how many
// characters were left out (the line is not counted).
func (b *boundedText) text(share int) string {
	if b.n <= share {
		return b.head.String() + string(b.tail)
	}
	headN := share / 2
	head := cutRunes(b.head.String(), headN)
	all := b.head.String() + string(b.tail)
	tail := lastRunes(all, share-headN)
	omitted := b.n - utf8.RuneCountInString(head) - utf8.RuneCountInString(tail)
	return head + fmt.Sprintf("\n[… %d characters omitted …]\n", omitted) + tail
}

// cutRunes returns the first n characters of s.
func cutRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

// lastRunes returns the last n characters of s.
func lastRunes(s string, n int) string {
	i := len(s)
	for i > 0 && n > 0 {
		_, size := utf8.DecodeLastRuneInString(s[:i])
		i -= size
		n--
	}
	return s[i:]
}
