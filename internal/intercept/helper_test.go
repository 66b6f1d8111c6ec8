package intercept

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"
	"go.uber.org/zap/zaptest"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2b"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/sse"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/localsandbox"
	"github.com/ciproxy/ciproxy/internal/upstream"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// sandboxes is one local sandbox provider for the tests that run real Python, so its warm pool
// serves every test instead of each test paying kernel start-ups. It starts with the first such
// test; on a host without bubblewrap those tests skip and the others still run.
var sandboxes = localsandbox.New(local.Options{Tool: "local", PoolSize: 2})

func TestMain(m *testing.M) { testutil.Main(m, sandboxes.Close) }

// harness is an Engine wired to a scripted upstream, served over HTTP the way the router calls
// it. Code runs in fake containers unless the harness was built withLocal or withE2B.
type harness struct {
	t     *testing.T
	up    *upstreamtest.Server
	cfg   *config.Config
	eng   *Engine
	sess  *containers.Manager // real sessions (withLocal, withE2B); nil with the fake
	state *embedded.Store     // their store, which holds the Files API's files too
	fake  *fakeContainers     // the fake containers; nil with real sessions
	srv   *httptest.Server
	store store.Responses // the responses the engine keeps: in state with real sessions
	reg   *prometheus.Registry
	local bool            // withLocal: code runs in the local sandbox
	e2b   *e2btest.Server // set by withE2B: the sandbox tool is e2b, emulated
	api   upstreamAPI     // what the upstream speaks (onAPI; the Responses API by default)

	client *upstream.Client
}

type harnessOpt func(*harness)

// upstreamAPI is the API the scripted upstream speaks to the engine: the Responses API (the seam
// is the target itself), or Chat Completions as a server flavour serves it (the seam is
// upstream.ChatAPI, and the upstream keeps nothing).
type upstreamAPI struct {
	name   string
	chat   bool
	server []upstreamtest.Option
}

var (
	responsesAPI = upstreamAPI{name: "responses"}
	vllmAPI      = upstreamAPI{name: "vllm", chat: true, server: []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM)}}
	llamaCppAPI  = upstreamAPI{name: "llamacpp", chat: true, server: []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatLlamaCpp)}}
	// nullsAPI is vLLM's answers with every field of the openai SDK's models that they leave
	// out sent as null, as servers and proxies built on those models send them.
	nullsAPI = upstreamAPI{name: "vllm-nulls", chat: true, server: []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM), upstreamtest.WithChatNulls()}}
)

// upstreamAPIs are the APIs the interception tests run against, once each.
var upstreamAPIs = []upstreamAPI{responsesAPI, vllmAPI, llamaCppAPI, nullsAPI}

// onAPI makes the harness's upstream speak api.
func onAPI(api upstreamAPI) harnessOpt { return func(h *harness) { h.api = api } }

// forEachAPI runs f as one subtest per upstream API.
func forEachAPI(t *testing.T, f func(t *testing.T, api upstreamAPI)) {
	t.Helper()
	for _, api := range upstreamAPIs {
		t.Run(api.name, func(t *testing.T) { f(t, api) })
	}
}

// withLocal runs code in the local sandbox (the test skips where it cannot run).
func withLocal() harnessOpt { return func(h *harness) { h.local = true } }

// withE2B serves the sandbox tool through the e2b client against the e2b emulator, which runs
// code in the local sandbox.
func withE2B() harnessOpt { return func(h *harness) { h.e2b = e2btest.New(sandboxes.Provider(h.t)) } }

func withConfig(f func(*config.Config)) harnessOpt { return func(h *harness) { f(h.cfg) } }

// noSandbox builds the harness without a sandbox tool registered under the configured name.
func noSandbox() harnessOpt {
	return func(h *harness) { h.cfg.Interception.SandboxToolName = "missing" }
}

// activeConfig is the default configuration with interception listed in callbacks: the local
// sandbox tool, the python stand-in, every other default.
func activeConfig() *config.Config {
	c := config.Defaults()
	c.Callbacks = []string{"code_interpreter_interception"}
	return c
}

// testConfig is an active interception config for model gpt-test served at base, with a shorter
// execution timeout and idle timeout than the defaults.
func testConfig(base string) *config.Config {
	c := activeConfig()
	c.Interception.ExecutionTimeout = 20 * time.Second
	c.Interception.ContainerIdleTimeout = 10 * time.Minute
	c.Models = []config.Deployment{{ModelName: "gpt-test", Provider: "openai", UpstreamModel: "gpt-up", APIBase: base}}
	return c
}

