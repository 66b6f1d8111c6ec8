package intercept

import (
	"errors"
	"net/http"

	"go.uber.org/zap"
)

// renderer writes the events of one request: as a stream (sseRenderer) or as one JSON Response
// (jsonRenderer). Both consume the same events.
type renderer interface {
	// emit renders one event. An error means the client is gone.
	emit(ev Event) error
	// started reports whether anything was written. Until it has, a failure is the caller's to
	// answer as an HTTP error.
	started() bool
	// done completes the response after the terminal event.
	done()
}

// sseRenderer writes events as server-sent events, numbering them and flushing after each one.
type sseRenderer struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	log     *zap.Logger
	seq     int
	begun   bool
	data    []byte // the event's JSON object being written
	buf     []byte // the frame being written
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
	s.data = ev.appendJSON(s.data[:0], s.seq)
	s.seq++
	data := compactJSON(s.data) // a data: line holds no line break
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

func (s *sseRenderer) done() {}
