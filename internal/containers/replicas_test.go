package containers

import (
	"context"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

// claimWatcher is a provider that reads, when asked to create, who holds the creating claim of the
// container the sandbox is for.
type claimWatcher struct {
	*recProvider
	st     store.Store
	holder string
	meta   map[string]string
}

func (w *claimWatcher) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Handle, error) {
	w.meta = opts.Metadata
	w.holder, _ = w.st.Holder(ctx, CreatingClaim(opts.Metadata[sandbox.MetadataContainerID]))
	return w.recProvider.Create(ctx, opts)
}

// TestSessionsForReplicas: every sandbox carries the deployment's tag and its container's id; the
// id is claimed as being created while the backend creates it, and free once the record exists;
// Expire marks a record expired once, and loses quietly to a writer that got there first.
func TestSessionsForReplicas(t *testing.T) {
	f := newFixture(t)
	w := &claimWatcher{recProvider: f.p, st: f.st}
	reg, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "py", Provider: w, Backend: "rec", HostBound: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(context.Background(), Options{Store: f.st, Host: "http://10.0.0.1:4000", Now: f.clock.Now,
		Registry: func() *sandbox.Registry { return reg }, SweepInterval: -1, Metadata: map[string]string{MetadataDeployment: "d1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	ctx := context.Background()
	c, err := s.Create(ctx, "py", "alice", sandbox.CreateOptions{Metadata: map[string]string{"k": "v"}}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if w.meta[MetadataDeployment] != "d1" || w.meta[sandbox.MetadataContainerID] != c.ID() || w.meta["k"] != "v" {
		t.Errorf("sandbox metadata = %v", w.meta)
	}
	if w.holder != "http://10.0.0.1:4000" {
		t.Errorf("creating claim held by %q during the create; want this replica", w.holder)
	}
	if h, err := f.st.Holder(ctx, CreatingClaim(c.ID())); err != nil || h != "" {
		t.Errorf("creating claim after the record = %q, %v; want it released", h, err)
	}
	rec := f.record(t, "alice", c.ID())
	if rec.Host != "http://10.0.0.1:4000" {
		t.Errorf("record host = %q", rec.Host)
	}
	if err := s.Expire(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if got := f.record(t, "alice", c.ID()); got.Status != StatusExpired || !got.ExpiresAt.IsZero() || got.ForgetAt.IsZero() {
		t.Errorf("after Expire: %+v", got)
	}
	if err := s.Expire(ctx, rec); err != nil { // rec is stale now
		t.Errorf("a second Expire from a stale read = %v; want nil", err)
	}
	s.Release(ctx, c)
}

// TestSessionsRecordLost: a container whose record the store lost (Redis restarted empty) is
// deleted, idle or when its last holder lets it go; one whose record another replica extended is
// kept.
func TestSessionsRecordLost(t *testing.T) {
	f := newFixtureBound(t, false)
	ctx := context.Background()
	idle := f.create(t, "alice", time.Minute)
	held := f.create(t, "alice", time.Minute)
	extended := f.create(t, "alice", time.Minute)
	f.s.Release(ctx, idle)
	f.s.Release(ctx, extended)
	for _, c := range []*Container{idle, held} {
		if err := f.st.DeleteContainer(ctx, "alice", c.ID()); err != nil {
			t.Fatal(err)
		}
	}
	// Another replica used the third one later: its record expires later than this process knows.
	if _, err := store.Modify(ctx, f.st, "alice", extended.ID(), func(r *store.Container) error {
		r.ExpiresAt = f.clock.Now().Add(time.Hour)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	f.clock.Add(2 * time.Minute)
	f.s.Sweep(ctx)
	live, _, deletes, _ := f.p.stats()
	if deletes != 1 || live != 2 {
		t.Fatalf("after a sweep: live %d, deletes %d; want the idle lost one deleted", live, deletes)
	}
	f.s.Release(ctx, held) // its record is gone: the release deletes it
	if live, _, deletes, _ := f.p.stats(); deletes != 2 || live != 1 {
		t.Errorf("after the release: live %d, deletes %d; want the held lost one deleted too", live, deletes)
	}
	if r := f.record(t, "alice", extended.ID()); !r.ExpiresAt.Equal(f.clock.Now().Add(58 * time.Minute)) {
		t.Errorf("the extended record's expiry = %v; a sweep must not pull it back", r.ExpiresAt)
	}
	if f.s.Live() != 1 {
		t.Errorf("Live = %d; want the extended one", f.s.Live())
	}
	// The replica that extended it died holding it (its hold lease runs for minutes), and then the
	// store lost the record too: this process finds that out within one idle timeout, not at the
	// expiry the dead replica wrote.
	if err := f.st.DeleteContainer(ctx, "alice", extended.ID()); err != nil {
		t.Fatal(err)
	}
	f.clock.Add(time.Minute)
	f.s.Sweep(ctx)
	if live, _, deletes, _ := f.p.stats(); deletes != 3 || live != 0 || f.s.Live() != 0 {
		t.Errorf("one idle timeout after the extended record was lost: live %d, deletes %d, held %d; want it deleted", live, deletes, f.s.Live())
	}
}

// TestSessionsReleaseUnrecorded: a release whose write to the store fails (a shared store
// restarting) does not leave the container held in memory for the whole hold lease. The next
// sweep writes the use again: the container then expires after its idle timeout, or, if its
// record was lost meanwhile, is deleted as one nobody can name.
func TestSessionsReleaseUnrecorded(t *testing.T) {
	for _, lost := range []bool{false, true} {
		t.Run(map[bool]string{false: "record kept", true: "record lost"}[lost], func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			fs := &failingStore{Store: f.st}
			s, err := New(ctx, Options{Store: fs, Now: f.clock.Now, Registry: func() *sandbox.Registry { return f.reg }, SweepInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close(ctx) })
			c, err := s.Create(ctx, "py", "alice", sandbox.CreateOptions{}, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			fs.failUpdate = true
			s.Release(ctx, c)
			fs.failUpdate = false
			if lost {
				if err := f.st.DeleteContainer(ctx, "alice", c.ID()); err != nil {
					t.Fatal(err)
				}
			}
			s.Sweep(ctx)
			// A record that is gone makes the container one nobody can name: deleted at once, as a
			// release that finds its record gone does.
			if live, _, deletes, _ := f.p.stats(); lost && deletes != 1 || !lost && (live != 1 || deletes != 0) {
				t.Fatalf("a sweep within the idle timeout: live %d, deletes %d; want it kept (deleted if its record is lost)", live, deletes)
			}
			f.clock.Add(2 * time.Minute)
			s.Sweep(ctx)
			if live, _, deletes, _ := f.p.stats(); live != 0 || deletes != 1 {
				t.Errorf("a sweep past the idle timeout: live %d, deletes %d; want it deleted, not held for the hold lease", live, deletes)
			}
			if s.Live() != 0 {
				t.Errorf("Live = %d; want 0", s.Live())
			}
		})
	}
}
