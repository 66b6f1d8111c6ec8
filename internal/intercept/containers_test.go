package intercept

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// The adapter's releases: a container the request created and whose id reached nobody is
// discarded; any other keeps the idle timeout it was created with, whatever the request's
// configuration says (a container made through the Containers API is not deleted by a request
// that ran with container_idle_timeout 0).
func TestSessionsAdapterRelease(t *testing.T) {
	p := sandboxes.Provider(t)
	reg, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "local", Provider: p, Backend: "local", HostBound: true})
	if err != nil {
		t.Fatal(err)
	}
	sess := newSessions(t, reg)
	defer sess.Close(context.Background())
	a := adaptSessions(sess)
	ctx := context.Background()

	made, err := a.Create(ctx, "local", "alice", sandbox.CreateOptions{}, 20*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	a.Release(ctx, made, 0) // created, never shown
	if _, err := sess.Open(ctx, made.ID(), "alice"); !errors.Is(err, sandbox.ErrExpired) {
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
	a.Release(ctx, used, 0) // a request with container_idle_timeout 0 used it by id
	again, err := sess.Open(ctx, api.ID(), "alice")
	if err != nil {
		t.Fatalf("Open() of the API's container after a request released it with idle 0: error = %v; want it alive", err)
	}
	sess.Release(ctx, again)

	kept, err := a.Create(ctx, "local", "alice", sandbox.CreateOptions{}, 20*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	a.Release(ctx, kept, 20*time.Minute) // created and shown
	if c, err := sess.Open(ctx, kept.ID(), "alice"); err != nil {
		t.Errorf("Open() of a released container error = %v", err)
	} else {
		sess.Release(ctx, c)
	}
}
