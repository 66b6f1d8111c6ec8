package containers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

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
		s.mu.Lock()
		c.unsaved = true
		s.mu.Unlock()
		return fmt.Errorf("%w: recording the container's use: %w", sandbox.ErrUnavailable, err)
	}
	s.mu.Lock()
	c.expiresAt, c.unsaved = due, false
	now := s.now()
	extend := due.After(c.backendUntil)
	s.mu.Unlock()
	if extend {
		s.keepAlive(ctx, c, due.Sub(now)+keepAliveMargin)
	}
	return nil
}

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
		// Another replica extended it, perhaps by a hold lease it took and will never end (it
		// died holding the container). The record may vanish before that expiry (a store that
		// loses its keys, as a Redis restarted empty), and the sandbox with it (the orphan
		// sweep): so look again one idle timeout from now at the latest, not only then.
		s.mu.Lock()
		c.expiresAt = minTime(rec.ExpiresAt, s.now().Add(c.idle))
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

// forget drops c from this process without deleting its sandbox: another process expired or
// deleted its record and deletes the sandbox.
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

// Release is Manager.Release of c, for a holder that has the container and not its manager.
func (c *Container) Release(ctx context.Context) { c.s.Release(ctx, c) }

// Discard is Manager.Discard of c.
func (c *Container) Discard(ctx context.Context) { c.s.Discard(ctx, c) }

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
