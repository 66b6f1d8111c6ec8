package intercept

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
)

// TestPlanContainer: the one rule for the container a request uses, on one replica and several:
// the tool's explicit id alone; else the latest live container of the conversation
// (previous_response_id's, then the input's calls, one named again counting where it is named
// last), at most maxReuseTries asked; else a new one.
func TestPlanContainer(t *testing.T) {
	const (
		a, b, c, d, e = "cntr_a", "cntr_b", "cntr_c", "cntr_d", "cntr_e"
	)
	ctx := context.Background()
	st := storetest.NewMemResponses(nil)
	if err := st.PutResponse(ctx, store.Response{ID: "resp_prev", Owner: "alice", UpstreamID: "up_1", ContainerID: a},
		[]store.Call{{ID: "ci_known", Owner: "alice", ContainerID: b, CallID: "call_1"}}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutResponse(ctx, store.Response{ID: "resp_bob", Owner: "bob", UpstreamID: "up_2", ContainerID: e}, nil); err != nil {
		t.Fatal(err)
	}
	call := func(id, container string) string {
		return `{"type":"code_interpreter_call","id":"` + id + `","container_id":"` + container + `","code":"1"}`
	}
	auto := `"tools":[{"type":"code_interpreter"}]`
	cases := []struct {
		name  string
		body  string
		live  []string // the containers live reports live
		want  string
		asked []string
	}{
		{"explicit, whatever lives", `{"model":"m","input":"x","previous_response_id":"resp_prev","tools":[{"type":"code_interpreter","container":"cntr_x"}]}`, []string{a}, "cntr_x", nil},
		{"previous response's", `{"model":"m","input":"x","previous_response_id":"resp_prev",` + auto + `}`, []string{a}, a, []string{a}},
		{"another owner's previous response", `{"model":"m","input":"x","previous_response_id":"resp_bob",` + auto + `}`, []string{e}, "", nil},
		{"the input's calls after the previous response", `{"model":"m","previous_response_id":"resp_prev","input":[` + call("ci_1", c) + `],` + auto + `}`, []string{a, c}, c, []string{c}},
		{"a stored call's container", `{"model":"m","input":[{"type":"item_reference","id":"ci_known"}],` + auto + `}`, []string{b}, b, []string{b}},
		{"the latest that lives", `{"model":"m","previous_response_id":"resp_prev","input":[` + call("ci_1", c) + `,` + call("ci_2", d) + `],` + auto + `}`, []string{a}, a, []string{d, c, a}},
		{"named again counts last", `{"model":"m","input":[` + call("ci_1", a) + `,` + call("ci_2", b) + `,` + call("ci_3", a) + `],` + auto + `}`, []string{a, b}, a, []string{a}},
		{"at most maxReuseTries asked", `{"model":"m","previous_response_id":"resp_prev","input":[` + call("ci_1", b) + `,` + call("ci_2", c) + `,` + call("ci_3", d) + `,` + call("ci_4", e) + `],` + auto + `}`, []string{a}, "", []string{e, d, c, b}},
		{"none lives: a new one", `{"model":"m","input":[` + call("ci_1", c) + `],` + auto + `}`, nil, "", []string{c}},
		{"no code_interpreter: none", `{"model":"m","previous_response_id":"resp_prev","input":"x"}`, []string{a}, "", nil},
	}
	eng := New(Options{Store: st})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := eng.Prepare(ctx, &Request{Config: activeConfig(), Body: []byte(tc.body), Caller: "alice"})
			if err != nil {
				t.Fatal(err)
			}
			var asked []string
			got, err := plan.Container(ctx, func(_ context.Context, id string) (bool, error) {
				asked = append(asked, id)
				return slices.Contains(tc.live, id), nil
			})
			if err != nil || got != tc.want || !slices.Equal(asked, tc.asked) {
				t.Errorf("Container = %q, %v, asking %v; want %q, asking %v", got, err, asked, tc.want, tc.asked)
			}
		})
	}
	t.Run("an error of live ends the search", func(t *testing.T) {
		plan, _ := eng.Prepare(ctx, &Request{Config: activeConfig(), Body: []byte(`{"model":"m","previous_response_id":"resp_prev","input":"x",` + auto + `}`), Caller: "alice"})
		boom := errors.New("boom")
		if _, err := plan.Container(ctx, func(context.Context, string) (bool, error) { return false, boom }); !errors.Is(err, boom) {
			t.Errorf("err = %v; want boom", err)
		}
	})
}

// countingStore counts the reads of stored responses and the call records written.
type countingStore struct {
	store.Responses
	responses, calls atomic.Int64
}

func (s *countingStore) Response(ctx context.Context, id string) (store.Response, error) {
	s.responses.Add(1)
	return s.Responses.Response(ctx, id)
}

func (s *countingStore) PutResponse(ctx context.Context, r store.Response, calls []store.Call) error {
	s.calls.Add(int64(len(calls)))
	return s.Responses.PutResponse(ctx, r, calls)
}

// TestPrepareReadsThePreviousResponseOnce: deciding, parsing and resolving read
// previous_response_id's record once.
func TestPrepareReadsThePreviousResponseOnce(t *testing.T) {
	ctx := context.Background()
	st := &countingStore{Responses: storetest.NewMemResponses(nil)}
	if err := st.PutResponse(ctx, store.Response{ID: "resp_prev", Owner: "alice", UpstreamID: "up_1", ContainerID: "cntr_a"}, nil); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{
		`{"model":"m","input":"x","previous_response_id":"resp_prev","tools":[{"type":"code_interpreter"}]}`,
		`{"model":"m","input":"x","previous_response_id":"resp_prev"}`,
	} {
		st.responses.Store(0)
		plan, err := New(Options{Store: st}).Prepare(ctx, &Request{Config: activeConfig(), Body: []byte(body), Caller: "alice"})
		if n := st.responses.Load(); err != nil || !plan.Intercepted || !plan.Minted || n != 1 {
			t.Errorf("%s: Prepare = %+v, %v after %d reads; want intercepted, minted, one read", body, plan, err, n)
		}
	}
}
