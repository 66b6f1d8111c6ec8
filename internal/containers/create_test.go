package containers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

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
	if got := f.p.lastCreate.Metadata[sandbox.MetadataContainerID]; got != c.ID() {
		t.Errorf("sandbox metadata %s = %q; want the container id %q", sandbox.MetadataContainerID, got, c.ID())
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
	fail       bool // CreateContainer fails
	failUpdate bool // UpdateContainer fails
}

func (s *failingStore) UpdateContainer(ctx context.Context, c store.Container) (store.Container, error) {
	if s.failUpdate {
		return store.Container{}, fmt.Errorf("%w: connection refused", store.ErrUnavailable)
	}
	return s.Store.UpdateContainer(ctx, c)
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
