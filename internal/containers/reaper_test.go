package containers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

func TestSessionsExpiry(t *testing.T) {
	ctx := context.Background()
	t.Run("idle past timeout is reaped and its id is expired", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 10*time.Minute)
		f.s.Release(ctx, c)
		f.clock.Add(9 * time.Minute)
		if n := f.s.Sweep(ctx); n != 0 {
			t.Fatalf("Sweep() at 9m of 10m idle = %d; want 0", n)
		}
		if info, err := f.s.Get(ctx, "alice", c.ID()); err != nil || info.Status != StatusRunning {
			t.Fatalf("Get() at 9m = %+v, %v; want running", info, err)
		}
		// Get was a use: the idle clock starts again.
		f.clock.Add(9 * time.Minute)
		if n := f.s.Sweep(ctx); n != 0 {
			t.Fatalf("Sweep() 9m after a Get = %d; want 0", n)
		}
		f.clock.Add(time.Minute)
		l, _ := f.s.List(ctx, "alice", store.ContainerQuery{})
		if len(l.Items) != 1 || l.Items[0].Status != StatusExpired {
			t.Errorf("List() at the idle timeout, before a sweep = %+v; want it expired", l.Items)
		}
		if n := f.s.Sweep(ctx); n != 1 {
			t.Fatalf("Sweep() at 10m of 10m idle = %d; want 1", n)
		}
		if live, _, deletes, _ := f.p.stats(); live != 0 || deletes != 1 {
			t.Errorf("provider live=%d deletes=%d; want 0, 1", live, deletes)
		}
		_, err := f.s.Open(ctx, c.ID(), "alice")
		wantExpired(t, "Open(reaped)", err)
		if _, err := c.Run(ctx, "x", sandbox.RunOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("Run(reaped) error = %v; want sandbox.ErrNotFound", err)
		}
		info, err := f.s.Get(ctx, "alice", c.ID())
		if err != nil || info.Status != StatusExpired {
			t.Errorf("Get(reaped) = %+v, %v; want it, expired", info, err)
		}
		if rec := f.record(t, "alice", c.ID()); !rec.ExpiresAt.IsZero() || !rec.ForgetAt.Equal(f.clock.Now().Add(DefaultRetention)) {
			t.Errorf("reaped record = %+v; want no expiry pending, forgotten after the retention", rec)
		}
		if got := metricValue(t, f.s.m.live); got != 0 {
			t.Errorf("containers gauge = %v; want 0", got)
		}
		f.clock.Add(DefaultRetention)
		if _, err := f.s.Get(ctx, "alice", c.ID()); !errors.Is(err, sandbox.ErrNotFound) || errors.Is(err, ErrExpired) {
			t.Errorf("Get() past the retention: error = %v; want ErrNotFound: forgotten", err)
		}
	})
	t.Run("use refreshes the idle clock", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 10*time.Minute)
		f.s.Release(ctx, c)
		f.clock.Add(8 * time.Minute)
		c2, err := f.s.Open(ctx, c.ID(), "alice")
		if err != nil {
			t.Fatal(err)
		}
		if rec := f.record(t, "alice", c.ID()); !rec.LastActiveAt.Equal(f.clock.Now()) {
			t.Errorf("Open() left last_active_at at %v; want now", rec.LastActiveAt)
		}
		f.s.Release(ctx, c2)
		f.clock.Add(8 * time.Minute)
		if n := f.s.Sweep(ctx); n != 0 {
			t.Errorf("Sweep() 8m after the last use = %d; want 0", n)
		}
	})
	t.Run("a held container is not reaped for idleness", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", time.Minute) // not released: a request still uses it
		for range 6 {
			f.clock.Add(10 * time.Minute)
			if n := f.s.Sweep(ctx); n != 0 {
				t.Fatalf("Sweep() of a held container = %d; want 0", n)
			}
		}
		if rec := f.record(t, "alice", c.ID()); !rec.ExpiresAt.After(f.clock.Now()) {
			t.Errorf("a held container's record expires at %v, not after now: another replica would reap it", rec.ExpiresAt)
		}
		f.s.Release(ctx, c)
		f.clock.Add(time.Minute)
		if n := f.s.Sweep(ctx); n != 1 {
			t.Errorf("Sweep() a minute after the release = %d; want 1", n)
		}
	})
	t.Run("hard end of life", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 20*time.Minute)
		id := c.ID()
		if want := f.clock.Now().Add(DefaultMaxLife); !c.Expires().Equal(want) {
			t.Errorf("Expires() = %v; want %v", c.Expires(), want)
		}
		for range 24 * 4 {
			f.clock.Add(15 * time.Minute)
			f.s.Sweep(ctx)
		}
		_, err := f.s.Open(ctx, id, "alice")
		wantExpired(t, "Open(past its end of life)", err)
		if live, _, _, _ := f.p.stats(); live != 0 {
			t.Errorf("a held container past its end of life is still live; want it deleted")
		}
	})
	t.Run("idle 0 deletes at release", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 0)
		f.s.Release(ctx, c)
		if live, _, deletes, _ := f.p.stats(); live != 0 || deletes != 1 {
			t.Errorf("after Release(idle 0): provider live=%d deletes=%d; want 0, 1", live, deletes)
		}
		if f.s.Live() != 0 {
			t.Errorf("Live() = %d; want 0", f.s.Live())
		}
		if rec := f.record(t, "alice", c.ID()); rec.Status != StatusExpired {
			t.Errorf("record status %q after the delete; want expired", rec.Status)
		}
	})
	t.Run("idle 0 waits for the last holder", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 0)
		c2, err := f.s.Open(ctx, c.ID(), "alice")
		if err != nil {
			t.Fatal(err)
		}
		f.s.Release(ctx, c)
		if live, _, _, _ := f.p.stats(); live != 1 {
			t.Fatalf("deleted while another request holds it")
		}
		f.clock.Add(time.Hour)
		if n := f.s.Sweep(ctx); n != 0 {
			t.Fatalf("Sweep() of a held idle-0 container = %d; want 0", n)
		}
		f.s.Release(ctx, c2)
		if live, _, _, _ := f.p.stats(); live != 0 {
			t.Errorf("provider live=%d after the last Release(idle 0); want 0", live)
		}
	})
	t.Run("discard deletes whatever the idle timeout", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 20*time.Minute)
		f.s.Discard(ctx, c)
		if live, _, deletes, _ := f.p.stats(); live != 0 || deletes != 1 {
			t.Errorf("after Discard: provider live=%d deletes=%d; want 0, 1", live, deletes)
		}
	})
	t.Run("a run that could outlast the backend lifetime extends it first", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 0) // backend lifetime 11m
		f.clock.Add(9 * time.Minute)
		if _, err := c.Run(ctx, "x", sandbox.RunOptions{Timeout: 2 * time.Minute}); err != nil {
			t.Fatal(err)
		}
		if ka, want := f.p.keepAliveCalls(), 2*time.Minute+keepAliveMargin; len(ka) == 0 || ka[0] != want {
			t.Errorf("KeepAlive calls = %v; want %v first", ka, want)
		}
	})
	t.Run("use extends the backend's lifetime", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 20*time.Minute) // backend lifetime 21m
		f.clock.Add(10 * time.Minute)
		f.s.Release(ctx, c)
		if ka := f.p.keepAliveCalls(); len(ka) != 1 || ka[0] != 20*time.Minute+keepAliveMargin {
			t.Errorf("KeepAlive calls = %v; want [%v]", ka, 20*time.Minute+keepAliveMargin)
		}
	})
}

