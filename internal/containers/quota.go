package containers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
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
// overrides). A zero field is no limit. What counts is the store's when it is shared (Redis): the
// owner's bounds hold across every replica.
type Limits struct {
	// MaxContainers bounds the containers in total. For a host-bound tool (local) it is this
	// process's: its local containers and the warm pools' kernels, which take this host's memory
	// and CPU. For any other tool (e2b) it is the deployment's: every such container of every
	// owner, on every replica sharing the store, which is what an e2b account's concurrency is.
	MaxContainers int
	// MaxPerOwner bounds the containers one owner holds: its live containers in the store,
	// whichever process created or opened them, and those being created.
	MaxPerOwner int
	// CreatesPerMinute and CreateBurst are the owner's token bucket of creations, in the store.
	CreatesPerMinute int
	CreateBurst      int
}

type ctxKeyLimits struct{}

// WithLimits returns ctx carrying the quotas that Manager.Create applies to containers created
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

// quotaBook counts the containers of host-bound tools that this process holds, for their total
// (Limits.MaxContainers). Owners' counts and buckets are the store's (store.Quotas).
type quotaBook struct {
	mu    sync.Mutex
	total int
}

// reserveTTL is how long a new container's place is reserved in the store before its record holds
// it: the create's own bound, so that the place of a create whose process died runs out.
const reserveTTL = createTimeout + keepAliveMargin

// quotaSlot is a new container's place in the quotas: its reservation in the store until its
// record holds the place (cancel gives it back if the record is never written), and, for a
// host-bound tool, its place in this process's total until the container is deleted (free, once).
type quotaSlot struct {
	book      *quotaBook // nil: not in this process's total
	st        store.Quotas
	owner, id string
	reserved  bool
	once      sync.Once
}

func (q *quotaSlot) free() {
	if q == nil || q.book == nil {
		return
	}
	q.once.Do(func() {
		q.book.mu.Lock()
		defer q.book.mu.Unlock()
		q.book.total--
	})
}

// cancel gives back a place reserved for a container whose record was never written (the store
// keeps a recorded one's). Should the store not answer, the reservation runs out at reserveTTL.
func (q *quotaSlot) cancel(ctx context.Context, timeout time.Duration) {
	if q == nil || !q.reserved {
		return
	}
	ctx, stop := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer stop()
	_ = q.st.CancelPlace(ctx, q.owner, q.id)
}

// admit reserves a place for owner's new container id on ent under the limits ctx carries, or says
// which quota it would exceed. The warm kernels of reg count in a host-bound tool's total. A store
// that cannot answer fails the create (ErrUnavailable wrapping store.ErrUnavailable): a quota is
// never waived.
func (s *Manager) admit(ctx context.Context, reg *sandbox.Registry, ent *sandbox.Tool, owner, id string) (*quotaSlot, error) {
	l := limitsFrom(ctx)
	slot := &quotaSlot{st: s.st, owner: owner, id: id}
	if ent.HostBound && l.MaxContainers > 0 {
		warm := 0
		if reg != nil {
			for _, name := range reg.Names() {
				p, _ := reg.Get(name)
				if w, ok := p.(warmer); ok {
					warm += w.Warm()
				}
			}
		}
		b := &s.quota
		b.mu.Lock()
		if b.total+warm >= l.MaxContainers {
			b.mu.Unlock()
			return nil, &QuotaError{Limit: "max_containers", Message: fmt.Sprintf(
				"Rate limit reached for containers: this server holds its limit of %d containers (max_containers). Delete containers you no longer need or try again later.", l.MaxContainers)}
		}
		b.total++
		b.mu.Unlock()
		slot.book = b
	}
	fail := func(err error) (*quotaSlot, error) {
		slot.free()
		slot.cancel(ctx, s.opts.DeleteTimeout)
		return nil, err
	}
	shared := !ent.HostBound
	if l.MaxPerOwner > 0 || (shared && l.MaxContainers > 0) {
		req := store.PlaceRequest{Owner: owner, ID: id, Shared: shared, MaxPerOwner: l.MaxPerOwner, TTL: reserveTTL}
		if shared {
			req.MaxShared = l.MaxContainers
		}
		p, err := s.st.ReservePlace(ctx, req)
		switch {
		case err != nil:
			return fail(fmt.Errorf("%w: checking the container quotas: %w", sandbox.ErrUnavailable, err))
		case p.Refused == store.RefusedOwner:
			return fail(&QuotaError{Limit: "max_containers_per_key", Message: fmt.Sprintf(
				"Rate limit reached for containers per API key: you hold %d containers and the limit is %d (max_containers_per_key). Delete containers you no longer need or let them expire.", p.Owner, l.MaxPerOwner)})
		case p.Refused == store.RefusedShared:
			return fail(&QuotaError{Limit: "max_containers", Message: fmt.Sprintf(
				"Rate limit reached for containers: the service holds its limit of %d containers (max_containers). Delete containers you no longer need or try again later.", l.MaxContainers)})
		}
		slot.reserved = true
	}
	if l.CreatesPerMinute > 0 {
		burst := max(l.CreateBurst, 1)
		ok, wait, err := s.st.TakeToken(ctx, "container_creates:"+owner, store.Bucket{PerMinute: l.CreatesPerMinute, Burst: burst})
		switch {
		case err != nil:
			return fail(fmt.Errorf("%w: checking the container creation rate: %w", sandbox.ErrUnavailable, err))
		case !ok:
			return fail(&QuotaError{Limit: "container_creates_per_minute", RetryAfter: wait, Message: fmt.Sprintf(
				"Rate limit reached for container creations per API key: limit %d per minute (container_creates_per_minute), bursts of %d. Please try again in %s.",
				l.CreatesPerMinute, burst, wait.Round(time.Millisecond))})
		}
	}
	return slot, nil
}
