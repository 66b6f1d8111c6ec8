package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/streamcheck"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestChaos drives many intercepted requests through the whole proxy (run(), in process) while
// faults are injected at random points: clients that leave before, during and after an
// execution; upstream 5xx, 429, hangs, cut streams and failed responses; sandbox creates and
// executions that fail, stall or are cut (the e2b emulator's knobs); config reloads that switch
// the interception between the local and the e2b sandbox tool. Then it checks that no sandbox was
// leaked, that every client got a complete response or an OpenAI-shaped error, that the proxy
// still serves, and that shutdown returns 0 without leaking a goroutine.
//
// Leak accounting uses three independent views: the emulator's own count of e2b sandboxes (and
// its exec provider's kernels), the proxy's ciproxy_sandbox_containers gauge, and the processes:
// every local sandbox is a bubblewrap process started by this test process, so the direct
// children of this process are exactly the local kernels (the proxy's warm pool included, at most
// pool_size of them; the emulator's exec provider runs with no pool). After shutdown there must be
// no child process and no sandbox directory left at all.
//
// CIPROXY_CHAOS_N sets the number of requests (default 40, about 20 s on 2 cores: every request
// starts a fresh sandbox, about a CPU second of Python start-up; `make chaos` runs 1000) and
// CIPROXY_CHAOS_SEED the seed (default: from the clock; printed either way).
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run skipped in -short mode")
	}
	if err := local.Check(context.Background(), local.Options{}); err != nil {
		t.Skipf("local sandbox unavailable: %v", err)
	}
	n := envInt(t, "CIPROXY_CHAOS_N", 40)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CIPROXY_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CIPROXY_CHAOS_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("chaos: %d requests, seed %d (rerun with CIPROXY_CHAOS_SEED=%d)", n, seed, seed)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	h := startChaos(t, seed)
	defer h.closeAll()

	rng := rand.New(rand.NewPCG(seed, 1))
	plans := make([]plan, n)
	for i := range plans {
		plans[i] = newPlan(rng, i)
	}

	// Reloads: the config is rewritten every reloadEvery requests, switching the sandbox tool.
	const workers = 16
	reloadEvery := max(n/40, 5)
	var next atomic.Int64
	var wg sync.WaitGroup
	results := make([]result, n)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if i > 0 && i%reloadEvery == 0 {
					h.reload(t, (i/reloadEvery)%2 == 1)
				}
				h.inject(plans[i])
				results[i] = h.do(plans[i])
			}
		})
	}
	wg.Wait()
	h.clearFaults()

	// Every client got a complete response or an OpenAI-shaped error (or had left).
	outcomes := map[string]int{}
	faults := map[string]int{}
	for i, r := range results {
		p := plans[i]
		faults[p.kind]++
		outcomes[r.outcome]++
		if r.violation != "" {
			t.Errorf("request %d (%s): %s", i, p, r.violation)
		}
	}

	// Faults are random, but a proxy that fails every request is not resilient: at least half of the
	// requests that met no fault of their own must complete (global emulator faults may hit a few of them).
	var clean, cleanDone int
	for i, r := range results {
		if plans[i].kind == kindNone {
			clean++
			if r.outcome == "completed" {
				cleanDone++
			}
		}
	}
	if clean >= 5 && cleanDone*2 < clean {
		t.Errorf("only %d of %d requests without a fault of their own completed", cleanDone, clean)
	}

	// No sandbox is left beyond the proxy's warm pool.
	h.waitNoLeaks(t)
	live := h.metric(t, "ciproxy_sandbox_containers")

	// The proxy still serves a normal request, on each tool.
	for _, e2b := range []bool{false, true} {
		h.reload(t, e2b)
		if r := h.do(plan{id: n, kind: kindNone, cells: 2}); r.outcome != "completed" {
			t.Errorf("normal request after the chaos (e2b=%v): outcome %s %s", e2b, r.outcome, r.violation)
		}
	}
	h.waitNoLeaks(t)
	if strings.Contains(h.stderr.String(), "panic") {
		t.Errorf("the proxy logged a panic")
	}
	if t.Failed() {
		t.Logf("proxy log (tail):\n%s", tail(h.stderr.String(), 6000))
	}

	t.Logf("chaos: requests by outcome: %s", counts(outcomes))
	t.Logf("chaos: faults by kind: %s", counts(faults))
	t.Logf("chaos: emulator faults injected: %s", counts(h.emuFaults()))
	t.Logf("chaos: config reloads: %d", h.reloads.Load())
	t.Logf("chaos: e2b sandboxes created %d, deleted %d, live %d; exec kernels live %d; proxy gauge %v; local sandbox processes %d (warm pools <= 2x%d)",
		h.emu.Creates(), h.emu.Deletes(), h.emu.Live(), h.exec.Live(), live, len(h.sandboxProcs(t)), poolSize)
	t.Logf("chaos: requests without a fault of their own: %d of %d completed", cleanDone, clean)
	t.Logf("chaos: upstream requests %d", len(h.up.Requests()))
	t.Logf("chaos: the proxy's own counts: %s", strings.Join(h.metricLines(t, "ciproxy_intercept_requests_total"), ", "))

	// Shutdown: run returns 0; then no sandbox process or directory is left.
	h.shutdown(t)
	h.closeAll()
	if procs := h.sandboxProcs(t); len(procs) > 0 {
		t.Errorf("after shutdown, sandbox processes are left: %v", procs)
	}
	if dirs := sandboxDirs(t, h.workDir); len(dirs) > 0 {
		t.Errorf("after shutdown, sandbox directories are left: %v", dirs)
	}
	h.client.CloseIdleConnections()
}

