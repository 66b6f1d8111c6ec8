package intercept

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

var containerIDs = regexp.MustCompile(`cntr_[A-Za-z0-9_\-]+`)

// TestTranslateGolden replays testdata/translate/<case>.upstream.sse (one upstream stream per
// loop iteration, separated by a ": next upstream call" comment) through the loop, with code
// running in the local sandbox, and compares the client stream with <case>.client.sse. Response
// and item ids are made predictable; container ids are replaced by cntr_X. Run with -update to
// regenerate the client streams.
func TestTranslateGolden(t *testing.T) {
	ups, _ := filepath.Glob("testdata/translate/*.upstream.sse")
	if len(ups) == 0 {
		t.Fatal("no golden cases")
	}
	reg, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "local", Provider: sandboxes.Provider(t), Backend: "local", HostBound: true})
	if err != nil {
		t.Fatal(err)
	}
	sess := newSessions(t, reg)
	defer sess.Close(context.Background())
	e := New(Options{Containers: sess, Store: storetest.NewMemResponses(nil)})
	ic := config.Defaults().Interception
	ic.ExecutionTimeout = 20 * time.Second
	ic.ContainerIdleTimeout = time.Minute
	// One container serves every case: kernel start-ups dominate the test's time.
	c, err := sess.Create(context.Background(), "local", "golden", sandbox.CreateOptions{}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sess.Release(context.Background(), c)

	for _, up := range ups {
		name := strings.TrimSuffix(up, ".upstream.sse")
		t.Run(filepath.Base(name), func(t *testing.T) {
			raw, err := os.ReadFile(up)
			if err != nil {
				t.Fatal(err)
			}
			var bodies [][]byte
			for _, part := range strings.Split(string(raw), ": next upstream call\n\n") {
				bodies = append(bodies, []byte(part))
			}
			client := []byte(`{"model":"gpt-test","input":"x","stream":true,"include":["code_interpreter_call.outputs"],"tools":[{"type":"code_interpreter","container":"` + c.ID() + `"}]}`)
			req, aerr := parseRequest(client, ic, true)
			if aerr != nil {
				t.Fatal(aerr)
			}
			req.resolve(lookup{ctx: context.Background()})
			w := httptest.NewRecorder()
			rend := newSSERenderer(w, zap.NewNop())
			n := 0
			mint := func(prefix string) string {
				if prefix == "resp_" {
					return "resp_golden"
				}
				n++
				return fmt.Sprintf("%sgolden%d", prefix, n)
			}
			r := e.newRun(ic, "local", &cannedUpstream{bodies: bodies, stream: true}, "golden", http.Header{}, req, rend.emit, mint)
			ctx := context.Background()
			if aerr := r.startContainer(ctx); aerr != nil {
				t.Fatal(aerr)
			}
			err = r.loop(ctx)
			r.releaseContainer(ctx)
			if err != nil {
				t.Fatalf("loop: %v", err)
			}
			got := containerIDs.ReplaceAll(w.Body.Bytes(), []byte("cntr_X"))
			checkStream(t, got)
			golden := name + ".client.sse"
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs; got:\n%s", golden, got)
			}
		})
	}
}

