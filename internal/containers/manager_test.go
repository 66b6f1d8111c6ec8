package containers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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

func TestSessionsCreateOpenRun(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c, err := f.s.Create(ctx, "py", "alice", sandbox.CreateOptions{Name: "analysis", MemoryLimit: "4g"}, 20*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !store.ContainerKind.Valid(c.ID()) || len(c.ID()) != len("cntr_")+48 || c.Tool() != "py" {
		t.Fatalf("ID() = %q, Tool() = %q; want cntr_ and 48 hex digits, py", c.ID(), c.Tool())
	}
	if got, want := f.p.lastCreate.Lifetime, 21*time.Minute; got != want {
		t.Errorf("Create asked the backend for lifetime %v; want idle + margin = %v", got, want)
	}
	if got := f.p.lastCreate.Metadata[MetadataContainerID]; got != c.ID() {
		t.Errorf("sandbox metadata %s = %q; want the container id %q", MetadataContainerID, got, c.ID())
	}
	rec := f.record(t, "alice", c.ID())
	var h sandbox.Handle
	if err := json.Unmarshal(rec.Handle, &h); err != nil || h.ID != "sbx-1" || h.AccessToken != "tok-sbx-1" {
		t.Errorf("record handle = %s, %v; want the sandbox's handle with its token", rec.Handle, err)
	}
	now := f.clock.Now()
	if rec.Owner != "alice" || rec.Name != "analysis" || rec.Tool != "py" || rec.Backend != "rec" || rec.MemoryLimit != "4g" ||
		rec.Status != StatusRunning || rec.IdleTimeout != 20*time.Minute || !rec.CreatedAt.Equal(now) ||
		!rec.LastActiveAt.Equal(now) || !rec.ExpiresAt.Equal(now.Add(20*time.Minute)) || rec.Host == "" {
		t.Errorf("record = %+v; want alice's running analysis container, expiring after 20m of idle, on this host", rec)
	}
	if _, err := f.s.Create(ctx, "py", "alice", sandbox.CreateOptions{}, 0); err != nil {
		t.Fatal(err)
	}
	if got, want := f.p.lastCreate.Lifetime, holdLease+keepAliveMargin; got != want {
		t.Errorf("Create(idle 0) asked the backend for lifetime %v; want the hold lease + margin = %v", got, want)
	}
	if _, err := f.s.Create(ctx, "py", "alice", sandbox.CreateOptions{Lifetime: time.Hour}, 0); err != nil {
		t.Fatal(err)
	}
	if got := f.p.lastCreate.Lifetime; got != time.Hour {
		t.Errorf("Create(Lifetime 1h) asked the backend for %v; want the caller's 1h", got)
	}
	res, err := c.Run(ctx, "1+1", sandbox.RunOptions{})
	if err != nil || res.Stdout != "ran: 1+1" {
		t.Fatalf("Run() = %+v, %v; want ran: 1+1", res, err)
	}
	id := c.ID()
	f.s.Release(ctx, c)

	again, err := f.s.Open(ctx, id, "alice")
	if err != nil {
		t.Fatalf("Open(own id) error = %v", err)
	}
	if again != c || again.ID() != id {
		t.Errorf("Open(own id) gave another container (%q); want the same, id unchanged", again.ID())
	}
	f.s.Release(ctx, again)

	swap := byte('a')
	if id[20] == swap {
		swap = 'b'
	}
	forged := id[:20] + string(swap) + id[21:]
	for _, tt := range []struct{ name, id, owner string }{
		{"another owner", id, "mallory"},
		{"anonymous caller", id, ""},
		{"forged id", forged, "alice"},
		{"not an id", "cntr_nope", "alice"},
		{"a file id", "file-0VSvpifh7cRTnHr5V04fFU", "alice"},
		{"an old sealed id", "cntr_" + strings.Repeat("Ab-_", 56), "alice"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := f.s.Open(ctx, tt.id, tt.owner); !errors.Is(err, sandbox.ErrNotFound) || errors.Is(err, ErrExpired) {
				t.Errorf("Open() error = %v; want sandbox.ErrNotFound (not ErrExpired)", err)
			}
		})
	}
	if live, creates, _, _ := f.p.stats(); live != 3 || creates != 3 {
		t.Errorf("provider live=%d creates=%d; want 3, 3", live, creates)
	}
	if got := metricValue(t, f.s.m.live); got != 3 {
		t.Errorf("containers gauge = %v; want 3", got)
	}
	if kas := f.p.keepAliveCalls(); len(kas) != 0 {
		t.Errorf("KeepAlive calls %v for uses well inside the backend lifetime; want none", kas)
	}
}