// poolSize is the warm pool of the proxy's local tool and of the emulator's exec provider: both
// keep kernels started ahead, so creates are fast and the run stays short.
const poolSize = 2

// Fault kinds of a plan.
const (
	kindNone         = "none"
	kindCodeError    = "code_error"      // the model's code raises
	kindCancelBefore = "cancel_before"   // client leaves before the execution
	kindCancelDuring = "cancel_during"   // client leaves while code runs
	kindCancelAfter  = "cancel_after"    // client leaves after an execution
	kindUp500        = "upstream_500"    // upstream answers 500 (or 503)
	kindUp429        = "upstream_429"    // upstream rate-limits
	kindUpHang       = "upstream_hang"   // upstream never answers; the client times out
	kindUpCut        = "upstream_cut"    // upstream drops the connection mid-stream
	kindUpFailed     = "upstream_failed" // upstream's response fails (response.failed)
	kindCreateFail   = "sandbox_create_fail"
	kindExecFail     = "sandbox_exec_fail"
	kindExecCut      = "sandbox_exec_cut"
	kindExecSlow     = "sandbox_exec_slow"
)

var kinds = []string{
	kindNone, kindNone, kindNone, kindCodeError, kindCancelBefore, kindCancelDuring, kindCancelAfter,
	kindUp500, kindUp429, kindUpHang, kindUpCut, kindUpFailed,
	kindCreateFail, kindExecFail, kindExecCut, kindExecSlow,
}

// plan is what one request does and which fault it meets.
type plan struct {
	id       int
	kind     string
	stream   bool
	cells    int           // code executions the model asks for
	turn     int           // upstream turn (0-based) the upstream fault hits
	cutAfter int           // upstream_cut: events (or bytes) sent before the cut
	wait     time.Duration // non-streaming cancels: when the client leaves
	midLine  bool          // sandbox_exec_cut: drop the connection mid-line
}

func newPlan(rng *rand.Rand, id int) plan {
	p := plan{id: id, kind: kinds[rng.IntN(len(kinds))], stream: rng.IntN(2) == 0, cells: 1 + rng.IntN(3)}
	p.turn = rng.IntN(p.cells + 1)
	p.cutAfter = rng.IntN(12)
	p.midLine = rng.IntN(2) == 0
	switch p.kind {
	case kindCancelBefore:
		p.wait = time.Duration(rng.IntN(20)) * time.Millisecond
	case kindCancelDuring:
		p.wait = time.Duration(50+rng.IntN(250)) * time.Millisecond
	case kindCancelAfter:
		p.wait = time.Duration(300+rng.IntN(400)) * time.Millisecond
	case kindUpHang:
		p.wait = time.Duration(100+rng.IntN(200)) * time.Millisecond
	}
	return p
}

func (p plan) String() string {
	return fmt.Sprintf("%s stream=%v cells=%d turn=%d", p.kind, p.stream, p.cells, p.turn)
}

// code is what the model runs in cell i.
func (p plan) code(i int) string {
	switch {
	case p.kind == kindCodeError && i == p.cells-1:
		return "raise ValueError('chaos')"
	case p.kind == kindCancelDuring:
		return fmt.Sprintf("import time\ntime.sleep(0.4)\nprint('cell %d')", i)
	}
	return fmt.Sprintf("x = %d\nprint('cell', x * 7)", i)
}

