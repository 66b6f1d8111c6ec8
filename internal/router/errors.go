package router

import (
	"context"
	"errors"
	"net/http"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

// handlerFunc is a handler that reports failure by returning an error instead of writing it.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// handle adapts h to http.Handler. A returned error is written in one place: an upstream's own
// error answer (*upstream.StatusError, as the interceptor returns it) is sent as it came, as
// pass-through would have sent it; a failure of the state store to answer (store.ErrUnavailable
// anywhere in the chain, even under a sandbox error) is a 503 the client may retry; an
// *apierror.Error in the chain is sent as it is (its cause only logged); anything else becomes a
// generic 500 whose details reach the log only. When the
// response has already started, nothing more can be sent honestly, so the error is logged
// instead. A request whose client went away is not an error.
func (s *server) handle(h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ww := wrapWriter(w)
		err := h(ww, r)
		if err == nil {
			return
		}
		if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
			ended := apierror.Ended(r.Context())
			if ended == nil {
				return // the client left; the access log records 499
			}
			err = ended // the server ended the request (shutting down), with the error to answer
		}
		var us *upstream.StatusError
		if errors.As(err, &us) && !ww.started() {
			if us.Status >= 500 {
				s.log.Warn("upstream failed", zap.String("request_id", RequestID(r.Context())),
					zap.String("path", r.URL.Path), zap.Int("status", us.Status))
			}
			us.Write(ww)
			return
		}
		e := apierror.From(err)
		if errors.Is(err, store.ErrUnavailable) {
			e = storeUnavailable(err)
		}
		fields := []zap.Field{
			zap.String("request_id", RequestID(r.Context())),
			zap.String("path", r.URL.Path),
			zap.Int("status", e.Status),
		}
		if ww.started() {
			s.log.Error("error after the response started", append(fields, zap.Error(err))...)
			return
		}
		if e.Err != nil || e.Status >= 500 {
			s.log.Warn("request failed", append(fields, zap.Error(err))...)
		}
		apierror.Write(ww, e)
	}
}

// storeUnavailable is the answer when the state store (Redis, for replicas) cannot be reached:
// what needs it fails until it is back, and the client may retry.
func storeUnavailable(cause error) *apierror.Error {
	return &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeServer, Code: apierror.CodeStoreUnavailable,
		Message: "The service's state store is unavailable; please try again shortly.", Err: cause}
}

// notFound answers an unknown path in OpenAI's shape.
func notFound(w http.ResponseWriter, r *http.Request) error {
	return apierror.NotFound("Invalid URL ("+r.Method+" "+r.URL.Path+")", "")
}

// methodNotAllowed answers a known path with a method it does not serve.
func methodNotAllowed(w http.ResponseWriter, r *http.Request) error {
	return &apierror.Error{
		Status:  http.StatusMethodNotAllowed,
		Message: "Method " + r.Method + " is not allowed for " + r.URL.Path + ".",
		Type:    apierror.TypeInvalidRequest,
	}
}
