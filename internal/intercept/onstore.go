package intercept

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
)

// DefaultStoredTTL is how long OnStore keeps a response and its calls: the MemoryStore's default,
// so that a conversation continues for a day whichever store holds it.
const DefaultStoredTTL = 24 * time.Hour

// OnStore returns the Store that keeps its records in rs: the proxy's state store, on local disk
// or shared by several replicas. Each record expires ttl after it is put (DefaultStoredTTL when
// ttl <= 0), and the store frees its keys then. now is the clock (nil: time.Now).
func OnStore(rs store.Responses, ttl time.Duration, now func() time.Time) Store {
	if ttl <= 0 {
		ttl = DefaultStoredTTL
	}
	if now == nil {
		now = time.Now
	}
	return &onStore{rs: rs, ttl: ttl, now: now}
}

type onStore struct {
	rs  store.Responses
	ttl time.Duration
	now func() time.Time
}

func (s *onStore) Response(ctx context.Context, id string) (StoredResponse, bool, error) {
	r, err := s.rs.Response(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return StoredResponse{}, false, nil
	case err != nil:
		return StoredResponse{}, false, err
	}
	sr := StoredResponse{Owner: r.Owner, UpstreamID: r.UpstreamID, ContainerID: r.ContainerID, Body: r.Body, Input: r.Input}
	for _, p := range r.Pending {
		sr.Pending = append(sr.Pending, p)
	}
	return sr, true, nil
}

func (s *onStore) Call(ctx context.Context, id string) (StoredCall, bool, error) {
	c, err := s.rs.Call(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return StoredCall{}, false, nil
	case err != nil:
		return StoredCall{}, false, err
	}
	return StoredCall{Owner: c.Owner, ContainerID: c.ContainerID, CallID: c.CallID, Code: c.Code, Output: c.Output}, true, nil
}

func (s *onStore) Put(ctx context.Context, id string, r StoredResponse, calls map[string]StoredCall) error {
	exp := s.now().Add(s.ttl)
	rec := store.Response{ID: id, Owner: r.Owner, UpstreamID: r.UpstreamID, ContainerID: r.ContainerID,
		Body: r.Body, Input: r.Input, ExpiresAt: exp}
	for _, p := range r.Pending {
		rec.Pending = append(rec.Pending, json.RawMessage(p))
	}
	recs := make([]store.Call, 0, len(calls))
	for cid, c := range calls {
		container := c.ContainerID
		if container == "" {
			container = r.ContainerID
		}
		recs = append(recs, store.Call{ID: cid, Owner: c.Owner, CallID: c.CallID, ContainerID: container,
			Code: c.Code, Output: c.Output, ExpiresAt: exp})
	}
	return s.rs.PutResponse(ctx, rec, recs)
}

// Delete keeps the id and its owner until the response would have expired: what it held is gone.
func (s *onStore) Delete(ctx context.Context, id string) error {
	r, err := s.rs.Response(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	return s.rs.PutResponse(ctx, store.Response{ID: id, Owner: r.Owner, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt}, nil)
}