// result is what the client saw.
type result struct {
	outcome   string // completed, failed_response, error_<status>, stream_error, canceled
	violation string // non-empty: the client got something that is neither an answer nor an error
}

// chaos is the running proxy and its surroundings.
type chaos struct {
	dir, cfgPath, workDir string
	up                    *upstreamtest.Server
	emu                   *e2btest.Server
	exec                  *local.Provider
	client                *http.Client
	base                  string

	cancelRun context.CancelFunc
	runDone   chan int
	stderr    *testutil.LockedBuffer

	cfgMu   sync.Mutex
	gen     int
	reloads atomic.Int64

	faultMu   sync.Mutex
	emuFault  map[string]int
	slowUntil time.Time

	closeOnce sync.Once
}

func startChaos(t *testing.T, seed uint64) *chaos {
	t.Helper()
	// Not t.TempDir: its 0700 directories cannot be crossed by bubblewrap, which runs as nobody
	// when the tests run as root.
	dir, err := os.MkdirTemp("", "ciproxy-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	h := &chaos{
		dir:      dir,
		cfgPath:  filepath.Join(dir, "config.yaml"),
		workDir:  filepath.Join(dir, "sandboxes"),
		emuFault: map[string]int{},
		stderr:   &testutil.LockedBuffer{},
		runDone:  make(chan int, 1),
	}
	h.exec, err = local.New(local.Options{PoolSize: poolSize, WorkDir: filepath.Join(dir, "emu"), Tool: "emu"})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	h.emu = e2btest.New(h.exec)
	h.up = upstreamtest.New(nil, upstreamtest.WithSeed(seed))
	h.up.Script(h.script)
	h.writeConfig(t, false)

	ctx, cancel := context.WithCancel(context.Background())
	h.cancelRun = cancel
	addr := make(chan net.Addr, 1)
	dataDir := t.TempDir()
	go func() {
		h.runDone <- runIn(t, ctx, dataDir, []string{"--config", h.cfgPath, "--host", "127.0.0.1", "--port", "0"},
			io.Discard, h.stderr, func(a net.Addr) { addr <- a })
	}()
	select {
	case a := <-addr:
		h.base = "http://" + a.String()
	case code := <-h.runDone:
		t.Fatalf("run returned %d before listening:\n%s", code, h.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("proxy did not start listening within 30s")
	}
	h.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	return h
}

// closeAll stops everything the harness started, except the proxy (see shutdown).
func (h *chaos) closeAll() {
	h.closeOnce.Do(func() {
		h.cancelRun()
		select {
		case <-h.runDone:
		case <-time.After(60 * time.Second):
		}
		h.up.Close()
		h.emu.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = h.exec.Close(ctx)
		if h.client != nil {
			h.client.CloseIdleConnections()
		}
	})
}

func (h *chaos) shutdown(t *testing.T) {
	t.Helper()
	h.cancelRun()
	select {
	case code := <-h.runDone:
		h.runDone <- code // closeAll waits on it too
		if code != 0 {
			t.Errorf("run returned %d after shutdown; log:\n%s", code, tail(h.stderr.String(), 4000))
		}
	case <-time.After(60 * time.Second):
		t.Fatal("run did not return within 60s of shutdown")
	}
}

// writeConfig writes the config atomically (rename), with the interception on the e2b tool or
// the local one; the generation comment makes every write a change.
func (h *chaos) writeConfig(t *testing.T, e2b bool) {
	h.cfgMu.Lock()
	defer h.cfgMu.Unlock()
	h.gen++
	tool := "local"
	if e2b {
		tool = "e2b"
	}
	cfg := fmt.Sprintf(`# generation %d
model_list:
  - model_name: chaos
    litellm_params:
      model: openai/chaos-model
      api_base: %s
sandbox_tools:
  - sandbox_tool_name: local
    litellm_params:
      sandbox_provider: local
      work_dir: %s
      pool_size: %d
      memory_limit: 512m
  - sandbox_tool_name: e2b
    litellm_params:
      sandbox_provider: e2b
      api_key: %s
      api_base: %s
      sandbox_url: %s
litellm_settings:
  callbacks: ["code_interpreter_interception"]
  code_interpreter_interception_params:
    sandbox_tool_name: %s
    execution_timeout: 20s
    container_idle_timeout: 0
general_settings:
  shutdown_grace: 20s
`, h.gen, h.up.URL(), h.workDir, poolSize, h.emu.APIKey(), h.emu.URL(), h.emu.SandboxURL(), tool)
	tmp := h.cfgPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(cfg), 0o600); err != nil {
		t.Errorf("write config: %v", err)
		return
	}
	if err := os.Rename(tmp, h.cfgPath); err != nil {
		t.Errorf("rename config: %v", err)
	}
}

