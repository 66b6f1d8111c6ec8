package intercept

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
)

// TestStoredRecords: what the engine keeps of a response in the state store (here the embedded
// one): its owner, upstream response, container, body and input, and each call that ran with its
// container, all for a day; a DELETE keeps the id and its owner only, until it would have expired,
// and the calls for stateless replay; past the day nothing is found.
func TestStoredRecords(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 8, 21, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	st, err := embedded.Open(embedded.Options{Dir: t.TempDir(), Now: clock, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	h := newHarness(t)
	h.eng.store, h.eng.now = st, clock
	ctx := context.Background()

	if _, ok, err := readResponse(ctx, st, "resp_none"); ok || err != nil {
		t.Errorf("readResponse of an unknown id = %v, %v; want false, nil", ok, err)
	}
	cid := h.container("alice")
	h.up.Enqueue(calls("1+1"), text("2."))
	status, resp := h.post(bodyIn(cid, ""), "alice")
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, resp)
	}
	id := gjson.GetBytes(resp, "id").String()
	ci := gjson.GetBytes(resp, `output.#(type=="code_interpreter_call").id`).String()
	day := now.Add(storedTTL)

	got, ok, err := readResponse(ctx, st, id)
	if !ok || err != nil || got.Owner != "alice" || got.UpstreamID == "" || got.ContainerID != cid ||
		got.Body == nil || gjson.GetBytes(got.Body, "id").String() != id || gjson.GetBytes(got.Input, "0.type").String() != "message" ||
		!got.ExpiresAt.Equal(day) {
		t.Errorf("the stored response = %+v, %v, %v; want alice's, its upstream id, container %s, body and input, for a day", got, ok, err, cid)
	}
	// The call remembers the container it ran in, for whoever routes requests that replay it.
	if c, ok, err := readCall(ctx, st, ci); !ok || err != nil || c.Owner != "alice" || c.ContainerID != cid || c.CallID == "" ||
		c.Code != "1+1" || c.Output == "" || !c.ExpiresAt.Equal(day) {
		t.Errorf("the stored call %s = %+v, %v, %v; want alice's, run in %s, for a day", ci, c, ok, err, cid)
	}

	rec := httptest.NewRecorder()
	if err := h.eng.ServeStored(rec, httptest.NewRequest(http.MethodDelete, "/v1/responses/"+id, nil), id, "alice"); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("DELETE = %d, %v", rec.Code, err)
	}
	// A deleted response stays known by id and owner only, until it would have expired.
	if d, ok, err := readResponse(ctx, st, id); !ok || err != nil || d.Owner != "alice" || d.Body != nil || d.Input != nil ||
		d.UpstreamID != "" || d.Pending != nil || !d.ExpiresAt.Equal(day) || !d.CreatedAt.Equal(got.CreatedAt) {
		t.Errorf("the response after DELETE = %+v, %v, %v; want its id and owner, its expiry kept", d, ok, err)
	}
	if _, ok, _ := readCall(ctx, st, ci); !ok {
		t.Error("DELETE forgot the calls; they stay for stateless replay")
	}

	mu.Lock()
	now = day
	mu.Unlock()
	if _, ok, err := readResponse(ctx, st, id); ok || err != nil {
		t.Errorf("the response after its day = %v, %v; want gone", ok, err)
	}
	if _, ok, err := readCall(ctx, st, ci); ok || err != nil {
		t.Errorf("the call after its day = %v, %v; want gone", ok, err)
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

// TestStoreUnavailable: a store that cannot answer is an error, never "not found".
func TestStoreUnavailable(t *testing.T) {
	var s failingResponses
	ctx := context.Background()
	if _, ok, err := readResponse(ctx, s, "resp_1"); ok || !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("readResponse = %v, %v", ok, err)
	}
	if _, ok, err := readCall(ctx, s, "ci_1"); ok || !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("readCall = %v, %v", ok, err)
	}
	if ok, err := New(Options{Store: s}).Minted(ctx, "resp_1"); ok || !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Minted = %v, %v", ok, err)
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

	// A response that cannot be stored is not given to the client: its id could not be continued.
	h := newHarness(t)
	h.eng.store = s
	h.up.Enqueue(text("Hi."))
	if status, resp := h.post(body(""), "alice"); status < 500 || gjson.GetBytes(resp, "id").String() != "" {
		t.Errorf("a response the store refused = %d %s; want an error", status, resp)
	}
}
