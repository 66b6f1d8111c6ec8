package intercept

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
	"github.com/ciproxy/ciproxy/internal/upstream"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// instantProvider is a sandbox that answers every run at once. Benchmarks only: it takes the
// sandbox's time out of the engine's cost.
type instantProvider struct {
	pieces int // pieces of output of each shell command
}

func (*instantProvider) Create(context.Context, sandbox.CreateOptions) (sandbox.Handle, error) {
	return sandbox.Handle{Backend: "instant", Tool: "instant", ID: "sb"}, nil
}

func (*instantProvider) Run(context.Context, sandbox.Handle, string, sandbox.RunOptions) (sandbox.Result, error) {
	return sandbox.Result{Stdout: "42\n", ExecutionCount: 1}, nil
}

// Exec answers every command at once with pieces pieces of output ("42\n" without them).
func (p *instantProvider) Exec(_ context.Context, _ sandbox.Handle, _ string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	if p.pieces == 0 {
		opts.OnOutput(sandbox.Stdout, "42\n")
	}
	for range p.pieces {
		opts.OnOutput(sandbox.Stdout, "All work and no play.\n")
	}
	return sandbox.ExecResult{}, nil
}

func (*instantProvider) Delete(context.Context, sandbox.Handle) error { return nil }

func (*instantProvider) KeepAlive(context.Context, sandbox.Handle, time.Duration) error { return nil }

// cannedUpstream answers upstream calls from recorded bodies, in order, without a network; the
// bodies are read as a Responses upstream's answers are (upstream.ReadAnswer).
type cannedUpstream struct {
	mu     sync.Mutex
	bodies [][]byte
	n      int
	stream bool
}

func (c *cannedUpstream) Responses(ctx context.Context, _ []byte, _ http.Header) (upstream.ResponseEvents, error) {
	c.mu.Lock()
	b := c.bodies[c.n%len(c.bodies)]
	c.n++
	c.mu.Unlock()
	ct := "application/json"
	if c.stream {
		ct = "text/event-stream"
	}
	return upstream.ReadAnswer(ctx, &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {ct}}, Body: io.NopCloser(bytes.NewReader(b))})
}

// record returns the scripted upstream's answer to one turn, streamed or not.
func record(b testing.TB, stream bool, turn upstreamtest.Turn) []byte {
	b.Helper()
	up := upstreamtest.New(b)
	up.Enqueue(turn)
	body := `{"model":"m","input":"x","stream":` + map[bool]string{false: "false", true: "true"}[stream] + `}`
	resp, err := http.Post(up.URL()+"/responses", "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	up.Close()
	return out
}

func benchEngine(b *testing.B) (*Engine, *config.Config, func()) {
	return benchEngineOn(b, newState(b), &instantProvider{})
}

// benchEngineOn is benchEngine with the container registry in st, on the sandbox p.
func benchEngineOn(b *testing.B, st store.Store, p *instantProvider) (*Engine, *config.Config, func()) {
	reg, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "instant", Provider: p, Backend: "instant"})
	if err != nil {
		b.Fatal(err)
	}
	sess := sessionsOn(b, reg, st)
	cfg := activeConfig()
	cfg.Interception.SandboxToolName = "instant"
	cfg.Interception.ExecutionTimeout = time.Minute
	cfg.Interception.ContainerIdleTimeout = time.Minute
	e := New(Options{Containers: sess, Store: storetest.NewMemResponses(nil)})
	return e, cfg, func() { _ = sess.Close(context.Background()) }
}

// iterations is the number of upstream calls of one request of the Iteration benchmarks.
const iterations = 5

// BenchmarkIteration measures the engine's own cost per loop iteration (rewrite, translate,
// render, container bookkeeping), with an upstream and a sandbox that answer at once: each
// request makes 4 upstream calls that run code, then one that answers in text.
func BenchmarkIteration(b *testing.B) {
	for _, stream := range []bool{false, true} {
		b.Run(map[bool]string{false: "json", true: "stream"}[stream], func(b *testing.B) {
			e, cfg, done := benchEngine(b)
			defer done()
			benchIteration(b, stream, e, cfg, nil)
		})
	}
	// The same loop with a shell call in each turn instead of a code call.
	b.Run("shell-stream", func(b *testing.B) {
		e, cfg, done := benchEngine(b)
		defer done()
		benchLoop(b, true, e, cfg, nil, shellCall("ls -la /mnt/data", "python3 -c 'print(6 * 7)'"),
			`"tools":[{"type":"shell","environment":{"type":"container_auto"}}]`)
	})
}

