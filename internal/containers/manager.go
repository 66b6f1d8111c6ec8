package containers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"sync"
	"sync/atomic"
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

// MetadataContainerID is the sandbox metadata key (where the backend keeps metadata, as e2b does)
// naming the container a sandbox was created for, so that a sandbox whose record was never written
// (its process died in between) can be found by listing the backend's sandboxes.
const MetadataContainerID = "ciproxy_container_id"

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
	h         sandbox.Handle
	ent       *sandbox.Tool
	hostBound bool
	created   time.Time
	runMu     chan struct{} // one run at a time: Jupyter kernels run one cell at a time
	// slot is its place in this process's total of host-bound containers (its owner's place is its
	// record's, in the store); nil for a container opened from its record.
	slot *quotaSlot

	// Guarded by s.mu.
	users        int // Create/Open calls not yet Released
	busy         int // runs in progress (0 or 1, as runs are serialized)
	idle         time.Duration
	lastUse      time.Time
	expiresAt    time.Time // as last written to the store
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

// expireDead expires the records of host-bound containers that a previous process of this
// replica made: their sandboxes died with it.
func (s *Manager) expireDead(ctx context.Context) (int, error) {
	all, err := s.st.ExpiringContainers(ctx, s.now().AddDate(100, 0, 0), 0)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, rec := range all {
		if rec.Host == "" || (s.opts.Host != "" && rec.Host != s.host) {
			continue
		}
		won, err := s.claimRecord(ctx, rec)
		if err != nil {
			return n, err
		}
		if won {
			n++
		}
	}
	return n, nil
}

// claimRecord marks rec expired if its record is still at the version read: the claim that makes
// exactly one process delete an expired sandbox. false: another writer got there first.
func (s *Manager) claimRecord(ctx context.Context, rec store.Container) (bool, error) {
	rec.Status, rec.ExpiresAt, rec.ForgetAt = StatusExpired, time.Time{}, s.now().Add(s.opts.Retention)
	_, err := s.st.UpdateContainer(ctx, rec)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
		return false, nil
	}
	return false, err
}

// Expire marks rec expired, unless another writer changed it since it was read: for a container
// whose sandbox is known to be gone with the replica that hosted it (peer.Options.Expire). It does
// not delete the sandbox.
func (s *Manager) Expire(ctx context.Context, rec store.Container) error {
	_, err := s.claimRecord(ctx, rec)
	return err
}

// errClaimed stops a Modify of a record that another process has expired.
var errClaimed = errors.New("container claimed as expired")

// expire marks owner's container id expired, from a fresh read. already reports that it was
// expired before (another process claimed it, and deletes the sandbox).
func (s *Manager) expire(ctx context.Context, owner, id string) (already bool, err error) {
	_, err = store.Modify(ctx, s.st, owner, id, func(r *store.Container) error {
		if r.Status == StatusExpired {
			return errClaimed
		}
		r.Status, r.ExpiresAt, r.ForgetAt = StatusExpired, time.Time{}, s.now().Add(s.opts.Retention)
		return nil
	})
	if errors.Is(err, errClaimed) {
		return true, nil
	}
	return false, err
}

