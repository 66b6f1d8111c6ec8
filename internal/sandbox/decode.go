package sandbox

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// DefaultOutputLimit is the output cap of DecodeExecution when its limit is <= 0.
const DefaultOutputLimit = 10 << 20

// lineSlack is how far one line may exceed the output limit before it is skipped unread: enough for
// the JSON around a payload that fits, and for an error's traceback, which is not counted.
const lineSlack = 1 << 20

// DecodeExecution reads an execution stream (one JSON message per "\n"-terminated line, as e2b's
// code-interpreter server and the local kernel write it) up to end_of_execution and assembles its
// Result the way e2b's SDKs do: stdout and stderr text appended, results collected, the last error
// kept, number_of_executions setting ExecutionCount, keepalive and unknown types ignored. Whatever
// follows end_of_execution is not read.
//
// limit caps the bytes of output kept (stdout + stderr + result payloads; DefaultOutputLimit when
// <= 0). Output beyond it is dropped: stdout/stderr text is cut at the limit, a result that does not
// fit whole is left out, and everything after is left out too. The Result then has Truncated set and
// the note "[output truncated: over N bytes]" at the end of Stdout. Decoding goes on to
// end_of_execution regardless, so the stream is always drained. A line far longer than the limit is
// skipped without being held in memory.
//
// onMessage, when non-nil, is called from the calling goroutine for every message in stream order,
// after the limit is applied (a cut chunk arrives cut; a dropped message does not arrive). It must not
// retain the Message.
//
// A stream that ends before end_of_execution returns what arrived and an error wrapping
// ErrIncomplete (and the read error, if any). A line that is not a JSON object returns what arrived
// and an error naming the line.
func DecodeExecution(r io.Reader, limit int, onMessage func(Message)) (Result, error) {
	if limit <= 0 {
		limit = DefaultOutputLimit
	}
	d := decoder{limit: limit, onMessage: onMessage}
	lr := lineReader{br: bufio.NewReaderSize(r, 16<<10), max: limit + lineSlack}
	for n := 1; ; n++ {
		line, tooLong, err := lr.next()
		if tooLong {
			d.truncate()
		} else if line = bytes.TrimSpace(line); len(line) > 0 {
			done, perr := d.line(line)
			if perr != nil && err != nil {
				// An unterminated last line that does not parse is a stream cut mid-line.
				return d.finish(), fmt.Errorf("%w: cut inside line %d: %w", ErrIncomplete, n, perr)
			}
			if perr != nil {
				return d.finish(), fmt.Errorf("sandbox: execution stream line %d: %w", n, perr)
			}
			if done {
				return d.finish(), nil
			}
		}
		if errors.Is(err, io.EOF) {
			return d.finish(), fmt.Errorf("%w: no end_of_execution after %d lines", ErrIncomplete, n-1)
		}
		if err != nil {
			return d.finish(), fmt.Errorf("%w: %w", ErrIncomplete, err)
		}
	}
}

// decoder accumulates one Result.
type decoder struct {
	limit     int
	used      int
	truncated bool
	stdout    strings.Builder
	stderr    strings.Builder
	res       Result
	onMessage func(Message)
}

// line handles one non-empty line and reports whether it was end_of_execution.
func (d *decoder) line(line []byte) (bool, error) {
	if line[0] != '{' {
		return false, errors.New("not a JSON object")
	}
	var w wireMessage
	if err := json.Unmarshal(line, &w); err != nil {
		return false, err
	}
	m := w.message()
	switch m.Type {
	case MessageStdout, MessageStderr:
		if !d.keepText(&m.Text) {
			return false, nil
		}
		if m.Type == MessageStdout {
			d.stdout.WriteString(m.Text)
		} else {
			d.stderr.WriteString(m.Text)
		}
	case MessageResult:
		size := m.Output.payloadSize()
		if d.truncated || size > d.limit-d.used {
			d.truncate()
			return false, nil
		}
		d.used += size
		d.res.Results = append(d.res.Results, m.Output)
	case MessageError:
		e := m.ExecError
		d.res.Error = &e
	case MessageNumberOfExecutions:
		d.res.ExecutionCount = m.ExecutionCount
	}
	if d.onMessage != nil {
		d.onMessage(m)
	}
	return m.Type == MessageEndOfExecution, nil
}

// keepText cuts *s to the remaining budget and reports whether anything is left to keep.
func (d *decoder) keepText(s *string) bool {
	if d.truncated {
		return false
	}
	room := d.limit - d.used
	if len(*s) > room {
		cut := room
		for cut > 0 && !utf8.RuneStart((*s)[cut]) {
			cut--
		}
		*s = (*s)[:cut]
		d.truncate()
	}
	d.used += len(*s)
	return len(*s) > 0
}

func (d *decoder) truncate() { d.truncated = true }

// finish returns the Result assembled so far, with the truncation note.
func (d *decoder) finish() Result {
	r := d.res
	if d.truncated {
		if d.stdout.Len() > 0 && !strings.HasSuffix(d.stdout.String(), "\n") {
			d.stdout.WriteByte('\n')
		}
		fmt.Fprintf(&d.stdout, "[output truncated: over %d bytes]\n", d.limit)
		r.Truncated = true
	}
	r.Stdout = d.stdout.String()
	r.Stderr = d.stderr.String()
	return r
}

// lineReader reads "\n"-terminated lines of any length, keeping at most max bytes of one.
type lineReader struct {
	br  *bufio.Reader
	max int
	buf []byte
}

// next returns the next line without its terminator. tooLong reports a line longer than max, of
// which nothing is returned. At the end of the stream err is io.EOF, and line is the unterminated
// rest, if any.
func (l *lineReader) next() (line []byte, tooLong bool, err error) {
	l.buf = l.buf[:0]
	for {
		frag, err := l.br.ReadSlice('\n')
		if !tooLong {
			if len(l.buf)+len(frag) > l.max+1 { // +1: the terminator
				tooLong = true
				l.buf = l.buf[:0]
			} else {
				l.buf = append(l.buf, frag...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimSuffix(l.buf, []byte("\n")), tooLong, err
	}
}
