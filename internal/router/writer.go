package router

import (
	"net/http"

	"github.com/ciproxy/ciproxy/internal/upstream"
)

// responseWriter records the status and size of a response for the access log, metrics and the
// error adapter. It keeps Flush (FlushError) and exposes Unwrap, so http.NewResponseController and
// httputil.ReverseProxy reach the connection's own Flusher, deadlines and Hijacker through it.
type responseWriter struct {
	http.ResponseWriter
	status int   // 0 until the header is written
	bytes  int64 // body bytes written
}

var (
	_ http.Flusher                              = (*responseWriter)(nil)
	_ interface{ FlushError() error }           = (*responseWriter)(nil)
	_ interface{ Unwrap() http.ResponseWriter } = (*responseWriter)(nil)
)

// wrapWriter returns w itself when it already is the router's writer, otherwise a new wrapper.
func wrapWriter(w http.ResponseWriter) *responseWriter {
	if rw, ok := w.(*responseWriter); ok {
		return rw
	}
	return &responseWriter{ResponseWriter: w}
}

// outcome is the status the access log and metrics record for r's response: the one written, or
// for a response that wrote nothing, 499 (upstream.StatusClientClosedRequest) when the client left,
// else 200 (what net/http sends for a handler that wrote nothing) unless the handler aborted,
// when it stays 0.
func (w *responseWriter) outcome(r *http.Request, aborted bool) int {
	switch {
	case w.status != 0:
		return w.status
	case r.Context().Err() != nil:
		return upstream.StatusClientClosedRequest
	case !aborted:
		return http.StatusOK
	}
	return 0
}

// started reports whether the response header has been sent (or is committed by a write).
func (w *responseWriter) started() bool { return w.status != 0 }

// WriteHeader records the first status and passes every call on, so 1xx informational headers
// still reach the client.
func (w *responseWriter) WriteHeader(code int) {
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

// FlushError flushes buffered data to the client; http.NewResponseController prefers it to Flush.
func (w *responseWriter) FlushError() error {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush implements http.Flusher for callers that type-assert instead of using a ResponseController.
func (w *responseWriter) Flush() { _ = w.FlushError() }

// Unwrap returns the wrapped writer, for http.NewResponseController.
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
