package containers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recProvider is a Provider that records calls, for testing the Manager' own bookkeeping (expiry,
// owners, reaping). Manager over real backends, and container files, are tested in
// internal/sandbox/backends.
type recProvider struct {
	mu          sync.Mutex
	seq         int
	live        map[string]bool
	creates     int
	deletes     int
	keepAlives  []time.Duration
	runs        int
	running     int
	maxRunning  int
	closes      int
	createErr   error
	lastCreate  sandbox.CreateOptions
	gate        chan struct{} // when non-nil, Run waits for it to be closed
	started     chan struct{} // when non-nil, Run sends on it once running
	deleteStart chan struct{} // when non-nil, Delete waits for it to be closed
	createGate  chan struct{} // when non-nil, Create waits for it to be closed, ignoring ctx (as e2b does)
}

func newRecProvider() *recProvider { return &recProvider{live: map[string]bool{}} }

func (p *recProvider) Create(_ context.Context, opts sandbox.CreateOptions) (sandbox.Handle, error) {
	if p.createGate != nil {
		<-p.createGate
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastCreate = opts
	if p.createErr != nil {
		return sandbox.Handle{}, p.createErr
	}
	p.seq++
	p.creates++
	id := fmt.Sprintf("sbx-%d", p.seq)
	p.live[id] = true
	return sandbox.Handle{Backend: "rec", ID: id, AccessToken: "tok-" + id}, nil
}

func (p *recProvider) Run(ctx context.Context, h sandbox.Handle, code string, _ sandbox.RunOptions) (sandbox.Result, error) {
	p.mu.Lock()
	if !p.live[h.ID] {
		p.mu.Unlock()
		return sandbox.Result{}, fmt.Errorf("%w: %s", sandbox.ErrNotFound, h.ID)
	}
	p.runs++
	p.running++
	p.maxRunning = max(p.maxRunning, p.running)
	gate, started := p.gate, p.started
	p.mu.Unlock()
	if started != nil {
		started <- struct{}{}
	}
	var err error
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	p.mu.Lock()
	p.running--
	p.mu.Unlock()
	return sandbox.Result{Stdout: "ran: " + code}, err
}

func (p *recProvider) Delete(_ context.Context, h sandbox.Handle) error {
	if p.deleteStart != nil {
		<-p.deleteStart
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live[h.ID] {
		p.deletes++
		delete(p.live, h.ID)
	}
	return nil
}

func (p *recProvider) KeepAlive(_ context.Context, h sandbox.Handle, d time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.live[h.ID] {
		return fmt.Errorf("%w: %s", sandbox.ErrNotFound, h.ID)
	}
	p.keepAlives = append(p.keepAlives, d)
	return nil
}

func (p *recProvider) Close(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closes++
	return nil
}

func (p *recProvider) stats() (live, creates, deletes, closes int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.live), p.creates, p.deletes, p.closes
}

func (p *recProvider) keepAliveCalls() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Duration(nil), p.keepAlives...)
}

// clock is an injected Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	p     *recProvider
	reg   *sandbox.Registry
	clock *clock
	st    *embedded.Store
	s     *Manager
	prom  *prometheus.Registry
}

// newFixture is Manager over a recProvider that dies with the process (host-bound, as local).
func newFixture(t *testing.T) *fixture { return newFixtureBound(t, true) }

// newFixtureBound is Manager over a recProvider whose sandboxes are host-bound or not (as e2b's).
func newFixtureBound(t *testing.T, hostBound bool) *fixture {
	t.Helper()
	p := newRecProvider()
	reg, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "py", Provider: p, Backend: "rec", HostBound: hostBound})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{p: p, reg: reg, clock: newClock(), prom: prometheus.NewRegistry()}
	f.st = f.openStore(t, t.TempDir())
	f.s = f.sessions(t, "", func() *sandbox.Registry { return f.reg })
	return f
}