// BenchmarkIterationStore is Iteration/json with the engine's calls to the container registry
// timed: the store's share of each iteration (the container's record created, then read and
// written back after each execution and at release), what is left for the engine itself, and the
// record writes per request. The store is the same embedded store as Iteration's.
func BenchmarkIterationStore(b *testing.B) {
	st := &timedContainers{Store: newState(b)}
	e, cfg, done := benchEngineOn(b, st, &instantProvider{})
	defer done()
	benchIteration(b, false, e, cfg, st)
	n := float64(b.N * iterations)
	b.ReportMetric(float64(st.took.Load())/n, "store-ns/iteration")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds()-st.took.Load())/n, "engine-ns/iteration")
	b.ReportMetric(float64(st.writes.Load())/float64(b.N), "record-writes/op")
}

// benchIteration runs the Iteration request on e until b is done, and reports ns/iteration. A
// non-nil timed starts counting with the timer.
func benchIteration(b *testing.B, stream bool, e *Engine, cfg *config.Config, timed *timedContainers) {
	benchLoop(b, stream, e, cfg, timed, call("import math\nprint(math.pi * 2)\nresult = [i * i for i in range(10)]\nresult"),
		`"tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"include":["code_interpreter_call.outputs"]`)
}

// benchLoop is benchIteration with the call item and the request's tools given.
func benchLoop(b *testing.B, stream bool, e *Engine, cfg *config.Config, timed *timedContainers, item upstreamtest.Item, tools string) {
	callTurn := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Reasoning("thinking"), item}}
	textTurn := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("The answer is 42, as computed above.")}}
	c, t := record(b, stream, callTurn), record(b, stream, textTurn)
	reqBody := []byte(`{"model":"m","input":"compute",` + tools + `,"stream":` + map[bool]string{false: "false", true: "true"}[stream] + `}`)
	b.ReportAllocs()
	if timed != nil {
		timed.took.Store(0)
		timed.writes.Store(0)
	}
	b.ResetTimer()
	for b.Loop() {
		p := &cannedUpstream{bodies: [][]byte{c, c, c, c, t}, stream: stream}
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/responses", nil)
		_ = serveResponses(e, w, r, &Request{Config: cfg, Upstream: p, Body: reqBody, Caller: "bench"})
		if w.Code != 200 {
			b.Fatalf("status %d: %s", w.Code, w.Body.Bytes())
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*iterations), "ns/iteration")
}

// timedContainers adds up the time spent in the container registry's calls, and counts the
// record writes among them.
type timedContainers struct {
	store.Store
	took, writes atomic.Int64
}

func (s *timedContainers) since(t0 time.Time, write bool) {
	s.took.Add(int64(time.Since(t0)))
	if write {
		s.writes.Add(1)
	}
}

func (s *timedContainers) CreateContainer(ctx context.Context, c store.Container) (store.Container, error) {
	defer s.since(time.Now(), true)
	return s.Store.CreateContainer(ctx, c)
}

func (s *timedContainers) Container(ctx context.Context, owner, id string) (store.Container, error) {
	defer s.since(time.Now(), false)
	return s.Store.Container(ctx, owner, id)
}

func (s *timedContainers) UpdateContainer(ctx context.Context, c store.Container) (store.Container, error) {
	defer s.since(time.Now(), true)
	return s.Store.UpdateContainer(ctx, c)
}

func (s *timedContainers) DeleteContainer(ctx context.Context, owner, id string) error {
	defer s.since(time.Now(), true)
	return s.Store.DeleteContainer(ctx, owner, id)
}

// BenchmarkStreamEvent measures what the engine adds to each forwarded streaming event: a
// text answer of many deltas from an upstream that answers at once, translated and written
// (numbered, flushed) to the client.
func BenchmarkStreamEvent(b *testing.B) {
	text := strings.Repeat("All work and no play makes a dull proxy. ", 100)
	answer := record(b, true, upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text(text)}, TextChunk: 8})
	events := bytes.Count(answer, []byte("\n\n"))
	e, cfg, done := benchEngine(b)
	defer done()
	reqBody := []byte(`{"model":"m","input":"write","tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"stream":true}`)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p := &cannedUpstream{bodies: [][]byte{answer}, stream: true}
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/responses", nil)
		_ = serveResponses(e, w, r, &Request{Config: cfg, Upstream: p, Body: reqBody, Caller: "bench"})
		if w.Code != 200 {
			b.Fatalf("status %d", w.Code)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
	b.ReportMetric(float64(events), "events/op")
}

