package intercept

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"regexp"
	"testing"
	"time"

	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sse"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/streamcheck"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// checkStream validates a client stream against OpenAI's rules and returns its report.
func checkStream(t *testing.T, raw []byte) streamcheck.Report {
	t.Helper()
	rep, err := streamcheck.Check(raw)
	if err != nil {
		t.Fatalf("stream check: %v\n%s", err, raw)
	}
	return rep
}

var volatile = regexp.MustCompile(`((ci|msg|rs|fc)_[0-9a-f]{48}|call_[A-Za-z0-9]+|cntr_[A-Za-z0-9_\-]+)`)

// normalized returns resp with the ids and times the proxy mints replaced, for comparison.
func normalized(t *testing.T, resp []byte) any {
	t.Helper()
	resp, _ = sjson.SetBytes(resp, "id", "resp_X")
	resp, _ = sjson.SetBytes(resp, "created_at", 0)
	resp, _ = sjson.DeleteBytes(resp, "completed_at")
	resp = volatile.ReplaceAll(resp, []byte("X"))
	var v any
	if err := json.Unmarshal(resp, &v); err != nil {
		t.Fatalf("response is not JSON: %v: %s", err, resp)
	}
	return v
}

func TestStreamAndJSONGiveTheSameResponse(t *testing.T) {
	forEachAPI(t, testStreamAndJSONGiveTheSameResponse)
}

func testStreamAndJSONGiveTheSameResponse(t *testing.T, api upstreamAPI) {
	u := &upstreamtest.Usage{InputTokens: 10, OutputTokens: 5}
	tests := []struct {
		name  string
		extra string
		turns []upstreamtest.Turn
	}{
		{"text only", "", []upstreamtest.Turn{{Items: []upstreamtest.Item{upstreamtest.Text("hi")}, Usage: u}}},
		{"one call", `"include":["code_interpreter_call.outputs"]`, []upstreamtest.Turn{{Items: []upstreamtest.Item{call("print(3)")}, Usage: u}, {Items: []upstreamtest.Item{upstreamtest.Text("3")}, Usage: u}}},
		{"reasoning, parallel calls, outputs null", `"reasoning":{"effort":"low"}`, []upstreamtest.Turn{
			{Items: []upstreamtest.Item{upstreamtest.Reasoning("think"), call("a = 1"), call("a + 1")}, Usage: u},
			{Items: []upstreamtest.Item{upstreamtest.Reasoning(""), upstreamtest.Text("2")}, Usage: u}}},
		{"unparseable call", "", []upstreamtest.Turn{{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", `{"code":"print(1)`)}, Usage: u}, {Items: []upstreamtest.Item{upstreamtest.Text("oops")}, Usage: u}}},
		{"a client function", "", []upstreamtest.Turn{{Items: []upstreamtest.Item{call("1"), upstreamtest.FunctionCall("get_weather", `{"city":"Oslo"}`)}, Usage: u}}},
		{"incomplete", "", []upstreamtest.Turn{{Items: []upstreamtest.Item{upstreamtest.Text("long")}, Usage: u, Incomplete: "max_output_tokens"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got [2]any
			for i, stream := range []bool{false, true} {
				h := newHarness(t, onAPI(api))
				h.up.Enqueue(tt.turns...)
				extra := tt.extra
				if stream {
					if extra != "" {
						extra += ","
					}
					extra += `"stream":true`
				}
				b := `{"model":"gpt-test","input":"go","tools":[{"type":"code_interpreter","container":{"type":"auto"}},` + weatherTool + `]`
				if extra != "" {
					b += "," + extra
				}
				status, raw := h.post(b+"}", "k")
				if status != 200 {
					t.Fatalf("stream=%v: status %d: %s", stream, status, raw)
				}
				resp := raw
				if stream {
					resp = checkStream(t, raw).Response
				}
				got[i] = normalized(t, resp)
			}
			if !reflect.DeepEqual(got[0], got[1]) {
				j0, _ := json.Marshal(got[0])
				j1, _ := json.Marshal(got[1])
				t.Errorf("JSON and stream differ:\njson:   %s\nstream: %s", j0, j1)
			}
		})
	}
}

// TestClientDisconnect runs with fake containers and, where it can, with the local sandbox, so
// the real deletion is checked too.
func TestClientDisconnect(t *testing.T) { forEachAPI(t, testClientDisconnect) }

func testClientDisconnect(t *testing.T, api upstreamAPI) {
	idle0 := withConfig(func(c *config.Config) { c.Interception.ContainerIdleTimeout = 0 })
	for _, sb := range []struct {
		name string
		opts []harnessOpt
	}{{"fake", nil}, {"local", []harnessOpt{withLocal()}}} {
		t.Run(sb.name+": during an execution the sandbox is released", func(t *testing.T) {
			h := newHarness(t, append(sb.opts, idle0, onAPI(api))...)
			if h.fake != nil {
				h.fake.setRun(func(ctx context.Context, _ string) (sandbox.Result, error) {
					<-ctx.Done() // the sleep below, cut short by the client leaving
					return sandbox.Result{}, ctx.Err()
				})
			}
			h.up.Enqueue(calls("import time; time.sleep(60)"))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp := h.do(ctx, body(`"stream":true`), "k")
			readUntil(t, resp.Body, "response.code_interpreter_call.interpreting")
			if n := h.live(); n != 1 {
				t.Fatalf("live containers during the run = %d; want 1", n)
			}
			cancel()
			resp.Body.Close()
			testutil.Eventually(t, "the container to be deleted", func() bool { return h.live() == 0 })
			if n := len(h.up.Requests()); n != 1 {
				t.Errorf("upstream calls = %d; want 1 (no follow-up after the client left)", n)
			}
		})

		t.Run(sb.name+": during an upstream call the upstream is cancelled", func(t *testing.T) {
			h := newHarness(t, append(sb.opts, idle0, onAPI(api))...)
			upstreamGone := make(chan struct{})
			h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("hello world")}, BeforeEvent: func(ctx context.Context, seq int, typ string) error {
				if seq == 4 {
					<-ctx.Done()
					close(upstreamGone)
					return ctx.Err()
				}
				return nil
			}})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp := h.do(ctx, body(`"stream":true`), "k")
			readUntil(t, resp.Body, "response.output_item.added")
			cancel()
			resp.Body.Close()
			select {
			case <-upstreamGone:
			case <-time.After(10 * time.Second):
				t.Fatal("the upstream call was not cancelled")
			}
			testutil.Eventually(t, "the auto container to be released", func() bool { return h.live() == 0 })
		})
	}
}

// readUntil reads client events until one of type typ.
func readUntil(t *testing.T, r io.Reader, typ string) {
	t.Helper()
	rd := sse.NewReader(r)
	for {
		ev, err := rd.Next()
		if errors.Is(err, io.EOF) || err != nil {
			t.Fatalf("stream ended before %s: %v", typ, err)
		}
		if ev.Name == typ {
			return
		}
	}
}
