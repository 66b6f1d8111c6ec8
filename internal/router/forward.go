package router

import (
	"context"
	"errors"
	"net/http"
	"regexp"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/peer"
)

// Forwarding between replicas. A local sandbox lives in the process of the replica that created
// it; a request for its container that lands on another replica is forwarded there, streamed
// through, so that the client sees no difference. The check happens where the request is already
// understood, so the body is read once:
//
//   - POST /v1/responses, in the responses handler, once the interceptor has prepared the
//     request and only when it takes it: the container its plan uses (intercept.Plan.Container:
//     the tool's explicit cntr_ id, else the latest live one of the conversation), each candidate
//     looked up in the store (peer.Peers.Host).
//   - /v1/containers/{id} and everything under it, by the forwardContainers middleware, from the
//     path alone, before the body is read (uploads stream through).
//
// A forwarded request carries peer.HeaderForwarded, signed with general_settings.container_secret
// (checked by peerCheck for every request); one that carries a valid signature is served where it
// arrives, never forwarded again. A replica found gone (nothing listens at its address) has its
// container expired, and the request is served here as for any expired container.

type ctxKeyForwarded struct{}

// forwarded reports whether the request came from another replica.
func forwarded(ctx context.Context) bool {
	v, _ := ctx.Value(ctxKeyForwarded{}).(bool)
	return v
}

// peerCheck verifies the signature of a request that says it was forwarded by another replica
// (one that says so without a valid signature is refused).
func (s *server) peerCheck(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret := ""
		if cfg := configFrom(r.Context()); cfg != nil {
			secret = cfg.General.ContainerSecret
		}
		sig := r.Header.Get(peer.HeaderForwarded)
		if sig == "" {
			next.ServeHTTP(w, r)
			return
		}
		if err := peer.Verify(secret, sig, r.Method, r.URL.RequestURI(), s.now()); err != nil {
			s.log.Warn("refused a forwarded request", zap.String("request_id", RequestID(r.Context())),
				zap.String("remote", r.RemoteAddr), zap.Error(err))
			apierror.Write(w, &apierror.Error{Status: http.StatusUnauthorized, Type: apierror.TypeInvalidRequest, Code: apierror.CodeInvalidForwarding,
				Message: "The request's " + peer.HeaderForwarded + " header is not valid."})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKeyForwarded{}, true)))
	})
}

// answerProbe answers another replica's probe (peer.HeaderProbe) with this one's proof. Only GET
// /healthz answers it, the route a probe asks: an HMAC under the shared secret of whatever nonce
// anyone sends is nothing to hand out on every route.
func (s *server) answerProbe(w http.ResponseWriter, r *http.Request) {
	nonce := r.Header.Get(peer.HeaderProbe)
	cfg := configFrom(r.Context())
	if nonce == "" || len(nonce) > 64 || cfg == nil || cfg.General.ContainerSecret == "" || s.replicas == nil {
		return
	}
	w.Header().Set(peer.HeaderPeer, peer.ProbeAnswer(cfg.General.ContainerSecret, s.replicas.Self(), nonce))
}

// forwardResponses forwards an intercepted POST /v1/responses to the replica that hosts the
// container its plan uses, if that is another one. It reports whether it did (the answer is then
// written, or the error is to be written).
func (s *server) forwardResponses(w http.ResponseWriter, r *http.Request, req *resolved, plan *intercept.Plan) (bool, error) {
	if s.replicas == nil || forwarded(r.Context()) {
		return false, nil
	}
	caller := plan.Request.Caller
	for range 2 {
		// The plan's rule picks the container, asking where each one it considers is live; the
		// replica served there picks the same one.
		host, at := "", ""
		id, err := plan.Container(r.Context(), func(ctx context.Context, id string) (bool, error) {
			h, live, err := s.replicas.Host(ctx, caller, id)
			if live {
				host, at = h, id
			}
			return live, err
		})
		if err == nil && id != "" && at != id {
			host, _, err = s.replicas.Host(r.Context(), caller, id) // the tool's explicit id
		}
		if err != nil || id == "" || host == "" {
			return false, err
		}
		err = s.replicas.Forward(w, r, host, req.cfg.General.ContainerSecret, RequestID(r.Context()), req.body)
		if !errors.Is(err, peer.ErrGone) {
			return true, forwardError(err)
		}
		// Its lease is ended now: Host expires the container, and the request is served here.
	}
	return false, nil
}

// containerPath matches the Containers API paths of one container.
var containerPath = regexp.MustCompile(`^(?:/v1)?/containers/([^/]+)(?:/|$)`)

// forwardContainers forwards a Containers API request for a container that another replica hosts.
// It runs after auth (containers are scoped by caller) and before the body is read.
func (s *server) forwardContainers(next http.Handler) http.Handler {
	if s.replicas == nil {
		return next
	}
	return s.handle(func(w http.ResponseWriter, r *http.Request) error {
		m := containerPath.FindStringSubmatch(r.URL.Path)
		if m == nil || forwarded(r.Context()) {
			next.ServeHTTP(w, r)
			return nil
		}
		secret := ""
		if cfg := configFrom(r.Context()); cfg != nil {
			secret = cfg.General.ContainerSecret
		}
		for range 2 {
			host, err := s.replicas.ContainerHost(r.Context(), Caller(r.Context()), m[1])
			if err != nil {
				return err
			}
			if host == "" {
				break
			}
			err = s.replicas.Forward(w, r, host, secret, RequestID(r.Context()), nil)
			if !errors.Is(err, peer.ErrGone) {
				return forwardError(err)
			}
		}
		next.ServeHTTP(w, r)
		return nil
	})
}

// forwardError is what the client sees of a forward that failed before anything was written.
func forwardError(err error) error {
	var ue *peer.UnreachableError
	if errors.As(err, &ue) {
		return &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeServer, Code: apierror.CodeReplicaUnavailable,
			Message: "The server that holds this container cannot be reached right now; please try again shortly.", Err: err}
	}
	return err
}
