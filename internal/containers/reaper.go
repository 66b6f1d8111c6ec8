package containers

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

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

// Sweep deletes every container that is expired at Now (idle past its timeout with no holder, or
// past its hard end of life) and not running code, whichever process made it, waits for those
// deletions, and returns how many it claimed. It first renews the hold lease of the containers this
// process's requests hold, writes again the uses whose write failed, and restarts the kernels idle past their kernel idle timeout
// (restartIdleKernels). The reaper calls it; tests call it directly.
func (s *Manager) Sweep(ctx context.Context) int {
	now := s.now()
	var renew []*Container
	s.mu.Lock()
	for _, c := range s.live {
		held := (c.users > 0 || c.busy > 0) && c.expiresAt.Before(now.Add(holdLease/2)) && now.Before(c.hardEnd())
		if !c.deleting && (held || c.unsaved) {
			renew = append(renew, c)
		}
	}
	s.mu.Unlock()
	for _, c := range renew {
		if err := s.touch(ctx, c); err != nil && !errors.Is(err, ErrExpired) {
			s.log.Warn("renewing a held container's lease or recording its use", zap.String("container", c.id), zap.Error(err))
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
