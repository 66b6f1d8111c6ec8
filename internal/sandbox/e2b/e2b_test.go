package e2b_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2b"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/localsandbox"
)

// sandboxes is the local sandbox every emulator in these tests executes through; one provider
// serves the whole package, since tests run one at a time. Tests skip where it cannot run.
var sandboxes = localsandbox.New(local.Options{PoolSize: -1})

func TestMain(m *testing.M) { testutil.Main(m, sandboxes.Close) }

// env is an e2b Provider talking to the emulator, which runs code in a real local sandbox.
type env struct {
	srv   *e2btest.Server
	exec  *local.Provider
	start time.Time
}

func newEnv(t testing.TB) (*env, *e2btest.Server) {
	t.Helper()
	execProvider := sandboxes.Provider(t)
	srv := e2btest.New(execProvider)
	e := &env{srv: srv, exec: execProvider, start: time.Date(2026, 8, 21, 18, 0, 0, 0, time.UTC)}
	srv.SetClock(func() time.Time { return e.start })
	t.Cleanup(func() {
		srv.Close()
		if n := execProvider.Live(); n != 0 {
			t.Errorf("local sandboxes alive after the emulator closed: %d", n)
		}
	})
	return e, srv
}

// provider returns a client in SandboxURL mode (one data-plane URL, routing headers).
func provider(t testing.TB, srv *e2btest.Server, mod ...func(*e2b.Options)) *e2b.Provider {
	t.Helper()
	opts := e2b.Options{APIKey: srv.APIKey(), APIBase: srv.URL(), SandboxURL: srv.SandboxURL(), HTTPClient: srv.Client(), Tool: "my-e2b"}
	for _, m := range mod {
		m(&opts)
	}
	p, err := e2b.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

func create(t testing.TB, p *e2b.Provider) sandbox.Handle {
	t.Helper()
	h, err := p.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return h
}

func TestCreateRequest(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv)
	h, err := p.Create(context.Background(), sandbox.CreateOptions{MemoryLimit: "4g", Metadata: map[string]string{"request": "r1"}})
	if err != nil {
		t.Fatal(err)
	}
	req, ok := srv.LastRequest("POST /sandboxes")
	if !ok {
		t.Fatal("no create request seen")
	}
	var body map[string]any
	if err := json.Unmarshal(req.Body, &body); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"templateID": "code-interpreter-v1", "timeout": float64(300), "secure": true, "allow_internet_access": false,
		"metadata": map[string]any{"created_by": "ciproxy", "memory_limit": "4g", "request": "r1"},
	}
	for k, w := range want {
		g, _ := json.Marshal(body[k])
		wb, _ := json.Marshal(w)
		if string(g) != string(wb) {
			t.Errorf("create body %s = %s; want %s", k, g, wb)
		}
	}
	if req.Header.Get("X-API-Key") != srv.APIKey() || req.Header.Get("Content-Type") != "application/json" {
		t.Errorf("create headers = %v", req.Header)
	}
	token, _, _ := srv.AccessToken(h.ID)
	if h.Backend != "e2b" || h.Tool != "my-e2b" || !regexp.MustCompile(`^i[a-z0-9]{20}$`).MatchString(h.ID) ||
		h.AccessToken != token || token == "" || h.Domain != "e2b.app" || h.TrafficToken != "" {
		t.Errorf("handle = %+v", h)
	}

	if _, err := p.Run(context.Background(), h, "1", sandbox.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	ex, _ := srv.LastRequest("49999 POST /execute")
	if ex.Header.Get("X-API-Key") != "" || strings.Contains(string(ex.Body), srv.APIKey()) {
		t.Error("the API key reached the data plane")
	}
	if ex.Header.Get("X-Access-Token") != token || ex.Header.Get("E2b-Sandbox-Id") != h.ID || ex.Header.Get("E2b-Sandbox-Port") != "49999" {
		t.Errorf("execute headers = %v", ex.Header)
	}
	if got := string(ex.Body); got != `{"code":"1","context_id":null,"language":null,"env_vars":{}}` {
		t.Errorf("execute body = %s", got)
	}
}