// Create starts a sandbox on the named tool for owner, records it, and returns it held (call
// Release when done). idle is its idle timeout for its whole life (0: the sandbox is deleted when
// the last holder releases it). When opts.Lifetime is 0 the backend is asked to keep the sandbox
// for the idle timeout (at least 5 minutes) plus a margin. Failures wrap ErrUnavailable.
func (s *Manager) Create(ctx context.Context, tool, owner string, opts sandbox.CreateOptions, idle time.Duration) (*Container, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("%w: shutting down", sandbox.ErrUnavailable)
	}
	reg := s.registry(ctx)
	ent, ok := reg.Tool(tool)
	if !ok {
		return nil, fmt.Errorf("%w: sandbox tool %q is not configured", sandbox.ErrUnavailable, tool)
	}
	id := s.st.NewID(store.ContainerKind)
	slot, err := s.admit(ctx, reg, ent, owner, id)
	if err != nil {
		return nil, err
	}
	kept := false
	defer func() {
		if !kept {
			slot.free()
			slot.cancel(ctx, s.opts.DeleteTimeout)
		}
	}()
	if !ent.Acquire() {
		return nil, fmt.Errorf("%w: sandbox tool %q is being reconfigured", sandbox.ErrUnavailable, tool)
	}
	if opts.Lifetime <= 0 {
		// Ask for a known lifetime, so that Run and Release know when the backend needs a KeepAlive:
		// the idle timeout, or the hold lease while the creating request holds it (with idle 0 the
		// sandbox is deleted at Release); Run extends it when an execution could outlast it.
		opts.Lifetime = min(max(idle, holdLease)+keepAliveMargin, maxBackendLifetime)
	}
	opts.Metadata = maps.Clone(opts.Metadata)
	if opts.Metadata == nil {
		opts.Metadata = map[string]string{}
	}
	maps.Copy(opts.Metadata, s.opts.Metadata)
	opts.Metadata[MetadataContainerID] = id
	// From before the sandbox exists until its record does (or it is deleted), the id is claimed
	// as being created, so that no orphan sweep takes the new sandbox for one.
	creating := CreatingClaim(id)
	if _, err := s.st.Claim(ctx, creating, s.host, createTimeout+keepAliveMargin); err != nil {
		s.releaseEntry(ctx, ent, tool)
		return nil, fmt.Errorf("sandbox tool %q: %w: %w", tool, sandbox.ErrUnavailable, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.DeleteTimeout)
		defer cancel()
		_ = s.st.Release(rctx, creating, s.host) // else it runs out
	}()

	start := time.Now()
	h, settled, err := s.createDetached(ctx, ent, opts)
	// Close waits until this create is settled: registered below, or deleted.
	defer settled()
	s.m.observe(opCreate, tool, start, err)
	if errors.Is(err, errAbandoned) {
		// The background create owns ent's reference now and deletes what it creates.
		return nil, ctx.Err()
	}
	if err != nil {
		s.releaseEntry(ctx, ent, tool)
		if errors.Is(err, sandbox.ErrUnavailable) {
			return nil, fmt.Errorf("sandbox tool %q: %w", tool, err)
		}
		return nil, fmt.Errorf("sandbox tool %q: %w: %w", tool, sandbox.ErrUnavailable, err)
	}
	h.Tool = tool
	now := s.now()
	c := &Container{
		s: s, id: id, owner: owner, name: opts.Name, memory: opts.MemoryLimit, h: h, ent: ent,
		hostBound: ent.HostBound, created: now, runMu: make(chan struct{}, 1), slot: slot,
		users: 1, idle: idle, lastUse: now, backendUntil: now.Add(opts.Lifetime), kernelIdle: opts.KernelIdle,
		baseline: map[string]fileStamp{}, // a new sandbox's /mnt/data is empty
	}
	c.expiresAt = c.dueLocked(now)
	rec := store.Container{
		ID: id, Owner: owner, Name: opts.Name, Backend: h.Backend, Tool: tool, Handle: encodeHandle(h),
		MemoryLimit: opts.MemoryLimit, Status: StatusRunning, IdleTimeout: idle,
		CreatedAt: now, LastActiveAt: now, ExpiresAt: c.expiresAt,
	}
	if c.hostBound {
		rec.Host = s.host
	}
	// Held in memory before its record exists, so that a sweep that finds the record finds the
	// container too (a host-bound record that no process holds is taken for dead).
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.deleteUnrecorded(ctx, ent, h)
		return nil, fmt.Errorf("%w: shutting down", sandbox.ErrUnavailable)
	}
	s.live[id] = c
	s.mu.Unlock()
	s.m.live.Inc()
	if _, err := s.st.CreateContainer(ctx, rec); err != nil {
		s.mu.Lock()
		c.deleting = true
		delete(s.live, id)
		s.mu.Unlock()
		s.m.live.Dec()
		s.deleteUnrecorded(ctx, ent, h)
		return nil, fmt.Errorf("sandbox tool %q: %w: recording the container: %w", tool, sandbox.ErrUnavailable, err)
	}
	s.log.Debug("container created", zap.String("container", id), zap.String("tool", tool), zap.String("sandbox", h.ID))
	kept = true
	return c, nil
}

// deleteUnrecorded deletes a sandbox whose record could not be written, and gives back ent.
func (s *Manager) deleteUnrecorded(ctx context.Context, ent *sandbox.Tool, h sandbox.Handle) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.DeleteTimeout)
	defer cancel()
	if err := ent.Provider.Delete(dctx, h); err != nil {
		s.log.Warn("deleting a sandbox whose container could not be recorded", zap.String("sandbox", h.ID), zap.Error(err))
	}
	s.releaseEntry(ctx, ent, h.Tool)
}

func (s *Manager) releaseEntry(ctx context.Context, ent *sandbox.Tool, tool string) {
	if err := ent.Release(context.WithoutCancel(ctx)); err != nil {
		s.log.Warn("closing retired sandbox tool", zap.String("tool", tool), zap.Error(err))
	}
}