func TestTranslatorLenientUpstreams(t *testing.T) {
	fc := `{"id":"fc_1","type":"function_call","status":"in_progress","arguments":"","call_id":"call_1","name":"python"}`
	fcDone := `{"id":"fc_1","type":"function_call","status":"completed","arguments":"{\"code\":\"1+1\"}","call_id":"call_1","name":"python"}`
	tests := []struct {
		name   string
		events []string
	}{
		{"no output_item.done: the final response finishes the call", []string{
			`{"type":"response.output_item.added","output_index":0,"item":` + fc + `}`,
			`{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"{\"code\":\"1+"}`,
			`{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"1\"}"}`,
			`{"type":"response.completed","response":{"id":"up_1","status":"completed","output":[` + fcDone + `]}}`,
		}},
		{"deltas named by output_index only", []string{
			`{"type":"response.output_item.added","output_index":0,"item":` + fc + `}`,
			`{"type":"response.function_call_arguments.delta","output_index":0,"delta":"{\"code\":\"1+1\"}"}`,
			`{"type":"response.output_item.done","output_index":0,"item":` + fcDone + `}`,
			`{"type":"response.completed","response":{"id":"up_1","status":"completed","output":[` + fcDone + `]}}`,
		}},
		{"no added event and no deltas", []string{
			`{"type":"response.output_item.done","output_index":0,"item":` + fcDone + `}`,
			`{"type":"response.completed","response":{"id":"up_1","status":"completed","output":[` + fcDone + `]}}`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, aerr := parseRequest([]byte(body(`"stream":true`)), config.Defaults().Interception, true)
			if aerr != nil {
				t.Fatal(aerr)
			}
			req.resolve(lookup{ctx: context.Background()})
			tr := newTranslator(req, "resp_t", 1, nil)
			tr.begin(false)
			asked := 0
			var code strings.Builder
			for _, ev := range tt.events {
				evs, err := tr.event([]byte(ev))
				if errors.Is(err, errNeedContainer) {
					if len(evs) != 0 {
						t.Fatalf("events %v beside errNeedContainer", evs)
					}
					asked++
					tr.setContainer("cntr_t") // as the loop does, once the container is open
					evs, err = tr.event([]byte(ev))
				}
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range evs {
					data := e.appendJSON(nil, 0)
					if strings.Contains(string(data), `"python"`) {
						t.Errorf("the stand-in leaked: %s", data)
					}
					if strings.Contains(string(data), `"container_id":""`) {
						t.Errorf("a call item without its container: %s", data)
					}
					if e.Type == "response.code_interpreter_call_code.delta" {
						code.WriteString(gjsonString(data, "delta"))
					}
				}
			}
			p := tr.calls()
			if !tr.ended() || len(p) != 1 || p[0].code != "1+1" || p[0].callID != "call_1" || code.String() != "1+1" {
				t.Fatalf("ended %v, calls %d, deltas %q", tr.ended(), len(p), code.String())
			}
			if asked != 1 {
				t.Errorf("the container was asked for %d times; want once, before the call started", asked)
			}
		})
	}
}

func gjsonString(data []byte, path string) string { return gjson.GetBytes(data, path).String() }

// TestTranslatorNeedsNoContainerWithoutACall: text and the client's own calls never make the
// translator ask for the container, so a request that runs no code never waits for one.
func TestTranslatorNeedsNoContainerWithoutACall(t *testing.T) {
	req, aerr := parseRequest([]byte(body(`"stream":true`)), config.Defaults().Interception, true)
	if aerr != nil {
		t.Fatal(aerr)
	}
	req.resolve(lookup{ctx: context.Background()})
	tr := newTranslator(req, "resp_t", 1, nil)
	tr.begin(false)
	weather := `{"id":"fc_1","type":"function_call","status":"completed","arguments":"{}","call_id":"call_1","name":"get_weather"}`
	for _, ev := range []string{
		`{"type":"response.created","response":{"id":"up_1","status":"in_progress","output":[]}}`,
		`{"type":"response.output_item.added","output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","content":[],"role":"assistant"}}`,
		`{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"hi"}`,
		`{"type":"response.output_item.added","output_index":1,"item":` + weather + `}`,
		`{"type":"response.output_item.done","output_index":1,"item":` + weather + `}`,
		`{"type":"response.completed","response":{"id":"up_1","status":"completed","output":[{"id":"msg_1","type":"message","status":"completed","content":[],"role":"assistant"},` + weather + `]}}`,
	} {
		if _, err := tr.event([]byte(ev)); err != nil {
			t.Fatalf("event(%s) = %v", ev, err)
		}
	}
	if !tr.ended() || len(tr.calls()) != 0 || !tr.clientCalls() {
		t.Errorf("ended %v, stand-in calls %d, client calls %v; want ended, none, the client's", tr.ended(), len(tr.calls()), tr.clientCalls())
	}
}

