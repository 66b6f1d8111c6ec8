package containers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

// Defaults of Options.
const (
	DefaultMaxLife       = 24 * time.Hour
	DefaultSweepInterval = 30 * time.Second
	DefaultDeleteTimeout = 30 * time.Second
	// DefaultRetention is how long an expired container stays visible before it is forgotten.
	DefaultRetention = 24 * time.Hour
	// DefaultIdleTimeout is OpenAI's: a container expires after 20 minutes unused.
	DefaultIdleTimeout = 20 * time.Minute
)

// Container statuses, as the store keeps them and the Containers API shows them.
const (
	StatusRunning = "running"
	StatusExpired = "expired"
)

// keepAliveMargin is added to every backend lifetime asked for, so the backend never ends a
// sandbox just before the reaper would.
const keepAliveMargin = time.Minute

// maxBackendLifetime is the longest lifetime asked of a backend at once: e2b refuses more than
// its plan's cap (24 hours at most); a container that lives longer is extended as it is used.
const maxBackendLifetime = 24 * time.Hour

// holdLease is how far ahead the store's expiry of a container that a request holds is kept, so
// that no process (this one's reaper, or another replica's) takes it for idle while it is in use;
// the holder's reaper renews it once less than half is left.
const holdLease = 10 * time.Minute

// sweepBatch is the most expired containers one Sweep claims.
const sweepBatch = 1000

// ErrExpired: the container has expired (idle past its timeout, past its end of life, or its
// sandbox is gone) and cannot be used any more. Errors that wrap it wrap ErrNotFound too.
var ErrExpired = errors.New("container expired")

// errExpired is what operations on an expired container return.
var errExpired = fmt.Errorf("%w: %w", sandbox.ErrNotFound, ErrExpired)

// ElsewhereError: the container's sandbox lives in another replica's process (a local backend),
// which is the only one that can serve it. It wraps ErrUnavailable.
type ElsewhereError struct {
	ID   string // the container
	Host string // the replica that hosts it
}

func (e *ElsewhereError) Error() string {
	return fmt.Sprintf("container %s is hosted by replica %q", e.ID, e.Host)
}

func (e *ElsewhereError) Unwrap() error { return sandbox.ErrUnavailable }

// Options configure Manager. Zero values mean the defaults.
type Options struct {
	// Store keeps the container registry and the container files. Required.
	Store store.Store
	// Host names this replica in a store that several replicas share. Containers whose sandboxes
	// live in this process (a host-bound tool: RegistryEntry.HostBound) are recorded with it, and
	// at start every such record of Host is expired: its sandbox died with the process that made
	// it. It must be unique per replica and stable across the replica's restarts.
	//
	// "" means one process per store, which the embedded store enforces: host-bound containers
	// are recorded with this machine's host name, and at start every host-bound record is expired,
	// whoever recorded it.
	Host string
	// Now is the clock for expiry (default time.Now). Tests inject one.
	Now func() time.Time
	// Registry returns the current sandbox tools (a reload swaps it), for calls whose context carries
	// no registry of its own (WithRegistry). Nil: none.
	Registry func() *sandbox.Registry
	// Logger, nil for none.
	Logger *zap.Logger
	// Metrics registers the sessions' metrics; nil registers nothing.
	Metrics prometheus.Registerer

	// MaxLife is a container's hard life from its creation, whatever its use (default
	// DefaultMaxLife; an idle timeout longer than it stretches it).
	MaxLife time.Duration
	// SweepInterval is how often the reaper deletes expired containers (default
	// DefaultSweepInterval); negative runs no reaper goroutine (call Sweep).
	SweepInterval time.Duration
	// DeleteTimeout bounds one sandbox deletion, and the store writes that follow a request's end
	// (default DefaultDeleteTimeout).
	DeleteTimeout time.Duration
	// Retention is how long an expired container stays visible (status "expired", its files still
	// listed) before the store forgets it (default DefaultRetention).
	Retention time.Duration
	// Metadata is added to the metadata of every sandbox created (where the backend keeps it):
	// the deployment's tag (MetadataDeployment), so that an orphan sweep tells this deployment's
	// sandboxes from another's (SweepOrphans).
	Metadata map[string]string
}