// reload rewrites the config and waits until the proxy reports the reload.
func (h *chaos) reload(t *testing.T, e2b bool) {
	before := h.metric(t, `ciproxy_config_reloads_total{result="success"}`)
	h.writeConfig(t, e2b)
	h.reloads.Add(1)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if h.metric(t, `ciproxy_config_reloads_total{result="success"}`) > before {
			return
		}
		<-tick.C
	}
	// Concurrent reloads may be debounced into one: only a reload that never lands is an error.
	if h.metric(t, `ciproxy_config_reloads_total{result="success"}`) == before {
		t.Errorf("config reload %d not applied within 10s", h.gen)
	}
}

// inject turns the emulator's fault knobs for plans that ask for a sandbox fault. The knobs are
// global: the fault hits whichever e2b request comes next, and nothing when the local tool is on.
func (h *chaos) inject(p plan) {
	h.faultMu.Lock()
	defer h.faultMu.Unlock()
	switch p.kind {
	case kindCreateFail:
		status := []int{500, 429, 503}[p.id%3]
		h.emu.FailNextCreates(1, status, 0)
	case kindExecFail:
		h.emu.FailNextExecutions(1, []int{500, 502}[p.id%2])
	case kindExecCut:
		h.emu.CutNextStreams(1, p.cutAfter%3, p.midLine)
	case kindExecSlow:
		h.emu.SetExecDelay(300 * time.Millisecond)
		h.slowUntil = time.Now().Add(500 * time.Millisecond)
	default:
		if !h.slowUntil.IsZero() && time.Now().After(h.slowUntil) {
			h.emu.SetExecDelay(0)
			h.slowUntil = time.Time{}
		}
		return
	}
	h.emuFault[p.kind]++
}

func (h *chaos) clearFaults() {
	h.faultMu.Lock()
	defer h.faultMu.Unlock()
	h.emu.SetExecDelay(0)
	h.emu.FailNextCreates(0, 0, 0)
	h.emu.FailNextExecutions(0, 0)
	h.emu.CutNextStreams(0, 0, false)
}

func (h *chaos) emuFaults() map[string]int {
	h.faultMu.Lock()
	defer h.faultMu.Unlock()
	return copyCounts(h.emuFault)
}

func copyCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// script is the upstream model: each request is answered according to the plan named in its
// X-Chaos-Plan header; the turn is the number of function outputs the model has already seen.
func (h *chaos) script(req upstreamtest.Request) upstreamtest.Turn {
	p, ok := decodePlan(req.Header.Get("X-Chaos-Plan"))
	if !ok {
		return upstreamtest.Turn{Error: upstreamtest.APIError(400, "", "chaos: request without a plan", "")}
	}
	turn := 0
	for _, it := range req.History {
		var v struct{ Type string }
		_ = json.Unmarshal(it, &v)
		if v.Type == "function_call_output" {
			turn++
		}
	}
	if turn == p.turn {
		switch p.kind {
		case kindUp500:
			return upstreamtest.Turn{Error: upstreamtest.APIError([]int{500, 503}[p.id%2], "", "The server had an error while processing your request.", "")}
		case kindUp429:
			return upstreamtest.Turn{Error: upstreamtest.APIError(429, "rate_limit_exceeded", "Rate limit reached for requests.", "")}
		case kindUpHang:
			return upstreamtest.Turn{Hold: make(chan struct{}), Items: []upstreamtest.Item{upstreamtest.Text("never")}}
		case kindUpCut:
			return upstreamtest.Turn{Cut: true, CutAfter: p.cutAfter, Items: h.items(p, turn)}
		case kindUpFailed:
			return upstreamtest.Turn{Fail: &upstreamtest.Failure{After: 0}, Items: h.items(p, turn)}
		}
	}
	return upstreamtest.Turn{Items: h.items(p, turn)}
}

