package intercept

import (
	"context"
	"sync"
	"time"
)

// Store remembers what the proxy needs to continue a conversation that it intercepted: which
// upstream response a client-visible response id stands for, which container it used, and the
// code_interpreter_call items it minted. Implementations are safe for concurrent use. The
// in-memory store is the default; OnStore puts the records in a store.Responses (the embedded
// store, or the shared one that lets several replicas serve one conversation).
//
// A record that does not exist is found false with a nil error; an error means the store could
// not answer (errors.Is(err, store.ErrUnavailable) when it cannot be reached), and the request
// fails with it rather than go on as if the record did not exist.
type Store interface {
	// Response returns the record stored under a response id minted by this proxy.
	Response(ctx context.Context, id string) (StoredResponse, bool, error)
	// Call returns the record of a code_interpreter_call item ("ci_...") minted by this proxy.
	Call(ctx context.Context, id string) (StoredCall, bool, error)
	// Put stores one finished response and its calls.
	Put(ctx context.Context, id string, r StoredResponse, calls map[string]StoredCall) error
	// Delete forgets what a response held (DELETE /v1/responses/{id}): its id stays known, with
	// its owner only, until it expires, so later requests naming it are answered as for a deleted
	// response rather than passed to an upstream that never heard of it. Its calls stay for
	// stateless replay.
	Delete(ctx context.Context, id string) error
}

// StoredResponse is what a client-visible response id maps to.
type StoredResponse struct {
	// Owner is the caller (hash of its key) that created the response; only it may continue.
	Owner string
	// UpstreamID is the id of the last upstream response of the loop.
	UpstreamID string
	// ContainerID is the cntr_ id of the container the response used ("" if none).
	ContainerID string
	// UpstreamID is "" for an upstream that keeps nothing (a Chat Completions upstream): the
	// proxy keeps the conversation in Pending instead.
	//
	// Pending holds the items sent upstream before the client's input when the conversation
	// continues. With UpstreamID set, the function_call_output items answering stand-in calls in
	// the last upstream response (it ended with a client function call beside ours). Without it,
	// the whole conversation as the upstream saw it: every input item, the model's turns and the
	// outputs of our calls (nil when the request had store false: nothing can continue it).
	Pending [][]byte
	// Body is the final Response as the client received it, kept when the request had store
	// true, for GET /v1/responses/{id}. Nil when it was not kept.
	Body []byte
	// Input is the JSON array of the request's input items as the client sent them, each with an
	// id, for GET /v1/responses/{id}/input_items; nil when not kept (store false).
	Input []byte
}

// size is the bytes of r's bodies, counted against a store's budget.
func (r StoredResponse) size() int {
	n := len(r.Body) + len(r.Input)
	for _, it := range r.Pending {
		n += len(it)
	}
	return n
}

// StoredCall is what the upstream saw of one code execution.
type StoredCall struct {
	Owner       string
	ContainerID string // the container the code ran in
	CallID      string // the upstream's call_id
	Code        string
	Output      string // the function_call_output text the model was given
}

// MemoryStore is the default Store: entries in memory, dropped after a TTL. Response bodies (the
// Response, its input items and a kept conversation) are kept up to a byte budget
// (MaxBodyBytes); past it, a response is remembered without them.
type MemoryStore struct {
	ttl time.Duration
	now func() time.Time
	// bodyBudget bounds the bytes of stored response bodies.
	bodyBudget int
	bodyBytes  int

	mu        sync.Mutex
	responses map[string]storedEntry[StoredResponse]
	calls     map[string]storedEntry[StoredCall]
	puts      int
}

type storedEntry[T any] struct {
	v       T
	expires time.Time
}

// NewMemoryStore returns a MemoryStore keeping entries for ttl (default 24h when ttl <= 0). now
// is the clock (nil: time.Now).
func NewMemoryStore(ttl time.Duration, now func() time.Time) *MemoryStore {
	if ttl <= 0 {
		ttl = 24 * time.Hour
	}
	if now == nil {
		now = time.Now
	}
	return &MemoryStore{ttl: ttl, now: now, bodyBudget: MaxBodyBytes, responses: map[string]storedEntry[StoredResponse]{}, calls: map[string]storedEntry[StoredCall]{}}
}

// MaxBodyBytes is the MemoryStore's budget for stored response bodies.
const MaxBodyBytes = 256 << 20

var _ Store = (*MemoryStore)(nil)

// Response implements [Store.Response].
func (s *MemoryStore) Response(_ context.Context, id string) (StoredResponse, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.responses[id]
	if !ok || !s.now().Before(e.expires) {
		return StoredResponse{}, false, nil
	}
	return e.v, true, nil
}

// Call implements [Store.Call].
func (s *MemoryStore) Call(_ context.Context, id string) (StoredCall, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.calls[id]
	if !ok || !s.now().Before(e.expires) {
		return StoredCall{}, false, nil
	}
	return e.v, true, nil
}

// Put implements [Store.Put]. Every 256 puts it sweeps expired entries, so memory stays bounded
// by the traffic of one TTL.
func (s *MemoryStore) Put(_ context.Context, id string, r StoredResponse, calls map[string]StoredCall) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	exp := now.Add(s.ttl)
	if s.bodyBytes+r.size() > s.bodyBudget {
		s.sweepLocked(now)
	}
	if s.bodyBytes+r.size() > s.bodyBudget {
		r.Body, r.Input = nil, nil
		if r.UpstreamID == "" {
			r.Pending = nil
		}
	}
	s.forgetLocked(id)
	s.bodyBytes += r.size()
	s.responses[id] = storedEntry[StoredResponse]{v: r, expires: exp}
	for k, c := range calls {
		s.calls[k] = storedEntry[StoredCall]{v: c, expires: exp}
	}
	s.puts++
	if s.puts%256 == 0 {
		s.sweepLocked(now)
	}
	return nil
}

// Delete implements [Store.Delete].
func (s *MemoryStore) Delete(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.responses[id]
	if !ok {
		return nil
	}
	s.forgetLocked(id)
	s.responses[id] = storedEntry[StoredResponse]{v: StoredResponse{Owner: e.v.Owner}, expires: e.expires}
	return nil
}

// forgetLocked drops a response and gives its body's bytes back to the budget.
func (s *MemoryStore) forgetLocked(id string) {
	if e, ok := s.responses[id]; ok {
		s.bodyBytes -= e.v.size()
		delete(s.responses, id)
	}
}

// sweepLocked drops expired entries.
func (s *MemoryStore) sweepLocked(now time.Time) {
	for k, e := range s.responses {
		if !now.Before(e.expires) {
			s.forgetLocked(k)
		}
	}
	for k, e := range s.calls {
		if !now.Before(e.expires) {
			delete(s.calls, k)
		}
	}
}

// Len returns the number of stored responses and calls (expired ones included until swept).
func (s *MemoryStore) Len() (responses, calls int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.responses), len(s.calls)
}
