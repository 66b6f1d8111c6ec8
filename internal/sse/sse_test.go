package sse

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// decodeAll reads every event of r and the error that ended the stream.
func decodeAll(r *Reader) ([]Event, error) {
	var evs []Event
	for {
		ev, err := r.Next()
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
}

func ev(name, data string) Event { return Event{Name: name, Data: []byte(data)} }

func TestSSEReader(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []Event
	}{
		{"named events", "event: a\ndata: 1\n\nevent: b\ndata: 2\n\n", []Event{ev("a", "1"), ev("b", "2")}},
		{"unnamed event has no name", "data: x\n\n", []Event{ev("", "x")}},
		{"multi-line data joined with LF", "data: l1\ndata: l2\ndata:\ndata: l4\n\n", []Event{ev("", "l1\nl2\n\nl4")}},
		{"CRLF line endings", "event: a\r\ndata: 1\r\ndata: 2\r\n\r\ndata: 3\r\n\r\n", []Event{ev("a", "1\n2"), ev("", "3")}},
		{"CR line endings", "event: a\rdata: 1\r\rdata: 2\r\r", []Event{ev("a", "1"), ev("", "2")}},
		{"comments skipped", ": ping\n:\ndata: x\n: between\ndata: y\n\n: trailing\n\n", []Event{ev("", "x\ny")}},
		{"only the first space after the colon is dropped", "data:  two\ndata:none\n\n", []Event{ev("", " two\nnone")}},
		{"field without colon is an empty value", "data\ndata\n\n", []Event{ev("", "\n")}},
		{"empty data line dispatches an empty event", "data:\n\n", []Event{ev("", "")}},
		{"event without data is not dispatched", "event: lonely\n\ndata: x\n\n", []Event{ev("", "x")}},
		{"id and retry and unknown fields ignored", "id: 7\nretry: 10\nfoo: bar\ndata: x\n\n", []Event{ev("", "x")}},
		{"DONE is an ordinary event", "data: {\"a\":1}\n\ndata: [DONE]\n\n", []Event{ev("", `{"a":1}`), ev("", "[DONE]")}},
		{"last event without blank line still returned", "data: a\n\ndata: b", []Event{ev("", "a"), ev("", "b")}},
		{"byte order mark stripped", "\xef\xbb\xbfdata: x\n\n", []Event{ev("", "x")}},
		{"extra blank lines between events", "\n\n\ndata: x\n\n\n\ndata: y\n\n", []Event{ev("", "x"), ev("", "y")}},
		{"colon inside the value kept", "data: {\"a\":\"b:c\"}\n\n", []Event{ev("", `{"a":"b:c"}`)}},
		{"empty stream", "", nil},
	}
	readers := []struct {
		name string
		wrap func(io.Reader) io.Reader
	}{
		{"whole", func(r io.Reader) io.Reader { return r }},
		{"one byte at a time", iotest.OneByteReader},
		{"half reads", iotest.HalfReader},
		{"data with EOF", iotest.DataErrReader},
	}
	for _, tc := range tests {
		for _, rd := range readers {
			t.Run(tc.name+"/"+rd.name, func(t *testing.T) {
				got, err := decodeAll(NewReader(rd.wrap(strings.NewReader(tc.in))))
				if err != io.EOF {
					t.Fatalf("Next error = %v; want io.EOF", err)
				}
				if !eventsEqual(got, tc.want) {
					t.Errorf("events(%q) = %s; want %s", tc.in, fmtEvents(got), fmtEvents(tc.want))
				}
			})
		}
	}
}

func TestSSEReaderOversize(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []Event // events before the error
	}{
		{"data line over the cap", "data: ok\n\ndata: " + strings.Repeat("x", 40) + "\n\n", []Event{ev("", "ok")}},
		{"data lines adding up over the cap", "data: " + strings.Repeat("x", 20) + "\ndata: " + strings.Repeat("y", 20) + "\n\n", nil},
		{"comment line over the line cap", ": " + strings.Repeat("c", 100) + "\ndata: x\n\n", nil},
		{"unterminated line over the line cap", "data: " + strings.Repeat("x", 100), nil},
	}
	for _, tc := range tests {
		for _, one := range []bool{false, true} {
			name := tc.name
			var r io.Reader = strings.NewReader(tc.in)
			if one {
				name += "/one byte at a time"
				r = iotest.OneByteReader(r)
			}
			t.Run(name, func(t *testing.T) {
				sr := NewReaderSize(r, 32)
				got, err := decodeAll(sr)
				if !errors.Is(err, ErrEventTooLarge) {
					t.Fatalf("error = %v; want ErrEventTooLarge", err)
				}
				if !eventsEqual(got, tc.want) {
					t.Errorf("events before the error = %s; want %s", fmtEvents(got), fmtEvents(tc.want))
				}
				if _, err2 := sr.Next(); !errors.Is(err2, ErrEventTooLarge) {
					t.Errorf("Next after the error = %v; want the same error", err2)
				}
			})
		}
	}
	// Exactly at the cap is fine.
	got, err := decodeAll(NewReaderSize(strings.NewReader("data: "+strings.Repeat("x", 32)+"\n\n"), 32))
	if err != io.EOF || len(got) != 1 || len(got[0].Data) != 32 {
		t.Errorf("event of exactly the cap: %d events, %v", len(got), err)
	}
}

