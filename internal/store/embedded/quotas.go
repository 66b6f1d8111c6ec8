package embedded

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
)

// Places and buckets live in memory: places are rebuilt from the container records at Open (a
// live record holds its place after a restart as before it), and a bucket lost to a restart only
// starts full again, as a new one does.

// maxBuckets bounds the buckets kept: beyond it, those that have refilled (which say nothing a
// new bucket would not) are dropped.
const maxBuckets = 4096

// bucket is a token bucket: tokens at the time at.
type bucket struct {
	tokens float64
	at     time.Time
}

// placeLocked moves the place of record r with it (see store.Quotas). s.mu is held.
func (s *Store) placeLocked(r *store.Container) {
	until := r.ExpiresAt
	if !r.ForgetAt.IsZero() && r.ForgetAt.Before(until) {
		until = r.ForgetAt
	}
	if until.IsZero() || !until.After(s.now()) {
		s.unplaceLocked(r.Owner, r.ID)
		return
	}
	s.holdLocked(r.Owner, r.ID, r.Host == "", until)
}

// holdLocked sets the place of owner's container id to until.
func (s *Store) holdLocked(owner, id string, shared bool, until time.Time) {
	m := s.places[owner]
	if m == nil {
		m = map[string]time.Time{}
		s.places[owner] = m
	}
	m[id] = until
	if shared {
		s.shared[id] = until
	} else {
		delete(s.shared, id)
	}
}

func (s *Store) unplaceLocked(owner, id string) {
	if m := s.places[owner]; m != nil {
		if delete(m, id); len(m) == 0 {
			delete(s.places, owner)
		}
	}
	delete(s.shared, id)
}

// countLocked drops the places of owner and the shared places that have run out, and counts
// what is left.
func (s *Store) countLocked(owner string) store.Places {
	now := s.now()
	m := s.places[owner]
	for id, until := range m {
		if !until.After(now) {
			delete(m, id)
		}
	}
	if m != nil && len(m) == 0 {
		delete(s.places, owner)
	}
	for id, until := range s.shared {
		if !until.After(now) {
			delete(s.shared, id)
		}
	}
	return store.Places{Owner: len(m), Shared: len(s.shared)}
}

// ReservePlace implements [store.Quotas.ReservePlace].
func (s *Store) ReservePlace(_ context.Context, r store.PlaceRequest) (store.Places, error) {
	if !store.ContainerKind.Valid(r.ID) || r.TTL <= 0 {
		return store.Places{}, fmt.Errorf("%w: place for %q for %s", errInvalid, r.ID, r.TTL)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(); err != nil {
		return store.Places{}, err
	}
	n := s.countLocked(r.Owner)
	until := s.now().Add(r.TTL)
	if had, ok := s.places[r.Owner][r.ID]; ok {
		_, shared := s.shared[r.ID]
		s.holdLocked(r.Owner, r.ID, shared, maxTime(had, until))
		return n, nil
	}
	switch {
	case r.MaxPerOwner > 0 && n.Owner >= r.MaxPerOwner:
		n.Refused = store.RefusedOwner
	case r.Shared && r.MaxShared > 0 && n.Shared >= r.MaxShared:
		n.Refused = store.RefusedShared
	default:
		s.holdLocked(r.Owner, r.ID, r.Shared, until)
		n.Owner++
		if r.Shared {
			n.Shared++
		}
	}
	return n, nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// CancelPlace implements [store.Quotas.CancelPlace].
func (s *Store) CancelPlace(_ context.Context, owner, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(); err != nil {
		return err
	}
	if r, ok := s.containers[id]; ok && r.Owner == owner && !expired(r.ForgetAt, s.now()) {
		return nil // recorded: the place is the record's
	}
	if _, ok := s.places[owner][id]; ok {
		s.unplaceLocked(owner, id)
	}
	return nil
}

// Places implements [store.Quotas.Places].
func (s *Store) Places(_ context.Context, owner string) (store.Places, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(); err != nil {
		return store.Places{}, err
	}
	return s.countLocked(owner), nil
}

// TakeToken implements [store.Quotas.TakeToken].
func (s *Store) TakeToken(_ context.Context, key string, b store.Bucket) (bool, time.Duration, error) {
	if b.PerMinute <= 0 {
		return false, 0, fmt.Errorf("%w: a bucket of %d a minute", errInvalid, b.PerMinute)
	}
	burst := float64(max(b.Burst, 1))
	rate := float64(b.PerMinute) / float64(time.Minute) // tokens per nanosecond
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(); err != nil {
		return false, 0, err
	}
	now := s.now()
	bk, ok := s.buckets[key]
	if !ok {
		if len(s.buckets) >= maxBuckets {
			s.dropFullLocked(now, rate, burst)
		}
		bk = bucket{tokens: burst, at: now}
	}
	bk.tokens = min(burst, bk.tokens+float64(max(now.Sub(bk.at), 0))*rate)
	bk.at = now
	if bk.tokens < 1 {
		s.buckets[key] = bk
		return false, time.Duration(math.Ceil((1 - bk.tokens) / rate)), nil
	}
	bk.tokens--
	s.buckets[key] = bk
	return true, 0, nil
}

// dropFullLocked forgets the buckets that have refilled: a new bucket starts full anyway.
func (s *Store) dropFullLocked(now time.Time, rate, burst float64) {
	for k, bk := range s.buckets {
		if bk.tokens+float64(max(now.Sub(bk.at), 0))*rate >= burst {
			delete(s.buckets, k)
		}
	}
}

var _ store.Quotas = (*Store)(nil)
