package containers

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

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