func encodeHandle(h sandbox.Handle) []byte {
	b, err := json.Marshal(h)
	if err != nil {
		panic(fmt.Sprintf("sandbox: marshal handle: %v", err)) // only strings: cannot fail
	}
	return b
}

// Open returns owner's container id, held (call Release when done). An id that is malformed,
// unknown, or another owner's is ErrNotFound; an expired container, or one whose sandbox is gone,
// is ErrNotFound wrapping ErrExpired. A container that this process does not hold yet is rebuilt
// from its record after a KeepAlive proves its sandbox still lives.
func (s *Manager) Open(ctx context.Context, id, owner string) (*Container, error) {
	if !store.ContainerKind.Valid(id) {
		return nil, fmt.Errorf("%w: unknown container id", sandbox.ErrNotFound)
	}
	rec, err := s.record(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	now := s.now()
	if expiredAt(rec, now) {
		return nil, errExpired
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: shutting down", sandbox.ErrUnavailable)
	}
	if c, ok := s.live[id]; ok && !c.deleting {
		c.users++
		c.lastUse = now
		s.mu.Unlock()
		if err := s.touch(ctx, c); err != nil {
			s.Release(ctx, c)
			return nil, err
		}
		return c, nil
	}
	dying := s.dying[id]
	s.mu.Unlock()
	if dying {
		return nil, errExpired
	}
	return s.revive(ctx, rec)
}

// record reads owner's container id, mapping the store's errors to the sandbox's.
func (s *Manager) record(ctx context.Context, owner, id string) (store.Container, error) {
	rec, err := s.st.Container(ctx, owner, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.Container{}, fmt.Errorf("%w: unknown container id", sandbox.ErrNotFound)
	case err != nil:
		return store.Container{}, fmt.Errorf("%w: reading the container registry: %w", sandbox.ErrUnavailable, err)
	}
	return rec, nil
}

// expiredAt reports whether rec is expired at now, whether or not a reaper has claimed it yet.
func expiredAt(rec store.Container, now time.Time) bool {
	return rec.Status == StatusExpired || (!rec.ExpiresAt.IsZero() && !now.Before(rec.ExpiresAt))
}

// revive builds a container this process does not hold from its record.
func (s *Manager) revive(ctx context.Context, rec store.Container) (*Container, error) {
	if rec.Host != "" {
		if s.opts.Host != "" && rec.Host != s.host {
			return nil, &ElsewhereError{ID: rec.ID, Host: rec.Host}
		}
		// A host-bound sandbox of this replica that this process did not make: it died with the
		// process that did.
		if _, err := s.expire(ctx, rec.Owner, rec.ID); err != nil {
			s.log.Warn("expiring a container of a previous process", zap.String("container", rec.ID), zap.Error(err))
		}
		return nil, errExpired
	}
	var h sandbox.Handle
	if err := json.Unmarshal(rec.Handle, &h); err != nil || h.ID == "" {
		return nil, fmt.Errorf("%w: the container's record has no usable sandbox handle", sandbox.ErrNotFound)
	}
	tool := rec.Tool
	h.Tool = tool
	ent, ok := s.registry(ctx).Tool(tool)
	if !ok || ent.Backend != "" && ent.Backend != h.Backend {
		return nil, fmt.Errorf("%w: sandbox tool %q is not configured", sandbox.ErrNotFound, tool)
	}
	if !ent.Acquire() {
		return nil, fmt.Errorf("%w: sandbox tool %q is being reconfigured", sandbox.ErrUnavailable, tool)
	}
	now := s.now()
	idle := rec.IdleTimeout
	keep := min(max(idle, holdLease)+keepAliveMargin, maxBackendLifetime)
	start := time.Now()
	err := ent.Provider.KeepAlive(ctx, h, keep)
	s.m.observe(opKeepAlive, tool, start, err)
	if err != nil {
		s.releaseEntry(ctx, ent, tool)
		if errors.Is(err, sandbox.ErrNotFound) {
			if _, err := s.expire(ctx, rec.Owner, rec.ID); err != nil {
				s.log.Warn("expiring a container whose sandbox is gone", zap.String("container", rec.ID), zap.Error(err))
			}
			return nil, errExpired
		}
		return nil, fmt.Errorf("sandbox tool %q: %w: %w", tool, sandbox.ErrUnavailable, err)
	}
	c := &Container{
		s: s, id: rec.ID, owner: rec.Owner, name: rec.Name, memory: rec.MemoryLimit, h: h, ent: ent,
		hostBound: ent.HostBound, created: rec.CreatedAt, runMu: make(chan struct{}, 1),
		users: 1, idle: idle, lastUse: now, expiresAt: rec.ExpiresAt, backendUntil: now.Add(keep),
	}
	s.mu.Lock()
	if other, ok := s.live[rec.ID]; ok && !other.deleting {
		// Opened concurrently: keep the first.
		other.users++
		other.lastUse = now
		s.mu.Unlock()
		s.releaseEntry(ctx, ent, tool)
		c = other
	} else if s.closed {
		s.mu.Unlock()
		s.releaseEntry(ctx, ent, tool)
		return nil, fmt.Errorf("%w: shutting down", sandbox.ErrUnavailable)
	} else {
		s.live[rec.ID] = c
		s.mu.Unlock()
		s.m.live.Inc()
		s.log.Debug("container reopened", zap.String("container", rec.ID), zap.String("tool", tool), zap.String("sandbox", h.ID))
	}
	if err := s.touch(ctx, c); err != nil {
		s.Release(ctx, c)
		return nil, err
	}
	return c, nil
}

// dueLocked is when c may be reaped if nobody uses it again: its idle timeout from now, or the
// hold lease while a request holds it, and never after its hard end of life. s.mu is held.
func (c *Container) dueLocked(now time.Time) time.Time {
	d := c.idle
	if c.users > 0 || c.busy > 0 {
		d = max(d, holdLease)
	}
	return minTime(now.Add(d), c.hardEnd())
}

// hardEnd is the container's end of life, whatever its use.
func (c *Container) hardEnd() time.Time {
	return c.created.Add(max(c.s.opts.MaxLife, c.idle))
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// touch writes c's last use and expiry to its record, and asks the backend to keep the sandbox
// at least that long. It runs detached from ctx's cancellation, under DeleteTimeout. A record
// that another process has expired, or that is gone, makes c forgotten here (that process deletes
// the sandbox) and is errExpired.
func (s *Manager) touch(ctx context.Context, c *Container) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.DeleteTimeout)
	defer cancel()
	var due time.Time
	_, err := store.Modify(ctx, s.st, c.owner, c.id, func(r *store.Container) error {
		if r.Status == StatusExpired {
			return errClaimed
		}
		s.mu.Lock()
		now := s.now()
		due = c.dueLocked(now)
		if c.lastUse.After(r.LastActiveAt) {
			r.LastActiveAt = c.lastUse
		}
		s.mu.Unlock()
		r.ExpiresAt = due
		return nil
	})
	switch {
	case errors.Is(err, errClaimed):
		s.forget(c) // the process that claimed it deletes the sandbox
		return errExpired
	case errors.Is(err, store.ErrNotFound):
		s.dropLost(ctx, c)
		return errExpired
	case err != nil:
		return fmt.Errorf("%w: recording the container's use: %w", sandbox.ErrUnavailable, err)
	}
	s.mu.Lock()
	c.expiresAt = due
	now := s.now()
	extend := due.After(c.backendUntil)
	s.mu.Unlock()
	if extend {
		s.keepAlive(ctx, c, due.Sub(now)+keepAliveMargin)
	}
	return nil
}

