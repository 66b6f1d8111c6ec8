package router

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/ciproxy/ciproxy/internal/apierror"
)

// bodyLimit caps the request body at general_settings.max_request_body_size of the request's
// configuration snapshot. A declared Content-Length over the cap is refused before reading;
// otherwise the body is wrapped so that reading past the cap fails (see readBody).
func bodyLimit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cfg := configFrom(r.Context())
		if cfg == nil || cfg.General.MaxRequestBodySize <= 0 {
			next.ServeHTTP(w, r)
			return
		}
		limit := cfg.General.MaxRequestBodySize
		if r.ContentLength > limit {
			apierror.Write(w, tooLarge(limit))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		next.ServeHTTP(w, r)
	})
}

// unreadBodyDeadline bounds what is left of a request once its handler returns. To keep the
// connection alive, net/http reads up to 256 KiB of a body the handler did not read (a 401, a 404,
// a 413 on a declared length) before it sends the answer, with no deadline of its own: a client
// trickling that body, with or without a key, would hold the connection and its goroutine forever.
// With the body read timeout as the deadline it gets its answer then, and the connection is closed.
// A body read to its end is unaffected: the next request's read sets its own deadline.
func (s *server) unreadBodyDeadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		if r.ContentLength != 0 {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.bodyTimeout))
		}
	})
}

// readBody reads the whole request body under a read deadline of timeout, so a client that sends
// its headers and then trickles the body cannot hold a connection forever. After a complete read
// the deadline is cleared (the connection's idle reads must not inherit it); after a failed one it
// stays, and the connection is closed after the error response, since what remains of the body
// can no longer be read.
func readBody(w http.ResponseWriter, r *http.Request, timeout time.Duration) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	rc := http.NewResponseController(w)
	// ErrNotSupported (a writer without deadlines, as in unit tests) only loses the deadline.
	_ = rc.SetReadDeadline(time.Now().Add(timeout))

	var b bytes.Buffer
	if r.ContentLength > 0 {
		b.Grow(int(r.ContentLength) + bytes.MinRead) // room for the final read that sees EOF
	}
	_, err := b.ReadFrom(r.Body)
	if err == nil {
		_ = rc.SetReadDeadline(time.Time{})
		return b.Bytes(), nil
	}
	// Without this, net/http would try to read the rest of the body before answering, to keep
	// the connection alive, and wait on the client that just failed to send it.
	w.Header().Set("Connection", "close")
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return nil, tooLarge(tooBig.Limit)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, &apierror.Error{Status: http.StatusRequestTimeout, Message: "Timed out reading the request body.", Type: apierror.TypeInvalidRequest, Err: err}
	case r.Context().Err() != nil:
		return nil, fmt.Errorf("reading request body: %w", r.Context().Err())
	default:
		return nil, &apierror.Error{Status: http.StatusBadRequest, Message: "Could not read the request body.", Type: apierror.TypeInvalidRequest, Err: err}
	}
}

func tooLarge(limit int64) *apierror.Error {
	return &apierror.Error{
		Status:  http.StatusRequestEntityTooLarge,
		Message: "The request body is larger than the limit of " + strconv.FormatInt(limit, 10) + " bytes.",
		Type:    apierror.TypeInvalidRequest,
		Code:    apierror.CodeRequestTooLarge,
	}
}
