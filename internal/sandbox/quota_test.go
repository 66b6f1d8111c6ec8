package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
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
		name   string
		limits Limits
		warm   int
		steps  []step
	}{
		{"per owner", Limits{MaxPerOwner: 2}, 0, []step{{"a", ""}, {"a", ""}, {"a", "max_containers_per_key"}, {"b", ""}}},
		{"total", Limits{MaxContainers: 3}, 0, []step{{"a", ""}, {"b", ""}, {"c", ""}, {"d", "max_containers"}}},
		{"total counts the warm pool", Limits{MaxContainers: 3}, 2, []step{{"a", ""}, {"b", "max_containers"}}},
		{"creation rate", Limits{CreatesPerMinute: 60, CreateBurst: 2}, 0, []step{{"a", ""}, {"a", ""}, {"a", "container_creates_per_minute"}, {"b", ""}}},
		{"no limits", Limits{}, 5, []step{{"a", ""}, {"a", ""}, {"a", ""}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			reg, err := NewRegistry(nil, RegistryEntry{Name: "py", Provider: &warmProvider{f.p, tc.warm}, Backend: "rec"})
			if err != nil {
				t.Fatal(err)
			}
			f.reg = reg
			ctx := WithLimits(context.Background(), tc.limits)
			for i, st := range tc.steps {
				c, err := f.s.Create(ctx, "py", st.owner, CreateOptions{}, time.Minute)
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
	c, err := f.s.Create(ctx, "py", "a", CreateOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Create(ctx, "py", "a", CreateOptions{}, time.Minute); !errors.Is(err, ErrQuota) {
		t.Fatalf("second create: %v; want a quota error", err)
	}
	f.s.Release(ctx, c) // idle 0: deleted now
	var qe *QuotaError
	if _, err := f.s.Create(ctx, "py", "a", CreateOptions{}, time.Minute); !errors.As(err, &qe) || qe.Limit != "container_creates_per_minute" || qe.RetryAfter <= 0 {
		t.Fatalf("create after delete: %v; want the rate quota with a retry time", err)
	}
	f.clock.Add(qe.RetryAfter)
	if _, err := f.s.Create(ctx, "py", "a", CreateOptions{}, time.Minute); err != nil {
		t.Fatalf("create after the bucket refilled: %v", err)
	}
}

// A failed backend create gives its place back.
func TestSessionsQuotaFreedOnFailure(t *testing.T) {
	f := newFixture(t)
	ctx := WithLimits(context.Background(), Limits{MaxPerOwner: 1})
	if _, err := f.s.Create(ctx, "nope", "a", CreateOptions{}, time.Minute); err == nil || errors.Is(err, ErrQuota) {
		t.Fatalf("create on an unknown tool: %v", err)
	}
	if _, err := f.s.Create(ctx, "py", "a", CreateOptions{}, time.Minute); err != nil {
		t.Fatalf("create after a failure: %v", err)
	}
}
