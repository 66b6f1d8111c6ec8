package containers

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"
)

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
