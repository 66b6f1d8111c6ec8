package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/ciproxy/ciproxy/internal/store"
)

// PutResponse implements [store.Responses.PutResponse]. The calls and the response are written in
// one transaction, so that a reader never sees a response without its calls.
func (s *Store) PutResponse(ctx context.Context, r store.Response, calls []store.Call) error {
	if !store.SafeID(r.ID) {
		return fmt.Errorf("%w: response id %q", store.ErrInvalid, r.ID)
	}
	for _, c := range calls {
		if !store.SafeID(c.ID) {
			return fmt.Errorf("%w: call id %q", store.ErrInvalid, c.ID)
		}
	}
	for _, raw := range append([]json.RawMessage{r.Body, r.Input}, r.Pending...) {
		if raw != nil && !json.Valid(raw) {
			return fmt.Errorf("%w: response %s holds JSON that does not parse", store.ErrInvalid, r.ID)
		}
	}
	if err := s.checkOpen(); err != nil {
		return err
	}
	now := s.nowMs()
	if r.CreatedAt.IsZero() {
		r.CreatedAt = s.now().Round(0)
	}
	rb, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("%w: encoding response %s: %w", store.ErrInvalid, r.ID, err)
	}
	cbs := make([][]byte, len(calls))
	for i, c := range calls {
		if cbs[i], err = json.Marshal(c); err != nil {
			return fmt.Errorf("%w: encoding call %s: %w", store.ErrInvalid, c.ID, err)
		}
	}
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range calls {
			p.Set(ctx, s.key("call", c.ID), cbs[i], ttl(atMs(c.ExpiresAt), now))
		}
		p.Set(ctx, s.key("resp", r.ID), rb, ttl(atMs(r.ExpiresAt), now))
		return nil
	})
	return s.fail(ctx, err)
}

// getJSON reads the record under key into v; a missing key is ErrNotFound.
func (s *Store) getJSON(ctx context.Context, key string, v any) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	b, err := s.rdb.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return store.ErrNotFound
	}
	if err != nil {
		return s.fail(ctx, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("redis store: %s: %w", key, err)
	}
	return nil
}

// Response implements [store.Responses.Response].
func (s *Store) Response(ctx context.Context, id string) (store.Response, error) {
	if err := s.checkOpen(); err != nil {
		return store.Response{}, err
	}
	var r store.Response
	if !store.SafeID(id) {
		return store.Response{}, fmt.Errorf("response %q: %w", id, store.ErrNotFound)
	}
	if err := s.getJSON(ctx, s.key("resp", id), &r); err != nil {
		return store.Response{}, fmt.Errorf("response %s: %w", id, err)
	}
	if expiredMs(atMs(r.ExpiresAt), s.nowMs()) {
		return store.Response{}, fmt.Errorf("response %s: %w", id, store.ErrNotFound)
	}
	return r, nil
}

// Call implements [store.Responses.Call].
func (s *Store) Call(ctx context.Context, id string) (store.Call, error) {
	if err := s.checkOpen(); err != nil {
		return store.Call{}, err
	}
	var c store.Call
	if !store.SafeID(id) {
		return store.Call{}, fmt.Errorf("call %q: %w", id, store.ErrNotFound)
	}
	if err := s.getJSON(ctx, s.key("call", id), &c); err != nil {
		return store.Call{}, fmt.Errorf("call %s: %w", id, err)
	}
	if expiredMs(atMs(c.ExpiresAt), s.nowMs()) {
		return store.Call{}, fmt.Errorf("call %s: %w", id, store.ErrNotFound)
	}
	return c, nil
}

// DeleteResponse implements [store.Responses.DeleteResponse].
func (s *Store) DeleteResponse(ctx context.Context, id string) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	if !store.SafeID(id) {
		return nil
	}
	return s.fail(ctx, s.rdb.Unlink(ctx, s.key("resp", id)).Err())
}

var _ store.Responses = (*Store)(nil)
