package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/peer"
	"github.com/ciproxy/ciproxy/internal/router"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/backends"
	"github.com/ciproxy/ciproxy/internal/snapshot"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/redisstore"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

const (
	// readHeaderTimeout bounds how long a client may take to send its request headers (slowloris).
	readHeaderTimeout = 10 * time.Second
	// idleTimeout closes keep-alive connections nobody uses.
	idleTimeout = 2 * time.Minute
	// cleanupTimeout bounds the unwind (app.close): deleting sandboxes, closing the backends and
	// the state store.
	cleanupTimeout = 30 * time.Second
	// finalWindow is what the requests still running past shutdown_grace get, once ended, to
	// write their last bytes before their connections are closed.
	finalWindow = 5 * time.Second
)

// errShuttingDown ends the requests still running past shutdown_grace: a JSON request gets it as
// a 503, a stream as its error event and response.failed (code server_error).
var errShuttingDown = &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeServer,
	Message: "The proxy is shutting down; please retry the request."}

// app is the proxy wired for one configuration: what wire built, in the order it built it, and
// what serve runs. Nothing in it serves a request before serve.
type app struct {
	f   flags
	log *zap.Logger

	store      store.Store         // the state store (embedded or Redis)
	current    *snapshot.Current   // the configuration and the sandbox registry, replaced by reloads
	listener   net.Listener        // bound, not yet accepting
	containers *containers.Manager // OpenAI's containers, in the state store
	replicas   *peer.Peers         // the other replicas; nil with one
	client     *upstream.Client
	handler    http.Handler
	tag        string // deploymentTag of the replicas' shared secret; "" with one replica

	draining atomic.Bool // set once shutdown begins: /readyz answers not ready

	// closers undo what wire built, in the order it built it; close runs them in reverse.
	closers []closer
}

// closer is one step of the unwind: what it closes (for the log) and how.
type closer struct {
	what  string
	close func(context.Context) error
}

// onClose adds a step to the unwind: it runs before every step added earlier.
func (a *app) onClose(what string, fn func(context.Context) error) {
	a.closers = append(a.closers, closer{what, fn})
}

// close undoes what wire built, last built first, within cleanupTimeout together: the containers'
// sandboxes are deleted before the backends that run them close, and the state store, which
// records them, closes last. Each failure is logged; the unwind goes on.
func (a *app) close() {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	for i := len(a.closers) - 1; i >= 0; i-- {
		if err := a.closers[i].close(ctx); err != nil {
			a.log.Error(a.closers[i].what, zap.Error(err))
		}
	}
	a.closers = nil
}

// wire builds the proxy for cfg in dependency order: the state store, the configuration snapshot
// with its sandbox backends, the listener, the containers, the replicas, the engine and the router.
// On error, everything already built is closed again, last built first, and the app is nil.
func wire(ctx context.Context, f flags, cfg *config.Config, log *zap.Logger) (_ *app, err error) {
	a := &app{f: f, log: log}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := router.NewMetrics(reg)

	// The state store first: without it (Redis unreachable) the proxy does not start, before any
	// sandbox backend is provisioned.
	if a.store, err = openStore(ctx, f, cfg, log); err != nil {
		return nil, err
	}
	a.onClose("closing the state store", func(context.Context) error { return a.store.Close() })
	shared := cfg.Router.Redis.Configured()
	parse := backends.ParseOptions(nil)
	if rs, ok := a.store.(*redisstore.Store); ok {
		// Replicas whose file sets no container_secret use the one they agree on through Redis,
		// now and after every reload; an explicit one wins.
		if parse.SharedSecret, err = rs.SharedSecret(ctx); err != nil {
			return nil, fmt.Errorf("state store: %w", err)
		}
		if cfg.General.ContainerSecret == "" {
			cfg.General.ContainerSecret = parse.SharedSecret
		}
	}

	// The configuration and the sandbox registry provisioned from it are published together, and
	// replaced together by each reload; a container keeps the provider it was created with.
	a.current, err = snapshot.New(ctx, cfg, snapshot.Options{
		Parse:     parse,
		Provision: backends.Build,
		Logger:    log,
		OnReload:  func(err error) { metrics.ConfigReload(err == nil) },
	})
	if err != nil {
		return nil, err
	}
	a.onClose("closing sandbox backends", a.current.Close)

	// Listening comes before the rest of the wiring: a replica's advertised address may be its
	// listen address, known once bound (--port 0).
	if a.listener, err = net.Listen("tcp", net.JoinHostPort(f.host, strconv.Itoa(f.port))); err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	// Once served, the server's shutdown has closed it already.
	a.onClose("closing the listener", func(context.Context) error { _ = a.listener.Close(); return nil })
	var self string
	if shared {
		if self, err = advertiseURL(f, cfg, a.listener.Addr()); err != nil {
			return nil, err
		}
		a.tag = deploymentTag(cfg.General.ContainerSecret)
	}

	// The containers live in the state store: an e2b container outlives a restart, a local one is
	// expired at start (its sandbox died with the previous process). With Redis, a local container
	// is recorded with this replica's address, and the sandboxes carry the deployment's tag.
	copts := containers.Options{
		Store:         a.store,
		Host:          self,
		Registry:      a.sandboxes,
		SweepInterval: f.sweep,
		Logger:        log,
		Metrics:       reg,
	}
	if shared {
		copts.Metadata = map[string]string{containers.MetadataDeployment: a.tag}
	}
	if a.containers, err = containers.New(ctx, copts); err != nil {
		return nil, err
	}
	a.onClose("deleting sandboxes", a.containers.Close)

	if shared {
		a.replicas, err = peer.New(peer.Options{Store: a.store, Self: self, Expire: a.containers.Expire, Logger: log.Named("replicas"),
			Secret: func() string { return a.current.Load().Config.General.ContainerSecret }})
		if err == nil {
			err = a.replicas.Register(ctx)
		}
		if err != nil {
			return nil, err
		}
		log.Info("replica registered", zap.String("advertise_url", self))
	}

	engine := intercept.New(intercept.Options{
		Containers: a.containers,
		Store:      a.store,
		Files:      a.store,
		Logger:     log,
		Metrics:    reg,
	})
	a.client = upstream.NewClient(upstream.ClientOptions{Logger: log, Metrics: upstream.NewMetrics(reg)})
	a.onClose("closing idle upstream connections", func(context.Context) error { a.client.CloseIdleConnections(); return nil })
	a.handler = router.New(router.Options{
		Store:       a.current,
		Client:      a.client,
		Balancer:    upstream.NewBalancer(),
		Interceptor: engine,
		Files:       a.store,
		Responses:   a.store,
		Containers:  a.containers,
		Replicas:    a.replicas,
		Logger:      log,
		Registry:    reg,
		Metrics:     metrics,
		Ready:       readiness(&a.draining, a.store),
	})
	return a, nil
}

