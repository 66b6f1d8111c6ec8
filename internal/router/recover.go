package router

import (
	"errors"
	"net/http"
	"runtime/debug"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/apierror"
)

// recoverer turns a panic into a generic OpenAI-shaped 500 when nothing was written yet. The panic
// value and stack go to the log only. http.ErrAbortHandler passes through untouched (it is how a
// handler aborts a response on purpose), and a panic after the response started becomes one, since
// a second status line cannot be sent and a silently truncated body would look complete.
func recoverer(log *zap.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ww := wrapWriter(w)
			defer func() {
				p := recover()
				if p == nil {
					return
				}
				if err, ok := p.(error); ok && errors.Is(err, http.ErrAbortHandler) {
					panic(p)
				}
				log.Error("panic serving request",
					zap.String("request_id", RequestID(r.Context())),
					zap.String("method", r.Method),
					zap.String("path", r.URL.Path),
					zap.Any("panic", p),
					zap.ByteString("stack", debug.Stack()))
				if ww.started() {
					panic(http.ErrAbortHandler)
				}
				apierror.Write(ww, apierror.From(nil))
			}()
			next.ServeHTTP(ww, r)
		})
	}
}
