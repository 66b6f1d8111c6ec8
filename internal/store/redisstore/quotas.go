package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
)

// sharedFlag is the scripts' shared argument for container c: "1" when any replica reaches its
// sandbox (its Host is ""), so that its place is also one of the deployment's shared places.
func sharedFlag(c store.Container) string {
	if c.Host == "" {
		return "1"
	}
	return "0"
}

// ReservePlace implements [store.Quotas.ReservePlace].
func (s *Store) ReservePlace(ctx context.Context, r store.PlaceRequest) (store.Places, error) {
	if !store.ContainerKind.Valid(r.ID) || r.TTL <= 0 {
		return store.Places{}, fmt.Errorf("%w: place for %q for %s", store.ErrInvalid, r.ID, r.TTL)
	}
	if err := s.checkOpen(); err != nil {
		return store.Places{}, err
	}
	shared := "0"
	if r.Shared {
		shared = "1"
	}
	now := s.now()
	v, err := s.lua.reservePlace.Run(ctx, s.rdb, []string{s.ownerKey(r.Owner, "places")}, s.prefix, now.UnixMilli(),
		r.ID, max(r.MaxPerOwner, 0), max(r.MaxShared, 0), shared, atMs(now.Add(r.TTL))).Result()
	if err != nil {
		return store.Places{}, s.fail(ctx, err)
	}
	st, rest, err := status(v)
	if err != nil {
		return store.Places{}, err
	}
	if len(rest) != 2 {
		return store.Places{}, fmt.Errorf("redis store: unexpected reply %v", v)
	}
	p := store.Places{Owner: int(asInt(rest[0])), Shared: int(asInt(rest[1]))}
	switch st {
	case "ok":
	case "owner":
		p.Refused = store.RefusedOwner
	case "shared":
		p.Refused = store.RefusedShared
	default:
		return store.Places{}, fmt.Errorf("redis store: unexpected reply %v", v)
	}
	return p, nil
}

// CancelPlace implements [store.Quotas.CancelPlace].
func (s *Store) CancelPlace(ctx context.Context, owner, id string) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	if !store.ContainerKind.Valid(id) {
		return nil
	}
	err := s.lua.cancelPlace.Run(ctx, s.rdb, []string{s.ownerKey(owner, "places"), s.key("cntr", id)}, s.prefix, s.nowMs(),
		id, owner).Err()
	return s.fail(ctx, err)
}

// Places implements [store.Quotas.Places].
func (s *Store) Places(ctx context.Context, owner string) (store.Places, error) {
	if err := s.checkOpen(); err != nil {
		return store.Places{}, err
	}
	v, err := s.lua.places.Run(ctx, s.rdb, []string{s.ownerKey(owner, "places")}, s.prefix, s.nowMs()).Result()
	if err != nil {
		return store.Places{}, s.fail(ctx, err)
	}
	st, rest, err := status(v)
	if err != nil {
		return store.Places{}, err
	}
	if st != "ok" || len(rest) != 2 {
		return store.Places{}, fmt.Errorf("redis store: unexpected reply %v", v)
	}
	return store.Places{Owner: int(asInt(rest[0])), Shared: int(asInt(rest[1]))}, nil
}

// TakeToken implements [store.Quotas.TakeToken]. The bucket is bucket:<key> (key with '%' and
// ':' percent-encoded), timed by Redis's clock (see lua/take_token.lua), and it expires when it has
// refilled.
func (s *Store) TakeToken(ctx context.Context, key string, b store.Bucket) (bool, time.Duration, error) {
	if b.PerMinute <= 0 {
		return false, 0, fmt.Errorf("%w: a bucket of %d a minute", store.ErrInvalid, b.PerMinute)
	}
	if err := s.checkOpen(); err != nil {
		return false, 0, err
	}
	v, err := s.lua.takeToken.Run(ctx, s.rdb, []string{s.key("bucket", escapeOwner(key))}, s.prefix, s.nowMs(),
		b.PerMinute, max(b.Burst, 1)).Result()
	if err != nil {
		return false, 0, s.fail(ctx, err)
	}
	st, rest, err := status(v)
	switch {
	case err != nil:
		return false, 0, err
	case st == "ok":
		return true, 0, nil
	case st == "wait" && len(rest) == 1:
		return false, time.Duration(max(asInt(rest[0]), 1)) * time.Millisecond, nil
	}
	return false, 0, fmt.Errorf("redis store: unexpected reply %v", v)
}

// asInt is an integer reply element (0 for anything else).
func asInt(v any) int64 {
	n, _ := v.(int64)
	return n
}

var _ store.Quotas = (*Store)(nil)