// forget drops c from this process without deleting its sandbox: another process expired or
// deleted its record and deletes the sandbox.
// refresh brings what this process knows of c's expiry up to its record: a later expiry (another
// replica used it), a claim by another process (which deletes the sandbox), or no record at all.
func (s *Manager) refresh(ctx context.Context, c *Container) {
	rec, err := s.st.Container(ctx, c.owner, c.id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		s.dropLost(ctx, c)
	case err != nil:
		s.log.Warn("reading the record of an idle container", zap.String("container", c.id), zap.Error(err))
	case rec.Status == StatusExpired:
		s.forget(c)
	default:
		s.mu.Lock()
		c.expiresAt = rec.ExpiresAt
		s.mu.Unlock()
	}
}

// dropLost deletes the sandbox of a container whose record is gone (a store that lost its keys, as
// a Redis restarted empty): nobody can name it any more, and nobody else will delete it. A
// container still held is deleted by the touch of its last release.
func (s *Manager) dropLost(ctx context.Context, c *Container) {
	s.mu.Lock()
	if c.deleting || c.users > 0 || c.busy > 0 {
		s.mu.Unlock()
		return
	}
	s.markDeletingLocked(c)
	s.mu.Unlock()
	s.deleteNow(ctx, c, "record lost")
}

func (s *Manager) forget(c *Container) {
	s.mu.Lock()
	if c.deleting {
		s.mu.Unlock()
		return
	}
	c.deleting = true
	if s.live[c.id] == c {
		delete(s.live, c.id)
	}
	s.mu.Unlock()
	s.m.live.Dec()
	c.slot.free()
	s.releaseEntry(context.Background(), c.ent, c.h.Tool)
}

