package intercept

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"go.uber.org/zap"
)

// renderer writes the events of one request: as a stream (sseRenderer) or as one JSON Response
// (jsonRenderer). Both consume the same events.
type renderer interface {
	// emit renders one event. An error means the client is gone.
	emit(ev Event) error
	// started reports whether anything was written.
	started() bool
	// done completes the response after the terminal event.
	done()
	// writeError answers with err; only when nothing was written.
	writeError(err error)
}

// sseRenderer writes events as server-sent events, numbering them and flushing after each one.
type sseRenderer struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	log     *zap.Logger
	seq     int
	begun   bool
	buf     []byte
	flushOK bool
}

func newSSERenderer(w http.ResponseWriter, log *zap.Logger) *sseRenderer {
	return &sseRenderer{w: w, rc: http.NewResponseController(w), log: log, flushOK: true}
}

func (s *sseRenderer) started() bool { return s.begun }

// emit implements [renderer.emit]: sequence_number is assigned here, and only here.
func (s *sseRenderer) emit(ev Event) error {
	if !s.begun {
		s.begun = true
		h := s.w.Header()
		h.Set("Content-Type", "text/event-stream; charset=utf-8")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
		h.Del("Content-Length")
		s.w.WriteHeader(http.StatusOK)
	}
	data := numbered(ev.Data, s.seq)
	s.seq++
	if bytes.IndexByte(data, '\n') >= 0 {
		var c bytes.Buffer
		if json.Compact(&c, data) == nil {
			data = c.Bytes()
		}
	}
	b := s.buf[:0]
	b = append(b, "event: "...)
	b = append(b, ev.Type...)
	b = append(b, "\ndata: "...)
	b = append(b, data...)
	b = append(b, "\n\n"...)
	s.buf = b
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	if err := s.rc.Flush(); err != nil {
		if errors.Is(err, http.ErrNotSupported) {
			// A wrapper hides Flush: a wiring bug, the stream would arrive in one piece.
			if s.flushOK {
				s.flushOK = false
				s.log.Error("intercept: the response writer cannot flush; events are buffered")
			}
			return nil
		}
		return err
	}
	return nil
}

// numbered returns data with its sequence_number set to n.
func numbered(data []byte, n int) []byte {
	r := gjson.GetBytes(data, "sequence_number")
	if !r.Exists() || r.Index <= 0 {
		out, err := sjson.SetBytes(data, "sequence_number", n)
		if err != nil {
			return data
		}
		return out
	}
	num := strconv.Itoa(n)
	out := make([]byte, 0, len(data)+len(num))
	out = append(out, data[:r.Index]...)
	out = append(out, num...)
	return append(out, data[r.Index+len(r.Raw):]...)
}

func (s *sseRenderer) done() {}

func (s *sseRenderer) writeError(err error) { writeError(s.w, err) }
