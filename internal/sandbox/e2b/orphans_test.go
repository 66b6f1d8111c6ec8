package e2b_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2b"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
)

// TestSweepOrphans: of the sandboxes tagged for this deployment, those that no live container
// record names are deleted (their creator died before recording them, or the janitor that expired
// them died before deleting), except one whose container is being created; sandboxes of another
// deployment are left alone; one replica sweeps at a time.
func TestSweepOrphans(t *testing.T) {
	_, srv := newEnv(t)
	srv.SetLazyKernels(true)
	p := provider(t, srv)
	ctx := context.Background()
	st, err := embedded.Open(embedded.Options{Dir: t.TempDir(), SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	reg, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "my-e2b", Provider: p, Backend: "e2b"})
	if err != nil {
		t.Fatal(err)
	}

	tagged := func(deployment string) (string, sandbox.Handle) {
		t.Helper()
		id := st.NewID(store.ContainerKind)
		h, err := p.Create(ctx, sandbox.CreateOptions{Metadata: map[string]string{
			containers.MetadataDeployment: deployment, sandbox.MetadataContainerID: id}})
		if err != nil {
			t.Fatal(err)
		}
		return id, h
	}
	record := func(id string, h sandbox.Handle) store.Container {
		t.Helper()
		hb, _ := json.Marshal(h)
		c, err := st.CreateContainer(ctx, store.Container{ID: id, Owner: "alice", Backend: "e2b", Tool: "my-e2b", Handle: hb,
			Status: "running", IdleTimeout: 20 * time.Minute, ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	liveID, live := tagged("d1")
	record(liveID, live)
	_, unrecorded := tagged("d1") // its creator died before CreateContainer
	creatingID, creating := tagged("d1")
	if ok, err := st.Claim(ctx, containers.CreatingClaim(creatingID), "replica-2", time.Minute); !ok || err != nil {
		t.Fatal(ok, err)
	}
	_, foreign := tagged("another-deployment")
	expiredID, expiredSb := tagged("d1") // expired by a janitor that died before deleting it
	rec := record(expiredID, expiredSb)
	rec.Status, rec.ExpiresAt, rec.ForgetAt = "expired", time.Time{}, time.Now().Add(time.Hour)
	if _, err := st.UpdateContainer(ctx, rec); err != nil {
		t.Fatal(err)
	}
	otherID, replaced := tagged("d1") // its record names another sandbox
	record(otherID, sandbox.Handle{Backend: "e2b", ID: "i0000000000000000000x"})

	opts := containers.OrphanOptions{Store: st, Registry: func() *sandbox.Registry { return reg },
		Tag: map[string]string{containers.MetadataDeployment: "d1"}, Holder: "replica-1", Lease: time.Minute}
	n, won, err := containers.SweepOrphans(ctx, opts)
	if err != nil || !won || n != 3 {
		t.Fatalf("SweepOrphans = %d, %v, %v; want 3 deleted", n, won, err)
	}
	left := map[string]bool{}
	for _, id := range srv.SandboxIDs() {
		left[id] = true
	}
	for name, h := range map[string]sandbox.Handle{"live": live, "creating": creating, "foreign": foreign} {
		if !left[h.ID] {
			t.Errorf("the %s sandbox was deleted", name)
		}
	}
	for name, h := range map[string]sandbox.Handle{"unrecorded": unrecorded, "expired": expiredSb, "replaced": replaced} {
		if left[h.ID] {
			t.Errorf("the %s sandbox was left", name)
		}
	}

	// Another replica waits for the claim; the holder sweeps again and finds nothing more.
	other := opts
	other.Holder = "replica-2"
	if n, won, err := containers.SweepOrphans(ctx, other); won || n != 0 || err != nil {
		t.Errorf("a second replica's sweep = %d, %v, %v; want it to wait for the claim", n, won, err)
	}
	if n, won, err := containers.SweepOrphans(ctx, opts); !won || n != 0 || err != nil {
		t.Errorf("a second sweep = %d, %v, %v; want nothing more to delete", n, won, err)
	}
	// Without a deployment tag nothing could be told apart: no sweep.
	opts.Tag = nil
	if _, _, err := containers.SweepOrphans(ctx, opts); err == nil {
		t.Error("a sweep without a tag ran")
	}
	for _, h := range []sandbox.Handle{live, creating, foreign} {
		_ = p.Delete(ctx, h)
	}
}

// hookedLister runs beforeReturn when List has its answer, before returning it: what a creator
// does meanwhile.
type hookedLister struct {
	*e2b.Provider
	beforeReturn func()
}

func (h *hookedLister) List(ctx context.Context, meta map[string]string) ([]sandbox.Listed, error) {
	l, err := h.Provider.List(ctx, meta)
	if h.beforeReturn != nil {
		h.beforeReturn()
		h.beforeReturn = nil
	}
	return l, err
}

// TestSweepOrphansRacesACreate: a creator that records its container and releases its creating
// claim while the sweep is listing must not lose its sandbox.
func TestSweepOrphansRacesACreate(t *testing.T) {
	_, srv := newEnv(t)
	srv.SetLazyKernels(true)
	p := provider(t, srv)
	ctx := context.Background()
	st, err := embedded.Open(embedded.Options{Dir: t.TempDir(), SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	id := st.NewID(store.ContainerKind)
	if ok, err := st.Claim(ctx, containers.CreatingClaim(id), "creator", time.Minute); !ok || err != nil {
		t.Fatal(ok, err)
	}
	h, err := p.Create(ctx, sandbox.CreateOptions{Metadata: map[string]string{containers.MetadataDeployment: "d1", sandbox.MetadataContainerID: id}})
	if err != nil {
		t.Fatal(err)
	}
	hl := &hookedLister{Provider: p, beforeReturn: func() {
		hb, _ := json.Marshal(h)
		if _, err := st.CreateContainer(ctx, store.Container{ID: id, Owner: "alice", Backend: "e2b", Tool: "my-e2b", Handle: hb,
			Status: "running", ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
			t.Error(err)
		}
		if err := st.Release(ctx, containers.CreatingClaim(id), "creator"); err != nil {
			t.Error(err)
		}
	}}
	reg, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "my-e2b", Provider: hl, Backend: "e2b"})
	if err != nil {
		t.Fatal(err)
	}
	n, _, err := containers.SweepOrphans(ctx, containers.OrphanOptions{Store: st, Registry: func() *sandbox.Registry { return reg },
		Tag: map[string]string{containers.MetadataDeployment: "d1"}, Holder: "sweeper", Lease: time.Minute})
	if err != nil || n != 0 {
		t.Errorf("SweepOrphans = %d, %v; want the new container's sandbox kept", n, err)
	}
	if srv.Live() != 1 {
		t.Errorf("%d sandboxes live; want 1", srv.Live())
	}
	_ = p.Delete(ctx, h)
}