// Release ends one holder's use of c (from Create or Open) and records the use. A container whose
// idle timeout is 0 is deleted once nobody holds it; any other lives until its idle timeout after
// its last use, and the backend is asked to keep it that long. ctx may already be cancelled: the
// work runs detached, under its own timeout. A nil c is ignored.
func (s *Manager) Release(ctx context.Context, c *Container) { s.release(ctx, c, false) }

// Discard is Release that deletes the sandbox once nobody else holds it, whatever its idle
// timeout: for a container whose id never reached anyone, which nobody could use again.
func (s *Manager) Discard(ctx context.Context, c *Container) { s.release(ctx, c, true) }

func (s *Manager) release(ctx context.Context, c *Container, discard bool) {
	if c == nil {
		return
	}
	s.mu.Lock()
	if c.users > 0 {
		c.users--
	}
	c.lastUse = s.now()
	if c.deleting {
		s.mu.Unlock()
		return
	}
	if (discard || c.idle <= 0) && c.users == 0 && c.busy == 0 {
		s.markDeletingLocked(c)
		s.mu.Unlock()
		why := "released"
		if discard {
			why = "discarded"
		}
		s.deleteNow(ctx, c, why)
		return
	}
	s.mu.Unlock()
	if err := s.touch(ctx, c); err != nil && !errors.Is(err, ErrExpired) {
		s.log.Warn("recording a container's use", zap.String("container", c.id), zap.Error(err))
	}
}

// keepAlive asks the backend to keep c for d more; a sandbox found gone is dropped.
func (s *Manager) keepAlive(ctx context.Context, c *Container, d time.Duration) {
	d = min(d, maxBackendLifetime)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.DeleteTimeout)
	defer cancel()
	start := time.Now()
	err := c.ent.Provider.KeepAlive(ctx, c.h, d)
	s.m.observe(opKeepAlive, c.h.Tool, start, err)
	if err == nil {
		s.mu.Lock()
		if until := s.now().Add(d); until.After(c.backendUntil) {
			c.backendUntil = until
		}
		s.mu.Unlock()
		return
	}
	if errors.Is(err, sandbox.ErrNotFound) {
		s.dropGone(ctx, c)
		return
	}
	s.log.Warn("sandbox keepalive failed", zap.String("tool", c.h.Tool), zap.String("sandbox", c.h.ID), zap.Error(err))
}

// dropGone expires a container whose sandbox the backend no longer has.
func (s *Manager) dropGone(ctx context.Context, c *Container) {
	s.mu.Lock()
	if c.deleting {
		s.mu.Unlock()
		return
	}
	s.markDeletingLocked(c)
	s.mu.Unlock()
	s.deleteNow(ctx, c, "gone")
}

// markDeletingLocked takes c out of the live set; the caller then calls deleteNow. s.mu is held.
func (s *Manager) markDeletingLocked(c *Container) {
	c.deleting = true
	if s.live[c.id] == c {
		delete(s.live, c.id)
	}
	s.dying[c.id] = true
	s.deletes.Add(1)
}

// deleteNow is deleteSandbox for a container marked by markDeletingLocked, which counted it in
// s.deletes.
func (s *Manager) deleteNow(ctx context.Context, c *Container, why string) bool {
	defer s.deletes.Done()
	return s.deleteSandbox(ctx, c, why)
}

// deleteSandbox expires c's record and deletes its sandbox, detached from ctx's cancellation,
// under DeleteTimeout, and releases its provider. c must be marked deleting. When another process
// claimed the record first, that process deletes the sandbox. When the store cannot be written,
// the sandbox is deleted all the same: a record that says running while its sandbox is gone is
// found expired by the next Open, a sandbox left running is a leak. It reports whether this
// process deleted the sandbox (false: another one had claimed it).
func (s *Manager) deleteSandbox(ctx context.Context, c *Container, why string) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.DeleteTimeout)
	defer cancel()
	h := c.h
	already, err := s.expire(ctx, c.owner, c.id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("expiring a container's record", zap.String("container", c.id), zap.Error(err))
	}
	if !already {
		start := time.Now()
		err := c.ent.Provider.Delete(ctx, h)
		s.m.observe(opDelete, h.Tool, start, err)
		if err != nil {
			s.log.Warn("sandbox delete failed", zap.String("container", c.id), zap.String("tool", h.Tool),
				zap.String("sandbox", h.ID), zap.String("why", why), zap.Error(err))
		} else {
			s.log.Debug("container deleted", zap.String("container", c.id), zap.String("tool", h.Tool),
				zap.String("sandbox", h.ID), zap.String("why", why))
		}
	}
	s.mu.Lock()
	delete(s.dying, c.id)
	s.mu.Unlock()
	s.m.live.Dec()
	c.slot.free()
	s.releaseEntry(ctx, c.ent, h.Tool)
	return !already
}