// Manager are the containers: "cntr_" ids minted by the store, one store record per container
// (owner, tool, the sandbox handle, expiry), per-container run serialization, idle expiry, and the
// reaper that deletes expired sandboxes. Safe for concurrent use.
//
// The store is the truth: any Manager on the same store opens any container id (after a
// KeepAlive proves its sandbox still lives), and another owner's id, a forged id or an unknown id
// is ErrNotFound. What a process holds in memory (the open sandbox, its run lock, how many
// requests hold it) is a cache of the record.
//
// Expiry. A container expires when it has been idle past its timeout (the record's ExpiresAt,
// moved on every use) or at its hard end of life (creation + MaxLife), but never while it runs
// code; an expired container cannot be used again and stays visible as "expired" for Retention.
// Exactly one process deletes an expired sandbox: the one whose UpdateContainer claims its record.
//
// Restarts. A sandbox of a host-bound tool (local) dies with the process, so the records of a
// previous process are expired at start. Any other sandbox (e2b) outlives the process: its record
// stays, and after a restart the container opens again by its id, and expires on its own timeout.
type Manager struct {
	opts Options
	st   store.Store
	host string
	now  func() time.Time
	log  *zap.Logger
	m    *metrics

	mu     sync.Mutex
	live   map[string]*Container // by container id
	dying  map[string]bool       // containers this process is deleting
	quota  quotaBook             // this process's host-bound containers (quota.go)
	closed bool

	deletes  sync.WaitGroup // in-flight deletions and creations
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// Container is one sandbox of one owner, held by the requests that opened or created it.
type Container struct {
	s         *Manager
	id        string
	owner     string
	name      string
	memory    string
	network   *store.NetworkPolicy // as the Containers API shows it
	h         sandbox.Handle
	ent       *sandbox.Tool
	hostBound bool
	created   time.Time
	runMu     chan struct{} // one run at a time: Jupyter kernels run one cell at a time
	// slot is its place in this process's total of host-bound containers (its owner's place is its
	// record's, in the store); nil for a container opened from its record.
	slot *quotaSlot

	// Guarded by s.mu.
	users   int // Create/Open calls not yet Released
	busy    int // runs in progress (0 or 1, as runs are serialized)
	idle    time.Duration
	lastUse time.Time
	// expiresAt is when the sweep looks at c next: its expiry as last written to the store, or
	// as read from a record another replica extended, but then no later than one idle timeout on.
	expiresAt time.Time
	// unsaved says that the last write of its use to the store failed (a shared store out of
	// reach): until the sweep writes it again, the record and expiresAt still hold the expiry
	// of the hold lease taken while a request held it.
	unsaved      bool
	backendUntil time.Time // the backend keeps the sandbox at least until then
	deleting     bool
	// kernelIdle is CreateOptions.KernelIdle; restarted says that the kernel was restarted since
	// the last execution (restartIdleKernels), which the next one reports.
	kernelIdle time.Duration
	restarted  bool

	// Guarded by runMu: the files under DataDir after the last execution, placement or listing;
	// nil when unknown (see Execute).
	baseline map[string]fileStamp
	// figures are the images the last execution saved into DataDir (see saveFigures): file
	// name → the container file id minted for it. Guarded by the run lock.
	figures map[string]string
}

// New returns Manager over opts.Store, expires the containers whose sandboxes died with a
// previous process (see Options.Host), and starts the reaper; Close stops it.
func New(ctx context.Context, opts Options) (*Manager, error) {
	if opts.Store == nil {
		return nil, errors.New("sandbox: Options.Store is required")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Registry == nil {
		opts.Registry = func() *sandbox.Registry { return nil }
	}
	if opts.MaxLife <= 0 {
		opts.MaxLife = DefaultMaxLife
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = DefaultSweepInterval
	}
	if opts.DeleteTimeout <= 0 {
		opts.DeleteTimeout = DefaultDeleteTimeout
	}
	if opts.Retention <= 0 {
		opts.Retention = DefaultRetention
	}
	host := opts.Host
	if host == "" {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		} else {
			host = "localhost"
		}
	}
	s := &Manager{
		opts:  opts,
		st:    opts.Store,
		host:  host,
		now:   opts.Now,
		log:   opts.Logger,
		m:     newMetrics(opts.Metrics),
		live:  make(map[string]*Container),
		dying: make(map[string]bool),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	n, err := s.expireDead(ctx)
	if err != nil {
		return nil, fmt.Errorf("sandbox: expiring the containers of a previous process: %w", err)
	}
	if n > 0 {
		s.log.Info("containers of a previous process expired (their sandboxes died with it)", zap.Int("containers", n))
	}
	if opts.SweepInterval > 0 {
		go s.reap(opts.SweepInterval)
	} else {
		close(s.done)
	}
	return s, nil
}

// Live returns how many containers this process holds.
func (s *Manager) Live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live)
}

// ID returns the container's "cntr_..." id.
func (c *Container) ID() string { return c.id }

// Tool returns the sandbox tool the container runs on.
func (c *Container) Tool() string { return c.h.Tool }

// Expires returns the container's hard end of life (see Manager).
func (c *Container) Expires() time.Time { return c.hardEnd() }

// Info describes the container as the Containers API shows it.
func (c *Container) Info() Info {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return Info{ID: c.id, Name: c.name, Status: StatusRunning, MemoryLimit: c.memory, Network: c.network,
		IdleTimeout: c.idle, CreatedAt: c.created, LastActiveAt: c.lastUse}
}

// registry returns the sandbox tools for a call with ctx: the request's (sandbox.WithRegistry), else the
// current ones (Options.Registry).
func (s *Manager) registry(ctx context.Context) *sandbox.Registry {
	if reg := sandbox.RegistryFrom(ctx); reg != nil {
		return reg
	}
	return s.opts.Registry()
}
