package intercept

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/upstream"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

func TestApplies(t *testing.T) {
	active := activeConfig
	ci := []byte(`{"model":"m","tools":[{"type":"function","name":"f"},{"type":"code_interpreter","container":{"type":"auto"}}]}`)
	tests := []struct {
		name     string
		cfg      func() *config.Config
		provider string
		body     []byte
		want     bool
	}{
		{"active with a code_interpreter tool", active, "openai", ci, true},
		{"nil config passes", func() *config.Config { return nil }, "openai", ci, false},
		{"callback not listed passes", func() *config.Config { c := active(); c.Callbacks = nil; return c }, "openai", ci, false},
		{"disabled passes", func() *config.Config { c := active(); c.Interception.Enabled = false; return c }, "openai", ci, false},
		{"provider not enabled passes", func() *config.Config {
			c := active()
			c.Interception.EnabledProviders = []string{"hosted_vllm"}
			return c
		}, "openai", ci, false},
		{"provider enabled", func() *config.Config { c := active(); c.Interception.EnabledProviders = []string{"openai"}; return c }, "openai", ci, true},
		{"empty provider list enables none", func() *config.Config { c := active(); c.Interception.EnabledProviders = []string{}; return c }, "openai", ci, false},
		{"no tools passes", active, "openai", []byte(`{"model":"m"}`), false},
		{"only other tools pass", active, "openai", []byte(`{"model":"m","tools":[{"type":"web_search"}]}`), false},
		{"invalid JSON passes", active, "openai", []byte(`{"tools":[{"type":"code_interpreter"}]`), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := intercepted(t, New(Options{Store: storetest.NewMemResponses(nil)}), &Request{Config: tt.cfg(), Provider: tt.provider, Body: tt.body}); got != tt.want {
				t.Errorf("Intercepted = %v; want %v", got, tt.want)
			}
		})
	}
}

func TestPrepareLeavesOthersToPassThrough(t *testing.T) {
	e := New(Options{Store: storetest.NewMemResponses(nil)})
	cfg := activeConfig()
	if intercepted(t, e, &Request{Config: cfg, Provider: "openai", Body: []byte(`{"model":"m","input":"hi"}`)}) {
		t.Fatal("Intercepted = true for a request without code_interpreter")
	}
}

func TestClientErrors(t *testing.T) { forEachAPI(t, testClientErrors) }

func testClientErrors(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api))
	tests := []struct {
		name, body, param string
		status            int
	}{
		{"a client function named like the stand-in", `{"model":"gpt-test","input":"x","tools":[{"type":"code_interpreter","container":{"type":"auto"}},{"type":"function","name":"python","parameters":{}}]}`, "tools", 400},
		{"background mode", body(`"background":true`), "background", 400},
		{"a forged container id", `{"model":"gpt-test","input":"x","tools":[{"type":"function","name":"f"},{"type":"code_interpreter","container":"cntr_forged"}]}`, "tools[1].container", 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, resp := h.post(tt.body, "k")
			if status != tt.status || gjson.GetBytes(resp, "error.param").String() != tt.param || gjson.GetBytes(resp, "error.type").String() != "invalid_request_error" {
				t.Errorf("answer = %d %s; want %d with param %s", status, resp, tt.status, tt.param)
			}
		})
	}
	if n := len(h.up.Requests()); n != 0 {
		t.Errorf("upstream got %d requests; want 0", n)
	}
}

func TestContainerReuseAndOwner(t *testing.T) { forEachAPI(t, testContainerReuseAndOwner) }