// BenchmarkShellOutputEvent measures what the engine adds to each streamed piece of a shell
// command's output (a shell_call_output_content.delta, numbered, written and flushed), with a
// sandbox whose command writes 1000 pieces at once; BenchmarkStreamEvent is the text deltas'
// figure to compare it with.
func BenchmarkShellOutputEvent(b *testing.B) {
	const pieces = 1000
	e, cfg, done := benchEngineOn(b, newState(b), &instantProvider{pieces: pieces})
	defer done()
	cfg.Interception.ModelOutputLimit = 1 << 20 // every piece is streamed
	c := record(b, true, upstreamtest.Turn{Items: []upstreamtest.Item{shellCall("yes 'All work and no play.' | head -1000")}})
	t := record(b, true, upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Done.")}})
	reqBody := []byte(`{"model":"m","input":"run","tools":[{"type":"shell","environment":{"type":"container_auto"}}],"stream":true}`)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p := &cannedUpstream{bodies: [][]byte{c, t}, stream: true}
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/responses", nil)
		_ = serveResponses(e, w, r, &Request{Config: cfg, Upstream: p, Body: reqBody, Caller: "bench"})
		if w.Code != 200 || bytes.Count(w.Body.Bytes(), []byte("event: "+evShellOutputDelta)) != pieces {
			b.Fatalf("status %d, %d output deltas", w.Code, bytes.Count(w.Body.Bytes(), []byte("event: "+evShellOutputDelta)))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*pieces), "ns/event")
}

// stampWriter is a streaming client that notes when it first saw each of two events: from is
// the model's call (done), to the first of its output.
type stampWriter struct {
	httptest.ResponseRecorder
	from, to     string
	fromAt, toAt time.Time
}

func (w *stampWriter) Write(p []byte) (int, error) {
	now := time.Now()
	if w.fromAt.IsZero() && bytes.Contains(p, []byte(w.from)) {
		w.fromAt = now
	}
	if w.toAt.IsZero() && bytes.Contains(p, []byte(w.to)) {
		w.toAt = now
	}
	return w.ResponseRecorder.Write(p)
}

func (w *stampWriter) Flush() {}

// BenchmarkFirstOutput measures, on the local sandbox, the time from the model's call reaching
// the client to the first of its output reaching the client: for the shell tool, from the
// shell_call's output_item.done to the first shell_call_output_content.delta of `echo hi`; for
// code interpreter, from code_interpreter_call_code.done to code_interpreter_call.completed of
// print('hi') (its output comes with the item, not before). Both run in one container made
// beforehand, with an upstream that answers at once.
func BenchmarkFirstOutput(b *testing.B) {
	prov := sandboxes.Provider(b)
	reg, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "local", Provider: prov, Backend: "local", HostBound: true})
	if err != nil {
		b.Fatal(err)
	}
	sess := sessionsOn(b, reg, newState(b))
	defer func() { _ = sess.Close(context.Background()) }()
	cfg := activeConfig()
	cfg.Interception.ExecutionTimeout = time.Minute
	e := New(Options{Containers: sess, Store: storetest.NewMemResponses(nil)})
	c, err := sess.Create(context.Background(), "local", "bench", sandbox.CreateOptions{}, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	id := c.ID()
	c.Release(context.Background())
	text := record(b, true, upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("hi")}})
	for _, tc := range []struct {
		name, tools, from, to string
		call                  upstreamtest.Item
	}{
		{"shell", `[{"type":"shell","environment":{"type":"container_reference","container_id":"` + id + `"}}]`,
			`"type":"shell_call","status":"completed"`, "event: " + evShellOutputDelta, shellCall("echo hi")},
		{"code_interpreter", `[{"type":"code_interpreter","container":"` + id + `"}]`,
			"event: " + evCallCodeDone, "event: " + evCallCompleted, call("print('hi')")},
	} {
		b.Run(tc.name, func(b *testing.B) {
			turn := record(b, true, upstreamtest.Turn{Items: []upstreamtest.Item{tc.call}})
			body := []byte(`{"model":"m","input":"x","stream":true,"tools":` + tc.tools + `}`)
			var total time.Duration
			for b.Loop() {
				w := &stampWriter{ResponseRecorder: *httptest.NewRecorder(), from: tc.from, to: tc.to}
				r := httptest.NewRequest(http.MethodPost, "/v1/responses", nil)
				_ = serveResponses(e, w, r, &Request{Config: cfg, Upstream: &cannedUpstream{bodies: [][]byte{turn, text}, stream: true}, Body: body, Caller: "bench"})
				if w.fromAt.IsZero() || w.toAt.IsZero() {
					b.Fatalf("status %d, events not seen: %.600s", w.Code, w.Body.Bytes())
				}
				total += w.toAt.Sub(w.fromAt)
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-to-first-output")
		})
	}
}
