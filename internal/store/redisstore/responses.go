package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ciproxy/ciproxy/internal/store"
)

// responseRecord is resp:<id>. The JSON the client received is kept as it is, not re-encoded.
type responseRecord struct {
	ID          string            `json:"id"`
	Owner       string            `json:"owner"`
	UpstreamID  string            `json:"upstream_id,omitempty"`
	ContainerID string            `json:"container_id,omitempty"`
	Pending     []json.RawMessage `json:"pending,omitempty"`
	Body        json.RawMessage   `json:"body,omitempty"`
	Input       json.RawMessage   `json:"input,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	ExpiresAt   time.Time         `json:"expires_at,omitzero"`
}

// callRecord is call:<id>.
type callRecord struct {
	ID        string    `json:"id"`
	Owner     string    `json:"owner"`
	CallID    string    `json:"call_id"`
	Code      string    `json:"code"`
	Output    string    `json:"output"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// safeNameRE is the shape of a response or call id: 1 to 128 letters, digits, '_' or '-' (the
// embedded store's rule, so that both accept the same ids).
var safeNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

func safeName(id string) bool { return safeNameRE.MatchString(id) }

// PutResponse implements [store.Responses.PutResponse]. The calls and the response are written in
// one transaction, so that a reader never sees a response without its calls.
func (s *Store) PutResponse(ctx context.Context, r store.Response, calls []store.Call) error {
	if !safeName(r.ID) {
		return fmt.Errorf("%w: response id %q", store.ErrInvalid, r.ID)
	}
	for _, c := range calls {
		if !safeName(c.ID) {
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
	rb, err := json.Marshal(responseRecord{ID: r.ID, Owner: r.Owner, UpstreamID: r.UpstreamID, ContainerID: r.ContainerID,
		Pending: r.Pending, Body: r.Body, Input: r.Input, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt})
	if err != nil {
		return fmt.Errorf("%w: encoding response %s: %w", store.ErrInvalid, r.ID, err)
	}
	cbs := make([][]byte, len(calls))
	for i, c := range calls {
		if cbs[i], err = json.Marshal(callRecord{ID: c.ID, Owner: c.Owner, CallID: c.CallID, Code: c.Code, Output: c.Output, ExpiresAt: c.ExpiresAt}); err != nil {
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
	var r responseRecord
	if !safeName(id) {
		return store.Response{}, fmt.Errorf("response %q: %w", id, store.ErrNotFound)
	}
	if err := s.getJSON(ctx, s.key("resp", id), &r); err != nil {
		return store.Response{}, fmt.Errorf("response %s: %w", id, err)
	}
	if expiredMs(atMs(r.ExpiresAt), s.nowMs()) {
		return store.Response{}, fmt.Errorf("response %s: %w", id, store.ErrNotFound)
	}
	return store.Response{ID: r.ID, Owner: r.Owner, UpstreamID: r.UpstreamID, ContainerID: r.ContainerID, Pending: r.Pending,
		Body: r.Body, Input: r.Input, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt}, nil
}

// Call implements [store.Responses.Call].
func (s *Store) Call(ctx context.Context, id string) (store.Call, error) {
	if err := s.checkOpen(); err != nil {
		return store.Call{}, err
	}
	var c callRecord
	if !safeName(id) {
		return store.Call{}, fmt.Errorf("call %q: %w", id, store.ErrNotFound)
	}
	if err := s.getJSON(ctx, s.key("call", id), &c); err != nil {
		return store.Call{}, fmt.Errorf("call %s: %w", id, err)
	}
	if expiredMs(atMs(c.ExpiresAt), s.nowMs()) {
		return store.Call{}, fmt.Errorf("call %s: %w", id, store.ErrNotFound)
	}
	return store.Call{ID: c.ID, Owner: c.Owner, CallID: c.CallID, Code: c.Code, Output: c.Output, ExpiresAt: c.ExpiresAt}, nil
}

// DeleteResponse implements [store.Responses.DeleteResponse].
func (s *Store) DeleteResponse(ctx context.Context, id string) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	if !safeName(id) {
		return nil
	}
	return s.fail(ctx, s.rdb.Unlink(ctx, s.key("resp", id)).Err())
}

var _ store.Responses = (*Store)(nil)
