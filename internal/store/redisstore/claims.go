package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

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
	v, err := s.lua.claim.Run(ctx, s.rdb, []string{s.key("claim", key)}, s.prefix, now, holder, now+ms, ms).Result()
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
	return s.fail(ctx, s.lua.release.Run(ctx, s.rdb, []string{s.key("claim", key)}, s.prefix, s.nowMs(), holder).Err())
}

// Holder implements [store.Claims.Holder]. A lease past its end by the store's clock is free,
// whether or not Redis has expired its key yet.
func (s *Store) Holder(ctx context.Context, key string) (string, error) {
	if err := s.checkOpen(); err != nil {
		return "", err
	}
	v, err := s.rdb.Get(ctx, s.key("claim", key)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", s.fail(ctx, err)
	}
	until, holder, ok := strings.Cut(v, ":")
	ms, perr := strconv.ParseInt(until, 10, 64)
	if !ok || perr != nil {
		return "", fmt.Errorf("redis store: claim %s holds %q", key, v)
	}
	if s.nowMs() >= ms {
		return "", nil
	}
	return holder, nil
}

var _ store.Claims = (*Store)(nil)
