package sandbox

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Defaults of SessionOptions.
const (
	DefaultMaxLife       = 24 * time.Hour
	DefaultSweepInterval = 30 * time.Second
	DefaultDeleteTimeout = 30 * time.Second
	// DefaultReviveIdle is the idle timeout of a container opened from its id alone (another
	// replica's, or this process's before a restart) until a Release sets the real one.
	DefaultReviveIdle = 20 * time.Minute
)

// minLifetime is the shortest backend lifetime asked at Create.
const minLifetime = 5 * time.Minute

// tombstoneLife is how long a deleted sandbox's key is remembered, so that its id fails fast without
// asking the backend. After it, an Open still fails: the backend's KeepAlive no longer finds it.
const tombstoneLife = time.Hour

// keepAliveMargin is added to every backend lifetime asked for, so the backend never ends a
// sandbox just before the reaper would.
const keepAliveMargin = time.Minute

// SessionOptions configure Sessions. Zero values mean the defaults.
type SessionOptions struct {
	// Key seals container ids. KeySize bytes are used as is; any other non-empty key is hashed with
	// KeyFromSecret; nil means a random key, so ids open only in this process.
	Key []byte
	// Now is the clock for expiry (default time.Now). Tests inject one.
	Now func() time.Time
	// Registry returns the current sandbox tools (a reload swaps it), for calls whose context carries
	// no registry of its own (WithRegistry). Nil: none.
	Registry func() *Registry
	// Logger, nil for none.
	Logger *zap.Logger
	// Metrics registers the sessions' metrics; nil registers nothing.
	Metrics prometheus.Registerer

	// MaxLife is a container's hard life from its creation, whatever its use, and the expiry sealed
	// into its id (default DefaultMaxLife).
	MaxLife time.Duration
	// SweepInterval is how often the reaper deletes idle containers (default
	// DefaultSweepInterval); negative runs no reaper goroutine (call Sweep).
	SweepInterval time.Duration
	// DeleteTimeout bounds one sandbox deletion (default DefaultDeleteTimeout).
	DeleteTimeout time.Duration
}