func (h *chaos) items(p plan, turn int) []upstreamtest.Item {
	if turn >= p.cells {
		return []upstreamtest.Item{upstreamtest.Text(fmt.Sprintf("Done after %d cells.", turn))}
	}
	args, _ := json.Marshal(map[string]string{"code": p.code(turn)})
	return []upstreamtest.Item{upstreamtest.FunctionCall("python", string(args))}
}

func encodePlan(p plan) string {
	return fmt.Sprintf("%d;%s;%d;%d;%d", p.id, p.kind, p.cells, p.turn, p.cutAfter)
}

func decodePlan(s string) (plan, bool) {
	f := strings.Split(s, ";")
	if len(f) != 5 {
		return plan{}, false
	}
	var p plan
	var err error
	p.kind = f[1]
	nums := []*int{&p.id, &p.cells, &p.turn, &p.cutAfter}
	for i, ptr := range nums {
		idx := []int{0, 2, 3, 4}[i]
		if *ptr, err = strconv.Atoi(f[idx]); err != nil {
			return plan{}, false
		}
	}
	return p, true
}

// cancelEvent is the stream event at which a streaming client leaves, per plan kind.
var cancelEvent = map[string]string{
	kindCancelBefore: "response.output_item.added",
	kindCancelDuring: "response.code_interpreter_call.interpreting",
	kindCancelAfter:  "response.code_interpreter_call.completed",
}

// do sends one request and classifies what the client got.
func (h *chaos) do(p plan) result {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leaving := p.wait > 0 && (!p.stream || p.kind == kindUpHang)
	if leaving {
		time.AfterFunc(p.wait, cancel)
	}
	body := map[string]any{
		"model":  "chaos",
		"input":  fmt.Sprintf("Request %d: compute something.", p.id),
		"tools":  []any{map[string]any{"type": "code_interpreter", "container": map[string]any{"type": "auto"}}},
		"stream": p.stream,
	}
	if p.id%2 == 0 {
		body["include"] = []string{"code_interpreter_call.outputs"}
	}
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.base+"/v1/responses", bytes.NewReader(b))
	if err != nil {
		return result{outcome: "bad_request", violation: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Chaos-Plan", encodePlan(p))
	resp, err := h.client.Do(req)
	if err != nil {
		if ctx.Err() != nil && ctx.Err() != context.DeadlineExceeded {
			return result{outcome: "canceled"}
		}
		return result{outcome: "transport_error", violation: "request failed: " + err.Error()}
	}
	defer resp.Body.Close()
	canceled := func() bool { return ctx.Err() == context.Canceled }

	if resp.StatusCode != http.StatusOK {
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			if canceled() {
				return result{outcome: "canceled"}
			}
			return result{outcome: "error_read", violation: "reading error body: " + err.Error()}
		}
		if v := checkErrorBody(raw); v != "" {
			return result{outcome: fmt.Sprintf("error_%d", resp.StatusCode), violation: v}
		}
		return result{outcome: fmt.Sprintf("error_%d", resp.StatusCode)}
	}

	if !p.stream {
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			if canceled() {
				return result{outcome: "canceled"}
			}
			return result{outcome: "read_error", violation: "reading response: " + err.Error()}
		}
		var r struct {
			Status string
			Error  *struct{ Message, Code string }
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return result{outcome: "bad_json", violation: fmt.Sprintf("response is not JSON: %v: %s", err, tail(string(raw), 300))}
		}
		switch {
		case r.Status == "completed":
			return result{outcome: "completed"}
		case r.Status == "failed" && r.Error != nil && r.Error.Message != "":
			return result{outcome: "failed_response"}
		}
		return result{outcome: "bad_status_" + r.Status, violation: "unexpected response: " + tail(string(raw), 300)}
	}

	// Streaming: read events; leave at the plan's event; validate the whole stream otherwise.
	var raw bytes.Buffer
	rd := bufio.NewReader(resp.Body)
	leaveAt := cancelEvent[p.kind]
	for {
		line, err := rd.ReadBytes('\n')
		raw.Write(line)
		if leaveAt != "" && bytes.HasPrefix(line, []byte("event: "+leaveAt)) {
			cancel()
			return result{outcome: "canceled"}
		}
		if err != nil {
			if canceled() {
				return result{outcome: "canceled"}
			}
			if err != io.EOF {
				return result{outcome: "stream_broken", violation: fmt.Sprintf("stream read: %v after %d bytes: %s", err, raw.Len(), tail(raw.String(), 400))}
			}
			break
		}
	}
	rep, err := streamcheck.Check(raw.Bytes())
	if err != nil {
		return result{outcome: "stream_invalid", violation: fmt.Sprintf("stream: %v: %s", err, tail(raw.String(), 600))}
	}
	switch rep.Terminal {
	case "response.completed":
		return result{outcome: "completed"}
	case "response.failed":
		return result{outcome: "stream_error"}
	}
	return result{outcome: "stream_" + rep.Terminal, violation: "stream ended with " + rep.Terminal}
}

