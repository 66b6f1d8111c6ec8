package router

import (
	"context"
	"net/http"
	"time"

	"go.uber.org/zap"
)

// logFields are request facts that handlers learn and the access log prints. Only the request's
// own goroutine writes them, before the handler returns.
type logFields struct {
	model      string
	deployment string
}

type ctxKeyLogFields struct{}

// annotate records the model and the first deployment tried, for the access log. No-op outside
// the router's chain.
func annotate(ctx context.Context, model, deployment string) {
	if f, ok := ctx.Value(ctxKeyLogFields{}).(*logFields); ok {
		f.model, f.deployment = model, deployment
	}
}

// accessLog writes one line per request: id, method, path, status, bytes, duration, model and
// deployment. It never logs a body, a query string or a header, so no key can reach the log.
func accessLog(log *zap.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			ww := wrapWriter(w)
			f := &logFields{}
			r = r.WithContext(context.WithValue(r.Context(), ctxKeyLogFields{}, f))
			aborted := true
			defer func() {
				status := ww.outcome(r, aborted)
				fields := []zap.Field{
					zap.String("request_id", RequestID(r.Context())),
					zap.String("method", r.Method),
					zap.String("path", r.URL.Path),
					zap.Int("status", status),
					zap.Int64("bytes", ww.bytes),
					zap.Duration("duration", time.Since(start)),
				}
				if f.model != "" {
					fields = append(fields, zap.String("model", f.model))
				}
				if f.deployment != "" {
					fields = append(fields, zap.String("deployment", f.deployment))
				}
				if aborted {
					fields = append(fields, zap.Bool("aborted", true))
				}
				log.Info("request", fields...)
			}()
			next.ServeHTTP(ww, r)
			aborted = false
			// net/http sends a buffered response only after the handler returns, which would put
			// the log write on the client's critical path. With a Content-Length the body is
			// complete, so flushing now changes nothing on the wire but the timing.
			if ww.started() && ww.Header().Get("Content-Length") != "" {
				_ = ww.FlushError()
			}
		})
	}
}
