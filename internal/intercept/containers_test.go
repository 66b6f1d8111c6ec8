package intercept

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

// The engine's releases: a container the request created and whose id reached nobody is
// discarded; any other keeps the idle timeout it was created with, whatever the request's
// configuration says (a container made through the Containers API is not deleted by a request
// that ran with container_idle_timeout 0).
func TestRelease(t *testing.T) {
	p := sandboxes.Provider(t)
	reg, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "local", Provider: p, Backend: "local", HostBound: true})
	if err != nil {
		t.Fatal(err)
	}
	sess := newSessions(t, reg)
	defer sess.Close(context.Background())
	a := manager{sess}
	ctx := context.Background()

	made, err := a.Create(ctx, "local", "alice", sandbox.CreateOptions{}, 20*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	release(ctx, made, true, false, 20*time.Minute) // created, never shown
	if _, err := sess.Open(ctx, made.ID(), "alice"); !errors.Is(err, containers.ErrExpired) {
		t.Errorf("Open() of a discarded container: error = %v; want ErrExpired", err)
	}

	api, err := sess.Create(ctx, "local", "alice", sandbox.CreateOptions{Name: "from the API"}, 20*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sess.Release(ctx, api)
	used, err := a.Open(ctx, api.ID(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	release(ctx, used, false, true, 0) // a request with container_idle_timeout 0 used it by id
	again, err := sess.Open(ctx, api.ID(), "alice")
	if err != nil {
		t.Fatalf("Open() of the API's container after a request released it with idle 0: error = %v; want it alive", err)
	}
	sess.Release(ctx, again)

	kept, err := a.Create(ctx, "local", "alice", sandbox.CreateOptions{}, 20*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	release(ctx, kept, true, true, 20*time.Minute) // created and shown
	if c, err := sess.Open(ctx, kept.ID(), "alice"); err != nil {
		t.Errorf("Open() of a released container error = %v", err)
	} else {
		sess.Release(ctx, c)
	}
}

// A file placed again in the same container is found by its record's origin, not by the memory
// of the process that placed it: another replica, or this one after a restart (the container
// opened again over the same store), returns the same record and writes nothing.
func TestPlaceFilesAgainFromTheStore(t *testing.T) {
	p := sandboxes.Provider(t)
	reg, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "local", Provider: p, Backend: "local", HostBound: true})
	if err != nil {
		t.Fatal(err)
	}
	st := newState(t)
	sess := sessionsOn(t, reg, st)
	defer sess.Close(context.Background())
	ctx := context.Background()

	up, err := st.BeginFile(ctx, "alice", store.FileLimits{})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Abort()
	if _, err := up.Write(ctx, strings.NewReader("a,b\n")); err != nil {
		t.Fatal(err)
	}
	f, err := up.Commit(ctx, store.File{Filename: "in.csv", Purpose: "user_data"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := sess.Create(ctx, "local", "alice", sandbox.CreateOptions{}, 20*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Release(ctx, c)
	files := []containers.Placement{{Name: "in.csv", FileID: f.ID}, {Name: "notes.txt", Data: []byte("inline")}}
	lim := containers.ContainerLimits{Files: 10}

	first, err := c.Place(ctx, files, lim)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Place(ctx, files, lim)
	if err != nil {
		t.Fatal(err)
	}
	for i := range files {
		if again[i].ID != first[i].ID || again[i].Path != first[i].Path {
			t.Errorf("placement %d again = %s %s; want %s %s", i, again[i].ID, again[i].Path, first[i].ID, first[i].Path)
		}
	}
	changed := []containers.Placement{{Name: "notes.txt", Data: []byte("other bytes")}}
	other, err := c.Place(ctx, changed, lim)
	if err != nil {
		t.Fatal(err)
	}
	if other[0].ID == first[1].ID || other[0].Path != "/mnt/data/notes-1.txt" {
		t.Errorf("other bytes under the same name = %s %s; want a new file notes-1.txt", other[0].ID, other[0].Path)
	}
	l, err := sess.Files(ctx, "alice", c.ID(), store.ContainerFileQuery{})
	if err != nil || len(l.Items) != 3 {
		t.Errorf("the container holds %d files (%v); want 3", len(l.Items), err)
	}
}
