package containers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Another Manager on the same store (another replica, same tools) opens an id it never created,
// after checking the sandbox is still there; an id of a deleted sandbox does not open.
func TestSessionsOpenOnAnotherReplica(t *testing.T) {
	f := newFixtureBound(t, false)
	ctx := context.Background()
	c := f.create(t, "alice", 20*time.Minute)
	f.s.Release(ctx, c)
	other := f.sessions(t, "replica-2", func() *sandbox.Registry { return f.reg })

	c2, err := other.Open(ctx, c.ID(), "alice")
	if err != nil {
		t.Fatalf("replica Open() error = %v", err)
	}
	if c2.ID() != c.ID() || c2 == c {
		t.Errorf("replica ID() = %q; want the same id, another process's container", c2.ID())
	}
	if res, err := c2.Run(ctx, "x", sandbox.RunOptions{}); err != nil || res.Stdout != "ran: x" {
		t.Errorf("replica Run() = %+v, %v", res, err)
	}
	if _, err := other.Open(ctx, c.ID(), "bob"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("replica Open(other owner) error = %v; want sandbox.ErrNotFound", err)
	}
	other.Release(ctx, c2)

	d := f.create(t, "alice", 0)
	f.s.Release(ctx, d) // deleted
	third := f.sessions(t, "replica-3", func() *sandbox.Registry { return f.reg })
	_, err = third.Open(ctx, d.ID(), "alice")
	wantExpired(t, "replica Open(deleted sandbox)", err)

	// A sandbox that vanished from the backend: the KeepAlive finds it gone, the container expires.
	e := f.create(t, "alice", 20*time.Minute)
	f.s.Release(ctx, e)
	f.p.mu.Lock()
	delete(f.p.live, e.h.ID)
	f.p.mu.Unlock()
	_, err = third.Open(ctx, e.ID(), "alice")
	wantExpired(t, "replica Open(vanished sandbox)", err)

	// A replica whose tool of that name is another backend does not reach for the sandbox.
	p2 := newRecProvider()
	reg2, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "py", Provider: p2, Backend: "other"})
	if err != nil {
		t.Fatal(err)
	}
	fourth := f.sessions(t, "replica-4", func() *sandbox.Registry { return reg2 })
	if _, err := fourth.Open(ctx, c.ID(), "alice"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Open() on a replica where the tool is another backend: error = %v; want sandbox.ErrNotFound", err)
	}
}

// A host-bound container in a shared store: another replica is told who hosts it.
func TestSessionsHostBoundOnAnotherReplica(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	one := f.sessions(t, "replica-1", func() *sandbox.Registry { return f.reg })
	c, err := one.Create(ctx, "py", "alice", sandbox.CreateOptions{}, 20*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	one.Release(ctx, c)
	two := f.sessions(t, "replica-2", func() *sandbox.Registry { return f.reg })
	_, err = two.Open(ctx, c.ID(), "alice")
	var elsewhere *ElsewhereError
	if !errors.As(err, &elsewhere) || elsewhere.Host != "replica-1" || !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("Open() on another replica error = %v; want ElsewhereError naming replica-1", err)
	}
	f.clock.Add(time.Hour)
	if n := two.Sweep(ctx); n != 0 {
		t.Errorf("another replica's Sweep() reaped %d of replica-1's sandboxes; want 0", n)
	}
	if n := one.Sweep(ctx); n != 1 {
		t.Errorf("the hosting replica's Sweep() = %d; want 1", n)
	}
}

// Restarts: a new Manager on the reopened store. Host-bound containers died with the process;
// the others open again by their id.
func TestSessionsRestart(t *testing.T) {
	ctx := context.Background()
	t.Run("host-bound", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 20*time.Minute)
		f.s.Release(ctx, c)
		// The process dies: no Close. Its sandbox dies with it.
		f.p.mu.Lock()
		delete(f.p.live, c.h.ID)
		f.p.mu.Unlock()
		dir := f.st.Dir()
		if err := f.st.Close(); err != nil {
			t.Fatal(err)
		}
		f.st = f.openStore(t, dir)
		s2 := f.sessions(t, "", func() *sandbox.Registry { return f.reg })
		if rec := f.record(t, "alice", c.ID()); rec.Status != StatusExpired || !rec.ExpiresAt.IsZero() {
			t.Errorf("record after the restart = %+v; want expired at start", rec)
		}
		_, err := s2.Open(ctx, c.ID(), "alice")
		wantExpired(t, "Open() after the restart", err)
		if info, err := s2.Get(ctx, "alice", c.ID()); err != nil || info.Status != StatusExpired {
			t.Errorf("Get() after the restart = %+v, %v; want expired", info, err)
		}
	})
	t.Run("outliving the process", func(t *testing.T) {
		f := newFixtureBound(t, false)
		c := f.create(t, "alice", 20*time.Minute)
		if err := f.s.Close(ctx); err != nil {
			t.Fatal(err)
		}
		dir := f.st.Dir()
		if err := f.st.Close(); err != nil {
			t.Fatal(err)
		}
		f.st = f.openStore(t, dir)
		f.clock.Add(5 * time.Minute)
		s2 := f.sessions(t, "", func() *sandbox.Registry { return f.reg })
		c2, err := s2.Open(ctx, c.ID(), "alice")
		if err != nil {
			t.Fatalf("Open() after the restart error = %v", err)
		}
		if ka := f.p.keepAliveCalls(); len(ka) != 1 {
			t.Errorf("KeepAlive calls %v; want one proving the sandbox lives", ka)
		}
		if res, err := c2.Run(ctx, "y", sandbox.RunOptions{}); err != nil || res.Stdout != "ran: y" {
			t.Errorf("Run() after the restart = %+v, %v", res, err)
		}
		s2.Release(ctx, c2)
		f.clock.Add(20 * time.Minute)
		if n := s2.Sweep(ctx); n != 1 {
			t.Errorf("Sweep() 20m after the last use = %d; want 1", n)
		}
		if live, _, deletes, _ := f.p.stats(); live != 0 || deletes != 1 {
			t.Errorf("provider live=%d deletes=%d; want the sandbox deleted by the new process", live, deletes)
		}
	})
	t.Run("expired while no process ran", func(t *testing.T) {
		f := newFixtureBound(t, false)
		c := f.create(t, "alice", 20*time.Minute)
		f.s.Release(ctx, c)
		if err := f.s.Close(ctx); err != nil {
			t.Fatal(err)
		}
		f.clock.Add(time.Hour)
		s2 := f.sessions(t, "", func() *sandbox.Registry { return f.reg })
		_, err := s2.Open(ctx, c.ID(), "alice")
		wantExpired(t, "Open() of a container that expired meanwhile", err)
		if n := s2.Sweep(ctx); n != 1 {
			t.Errorf("Sweep() = %d; want the expired sandbox deleted", n)
		}
		if live, _, _, _ := f.p.stats(); live != 0 {
			t.Errorf("provider live=%d; want 0", live)
		}
	})
}
