package sandbox

import (
	"errors"
	"io"
	"strings"
	"unicode/utf8"
)

// CappedReader reads r until max bytes, then ends as if r had ended, noting (Over) that r had
// more; an error from r also ends it (Err). The backends send a file they write into a sandbox
// through one, so that a file larger than the limit is refused without being read whole.
type CappedReader struct {
	r    io.Reader
	max  int64
	n    int64
	over bool
	err  error
}

// NewCappedReader returns a CappedReader of r that passes at most max bytes.
func NewCappedReader(r io.Reader, max int64) *CappedReader { return &CappedReader{r: r, max: max} }

// Over reports whether r held more than max bytes.
func (c *CappedReader) Over() bool { return c.over }

// Err is the error that ended r, if one did (the reader itself then reported an end).
func (c *CappedReader) Err() error { return c.err }

func (c *CappedReader) Read(b []byte) (int, error) {
	if c.over || c.err != nil {
		return 0, io.EOF
	}
	// One byte past max is read, to tell a source of exactly max bytes from a longer one; written
	// so that a max of math.MaxInt64 (no limit) does not overflow.
	if room := c.max - c.n; room < int64(len(b))-1 {
		b = b[:room+1]
	}
	n, err := c.r.Read(b)
	if c.n+int64(n) > c.max {
		c.over = true
		n = int(c.max - c.n)
	}
	c.n += int64(n)
	switch {
	case errors.Is(err, io.EOF):
		return n, io.EOF
	case err != nil:
		c.err = err
		return n, io.EOF
	}
	return n, nil
}

// UTF8Decoder turns a byte stream into valid UTF-8 pieces, as Shell's ExecOptions.OnOutput
// promises: a sequence cut at the end of a piece is held for the next one, invalid bytes become
// U+FFFD. The zero value is ready to use.
type UTF8Decoder struct{ held []byte }

// Decode returns the text of b and what was held before it, holding an incomplete sequence at
// its end (at most 3 bytes).
func (u *UTF8Decoder) Decode(b []byte) string {
	b = append(u.held, b...)
	u.held = nil
	for i := 1; i <= 3 && i <= len(b); i++ {
		c := b[len(b)-i]
		if c < 0x80 {
			break
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(b[len(b)-i:]) {
				u.held = append([]byte(nil), b[len(b)-i:]...)
				b = b[:len(b)-i]
			}
			break
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// Flush returns what is held, at the stream's end.
func (u *UTF8Decoder) Flush() string {
	s := strings.ToValidUTF8(string(u.held), "\uFFFD")
	u.held = nil
	return s
}