// failingStore is a store whose container writes fail, as a shared store out of reach does.
type failingStore struct {
	store.Store
	fail bool
}

func (s *failingStore) CreateContainer(ctx context.Context, c store.Container) (store.Container, error) {
	if s.fail {
		return store.Container{}, fmt.Errorf("%w: connection refused", store.ErrUnavailable)
	}
	return s.Store.CreateContainer(ctx, c)
}

func TestSessionsCreateFailures(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.s.Create(ctx, "nope", "a", sandbox.CreateOptions{}, time.Minute); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("Create(unknown tool) error = %v; want sandbox.ErrUnavailable", err)
	}
	cause := errors.New("e2b: 401 invalid API key")
	f.p.createErr = cause
	_, err := f.s.Create(ctx, "py", "a", sandbox.CreateOptions{}, time.Minute)
	if !errors.Is(err, sandbox.ErrUnavailable) || !errors.Is(err, cause) {
		t.Errorf("Create(backend fails) error = %v; want sandbox.ErrUnavailable wrapping the cause", err)
	}
	if got := metricValue(t, f.s.m.failures.WithLabelValues("create", "py")); got != 1 {
		t.Errorf("create failures = %v; want 1", got)
	}
	f.p.createErr = nil

	// A sandbox whose record cannot be written is deleted: nobody could ever reach it.
	fs := &failingStore{Store: f.st, fail: true}
	s2, err := New(ctx, Options{Store: fs, Now: f.clock.Now, Registry: func() *sandbox.Registry { return f.reg }, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Create(ctx, "py", "a", sandbox.CreateOptions{}, time.Minute); !errors.Is(err, sandbox.ErrUnavailable) || !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Create(store fails) error = %v; want sandbox.ErrUnavailable wrapping the store's", err)
	}
	if live, creates, deletes, _ := f.p.stats(); live != 0 || creates != 1 || deletes != 1 {
		t.Errorf("after a failed record: provider live=%d creates=%d deletes=%d; want 0, 1, 1", live, creates, deletes)
	}
	if err := s2.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// The failed creates gave their provider reference back: retiring closes the provider at once.
	if err := f.reg.Retire(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, _, closes := f.p.stats(); closes != 1 {
		t.Errorf("provider closed %d times after retiring an unused tool; want 1", closes)
	}
	if _, err := New(ctx, Options{}); err == nil {
		t.Errorf("New without a store: no error")
	}
}

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

func TestContainerRunSerialized(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.create(t, "alice", time.Minute)
	f.p.gate = make(chan struct{})
	f.p.started = make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			if _, err := c.Run(ctx, fmt.Sprint(i), sandbox.RunOptions{}); err != nil {
				t.Errorf("Run() error = %v", err)
			}
		})
	}
	<-f.p.started
	// A run waiting for the container gives up with its context.
	short, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Run(short, "late", sandbox.RunOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Run(cancelled while another runs) error = %v; want context.Canceled", err)
	}
	close(f.p.gate)
	wg.Wait()
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	if f.p.runs != 4 || f.p.maxRunning != 1 {
		t.Errorf("runs=%d maxRunning=%d; want 4 runs, one at a time", f.p.runs, f.p.maxRunning)
	}
}

