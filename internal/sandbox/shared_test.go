package sandbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/redisstore"
	"github.com/ciproxy/ciproxy/internal/testutil/redisserver"
)

// Three replicas, each with its own client of one real Redis (the shared store): a container made
// on one is opened and run on another, reaped exactly once, and a host-bound one is reported as
// hosted elsewhere.
func TestSessionsOnASharedStore(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	clk := newClock()
	p := newRecProvider()
	shared, err := NewRegistry(nil, RegistryEntry{Name: "cloud", Provider: p, Backend: "rec"})
	if err != nil {
		t.Fatal(err)
	}
	bound := newRecProvider()
	onHost, err := NewRegistry(nil, RegistryEntry{Name: "cloud", Provider: bound, Backend: "rec", HostBound: true})
	if err != nil {
		t.Fatal(err)
	}
	replica := func(host string, reg *Registry) *Sessions {
		t.Helper()
		st, err := redisstore.Open(ctx, redisstore.Options{URL: srv.URL(), Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewSessions(ctx, SessionOptions{Store: st, Host: host, Now: clk.Now, SweepInterval: -1,
			Registry: func() *Registry { return reg }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = s.Close(ctx)
			_ = st.Close()
		})
		return s
	}
	a, b, c := replica("a", shared), replica("b", shared), replica("c", shared)

	made, err := a.Create(ctx, "cloud", "alice", CreateOptions{Name: "shared"}, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	a.Release(ctx, made)
	other, err := b.Open(ctx, made.ID(), "alice")
	if err != nil {
		t.Fatalf("Open() on another replica error = %v", err)
	}
	if res, err := other.Run(ctx, "x", RunOptions{}); err != nil || res.Stdout != "ran: x" {
		t.Errorf("Run() on another replica = %+v, %v", res, err)
	}
	if _, err := c.Open(ctx, made.ID(), "mallory"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open(another owner) error = %v; want ErrNotFound", err)
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
	for i, s := range []*Sessions{a, b, c} {
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
	local, err := d.Create(ctx, "cloud", "alice", CreateOptions{}, 10*time.Minute)
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
