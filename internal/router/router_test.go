package router

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

func TestRequestValidation(t *testing.T) {
	up := newUpstream(t, nil)
	passing := newProxy(t, testConfig(up.URL+"/v1"))
	// Every POST /v1/responses of this one is intercepted: the checks come before.
	intercepting := newProxy(t, testConfig(up.URL+"/v1"), func(o *Options) { o.Interceptor = namedInterceptor{name: "r"} })
	cases := []struct {
		name      string
		body      string
		wantParam string
		wantCode  string
		wantMsg   string
	}{
		{"malformed JSON", `{"model":"gpt-test",`, "", "", "parse the JSON body"},
		{"JSON that is not an object", `["gpt-test"]`, "", "", "parse the JSON body"},
		{"empty body", ``, "", "", "parse the JSON body"},
		{"missing model", `{"input":"hi"}`, "model", "", "you must provide a model parameter"},
		{"null model", `{"model":null}`, "model", "", "you must provide a model parameter"},
		{"model that is not a string", `{"model":42}`, "model", "invalid_type", "Invalid type for 'model': expected a string, but got an integer instead."},
		{"model that is an object", `{"model":{"name":"gpt-test"}}`, "model", "invalid_type", "Invalid type for 'model': expected a string, but got an object instead."},
		{"empty model", `{"model":""}`, "model", "", "you must provide a model parameter"},
		{"unknown model", `{"model":"gpt-nope"}`, "model", "model_not_found", "The model 'gpt-nope' does not exist or you do not have access to it."},
		{"a key named twice", `{"model":"gpt-test","tools":[],"input":"x","tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`, "tools", "", "names 'tools' more than once"},
		{"a key named twice, once escaped", `{"model":"gpt-test","tools":[],"tool\u0073":[{"type":"code_interpreter"}]}`, "tools", "", "names 'tools' more than once"},
		{"the model named twice", `{"model":"gpt-test","model":"gpt-test"}`, "model", "", "names 'model' more than once"},
		{"an empty key named twice", `{"model":"gpt-test","":1,"":2}`, "", "", "names '' more than once"},
		// The proxy reads the first of two keys, OpenAI the last: a function tool that is OpenAI's
		// own code_interpreter would run the code on OpenAI's containers.
		{"a tool's type named twice", `{"model":"gpt-test","tools":[{"type":"function","name":"f","parameters":{},"type":"code_interpreter","container":{"type":"auto"}}]}`, "tools[0].type", "", "names 'tools[0].type' more than once"},
		{"beside a real code_interpreter", `{"model":"gpt-test","tools":[{"type":"code_interpreter","container":{"type":"auto"}},{"type":"function","name":"f","type":"code_interpreter"}]}`, "tools[1].type", "", "names 'tools[1].type' more than once"},
		{"escaped, deep in an input item", `{"model":"gpt-test","input":[{"role":"user","content":[{"type":"input_text","text":"a","t\u0065xt":"b"}]}]}`, "input[0].content[0].text", "", "more than once"},
		{"in a nested container object", `{"model":"gpt-test","tools":[{"type":"code_interpreter","container":{"type":"auto","type":"cntr_x"}}]}`, "tools[0].container.type", "", "more than once"},
	}
	for _, p := range []*proxy{passing, intercepting} {
		for _, path := range []string{"/v1/responses", "/chat/completions", "/v1/completions", "/embeddings"} {
			for _, tc := range cases {
				t.Run(path+"/"+tc.name, func(t *testing.T) {
					req, _ := http.NewRequest(http.MethodPost, p.URL+path, strings.NewReader(tc.body))
					resp, err := p.Client().Do(req)
					if err != nil {
						t.Fatal(err)
					}
					defer resp.Body.Close()
					var buf bytes.Buffer
					_, _ = buf.ReadFrom(resp.Body)
					if resp.StatusCode != http.StatusBadRequest {
						t.Fatalf("POST %s %s = %d %s; want 400", path, tc.body, resp.StatusCode, buf.Bytes())
					}
					msg, typ, param, code := decodeError(t, buf.Bytes())
					if typ != "invalid_request_error" || param != tc.wantParam || code != tc.wantCode || !strings.Contains(msg, tc.wantMsg) {
						t.Errorf("error = %s; want type invalid_request_error, param %q, code %q, message containing %q", buf.Bytes(), tc.wantParam, tc.wantCode, tc.wantMsg)
					}
				})
			}
		}
	}
	if n := len(up.requests()); n != 0 {
		t.Errorf("upstream got %d requests for invalid ones", n)
	}
}

