// Package router is ciproxy's HTTP front: chi routes and middleware, the /v1 handlers, health,
// readiness and metrics endpoints, and the one place where errors become OpenAI-shaped responses.
package router

import (
	"context"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/inputfiles"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/peer"
	"github.com/ciproxy/ciproxy/internal/snapshot"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

// Interceptor runs OpenAI's code_interpreter tool in the proxy (*intercept.Engine). Its methods
// are called concurrently, from the request's goroutine.
//
// Every POST /v1/responses, once authenticated, its body read and its model resolved, is offered
// to Prepare, which reads and resolves it once; a request its Plan says is Intercepted is
// forwarded to the replica that holds the container the plan names (Plan.Container), or served
// here by Serve; any other passes through. An error from Prepare or Serve means nothing was
// written, and handle writes it (the one error path); once the response has started, failures are
// the interceptor's to end in its own stream.
//
// GET and DELETE /v1/responses/{id} go to ServeStored, and GET /v1/responses/{id}/input_items to
// ServeInputItems, when Minted reports that the id is one the interceptor minted (the upstream
// has never heard of it); every other id passes through. An error from Minted (its store cannot
// answer) and their errors are written the same way.
type Interceptor interface {
	Prepare(ctx context.Context, req *intercept.Request) (*intercept.Plan, error)
	Serve(w http.ResponseWriter, r *http.Request, plan *intercept.Plan) error
	Minted(ctx context.Context, id string) (bool, error)
	ServeStored(w http.ResponseWriter, r *http.Request, id, caller string) error
	ServeInputItems(w http.ResponseWriter, r *http.Request, id, caller string) error
	ServeCancel(w http.ResponseWriter, r *http.Request, id, caller string) error
}

var _ Interceptor = (*intercept.Engine)(nil)

// Options configures New. Store, Client and Balancer are required; New panics without them.
type Options struct {
	// Store holds the live configuration and sandbox registry; each request holds one snapshot of
	// them, from its first middleware to its last byte.
	Store *snapshot.Current
	// Client sends requests upstream.
	Client *upstream.Client
	// Balancer orders a model's deployments for each request.
	Balancer *upstream.Balancer
	// Interceptor is offered every POST /v1/responses first. Nil: pass-through only.
	Interceptor Interceptor
	// Files stores the Files API's files (/v1/files). Nil: the Files API is not served.
	Files store.Files
	// Responses is where the owner of each response an upstream stores for a pass-through request
	// is recorded, so that only that owner reaches it (owners.go). Nil: such responses are
	// reachable by any key (tests of other things only).
	Responses store.Responses
	// Replicas are the other replicas sharing the store: requests for a container that one of them
	// hosts are forwarded to it (see forward.go). Nil: one replica, nothing is forwarded.
	Replicas *peer.Peers
	// Containers are the containers the code_interpreter tool runs in, served by the Containers
	// API (/v1/containers). Nil: the Containers API is not served.
	Containers *containers.Manager
	// Logger receives the access log and error details. Nil: no logging.
	Logger *zap.Logger
	// Registry is where the router's metrics are registered and what /metrics serves.
	// Nil: a private registry (metrics are still counted, and /metrics serves them).
	Registry *prometheus.Registry
	// Metrics, when set, is used instead of creating the router's metrics on Registry, so that the
	// caller can count config reloads on the same collectors (see NewMetrics).
	Metrics *Metrics
	// Ready reports what /readyz answers beyond a loaded config (shown in the answer, so it must
	// hold no secret). Nil: ready once a config is loaded.
	Ready func(ctx context.Context) Readiness
	// BodyReadTimeout bounds how long reading a request body may take. Zero: 60s.
	BodyReadTimeout time.Duration
	// Now is the clock. Nil: time.Now.
	Now func() time.Time
}

// server holds what the handlers share. It is immutable after New.
type server struct {
	store       *snapshot.Current
	client      *upstream.Client
	balancer    *upstream.Balancer
	interceptor Interceptor
	files       store.Files
	owners      store.Responses
	replicas    *peer.Peers
	containers  *containers.Manager
	log         *zap.Logger
	metrics     *Metrics
	ready       func(context.Context) Readiness
	bodyTimeout time.Duration
	now         func() time.Time
	started     time.Time
	inflight    *inflight          // intercepted requests in progress, and pass-through ones that inline (quota.go)
	inlined     *inputfiles.Budget // bytes of stored files inlined by requests in progress
}

// New returns the proxy's HTTP handler. Every route is served both with and without the /v1 prefix.
func New(opts Options) http.Handler {
	if opts.Store == nil || opts.Client == nil || opts.Balancer == nil {
		panic("router.New: Store, Client and Balancer are required")
	}
	s := &server{
		store:       opts.Store,
		client:      opts.Client,
		balancer:    opts.Balancer,
		interceptor: opts.Interceptor,
		files:       opts.Files,
		owners:      opts.Responses,
		replicas:    opts.Replicas,
		containers:  opts.Containers,
		log:         opts.Logger,
		metrics:     opts.Metrics,
		ready:       opts.Ready,
		bodyTimeout: opts.BodyReadTimeout,
		now:         opts.Now,
		inflight:    &inflight{},
		inlined:     &inputfiles.Budget{},
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.bodyTimeout <= 0 {
		s.bodyTimeout = 60 * time.Second
	}
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if s.metrics == nil {
		s.metrics = NewMetrics(reg)
	}
	s.started = s.now()

	r := chi.NewRouter()
	r.Use(s.unreadBodyDeadline, requestID, accessLog(s.log), s.metrics.middleware, recoverer(s.log), s.snapshot, s.peerCheck)
	r.NotFound(s.handle(notFound))
	r.MethodNotAllowed(s.handle(methodNotAllowed))

	// No timeout middleware anywhere: most routes may stream, and a stream ends by client
	// cancellation or the upstream. The server's ReadHeaderTimeout and the body read deadline
	// bound what a slow client can hold.
	r.Get("/healthz", s.healthz)
	r.Get("/readyz", s.readyz)
	r.With(auth, masterOnly).Method(http.MethodGet, "/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if s.files != nil {
		// Uploads are bounded by max_file_upload_size, not max_request_body_size, and streamed to
		// the store, so they skip bodyLimit.
		r.With(auth).Post("/v1/files", s.handle(s.createFile))
		r.With(auth).Post("/files", s.handle(s.createFile))
	}
	if s.containers != nil {
		// Container file uploads likewise: bounded by max_file_upload_size, streamed to the sandbox.
		r.With(auth, s.forwardContainers).Post("/v1/containers/{id}/files", s.handle(s.createContainerFile))
		r.With(auth, s.forwardContainers).Post("/containers/{id}/files", s.handle(s.createContainerFile))
	}

	r.Route("/v1", func(v chi.Router) {
		v.Use(auth, s.forwardContainers, bodyLimit)
		v.NotFound(s.handle(notFound))
		v.MethodNotAllowed(s.handle(methodNotAllowed))
		s.api(v)
	})
	r.Group(func(g chi.Router) {
		g.Use(auth, s.forwardContainers, bodyLimit)
		s.api(g)
	})
	return r
}

// api registers the OpenAI routes on r, relative to the API root.
func (s *server) api(r chi.Router) {
	r.Post("/responses", s.handle(s.responses))
	r.Get("/responses/{id}", s.handle(s.storedResponse))
	r.Delete("/responses/{id}", s.handle(s.storedResponse))
	r.Get("/responses/{id}/input_items", s.handle(s.inputItems))
	r.Post("/responses/{id}/cancel", s.handle(s.cancelResponse))
	r.Post("/chat/completions", s.handle(s.modelPassthrough))
	r.Post("/completions", s.handle(s.modelPassthrough))
	r.Post("/embeddings", s.handle(s.modelPassthrough))
	r.Get("/models", s.handle(s.models))
	r.Get("/models/*", s.handle(s.model)) // a wildcard: model names may contain "/"
	if s.files != nil {
		r.Get("/files", s.handle(s.listFiles))
		r.Get("/files/{id}", s.handle(s.getFile))
		r.Delete("/files/{id}", s.handle(s.deleteFile))
		r.Get("/files/{id}/content", s.handle(s.fileContent))
	}
	if s.containers != nil {
		r.Post("/containers", s.handle(s.createContainer))
		r.Get("/containers", s.handle(s.listContainers))
		r.Get("/containers/{id}", s.handle(s.getContainer))
		r.Delete("/containers/{id}", s.handle(s.deleteContainer))
		r.Get("/containers/{id}/files", s.handle(s.listContainerFiles))
		r.Get("/containers/{id}/files/{file_id}", s.handle(s.getContainerFile))
		r.Delete("/containers/{id}/files/{file_id}", s.handle(s.deleteContainerFile))
		r.Get("/containers/{id}/files/{file_id}/content", s.handle(s.containerFileContent))
	}
}

// snapshot holds the configuration snapshot (config and sandbox registry) for the whole request;
// everything below reads that snapshot, the interceptor's sandboxes included (snapshot.NewContext).
func (s *server) snapshot(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		snap := s.store.Acquire()
		defer s.store.Release(snap)
		next.ServeHTTP(w, r.WithContext(snapshot.NewContext(r.Context(), snap)))
	})
}

// configFrom returns the request's configuration snapshot, or nil when none is loaded.
func configFrom(ctx context.Context) *config.Config {
	if snap := snapshot.FromContext(ctx); snap != nil {
		return snap.Config
	}
	return nil
}