func newHarness(t *testing.T, opts ...harnessOpt) *harness {
	t.Helper()
	h := &harness{t: t, reg: prometheus.NewRegistry(), api: responsesAPI}
	h.cfg = testConfig("")
	for _, o := range opts {
		o(h)
	}
	h.up = upstreamtest.New(t, h.api.server...)
	h.cfg.Models[0].APIBase = h.up.URL()
	if h.api.chat {
		h.cfg.Models[0].API = config.APIChatCompletions
	}
	switch {
	case h.local || h.e2b != nil:
		entry := sandbox.RegistryEntry{Name: "local", Provider: sandboxes.Provider(t), Backend: "local", HostBound: true}
		if h.e2b != nil {
			ep, err := e2b.New(e2b.Options{APIKey: h.e2b.APIKey(), APIBase: h.e2b.URL(), SandboxURL: h.e2b.SandboxURL(), HTTPClient: h.e2b.Client(), Tool: "local"})
			if err != nil {
				t.Fatal(err)
			}
			entry = sandbox.RegistryEntry{Name: "local", Provider: ep, Backend: "e2b"}
		}
		reg, err := sandbox.NewRegistry(nil, entry)
		if err != nil {
			t.Fatal(err)
		}
		h.state = newState(t)
		h.store = h.state
		h.sess = sessionsOn(t, reg, h.state)
		h.eng = New(Options{Containers: h.sess, Store: h.store, Files: h.state, Metrics: h.reg, Logger: zaptest.NewLogger(t)})
	default:
		h.fake = newFakeContainers("local")
		h.store = storetest.NewMemResponses(nil)
		h.eng = New(Options{Store: h.store, Metrics: h.reg, Logger: zaptest.NewLogger(t)})
		h.eng.sessions = h.fake
	}
	client := upstream.NewClient(upstream.ClientOptions{})
	h.client = client
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := h.request(body, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		// As the router: what the engine does not serve passes through.
		plan, err := h.eng.Prepare(r.Context(), req)
		if err == nil && !plan.Intercepted {
			w.WriteHeader(299) // pass-through would follow
			return
		}
		serveLikeRouter(w, r, func() error {
			if err != nil {
				return err
			}
			return h.eng.Serve(w, r, plan)
		})
	}))
	t.Cleanup(func() {
		h.srv.CloseClientConnections()
		h.srv.Close()
		if h.sess != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = h.sess.Close(ctx)
		}
		if h.e2b != nil {
			h.e2b.Close()
		}
		client.CloseIdleConnections()
	})
	return h
}

// newSessions is Sessions on reg over an embedded store in a temporary directory, which is closed
// at the end of the test (after the Sessions, whose Close the caller arranges first).
func newSessions(tb testing.TB, reg *sandbox.Registry) *containers.Manager {
	tb.Helper()
	return sessionsOn(tb, reg, newState(tb))
}

// newState is an embedded store in a temporary directory, closed at the end of the test.
func newState(tb testing.TB) *embedded.Store {
	tb.Helper()
	st, err := embedded.Open(embedded.Options{Dir: tb.TempDir(), SweepEvery: -1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	return st
}

// sessionsOn is Sessions on reg over st.
func sessionsOn(tb testing.TB, reg *sandbox.Registry, st store.Store) *containers.Manager {
	tb.Helper()
	s, err := containers.New(context.Background(), containers.Options{Store: st, Registry: func() *sandbox.Registry { return reg }, SweepInterval: -1})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// request is the engine's Request for body from caller, as the router builds it for the
// harness's upstream API.
func (h *harness) request(body []byte, caller string) *Request {
	deps := h.cfg.Deployments(gjson.GetBytes(body, "model").String())
	target := h.client.Target(deps)
	req := &Request{Config: h.cfg, Body: body, Upstream: target, Provider: "openai", Caller: caller}
	if h.api.chat {
		req.Upstream, req.Stateless = upstream.NewChatAPI(target, upstream.ChatOptionsFor(deps[0])), true
	}
	return req
}

// serveLikeRouter answers as router.handle and its recoverer do around an intercept call:
// a returned error is written (an upstream's own answer as it came, anything else OpenAI-shaped)
// unless the client left, and a panic is a generic 500. The router itself cannot be used here:
// it imports this package.
func serveLikeRouter(w http.ResponseWriter, r *http.Request, serve func() error) {
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			apierror.Write(w, apierror.From(nil))
		}
	}()
	err := serve()
	if err == nil || (errors.Is(err, context.Canceled) && r.Context().Err() != nil) {
		return
	}
	var us *upstream.StatusError
	if errors.As(err, &us) {
		us.Write(w)
		return
	}
	apierror.Write(w, apierror.From(err))
}

// live returns the containers the engine holds.
func (h *harness) live() int {
	if h.sess != nil {
		return h.sess.Live()
	}
	return h.fake.Live()
}

// post sends body to the engine as caller and returns the status and the whole body.
func (h *harness) post(body, caller string) (int, []byte) {
	h.t.Helper()
	resp := h.do(context.Background(), body, caller)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("reading the answer: %v", err)
	}
	return resp.StatusCode, b
}