func TestContainerRunGone(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.create(t, "alice", time.Minute)
	f.p.mu.Lock()
	delete(f.p.live, c.h.ID) // the backend lost it
	f.p.mu.Unlock()
	if _, err := c.Run(ctx, "x", sandbox.RunOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Run() error = %v; want sandbox.ErrNotFound", err)
	}
	if f.s.Live() != 0 {
		t.Errorf("Live() = %d after the sandbox was found gone; want 0", f.s.Live())
	}
	_, err := f.s.Open(ctx, c.ID(), "alice")
	wantExpired(t, "Open(gone)", err)
}

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

func TestSessionsAPI(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var ids []string
	for i := range 3 {
		c, err := f.s.Create(ctx, "py", "alice", sandbox.CreateOptions{Name: fmt.Sprint("c", i)}, 20*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		f.s.Release(ctx, c)
		ids = append(ids, c.ID())
		f.clock.Add(time.Second)
	}
	l, err := f.s.List(ctx, "alice", store.ContainerQuery{Page: store.Page{Limit: 2}})
	if err != nil || len(l.Items) != 2 || !l.HasMore || l.Items[0].ID != ids[2] || l.Items[1].Name != "c1" {
		t.Errorf("List(limit 2) = %+v, %v; want the two newest, more to come", l, err)
	}
	if l, _ := f.s.List(ctx, "bob", store.ContainerQuery{}); len(l.Items) != 0 {
		t.Errorf("List(bob) = %+v; want none of alice's", l.Items)
	}
	if _, err := f.s.Get(ctx, "bob", ids[0]); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Get(bob, alice's) error = %v; want sandbox.ErrNotFound", err)
	}
	if err := f.s.Delete(ctx, "bob", ids[0]); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Delete(bob, alice's) error = %v; want sandbox.ErrNotFound", err)
	}
	if err := f.s.Delete(ctx, "alice", ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Get(ctx, "alice", ids[0]); !errors.Is(err, sandbox.ErrNotFound) || errors.Is(err, ErrExpired) {
		t.Errorf("Get(deleted) error = %v; want sandbox.ErrNotFound", err)
	}
	if live, _, deletes, _ := f.p.stats(); live != 2 || deletes != 1 {
		t.Errorf("provider live=%d deletes=%d; want the deleted container's sandbox gone", live, deletes)
	}
	// A container held by a request, deleted by its owner: the request's next run finds it gone.
	held, err := f.s.Open(ctx, ids[1], "alice")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.s.Delete(ctx, "alice", ids[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := held.Run(ctx, "x", sandbox.RunOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Run() on a deleted container error = %v; want sandbox.ErrNotFound", err)
	}
	f.s.Release(ctx, held)
	// An expired container can be deleted too.
	f.clock.Add(time.Hour)
	f.s.Sweep(ctx)
	if err := f.s.Delete(ctx, "alice", ids[2]); err != nil {
		t.Errorf("Delete(expired) error = %v", err)
	}
	if live, _, _, _ := f.p.stats(); live != 0 {
		t.Errorf("provider live=%d; want 0", live)
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

// TestCreateAbandonedByCaller: a caller that leaves while the backend is still creating gets its
// context's error at once, and the sandbox the backend finishes creating is deleted, not lost.
func TestCreateAbandonedByCaller(t *testing.T) {
	f := newFixture(t)
	f.p.createGate = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := f.s.Create(ctx, "py", "alice", sandbox.CreateOptions{}, time.Minute)
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Create() after the caller left: error = %v; want context.Canceled", err)
	}
	close(f.p.createGate) // the backend finishes the create it was asked for
	if err := f.s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if live, creates, deletes, _ := f.p.stats(); creates != 1 || deletes != 1 || live != 0 {
		t.Errorf("provider live=%d creates=%d deletes=%d; want 0, 1, 1", live, creates, deletes)
	}
	if got := f.s.Live(); got != 0 {
		t.Errorf("Manager.Live() = %d; want 0", got)
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
