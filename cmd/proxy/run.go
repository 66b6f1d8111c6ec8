package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/peer"
	"github.com/ciproxy/ciproxy/internal/router"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/backends"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/snapshot"
	"github.com/ciproxy/ciproxy/internal/store/redisstore"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

const (
	// readHeaderTimeout bounds how long a client may take to send its request headers (slowloris).
	readHeaderTimeout = 10 * time.Second
	// idleTimeout closes keep-alive connections nobody uses.
	idleTimeout = 2 * time.Minute
	// cleanupTimeout bounds deleting sandboxes and closing backends at shutdown.
	cleanupTimeout = 30 * time.Second
	// finalWindow is what the requests still running past shutdown_grace get, once ended, to
	// write their last bytes before their connections are closed.
	finalWindow = 5 * time.Second
)

// errShuttingDown ends the requests still running past shutdown_grace: a JSON request gets it as
// a 503, a stream as its error event and response.failed (code server_error).
var errShuttingDown = &apierror.Error{Status: http.StatusServiceUnavailable, Type: "server_error",
	Message: "The proxy is shutting down; please retry the request."}

// flags are the command line.
type flags struct {
	config    string
	host      string
	port      int
	logFormat string
	dataDir   string
	advertise string
	sweep     time.Duration
	check     bool
	version   bool
}

func parseFlags(args []string, stderr io.Writer) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.config, "config", "", "configuration file (YAML, LiteLLM-compatible)")
	fs.StringVar(&f.host, "host", "0.0.0.0", "address to listen on")
	fs.IntVar(&f.port, "port", 4000, "port to listen on (0: any free port)")
	fs.StringVar(&f.logFormat, "log-format", "json", "log format: json or console")
	fs.StringVar(&f.dataDir, "data-dir", "", "directory of the proxy's own state (files, containers, stored responses); overrides general_settings.data_dir")
	fs.StringVar(&f.advertise, "advertise-url", "", "the URL other replicas reach this one at (http://host:port); overrides general_settings.advertise_url")
	fs.DurationVar(&f.sweep, "sweep-interval", defaultSweepInterval, "how often one replica looks for the containers of replicas that are gone and for orphaned sandboxes")
	fs.BoolVar(&f.check, "check", false, "validate the configuration file and exit")
	fs.BoolVar(&f.version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	switch {
	case f.version:
		return f, nil
	case fs.NArg() > 0:
		return f, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case f.config == "":
		return f, errors.New("--config is required")
	case f.logFormat != "json" && f.logFormat != "console":
		return f, fmt.Errorf("--log-format must be json or console, not %q", f.logFormat)
	case f.port < 0 || f.port > 65535:
		return f, fmt.Errorf("--port %d is out of range", f.port)
	case f.sweep <= 0:
		return f, fmt.Errorf("--sweep-interval must be positive, not %s", f.sweep)
	}
	if f.advertise != "" {
		if err := config.CheckAdvertiseURL(f.advertise); err != nil {
			return f, fmt.Errorf("--advertise-url: %w", err)
		}
	}
	return f, nil
}

// run is the whole program; main only adds signals and the exit code. It returns when ctx ends
// (after a graceful shutdown) or on a fatal error. listening, when not nil, is called with the
// bound address once the server accepts connections.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, listening func(net.Addr)) int {
	f, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "proxy: %v\n", err)
		return 2
	}
	if f.version {
		fmt.Fprintf(stdout, "ciproxy %s\n", version)
		return 0
	}

	if f.check {
		return check(f.config, stdout, stderr)
	}
	cfg, err := config.Load(f.config, backends.ParseOptions(nil))
	if err != nil {
		fmt.Fprintf(stderr, "proxy: configuration is not valid:\n%v\n", err)
		return 1
	}

	log, err := newLogger(f.logFormat, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "proxy: %v\n", err)
		return 1
	}
	defer func() { _ = log.Sync() }()
	if err := serve(ctx, f, cfg, log, listening); err != nil {
		log.Error("proxy stopped", zap.Error(err))
		return 1
	}
	return 0
}