// Sweep deletes every container that is expired at Now (idle past its timeout with no holder, or
// past its hard end of life) and not running code, whichever process made it, waits for those
// deletions, and returns how many it claimed. It first renews the hold lease of the containers this
// process's requests hold, and restarts the kernels idle past their kernel idle timeout
// (restartIdleKernels). The reaper calls it; tests call it directly.
func (s *Manager) Sweep(ctx context.Context) int {
	now := s.now()
	var renew []*Container
	s.mu.Lock()
	for _, c := range s.live {
		if !c.deleting && (c.users > 0 || c.busy > 0) && c.expiresAt.Before(now.Add(holdLease/2)) && now.Before(c.hardEnd()) {
			renew = append(renew, c)
		}
	}
	s.mu.Unlock()
	for _, c := range renew {
		if err := s.touch(ctx, c); err != nil && !errors.Is(err, ErrExpired) {
			s.log.Warn("renewing a held container's lease", zap.String("container", c.id), zap.Error(err))
		}
	}

	s.restartIdleKernels(ctx, now)

	due, err := s.st.ExpiringContainers(ctx, now, sweepBatch)
	if err != nil {
		s.log.Warn("listing expired containers", zap.Error(err))
		return 0
	}
	var doomed []*Container
	var orphans []store.Container
	listed := make(map[string]bool, len(due))
	for _, rec := range due {
		listed[rec.ID] = true
	}
	// A container this process holds in memory, idle past its expiry, that the store does not list
	// as due: its record was extended by another replica, claimed, or lost (see refresh).
	var stale []*Container
	s.mu.Lock()
	for id, c := range s.live {
		if !listed[id] && !c.deleting && c.users == 0 && c.busy == 0 && !c.expiresAt.IsZero() && !now.Before(c.expiresAt) {
			stale = append(stale, c)
		}
	}
	s.mu.Unlock()
	for _, c := range stale {
		s.refresh(ctx, c)
	}
	s.mu.Lock()
	for _, rec := range due {
		if s.opts.Host != "" && rec.Host != "" && rec.Host != s.host {
			continue // another replica's process holds that sandbox, and reaps it
		}
		c, ok := s.live[rec.ID]
		switch {
		case s.dying[rec.ID]:
		case !ok:
			orphans = append(orphans, rec)
		case c.deleting || c.busy > 0:
		case c.users > 0 && now.Before(c.hardEnd()):
		default:
			s.markDeletingLocked(c)
			doomed = append(doomed, c)
		}
	}
	s.mu.Unlock()
	var n atomic.Int32
	var wg sync.WaitGroup
	for _, c := range doomed {
		wg.Go(func() {
			if s.deleteNow(ctx, c, "expired") {
				n.Add(1)
			}
		})
	}
	for _, rec := range orphans {
		wg.Go(func() {
			if s.reapRecord(ctx, rec) {
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return int(n.Load())
}

// restartIdleKernels restarts the kernel of every container of this process that nobody has used
// for its kernel idle timeout (CreateOptions.KernelIdle), on a provider that is a KernelRestarter:
// an idle container then holds its files and a fresh kernel, not the memory of its Python state.
// Its next execution reports the restart (Result.KernelRestarted).
func (s *Manager) restartIdleKernels(ctx context.Context, now time.Time) {
	var idle []*Container
	s.mu.Lock()
	for _, c := range s.live {
		if _, ok := c.ent.Provider.(sandbox.KernelRestarter); ok && c.kernelIdle > 0 && !c.restarted && !c.deleting &&
			c.users == 0 && c.busy == 0 && !now.Before(c.lastUse.Add(c.kernelIdle)) {
			idle = append(idle, c)
		}
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range idle {
		wg.Go(func() { s.restartKernel(ctx, c) })
	}
	wg.Wait()
}

// restartKernel restarts c's kernel unless c is in use again.
func (s *Manager) restartKernel(ctx context.Context, c *Container) {
	select {
	case c.runMu <- struct{}{}:
	default:
		return // an execution is under way
	}
	defer c.unlock()
	s.mu.Lock()
	idle := !c.deleting && c.users == 0 && c.busy == 0
	if idle {
		c.busy++ // not reaped while its kernel restarts
	}
	s.mu.Unlock()
	if !idle {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.DeleteTimeout)
	start := time.Now()
	err := c.ent.Provider.(sandbox.KernelRestarter).RestartKernel(rctx, c.h)
	cancel()
	s.m.observe(opRestart, c.h.Tool, start, err)
	s.mu.Lock()
	c.busy--
	if err == nil {
		c.restarted = true
	}
	s.mu.Unlock()
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		s.dropGone(ctx, c)
	case err != nil:
		s.log.Warn("restarting an idle kernel", zap.String("container", c.id), zap.String("tool", c.h.Tool), zap.Error(err))
	default:
		s.log.Debug("idle kernel restarted", zap.String("container", c.id), zap.String("tool", c.h.Tool))
	}
}

// reapRecord claims the expired record of a container this process does not hold and deletes its
// sandbox. It reports whether this process claimed it.
func (s *Manager) reapRecord(ctx context.Context, rec store.Container) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.DeleteTimeout)
	defer cancel()
	won, err := s.claimRecord(ctx, rec)
	if err != nil {
		s.log.Warn("claiming an expired container", zap.String("container", rec.ID), zap.Error(err))
	}
	if won {
		s.deleteRecorded(ctx, rec)
	}
	return won
}

// deleteRecorded deletes the sandbox of a container this process does not hold, whose record it
// has just expired.
func (s *Manager) deleteRecorded(ctx context.Context, rec store.Container) {
	if rec.Host != "" {
		return // a host-bound sandbox this process does not hold died with the process that made it
	}
	var h sandbox.Handle
	if err := json.Unmarshal(rec.Handle, &h); err != nil || h.ID == "" {
		return
	}
	h.Tool = rec.Tool
	ent, ok := s.registry(ctx).Tool(rec.Tool)
	if !ok || ent.Backend != "" && ent.Backend != h.Backend {
		s.log.Warn("an expired container's sandbox tool is not configured: its backend's own timeout ends it",
			zap.String("container", rec.ID), zap.String("tool", rec.Tool))
		return
	}
	start := time.Now()
	err := ent.Provider.Delete(ctx, h)
	s.m.observe(opDelete, rec.Tool, start, err)
	if err != nil {
		s.log.Warn("sandbox delete failed", zap.String("container", rec.ID), zap.String("sandbox", h.ID), zap.Error(err))
	}
}

// reap runs Sweep every interval until Close.
func (s *Manager) reap(interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep(context.Background())
		}
	}
}

