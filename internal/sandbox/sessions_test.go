package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recProvider is a Provider that records calls, for testing the Sessions' own bookkeeping (expiry,
// owners, reaping). Sessions over real backends are tested in internal/sandbox/backends.
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
	lastCreate  CreateOptions
	gate        chan struct{} // when non-nil, Run waits for it to be closed
	started     chan struct{} // when non-nil, Run sends on it once running
	deleteStart chan struct{} // when non-nil, Delete waits for it to be closed
	createGate  chan struct{} // when non-nil, Create waits for it to be closed, ignoring ctx (as e2b does)
}

func newRecProvider() *recProvider { return &recProvider{live: map[string]bool{}} }

func (p *recProvider) Create(_ context.Context, opts CreateOptions) (Handle, error) {
	if p.createGate != nil {
		<-p.createGate
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastCreate = opts
	if p.createErr != nil {
		return Handle{}, p.createErr
	}
	p.seq++
	p.creates++
	id := fmt.Sprintf("sbx-%d", p.seq)
	p.live[id] = true
	return Handle{Backend: "rec", ID: id, AccessToken: "tok-" + id}, nil
}

func (p *recProvider) Run(ctx context.Context, h Handle, code string, _ RunOptions) (Result, error) {
	p.mu.Lock()
	if !p.live[h.ID] {
		p.mu.Unlock()
		return Result{}, fmt.Errorf("%w: %s", ErrNotFound, h.ID)
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
	return Result{Stdout: "ran: " + code}, err
}

func (p *recProvider) Delete(_ context.Context, h Handle) error {
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

func (p *recProvider) KeepAlive(_ context.Context, h Handle, d time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.live[h.ID] {
		return fmt.Errorf("%w: %s", ErrNotFound, h.ID)
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
	reg   *Registry
	clock *clock
	s     *Sessions
	prom  *prometheus.Registry
}

var testKey = bytes.Repeat([]byte{42}, KeySize)

func newFixture(t *testing.T) *fixture {
	t.Helper()
	p := newRecProvider()
	reg, err := NewRegistry(nil, RegistryEntry{Name: "py", Provider: p, Backend: "rec"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{p: p, reg: reg, clock: newClock(), prom: prometheus.NewRegistry()}
	f.s = f.sessions(t, func() *Registry { return f.reg })
	return f
}

// sessions returns another Sessions on the same key and clock: another replica.
func (f *fixture) sessions(t *testing.T, reg func() *Registry) *Sessions {
	t.Helper()
	s := NewSessions(SessionOptions{Key: testKey, Now: f.clock.Now, Registry: reg,
		Metrics: f.prom, SweepInterval: -1})
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("Close() error = %v", err)
		}
	})
	return s
}

func (f *fixture) create(t *testing.T, owner string, idle time.Duration) *Container {
	t.Helper()
	c, err := f.s.Create(context.Background(), "py", owner, CreateOptions{}, idle)
	if err != nil {
		t.Fatalf("Create() error = %v", err)
	}
	return c
}

func TestSessionsCreateOpenRun(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.create(t, "alice", 20*time.Minute)
	if !strings.HasPrefix(c.ID(), "cntr_") || c.Tool() != "py" {
		t.Fatalf("ID() = %q, Tool() = %q; want cntr_..., py", c.ID(), c.Tool())
	}
	if got, want := f.p.lastCreate.Lifetime, 21*time.Minute; got != want {
		t.Errorf("Create asked the backend for lifetime %v; want idle + margin = %v", got, want)
	}
	if _, err := f.s.Create(ctx, "py", "alice", CreateOptions{}, 0); err != nil {
		t.Fatal(err)
	}
	if got, want := f.p.lastCreate.Lifetime, 6*time.Minute; got != want {
		t.Errorf("Create(idle 0) asked the backend for lifetime %v; want the minimum + margin = %v", got, want)
	}
	if _, err := f.s.Create(ctx, "py", "alice", CreateOptions{Lifetime: time.Hour}, 0); err != nil {
		t.Fatal(err)
	}
	if got := f.p.lastCreate.Lifetime; got != time.Hour {
		t.Errorf("Create(Lifetime 1h) asked the backend for %v; want the caller's 1h", got)
	}
	res, err := c.Run(ctx, "1+1", RunOptions{})
	if err != nil || res.Stdout != "ran: 1+1" {
		t.Fatalf("Run() = %+v, %v; want ran: 1+1", res, err)
	}
	id := c.ID()
	f.s.Release(ctx, c, 20*time.Minute)

	again, err := f.s.Open(ctx, id, "alice")
	if err != nil {
		t.Fatalf("Open(own id) error = %v", err)
	}
	if again != c || again.ID() != id {
		t.Errorf("Open(own id) gave another container (%q); want the same, id unchanged", again.ID())
	}
	f.s.Release(ctx, again, 20*time.Minute)

	// Change one character in the middle of the sealed part: the AEAD tag must reject it. (Changing
	// the last characters could hit base64's unused bits and leave the bytes as they were.)
	mid := len(id) / 2
	swap := byte('A')
	if id[mid] == swap {
		swap = 'B'
	}
	forged := id[:mid] + string(swap) + id[mid+1:]
	for _, tt := range []struct{ name, id, owner string }{
		{"another owner", id, "mallory"},
		{"anonymous caller", id, ""},
		{"forged id", forged, "alice"},
		{"not an id", "cntr_nope", "alice"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := f.s.Open(ctx, tt.id, tt.owner); !errors.Is(err, ErrNotFound) {
				t.Errorf("Open() error = %v; want ErrNotFound", err)
			}
		})
	}
	if live, creates, _, _ := f.p.stats(); live != 3 || creates != 3 {
		t.Errorf("provider live=%d creates=%d; want 3, 3", live, creates)
	}
	if got := metricValue(t, f.s.m.live); got != 3 {
		t.Errorf("containers gauge = %v; want 3", got)
	}
	f.p.mu.Lock()
	kas := len(f.p.keepAlives)
	f.p.mu.Unlock()
	if kas != 0 {
		t.Errorf("%d KeepAlive calls for a run well inside the backend lifetime; want 0", kas)
	}
}

func TestSessionsCreateFailures(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.s.Create(ctx, "nope", "a", CreateOptions{}, time.Minute); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Create(unknown tool) error = %v; want ErrUnavailable", err)
	}
	cause := errors.New("e2b: 401 invalid API key")
	f.p.createErr = cause
	_, err := f.s.Create(ctx, "py", "a", CreateOptions{}, time.Minute)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, cause) {
		t.Errorf("Create(backend fails) error = %v; want ErrUnavailable wrapping the cause", err)
	}
	if got := metricValue(t, f.s.m.failures.WithLabelValues("create", "py")); got != 1 {
		t.Errorf("create failures = %v; want 1", got)
	}
	// The failed create gave its provider reference back: retiring closes the provider at once.
	if err := f.reg.Retire(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, _, closes := f.p.stats(); closes != 1 {
		t.Errorf("provider closed %d times after retiring an unused tool; want 1", closes)
	}
}

func TestSessionsExpiry(t *testing.T) {
	ctx := context.Background()
	t.Run("idle past timeout is reaped and its id is dead", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 0)
		f.s.Release(ctx, c, 10*time.Minute)
		f.clock.Add(9 * time.Minute)
		if n := f.s.Sweep(ctx); n != 0 {
			t.Fatalf("Sweep() at 9m of 10m idle = %d; want 0", n)
		}
		f.clock.Add(time.Minute)
		if n := f.s.Sweep(ctx); n != 1 {
			t.Fatalf("Sweep() at 10m of 10m idle = %d; want 1", n)
		}
		if live, _, deletes, _ := f.p.stats(); live != 0 || deletes != 1 {
			t.Errorf("provider live=%d deletes=%d; want 0, 1", live, deletes)
		}
		if _, err := f.s.Open(ctx, c.ID(), "alice"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Open(reaped) error = %v; want ErrNotFound", err)
		}
		if _, err := c.Run(ctx, "x", RunOptions{}); !errors.Is(err, ErrNotFound) {
			t.Errorf("Run(reaped) error = %v; want ErrNotFound", err)
		}
		if got := metricValue(t, f.s.m.live); got != 0 {
			t.Errorf("containers gauge = %v; want 0", got)
		}
	})
	t.Run("use refreshes the idle clock", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 10*time.Minute)
		f.s.Release(ctx, c, 10*time.Minute)
		f.clock.Add(8 * time.Minute)
		c2, err := f.s.Open(ctx, c.ID(), "alice")
		if err != nil {
			t.Fatal(err)
		}
		f.s.Release(ctx, c2, 10*time.Minute)
		f.clock.Add(8 * time.Minute)
		if n := f.s.Sweep(ctx); n != 0 {
			t.Errorf("Sweep() 8m after the last use = %d; want 0", n)
		}
	})
	t.Run("a held container is not reaped for idleness", func(t *testing.T) {
		f := newFixture(t)
		f.create(t, "alice", time.Minute) // not released: a request still uses it
		f.clock.Add(time.Hour)
		if n := f.s.Sweep(ctx); n != 0 {
			t.Errorf("Sweep() of a held container = %d; want 0", n)
		}
	})
	t.Run("hard end of life", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 20*time.Minute)
		id := c.ID()
		if want := f.clock.Now().Add(DefaultMaxLife); !c.Expires().Equal(want) {
			t.Errorf("Expires() = %v; want %v", c.Expires(), want)
		}
		f.clock.Add(DefaultMaxLife)
		if _, err := f.s.Open(ctx, id, "alice"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Open(expired id) error = %v; want ErrNotFound", err)
		}
		if n := f.s.Sweep(ctx); n != 1 {
			t.Errorf("Sweep() past the hard end of life of a held container = %d; want 1", n)
		}
	})
	t.Run("idle 0 deletes at release", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 0)
		f.s.Release(ctx, c, 0)
		if live, _, deletes, _ := f.p.stats(); live != 0 || deletes != 1 {
			t.Errorf("after Release(idle 0): provider live=%d deletes=%d; want 0, 1", live, deletes)
		}
		if f.s.Live() != 0 {
			t.Errorf("Live() = %d; want 0", f.s.Live())
		}
	})
	t.Run("idle 0 waits for the last holder", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 0)
		c2, err := f.s.Open(ctx, c.ID(), "alice")
		if err != nil {
			t.Fatal(err)
		}
		f.s.Release(ctx, c, 0)
		if live, _, _, _ := f.p.stats(); live != 1 {
			t.Fatalf("deleted while another request holds it")
		}
		f.clock.Add(time.Hour)
		if n := f.s.Sweep(ctx); n != 0 {
			t.Fatalf("Sweep() of a held idle-0 container = %d; want 0", n)
		}
		f.s.Release(ctx, c2, 0)
		if live, _, _, _ := f.p.stats(); live != 0 {
			t.Errorf("provider live=%d after the last Release(idle 0); want 0", live)
		}
	})
	t.Run("a run that could outlast the backend lifetime extends it first", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", 0) // backend lifetime 6m
		f.clock.Add(4 * time.Minute)
		if _, err := c.Run(ctx, "x", RunOptions{Timeout: 2 * time.Minute}); err != nil {
			t.Fatal(err)
		}
		f.p.mu.Lock()
		ka := append([]time.Duration(nil), f.p.keepAlives...)
		f.p.mu.Unlock()
		if want := 2*time.Minute + keepAliveMargin; len(ka) != 1 || ka[0] != want {
			t.Errorf("KeepAlive calls = %v; want [%v]", ka, want)
		}
	})
	t.Run("release extends the backend's lifetime", func(t *testing.T) {
		f := newFixture(t)
		c := f.create(t, "alice", time.Minute)
		f.s.Release(ctx, c, time.Hour)
		f.p.mu.Lock()
		ka := append([]time.Duration(nil), f.p.keepAlives...)
		f.p.mu.Unlock()
		if len(ka) != 1 || ka[0] != time.Hour+keepAliveMargin {
			t.Errorf("KeepAlive calls = %v; want [%v]", ka, time.Hour+keepAliveMargin)
		}
	})
}

