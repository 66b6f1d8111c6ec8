package containers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Shutdown deletes the sandboxes that die with the process and leaves those that outlive it,
// recorded, for the next process.
func TestSessionsClose(t *testing.T) {
	ctx := context.Background()
	t.Run("host-bound", func(t *testing.T) {
		f := newFixture(t)
		var ids []string
		for i := range 5 {
			c := f.create(t, "alice", time.Duration(i)*time.Minute)
			ids = append(ids, c.ID())
			if i%2 == 0 {
				f.s.Release(ctx, c)
			}
		}
		if err := f.s.Close(ctx); err != nil {
			t.Fatalf("Close() error = %v", err)
		}
		// The idle-0 container was deleted by its Release, the four others by Close.
		if live, creates, deletes, _ := f.p.stats(); live != 0 || creates != 5 || deletes != 5 {
			t.Errorf("after Close: provider live=%d creates=%d deletes=%d; want 0, 5, 5", live, creates, deletes)
		}
		for _, id := range ids {
			if rec := f.record(t, "alice", id); rec.Status != StatusExpired {
				t.Errorf("record %s status %q after Close; want expired", id, rec.Status)
			}
		}
		if _, err := f.s.Create(ctx, "py", "alice", sandbox.CreateOptions{}, time.Minute); !errors.Is(err, sandbox.ErrUnavailable) {
			t.Errorf("Create() after Close error = %v; want sandbox.ErrUnavailable", err)
		}
		if _, err := f.s.Open(ctx, ids[1], "alice"); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("Open() after Close error = %v; want sandbox.ErrNotFound", err)
		}
		if err := f.s.Close(ctx); err != nil {
			t.Errorf("second Close() error = %v", err)
		}
	})
	t.Run("outliving the process", func(t *testing.T) {
		f := newFixtureBound(t, false)
		kept := f.create(t, "alice", 20*time.Minute)
		held := f.create(t, "alice", 20*time.Minute) // a request still holds it at shutdown
		f.s.Release(ctx, kept)
		gone := f.create(t, "alice", 0)
		if err := f.s.Close(ctx); err != nil {
			t.Fatalf("Close() error = %v", err)
		}
		if live, _, deletes, _ := f.p.stats(); live != 2 || deletes != 1 {
			t.Errorf("after Close: provider live=%d deletes=%d; want the two with an idle timeout left, the idle-0 one deleted", live, deletes)
		}
		if rec := f.record(t, "alice", held.ID()); rec.Status != StatusRunning || !rec.ExpiresAt.Equal(f.clock.Now().Add(20*time.Minute)) {
			t.Errorf("record of the held container after Close = %+v; want running, expiring 20m after its last use", rec)
		}
		if rec := f.record(t, "alice", gone.ID()); rec.Status != StatusExpired {
			t.Errorf("record of the idle-0 container status %q; want expired", rec.Status)
		}
		if f.s.Live() != 0 || metricValue(t, f.s.m.live) != 0 {
			t.Errorf("Live() = %d, gauge %v after Close; want 0, 0", f.s.Live(), metricValue(t, f.s.m.live))
		}
	})
}

// Close waits for deletions that are already running, e.g. a Release(idle 0) on another goroutine.
func TestSessionsCloseWaitsForInflightDeletes(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.create(t, "alice", 0)
	f.p.deleteStart = make(chan struct{})
	released := make(chan struct{})
	go func() {
		f.s.Release(ctx, c)
		close(released)
	}()
	// Wait until the deletion is in flight (the container has left the live set).
	for deadline := time.Now().Add(5 * time.Second); f.s.Live() != 0; {
		if time.Now().After(deadline) {
			t.Fatal("Release(idle 0) never started deleting")
		}
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error)
	go func() { closed <- f.s.Close(ctx) }()
	select {
	case <-closed:
		t.Fatal("Close() returned while a deletion was still running")
	case <-time.After(20 * time.Millisecond):
	}
	close(f.p.deleteStart)
	if err := <-closed; err != nil {
		t.Fatalf("Close() error = %v", err)
	}
	<-released
	if live, _, _, _ := f.p.stats(); live != 0 {
		t.Errorf("provider live=%d; want 0", live)
	}
}
