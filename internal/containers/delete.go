package containers

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

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