// A container that runs code is never reaped, however long it runs.
func TestSessionsRunDuringSweep(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.create(t, "alice", time.Minute)
	f.s.Release(ctx, c, time.Minute)
	f.p.gate = make(chan struct{})
	f.p.started = make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := c.Run(ctx, "long()", RunOptions{})
		done <- err
	}()
	<-f.p.started
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
			if _, err := c.Run(ctx, fmt.Sprint(i), RunOptions{}); err != nil {
				t.Errorf("Run() error = %v", err)
			}
		})
	}
	<-f.p.started
	// A run waiting for the container gives up with its context.
	short, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Run(short, "late", RunOptions{}); !errors.Is(err, context.Canceled) {
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
	delete(f.p.live, c.tok.Handle.ID) // the backend lost it
	f.p.mu.Unlock()
	if _, err := c.Run(ctx, "x", RunOptions{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Run() error = %v; want ErrNotFound", err)
	}
	if f.s.Live() != 0 {
		t.Errorf("Live() = %d after the sandbox was found gone; want 0", f.s.Live())
	}
	if _, err := f.s.Open(ctx, c.ID(), "alice"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open(gone) error = %v; want ErrNotFound", err)
	}
}

func TestSessionsClose(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var ids []string
	for i := range 5 {
		c := f.create(t, "alice", time.Duration(i)*time.Minute)
		ids = append(ids, c.ID())
		if i%2 == 0 {
			f.s.Release(ctx, c, 20*time.Minute)
		}
	}
	if err := f.s.Close(ctx); err != nil {
		t.Fatalf("Close() error = %v", err)
	}
	if live, creates, deletes, _ := f.p.stats(); live != 0 || creates != 5 || deletes != 5 {
		t.Errorf("after Close: provider live=%d creates=%d deletes=%d; want 0, 5, 5", live, creates, deletes)
	}
	if _, err := f.s.Create(ctx, "py", "alice", CreateOptions{}, time.Minute); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Create() after Close error = %v; want ErrUnavailable", err)
	}
	if _, err := f.s.Open(ctx, ids[1], "alice"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open() after Close error = %v; want ErrNotFound", err)
	}
	if err := f.s.Close(ctx); err != nil {
		t.Errorf("second Close() error = %v", err)
	}
}