func (h *harness) do(ctx context.Context, body, caller string) *http.Response {
	h.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/responses", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if caller != "" {
		req.Header.Set("Authorization", "Bearer "+caller)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("POST: %v", err)
	}
	return resp
}

// sseEvent is one parsed client event.
type sseEvent struct {
	Name string
	Data []byte
}

func parseSSE(t *testing.T, b []byte) []sseEvent {
	t.Helper()
	rd := sse.NewReader(bytes.NewReader(b))
	var out []sseEvent
	for {
		ev, err := rd.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("parsing the stream: %v", err)
		}
		out = append(out, sseEvent{ev.Name, ev.Data})
	}
}

// finalResponse returns the response of the stream's terminal event.
func finalResponse(t *testing.T, evs []sseEvent) []byte {
	t.Helper()
	if len(evs) == 0 {
		t.Fatal("empty stream")
	}
	last := evs[len(evs)-1]
	return []byte(gjson.GetBytes(last.Data, "response").Raw)
}

// fcOutputs returns the function_call_output texts in an upstream request's input (for a chat
// request, its tool messages).
func fcOutputs(r upstreamtest.Request) []string {
	var out []string
	for _, it := range inputItems(r, "function_call_output") {
		out = append(out, gjson.GetBytes(it, "output").String())
	}
	return out
}

// inputItems returns the input items of type typ of an upstream request: a Responses request's
// input, or a chat request's messages read as items (upstreamtest's History).
func inputItems(r upstreamtest.Request, typ string) []json.RawMessage {
	if r.Path != "/v1/chat/completions" {
		return r.InputItems(typ)
	}
	var out []json.RawMessage
	for _, it := range r.History {
		if gjson.GetBytes(it, "type").String() == typ {
			out = append(out, it)
		}
	}
	return out
}

func call(code string) upstreamtest.Item {
	args, _ := json.Marshal(map[string]string{"code": code})
	return upstreamtest.FunctionCall("python", string(args))
}

func body(extra string) string {
	b := `{"model":"gpt-test","input":"compute","tools":[{"type":"code_interpreter","container":{"type":"auto"}}]`
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

func types(resp []byte) []string {
	var out []string
	gjson.GetBytes(resp, "output").ForEach(func(_, it gjson.Result) bool {
		out = append(out, it.Get("type").String())
		return true
	})
	return out
}

// container creates a container owned by caller, kept for later requests, and returns its id.
// Tests that do not need a fresh sandbox per request share one: kernel start-ups dominate.
func (h *harness) container(caller string) string {
	h.t.Helper()
	ctx := context.Background()
	c, err := h.eng.sessions.Create(ctx, "local", caller, sandbox.CreateOptions{}, 10*time.Minute)
	if err != nil {
		h.t.Fatalf("Create: %v", err)
	}
	c.Release(ctx)
	return c.ID()
}

// bodyIn is body with the code_interpreter tool bound to container cid.
func bodyIn(cid, extra string) string {
	b := `{"model":"gpt-test","input":"compute","tools":[{"type":"code_interpreter","container":"` + cid + `"}]`
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

// serveResponses serves req as a caller that routes it to the engine: prepared, then served.
func serveResponses(e *Engine, w http.ResponseWriter, r *http.Request, req *Request) error {
	plan, err := e.prepare(r.Context(), req, true)
	if err != nil {
		return err
	}
	return e.Serve(w, r, plan)
}

// intercepted reports whether Prepare plans to serve req.
func intercepted(t *testing.T, e *Engine, req *Request) bool {
	t.Helper()
	plan, _ := e.Prepare(context.Background(), req)
	return plan.Intercepted
}
