// Package snapshot publishes what the proxy serves with: one Snapshot, a parsed configuration
// together with the sandbox registry provisioned from it, replaced as a whole by each reload.
//
// A reload is one transaction, as Caddy applies a config (Current.Reload): read the file, compare its
// bytes with the current snapshot's, parse it (each sandbox tool decoded by its backend), provision
// the sandbox registry, publish the new snapshot with one atomic store, then retire what the old
// snapshot held and the new one does not. Until the publish nothing is visible; if any step fails,
// the old snapshot keeps serving, whole. A request holds the snapshot it started with (Acquire), so
// it sees the models and the sandbox tools of one configuration, and the tools it may still need are
// retired only once it is done.
package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// retireTimeout bounds closing the sandbox providers that a replaced snapshot alone held.
const retireTimeout = 30 * time.Second

// ErrUnchanged is Reload's answer when the file holds the bytes of the current snapshot, or of the
// edit rejected last: nothing is reloaded (and nothing logged above debug level).
var ErrUnchanged = errors.New("config file unchanged")

// Snapshot is the proxy's state at one moment: a configuration and the sandbox registry provisioned
// from it. Neither changes once published.
type Snapshot struct {
	Config    *config.Config
	Sandboxes *sandbox.Registry

	users    atomic.Int64 // requests holding it (Current.Acquire, Current.Release)
	replaced atomic.Bool  // a reload published another snapshot in its place
	next     *Snapshot    // the snapshot that replaced it; guarded by Current.mu
}

// Provision builds the sandbox registry for tools. prev is the registry being replaced (nil at
// start): a provider it holds for an unchanged tool is carried over, and prev itself must be left as
// it is, since the old snapshot keeps serving until the new one is published (and for good when
// provisioning fails). On error, whatever it started must be closed. backends.Build is the one.
type Provision func(ctx context.Context, tools []config.SandboxTool, prev *sandbox.Registry, log *zap.Logger) (*sandbox.Registry, error)

// Options configure a Current made by New.
type Options struct {
	// Parse are the options each reload parses the file with: the sandbox backends
	// (backends.ParseOptions) and the environment.
	Parse config.ParseOptions
	// Provision builds the sandbox registry of each configuration. Required.
	Provision Provision
	// Logger receives one line per reload (and per warning of a published configuration); nil means
	// no logging. Values of secrets are never logged.
	Logger *zap.Logger
	// OnReload, if not nil, is called after each reload that found the file changed: with nil once
	// the new snapshot is published, or with the error that kept the previous one. It runs on the
	// reloading goroutine, after the outcome is logged.
	OnReload func(err error)
}

// Current holds the current Snapshot and replaces it on Reload. Load and Acquire are safe for
// concurrent use and never wait for a reload.
type Current struct {
	p    atomic.Pointer[Snapshot]
	path string
	opts Options
	log  *zap.Logger

	reloading sync.Mutex     // one reload at a time
	failed    []byte         // the bytes of the last rejected file; guarded by reloading
	started   *config.Config // the configuration the process started with (New)

	mu         sync.Mutex
	superseded []*Snapshot // replaced snapshots not yet retired, oldest first
	closed     bool
	retiring   sync.WaitGroup
}

// New provisions cfg (parsed from the file at cfg.Path, with opts.Parse) and returns a Current
// publishing it as the first snapshot. The configuration's warnings are logged first, once. On error
// nothing is left running.
func New(ctx context.Context, cfg *config.Config, opts Options) (*Current, error) {
	s := newCurrent(cfg.Path, opts)
	s.started = cfg
	s.logWarnings(cfg)
	reg, err := opts.Provision(ctx, cfg.SandboxTools, nil, s.log)
	if err != nil {
		return nil, fmt.Errorf("sandbox tools: %w", err)
	}
	s.p.Store(&Snapshot{Config: cfg, Sandboxes: reg})
	return s, nil
}

// Fixed returns a Current holding snap, for callers that build a snapshot themselves (tests). It has
// no file: Reload fails.
func Fixed(snap *Snapshot) *Current {
	s := newCurrent("", Options{})
	s.p.Store(snap)
	return s
}

func newCurrent(path string, opts Options) *Current {
	s := &Current{path: path, opts: opts, log: opts.Logger}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	return s
}

// Load returns the current snapshot without holding it: for what is not a request (shutdown
// settings, the sandbox tools of work done outside any request). The result must not be modified.
func (s *Current) Load() *Snapshot { return s.p.Load() }

// Acquire returns the current snapshot for one request, held until Release (once, when the request
// is done): until then the sandbox tools of the snapshot stay open for the request, even if a reload
// replaces them. The result must not be modified; it is nil while the Current holds none.
func (s *Current) Acquire() *Snapshot {
	for {
		snap := s.p.Load()
		if snap == nil {
			return nil
		}
		snap.users.Add(1)
		if s.p.Load() == snap {
			return snap
		}
		// Replaced in between: the retirement may not have counted this use. Let go and take the new one.
		s.Release(snap)
	}
}

// Release lets go of a snapshot Acquire returned; nil is ignored. Only the last holder of a replaced
// snapshot has anything to do, so a request on the current snapshot takes no lock. (publish sets
// replaced before it counts the holders, and Release counts down before it reads replaced: one of
// them sees the other.)
func (s *Current) Release(snap *Snapshot) {
	if snap != nil && snap.users.Add(-1) == 0 && snap.replaced.Load() {
		s.retireIdle()
	}
}

