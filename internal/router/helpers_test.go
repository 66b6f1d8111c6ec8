package router

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/snapshot"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

// seen is one request as the fake upstream received it.
type seen struct {
	Method, Path, Query string
	Header              http.Header
	Body                []byte
}

// fakeUpstream is an httptest server standing in for an OpenAI-compatible provider. Its handler
// records each request and then calls respond (nil: a small JSON echo of the path).
type fakeUpstream struct {
	*httptest.Server
	mu      sync.Mutex
	reqs    []seen
	respond http.HandlerFunc
}

func newUpstream(t *testing.T, respond http.HandlerFunc) *fakeUpstream {
	t.Helper()
	u := &fakeUpstream{respond: respond}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.reqs = append(u.reqs, seen{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone(), Body: body})
		u.mu.Unlock()
		if u.respond != nil {
			r.Body = io.NopCloser(bytes.NewReader(body))
			u.respond(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"path":"`+r.URL.Path+`"}`)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *fakeUpstream) requests() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.reqs...)
}

// deployment is a model_list entry served by the fake upstream at base (which ends in /v1).
func deployment(name, base string) config.Deployment {
	return config.Deployment{ModelName: name, Provider: "openai", UpstreamModel: name + "-upstream", APIBase: base, APIKey: "sk-upstream-secret", Line: 3}
}

// testConfig is a configuration with one model served by base and the usual defaults.
func testConfig(base string, mutate ...func(*config.Config)) *config.Config {
	c := &config.Config{
		Models: []config.Deployment{deployment("gpt-test", base)},
		General: config.General{
			MaxRequestBodySize: 1 << 20,
		},
	}
	for _, m := range mutate {
		m(c)
	}
	return c
}

// proxy is a router under test behind a real socket.
type proxy struct {
	*httptest.Server
	logs  *observer.ObservedLogs
	reg   *prometheus.Registry
	store *snapshot.Current
}

func newProxy(t *testing.T, cfg *config.Config, mutate ...func(*Options)) *proxy {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	reg := prometheus.NewRegistry()
	opts := Options{
		Store:    snapshot.Fixed(&snapshot.Snapshot{Config: cfg}),
		Client:   upstream.NewClient(upstream.ClientOptions{Logger: log}),
		Balancer: upstream.NewBalancer(),
		Logger:   log,
		Registry: reg,
	}
	for _, m := range mutate {
		m(&opts)
	}
	p := &proxy{Server: httptest.NewServer(New(opts)), logs: logs, reg: reg, store: opts.Store}
	t.Cleanup(p.Close)
	return p
}

// do sends a request and returns the status, headers and body.
func (p *proxy) do(t *testing.T, method, path, body string, header ...string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, p.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := p.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header, b
}

// openAIError is the wire shape of an error, with param and code kept nullable.
type openAIError struct {
	Error struct {
		Message *string `json:"message"`
		Type    *string `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// decodeError checks that body is OpenAI-shaped: all four keys present, message and type strings.
func decodeError(t *testing.T, body []byte) (msg, typ, param, code string) {
	t.Helper()
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("error body %q is not JSON: %v", body, err)
	}
	inner, ok := raw["error"]
	if !ok {
		t.Fatalf("error body %q has no \"error\" object", body)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := inner[k]; !ok {
			t.Fatalf("error body %q lacks key %q", body, k)
		}
	}
	var e openAIError
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatal(err)
	}
	if e.Error.Message == nil || e.Error.Type == nil {
		t.Fatalf("error body %q: message and type must be strings", body)
	}
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	return *e.Error.Message, *e.Error.Type, str(e.Error.Param), str(e.Error.Code)
}

// planned is a fake interceptor's Prepare: the plan of eng (nil: a plan that names no container),
// made under an active interception config so that it knows the container the request uses,
// intercepted when handles says so or when minted claims previous_response_id.
func planned(ctx context.Context, eng *intercept.Engine, req *intercept.Request, handles bool, minted func(context.Context, string) (bool, error)) (*intercept.Plan, error) {
	plan, err := &intercept.Plan{Request: req}, error(nil)
	if eng != nil {
		c, cfg := *req, *req.Config
		cfg.Interception = config.Defaults().Interception
		cfg.Callbacks = []string{"code_interpreter_interception"}
		c.Config = &cfg
		plan, err = eng.Prepare(ctx, &c)
		plan.Request = req
	}
	plan.Minted = false
	if prev := gjson.GetBytes(req.Body, "previous_response_id").String(); prev != "" {
		plan.Minted, _ = minted(ctx, prev)
	}
	plan.Intercepted = handles || plan.Minted
	return plan, err
}