// Close waits for deletions that are already running, e.g. a Release(idle 0) on another goroutine.
func TestSessionsCloseWaitsForInflightDeletes(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.create(t, "alice", 0)
	f.p.deleteStart = make(chan struct{})
	released := make(chan struct{})
	go func() {
		f.s.Release(ctx, c, 0)
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

// Another replica (same key, same tools) opens an id it never created, after checking the sandbox is
// still there; an id of a deleted sandbox does not open.
func TestSessionsOpenOnAnotherReplica(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.create(t, "alice", 20*time.Minute)
	f.s.Release(ctx, c, 20*time.Minute)
	other := f.sessions(t, func() *Registry { return f.reg })

	c2, err := other.Open(ctx, c.ID(), "alice")
	if err != nil {
		t.Fatalf("replica Open() error = %v", err)
	}
	if c2.ID() != c.ID() {
		t.Errorf("replica ID() = %q; want the same id", c2.ID())
	}
	if res, err := c2.Run(ctx, "x", RunOptions{}); err != nil || res.Stdout != "ran: x" {
		t.Errorf("replica Run() = %+v, %v", res, err)
	}
	if _, err := other.Open(ctx, c.ID(), "bob"); !errors.Is(err, ErrNotFound) {
		t.Errorf("replica Open(other owner) error = %v; want ErrNotFound", err)
	}
	other.Release(ctx, c2, 20*time.Minute)

	d := f.create(t, "alice", 0)
	f.s.Release(ctx, d, 0) // deleted
	third := f.sessions(t, func() *Registry { return f.reg })
	if _, err := third.Open(ctx, d.ID(), "alice"); !errors.Is(err, ErrNotFound) {
		t.Errorf("replica Open(deleted sandbox) error = %v; want ErrNotFound", err)
	}
	// A replica whose tool of that name is another backend does not reach for the sandbox.
	p2 := newRecProvider()
	reg2, err := NewRegistry(nil, RegistryEntry{Name: "py", Provider: p2, Backend: "other"})
	if err != nil {
		t.Fatal(err)
	}
	fourth := f.sessions(t, func() *Registry { return reg2 })
	if _, err := fourth.Open(ctx, c.ID(), "alice"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open() on a replica where the tool is another backend: error = %v; want ErrNotFound", err)
	}
}

// A reload that removes a tool keeps its containers working; its provider is closed after the last.
func TestSessionsToolRetired(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.create(t, "alice", 20*time.Minute)
	p2 := newRecProvider()
	next, err := NewRegistry(f.reg, RegistryEntry{Name: "other", Provider: p2})
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
	if _, err := c.Run(ctx, "still", RunOptions{}); err != nil {
		t.Errorf("Run() on a retired tool's container error = %v", err)
	}
	if _, err := f.s.Create(ctx, "py", "alice", CreateOptions{}, time.Minute); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Create(removed tool) error = %v; want ErrUnavailable", err)
	}
	if _, ok := old.Get("py"); !ok {
		t.Errorf("old registry lost its entry")
	}
	f.s.Release(ctx, c, 0)
	if live, _, _, closes := f.p.stats(); live != 0 || closes != 1 {
		t.Errorf("after the last container: live=%d closes=%d; want 0, 1", live, closes)
	}
}

func TestRegistry(t *testing.T) {
	ctx := context.Background()
	a, b := newRecProvider(), newRecProvider()
	r1, err := NewRegistry(nil, RegistryEntry{Name: "a", Provider: a}, RegistryEntry{Name: "b", Provider: b})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r1.Names(), ","); got != "a,b" {
		t.Errorf("Names() = %q; want a,b", got)
	}
	if p, ok := r1.Get("a"); !ok || p != a {
		t.Errorf("Get(a) = %v, %v", p, ok)
	}
	if _, ok := r1.Get("zzz"); ok {
		t.Errorf("Get(zzz) ok; want false")
	}
	if _, err := NewRegistry(nil, RegistryEntry{Name: "a", Provider: a}, RegistryEntry{Name: "a", Provider: b}); err == nil {
		t.Errorf("NewRegistry(duplicate names) error = nil")
	}
	// b is kept, a replaced: only a is closed.
	a2 := newRecProvider()
	r2, err := NewRegistry(r1, RegistryEntry{Name: "a", Provider: a2}, RegistryEntry{Name: "b", Provider: b})
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Retire(ctx, r2); err != nil {
		t.Fatal(err)
	}
	if _, _, _, c := a.stats(); c != 1 {
		t.Errorf("replaced provider closed %d times; want 1", c)
	}
	if _, _, _, c := b.stats(); c != 0 {
		t.Errorf("kept provider closed %d times; want 0", c)
	}
	if err := r2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]*recProvider{"a": a, "a2": a2, "b": b} {
		if _, _, _, c := p.stats(); c != 1 {
			t.Errorf("provider %s closed %d times; want exactly 1", name, c)
		}
	}
	var nilReg *Registry
	if _, ok := nilReg.Get("a"); ok || nilReg.Names() != nil || nilReg.Close(ctx) != nil {
		t.Errorf("nil registry is not empty")
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
				switch (i + j) % 4 {
				case 0:
					c, err := f.s.Create(ctx, "py", "alice", CreateOptions{}, time.Duration(j%2)*time.Minute)
					if err != nil {
						t.Errorf("Create() error = %v", err)
						return
					}
					c.Run(ctx, "x", RunOptions{})
					f.s.Release(ctx, c, time.Duration(j%2)*time.Minute)
				case 1:
					c, err := f.s.Open(ctx, shared.ID(), "alice")
					if err != nil {
						t.Errorf("Open() error = %v", err)
						return
					}
					c.Run(ctx, "y", RunOptions{})
					f.s.Release(ctx, c, time.Minute)
				case 2:
					f.clock.Add(10 * time.Second)
					f.s.Sweep(ctx)
				case 3:
					f.s.Open(ctx, shared.ID(), "bob")
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
	p := newRecProvider()
	reg, err := NewRegistry(nil, RegistryEntry{Name: "py", Provider: p})
	if err != nil {
		t.Fatal(err)
	}
	clk := newClock()
	s := NewSessions(SessionOptions{Now: clk.Now, Registry: func() *Registry { return reg },
		SweepInterval: time.Millisecond})
	defer s.Close(context.Background())
	ctx := context.Background()
	c, err := s.Create(ctx, "py", "", CreateOptions{}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s.Release(ctx, c, time.Minute)
	clk.Add(2 * time.Minute)
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
		_, err := f.s.Create(ctx, "py", "alice", CreateOptions{}, time.Minute)
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
		t.Errorf("Sessions.Live() = %d; want 0", got)
	}
}