// sandboxes is the current snapshot's sandbox registry, for what runs outside any request.
func (a *app) sandboxes() *sandbox.Registry { return a.current.Load().Sandboxes }

// serve serves on the app's listener until ctx ends, with the config watcher and, with replicas,
// the lease and the sweeps beside it, then shuts down gracefully: it stops taking requests, lets
// the ones in flight finish within shutdown_grace, and ends those still running. listening, when
// not nil, is called with the bound address once the server accepts connections. The caller
// closes the app afterwards.
func (a *app) serve(ctx context.Context, listening func(net.Addr)) error {
	log := a.log
	// Every request's context descends from requests, which shutdown cancels with errShuttingDown
	// once the grace is over, so that what still runs ends with an answer the client can read.
	requests, endRequests := context.WithCancelCause(context.WithoutCancel(ctx))
	defer endRequests(nil)
	srv := &http.Server{
		Handler:           a.handler,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          zap.NewStdLog(log.Named("http")),
		BaseContext:       func(net.Listener) context.Context { return requests },
	}

	watchCtx, stopWatch := context.WithCancel(ctx)
	replicaCtx, stopReplica := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	if a.replicas != nil {
		// The lease is renewed until the server has drained (stopReplica), then ended.
		wg.Go(func() { a.replicas.Run(replicaCtx) })
		wg.Go(func() {
			sweepReplicas(watchCtx, a.f.sweep, a.replicas, a.store, a.sandboxes, a.tag, log.Named("replicas"))
		})
	}
	wg.Go(func() {
		reload := func(ctx context.Context) { _ = a.current.Reload(ctx) } // Reload logs and counts its outcome
		if err := config.Watch(watchCtx, a.f.config, reload, config.WatchOptions{Logger: log}); err != nil && watchCtx.Err() == nil {
			log.Error("config watcher stopped; edits are no longer picked up", zap.Error(err))
		}
	})

	served := make(chan error, 1)
	// net/http's own answers to requests it cannot read (headers too large, malformed) are
	// OpenAI-shaped too.
	go func() { served <- srv.Serve(router.ShapedErrors(a.listener)) }()
	log.Info("listening", zap.String("addr", a.listener.Addr().String()), zap.String("version", version))
	if listening != nil {
		listening(a.listener.Addr())
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}

	// Stop taking requests and let the ones in flight finish within the grace period; the
	// caller's close then deletes every sandbox this process created and closes the backends.
	a.draining.Store(true)
	grace := a.current.Load().Config.General.ShutdownGrace
	log.Info("shutting down", zap.Duration("grace", grace))
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	if err := srv.Shutdown(shutCtx); err != nil {
		// Cut now, a stream would end with no error event and a JSON request with no answer:
		// the requests are ended first (the engine ends a stream with its error event and
		// response.failed, the router answers 503), and given a moment to say so.
		log.Warn("grace period over; ending the requests in flight", zap.Error(err))
		endRequests(errShuttingDown)
		finalCtx, cancelFinal := context.WithTimeout(context.WithoutCancel(ctx), finalWindow)
		if err := srv.Shutdown(finalCtx); err != nil {
			log.Warn("closing the remaining connections", zap.Error(err))
			_ = srv.Close()
		}
		cancelFinal()
	}
	cancel()
	stopReplica()
	stopWatch()
	wg.Wait()
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", serveErr)
	}
	return nil
}
