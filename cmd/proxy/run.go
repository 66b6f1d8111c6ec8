package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/router"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/backends"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

const (
	// readHeaderTimeout bounds how long a client may take to send its request headers (slowloris).
	readHeaderTimeout = 10 * time.Second
	// idleTimeout closes keep-alive connections nobody uses.
	idleTimeout = 2 * time.Minute
	// cleanupTimeout bounds deleting sandboxes and closing backends at shutdown.
	cleanupTimeout = 30 * time.Second
)

// flags are the command line.
type flags struct {
	config    string
	host      string
	port      int
	logFormat string
	dataDir   string
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

	cfg, err := config.Load(f.config)
	if err != nil {
		fmt.Fprintf(stderr, "proxy: configuration is not valid:\n%v\n", err)
		return 1
	}
	if f.check {
		for _, w := range cfg.Warnings {
			fmt.Fprintf(stdout, "warning: %s\n", w)
		}
		fmt.Fprintf(stdout, "%s: OK\n", f.config)
		return 0
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

// serve wires the proxy for cfg, serves until ctx ends, and shuts down gracefully.
func serve(ctx context.Context, f flags, cfg *config.Config, log *zap.Logger, listening func(net.Addr)) error {
	logWarnings(log, cfg)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := router.NewMetrics(reg)

	// The sandbox registry is rebuilt on every reload; sessions read the current one through this
	// pointer, and a container keeps the provider it was created with.
	if err := checkLocal(ctx, cfg.SandboxTools); err != nil {
		return err
	}
	tools, err := backends.Build(cfg.SandboxTools, nil, log)
	if err != nil {
		return fmt.Errorf("sandbox tools: %w", err)
	}
	var registry atomic.Pointer[sandbox.Registry]
	registry.Store(tools)

	var key []byte // nil: a random key per process, so ids die with it
	if cfg.General.ContainerSecret != "" {
		key = sandbox.KeyFromSecret(cfg.General.ContainerSecret)
	}
	sessions := sandbox.NewSessions(sandbox.SessionOptions{Key: key, Registry: registry.Load, Logger: log, Metrics: reg})
	engine := intercept.New(intercept.Options{Sessions: sessions, Logger: log, Metrics: reg})
	client := upstream.NewClient(upstream.ClientOptions{Logger: log, Metrics: upstream.NewMetrics(reg)})

	state, err := openState(f, cfg, log)
	if err != nil {
		closeSandboxes(log, sessions, &registry)
		return err
	}
	defer func() {
		if err := state.Close(); err != nil {
			log.Error("closing the data directory", zap.Error(err))
		}
	}()

	store := config.NewStore(cfg)
	var draining atomic.Bool
	handler := router.New(router.Options{
		Store:       store,
		Client:      client,
		Balancer:    upstream.NewBalancer(),
		Interceptor: engine,
		Files:       state,
		Logger:      log,
		Registry:    reg,
		Metrics:     metrics,
		Ready:       func() bool { return !draining.Load() },
	})

	ln, err := net.Listen("tcp", net.JoinHostPort(f.host, strconv.Itoa(f.port)))
	if err != nil {
		closeSandboxes(log, sessions, &registry)
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          zap.NewStdLog(log.Named("http")),
	}

	watchCtx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		err := config.Watch(watchCtx, f.config, store, config.WatchOptions{
			Logger: log,
			OnReload: func(next *config.Config, err error) {
				reload(watchCtx, log, metrics, &registry, next, err)
			},
		})
		if err != nil && watchCtx.Err() == nil {
			log.Error("config watcher stopped; edits are no longer picked up", zap.Error(err))
		}
	})

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
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
	grace := store.Load().General.ShutdownGrace
	log.Info("shutting down", zap.Duration("grace", grace))
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	if err := srv.Shutdown(shutCtx); err != nil {
		log.Warn("grace period over; closing the remaining connections", zap.Error(err))
		_ = srv.Close()
	}
	cancel()
	stopWatch()
	wg.Wait()
	client.CloseIdleConnections()
	closeSandboxes(log, sessions, &registry)
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", serveErr)
	}
	log.Info("stopped")
	return nil
}

// openState opens the proxy's own state in --data-dir, else general_settings.data_dir, else the
// default directory. It is read once: a data_dir changed by a reload applies at the next start.
func openState(f flags, cfg *config.Config, log *zap.Logger) (*embedded.Store, error) {
	dir := f.dataDir
	if dir == "" {
		dir = cfg.General.DataDir
	}
	if dir == "" {
		var err error
		if dir, err = embedded.DefaultDir(); err != nil {
			return nil, err
		}
	}
	st, err := embedded.Open(embedded.Options{Dir: dir, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	log.Info("data directory", zap.String("dir", st.Dir()))
	return st, nil
}

// reload applies one reload attempt: on success it builds the sandbox registry for the new tools
// (which retires the providers the new configuration no longer holds) and swaps it in.
func reload(ctx context.Context, log *zap.Logger, metrics *router.Metrics, registry *atomic.Pointer[sandbox.Registry], next *config.Config, err error) {
	if err != nil {
		metrics.ConfigReload(false)
		log.Error("configuration reload failed; still serving the previous configuration", zap.Error(err))
		return
	}
	if err := checkLocal(ctx, next.SandboxTools); err != nil {
		metrics.ConfigReload(false)
		log.Error("configuration reloaded, but a local sandbox tool cannot work here; keeping the previous sandbox tools", zap.Error(err))
		return
	}
	tools, err := backends.Build(next.SandboxTools, registry.Load(), log)
	if err != nil {
		// The new model list is already live; only the sandbox tools stay as they were.
		metrics.ConfigReload(false)
		log.Error("configuration reloaded, but its sandbox tools could not be built; keeping the previous ones", zap.Error(err))
		return
	}
	registry.Store(tools)
	metrics.ConfigReload(true)
	logWarnings(log, next)
	log.Info("configuration reloaded", zap.Int("models", len(next.Models)), zap.Int("sandbox_tools", len(next.SandboxTools)))
}

// checkLocal reports, for the first local sandbox tool that cannot start a sandbox on this host,
// what is missing (bubblewrap, user namespaces, the interpreter). backends.Build only prepares the
// providers; without this check a broken host would surface as failed requests much later.
func checkLocal(ctx context.Context, tools []config.SandboxTool) error {
	for _, t := range tools {
		if t.Provider != "local" {
			continue
		}
		if err := local.Check(ctx, local.Options{Python: t.Python, WorkDir: t.WorkDir, Tool: t.Name}); err != nil {
			return fmt.Errorf("sandbox tool %q cannot run on this host: %w", t.Name, err)
		}
	}
	return nil
}

func closeSandboxes(log *zap.Logger, sessions *sandbox.Sessions, registry *atomic.Pointer[sandbox.Registry]) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := sessions.Close(ctx); err != nil {
		log.Error("deleting sandboxes", zap.Error(err))
	}
	if err := registry.Load().Close(ctx); err != nil {
		log.Error("closing sandbox backends", zap.Error(err))
	}
}

func logWarnings(log *zap.Logger, cfg *config.Config) {
	for _, w := range cfg.Warnings {
		log.Warn("configuration warning: "+w, zap.String("config", cfg.Path))
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