func testContainerReuseAndOwner(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api), withLocal(), withConfig(func(c *config.Config) { c.Interception.ContainerIdleTimeout = 600e9 }))
	h.up.Enqueue(
		upstreamtest.Turn{Items: []upstreamtest.Item{call("secret = 41")}},
		upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Stored.")}},
	)
	status, resp := h.post(body(""), "alice")
	if status != 200 {
		t.Fatalf("first: %d %s", status, resp)
	}
	cid := gjson.GetBytes(resp, "output.0.container_id").String()
	tools := `"tools":[{"type":"code_interpreter","container":"` + cid + `"}]`

	t.Run("another owner gets 404", func(t *testing.T) {
		status, resp := h.post(`{"model":"gpt-test","input":"x",`+tools+`}`, "mallory")
		if status != 404 || !strings.Contains(gjson.GetBytes(resp, "error.message").String(), cid) {
			t.Errorf("answer = %d %s; want 404 naming the container", status, resp)
		}
	})
	t.Run("the owner keeps its state", func(t *testing.T) {
		h.up.Enqueue(
			upstreamtest.Turn{Items: []upstreamtest.Item{call("secret + 1")}},
			upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("42.")}},
		)
		status, resp := h.post(`{"model":"gpt-test","input":"x",`+tools+`}`, "alice")
		if status != 200 || gjson.GetBytes(resp, "output.0.container_id").String() != cid {
			t.Fatalf("answer = %d %s", status, resp)
		}
		reqs := h.up.Requests()
		if got := fcOutputs(reqs[len(reqs)-1]); len(got) != 1 || got[0] != "42" {
			t.Errorf("model saw %q; want 42", got)
		}
	})
}

func TestSandboxUnavailable(t *testing.T) { forEachAPI(t, testSandboxUnavailable) }

func testSandboxUnavailable(t *testing.T, api upstreamAPI) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			h := newHarness(t, onAPI(api), noSandbox())
			h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{call("1")}})
			extra := ""
			if stream {
				extra = `"stream":true`
			}
			status, raw := h.post(body(extra), "k")
			if strings.Contains(string(raw), `"function_call"`) || strings.Contains(string(raw), `"python"`) {
				t.Errorf("the stand-in call leaked: %s", raw)
			}
			if !stream {
				if status != 502 || gjson.GetBytes(raw, "error.code").String() != "sandbox_unavailable" {
					t.Errorf("answer = %d %s", status, raw)
				}
				return
			}
			checkStream(t, raw)
			evs := parseSSE(t, raw)
			n := len(evs)
			if n < 2 || evs[n-2].Name != "error" || gjson.GetBytes(evs[n-2].Data, "error.code").String() != "sandbox_unavailable" || evs[n-1].Name != "response.failed" {
				t.Errorf("stream ends with %v", eventTypes(evs))
			}
			if c := gjson.GetBytes(finalResponse(t, evs), "error.code").String(); c != "sandbox_unavailable" {
				t.Errorf("response.failed error code = %q", c)
			}
		})
	}
}

func TestMetrics(t *testing.T) { forEachAPI(t, testMetrics) }

func testMetrics(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api))
	h.fake.setRun(func(context.Context, string) (sandbox.Result, error) {
		return sandbox.Result{Error: &sandbox.ExecError{Name: "ZeroDivisionError", Value: "division by zero"}}, nil
	})
	h.up.Enqueue(calls("1/0"), text("failed"))
	if status, resp := h.post(body(""), "k"); status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	h.up.Enqueue(upstreamtest.Turn{Error: upstreamtest.APIError(500, "", "down", "")})
	h.post(body(""), "k")

	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.GetCounter() != nil:
				got[key] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				got[key+"_count"] = float64(m.GetHistogram().GetSampleCount())
				got[key+"_sum"] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	for key, want := range map[string]float64{
		"ciproxy_intercept_requests_total{outcome=completed}":           1,
		"ciproxy_intercept_requests_total{outcome=upstream_error}":      1,
		"ciproxy_intercept_code_executions_total{status=failed}":        1,
		"ciproxy_intercept_code_execution_seconds{status=failed}_count": 1,
		"ciproxy_intercept_iterations_count":                            1,
		"ciproxy_intercept_iterations_sum":                              2,
	} {
		if got[key] != want {
			t.Errorf("%s = %v; want %v", key, got[key], want)
		}
	}
}

// panickingUpstream answers its first call from a recording, then panics: a fault injected to
// prove the engine releases the sandbox (which then holds a container) and answers.
type panickingUpstream struct {
	first *cannedUpstream
	calls int
}

func (p *panickingUpstream) Responses(ctx context.Context, body []byte, h http.Header) (upstream.ResponseEvents, error) {
	p.calls++
	if p.calls == 1 {
		return p.first.Responses(ctx, body, h)
	}
	panic("injected fault")
}

