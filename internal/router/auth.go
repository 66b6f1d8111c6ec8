package router

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/ciproxy/ciproxy/internal/apierror"
)

type ctxKeyCaller struct{}

// auth requires general_settings.master_key, when set, as "Authorization: Bearer <key>" or
// "x-api-key: <key>". It also derives the caller id from whatever key was presented (see Caller),
// with or without a master key, so containers stay bound to the key that created them.
func auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cfg := configFrom(r.Context())
		if cfg == nil {
			apierror.Write(w, notReady())
			return
		}
		key := presentedKey(r.Header)
		if want := cfg.General.MasterKey; want != "" {
			// Comparing digests keeps the comparison constant-time regardless of the key's length.
			got, exp := sha256.Sum256([]byte(key)), sha256.Sum256([]byte(want))
			if key == "" || subtle.ConstantTimeCompare(got[:], exp[:]) != 1 {
				msg := "Incorrect API key provided."
				switch {
				case cfg.General.MissingEnv != "":
					// The master key names an unset variable: config holds a key nobody knows, so
					// everyone is refused; say why instead of blaming the client's key.
					msg = "The proxy's master key is not configured: the environment variable " + cfg.General.MissingEnv + " is not set."
				case key == "":
					msg = "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
				}
				apierror.Write(w, apierror.Unauthorized(msg))
				return
			}
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKeyCaller{}, callerID(key))))
	})
}

// presentedKey returns the bearer token of the Authorization header, or else the x-api-key header.
func presentedKey(h http.Header) string {
	if a := h.Get("Authorization"); a != "" {
		if scheme, tok, ok := strings.Cut(a, " "); ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(tok)
		}
		return ""
	}
	return strings.TrimSpace(h.Get("X-Api-Key"))
}

// callerID is the first 32 hex digits of SHA-256 of key, or "" for no key. It names the caller
// without revealing the key.
func callerID(key string) string {
	if key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

// Caller returns the caller id of an authenticated request: the hex SHA-256 prefix of the key the
// client presented, "" when it presented none.
func Caller(ctx context.Context) string {
	c, _ := ctx.Value(ctxKeyCaller{}).(string)
	return c
}

// notReady is the answer while no configuration is loaded.
func notReady() *apierror.Error {
	return &apierror.Error{Status: http.StatusServiceUnavailable, Message: "The proxy is not ready: no configuration is loaded.", Type: "server_error"}
}