// TestStoredResponsesSkipUnusableDeployments: a request that names no model goes to the first
// deployment that can be called, not to one the proxy cannot call.
func TestStoredResponsesSkipUnusableDeployments(t *testing.T) {
	up := newUpstream(t, nil)
	p := newProxy(t, testConfig(up.URL+"/v1", func(c *config.Config) {
		bedrock := config.Deployment{ModelName: "claude", Provider: "bedrock", UpstreamModel: "anthropic.claude-3", Unusable: "provider bedrock cannot be called", Line: 2}
		c.Models = append([]config.Deployment{bedrock}, c.Models...)
	}))
	status, _, body := p.do(t, http.MethodGet, "/v1/responses/resp_1", "", "Authorization", "Bearer client-key")
	if status != http.StatusOK || len(up.requests()) != 1 {
		t.Fatalf("GET /v1/responses/resp_1 = %d %s after %d upstream requests; want 200 from the usable deployment", status, body, len(up.requests()))
	}
}

func TestPathForms(t *testing.T) {
	up := newUpstream(t, nil)
	p := newProxy(t, testConfig(up.URL+"/v1"))
	model := `{"model":"gpt-test","input":"hi"}`
	cases := []struct {
		method, path, body string
		wantUpstream       string
	}{
		{http.MethodPost, "/responses", model, "/v1/responses"},
		{http.MethodGet, "/responses/resp_123", "", "/v1/responses/resp_123"},
		{http.MethodDelete, "/responses/resp_123", "", "/v1/responses/resp_123"},
		{http.MethodGet, "/responses/resp_123/input_items", "", "/v1/responses/resp_123/input_items"},
		{http.MethodPost, "/responses/resp_123/cancel", "", "/v1/responses/resp_123/cancel"},
		{http.MethodPost, "/chat/completions", model, "/v1/chat/completions"},
		{http.MethodPost, "/completions", model, "/v1/completions"},
		{http.MethodPost, "/embeddings", model, "/v1/embeddings"},
	}
	for _, prefix := range []string{"/v1", ""} {
		for _, tc := range cases {
			t.Run(tc.method+" "+prefix+tc.path, func(t *testing.T) {
				before := len(up.requests())
				status, _, body := p.do(t, tc.method, prefix+tc.path, tc.body, "Authorization", "Bearer client-key")
				if status != http.StatusOK {
					t.Fatalf("%s %s = %d %s; want 200", tc.method, prefix+tc.path, status, body)
				}
				reqs := up.requests()
				if len(reqs) != before+1 {
					t.Fatalf("upstream got %d requests; want 1", len(reqs)-before)
				}
				got := reqs[len(reqs)-1]
				if got.Method != tc.method || got.Path != tc.wantUpstream {
					t.Errorf("upstream saw %s %s; want %s %s", got.Method, got.Path, tc.method, tc.wantUpstream)
				}
				if a := got.Header.Get("Authorization"); a != "Bearer sk-upstream-secret" {
					t.Errorf("upstream Authorization = %q; want the deployment's key, never the client's", a)
				}
				if tc.body != "" {
					if m := gjson.GetBytes(got.Body, "model").Str; m != "gpt-test-upstream" {
						t.Errorf("upstream model = %q; want gpt-test-upstream", m)
					}
					if in := gjson.GetBytes(got.Body, "input").Str; in != "hi" {
						t.Errorf("upstream input = %q; want the client's bytes kept", in)
					}
				}
			})
		}
	}
}

