package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/backends"
)

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
	a, err := wire(ctx, f, cfg, log)
	if err != nil {
		log.Error("proxy stopped", zap.Error(err))
		return 1
	}
	err = a.serve(ctx, listening)
	a.close()
	if err != nil {
		log.Error("proxy stopped", zap.Error(err))
		return 1
	}
	log.Info("stopped")
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

// checkSandboxes asks the backend of each sandbox tool whose sandboxes run on this host (a
// sandbox.HostChecker: local) to start one under the tool's real limits, as the start does, and
// prints the isolation the host gives it, loudly when it is weaker than the backend's best. It
// reports false when a tool cannot run on this host (the proxy would not start).
func checkSandboxes(cfg *config.Config, stdout, stderr io.Writer) bool {
	ok := true
	for _, t := range cfg.SandboxTools {
		hc, onHost := t.Settings.(sandbox.HostChecker)
		if !onHost {
			continue
		}
		rep, err := hc.CheckHost(context.Background())
		switch {
		case err != nil:
			fmt.Fprintf(stderr, "sandbox tool %q (%s): cannot run on this host: %v\n", t.Name, t.Backend, err)
			ok = false
		case rep.Weaker:
			fmt.Fprintf(stdout, "sandbox tool %q (%s): WEAKER ISOLATION ON THIS HOST: %s\n", t.Name, t.Backend, rep.Isolation)
		default:
			fmt.Fprintf(stdout, "sandbox tool %q (%s): isolation %s\n", t.Name, t.Backend, rep.Isolation)
		}
	}
	return ok
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