func (f *fixture) openStore(t *testing.T, dir string) *embedded.Store {
	t.Helper()
	st, err := embedded.Open(embedded.Options{Dir: dir, Now: f.clock.Now, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// sessions returns another Manager on the same store and clock: another replica (host names it in
// a shared store), or this process after a restart.
func (f *fixture) sessions(t *testing.T, host string, reg func() *sandbox.Registry) *Manager {
	t.Helper()
	s, err := New(context.Background(), Options{Store: f.st, Host: host, Now: f.clock.Now, Registry: reg,
		Metrics: f.prom, SweepInterval: -1})
	if err != nil {
		t.Fatalf("New() error = %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("Close() error = %v", err)
		}
	})
	return s
}

func (f *fixture) create(t *testing.T, owner string, idle time.Duration) *Container {
	t.Helper()
	c, err := f.s.Create(context.Background(), "py", owner, sandbox.CreateOptions{}, idle)
	if err != nil {
		t.Fatalf("Create() error = %v", err)
	}
	return c
}

// record reads a container's store record, whatever its owner.
func (f *fixture) record(t *testing.T, owner, id string) store.Container {
	t.Helper()
	r, err := f.st.Container(context.Background(), owner, id)
	if err != nil {
		t.Fatalf("store Container(%s) error = %v", id, err)
	}
	return r
}

func wantExpired(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, sandbox.ErrNotFound) || !errors.Is(err, ErrExpired) {
		t.Errorf("%s: error = %v; want sandbox.ErrNotFound and ErrExpired", what, err)
	}
}

// A reload that removes a tool keeps its containers working; its provider is closed after the last.
func TestSessionsToolRetired(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.create(t, "alice", 0)
	p2 := newRecProvider()
	next, err := sandbox.NewRegistry(f.reg, sandbox.RegistryEntry{Name: "other", Provider: p2})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.reg.Retire(ctx, next); err != nil {
		t.Fatal(err)
	}
	old := f.reg
	f.reg = next
	if _, _, _, closes := f.p.stats(); closes != 0 {
		t.Fatalf("retired provider closed while a container uses it")
	}
	if _, err := c.Run(ctx, "still", sandbox.RunOptions{}); err != nil {
		t.Errorf("Run() on a retired tool's container error = %v", err)
	}
	if _, err := f.s.Create(ctx, "py", "alice", sandbox.CreateOptions{}, time.Minute); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("Create(removed tool) error = %v; want sandbox.ErrUnavailable", err)
	}
	if _, ok := old.Get("py"); !ok {
		t.Errorf("old registry lost its entry")
	}
	f.s.Release(ctx, c)
	if live, _, _, closes := f.p.stats(); live != 0 || closes != 1 {
		t.Errorf("after the last container: live=%d closes=%d; want 0, 1", live, closes)
	}
}

// Many requests at once on few containers, with the reaper sweeping: no race, no leak.
func TestSessionsConcurrent(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	shared := f.create(t, "alice", time.Minute)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			for j := range 20 {
				switch (i + j) % 5 {
				case 0:
					c, err := f.s.Create(ctx, "py", "alice", sandbox.CreateOptions{}, time.Duration(j%2)*time.Minute)
					if err != nil {
						t.Errorf("Create() error = %v", err)
						return
					}
					c.Run(ctx, "x", sandbox.RunOptions{})
					f.s.Release(ctx, c)
				case 1:
					c, err := f.s.Open(ctx, shared.ID(), "alice")
					if err != nil {
						t.Errorf("Open() error = %v", err)
						return
					}
					c.Run(ctx, "y", sandbox.RunOptions{})
					f.s.Release(ctx, c)
				case 2:
					f.clock.Add(10 * time.Second)
					f.s.Sweep(ctx)
				case 3:
					f.s.Open(ctx, shared.ID(), "bob")
				case 4:
					f.s.List(ctx, "alice", store.ContainerQuery{Page: store.Page{Limit: 5}})
				}
			}
		})
	}
	wg.Wait()
	if err := f.s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if live, creates, deletes, _ := f.p.stats(); live != 0 || creates != deletes {
		t.Errorf("after Close: live=%d creates=%d deletes=%d; want nothing left", live, creates, deletes)
	}
	if got := metricValue(t, f.s.m.live); got != 0 {
		t.Errorf("containers gauge = %v; want 0", got)
	}
}

// metricValue reads a gauge or counter.
func metricValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	}
	t.Fatalf("metric is neither a gauge nor a counter")
	return 0
}