// check is --check: it prints the file's three lists (errors on stderr; the LiteLLM keys accepted
// but not implemented, and the deployments that load but cannot be called, on stdout) and the other
// warnings, and returns 0 when there is no error.
func check(path string, stdout, stderr io.Writer) int {
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "proxy: reading config: %v\n", err)
		return 1
	}
	cfg, err := config.Check(data, path, backends.ParseOptions(nil))
	var errs *config.Errors
	switch {
	case errors.As(err, &errs):
		fmt.Fprintf(stderr, "errors (%d): the configuration is not valid:\n%v\n", len(errs.Problems), err)
	case err != nil:
		fmt.Fprintf(stderr, "errors (1): the proxy does not start with this configuration:\n%v\n", err)
	default:
		fmt.Fprintln(stdout, "errors: none")
	}
	list := func(title string, lines []string) {
		if len(lines) == 0 {
			fmt.Fprintf(stdout, "%s: none\n", title)
			return
		}
		fmt.Fprintf(stdout, "%s (%d):\n", title, len(lines))
		for _, l := range lines {
			fmt.Fprintf(stdout, "  %s\n", l)
		}
	}
	var ignored []string
	for _, k := range cfg.Ignored {
		ignored = append(ignored, k.String())
	}
	list("ignored LiteLLM keys (accepted, not implemented)", ignored)
	list("unusable deployments (loaded; requests for them get an error)", cfg.UnusableWarnings())
	var warnings []string
	for _, w := range cfg.Warnings {
		warnings = append(warnings, "warning: "+w)
	}
	list("warnings", warnings)
	if err != nil {
		return 1
	}
	if !checkSandboxes(cfg, stdout, stderr) {
		return 1
	}
	fmt.Fprintf(stdout, "%s: OK\n", path)
	return 0
}

// checkSandboxes starts one sandbox of each local tool under its real limits, as the start does,
// and prints the isolation the host gives it, loudly when it is weaker than the best mode. It
// reports false when a tool cannot run on this host (the proxy would not start).
func checkSandboxes(cfg *config.Config, stdout, stderr io.Writer) bool {
	ok := true
	for _, t := range cfg.SandboxTools {
		opts, isLocal := t.Settings.(local.Options)
		if !isLocal {
			continue
		}
		iso, err := local.CheckIsolation(context.Background(), opts)
		if err != nil {
			fmt.Fprintf(stderr, "sandbox tool %q (local): cannot run on this host: %v\n", t.Name, err)
			ok = false
			continue
		}
		if len(iso.Warnings) > 0 {
			fmt.Fprintf(stdout, "sandbox tool %q (local): WEAKER ISOLATION ON THIS HOST: %s\n", t.Name, iso)
		} else {
			fmt.Fprintf(stdout, "sandbox tool %q (local): isolation %s\n", t.Name, iso)
		}
	}
	return ok
}

