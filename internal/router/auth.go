package router

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
)

type ctxKeyCaller struct{}

// auth requires a key when the proxy has one (general_settings.master_key or client_keys), as
// "Authorization: Bearer <key>" or "x-api-key: <key>", and names the caller (see Caller): a client
// key's entry name, or for the master key (and for any key of an open proxy) an id derived from
// the key, so containers, files and responses stay bound to the key that created them. It also
// puts the caller's container quotas in the context (containers.WithLimits).
func auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cfg := configFrom(r.Context())
		if cfg == nil {
			apierror.Write(w, notReady())
			return
		}
		key := presentedKey(r.Header)
		g := &cfg.General
		who := caller{id: callerID(key), quotas: g.Quotas}
		if !g.Open() {
			if ck, ok := g.ClientKeyFor(key); ok && key != "" {
				who = caller{id: ck.Name, quotas: ck.Quotas}
			} else if !matches(key, g.MasterKey) {
				msg := "Incorrect API key provided."
				switch {
				case g.MasterKey != "" && g.MissingEnv != "" && len(g.ClientKeys) == 0:
					// The master key names an unset variable: config holds a key nobody knows, so
					// everyone is refused; say why instead of blaming the client's key.
					msg = "The proxy's master key is not configured: the environment variable " + g.MissingEnv + " is not set."
				case key == "":
					msg = "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
				}
				apierror.Write(w, apierror.Unauthorized(msg))
				return
			}
		}
		ctx := context.WithValue(r.Context(), ctxKeyCaller{}, who)
		ctx = containers.WithLimits(ctx, containers.Limits{
			MaxContainers:    who.quotas.MaxContainers,
			MaxPerOwner:      who.quotas.MaxContainersPerKey,
			CreatesPerMinute: who.quotas.ContainerCreatesPerMinute,
			CreateBurst:      who.quotas.ContainerCreateBurst,
		})
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// masterOnly, after auth, keeps an operator's route (/metrics) to the master key: a client key is
// a tenant's, and the route reports on every tenant. With client keys and no master key, nobody
// is let in (the operator sets a master key to scrape); an open proxy, where any key is anyone's,
// lets everyone in.
func masterOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g := &configFrom(r.Context()).General
		if !g.Open() && !matches(presentedKey(r.Header), g.MasterKey) {
			msg := "Incorrect API key provided: this route needs the master key."
			if g.MasterKey == "" {
				msg = "This route needs the master key, and none is configured (general_settings.master_key)."
			}
			apierror.Write(w, apierror.Unauthorized(msg))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// caller is who made a request and the quotas that apply to it.
type caller struct {
	id     string
	quotas config.Quotas
}

// matches reports whether key is want (not empty), in constant time: comparing digests keeps the
// comparison constant-time regardless of the key's length.
func matches(key, want string) bool {
	if key == "" || want == "" {
		return false
	}
	got, exp := sha256.Sum256([]byte(key)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(got[:], exp[:]) == 1
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

// Caller returns the owner of what an authenticated request creates: the name of its client key
// (general_settings.client_keys), or else the hex SHA-256 prefix of the key the client presented
// (the master key, or any key of an open proxy: callers that share a key share an owner), "" when
// it presented none.
func Caller(ctx context.Context) string {
	c, _ := ctx.Value(ctxKeyCaller{}).(caller)
	return c.id
}

// callerQuotas returns the quotas of an authenticated request's caller.
func callerQuotas(ctx context.Context) config.Quotas {
	c, _ := ctx.Value(ctxKeyCaller{}).(caller)
	return c.quotas
}

// notReady is the answer while no configuration is loaded.
func notReady() *apierror.Error {
	return &apierror.Error{Status: http.StatusServiceUnavailable, Message: "The proxy is not ready: no configuration is loaded.", Type: apierror.TypeServer}
}