// Live returns how many containers this process holds.
func (s *Manager) Live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live)
}

// Close stops the reaper and deletes the sandboxes this process owns: those of host-bound tools
// (they would die with the process anyway; their records become expired) and those with idle
// timeout 0 (their requests are over). Other sandboxes (e2b) outlive the process, recorded with
// their expiry, to be opened again after a restart or reaped by whichever process finds them
// expired. It waits for all deletions, including those already in flight, or for ctx. Create and
// Open fail afterwards.
func (s *Manager) Close(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
	s.mu.Lock()
	s.closed = true
	var doomed, kept []*Container
	for _, c := range s.live {
		switch {
		case c.deleting:
		case c.hostBound || c.idle <= 0:
			s.markDeletingLocked(c)
			doomed = append(doomed, c)
		default:
			c.users, c.busy = 0, 0 // what the record says from now on: idle since its last use
			kept = append(kept, c)
		}
	}
	s.mu.Unlock()
	for _, c := range doomed {
		go s.deleteNow(ctx, c, "shutdown")
	}
	for _, c := range kept {
		if err := s.touch(ctx, c); err != nil && !errors.Is(err, ErrExpired) {
			s.log.Warn("recording a container at shutdown", zap.String("container", c.id), zap.Error(err))
		}
		s.forget(c)
	}
	finished := make(chan struct{})
	go func() {
		s.deletes.Wait()
		close(finished)
	}()
	select {
	case <-finished:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sandbox: %d containers: waiting for deletions: %w", len(doomed), ctx.Err())
	}
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
	return Info{ID: c.id, Name: c.name, Status: StatusRunning, MemoryLimit: c.memory, IdleTimeout: c.idle,
		CreatedAt: c.created, LastActiveAt: c.lastUse}
}