// A container that runs code is never reaped, however long it runs.
func TestSessionsRunDuringSweep(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.create(t, "alice", time.Minute)
	f.p.gate = make(chan struct{})
	f.p.started = make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := c.Run(ctx, "long()", sandbox.RunOptions{})
		done <- err
	}()
	<-f.p.started
	f.s.Release(ctx, c) // the request lets go while its code runs
	f.clock.Add(time.Hour)
	if n := f.s.Sweep(ctx); n != 0 {
		t.Fatalf("Sweep() during a run = %d; want 0", n)
	}
	close(f.p.gate)
	if err := <-done; err != nil {
		t.Fatalf("Run() error = %v", err)
	}
	if n := f.s.Sweep(ctx); n != 0 {
		t.Fatalf("Sweep() right after the run = %d; want 0 (the run was a use)", n)
	}
	f.clock.Add(time.Minute)
	if n := f.s.Sweep(ctx); n != 1 {
		t.Fatalf("Sweep() a minute after the run = %d; want 1", n)
	}
}

// Two replicas sweep the same expired containers at once: each sandbox is deleted exactly once.
func TestSessionsSweepClaims(t *testing.T) {
	f := newFixtureBound(t, false)
	ctx := context.Background()
	for range 20 {
		f.s.Release(ctx, f.create(t, "alice", time.Minute))
	}
	if err := f.s.Close(ctx); err != nil { // this process is gone; its sandboxes are not
		t.Fatal(err)
	}
	f.clock.Add(2 * time.Minute)
	a := f.sessions(t, "a", func() *sandbox.Registry { return f.reg })
	b := f.sessions(t, "b", func() *sandbox.Registry { return f.reg })
	var wg sync.WaitGroup
	var na, nb int
	wg.Go(func() { na = a.Sweep(ctx) })
	wg.Go(func() { nb = b.Sweep(ctx) })
	wg.Wait()
	if na+nb != 20 {
		t.Errorf("the two sweeps claimed %d + %d; want 20 together", na, nb)
	}
	if live, _, deletes, _ := f.p.stats(); live != 0 || deletes != 20 {
		t.Errorf("provider live=%d deletes=%d; want 0, exactly 20", live, deletes)
	}
}