// TestTranslatorCompletedAt: an upstream's answer in one piece (its Response finished, with
// completed_at) still shows the client an in-progress Response first, with completed_at null;
// the completed one keeps the upstream's.
func TestTranslatorCompletedAt(t *testing.T) {
	req, aerr := parseRequest([]byte(body(`"stream":true`)), config.Defaults().Interception, true)
	if aerr != nil {
		t.Fatal(aerr)
	}
	req.resolve(lookup{ctx: context.Background()})
	tr := newTranslator(req, "resp_t", 1, nil)
	tr.begin(false)
	evs, err := tr.event([]byte(`{"type":"response.completed","response":{"id":"up_1","status":"completed","completed_at":1767225700,"output":[]}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if got := gjson.GetBytes(e.appendJSON(nil, 0), "response.completed_at"); e.Type == evCreated || e.Type == evInProgress {
			if got.Type != gjson.Null {
				t.Errorf("%s: completed_at %s; want null", e.Type, got.Raw)
			}
		}
	}
	if got := gjson.GetBytes(tr.completed().Response, "completed_at").Int(); got != 1767225700 {
		t.Errorf("the final Response's completed_at = %d; want the upstream's", got)
	}
}

// TestOutputIndexBounds: an upstream event whose output_index is negative or far past the
// items so far is malformed; nothing is allocated for it, and nothing panics.
func TestOutputIndexBounds(t *testing.T) {
	for _, tc := range []struct {
		index string
		ok    bool
	}{
		{"0", true},
		{strconv.Itoa(maxIndexGap), true},
		{strconv.Itoa(maxIndexGap + 1), false},
		{"-1", false},
		{"100000000000", false},
	} {
		for _, typ := range []string{"response.output_item.added", "response.output_item.done", "response.function_call_arguments.delta", "response.output_text.done"} {
			tr := newTranslator(&parsedRequest{code: true, fn: "python"}, "resp_1", 0, nil)
			tr.begin(false)
			ev := `{"type":"` + typ + `","output_index":` + tc.index + `,"content_index":0,"item_id":"x","delta":"a","text":"a",` +
				`"item":{"type":"message","id":"m","status":"completed","role":"assistant","content":[]}}`
			_, err := tr.event([]byte(ev))
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, upstream.ErrMalformed)) {
				t.Errorf("%s at output_index %s: %v", typ, tc.index, err)
			}
			if len(tr.out) > maxIndexGap+1 {
				t.Errorf("%s at output_index %s: %d items allocated", typ, tc.index, len(tr.out))
			}
		}
	}
}

// TestHeldEventsBounded: what the model streams after a call in the same turn is held until the
// call has run; past the bound the answer is malformed, so a model that goes on and on cannot
// make the proxy hold it all.
func TestHeldEventsBounded(t *testing.T) {
	tr := newTranslator(&parsedRequest{code: true, fn: "python"}, "resp_1", 0, nil)
	tr.maxHeld = 4 << 10
	tr.setContainer("cntr_x")
	tr.begin(false)
	feed := func(ev string) ([]Event, error) { return tr.event([]byte(ev)) }
	if evs, err := feed(`{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"fc","call_id":"c","name":"python","arguments":""}}`); err != nil || len(evs) == 0 {
		t.Fatalf("the call: %d events, %v; want it shown live", len(evs), err)
	}
	if evs, err := feed(`{"type":"response.output_item.added","output_index":1,"item":{"type":"message","id":"m","role":"assistant","content":[]}}`); err != nil || len(evs) != 0 {
		t.Fatalf("the message after the call: %d events, %v; want it held", len(evs), err)
	}
	delta := `{"type":"response.output_text.delta","output_index":1,"item_id":"m","content_index":0,"delta":"` + strings.Repeat("x", 1000) + `"}`
	var err error
	for i := 0; i < 10 && err == nil; i++ {
		_, err = feed(delta)
	}
	if !errors.Is(err, upstream.ErrMalformed) {
		t.Fatalf("10 KB held with a 4 KB bound: %v", err)
	}
	if got := len(tr.release(-1)); got < 2 {
		t.Errorf("released %d events; want the held ones", got)
	}
}
