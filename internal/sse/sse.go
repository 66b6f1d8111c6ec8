// Package sse reads server-sent events (text/event-stream): the upstream client reads a Responses
// upstream's stream with it, and the Chat Completions seam a chat upstream's chunks.
package sse

import (
	"bytes"
	"errors"
	"fmt"
	"io"
)

// DefaultMaxEventSize is the largest event data a Reader from NewReader accepts. A Responses
// API event carries at most one output item, but a response.completed event repeats the whole
// response, images included, so the cap is generous.
const DefaultMaxEventSize = 16 << 20

// ErrEventTooLarge is returned when an event's data, or a single line, exceeds the reader's cap.
var ErrEventTooLarge = errors.New("sse: server-sent event too large")

// Event is one server-sent event.
type Event struct {
	// Name is the value of the event's "event:" line, "" when it had none.
	Name string
	// Data is the event's "data:" lines joined with "\n". The caller owns it.
	Data []byte
}

// Reader decodes a text/event-stream (the WHATWG EventSource format): lines end with LF, CRLF or
// CR; lines starting with ":" are comments; one space after "field:" is dropped; "id" and "retry"
// are ignored; an event without data lines is not dispatched. "data: [DONE]" is an ordinary event
// whose Data is "[DONE]". An event left open when the stream ends is still returned, so a server
// that omits the final blank line loses nothing; a stream cut mid-event shows up to the caller as
// invalid or incomplete data.
//
// A Reader is not safe for concurrent use.
type Reader struct {
	r        io.Reader
	buf      []byte
	start    int   // first unread byte of buf
	end      int   // end of the bytes read into buf
	scanned  int   // bytes after start known to hold no line ending
	rerr     error // sticky error from r
	err      error // sticky error Next returns
	max      int
	lineMax  int
	skipLF   bool // the previous line ended in CR at the end of the buffer; drop a leading LF
	bomDone  bool
	hasData  bool
	data     []byte
	name     string
	lastName string // reused, so repeated event names cost no allocation
}

// NewReader returns a reader of the events in r, with events capped at DefaultMaxEventSize.
func NewReader(r io.Reader) *Reader { return NewReaderSize(r, DefaultMaxEventSize) }

// NewReaderSize returns a reader whose events (and lines) may hold at most max bytes of data;
// max <= 0 means DefaultMaxEventSize.
func NewReaderSize(r io.Reader, max int) *Reader {
	if max <= 0 {
		max = DefaultMaxEventSize
	}
	return &Reader{r: r, max: max, lineMax: max + len("event: \r\n")}
}

// Next returns the next event, or io.EOF after the last one. Any other error (ErrEventTooLarge, or
// r's read error) ends the stream; later calls return it again.
func (s *Reader) Next() (Event, error) {
	if s.err != nil {
		return Event{}, s.err
	}
	for {
		line, err := s.readLine()
		if err != nil {
			s.err = err
			if err == io.EOF && s.hasData {
				return s.dispatch(), nil
			}
			return Event{}, err
		}
		if len(line) == 0 {
			if s.hasData {
				return s.dispatch(), nil
			}
			s.name = ""
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value := line, line[len(line):]
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) {
		case "data":
			n := len(s.data) + len(value)
			if s.hasData {
				n++
			}
			if n > s.max {
				s.err = fmt.Errorf("%w: data over %d bytes", ErrEventTooLarge, s.max)
				return Event{}, s.err
			}
			if s.hasData {
				s.data = append(s.data, '\n')
			}
			s.data = append(s.data, value...)
			s.hasData = true
		case "event":
			if string(value) != s.lastName {
				s.lastName = string(value)
			}
			s.name = s.lastName
		}
	}
}

func (s *Reader) dispatch() Event {
	ev := Event{Name: s.name, Data: make([]byte, len(s.data))}
	copy(ev.Data, s.data)
	s.name, s.hasData = "", false
	if cap(s.data) > 1<<16 {
		s.data = nil // do not pin one huge event's buffer for the rest of a long stream
	} else {
		s.data = s.data[:0]
	}
	return ev
}

// readLine returns the next line without its ending. The slice is valid until the next call. At
// the end of r, an unterminated last line is returned before the error.
func (s *Reader) readLine() ([]byte, error) {
	for {
		if s.skipLF && s.start < s.end {
			if s.buf[s.start] == '\n' {
				s.start++
			}
			s.skipLF = false
		}
		win := s.buf[s.start:s.end]
		if !s.bomDone {
			// A UTF-8 byte order mark at the very start is not part of the first line.
			const bom = "\xef\xbb\xbf"
			if len(win) < len(bom) && s.rerr == nil && bom[:len(win)] == string(win) {
				s.fill()
				continue
			}
			if bytes.HasPrefix(win, []byte(bom)) {
				s.start += len(bom)
				win = win[len(bom):]
			}
			s.bomDone = true
		}
		if i := indexEOL(win[s.scanned:]); i >= 0 {
			i += s.scanned
			line := win[:i]
			s.start += i + 1
			s.scanned = 0
			if win[i] == '\r' {
				if i+1 < len(win) {
					if win[i+1] == '\n' {
						s.start++
					}
				} else {
					s.skipLF = true
				}
			}
			if len(line) > s.lineMax {
				return nil, fmt.Errorf("%w: line over %d bytes", ErrEventTooLarge, s.lineMax)
			}
			return line, nil
		}
		s.scanned = len(win)
		if len(win) > s.lineMax {
			return nil, fmt.Errorf("%w: line over %d bytes", ErrEventTooLarge, s.lineMax)
		}
		if s.rerr != nil {
			if len(win) > 0 {
				s.start, s.scanned = s.end, 0
				return win, nil
			}
			return nil, s.rerr
		}
		s.fill()
	}
}

// fill reads more of r into buf, making room first.
func (s *Reader) fill() {
	if s.start == s.end {
		s.start, s.end = 0, 0
		if cap(s.buf) > 1<<16 {
			s.buf = nil // a long line is over; go back to a small buffer
		}
	}
	if s.buf == nil {
		s.buf = make([]byte, 4096)
	}
	if s.end == len(s.buf) {
		if s.start > 0 {
			s.end = copy(s.buf, s.buf[s.start:s.end])
			s.start = 0
		} else {
			// The line is longer than the buffer. Growing past lineMax+1 is never needed: by then
			// the line is known to be too long.
			n := min(2*len(s.buf), s.lineMax+1)
			nb := make([]byte, n)
			copy(nb, s.buf[:s.end])
			s.buf = nb
		}
	}
	for range 100 {
		n, err := s.r.Read(s.buf[s.end:])
		s.end += n
		if err != nil {
			s.rerr = err
			return
		}
		if n > 0 {
			return
		}
	}
	s.rerr = io.ErrNoProgress
}

// indexEOL returns the index of the first CR or LF in b, or -1.
func indexEOL(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return bytes.IndexByte(b, '\r')
	}
	if j := bytes.IndexByte(b[:i], '\r'); j >= 0 {
		return j
	}
	return i
}