// serve wires the proxy for cfg, serves until ctx ends, and shuts down gracefully.
func serve(ctx context.Context, f flags, cfg *config.Config, log *zap.Logger, listening func(net.Addr)) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := router.NewMetrics(reg)

	// The state store first: without it (Redis unreachable) the proxy does not start, before any
	// sandbox backend is provisioned.
	state, err := openState(ctx, f, cfg, log)
	if err != nil {
		return err
	}
	defer func() {
		if err := state.Close(); err != nil {
			log.Error("closing the state store", zap.Error(err))
		}
	}()
	shared := cfg.Router.Redis.Configured()
	parse := backends.ParseOptions(nil)
	if rs, ok := state.(*redisstore.Store); ok {
		// Replicas whose file sets no container_secret use the one they agree on through Redis,
		// now and after every reload; an explicit one wins.
		if parse.SharedSecret, err = rs.SharedSecret(ctx); err != nil {
			return fmt.Errorf("state store: %w", err)
		}
		if cfg.General.ContainerSecret == "" {
			cfg.General.ContainerSecret = parse.SharedSecret
		}
	}

	// The configuration and the sandbox registry provisioned from it are published together, and
	// replaced together by each reload; a container keeps the provider it was created with.
	store, err := snapshot.New(ctx, cfg, snapshot.Options{
		Parse:     parse,
		Provision: backends.Build,
		Logger:    log,
		OnReload:  func(err error) { metrics.ConfigReload(err == nil) },
	})
	if err != nil {
		return err
	}

	// Listening comes before the rest of the wiring: a replica's advertised address may be its
	// listen address, known once bound (--port 0).
	ln, err := net.Listen("tcp", net.JoinHostPort(f.host, strconv.Itoa(f.port)))
	if err != nil {
		_ = store.Close(context.WithoutCancel(ctx))
		return fmt.Errorf("listen: %w", err)
	}
	fail := func(err error) error {
		_ = ln.Close()
		_ = store.Close(context.WithoutCancel(ctx))
		return err
	}
	var self string
	if shared {
		if self, err = advertiseURL(f, cfg, ln.Addr()); err != nil {
			return fail(err)
		}
	}
	// The containers live in the state store: an e2b container outlives a restart, a local one is
	// expired at start (its sandbox died with the previous process). With Redis, a local container
	// is recorded with this replica's address, and the sandboxes carry the deployment's tag.
	sopts := containers.Options{
		Store:         state,
		Host:          self,
		Registry:      func() *sandbox.Registry { return store.Load().Sandboxes },
		SweepInterval: f.sweep,
		Logger:        log,
		Metrics:       reg,
	}
	if shared {
		sopts.Metadata = map[string]string{containers.MetadataDeployment: deploymentTag(cfg.General.ContainerSecret)}
	}
	sessions, err := containers.New(ctx, sopts)
	if err != nil {
		return fail(err)
	}
	var replicas *peer.Peers
	if shared {
		replicas, err = peer.New(peer.Options{Store: state, Self: self, Expire: sessions.Expire, Logger: log.Named("replicas"),
			Secret: func() string { return store.Load().Config.General.ContainerSecret }})
		if err == nil {
			err = replicas.Register(ctx)
		}
		if err != nil {
			_ = ln.Close()
			closeSandboxes(log, sessions, store)
			return err
		}
		log.Info("replica registered", zap.String("advertise_url", self))
	}
	engine := intercept.New(intercept.Options{
		Containers: sessions,
		Store:      intercept.OnStore(state, 0, nil),
		Files:      state,
		Logger:     log,
		Metrics:    reg,
	})
	client := upstream.NewClient(upstream.ClientOptions{Logger: log, Metrics: upstream.NewMetrics(reg)})

	var draining atomic.Bool
	handler := router.New(router.Options{
		Store:       store,
		Client:      client,
		Balancer:    upstream.NewBalancer(),
		Interceptor: engine,
		Files:       state,
		Responses:   state,
		Containers:  sessions,
		Replicas:    replicas,
		Logger:      log,
		Registry:    reg,
		Metrics:     metrics,
		Ready:       readiness(&draining, state),
	})

	// Every request's context descends from requests, which shutdown cancels with errShuttingDown
	// once the grace is over, so that what still runs ends with an answer the client can read.
	requests, endRequests := context.WithCancelCause(context.WithoutCancel(ctx))
	defer endRequests(nil)
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          zap.NewStdLog(log.Named("http")),
		BaseContext:       func(net.Listener) context.Context { return requests },
	}

	watchCtx, stopWatch := context.WithCancel(ctx)
	replicaCtx, stopReplica := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	if replicas != nil {
		// The lease is renewed until the server has drained (stopReplica), then ended.
		wg.Go(func() { replicas.Run(replicaCtx) })
		wg.Go(func() {
			sweepReplicas(watchCtx, f.sweep, replicas, state, func() *sandbox.Registry { return store.Load().Sandboxes },
				deploymentTag(cfg.General.ContainerSecret), log.Named("replicas"))
		})
	}
	wg.Go(func() {
		reload := func(ctx context.Context) { _ = store.Reload(ctx) } // Reload logs and counts its outcome
		if err := config.Watch(watchCtx, f.config, reload, config.WatchOptions{Logger: log}); err != nil && watchCtx.Err() == nil {
			log.Error("config watcher stopped; edits are no longer picked up", zap.Error(err))
		}
	})

	served := make(chan error, 1)
	// net/http's own answers to requests it cannot read (headers too large, malformed) are
	// OpenAI-shaped too.
	go func() { served <- srv.Serve(router.ShapedErrors(ln)) }()
	log.Info("listening", zap.String("addr", ln.Addr().String()), zap.String("version", version))
	if listening != nil {
		listening(ln.Addr())
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}

	// Stop taking requests, let the ones in flight finish within the grace period, then delete
	// every sandbox this process created and close the backends.
	draining.Store(true)
	grace := store.Load().Config.General.ShutdownGrace
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
	client.CloseIdleConnections()
	closeSandboxes(log, sessions, store)
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", serveErr)
	}
	log.Info("stopped")
	return nil
}

func closeSandboxes(log *zap.Logger, sessions *containers.Manager, store *snapshot.Current) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := sessions.Close(ctx); err != nil {
		log.Error("deleting sandboxes", zap.Error(err))
	}
	if err := store.Close(ctx); err != nil {
		log.Error("closing sandbox backends", zap.Error(err))
	}
}

func newLogger(format string, w io.Writer) (*zap.Logger, error) {
	ec := zap.NewProductionEncoderConfig()
	ec.TimeKey = "time"
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	switch format {
	case "console":
		ec.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(ec)
	case "json":
		enc = zapcore.NewJSONEncoder(ec)
	default:
		return nil, fmt.Errorf("unknown log format %q", format)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), zap.InfoLevel)), nil
}
