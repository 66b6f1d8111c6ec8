package containers

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/redisstore"
	"github.com/ciproxy/ciproxy/internal/testutil/redisserver"
)

// sharedReplicas is one real Redis, a clock, and two registries: shared (an e2b-like backend, the
// recording provider p) and onHost (a host-bound one). replica makes a Manager on its own
// client of that Redis, named host, closed at the end of the test.
func sharedReplicas(t *testing.T) (srv *redisserver.Server, clk *clock, p *recProvider, shared, onHost *sandbox.Registry, replica func(host string, reg *sandbox.Registry) *Manager) {
	t.Helper()
	ctx := context.Background()
	srv = redisserver.Start(t)
	clk = newClock()
	p = newRecProvider()
	var err error
	if shared, err = sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "cloud", Provider: p, Backend: "rec"}); err != nil {
		t.Fatal(err)
	}
	if onHost, err = sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "cloud", Provider: newRecProvider(), Backend: "rec", HostBound: true}); err != nil {
		t.Fatal(err)
	}
	replica = func(host string, reg *sandbox.Registry) *Manager {
		t.Helper()
		st, err := redisstore.Open(ctx, redisstore.Options{URL: srv.URL(), Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(ctx, Options{Store: st, Host: host, Now: clk.Now, SweepInterval: -1,
			Registry: func() *sandbox.Registry { return reg }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = s.Close(ctx)
			_ = st.Close()
		})
		return s
	}
	return srv, clk, p, shared, onHost, replica
}

// Three replicas, each with its own client of one real Redis (the shared store): a container made
// on one is opened and run on another, reaped exactly once, and a host-bound one is reported as
// hosted elsewhere.
func TestSessionsOnASharedStore(t *testing.T) {
	_, clk, p, shared, onHost, replica := sharedReplicas(t)
	ctx := context.Background()
	a, b, c := replica("a", shared), replica("b", shared), replica("c", shared)

	made, err := a.Create(ctx, "cloud", "alice", sandbox.CreateOptions{Name: "shared"}, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	a.Release(ctx, made)
	other, err := b.Open(ctx, made.ID(), "alice")
	if err != nil {
		t.Fatalf("Open() on another replica error = %v", err)
	}
	if res, err := other.Run(ctx, "x", sandbox.RunOptions{}); err != nil || res.Stdout != "ran: x" {
		t.Errorf("Run() on another replica = %+v, %v", res, err)
	}
	if _, err := c.Open(ctx, made.ID(), "mallory"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Open(another owner) error = %v; want sandbox.ErrNotFound", err)
	}
	b.Release(ctx, other)
	l, err := c.List(ctx, "alice", store.ContainerQuery{})
	if err != nil || len(l.Items) != 1 || l.Items[0].Name != "shared" {
		t.Errorf("List() on a third replica = %+v, %v", l, err)
	}

	// Idle past its timeout: the three replicas sweep at once, the sandbox is deleted once.
	clk.Add(11 * time.Minute)
	var wg sync.WaitGroup
	counts := make([]int, 3)
	for i, s := range []*Manager{a, b, c} {
		wg.Go(func() { counts[i] = s.Sweep(ctx) })
	}
	wg.Wait()
	if live, _, deletes, _ := p.stats(); counts[0]+counts[1]+counts[2] != 1 || deletes != 1 || live != 0 {
		t.Errorf("sweeps claimed %v, provider deletes=%d live=%d; want exactly one claim and one delete", counts, deletes, live)
	}
	if info, err := c.Get(ctx, "alice", made.ID()); err != nil || info.Status != StatusExpired {
		t.Errorf("Get() after the sweep = %+v, %v; want expired", info, err)
	}

	// A host-bound container lives on its replica only.
	d, e := replica("d", onHost), replica("e", onHost)
	local, err := d.Create(ctx, "cloud", "alice", sandbox.CreateOptions{}, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	d.Release(ctx, local)
	var elsewhere *ElsewhereError
	if _, err := e.Open(ctx, local.ID(), "alice"); !errors.As(err, &elsewhere) || elsewhere.Host != "d" {
		t.Errorf("Open() of replica d's local container on e: error = %v; want ElsewhereError naming d", err)
	}
	// Replica e restarting expires none of d's containers.
	replica("e", onHost)
	if c2, err := d.Open(ctx, local.ID(), "alice"); err != nil {
		t.Errorf("Open() on d after e restarted: error = %v; want its container still running", err)
	} else {
		d.Release(ctx, c2)
	}
}

// Replicas on one Redis apply one owner's quotas together: its containers, whichever replica made
// or opened them, its creation bucket, and the total of shared (e2b-like) containers; the total of
// host-bound ones is each replica's. Redis gone, a create that needs a quota fails, never unlimited.
func TestSessionsQuotasAcrossReplicas(t *testing.T) {
	srv, _, p, shared, onHost, replica := sharedReplicas(t)
	ctx := context.Background()
	a, b := replica("a", shared), replica("b", shared)
	create := func(s *Manager, owner string, l Limits, idle time.Duration) (*Container, error) {
		return s.Create(WithLimits(ctx, l), "cloud", owner, sandbox.CreateOptions{}, idle)
	}

	perOwner := Limits{MaxPerOwner: 1}
	held, err := create(a, "alice", perOwner, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, err = create(b, "alice", perOwner, time.Minute)
	wantQuota(t, "alice's second container, on another replica", err, "max_containers_per_key")
	opened, err := b.Open(ctx, held.ID(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	b.Release(ctx, opened)
	_, err = create(b, "alice", perOwner, time.Minute)
	wantQuota(t, "after another replica opened and released it", err, "max_containers_per_key")
	a.Release(ctx, held)
	if err := b.Delete(ctx, "alice", held.ID()); err != nil { // on another replica than its maker
		t.Fatal(err)
	}
	again, err := create(b, "alice", perOwner, time.Minute)
	if err != nil {
		t.Fatalf("create after the first was deleted: %v", err)
	}
	b.Release(ctx, again)

	rate := Limits{CreatesPerMinute: 1, CreateBurst: 1}
	if _, err := create(a, "carol", rate, time.Minute); err != nil {
		t.Fatal(err)
	}
	_, err = create(b, "carol", rate, time.Minute)
	wantQuota(t, "carol's second create within the minute, on another replica", err, "container_creates_per_minute")

	// alice's and carol's are live: a total of 2 shared containers is reached on every replica.
	_, err = create(a, "dave", Limits{MaxContainers: 2}, time.Minute)
	wantQuota(t, "dave's create at the shared total", err, "max_containers")
	// Host-bound containers count in their own replica's total only.
	c, d := replica("c", onHost), replica("d", onHost)
	local := Limits{MaxContainers: 1}
	if _, err := create(c, "dave", local, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := create(d, "dave", local, time.Minute); err != nil {
		t.Fatalf("a host-bound create on another replica: %v", err)
	}
	_, err = create(c, "erin", local, time.Minute)
	wantQuota(t, "a second host-bound create on one replica", err, "max_containers")

	// Redis gone: the create fails as unavailable, and no sandbox is made.
	_, before, _, _ := p.stats()
	srv.Stop()
	_, err = create(a, "frank", perOwner, time.Minute)
	if !errors.Is(err, sandbox.ErrUnavailable) || !errors.Is(err, store.ErrUnavailable) || errors.Is(err, ErrQuota) {
		t.Errorf("create with Redis gone: error = %v; want unavailable (the store's), not a quota", err)
	}
	_, err = create(a, "frank", rate, time.Minute)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("create with a rate and Redis gone: error = %v; want the store unavailable", err)
	}
	if _, after, _, _ := p.stats(); after != before {
		t.Errorf("the backend saw %d creates while Redis was gone", after-before)
	}
}