// TestByIDRefusesPathTricks: a response id is one path segment. An id that decodes to a dot
// segment or holds a slash would make the pass-through path climb to another upstream endpoint
// (/v1/responses/%2e%2e%2ffiles -> GET /v1/files) with the deployment's key; it is refused before
// anything reaches the upstream.
func TestByIDRefusesPathTricks(t *testing.T) {
	up := newUpstream(t, nil)
	p := newProxy(t, testConfig(up.URL+"/v1"))
	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/v1/responses/%2e%2e"},
		{http.MethodDelete, "/v1/responses/..%2f..%2ffiles%2ffile-abc"},
		{http.MethodGet, "/v1/responses/x%2f..%2f..%2ffiles/input_items"},
		{http.MethodPost, "/v1/responses/%2e%2e%2f%2e%2e%2fbatches%2fbatch_1/cancel"},
		{http.MethodPost, "/v1/responses/%2e%2e/cancel"},
		{http.MethodGet, "/v1/responses/%2e"},
		{http.MethodGet, "/responses/a%5c..%5c..%5cfiles"},
		{http.MethodGet, "/v1/responses/resp_%00"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			before := len(up.requests())
			req, err := http.NewRequest(tc.method, p.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer client-key")
			resp, err := p.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("%s %s = %d %s; want 400", tc.method, tc.path, resp.StatusCode, body)
			} else if _, typ, param, _ := decodeError(t, body); typ != "invalid_request_error" || param != "response_id" {
				t.Errorf("error type %q param %q; want invalid_request_error on response_id", typ, param)
			}
			for _, r := range up.requests()[before:] {
				t.Errorf("upstream got %s %s; want nothing sent", r.Method, r.Path)
			}
		})
	}
}

func TestByIDWithoutDeployments(t *testing.T) {
	p := newProxy(t, &config.Config{General: config.General{MaxRequestBodySize: 1 << 20}})
	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/v1/responses/resp_1"},
		{http.MethodDelete, "/responses/resp_1"},
		{http.MethodGet, "/v1/responses/resp_1/input_items"},
		{http.MethodPost, "/v1/responses/resp_1/cancel"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			status, _, body := p.do(t, tc.method, tc.path, "")
			if status != http.StatusNotFound {
				t.Fatalf("%s %s = %d %s; want 404", tc.method, tc.path, status, body)
			}
			if msg, _, _, _ := decodeError(t, body); !strings.Contains(msg, "model_list") {
				t.Errorf("message %q should say that no upstream is configured", msg)
			}
		})
	}
}