func TestCreateOptions(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv, func(o *e2b.Options) {
		o.Template = "base"
		o.Timeout = 90 * time.Second
		o.AllowInternetAccess = true
	})
	if _, err := p.Create(context.Background(), sandbox.CreateOptions{Lifetime: 1500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	req, _ := srv.LastRequest("POST /sandboxes")
	if !strings.Contains(string(req.Body), `"templateID":"base","timeout":2,`) || !strings.Contains(string(req.Body), `"allow_internet_access":true`) {
		t.Errorf("create body = %s; want template base, timeout rounded up to 2, internet on", req.Body)
	}
}

func TestRun(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	tests := []struct {
		name  string
		code  string
		check func(t *testing.T, r sandbox.Result)
	}{
		{"stdout and the last expression", "print('hi')\n1+1", func(t *testing.T, r sandbox.Result) {
			if r.Stdout != "hi\n" || len(r.Results) != 1 || r.Results[0].Text != "2" || !r.Results[0].IsMainResult || r.ExecutionCount != 1 {
				t.Errorf("result = %+v", r)
			}
		}},
		{"state is kept across runs", "x = 41", nil},
		{"state read back", "x + 1", func(t *testing.T, r sandbox.Result) {
			if len(r.Results) != 1 || r.Results[0].Text != "42" || r.ExecutionCount != 3 {
				t.Errorf("result = %+v", r)
			}
		}},
		{"stderr", "import sys; sys.stderr.write('warn\\n')", func(t *testing.T, r sandbox.Result) {
			if r.Stderr != "warn\n" {
				t.Errorf("stderr = %q", r.Stderr)
			}
		}},
		{"a Python exception is a result, not an error", "1/0", func(t *testing.T, r sandbox.Result) {
			if r.Error == nil || r.Error.Name != "ZeroDivisionError" || r.Error.Value != "division by zero" || !strings.Contains(r.Error.Traceback, "ZeroDivisionError") {
				t.Errorf("error = %+v", r.Error)
			}
		}},
		{"non-ASCII output survives the escapes", "print('é😀')", func(t *testing.T, r sandbox.Result) {
			if r.Stdout != "é😀\n" {
				t.Errorf("stdout = %q", r.Stdout)
			}
		}},
		{"matplotlib figure as png", "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1,2,3])\nplt.show()", func(t *testing.T, r sandbox.Result) {
			var png string
			for _, o := range r.Results {
				if o.PNG != "" {
					png = o.PNG
				}
			}
			b, err := base64.StdEncoding.DecodeString(png)
			if err != nil || len(b) < 8 || string(b[1:4]) != "PNG" {
				t.Errorf("no PNG in %d results (err %v)", len(r.Results), err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var msgs []string
			r, err := p.Run(context.Background(), h, tc.code, sandbox.RunOptions{OnMessage: func(m sandbox.Message) { msgs = append(msgs, m.Type) }})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if len(msgs) == 0 || msgs[len(msgs)-1] != sandbox.MessageEndOfExecution {
				t.Errorf("messages = %v; want them streamed, ending with end_of_execution", msgs)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

func TestKeepaliveIgnored(t *testing.T) {
	_, srv := newEnv(t)
	srv.SetKeepaliveInterval(20 * time.Millisecond)
	p := provider(t, srv)
	h := create(t, p)
	keepalives := 0
	r, err := p.Run(context.Background(), h, "import time\ntime.sleep(0.3)\nprint('done')", sandbox.RunOptions{
		OnMessage: func(m sandbox.Message) {
			if m.Type == sandbox.MessageKeepalive {
				keepalives++
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if keepalives == 0 || r.Stdout != "done\n" || len(r.Results) != 0 {
		t.Errorf("keepalives %d, result %+v; want keepalives seen and ignored", keepalives, r)
	}
}

func TestBrokenStreams(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	tests := []struct {
		name    string
		midLine bool
	}{
		{"stream ends before end_of_execution", false},
		{"connection drops inside a line", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv.CutNextStreams(1, 2, tc.midLine)
			r, err := p.Run(context.Background(), h, "print('a')\nprint('b', flush=True)\n3", sandbox.RunOptions{})
			if !errors.Is(err, sandbox.ErrIncomplete) {
				t.Fatalf("Run error = %v; want ErrIncomplete", err)
			}
			// What arrived before the cut is returned: the count and the first chunk.
			if r.ExecutionCount == 0 || !strings.HasPrefix(r.Stdout, "a") {
				t.Errorf("partial result = %+v", r)
			}
		})
	}
	if _, err := p.Run(context.Background(), h, "1", sandbox.RunOptions{}); err != nil {
		t.Errorf("a run after the broken streams: %v", err)
	}
}

func TestDeleteTwice(t *testing.T) {
	e, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	for i := range 2 {
		if err := p.Delete(context.Background(), h); err != nil {
			t.Fatalf("Delete %d: %v", i, err)
		}
	}
	if srv.Live() != 0 || srv.Deletes() != 1 || e.exec.Live() != 0 {
		t.Errorf("live %d, deletes %d, exec live %d; want 0 1 0", srv.Live(), srv.Deletes(), e.exec.Live())
	}
	if _, err := p.Run(context.Background(), h, "1", sandbox.RunOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Run after Delete = %v; want ErrNotFound", err)
	}
}

func TestCreateErrors(t *testing.T) {
	_, srv := newEnv(t)
	tests := []struct {
		name       string
		fail       func()
		key        string
		want       error
		wantInMsg  string
		retryAfter time.Duration
	}{
		{"wrong key", func() {}, "e2b_0123456789abcdef0123456789abcdef", sandbox.ErrUnavailable, "e2b rejected the API key", 0},
		{"401", func() { srv.FailNextCreates(1, 401, 0) }, "", sandbox.ErrUnavailable, "e2b rejected the API key", 0},
		{"429 with Retry-After", func() { srv.FailNextCreates(1, 429, 7*time.Second) }, "", sandbox.ErrRateLimited, "retry after 7s", 7 * time.Second},
		{"500", func() { srv.FailNextCreates(1, 500, 0) }, "", sandbox.ErrUnavailable, "HTTP 500", 0},
		{"503", func() { srv.FailNextCreates(1, 503, 0) }, "", sandbox.ErrUnavailable, "HTTP 503", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := srv.APIKey()
			if tc.key != "" {
				key = tc.key
			}
			p := provider(t, srv, func(o *e2b.Options) { o.APIKey = key })
			tc.fail()
			_, err := p.Create(context.Background(), sandbox.CreateOptions{})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Create error = %v; want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.wantInMsg) {
				t.Errorf("error %q does not say %q", err, tc.wantInMsg)
			}
			if strings.Contains(err.Error(), key) || strings.Contains(err.Error(), srv.APIKey()) {
				t.Errorf("error %q leaks the API key", err)
			}
			var apiErr *e2b.APIError
			if !errors.As(err, &apiErr) || apiErr.RetryAfter != tc.retryAfter {
				t.Errorf("APIError = %+v; want RetryAfter %v", apiErr, tc.retryAfter)
			}
		})
	}
	if srv.Live() != 0 {
		t.Errorf("Live = %d after failed creates", srv.Live())
	}
}

func TestNetworkErrorIsUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p, err := e2b.New(e2b.Options{APIKey: "e2b_00", APIBase: "http://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	if _, err := p.Create(context.Background(), sandbox.CreateOptions{}); !errors.Is(err, sandbox.ErrUnavailable) || strings.Contains(err.Error(), "e2b_00") {
		t.Errorf("Create = %v; want ErrUnavailable without the key", err)
	}
}

func TestNoAPIKey(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv, func(o *e2b.Options) { o.APIKey = "" })
	if _, err := p.Create(context.Background(), sandbox.CreateOptions{}); !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "no API key") {
		t.Errorf("Create = %v; want ErrUnavailable (no API key)", err)
	}
	if _, ok := srv.LastRequest("POST /sandboxes"); ok {
		t.Error("a create without a key reached e2b")
	}
}

func TestEnvdTooOld(t *testing.T) {
	e, srv := newEnv(t)
	srv.SetEnvdVersion("0.0.9")
	p := provider(t, srv)
	if _, err := p.Create(context.Background(), sandbox.CreateOptions{}); !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "0.0.9") {
		t.Fatalf("Create = %v; want ErrUnavailable naming the version", err)
	}
	if srv.Live() != 0 || srv.Deletes() != 1 || e.exec.Live() != 0 {
		t.Errorf("the outdated sandbox was not killed: live %d deletes %d", srv.Live(), srv.Deletes())
	}
}

func TestExpiryAndKeepAlive(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	if err := p.KeepAlive(context.Background(), h, 600*time.Second); err != nil {
		t.Fatal(err)
	}
	if req, _ := srv.LastRequest("POST /sandboxes/{id}/timeout"); string(req.Body) != `{"timeout":600}` {
		t.Errorf("keepalive body = %s", req.Body)
	}
	if err := p.KeepAlive(context.Background(), h, 0); err != nil {
		t.Fatal(err) // a zero keepalive must not end the sandbox (e2b's /timeout 0 would)
	}
	srv.Advance(400 * time.Second) // past the 300 s asked at create, within the keepalive
	if _, err := p.Run(context.Background(), h, "1", sandbox.RunOptions{}); err != nil {
		t.Fatalf("Run within the extended lifetime: %v", err)
	}
	srv.Advance(201 * time.Second)
	_, err := p.Run(context.Background(), h, "1", sandbox.RunOptions{})
	if !errors.Is(err, sandbox.ErrNotFound) || !strings.Contains(err.Error(), "container expired") {
		t.Errorf("Run after expiry = %v; want ErrNotFound (container expired)", err)
	}
	if err := p.KeepAlive(context.Background(), h, time.Minute); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("KeepAlive after expiry = %v; want ErrNotFound", err)
	}
	if err := p.Delete(context.Background(), h); err != nil {
		t.Errorf("Delete after expiry = %v; want nil", err)
	}
}

func TestRunTimeout(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	srv.SetExecDelay(time.Minute)
	_, err := p.Run(context.Background(), h, "1", sandbox.RunOptions{Timeout: 100 * time.Millisecond})
	if !errors.Is(err, sandbox.ErrTimeout) {
		t.Fatalf("Run = %v; want ErrTimeout", err)
	}
	srv.SetExecDelay(0)
	// A slow cell, cut by the timeout while it runs; the kernel is interrupted, not lost.
	_, err = p.Run(context.Background(), h, "import time\ntime.sleep(30)", sandbox.RunOptions{Timeout: 300 * time.Millisecond})
	if !errors.Is(err, sandbox.ErrTimeout) {
		t.Fatalf("Run = %v; want ErrTimeout", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Run(ctx, h, "1", sandbox.RunOptions{}); !errors.Is(err, context.Canceled) || errors.Is(err, sandbox.ErrTimeout) {
		t.Errorf("Run with a cancelled context = %v; want context.Canceled", err)
	}
	if r, err := p.Run(context.Background(), h, "'alive'", sandbox.RunOptions{Timeout: 20 * time.Second}); err != nil || len(r.Results) != 1 || r.Results[0].Text != "alive" {
		t.Errorf("Run after the timeouts = %+v, %v", r, err)
	}
}

func TestRoutingModes(t *testing.T) {
	_, srv := newEnv(t)
	tests := []struct {
		name     string
		opts     func(*e2b.Options)
		wantHost func(id string) string
	}{
		{"SandboxURL with routing headers", func(*e2b.Options) {}, func(string) string {
			return strings.TrimPrefix(srv.SandboxURL(), "http://")
		}},
		{"Host {port}-{id}.{domain}", func(o *e2b.Options) { o.SandboxURL = ""; o.Domain = e2btest.Domain }, func(id string) string {
			return "49999-" + id + "." + e2btest.Domain
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := provider(t, srv, tc.opts)
			h := create(t, p)
			r, err := p.Run(context.Background(), h, "6*7", sandbox.RunOptions{})
			if err != nil || len(r.Results) != 1 || r.Results[0].Text != "42" {
				t.Fatalf("Run = %+v, %v", r, err)
			}
			req, _ := srv.LastRequest("49999 POST /execute")
			if req.Host != tc.wantHost(h.ID) || req.URL.Path != "/execute" {
				t.Errorf("request host %q path %q; want %q", req.Host, req.URL.Path, tc.wantHost(h.ID))
			}
			if err := p.Delete(context.Background(), h); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestTrafficToken(t *testing.T) {
	_, srv := newEnv(t)
	srv.RequireTrafficToken(true)
	p := provider(t, srv)
	h := create(t, p)
	_, traffic, _ := srv.AccessToken(h.ID)
	if h.TrafficToken == "" || h.TrafficToken != traffic {
		t.Fatalf("handle traffic token %q; emulator %q", h.TrafficToken, traffic)
	}
	if _, err := p.Run(context.Background(), h, "1", sandbox.RunOptions{}); err != nil {
		t.Fatalf("Run with the token: %v", err)
	}
	if req, _ := srv.LastRequest("49999 POST /execute"); req.Header.Get("E2B-Traffic-Access-Token") != traffic {
		t.Errorf("token header = %q", req.Header.Get("E2B-Traffic-Access-Token"))
	}
	stripped := h
	stripped.TrafficToken = ""
	_, err := p.Run(context.Background(), stripped, "1", sandbox.RunOptions{})
	var apiErr *e2b.APIError
	if !errors.Is(err, sandbox.ErrUnavailable) || !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusForbidden {
		t.Errorf("Run without the token = %v; want a 403 ErrUnavailable", err)
	}
}

func TestExecuteStatusErrors(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	tests := []struct {
		status int
		want   error
	}{
		{502, sandbox.ErrNotFound},
		{404, sandbox.ErrNotFound},
		{429, sandbox.ErrRateLimited},
		{500, sandbox.ErrUnavailable},
	}
	for _, tc := range tests {
		t.Run(http.StatusText(tc.status), func(t *testing.T) {
			srv.FailNextExecutions(1, tc.status)
			if _, err := p.Run(context.Background(), h, "1", sandbox.RunOptions{}); !errors.Is(err, tc.want) {
				t.Errorf("Run = %v; want %v", err, tc.want)
			}
		})
	}
}

// TestList: the sandboxes tagged with given metadata, across pages, running or paused, and only
// those; a list needs the API key like every control-plane call.
func TestList(t *testing.T) {
	_, srv := newEnv(t)
	srv.SetLazyKernels(true) // only the control plane is driven
	p := provider(t, srv)
	ctx := context.Background()
	want := map[string]bool{}
	for i := range 105 {
		meta := map[string]string{"ciproxy_container_id": fmt.Sprintf("cntr_%d", i), "deployment": "d1"}
		if i%10 == 0 {
			meta["deployment"] = "other"
		}
		h, err := p.Create(ctx, sandbox.CreateOptions{Metadata: meta})
		if err != nil {
			t.Fatal(err)
		}
		if i%10 != 0 {
			want[h.ID] = true
		}
	}
	got, err := p.List(ctx, map[string]string{"deployment": "d1", "created_by": "ciproxy"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("List = %d sandboxes; want %d", len(got), len(want))
	}
	for _, l := range got {
		if !want[l.Handle.ID] || l.Handle.Backend != "e2b" || l.Handle.Tool != "my-e2b" || l.Handle.AccessToken != "" {
			t.Errorf("listed %+v", l.Handle)
		}
		if l.Metadata["deployment"] != "d1" || !strings.HasPrefix(l.Metadata["ciproxy_container_id"], "cntr_") || l.StartedAt.IsZero() {
			t.Errorf("listed metadata %v, started %v", l.Metadata, l.StartedAt)
		}
		delete(want, l.Handle.ID)
	}
	// A listed handle is enough to delete the sandbox.
	if err := p.Delete(ctx, got[0].Handle); err != nil {
		t.Fatal(err)
	}
	if again, err := p.List(ctx, map[string]string{"deployment": "d1"}); err != nil || len(again) != len(got)-1 {
		t.Errorf("List after a delete = %d, %v; want %d", len(again), err, len(got)-1)
	}
	if r, ok := srv.LastRequest("GET /v2/sandboxes"); !ok || r.Header.Get("X-API-Key") != srv.APIKey() {
		t.Errorf("the list request = %+v, %v; want the API key", r, ok)
	}
	noKey := provider(t, srv, func(o *e2b.Options) { o.APIKey = "" })
	if _, err := noKey.List(ctx, nil); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("List without a key = %v", err)
	}
	for _, l := range got[1:] {
		_ = p.Delete(ctx, l.Handle)
	}
	for _, l := range mustList(t, p, map[string]string{"deployment": "other"}) {
		_ = p.Delete(ctx, l.Handle)
	}
}

func mustList(t *testing.T, p *e2b.Provider, meta map[string]string) []sandbox.Listed {
	t.Helper()
	l, err := p.List(context.Background(), meta)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestCreateMakesMntData: the template has no /mnt/data; Create makes it through envd before it
// hands the sandbox out, so the first code can write there. A sandbox where it cannot be made is
// killed and Create fails.
func TestCreateMakesMntData(t *testing.T) {
	e, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	mk, ok := srv.LastRequest("49983 POST /filesystem.Filesystem/MakeDir")
	if token, _, _ := srv.AccessToken(h.ID); !ok || mk.Header.Get("X-Access-Token") != token || mk.Header.Get("E2b-Sandbox-Id") != h.ID {
		t.Fatalf("MakeDir request %v, %+v; want one for the new sandbox with its token", ok, mk.Header)
	}
	res, err := p.Run(context.Background(), h, "open('/mnt/data/state.txt', 'w').write('kept')\nprint(open('/mnt/data/state.txt').read())", sandbox.RunOptions{})
	if err != nil || res.Error != nil || res.Stdout != "kept\n" {
		t.Fatalf("first code writing /mnt/data = %+v, %v", res, err)
	}

	refusing := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/filesystem.Filesystem/MakeDir") {
			return &http.Response{StatusCode: http.StatusForbidden, Header: http.Header{"Content-Type": {"application/json"}}, Request: r,
				Body: io.NopCloser(strings.NewReader(`{"code":"permission_denied","message":"no"}`))}, nil
		}
		return srv.Client().Transport.RoundTrip(r)
	})}
	live := srv.Live()
	p = provider(t, srv, func(o *e2b.Options) { o.HTTPClient = refusing })
	if _, err := p.Create(context.Background(), sandbox.CreateOptions{}); !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "/mnt/data") {
		t.Errorf("Create where /mnt/data cannot be made = %v; want ErrUnavailable naming it", err)
	}
	if srv.Live() != live || e.exec.Live() != live {
		t.Errorf("live sandboxes %d (exec %d); want %d: the unprepared one killed", srv.Live(), e.exec.Live(), live)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
