package intercept

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
)

func TestOnStore(t *testing.T) {
	now := time.Date(2026, 8, 21, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	st, err := embedded.Open(embedded.Options{Dir: t.TempDir(), Now: clock, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	s := OnStore(st, time.Hour, clock)
	ctx := context.Background()

	if _, ok, err := s.Response(ctx, "resp_none"); ok || err != nil {
		t.Errorf("Response of an unknown id = %v, %v; want false, nil", ok, err)
	}
	sr := StoredResponse{Owner: "alice", UpstreamID: "up_1", ContainerID: "cntr_1",
		Pending: [][]byte{[]byte(`{"type":"function_call_output","call_id":"c","output":"1"}`)}, Body: []byte(`{"id":"resp_1"}`),
		Input: []byte(`[{"id":"msg_1","type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}]`)}
	calls := map[string]StoredCall{"ci_1": {Owner: "alice", ContainerID: "cntr_1", CallID: "call_1", Code: "1+1", Output: "2"}}
	if err := s.Put(ctx, "resp_1", sr, calls); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Response(ctx, "resp_1")
	if !ok || err != nil || got.Owner != "alice" || got.UpstreamID != "up_1" || got.ContainerID != "cntr_1" ||
		len(got.Pending) != 1 || string(got.Body) != `{"id":"resp_1"}` || string(got.Input) != string(sr.Input) {
		t.Errorf("Response = %+v, %v, %v", got, ok, err)
	}
	if c, ok, err := s.Call(ctx, "ci_1"); !ok || err != nil || c != calls["ci_1"] {
		t.Errorf("Call = %+v, %v, %v", c, ok, err)
	}
	// The call remembers the container it ran in, for whoever routes requests that replay it.
	if c, err := st.Call(ctx, "ci_1"); err != nil || c.ContainerID != "cntr_1" || !c.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Errorf("stored call = %+v, %v", c, err)
	}
	if r, err := st.Response(ctx, "resp_1"); err != nil || !r.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Errorf("stored response = %+v, %v; want it to expire after the TTL", r, err)
	}
	if err := s.Delete(ctx, "resp_1"); err != nil {
		t.Fatal(err)
	}
	// A deleted response stays known by id and owner only, until it would have expired.
	if d, ok, err := s.Response(ctx, "resp_1"); !ok || err != nil || d.Owner != "alice" || d.Body != nil || d.Input != nil || d.UpstreamID != "" {
		t.Errorf("Response after Delete = %+v, %v, %v", d, ok, err)
	}
	if r, err := st.Response(ctx, "resp_1"); err != nil || !r.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Errorf("the deleted response's record = %+v, %v; want its expiry kept", r, err)
	}
	if _, ok, _ := s.Call(ctx, "ci_1"); !ok {
		t.Error("Delete forgot the calls; they stay for stateless replay")
	}
}

// failingResponses is a store.Responses whose service cannot be reached.
type failingResponses struct{}

var errDown = fmt.Errorf("%w: redis: connection refused", store.ErrUnavailable)

func (failingResponses) PutResponse(context.Context, store.Response, []store.Call) error {
	return errDown
}
func (failingResponses) Response(context.Context, string) (store.Response, error) {
	return store.Response{}, errDown
}
func (failingResponses) Call(context.Context, string) (store.Call, error) {
	return store.Call{}, errDown
}
func (failingResponses) DeleteResponse(context.Context, string) error { return errDown }

// TestOnStoreUnavailable: a store that cannot answer is an error, never "not found".
func TestOnStoreUnavailable(t *testing.T) {
	s := OnStore(failingResponses{}, 0, nil)
	ctx := context.Background()
	if _, ok, err := s.Response(ctx, "resp_1"); ok || !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Response = %v, %v", ok, err)
	}
	if _, ok, err := s.Call(ctx, "ci_1"); ok || !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Call = %v, %v", ok, err)
	}
	if err := s.Put(ctx, "resp_1", StoredResponse{}, nil); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Put = %v", err)
	}
	if err := s.Delete(ctx, "resp_1"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Delete = %v", err)
	}

	// A request that names a previous response cannot be resolved, so it fails before any
	// upstream call; one that names none resolves without the store.
	req, aerr := parseRequest([]byte(`{"model":"m","previous_response_id":"resp_1","input":"hi","tools":[{"type":"code_interpreter"}]}`), config.Defaults().Interception, true)
	if aerr != nil {
		t.Fatal(aerr)
	}
	if err := req.resolve(lookup{ctx: ctx, store: s, caller: "alice"}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("resolve = %v; want the store's error", err)
	}
	req, _ = parseRequest([]byte(`{"model":"m","input":[{"type":"item_reference","id":"ci_1"}],"tools":[{"type":"code_interpreter"}]}`), config.Defaults().Interception, true)
	if err := req.resolve(lookup{ctx: ctx, store: s, caller: "alice"}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("resolve of a replayed call = %v; want the store's error", err)
	}
	req, _ = parseRequest([]byte(`{"model":"m","input":"hi","tools":[{"type":"code_interpreter"}]}`), config.Defaults().Interception, true)
	if err := req.resolve(lookup{ctx: ctx, store: s, caller: "alice"}); err != nil {
		t.Errorf("resolve of a request that needs no record = %v", err)
	}
}