func TestModels(t *testing.T) {
	p := newProxy(t, testConfig("http://127.0.0.1:1/v1", func(c *config.Config) {
		c.Models = []config.Deployment{
			deployment("gpt-b", "http://127.0.0.1:1/v1"),
			deployment("gpt-a", "http://127.0.0.1:1/v1"),
			deployment("gpt-b", "http://127.0.0.2:1/v1"),
			{ModelName: "Qwen/Qwen3-8B", Provider: "hosted_vllm", UpstreamModel: "qwen", APIBase: "http://127.0.0.1:1/v1"},
			{ModelName: "claude", Provider: "bedrock", UpstreamModel: "anthropic.claude-3", Unusable: "provider bedrock cannot be called"},
			{ModelName: "keyless", Provider: "openai", UpstreamModel: "gpt-4o", MissingEnv: "OPENAI_API_KEY"},
			{ModelName: "gpt-a", Provider: "bedrock", UpstreamModel: "x", Unusable: "provider bedrock cannot be called"},
		}
	}))
	for _, path := range []string{"/v1/models", "/models"} {
		t.Run(path, func(t *testing.T) {
			status, h, body := p.do(t, http.MethodGet, path, "")
			if status != http.StatusOK || !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
				t.Fatalf("GET %s = %d %s %s", path, status, h.Get("Content-Type"), body)
			}
			var list struct {
				Object string `json:"object"`
				Data   []struct {
					ID      *string `json:"id"`
					Object  *string `json:"object"`
					Created *int64  `json:"created"`
					OwnedBy *string `json:"owned_by"`
				} `json:"data"`
			}
			if err := json.Unmarshal(body, &list); err != nil {
				t.Fatal(err)
			}
			if list.Object != "list" {
				t.Errorf("object = %q; want list", list.Object)
			}
			var ids []string
			for _, m := range list.Data {
				if m.ID == nil || m.Object == nil || *m.Object != "model" || m.Created == nil || *m.Created <= 0 || m.OwnedBy == nil {
					t.Fatalf("model entry incomplete in %s", body)
				}
				ids = append(ids, *m.ID)
			}
			if got, want := strings.Join(ids, ","), "gpt-b,gpt-a,Qwen/Qwen3-8B"; got != want {
				t.Errorf("ids = %s; want %s (one per callable model_name, file order)", got, want)
			}
			if *list.Data[2].OwnedBy != "hosted_vllm" {
				t.Errorf("owned_by = %q; want the provider", *list.Data[2].OwnedBy)
			}
		})
	}
	t.Run("retrieve one model", func(t *testing.T) {
		status, _, body := p.do(t, http.MethodGet, "/v1/models/gpt-a", "")
		if status != http.StatusOK || gjson.GetBytes(body, "id").Str != "gpt-a" || gjson.GetBytes(body, "object").Str != "model" {
			t.Errorf("GET /v1/models/gpt-a = %d %s", status, body)
		}
	})
	t.Run("retrieve a model whose name has a slash", func(t *testing.T) {
		status, _, body := p.do(t, http.MethodGet, "/models/Qwen/Qwen3-8B", "")
		if status != http.StatusOK || gjson.GetBytes(body, "id").Str != "Qwen/Qwen3-8B" || gjson.GetBytes(body, "owned_by").Str != "hosted_vllm" {
			t.Errorf("GET /models/Qwen/Qwen3-8B = %d %s", status, body)
		}
	})
	t.Run("retrieve a model no deployment of which can be called", func(t *testing.T) {
		for _, name := range []string{"claude", "keyless"} {
			status, _, body := p.do(t, http.MethodGet, "/v1/models/"+name, "")
			if _, _, _, code := decodeError(t, body); status != http.StatusNotFound || code != "model_not_found" {
				t.Errorf("GET /v1/models/%s = %d %s; want 404 model_not_found", name, status, body)
			}
		}
	})
	t.Run("retrieve an unknown model", func(t *testing.T) {
		status, _, body := p.do(t, http.MethodGet, "/models/gpt-x", "")
		if _, _, _, code := decodeError(t, body); status != http.StatusNotFound || code != "model_not_found" {
			t.Errorf("GET /models/gpt-x = %d %s; want 404 model_not_found", status, body)
		}
	})
}

func TestUnknownRoutes(t *testing.T) {
	p := newProxy(t, testConfig("http://127.0.0.1:1/v1"))
	cases := []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/v1/nothing", http.StatusNotFound},
		{http.MethodPost, "/v1/responses/resp_1/extra/parts", http.StatusNotFound},
		{http.MethodGet, "/nothing", http.StatusNotFound},
		{http.MethodPut, "/v1/responses", http.StatusMethodNotAllowed},
		{http.MethodGet, "/v1/chat/completions", http.StatusMethodNotAllowed},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			status, _, body := p.do(t, tc.method, tc.path, "")
			if status != tc.want {
				t.Fatalf("%s %s = %d %s; want %d", tc.method, tc.path, status, body, tc.want)
			}
			decodeError(t, body)
		})
	}
}

