package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrQuota is wrapped by a *QuotaError: a container would go over a quota. Clients see 429
// rate_limit_exceeded with the error's message.
var ErrQuota = errors.New("sandbox quota exceeded")

// QuotaError names the quota a Create would exceed.
type QuotaError struct {
	// Limit is the config key of the quota ("max_containers_per_key", ...).
	Limit string
	// Message says which limit, for the client.
	Message string
	// RetryAfter is when a creation may succeed again (the rate quota only); 0: unknown.
	RetryAfter time.Duration
}

func (e *QuotaError) Error() string        { return e.Message }
func (e *QuotaError) Is(target error) bool { return target == ErrQuota }

// Limits are the container quotas of one caller (general_settings' quotas, with its client key's
// overrides). A zero field is no limit.
type Limits struct {
	// MaxContainers bounds the containers of this process, every owner's and the warm pools'
	// kernels together.
	MaxContainers int
	// MaxPerOwner bounds the containers one owner holds (created or opened here, or being created).
	MaxPerOwner int
	// CreatesPerMinute and CreateBurst are the owner's token bucket of creations.
	CreatesPerMinute int
	CreateBurst      int
}

type ctxKeyLimits struct{}

// WithLimits returns ctx carrying the quotas that Sessions.Create applies to containers created
// under it. The router sets them per request from the request's configuration snapshot, so a
// reload changes them for the next request.
func WithLimits(ctx context.Context, l Limits) context.Context {
	return context.WithValue(ctx, ctxKeyLimits{}, l)
}

func limitsFrom(ctx context.Context) Limits {
	l, _ := ctx.Value(ctxKeyLimits{}).(Limits)
	return l
}

// warmer is implemented by providers that keep started sandboxes in advance (local's warm pool).
type warmer interface{ Warm() int }

// quotaBook counts containers by owner and holds each owner's creation bucket. Counts are this
// process's: replicas each apply the quotas to what they hold.
type quotaBook struct {
	mu      sync.Mutex
	owned   map[string]int
	total   int
	buckets map[string]*bucket
}

// bucket is a token bucket: tokens at the time at.
type bucket struct {
	tokens float64
	at     time.Time
}

// maxIdleBuckets bounds the buckets kept: beyond it, full ones (which say nothing) are dropped.
const maxIdleBuckets = 4096

// quotaSlot is one container's place in the counts; free gives it back, once.
type quotaSlot struct {
	book  *quotaBook
	owner string
	once  sync.Once
}

func (q *quotaSlot) free() {
	if q == nil {
		return
	}
	q.once.Do(func() {
		q.book.mu.Lock()
		defer q.book.mu.Unlock()
		q.book.total--
		if q.book.owned[q.owner]--; q.book.owned[q.owner] <= 0 {
			delete(q.book.owned, q.owner)
		}
	})
}

// admit reserves a place for a new container of owner under the limits ctx carries, or says which
// quota it would exceed. The warm kernels of reg count in the total.
func (s *Sessions) admit(ctx context.Context, reg *Registry, owner string) (*quotaSlot, error) {
	l := limitsFrom(ctx)
	warm := 0
	if l.MaxContainers > 0 && reg != nil {
		for _, e := range reg.entries {
			if w, ok := e.Provider.(warmer); ok {
				warm += w.Warm()
			}
		}
	}
	b := &s.quota
	now := s.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.owned == nil {
		b.owned, b.buckets = map[string]int{}, map[string]*bucket{}
	}
	if l.MaxContainers > 0 && b.total+warm >= l.MaxContainers {
		return nil, &QuotaError{Limit: "max_containers", Message: fmt.Sprintf(
			"Rate limit reached for containers: the proxy holds its limit of %d containers (max_containers). Delete containers you no longer need or try again later.", l.MaxContainers)}
	}
	if l.MaxPerOwner > 0 && b.owned[owner] >= l.MaxPerOwner {
		return nil, &QuotaError{Limit: "max_containers_per_key", Message: fmt.Sprintf(
			"Rate limit reached for containers per API key: you hold %d containers, the limit (max_containers_per_key). Delete containers you no longer need or let them expire.", l.MaxPerOwner)}
	}
	if l.CreatesPerMinute > 0 {
		burst := float64(max(l.CreateBurst, 1))
		rate := float64(l.CreatesPerMinute) / 60 // tokens per second
		bk, ok := b.buckets[owner]
		if !ok {
			if len(b.buckets) >= maxIdleBuckets {
				b.dropFull(now, rate, burst)
			}
			bk = &bucket{tokens: burst, at: now}
			b.buckets[owner] = bk
		}
		bk.tokens = min(burst, bk.tokens+now.Sub(bk.at).Seconds()*rate)
		bk.at = now
		if bk.tokens < 1 {
			wait := time.Duration((1 - bk.tokens) / rate * float64(time.Second))
			return nil, &QuotaError{Limit: "container_creates_per_minute", RetryAfter: wait, Message: fmt.Sprintf(
				"Rate limit reached for container creations per API key: limit %d per minute (container_creates_per_minute), bursts of %d. Please try again in %s.",
				l.CreatesPerMinute, int(burst), wait.Round(time.Millisecond))}
		}
		bk.tokens--
	}
	b.total++
	b.owned[owner]++
	return &quotaSlot{book: b, owner: owner}, nil
}

// dropFull forgets the buckets that have refilled: a new bucket starts full anyway. b.mu is held.
func (b *quotaBook) dropFull(now time.Time, rate, burst float64) {
	for k, bk := range b.buckets {
		if bk.tokens+now.Sub(bk.at).Seconds()*rate >= burst {
			delete(b.buckets, k)
		}
	}
}