// lock takes c's run lock, or gives up with ctx.
func (c *Container) lock(ctx context.Context) error {
	select {
	case c.runMu <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Container) unlock() { <-c.runMu }

// Run executes code in the container's kernel: one run at a time per container (a second waits for
// the first, or for ctx), never reaped while running. Errors are the provider's (see Provider.Run);
// a container found gone is ErrNotFound and is expired.
func (c *Container) Run(ctx context.Context, code string, opts sandbox.RunOptions) (sandbox.Result, error) {
	if err := c.lock(ctx); err != nil {
		return sandbox.Result{}, err
	}
	defer c.unlock()
	return c.runLocked(ctx, code, opts)
}

func (c *Container) runLocked(ctx context.Context, code string, opts sandbox.RunOptions) (sandbox.Result, error) {
	s := c.s
	s.mu.Lock()
	if c.deleting {
		s.mu.Unlock()
		return sandbox.Result{}, fmt.Errorf("%w: container deleted", sandbox.ErrNotFound)
	}
	c.busy++
	restarted := c.restarted
	c.restarted = false
	now := s.now()
	need := opts.Timeout
	if need <= 0 {
		need = 5 * time.Minute
	}
	extend := c.backendUntil.Before(now.Add(need + keepAliveMargin))
	keep := max(c.idle, need) + keepAliveMargin
	s.mu.Unlock()

	if extend {
		s.keepAlive(ctx, c, keep)
	}
	start := time.Now()
	res, err := c.ent.Provider.Run(ctx, c.h, code, opts)
	s.m.observe(opRun, c.h.Tool, start, err)
	res.KernelRestarted = restarted

	s.mu.Lock()
	c.busy--
	c.lastUse = s.now()
	s.mu.Unlock()
	if errors.Is(err, sandbox.ErrNotFound) {
		s.dropGone(ctx, c)
		return res, err
	}
	if terr := s.touch(ctx, c); terr != nil && !errors.Is(terr, ErrExpired) {
		s.log.Warn("recording a container's use", zap.String("container", c.id), zap.Error(terr))
	}
	return res, err
}

// createTimeout bounds a backend create that runs detached from its caller.
const createTimeout = 2 * time.Minute

// errAbandoned marks a create whose caller left before the backend answered.
var errAbandoned = errors.New("sandbox: create abandoned by its caller")

// createDetached runs the backend's Create detached from ctx's cancellation. A backend such as e2b
// finishes a create even when its client goes away, and a sandbox whose id never reached us could
// only be left to run until its backend timeout. When ctx ends first, createDetached returns
// errAbandoned at once; the create goes on in the background, deletes the sandbox it gets, and
// releases ent. Close waits for it: when the caller got the result, until the caller calls the
// returned func (once the sandbox is registered or deleted); otherwise until the background
// create has deleted what it got.
func (s *Manager) createDetached(ctx context.Context, ent *sandbox.Tool, opts sandbox.CreateOptions) (sandbox.Handle, func(), error) {
	type result struct {
		h   sandbox.Handle
		err error
	}
	const (
		waiting = iota
		delivered
		abandoned
	)
	var state atomic.Int32
	out := make(chan result, 1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return sandbox.Handle{}, func() {}, fmt.Errorf("%w: shutting down", sandbox.ErrUnavailable)
	}
	s.deletes.Add(1)
	s.mu.Unlock()
	var once sync.Once
	settle := func() { once.Do(s.deletes.Done) }
	go func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
		defer cancel()
		h, err := ent.Provider.Create(cctx, opts)
		if state.CompareAndSwap(waiting, delivered) {
			out <- result{h, err} // the caller settles
			return
		}
		defer settle()
		if err == nil {
			dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.DeleteTimeout)
			if derr := ent.Provider.Delete(dctx, h); derr != nil {
				s.log.Warn("deleting a sandbox whose request left during its creation", zap.String("sandbox", h.ID), zap.Error(derr))
			}
			dcancel()
		}
		if err := ent.Release(context.WithoutCancel(ctx)); err != nil {
			s.log.Warn("closing retired sandbox tool", zap.Error(err))
		}
	}()
	select {
	case r := <-out:
		return r.h, settle, r.err
	case <-ctx.Done():
		if state.CompareAndSwap(waiting, abandoned) {
			return sandbox.Handle{}, func() {}, errAbandoned
		}
		r := <-out
		return r.h, settle, r.err
	}
}

// registry returns the sandbox tools for a call with ctx: the request's (sandbox.WithRegistry), else the
// current ones (Options.Registry).
func (s *Manager) registry(ctx context.Context) *sandbox.Registry {
	if reg := sandbox.RegistryFrom(ctx); reg != nil {
		return reg
	}
	return s.opts.Registry()
}
