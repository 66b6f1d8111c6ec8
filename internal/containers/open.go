package containers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

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
		s: s, id: rec.ID, owner: rec.Owner, name: rec.Name, memory: rec.MemoryLimit, network: rec.Network, h: h, ent: ent,
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