func TestPanicReleasesTheSandbox(t *testing.T) {
	h := newHarness(t, withConfig(func(c *config.Config) { c.Interception.ContainerIdleTimeout = 0 }))
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/v1/responses", nil)
	p := &panickingUpstream{first: &cannedUpstream{bodies: [][]byte{record(t, false, calls("x = 1"))}}}
	serveLikeRouter(w, r, func() error {
		return serveResponses(h.eng, w, r, &Request{Config: h.cfg, Upstream: p, Body: []byte(body("")), Caller: "k"})
	})
	if p.calls != 2 {
		t.Fatalf("upstream calls = %d; want 2", p.calls)
	}
	if w.Code != 500 || gjson.GetBytes(w.Body.Bytes(), "error.type").String() != "server_error" || strings.Contains(w.Body.String(), "injected") {
		t.Errorf("answer = %d %s; want a generic 500", w.Code, w.Body.String())
	}
	testutil.Eventually(t, "the container to be released", func() bool { return h.live() == 0 })
}

// TestWithoutCodeInterpreter: a request without a code_interpreter tool, when a caller routes it
// to the engine, is one upstream call passed on under a minted, stored id; no container is made,
// and a client function named like the stand-in is the client's.
func TestWithoutCodeInterpreter(t *testing.T) { forEachAPI(t, testWithoutCodeInterpreter) }

func testWithoutCodeInterpreter(t *testing.T, api upstreamAPI) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			h := newHarness(t, onAPI(api))
			h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", `{"code":"1"}`)}})
			b := `{"model":"gpt-test","input":"x","tools":[{"type":"function","name":"python","parameters":{}}],"stream":` + map[bool]string{false: "false", true: "true"}[stream] + `}`
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/v1/responses", nil)
			if err := serveResponses(h.eng, w, r, h.request([]byte(b), "k")); err != nil {
				t.Fatalf("serve = %v", err)
			}
			resp := w.Body.Bytes()
			if stream {
				resp = checkStream(t, resp).Response
			}
			id := gjson.GetBytes(resp, "id").String()
			if w.Code != http.StatusOK || !strings.HasPrefix(id, "resp_") || len(id) != len("resp_")+48 {
				t.Fatalf("answer = %d %s; want 200 under a minted id", w.Code, resp)
			}
			if it := gjson.GetBytes(resp, "output.0"); it.Get("type").String() != "function_call" || it.Get("name").String() != "python" {
				t.Errorf("output = %s; want the client's function call as it came", gjson.GetBytes(resp, "output").Raw)
			}
			if n := len(h.up.Requests()); n != 1 {
				t.Errorf("upstream calls = %d; want 1", n)
			}
			if ok, _ := h.eng.Minted(r.Context(), id); !ok {
				t.Error("the response id was not stored")
			}
			if h.fake.Created() != 0 || len(h.fake.Codes()) != 0 {
				t.Errorf("containers created %d, code run %q; want none", h.fake.Created(), h.fake.Codes())
			}
		})
	}
}

// TestMetricsOnASharedRegistry: a second engine on the same registry counts on the collectors the
// registry serves, not on unregistered ones.
func TestMetricsOnASharedRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	first, second := New(Options{Store: storetest.NewMemResponses(nil), Metrics: reg}), New(Options{Store: storetest.NewMemResponses(nil), Metrics: reg})
	second.m.requests.WithLabelValues("completed").Inc()
	second.m.executions.WithLabelValues("failed").Inc()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			served[mf.GetName()] += m.GetCounter().GetValue()
		}
	}
	for _, name := range []string{"ciproxy_intercept_requests_total", "ciproxy_intercept_code_executions_total"} {
		if served[name] != 1 {
			t.Errorf("%s served = %v; want 1", name, served[name])
		}
	}
	if first.m.requests != second.m.requests {
		t.Error("the engines count on different collectors")
	}
}

func TestPrepareTakesEveryRequestForAStatelessUpstream(t *testing.T) {
	e := New(Options{Store: storetest.NewMemResponses(nil)})
	cfg := config.Defaults() // interception not even active
	if !intercepted(t, e, &Request{Config: cfg, Provider: "deepseek", Body: []byte(`{"model":"m","input":"hi"}`), Stateless: true}) {
		t.Fatal("Intercepted = false for a stateless upstream")
	}
	if intercepted(t, e, &Request{Provider: "deepseek", Body: []byte(`{"model":"m","input":"hi"}`), Stateless: true}) {
		t.Fatal("Intercepted = true without a config")
	}
}