// The reaper goroutine sweeps by itself and stops at Close.
func TestSessionsReaperGoroutine(t *testing.T) {
	f := newFixture(t)
	s, err := New(context.Background(), Options{Store: f.st, Now: f.clock.Now,
		Registry: func() *sandbox.Registry { return f.reg }, SweepInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	ctx := context.Background()
	c, err := s.Create(ctx, "py", "", sandbox.CreateOptions{}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s.Release(ctx, c)
	f.clock.Add(2 * time.Minute)
	for deadline := time.Now().Add(5 * time.Second); s.Live() != 0; {
		if time.Now().After(deadline) {
			t.Fatal("the reaper never deleted the idle container")
		}
		time.Sleep(time.Millisecond)
	}
}

// restartingProvider is a recProvider that restarts kernels (a KernelRestarter, as local).
type restartingProvider struct {
	*recProvider
	restarts map[string]int // by sandbox id
}

func (p *restartingProvider) RestartKernel(_ context.Context, h sandbox.Handle) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.live[h.ID] {
		return fmt.Errorf("%w: %s", sandbox.ErrNotFound, h.ID)
	}
	p.restarts[h.ID]++
	return nil
}

func (p *restartingProvider) restartsOf(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts[id]
}

// TestSessionsRestartIdleKernels: the sweep restarts the kernel of a container nobody has used for
// its kernel idle timeout, once, never one that a request holds; the next execution reports it.
func TestSessionsRestartIdleKernels(t *testing.T) {
	f := newFixture(t)
	p := &restartingProvider{recProvider: f.p, restarts: map[string]int{}}
	reg, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "py", Provider: p, Backend: "rec", HostBound: true})
	if err != nil {
		t.Fatal(err)
	}
	f.reg = reg
	ctx := context.Background()
	c, err := f.s.Create(ctx, "py", "alice", sandbox.CreateOptions{KernelIdle: 5 * time.Minute}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id, sbx := c.ID(), c.h.ID
	never := f.create(t, "alice", time.Hour) // no kernel idle timeout
	f.s.Release(ctx, never)

	f.clock.Add(10 * time.Minute) // idle for long, but held by its request
	f.s.Sweep(ctx)
	if n := p.restartsOf(sbx); n != 0 {
		t.Fatalf("a held container's kernel was restarted %d times", n)
	}
	f.s.Release(ctx, c)
	for _, step := range []struct {
		after time.Duration
		want  int
	}{
		{4 * time.Minute, 0},  // not idle long enough
		{time.Minute, 1},      // 5 minutes since its last use
		{10 * time.Minute, 1}, // a fresh kernel is not restarted again
	} {
		f.clock.Add(step.after)
		if n := f.s.Sweep(ctx); n != 0 {
			t.Fatalf("the sweep expired %d containers", n)
		}
		if n := p.restartsOf(sbx); n != step.want {
			t.Fatalf("after %s more: %d restarts; want %d", step.after, n, step.want)
		}
	}
	if n := p.restartsOf(never.h.ID); n != 0 {
		t.Errorf("a container without a kernel idle timeout was restarted %d times", n)
	}
	c, err = f.s.Open(ctx, id, "alice")
	if err != nil {
		t.Fatal(err)
	}
	defer f.s.Release(ctx, c)
	for i, want := range []bool{true, false} {
		res, err := c.Run(ctx, "x", sandbox.RunOptions{})
		if err != nil || res.KernelRestarted != want {
			t.Errorf("run %d: KernelRestarted = %v, %v; want %v", i+1, res.KernelRestarted, err, want)
		}
	}
}