func TestUpstreamErrors(t *testing.T) {
	quota := `{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(quota))
	})
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadBase := "http://" + closed.Addr().String() + "/v1"
	closed.Close()

	p := newProxy(t, testConfig(up.URL+"/v1", func(c *config.Config) {
		c.Models = append(c.Models,
			deployment("gpt-dead", deadBase),
			config.Deployment{ModelName: "gpt-noenv", Provider: "openai", UpstreamModel: "x", APIBase: up.URL + "/v1", MissingEnv: "MY_UNSET_OPENAI_KEY"},
		)
	}))

	t.Run("upstream status and body are kept", func(t *testing.T) {
		for _, path := range []string{"/v1/responses", "/v1/chat/completions"} {
			status, h, body := p.do(t, http.MethodPost, path, `{"model":"gpt-test"}`)
			if status != http.StatusTooManyRequests || string(bytes.TrimSpace(body)) != quota || h.Get("Retry-After") != "7" {
				t.Errorf("POST %s = %d %s (Retry-After %q); want 429 with the upstream's body and headers", path, status, body, h.Get("Retry-After"))
			}
		}
	})
	t.Run("unreachable upstream is a 502", func(t *testing.T) {
		status, _, body := p.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"gpt-dead"}`)
		if status != http.StatusBadGateway {
			t.Fatalf("status = %d %s; want 502", status, body)
		}
		msg, _, _, _ := decodeError(t, body)
		if strings.Contains(msg, "sk-upstream-secret") {
			t.Errorf("502 message leaks the upstream key: %q", msg)
		}
	})
	t.Run("deployment with a missing variable names it", func(t *testing.T) {
		before := len(up.requests())
		status, _, body := p.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"gpt-noenv"}`)
		if status < 400 {
			t.Fatalf("status = %d %s; want an error", status, body)
		}
		if msg, _, _, _ := decodeError(t, body); !strings.Contains(msg, "MY_UNSET_OPENAI_KEY") {
			t.Errorf("message %q should name the missing variable", msg)
		}
		if len(up.requests()) != before {
			t.Errorf("a deployment with a missing key must not call upstream")
		}
	})
}

func TestReadiness(t *testing.T) {
	var state atomic.Value
	p := newProxy(t, testConfig("http://127.0.0.1:1/v1"), func(o *Options) {
		o.Ready = func(context.Context) Readiness { return state.Load().(Readiness) }
	})
	empty := newProxy(t, nil)
	cases := []struct {
		name     string
		p        *proxy
		state    Readiness
		path     string
		want     int
		wantBody string
	}{
		{"healthz is 200 while not ready", p, Readiness{NotReady: "shutting down"}, "/healthz", http.StatusOK, `"ok"`},
		{"readyz is 503 with the reason", p, Readiness{NotReady: "shutting down"}, "/readyz", http.StatusServiceUnavailable, `"reason":"shutting down"`},
		{"readyz is 200 when ready", p, Readiness{}, "/readyz", http.StatusOK, `{"status":"ready"}`},
		{"readyz is 200 and names a shared fault", p, Readiness{Degraded: "the state store is unavailable"}, "/readyz", http.StatusOK, `"degraded":"the state store is unavailable"`},
		{"readyz is 503 without a configuration", empty, Readiness{}, "/readyz", http.StatusServiceUnavailable, "no configuration"},
		{"API is 503 without a configuration", empty, Readiness{}, "/v1/models", http.StatusServiceUnavailable, "not ready"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			state.Store(tc.state)
			status, _, body := tc.p.do(t, http.MethodGet, tc.path, "")
			if status != tc.want || !strings.Contains(string(body), tc.wantBody) {
				t.Errorf("GET %s = %d %s; want %d with %s", tc.path, status, body, tc.want, tc.wantBody)
			}
		})
	}
}

// interceptCall is what one Prepare call received.
type interceptCall struct {
	cfg      *config.Config
	target   upstream.ResponsesAPI
	provider string
	body     string
	caller   string
}

// recordingInterceptor claims requests whose input is "intercept me" (answering them), "fail me"
// (failing with a client error) or "upstream error" (failing with an upstream's 429), and
// records what Prepare was given.
type recordingInterceptor struct {
	mu    sync.Mutex
	calls []interceptCall
}

func (ri *recordingInterceptor) Prepare(ctx context.Context, req *intercept.Request) (*intercept.Plan, error) {
	ri.mu.Lock()
	ri.calls = append(ri.calls, interceptCall{req.Config, req.Upstream, req.Provider, string(req.Body), req.Caller})
	ri.mu.Unlock()
	handles := false
	switch gjson.GetBytes(req.Body, "input").Str {
	case "intercept me", "fail me", "upstream error":
		handles = true
	}
	return planned(ctx, nil, req, handles, ri.Minted)
}

func (ri *recordingInterceptor) Serve(w http.ResponseWriter, r *http.Request, plan *intercept.Plan) error {
	req := plan.Request
	switch gjson.GetBytes(req.Body, "input").Str {
	case "fail me":
		return apierror.BadRequest("Refused by the interceptor.", "input", "refused")
	case "upstream error":
		return fmt.Errorf("calling upstream: %w", &upstream.StatusError{Status: http.StatusTooManyRequests,
			Header: http.Header{"Content-Type": {"application/json"}, "Retry-After": {"7"}},
			Body:   []byte(`{"error":{"message":"Slow down.","type":"rate_limit_exceeded","param":null,"code":"rate_limit_exceeded"}}`)})
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"object":"response","intercepted":true}`))
	return nil
}