// Reload applies the file as one transaction: read, compare, parse, provision, publish, retire. It
// returns ErrUnchanged when the file holds the current snapshot's bytes or those of the edit rejected
// last, nil once the new snapshot is published, and otherwise the error that kept the current one
// (which then serves on, whole). Each outcome but ErrUnchanged is logged once and reported to
// OnReload.
func (s *Current) Reload(ctx context.Context) error {
	s.reloading.Lock()
	defer s.reloading.Unlock()
	if s.path == "" || s.opts.Provision == nil {
		return errors.New("snapshot: no configuration file to reload (Fixed)")
	}
	err := s.reload(ctx)
	switch {
	case errors.Is(err, ErrUnchanged):
		s.log.Debug("config file unchanged", zap.String("path", s.path))
		return err
	case err != nil:
		// Problems name keys and lines, never values of secrets.
		s.log.Error("config reload failed; keeping the previous config", zap.String("path", s.path), zap.Error(err))
	default:
		cfg := s.Load().Config
		s.log.Info("config reloaded", zap.String("path", s.path),
			zap.Int("models", len(cfg.Models)),
			zap.Int("sandbox_tools", len(cfg.SandboxTools)),
			zap.Bool("interception", cfg.InterceptionActive()))
		if changed := config.StartOnlyChanges(s.started, cfg); len(changed) > 0 {
			// Published with the rest, but what reads them did so once, at start.
			s.log.Warn("config reloaded; these settings apply only at the next start", zap.String("path", s.path),
				zap.Strings("settings", changed))
		}
		s.logWarnings(cfg)
	}
	if s.opts.OnReload != nil {
		s.opts.OnReload(err)
	}
	return err
}

func (s *Current) reload(ctx context.Context) error {
	data, err := os.ReadFile(s.path)
	if err != nil {
		s.failed = nil
		return fmt.Errorf("reading config: %w", err)
	}
	cur := s.Load()
	if cur.Config.SameSource(data) || (s.failed != nil && bytes.Equal(s.failed, data)) {
		return ErrUnchanged
	}
	cfg, err := config.ParseWith(data, s.path, s.opts.Parse)
	if err != nil {
		s.failed = data
		return err
	}
	reg, err := s.opts.Provision(ctx, cfg.SandboxTools, cur.Sandboxes, s.log)
	if err != nil {
		s.failed = data
		return fmt.Errorf("sandbox tools: %w", err)
	}
	s.failed = nil
	s.publish(&Snapshot{Config: cfg, Sandboxes: reg})
	return nil
}

// publish makes next the current snapshot and retires what the replaced ones no longer need.
func (s *Current) publish(next *Snapshot) {
	s.mu.Lock()
	old := s.p.Swap(next)
	if old != nil {
		old.next = next
		old.replaced.Store(true)
		s.superseded = append(s.superseded, old)
	}
	s.mu.Unlock()
	s.retireIdle()
}

// retireIdle retires the replaced snapshots that no request holds any more, oldest first, stopping at
// the first one still held: a tool that an older snapshot shares with a newer one is retired by the
// newer one, so the newer one must not go while the older one may still need the tool. Retiring a
// snapshot retires every provider it holds that its successor does not (sandbox.Registry.Retire):
// no container starts on it any more, and it closes once its last container is deleted. The closing
// runs in the background: a request that lets go of a snapshot does not wait for it.
func (s *Current) retireIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	for len(s.superseded) > 0 && s.superseded[0].users.Load() == 0 {
		old := s.superseded[0]
		s.superseded = s.superseded[1:]
		s.retiring.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), retireTimeout)
			defer cancel()
			if err := old.Sandboxes.Retire(ctx, old.next.Sandboxes); err != nil {
				s.log.Warn("closing retired sandbox tools", zap.Error(err))
			}
		})
	}
}

// Close closes every sandbox provider of the current snapshot and of the replaced ones that requests
// still held, now: it is for shutdown, after containers.Manager.Close has deleted the containers.
// Nothing is retired after it.
func (s *Current) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	held := s.superseded
	s.superseded = nil
	s.mu.Unlock()
	s.retiring.Wait()
	var errs []error
	for _, old := range held {
		errs = append(errs, old.Sandboxes.Close(ctx))
	}
	if cur := s.Load(); cur != nil {
		errs = append(errs, cur.Sandboxes.Close(ctx))
	}
	return errors.Join(errs...)
}

func (s *Current) logWarnings(cfg *config.Config) {
	for _, w := range cfg.AllWarnings() {
		s.log.Warn("config warning", zap.String("path", cfg.Path), zap.String("warning", w))
	}
}

type ctxKey struct{}

// NewContext returns ctx carrying snap, and snap's sandbox registry for containers.Manager
// (sandbox.WithRegistry), so that everything the request does sees the one configuration.
func NewContext(ctx context.Context, snap *Snapshot) context.Context {
	ctx = context.WithValue(ctx, ctxKey{}, snap)
	if snap != nil && snap.Sandboxes != nil {
		ctx = sandbox.WithRegistry(ctx, snap.Sandboxes)
	}
	return ctx
}

// FromContext returns the snapshot NewContext put in ctx, or nil.
func FromContext(ctx context.Context) *Snapshot {
	snap, _ := ctx.Value(ctxKey{}).(*Snapshot)
	return snap
}