// checkErrorBody reports what is wrong with an error body, "" when it is OpenAI-shaped.
func checkErrorBody(raw []byte) string {
	var e struct {
		Error *struct {
			Message *string         `json:"message"`
			Type    *string         `json:"type"`
			Param   json.RawMessage `json:"param"`
			Code    json.RawMessage `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &e); err != nil || e.Error == nil || e.Error.Message == nil || e.Error.Type == nil ||
		e.Error.Param == nil || e.Error.Code == nil {
		return "error body is not OpenAI-shaped: " + tail(string(raw), 300)
	}
	return ""
}

// metric reads one sample from the proxy's /metrics ("name" or "name{labels}"); 0 when absent.
func (h *chaos) metric(t *testing.T, name string) float64 {
	resp, err := h.client.Get(h.base + "/metrics")
	if err != nil {
		t.Errorf("GET /metrics: %v", err)
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Errorf("metric %s: %v", line, err)
			}
			return v
		}
	}
	return 0
}

// metricLines returns the /metrics samples of a family, e.g. `name{outcome="completed"} 12`.
func (h *chaos) metricLines(t *testing.T, family string) []string {
	resp, err := h.client.Get(h.base + "/metrics")
	if err != nil {
		t.Errorf("GET /metrics: %v", err)
		return nil
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, family+"{") || strings.HasPrefix(line, family+" ") {
			out = append(out, strings.TrimPrefix(line, family))
		}
	}
	return out
}

// waitNoLeaks polls until every view counts no sandbox beyond the warm pool (releases finish
// after the client has its answer), then reports what is left.
func (h *chaos) waitNoLeaks(t *testing.T) {
	t.Helper()
	var why string
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(30 * time.Second)
	for {
		why = ""
		if n := h.emu.Live(); n != 0 {
			why += fmt.Sprintf("e2b emulator: %d live sandboxes %v; ", n, h.emu.SandboxIDs())
		}
		if n := h.exec.Live(); n != 0 {
			why += fmt.Sprintf("emulator exec kernels: %d live; ", n)
		}
		if v := h.metric(t, "ciproxy_sandbox_containers"); v != 0 {
			why += fmt.Sprintf("proxy gauge ciproxy_sandbox_containers = %v; ", v)
		}
		if procs := h.sandboxProcs(t); len(procs) > 2*poolSize {
			why += fmt.Sprintf("%d local sandbox processes (warm pools 2x%d): %v; ", len(procs), poolSize, procs)
		}
		if why == "" || time.Now().After(deadline) {
			break
		}
		<-tick.C
	}
	if why == "" {
		return
	}
	t.Errorf("sandboxes leaked: %s", why)
}

// sandboxProcs lists the direct child processes of this test process ("pid comm"): every local
// sandbox (the proxy's and the emulator's exec provider's) is a bubblewrap process started by it,
// and nothing else in this test starts processes.
func (h *chaos) sandboxProcs(t *testing.T) []string {
	self := os.Getpid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Errorf("read /proc: %v", err)
		return nil
	}
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses: split at the last ')'.
		s := string(stat)
		end := strings.LastIndexByte(s, ')')
		if end < 0 {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		if ppid == self {
			comm := s[strings.IndexByte(s, '(')+1 : end]
			out = append(out, fmt.Sprintf("%d %s %s", pid, comm, fields[0]))
		}
	}
	return out
}

// sandboxDirs lists what is left under the local tool's work_dir.
func sandboxDirs(t *testing.T, dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil
		}
		out = append(out, strings.TrimPrefix(p, dir+"/"))
		if d.IsDir() && len(out) > 20 {
			return filepath.SkipAll
		}
		return nil
	})
	return out
}

func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	total := 0
	for k, v := range m {
		keys = append(keys, k)
		total += v
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return fmt.Sprintf("%s (total %d)", strings.Join(parts, " "), total)
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return v
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
