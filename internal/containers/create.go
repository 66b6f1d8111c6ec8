package containers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

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
	network, err := sandbox.NetworkPolicy(ent.Provider, tool, ent.Backend, opts.NetworkPolicy)
	if err != nil {
		return nil, err
	}
	opts.Network = network
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
	opts.Metadata[sandbox.MetadataContainerID] = id
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
		s: s, id: id, owner: owner, name: opts.Name, memory: opts.MemoryLimit, network: shownNetwork(opts), h: h, ent: ent,
		hostBound: ent.HostBound, created: now, runMu: make(chan struct{}, 1), slot: slot,
		users: 1, idle: idle, lastUse: now, backendUntil: now.Add(opts.Lifetime), kernelIdle: opts.KernelIdle,
		baseline: map[string]fileStamp{}, // a new sandbox's /mnt/data is empty
	}
	c.expiresAt = c.dueLocked(now)
	rec := store.Container{
		ID: id, Owner: owner, Name: opts.Name, Backend: h.Backend, Tool: tool, Handle: encodeHandle(h),
		MemoryLimit: opts.MemoryLimit, Network: shownNetwork(opts), Status: StatusRunning, IdleTimeout: idle,
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

// CheckNetwork returns the policy tool gives a new container for the network policy asked (nil:
// none), as Create would decide, without creating anything: a *sandbox.NetworkError says why it
// cannot. The policy holds secrets: it is for telling the model what it can reach, no more.
func (s *Manager) CheckNetwork(ctx context.Context, tool string, asked *egress.Policy) (egress.Policy, error) {
	ent, ok := s.registry(ctx).Tool(tool)
	if !ok {
		return egress.Policy{}, fmt.Errorf("%w: sandbox tool %q is not configured", sandbox.ErrUnavailable, tool)
	}
	return sandbox.NetworkPolicy(ent.Provider, tool, ent.Backend, asked)
}

// shownNetwork is what the Containers API shows of a new container's policy: the domains it
// got, or "disabled" when its request asked for that; nil when nothing was asked and the tool
// gave nothing.
func shownNetwork(opts sandbox.CreateOptions) *store.NetworkPolicy {
	switch {
	case opts.Network.Open():
		return &store.NetworkPolicy{Type: "allowlist", AllowedDomains: opts.Network.Domains}
	case opts.NetworkPolicy != nil:
		return &store.NetworkPolicy{Type: "disabled"}
	}
	return nil
}