// Sessions holds the containers this process created or opened: sealed cntr_ ids, per-container run
// serialization, idle expiry and the reaper that deletes expired sandboxes. Safe for concurrent use.
//
// Expiry. A container id is sealed once, at creation, so it stays the same for the container's whole
// life as OpenAI's do. The expiry sealed into it is the hard end of life (creation + MaxLife, or more
// if the idle timeout is longer); the idle expiry (last use + idle timeout), which moves on every use,
// is kept here in memory. A container is deleted when it has been idle past its timeout with nobody
// holding it, or at its hard end of life, but never while it runs code.
//
// Replicas. Any process with the same key can open an id: a container it does not hold is rebuilt from
// the sealed handle through the current registry's provider for the tool, after a KeepAlive proves the
// sandbox is still there. Only the process that holds a container in memory reaps it.
type Sessions struct {
	opts   SessionOptions
	sealer *Sealer
	now    func() time.Time
	log    *zap.Logger
	m      *metrics

	mu     sync.Mutex
	live   map[string]*Container // by sandboxKey
	quota  quotaBook             // containers by owner, creation buckets (quota.go)
	gone   map[string]time.Time  // deleted sandboxes → when to forget them (tombstoneLife)
	closed bool

	deletes  sync.WaitGroup // in-flight deletions
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// Container is one sandbox bound to an owner and a sealed id.
type Container struct {
	s     *Sessions
	id    string
	tok   Token
	ent   *providerEntry
	runMu chan struct{} // one run at a time: Jupyter kernels run one cell at a time
	slot  *quotaSlot    // its place in the quotas; nil for a container opened from its id

	// Guarded by s.mu.
	users        int       // Create/Open calls not yet Released
	busy         int       // runs in progress (0 or 1, as runs are serialized)
	lastUse      time.Time // end of the last run, or the last Create/Open/Release
	idle         time.Duration
	backendUntil time.Time // the backend keeps the sandbox at least until then
	deleting     bool
}

// NewSessions returns Sessions and starts their reaper; Close stops it.
func NewSessions(opts SessionOptions) *Sessions {
	key := opts.Key
	if len(key) != 0 && len(key) != KeySize {
		key = KeyFromSecret(string(key))
	}
	sealer, err := NewSealer(key)
	if err != nil {
		// Only a failing crypto/rand gets here: nothing can work without it.
		panic(err)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Registry == nil {
		opts.Registry = func() *Registry { return nil }
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
	s := &Sessions{
		opts:   opts,
		sealer: sealer,
		now:    opts.Now,
		log:    opts.Logger,
		m:      newMetrics(opts.Metrics),
		live:   make(map[string]*Container),
		gone:   make(map[string]time.Time),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if opts.SweepInterval > 0 {
		go s.reap(opts.SweepInterval)
	} else {
		close(s.done)
	}
	return s
}

// sandboxKey identifies a sandbox across ids and processes.
func sandboxKey(h Handle) string { return h.Tool + "\x00" + h.Backend + "\x00" + h.ID }

// Create starts a sandbox on the named tool for owner and returns it held (call Release when done).
// idle is the idle timeout (0: the sandbox is deleted at Release). When opts.Lifetime is 0 the
// backend is asked to keep the sandbox for the idle timeout (at least 5 minutes) plus a margin.
// Failures wrap ErrUnavailable.
func (s *Sessions) Create(ctx context.Context, tool, owner string, opts CreateOptions, idle time.Duration) (*Container, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("%w: shutting down", ErrUnavailable)
	}
	slot, err := s.admit(ctx, s.registry(ctx), owner)
	if err != nil {
		return nil, err
	}
	kept := false
	defer func() {
		if !kept {
			slot.free()
		}
	}()
	ent, ok := s.registry(ctx).entry(tool)
	if !ok {
		return nil, fmt.Errorf("%w: sandbox tool %q is not configured", ErrUnavailable, tool)
	}
	if !ent.acquire() {
		return nil, fmt.Errorf("%w: sandbox tool %q is being reconfigured", ErrUnavailable, tool)
	}
	if opts.Lifetime <= 0 {
		// Ask for a known lifetime, so that Run and Release know when the backend needs a KeepAlive.
		// With idle 0 the sandbox is deleted at Release; minLifetime covers the request until then
		// (Run extends it when an execution could outlast it).
		opts.Lifetime = max(idle, minLifetime) + keepAliveMargin
	}
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
		relErr := ent.release(context.WithoutCancel(ctx))
		if relErr != nil {
			s.log.Warn("closing retired sandbox tool", zap.String("tool", tool), zap.Error(relErr))
		}
		if errors.Is(err, ErrUnavailable) {
			return nil, fmt.Errorf("sandbox tool %q: %w", tool, err)
		}
		return nil, fmt.Errorf("sandbox tool %q: %w: %w", tool, ErrUnavailable, err)
	}
	h.Tool = tool
	now := s.now()
	life := s.opts.MaxLife
	if idle > life {
		life = idle
	}
	c := &Container{
		s: s,
		// Whole seconds, as sealed: the id and the reaper agree on the end of life.
		tok:     Token{Handle: h, Owner: owner, Expires: now.Add(life).Truncate(time.Second)},
		ent:     ent,
		runMu:   make(chan struct{}, 1),
		slot:    slot,
		users:   1,
		lastUse: now,
		idle:    idle,
	}
	c.backendUntil = now.Add(opts.Lifetime)
	c.id = s.sealer.Seal(c.tok)

	s.mu.Lock()
	if s.closed {
		// Close may be waiting on s.deletes already: this one is not counted there.
		c.deleting = true
		s.mu.Unlock()
		s.m.live.Inc() // deleteSandbox counts it down
		s.deleteSandbox(ctx, c, "shutdown")
		return nil, fmt.Errorf("%w: shutting down", ErrUnavailable)
	}
	s.live[sandboxKey(h)] = c
	s.mu.Unlock()
	s.m.live.Inc()
	s.log.Debug("container created", zap.String("tool", tool), zap.String("sandbox", h.ID))
	kept = true
	return c, nil
}

// Open returns the container of id, held (call Release when done). An id that is forged, belongs to
// another owner, has expired, or whose sandbox is gone is ErrNotFound.
func (s *Sessions) Open(ctx context.Context, id, owner string) (*Container, error) {
	tok, err := s.sealer.OpenAt(id, s.now())
	if err != nil {
		return nil, err
	}
	if subtle.ConstantTimeCompare([]byte(tok.Owner), []byte(owner)) != 1 {
		return nil, fmt.Errorf("%w: unknown container id", ErrNotFound)
	}
	key := sandboxKey(tok.Handle)

	s.mu.Lock()
	if c, ok := s.live[key]; ok && !c.deleting {
		c.users++
		c.lastUse = s.now()
		s.mu.Unlock()
		return c, nil
	}
	_, gone := s.gone[key]
	closed := s.closed
	s.mu.Unlock()
	if gone {
		return nil, fmt.Errorf("%w: container deleted", ErrNotFound)
	}
	if closed {
		return nil, fmt.Errorf("%w: shutting down", ErrUnavailable)
	}
	return s.revive(ctx, id, tok)
}

// revive rebuilds a container this process does not hold from its token.
func (s *Sessions) revive(ctx context.Context, id string, tok Token) (*Container, error) {
	tool := tok.Handle.Tool
	ent, ok := s.registry(ctx).entry(tool)
	if !ok || ent.Backend != "" && ent.Backend != tok.Handle.Backend {
		return nil, fmt.Errorf("%w: sandbox tool %q is not configured", ErrNotFound, tool)
	}
	if !ent.acquire() {
		return nil, fmt.Errorf("%w: sandbox tool %q is being reconfigured", ErrUnavailable, tool)
	}
	start := time.Now()
	err := ent.Provider.KeepAlive(ctx, tok.Handle, DefaultReviveIdle+keepAliveMargin)
	s.m.observe(opKeepAlive, tool, start, err)
	if err != nil {
		_ = ent.release(context.WithoutCancel(ctx))
		if errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("%w: container gone", ErrNotFound)
		}
		return nil, fmt.Errorf("sandbox tool %q: %w: %w", tool, ErrUnavailable, err)
	}
	now := s.now()
	c := &Container{
		s:            s,
		id:           id,
		tok:          tok,
		ent:          ent,
		runMu:        make(chan struct{}, 1),
		users:        1,
		lastUse:      now,
		idle:         DefaultReviveIdle,
		backendUntil: now.Add(DefaultReviveIdle + keepAliveMargin),
	}
	key := sandboxKey(tok.Handle)
	s.mu.Lock()
	if other, ok := s.live[key]; ok && !other.deleting {
		// Opened concurrently: keep the first.
		other.users++
		other.lastUse = now
		s.mu.Unlock()
		_ = ent.release(context.WithoutCancel(ctx))
		return other, nil
	}
	if s.closed {
		s.mu.Unlock()
		_ = ent.release(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("%w: shutting down", ErrUnavailable)
	}
	s.live[key] = c
	s.mu.Unlock()
	s.m.live.Inc()
	s.log.Debug("container reopened", zap.String("tool", tool), zap.String("sandbox", tok.Handle.ID))
	return c, nil
}

// Release ends one holder's use of c (from Create or Open) and restarts its idle clock. With
// idle == 0 the sandbox is deleted now, once nobody else holds it; otherwise it lives until idle
// after its last use, and the backend is asked to keep it that long. ctx may already be cancelled:
// the work runs detached, under its own timeout. A nil c is ignored.
func (s *Sessions) Release(ctx context.Context, c *Container, idle time.Duration) {
	if c == nil {
		return
	}
	s.mu.Lock()
	if c.users > 0 {
		c.users--
	}
	c.idle = idle
	now := s.now()
	c.lastUse = now
	if c.deleting {
		s.mu.Unlock()
		return
	}
	if idle <= 0 {
		if c.users == 0 && c.busy == 0 {
			s.markDeletingLocked(c)
			s.mu.Unlock()
			s.deleteNow(ctx, c, "released")
			return
		}
		s.mu.Unlock()
		return
	}
	need := now.Add(idle)
	extend := need.After(c.backendUntil)
	s.mu.Unlock()
	if extend {
		s.keepAlive(ctx, c, idle+keepAliveMargin)
	}
}

// keepAlive asks the backend to keep c for d more; a sandbox found gone is dropped.
func (s *Sessions) keepAlive(ctx context.Context, c *Container, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.DeleteTimeout)
	defer cancel()
	start := time.Now()
	err := c.ent.Provider.KeepAlive(ctx, c.tok.Handle, d)
	s.m.observe(opKeepAlive, c.tok.Handle.Tool, start, err)
	if err == nil {
		s.mu.Lock()
		if until := s.now().Add(d); until.After(c.backendUntil) {
			c.backendUntil = until
		}
		s.mu.Unlock()
		return
	}
	if errors.Is(err, ErrNotFound) {
		s.dropGone(ctx, c)
		return
	}
	s.log.Warn("sandbox keepalive failed", zap.String("tool", c.tok.Handle.Tool),
		zap.String("sandbox", c.tok.Handle.ID), zap.Error(err))
}

// dropGone forgets a container whose sandbox the backend no longer has.
func (s *Sessions) dropGone(ctx context.Context, c *Container) {
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
func (s *Sessions) markDeletingLocked(c *Container) {
	c.deleting = true
	key := sandboxKey(c.tok.Handle)
	if s.live[key] == c {
		delete(s.live, key)
	}
	forget := s.now().Add(tombstoneLife)
	if c.tok.Expires.Before(forget) {
		forget = c.tok.Expires
	}
	s.gone[key] = forget
	s.deletes.Add(1)
}

// deleteNow is deleteSandbox for a container marked by markDeletingLocked, which counted it in
// s.deletes.
func (s *Sessions) deleteNow(ctx context.Context, c *Container, why string) {
	defer s.deletes.Done()
	s.deleteSandbox(ctx, c, why)
}

// deleteSandbox deletes c's sandbox detached from ctx's cancellation, under DeleteTimeout, and
// releases its provider. c must be marked deleting.
func (s *Sessions) deleteSandbox(ctx context.Context, c *Container, why string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.DeleteTimeout)
	defer cancel()
	h := c.tok.Handle
	start := time.Now()
	err := c.ent.Provider.Delete(ctx, h)
	s.m.observe(opDelete, h.Tool, start, err)
	s.m.live.Dec()
	c.slot.free()
	if err != nil {
		s.log.Warn("sandbox delete failed", zap.String("tool", h.Tool), zap.String("sandbox", h.ID),
			zap.String("why", why), zap.Error(err))
	} else {
		s.log.Debug("container deleted", zap.String("tool", h.Tool), zap.String("sandbox", h.ID),
			zap.String("why", why))
	}
	if err := c.ent.release(ctx); err != nil {
		s.log.Warn("closing retired sandbox tool", zap.String("tool", h.Tool), zap.Error(err))
	}
}

// Sweep deletes every container that is expired at Now (idle past its timeout with no holder, or
// past its hard end of life) and not running code, waits for those deletions, and returns how many
// it deleted. The reaper calls it; tests call it directly.
func (s *Sessions) Sweep(ctx context.Context) int {
	now := s.now()
	var doomed []*Container
	s.mu.Lock()
	for _, c := range s.live {
		if c.deleting || c.busy > 0 {
			continue
		}
		idleOut := c.users == 0 && !now.Before(c.lastUse.Add(c.idle))
		if idleOut || !now.Before(c.tok.Expires) {
			s.markDeletingLocked(c)
			doomed = append(doomed, c)
		}
	}
	for key, exp := range s.gone {
		if !now.Before(exp) {
			delete(s.gone, key) // the id itself has expired now
		}
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range doomed {
		wg.Go(func() { s.deleteNow(ctx, c, "expired") })
	}
	wg.Wait()
	return len(doomed)
}

// reap runs Sweep every interval until Close.
func (s *Sessions) reap(interval time.Duration) {
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
func (s *Sessions) Live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live)
}

// Close stops the reaper, deletes every sandbox this process holds (running or not) and waits for
// all deletions, including those already in flight, or for ctx. Create and Open fail afterwards.
func (s *Sessions) Close(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
	s.mu.Lock()
	s.closed = true
	var doomed []*Container
	for _, c := range s.live {
		if !c.deleting {
			s.markDeletingLocked(c)
			doomed = append(doomed, c)
		}
	}
	s.mu.Unlock()
	for _, c := range doomed {
		go s.deleteNow(ctx, c, "shutdown")
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

// ID returns the container's sealed "cntr_..." id. It does not change during the container's life.
func (c *Container) ID() string { return c.id }

// Tool returns the sandbox tool the container runs on.
func (c *Container) Tool() string { return c.tok.Handle.Tool }

// Expires returns the container's hard end of life (see Sessions).
func (c *Container) Expires() time.Time { return c.tok.Expires }

// Run executes code in the container's kernel: one run at a time per container (a second waits for
// the first, or for ctx), never reaped while running. Errors are the provider's (see Provider.Run);
// a container found gone is ErrNotFound and is forgotten.
func (c *Container) Run(ctx context.Context, code string, opts RunOptions) (Result, error) {
	s := c.s
	select {
	case c.runMu <- struct{}{}:
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
	defer func() { <-c.runMu }()

	s.mu.Lock()
	if c.deleting {
		s.mu.Unlock()
		return Result{}, fmt.Errorf("%w: container deleted", ErrNotFound)
	}
	c.busy++
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
	res, err := c.ent.Provider.Run(ctx, c.tok.Handle, code, opts)
	s.m.observe(opRun, c.tok.Handle.Tool, start, err)

	s.mu.Lock()
	c.busy--
	c.lastUse = s.now()
	s.mu.Unlock()
	if errors.Is(err, ErrNotFound) {
		s.dropGone(ctx, c)
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
func (s *Sessions) createDetached(ctx context.Context, ent *providerEntry, opts CreateOptions) (Handle, func(), error) {
	type result struct {
		h   Handle
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
		return Handle{}, func() {}, fmt.Errorf("%w: shutting down", ErrUnavailable)
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
		if err := ent.release(context.WithoutCancel(ctx)); err != nil {
			s.log.Warn("closing retired sandbox tool", zap.Error(err))
		}
	}()
	select {
	case r := <-out:
		return r.h, settle, r.err
	case <-ctx.Done():
		if state.CompareAndSwap(waiting, abandoned) {
			return Handle{}, func() {}, errAbandoned
		}
		r := <-out
		return r.h, settle, r.err
	}
}
