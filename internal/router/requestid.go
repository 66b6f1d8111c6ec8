package router

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
)

// RequestIDHeader carries the request id in both directions.
const RequestIDHeader = "X-Request-Id"

type ctxKeyRequestID struct{}

// requestID gives every request an id: the client's X-Request-Id when it is short and printable,
// otherwise a new random one. The id is echoed in the response header and logged.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(RequestIDHeader)
		if !validRequestID(id) {
			id = "req_" + strconv.FormatUint(rand.Uint64(), 16)
		}
		w.Header().Set(RequestIDHeader, id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKeyRequestID{}, id)))
	})
}

// RequestID returns the request's id, or "" when the request did not pass through the router.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(ctxKeyRequestID{}).(string)
	return id
}

// validRequestID reports whether a client-sent id is safe to adopt: 1 to 128 visible ASCII characters.
func validRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return false
		}
	}
	return true
}
