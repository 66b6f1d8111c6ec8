package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
)

// MemResponses is a store.Responses in memory, for unit tests and benchmarks of the code that keeps
// responses, where a store on disk would be most of what they measure. It keeps the interface's
// contract as the real stores do (RunResponses holds it to it): ids and JSON are checked, records
// are copied in and out, and a record is gone from its ExpiresAt on.
type MemResponses struct {
	now func() time.Time

	mu        sync.Mutex
	responses map[string]store.Response
	calls     map[string]store.Call
}

// NewMemResponses returns an empty MemResponses reading the clock now (nil: time.Now).
func NewMemResponses(now func() time.Time) *MemResponses {
	if now == nil {
		now = time.Now
	}
	return &MemResponses{now: now, responses: map[string]store.Response{}, calls: map[string]store.Call{}}
}

var _ store.Responses = (*MemResponses)(nil)

// PutResponse implements [store.Responses.PutResponse].
func (m *MemResponses) PutResponse(ctx context.Context, r store.Response, calls []store.Call) error {
	if !store.SafeID(r.ID) {
		return fmt.Errorf("%w: response id %q", store.ErrInvalid, r.ID)
	}
	for _, c := range calls {
		if !store.SafeID(c.ID) {
			return fmt.Errorf("%w: call id %q", store.ErrInvalid, c.ID)
		}
	}
	if !validJSON(r.Body) || !validJSON(r.Input) {
		return fmt.Errorf("%w: response %s holds JSON that does not parse", store.ErrInvalid, r.ID)
	}
	for _, p := range r.Pending {
		if !validJSON(p) {
			return fmt.Errorf("%w: response %s holds JSON that does not parse", store.ErrInvalid, r.ID)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = m.now()
	}
	r = copyResponse(r)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range calls {
		m.calls[c.ID] = c
	}
	m.responses[r.ID] = r
	return nil
}

// Response implements [store.Responses.Response].
func (m *MemResponses) Response(_ context.Context, id string) (store.Response, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.responses[id]
	if !ok || m.expired(r.ExpiresAt) {
		return store.Response{}, fmt.Errorf("response %q: %w", id, store.ErrNotFound)
	}
	return copyResponse(r), nil
}

// Call implements [store.Responses.Call].
func (m *MemResponses) Call(_ context.Context, id string) (store.Call, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.calls[id]
	if !ok || m.expired(c.ExpiresAt) {
		return store.Call{}, fmt.Errorf("call %q: %w", id, store.ErrNotFound)
	}
	return c, nil
}

// DeleteResponse implements [store.Responses.DeleteResponse].
func (m *MemResponses) DeleteResponse(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.responses, id)
	return nil
}

func (m *MemResponses) expired(at time.Time) bool { return !at.IsZero() && !m.now().Before(at) }

func validJSON(raw json.RawMessage) bool { return raw == nil || json.Valid(raw) }

// copyResponse returns r with bytes of its own, as a store that encodes what it keeps hands out.
func copyResponse(r store.Response) store.Response {
	r.Body, r.Input = bytes.Clone(r.Body), bytes.Clone(r.Input)
	if r.Pending != nil {
		// One buffer for every item: a kept conversation is many small ones.
		n := 0
		for _, it := range r.Pending {
			n += len(it)
		}
		buf := make([]byte, 0, n)
		p := make([]json.RawMessage, len(r.Pending))
		for i, it := range r.Pending {
			if it != nil {
				buf = append(buf, it...)
				p[i] = buf[len(buf)-len(it) : len(buf) : len(buf)]
			}
		}
		r.Pending = p
	}
	return r
}
