package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
)

// Claim implements [store.Claims.Claim]. The lease ends by the store's clock (the key holds its
// end), and the key expires with it.
func (s *Store) Claim(ctx context.Context, key, holder string, ttl time.Duration) (bool, error) {
	if ttl <= 0 {
		return false, fmt.Errorf("%w: claim ttl %s", store.ErrInvalid, ttl)
	}
	if err := s.checkOpen(); err != nil {
		return false, err
	}
	ms := max(ttl.Milliseconds(), 1)
	now := s.nowMs()
	v, err := scriptClaim.Run(ctx, s.rdb, []string{s.key("claim", key)}, s.prefix, now, holder, now+ms, ms).Result()
	if err != nil {
		return false, s.fail(ctx, err)
	}
	st, _, err := status(v)
	return st == "ok", err
}

// Release implements [store.Claims.Release].
func (s *Store) Release(ctx context.Context, key, holder string) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	return s.fail(ctx, scriptRelease.Run(ctx, s.rdb, []string{s.key("claim", key)}, s.prefix, s.nowMs(), holder).Err())
}

var _ store.Claims = (*Store)(nil)
