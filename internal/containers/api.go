package containers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

// The Containers API's side of Manager: containers by id, as a client lists, retrieves and
// deletes them. Every operation on one container counts as a use (OpenAI: "any container
// operation ... refreshes last_active_at"); listing does not.

// Info is what the Containers API shows of a container.
type Info struct {
	ID          string
	Name        string
	Status      string               // StatusRunning or StatusExpired
	MemoryLimit string               // as asked at creation; "" for the tool's default
	Network     *store.NetworkPolicy // nil: none was set
	IdleTimeout time.Duration
	CreatedAt   time.Time
	// LastActiveAt is the last use (creation, an execution, an API operation).
	LastActiveAt time.Time
}

func infoOf(r store.Container, now time.Time) Info {
	status := StatusRunning
	if expiredAt(r, now) {
		status = StatusExpired
	}
	return Info{ID: r.ID, Name: r.Name, Status: status, MemoryLimit: r.MemoryLimit, Network: r.Network, IdleTimeout: r.IdleTimeout,
		CreatedAt: r.CreatedAt, LastActiveAt: r.LastActiveAt}
}

// use opens owner's container id for one operation and releases it after f. An expired
// container is errExpired, and f does not run.
func (s *Manager) use(ctx context.Context, owner, id string, f func(c *Container) error) error {
	c, err := s.Open(ctx, id, owner)
	if err != nil {
		return err
	}
	defer s.Release(ctx, c)
	return f(c)
}

// Get returns owner's container id, expired or not; retrieving a running container is a use.
func (s *Manager) Get(ctx context.Context, owner, id string) (Info, error) {
	if err := s.use(ctx, owner, id, func(*Container) error { return nil }); err != nil && !errors.Is(err, ErrExpired) {
		return Info{}, err
	}
	rec, err := s.record(ctx, owner, id)
	if err != nil {
		return Info{}, err
	}
	return infoOf(rec, s.now()), nil
}

// List lists owner's containers by creation, expired ones included.
func (s *Manager) List(ctx context.Context, owner string, q store.ContainerQuery) (store.List[Info], error) {
	l, err := s.st.ListContainers(ctx, owner, q)
	if err != nil {
		if errors.Is(err, store.ErrInvalid) {
			return store.List[Info]{}, err
		}
		return store.List[Info]{}, fmt.Errorf("%w: reading the container registry: %w", sandbox.ErrUnavailable, err)
	}
	now := s.now()
	out := store.List[Info]{Items: make([]Info, len(l.Items)), HasMore: l.HasMore}
	for i, r := range l.Items {
		out.Items[i] = infoOf(r, now)
	}
	return out, nil
}

// Delete deletes owner's container id: its sandbox (running code or not, held by requests or not:
// their next use finds it gone), its record and its files' records.
func (s *Manager) Delete(ctx context.Context, owner, id string) error {
	if !store.ContainerKind.Valid(id) {
		return fmt.Errorf("%w: unknown container id", sandbox.ErrNotFound)
	}
	rec, err := s.record(ctx, owner, id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	c, held := s.live[id]
	if held && !c.deleting {
		s.markDeletingLocked(c)
	} else {
		held = false
	}
	s.mu.Unlock()
	switch {
	case held:
		s.deleteNow(ctx, c, "deleted by its owner")
	case rec.Status == StatusExpired:
	case s.opts.Host != "" && rec.Host != "" && rec.Host != s.host:
		return &ElsewhereError{ID: id, Host: rec.Host}
	default:
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.DeleteTimeout)
		defer cancel()
		already, err := s.expire(dctx, owner, id)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: expiring the container: %w", sandbox.ErrUnavailable, err)
		}
		if !already {
			s.deleteRecorded(dctx, rec)
		}
	}
	if err := s.st.DeleteContainer(ctx, owner, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: deleting the container's record: %w", sandbox.ErrUnavailable, err)
	}
	return nil
}
