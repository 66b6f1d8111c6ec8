package embedded

import (
	"context"
	"fmt"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
)

// claim is one lease. Claims live in memory only: they decide which process does some work, and
// with one process per data directory a restart leaves no one else to hold them.
type claim struct {
	holder string
	until  time.Time
}

// Claim implements [store.Claims.Claim].
func (s *Store) Claim(_ context.Context, key, holder string, ttl time.Duration) (bool, error) {
	if ttl <= 0 {
		return false, fmt.Errorf("%w: claim ttl %s", errInvalid, ttl)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(); err != nil {
		return false, err
	}
	now := s.now()
	if c, ok := s.claims[key]; ok && c.holder != holder && now.Before(c.until) {
		return false, nil
	}
	s.claims[key] = claim{holder: holder, until: now.Add(ttl)}
	return true, nil
}

// Release implements [store.Claims.Release].
func (s *Store) Release(_ context.Context, key, holder string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(); err != nil {
		return err
	}
	if c, ok := s.claims[key]; ok && c.holder == holder {
		delete(s.claims, key)
	}
	return nil
}

var _ store.Claims = (*Store)(nil)

// Holder implements [store.Claims.Holder].
func (s *Store) Holder(_ context.Context, key string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(); err != nil {
		return "", err
	}
	if c, ok := s.claims[key]; ok && s.now().Before(c.until) {
		return c.holder, nil
	}
	return "", nil
}