func TestSSEReaderReadError(t *testing.T) {
	boom := errors.New("connection reset")
	r := NewReader(io.MultiReader(strings.NewReader("data: a\n\ndata: partial"), iotest.ErrReader(boom)))
	got, err := decodeAll(r)
	if !errors.Is(err, boom) {
		t.Fatalf("error = %v; want the read error", err)
	}
	if !eventsEqual(got, []Event{ev("", "a")}) {
		t.Errorf("events = %s; want only the complete one", fmtEvents(got))
	}
}

func TestSSEReaderDataIsOwned(t *testing.T) {
	r := NewReader(strings.NewReader("data: first\n\ndata: second\n\n"))
	a, _ := r.Next()
	b, _ := r.Next()
	if string(a.Data) != "first" || string(b.Data) != "second" {
		t.Errorf("events = %q, %q; earlier data was overwritten", a.Data, b.Data)
	}
}

func TestSSEReaderLongLines(t *testing.T) {
	// Lines much longer than the initial buffer, split over many reads.
	big := strings.Repeat("0123456789", 50_000)
	in := "event: big\ndata: " + big + "\r\n\r\ndata: small\n\n"
	got, err := decodeAll(NewReader(iotest.HalfReader(strings.NewReader(in))))
	if err != io.EOF || !eventsEqual(got, []Event{ev("big", big), ev("", "small")}) {
		t.Errorf("long line: %d events, error %v", len(got), err)
	}
}

// chunkReader returns data in chunks whose sizes cycle through sizes (each 1..16).
type chunkReader struct {
	data  []byte
	sizes []byte
	i     int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(c.sizes) > 0 {
		n = int(c.sizes[c.i%len(c.sizes)]%16) + 1
		c.i++
	}
	n = min(n, len(p), len(c.data))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

func FuzzSSEReader(f *testing.F) {
	seeds := []string{
		"event: response.created\ndata: {\"type\":\"response.created\"}\n\n",
		"data: a\r\ndata: b\r\n\r\n",
		"data: a\rdata: b\r\r",
		": comment\n\ndata:x\n\n",
		"\xef\xbb\xbfdata: bom\n\n",
		"data: [DONE]\n\n",
		"data: unterminated",
		"data: " + strings.Repeat("z", 80) + "\n\n",
		"event\ndata\n\n\r\n\r",
	}
	for _, s := range seeds {
		f.Add([]byte(s), []byte{0, 3, 7})
	}
	f.Fuzz(func(t *testing.T, data, sizes []byte) {
		const max = 64
		whole, werr := decodeAll(NewReaderSize(bytes.NewReader(data), max))
		chunked, cerr := decodeAll(NewReaderSize(&chunkReader{data: data, sizes: sizes}, max))
		if (werr == io.EOF) != (cerr == io.EOF) || errors.Is(werr, ErrEventTooLarge) != errors.Is(cerr, ErrEventTooLarge) {
			t.Fatalf("errors differ: whole %v, chunked %v", werr, cerr)
		}
		if !eventsEqual(whole, chunked) {
			t.Fatalf("events differ by chunking:\nwhole   %s\nchunked %s", fmtEvents(whole), fmtEvents(chunked))
		}
		for _, e := range whole {
			if len(e.Data) > max {
				t.Fatalf("event data of %d bytes passed a cap of %d", len(e.Data), max)
			}
		}
	})
}

func eventsEqual(a, b []Event) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || !bytes.Equal(a[i].Data, b[i].Data) {
			return false
		}
	}
	return true
}

func fmtEvents(evs []Event) string {
	var b strings.Builder
	b.WriteString("[")
	for i, e := range evs {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%q:%q", e.Name, e.Data)
	}
	b.WriteString("]")
	return b.String()
}
