package containers

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// warmProvider is a recProvider with a warm pool of a given size.
type warmProvider struct {
	*recProvider
	warm int
}

func (p *warmProvider) Warm() int { return p.warm }

func TestSessionsQuotas(t *testing.T) {
	type step struct {
		owner string
		limit string // "" when the create must succeed
	}
	cases := []struct {
		name      string
		limits    Limits
		hostBound bool
		warm      int
		steps     []step
	}{
		{"per owner", Limits{MaxPerOwner: 2}, true, 0, []step{{"a", ""}, {"a", ""}, {"a", "max_containers_per_key"}, {"b", ""}}},
		{"per owner, shared", Limits{MaxPerOwner: 2}, false, 0, []step{{"a", ""}, {"a", ""}, {"a", "max_containers_per_key"}, {"b", ""}}},
		{"total", Limits{MaxContainers: 3}, true, 0, []step{{"a", ""}, {"b", ""}, {"c", ""}, {"d", "max_containers"}}},
		{"total, shared", Limits{MaxContainers: 3}, false, 0, []step{{"a", ""}, {"b", ""}, {"c", ""}, {"d", "max_containers"}}},
		{"total counts the warm pool", Limits{MaxContainers: 3}, true, 2, []step{{"a", ""}, {"b", "max_containers"}}},
		{"creation rate", Limits{CreatesPerMinute: 60, CreateBurst: 2}, true, 0, []step{{"a", ""}, {"a", ""}, {"a", "container_creates_per_minute"}, {"b", ""}}},
		{"no limits", Limits{}, true, 5, []step{{"a", ""}, {"a", ""}, {"a", ""}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			reg, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "py", Provider: &warmProvider{f.p, tc.warm}, Backend: "rec", HostBound: tc.hostBound})
			if err != nil {
				t.Fatal(err)
			}
			f.reg = reg
			ctx := WithLimits(context.Background(), tc.limits)
			for i, st := range tc.steps {
				c, err := f.s.Create(ctx, "py", st.owner, sandbox.CreateOptions{}, time.Minute)
				if st.limit == "" {
					if err != nil {
						t.Fatalf("step %d: Create(%s) error = %v", i, st.owner, err)
					}
					continue
				}
				var qe *QuotaError
				if !errors.As(err, &qe) || !errors.Is(err, ErrQuota) || qe.Limit != st.limit || !strings.Contains(qe.Message, st.limit) {
					t.Fatalf("step %d: Create(%s) = %v, %v; want the %s quota", i, st.owner, c, err, st.limit)
				}
			}
			if live, creates, _, _ := f.p.stats(); creates != live {
				t.Errorf("the backend saw %d creates, %d live: a refused create reached it", creates, live)
			}
		})
	}
}

// A deleted container gives its place back, and the bucket refills with the clock.
func TestSessionsQuotaFreedAndRefilled(t *testing.T) {
	f := newFixture(t)
	ctx := WithLimits(context.Background(), Limits{MaxPerOwner: 1, CreatesPerMinute: 6, CreateBurst: 1})
	c, err := f.s.Create(ctx, "py", "a", sandbox.CreateOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Create(ctx, "py", "a", sandbox.CreateOptions{}, time.Minute); !errors.Is(err, ErrQuota) {
		t.Fatalf("second create: %v; want a quota error", err)
	}
	f.s.Release(ctx, c) // idle 0: deleted now
	var qe *QuotaError
	if _, err := f.s.Create(ctx, "py", "a", sandbox.CreateOptions{}, time.Minute); !errors.As(err, &qe) || qe.Limit != "container_creates_per_minute" || qe.RetryAfter <= 0 {
		t.Fatalf("create after delete: %v; want the rate quota with a retry time", err)
	}
	f.clock.Add(qe.RetryAfter)
	if _, err := f.s.Create(ctx, "py", "a", sandbox.CreateOptions{}, time.Minute); err != nil {
		t.Fatalf("create after the bucket refilled: %v", err)
	}
}

// A failed backend create gives its place back.
func TestSessionsQuotaFreedOnFailure(t *testing.T) {
	f := newFixture(t)
	ctx := WithLimits(context.Background(), Limits{MaxPerOwner: 1})
	if _, err := f.s.Create(ctx, "nope", "a", sandbox.CreateOptions{}, time.Minute); err == nil || errors.Is(err, ErrQuota) {
		t.Fatalf("create on an unknown tool: %v", err)
	}
	if _, err := f.s.Create(ctx, "py", "a", sandbox.CreateOptions{}, time.Minute); err != nil {
		t.Fatalf("create after a failure: %v", err)
	}
}

// wantQuota fails unless err is the quota named limit.
func wantQuota(t *testing.T, what string, err error, limit string) {
	t.Helper()
	var qe *QuotaError
	if !errors.As(err, &qe) || qe.Limit != limit {
		t.Fatalf("%s: error = %v; want the %s quota", what, err, limit)
	}
}

// Containers that outlive the process (e2b's) count for their owner after a restart, opened again
// or not, until they are deleted or expire: the count is the owner's live containers, not what
// this process created.
func TestSessionsQuotaCountsReopenedContainers(t *testing.T) {
	f := newFixtureBound(t, false)
	ctx := WithLimits(context.Background(), Limits{MaxPerOwner: 2})
	var ids []string
	for range 2 {
		c := f.create(t, "alice", 10*time.Minute)
		ids = append(ids, c.ID())
		f.s.Release(ctx, c)
	}
	if err := f.s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := f.sessions(t, "", func() *sandbox.Registry { return f.reg })
	_, err := restarted.Create(ctx, "py", "alice", sandbox.CreateOptions{}, time.Minute)
	wantQuota(t, "create after a restart, two containers live", err, "max_containers_per_key")
	c, err := restarted.Open(ctx, ids[0], "alice")
	if err != nil {
		t.Fatalf("Open() after the restart: %v", err)
	}
	_, err = restarted.Create(ctx, "py", "alice", sandbox.CreateOptions{}, time.Minute)
	wantQuota(t, "create with one container reopened", err, "max_containers_per_key")
	if _, err := restarted.Create(ctx, "py", "bob", sandbox.CreateOptions{}, time.Minute); err != nil {
		t.Fatalf("another owner's create: %v", err)
	}
	restarted.Release(ctx, c)

	// Deleting the reopened one frees its place, once: a second delete frees nothing more.
	for range 2 {
		_ = restarted.Delete(ctx, "alice", ids[0])
	}
	if p, err := f.st.Places(ctx, "alice"); err != nil || p.Owner != 1 {
		t.Fatalf("Places(alice) after a delete = %+v, %v; want 1", p, err)
	}
	made, err := restarted.Create(ctx, "py", "alice", sandbox.CreateOptions{}, time.Minute)
	if err != nil {
		t.Fatalf("create after a delete: %v", err)
	}
	restarted.Release(ctx, made)
	_, err = restarted.Create(ctx, "py", "alice", sandbox.CreateOptions{}, time.Minute)
	wantQuota(t, "create at the limit again", err, "max_containers_per_key")

	// The one never reopened expires on its idle timeout: its place ends with it.
	f.clock.Add(11 * time.Minute)
	restarted.Sweep(ctx)
	if p, err := f.st.Places(ctx, "alice"); err != nil || p.Owner != 0 {
		t.Fatalf("Places(alice) after every container expired = %+v, %v; want 0", p, err)
	}
}