// Minted claims the id "resp_ours" and lets every other id pass through.
func (ri *recordingInterceptor) Minted(_ context.Context, id string) (bool, error) {
	return id == "resp_ours", nil
}

func (ri *recordingInterceptor) ServeStored(w http.ResponseWriter, r *http.Request, id, caller string) error {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"id":"resp_ours","stored":true,"method":"` + r.Method + `","caller":"` + caller + `"}`))
	return nil
}

func (ri *recordingInterceptor) ServeInputItems(w http.ResponseWriter, r *http.Request, id, caller string) error {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"object":"list","input_items_of":"` + id + `","caller":"` + caller + `"}`))
	return nil
}

func (ri *recordingInterceptor) ServeCancel(w http.ResponseWriter, r *http.Request, id, caller string) error {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"cancelled":"` + id + `","caller":"` + caller + `"}`))
	return nil
}

func (ri *recordingInterceptor) recorded() []interceptCall {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	return append([]interceptCall(nil), ri.calls...)
}

func TestInterceptor(t *testing.T) {
	up := newUpstream(t, nil)
	ri := &recordingInterceptor{}
	cfg := testConfig(up.URL + "/v1")
	p := newProxy(t, cfg, func(o *Options) { o.Interceptor = ri })

	body := `{"model":"gpt-test","input":"intercept me"}`
	status, _, got := p.do(t, http.MethodPost, "/v1/responses", body, "Authorization", "Bearer abc")
	if status != http.StatusOK || !gjson.GetBytes(got, "intercepted").Bool() {
		t.Fatalf("claimed request = %d %s; want the interceptor's answer", status, got)
	}
	calls := ri.recorded()
	if len(calls) != 1 {
		t.Fatalf("interceptor called %d times; want 1", len(calls))
	}
	if c := calls[0]; c.cfg != cfg || c.target == nil || c.provider != "openai" || c.body != body || c.caller != "ba7816bf8f01cfea414140de5dae2223" {
		t.Errorf("interceptor got cfg %p target %v provider %q body %q caller %q", c.cfg, c.target, c.provider, c.body, c.caller)
	}
	if n := len(up.requests()); n != 0 {
		t.Errorf("upstream got %d requests for a claimed one", n)
	}

	status, _, got = p.do(t, http.MethodPost, "/responses", `{"model":"gpt-test","input":"not for you"}`)
	calls = ri.recorded()
	if status != http.StatusOK || gjson.GetBytes(got, "path").Str != "/v1/responses" || len(calls) != 2 || calls[1].caller != "" {
		t.Errorf("declined request = %d %s; want the pass-through answer and an empty caller", status, got)
	}
	status, _, _ = p.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"gpt-test","input":"intercept me"}`)
	if n := len(ri.recorded()); status != http.StatusOK || n != 2 {
		t.Errorf("chat completions = %d, interceptor calls %d; only /responses may reach the interceptor", status, n)
	}

	// The interceptor's errors before the first byte are written by the router's error path.
	status, _, got = p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"fail me"}`)
	if _, typ, param, code := decodeError(t, got); status != http.StatusBadRequest || typ != "invalid_request_error" || param != "input" || code != "refused" {
		t.Errorf("a refused request = %d %s; want the interceptor's 400", status, got)
	}
	status, hdr, got := p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"upstream error"}`)
	if status != http.StatusTooManyRequests || hdr.Get("Retry-After") != "7" || gjson.GetBytes(got, "error.code").Str != "rate_limit_exceeded" {
		t.Errorf("an upstream's error = %d %v %s; want its 429, body and Retry-After as they came", status, hdr, got)
	}

	// Stored responses: the interceptor answers for its own ids, the upstream for the others.
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		status, _, got = p.do(t, method, "/v1/responses/resp_ours", "", "Authorization", "Bearer abc")
		if status != http.StatusOK || !gjson.GetBytes(got, "stored").Bool() || gjson.GetBytes(got, "method").Str != method ||
			gjson.GetBytes(got, "caller").Str != "ba7816bf8f01cfea414140de5dae2223" {
			t.Errorf("%s /v1/responses/resp_ours = %d %s; want the interceptor's answer with the caller", method, status, got)
		}
	}
	status, _, got = p.do(t, http.MethodGet, "/v1/responses/resp_ours/input_items?limit=2", "", "Authorization", "Bearer abc")
	if status != http.StatusOK || gjson.GetBytes(got, "input_items_of").Str != "resp_ours" || gjson.GetBytes(got, "caller").Str != "ba7816bf8f01cfea414140de5dae2223" {
		t.Errorf("GET /v1/responses/resp_ours/input_items = %d %s; want the interceptor's answer with the caller", status, got)
	}
	status, _, got = p.do(t, http.MethodPost, "/v1/responses/resp_ours/cancel", "", "Authorization", "Bearer abc")
	if status != http.StatusOK || gjson.GetBytes(got, "cancelled").Str != "resp_ours" || gjson.GetBytes(got, "caller").Str != "ba7816bf8f01cfea414140de5dae2223" {
		t.Errorf("POST /v1/responses/resp_ours/cancel = %d %s; want the interceptor's answer with the caller", status, got)
	}
	before := len(up.requests())
	status, _, got = p.do(t, http.MethodGet, "/v1/responses/resp_theirs", "")
	if status != http.StatusOK || gjson.GetBytes(got, "path").Str != "/v1/responses/resp_theirs" || len(up.requests()) != before+1 {
		t.Errorf("GET /v1/responses/resp_theirs = %d %s; want it passed through", status, got)
	}
	status, _, got = p.do(t, http.MethodGet, "/v1/responses/resp_theirs/input_items", "")
	if status != http.StatusOK || gjson.GetBytes(got, "path").Str != "/v1/responses/resp_theirs/input_items" || len(up.requests()) != before+2 {
		t.Errorf("GET /v1/responses/resp_theirs/input_items = %d %s; want it passed through", status, got)
	}
	status, _, got = p.do(t, http.MethodPost, "/v1/responses/resp_theirs/cancel", "")
	if status != http.StatusOK || gjson.GetBytes(got, "path").Str != "/v1/responses/resp_theirs/cancel" || len(up.requests()) != before+3 {
		t.Errorf("POST /v1/responses/resp_theirs/cancel = %d %s; want it passed through", status, got)
	}
}
