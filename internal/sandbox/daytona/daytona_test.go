package daytona_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/daytona"
	"github.com/ciproxy/ciproxy/internal/sandbox/daytonatest"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/localsandbox"
)

var sandboxes = localsandbox.New(local.Options{PoolSize: -1})

func TestMain(m *testing.M) { testutil.Main(m, sandboxes.Close) }

// newDouble starts a Daytona double running code in the shared local sandbox provider.
func newDouble(t testing.TB) *daytonatest.Server {
	t.Helper()
	exec := sandboxes.Provider(t)
	srv := daytonatest.New(exec)
	t.Cleanup(func() {
		srv.Close()
		if n := exec.Live(); n != 0 {
			t.Errorf("local sandboxes alive after the double closed: %d", n)
		}
	})
	return srv
}

func provider(t testing.TB, srv *daytonatest.Server, mod ...func(*daytona.Options)) *daytona.Provider {
	t.Helper()
	opts := daytona.Options{APIKey: srv.APIKey(), APIBase: srv.URL(), Tool: "my-daytona", PollInterval: 10 * time.Millisecond}
	for _, m := range mod {
		m(&opts)
	}
	p, err := daytona.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

func create(t testing.TB, p *daytona.Provider) sandbox.Handle {
	t.Helper()
	h, err := p.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return h
}

func run(t testing.TB, p *daytona.Provider, h sandbox.Handle, code string) sandbox.Result {
	t.Helper()
	res, err := p.Run(context.Background(), h, code, sandbox.RunOptions{})
	if err != nil {
		t.Fatalf("Run(%q): %v", code, err)
	}
	return res
}

func TestCreateRequest(t *testing.T) {
	srv := newDouble(t)
	for _, tc := range []struct {
		name  string
		mod   func(*daytona.Options)
		opts  sandbox.CreateOptions
		check func(t *testing.T, body gjson.Result)
	}{
		{"snapshot, no network", func(o *daytona.Options) { o.Snapshot = "py-snap"; o.Target = "eu" },
			sandbox.CreateOptions{MemoryLimit: "4g", Lifetime: 90 * time.Second, NetworkPolicy: &egress.Policy{}, Metadata: map[string]string{sandbox.MetadataContainerID: "cntr_1"}},
			func(t *testing.T, b gjson.Result) {
				want := map[string]string{"snapshot": "py-snap", "target": "eu", "networkBlockAll": "true", "autoStopInterval": "2", "autoDeleteInterval": "0",
					"labels.ciproxy_container_id": "cntr_1", "labels.memory_limit": "4g", "labels.code-toolbox-language": "python", "labels.created_by": "ciproxy"}
				for k, v := range want {
					if got := b.Get(strings.ReplaceAll(k, "-", "\\-")).String(); got != v {
						t.Errorf("%s = %q, want %q (%s)", k, got, v, b.Raw)
					}
				}
				if b.Get("memory").Exists() || b.Get("buildInfo").Exists() {
					t.Errorf("resources sent with a snapshot: %s", b.Raw)
				}
			}},
		{"image with resources, allowlist", func(o *daytona.Options) { o.Image = "python:3.12"; o.CPU = 2; o.Disk = 5; o.Memory = 2 },
			sandbox.CreateOptions{MemoryLimit: "4g", Network: egress.Policy{Domains: []string{"pypi.org", "*.pythonhosted.org"}}, NetworkPolicy: &egress.Policy{Domains: []string{"pypi.org"}}},
			func(t *testing.T, b gjson.Result) {
				if b.Get("buildInfo.dockerfileContent").String() != "FROM python:3.12\n" || b.Get("cpu").Int() != 2 || b.Get("memory").Int() != 4 || b.Get("disk").Int() != 5 {
					t.Errorf("build and resources: %s", b.Raw)
				}
				if b.Get("networkBlockAll").Bool() || b.Get("domainAllowList").String() != "pypi.org,*.pythonhosted.org" {
					t.Errorf("network: %s", b.Raw)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := provider(t, srv, tc.mod)
			h, err := p.Create(context.Background(), tc.opts)
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			defer p.Delete(context.Background(), h)
			tc.check(t, gjson.ParseBytes(srv.LastCreate()))
			if h.Backend != "daytona" || h.Tool != "my-daytona" || h.ID == "" || h.AccessToken != "" || h.Domain != "" {
				t.Errorf("handle %+v", h)
			}
		})
	}
}

func TestRunResults(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p)
	defer p.Delete(context.Background(), h)
	for _, tc := range []struct {
		name, code string
		check      func(t *testing.T, r sandbox.Result)
	}{
		{"stdout and stderr", "import sys\nprint('out')\nprint('err', file=sys.stderr)", func(t *testing.T, r sandbox.Result) {
			if r.Stdout != "out\n" || r.Stderr != "err\n" || r.Error != nil || len(r.Results) != 0 {
				t.Errorf("%+v", r)
			}
		}},
		{"state kept", "x = 41", func(t *testing.T, r sandbox.Result) {
			if r2 := run(t, p, h, "print(x + 1)"); r2.Stdout != "42\n" {
				t.Errorf("second run: %+v", r2)
			}
		}},
		{"trailing expression", "y = 6\ny * 7", func(t *testing.T, r sandbox.Result) {
			if len(r.Results) != 1 || r.Results[0].Text != "42" || !r.Results[0].IsMainResult || r.Stdout != "" {
				t.Errorf("%+v", r)
			}
		}},
		{"exception", "def f():\n    return 1 / 0\nprint('before')\nf()", func(t *testing.T, r sandbox.Result) {
			if r.Error == nil || r.Error.Name != "ZeroDivisionError" || r.Error.Value != "division by zero" ||
				!strings.Contains(r.Error.Traceback, "return 1 / 0") || strings.Contains(r.Error.Traceback, "__ciproxy") || r.Stdout != "before\n" {
				t.Errorf("%+v %+v", r, r.Error)
			}
		}},
		{"syntax error", "def (:", func(t *testing.T, r sandbox.Result) {
			if r.Error == nil || r.Error.Name != "SyntaxError" {
				t.Errorf("%+v", r)
			}
		}},
		{"marker-like output passes", "print('\\x1e' + 'abc:' + '{}')", func(t *testing.T, r sandbox.Result) {
			if r.Stdout != "\x1eabc:{}\n" {
				t.Errorf("%q", r.Stdout)
			}
		}},
		{"long lines", "print('a' * 5000)\nprint('b' * 3, end='')", func(t *testing.T, r sandbox.Result) {
			if r.Stdout != strings.Repeat("a", 5000)+"\nbbb" {
				t.Errorf("%d bytes: %.40q", len(r.Stdout), r.Stdout)
			}
		}},
		{"execution count", "pass", func(t *testing.T, r sandbox.Result) {
			if r.ExecutionCount < 1 {
				t.Errorf("count %d", r.ExecutionCount)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.check(t, run(t, p, h, tc.code)) })
	}
}

func TestRunFigure(t *testing.T) {
	localsandbox.PythonModules(t, "", "matplotlib")
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p)
	defer p.Delete(context.Background(), h)
	for _, code := range []string{
		"import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()",
		"plt.figure(); plt.plot([3, 2, 1]); print('open at the end')",
	} {
		r := run(t, p, h, code)
		var pngs int
		for _, o := range r.Results {
			if o.PNG != "" {
				raw, err := base64.StdEncoding.DecodeString(o.PNG)
				if err != nil || !bytes.HasPrefix(raw, []byte("\x89PNG")) {
					t.Errorf("not a PNG: %v", err)
				}
				pngs++
			}
		}
		if pngs != 1 || r.Error != nil {
			t.Errorf("%q: %d figures, error %+v, stderr %q", code, pngs, r.Error, r.Stderr)
		}
	}
}

func TestStreaming(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p)
	defer p.Delete(context.Background(), h)
	var first time.Time
	start := time.Now()
	res, err := p.Run(context.Background(), h, "import time\nprint('one', flush=True)\ntime.sleep(1)\nprint('two')", sandbox.RunOptions{OnMessage: func(m sandbox.Message) {
		if m.Type == sandbox.MessageStdout && first.IsZero() {
			first = time.Now()
		}
	}})
	if err != nil || res.Stdout != "one\ntwo\n" {
		t.Fatalf("%+v %v", res, err)
	}
	if first.IsZero() || first.Sub(start) > time.Since(start)-500*time.Millisecond {
		t.Errorf("the first line arrived %s after the start, the run took %s: not streamed", first.Sub(start), time.Since(start))
	}
}

func TestRunTimeoutAndDisconnect(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p)
	defer p.Delete(context.Background(), h)
	run(t, p, h, "kept = 1")
	_, err := p.Run(context.Background(), h, "import time\nprint('x', flush=True)\ntime.sleep(30)", sandbox.RunOptions{Timeout: time.Second})
	if !errors.Is(err, sandbox.ErrTimeout) {
		t.Fatalf("timeout: %v", err)
	}
	if r := run(t, p, h, "print(kept)"); r.Stdout != "1\n" {
		t.Errorf("after a timeout: %+v", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = p.Run(ctx, h, "import time\ntime.sleep(30)", sandbox.RunOptions{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("disconnect: %v", err)
	}
	// Daytona cannot interrupt: the context was deleted, and the next run says its state is gone.
	r := run(t, p, h, "print('fresh')")
	if r.Stdout != "fresh\n" || !strings.Contains(r.Stderr, "restarted") {
		t.Errorf("after a disconnect: %+v", r)
	}
}

func TestErrors(t *testing.T) {
	srv := newDouble(t)
	for _, tc := range []struct {
		name  string
		setup func()
		mod   func(*daytona.Options)
		want  error
	}{
		{"bad key", func() {}, func(o *daytona.Options) { o.APIKey = "wrong" }, sandbox.ErrUnavailable},
		{"quota", func() { srv.FailCreates(1, 403) }, nil, sandbox.ErrUnavailable},
		{"rate limited", func() { srv.FailCreates(1, 429) }, nil, sandbox.ErrRateLimited},
		{"start fails", func() { srv.FailStarts(1) }, nil, sandbox.ErrUnavailable},
		{"slow start", func() { srv.SlowStarts(3 * time.Second) }, func(o *daytona.Options) { o.CreateTimeout = time.Second }, sandbox.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup()
			defer srv.SlowStarts(0)
			mod := tc.mod
			if mod == nil {
				mod = func(*daytona.Options) {}
			}
			p := provider(t, srv, mod)
			_, err := p.Create(context.Background(), sandbox.CreateOptions{})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Create: %v, want %v", err, tc.want)
			}
			if strings.Contains(err.Error(), srv.APIKey()) {
				t.Errorf("the key is in the error: %v", err)
			}
			testutil.Eventually(t, "no sandbox left", func() bool { return srv.Live() == 0 })
		})
	}
}

func TestGoneAndCut(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p)
	srv.CutStreams(1, 2)
	_, err := p.Run(context.Background(), h, "for i in range(5): print(i, flush=True)", sandbox.RunOptions{})
	if !errors.Is(err, sandbox.ErrIncomplete) {
		t.Errorf("cut stream: %v", err)
	}
	srv.Destroy(h.ID)
	if _, err := p.Run(context.Background(), h, "print(1)", sandbox.RunOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("run on a gone sandbox: %v", err)
	}
	if err := p.KeepAlive(context.Background(), h, time.Minute); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("keepalive on a gone sandbox: %v", err)
	}
	if err := p.Delete(context.Background(), h); err != nil {
		t.Errorf("delete of a gone sandbox: %v", err)
	}
	// A fresh provider (another replica) reaches a live sandbox by its id alone.
	h2 := create(t, p)
	other := provider(t, srv)
	if r, err := other.Run(context.Background(), h2, "print('hi')", sandbox.RunOptions{}); err != nil || r.Stdout != "hi\n" {
		t.Errorf("another replica: %+v %v", r, err)
	}
	// Auto-stop past the lifetime deletes it (auto-delete 0).
	if err := p.KeepAlive(context.Background(), h2, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	srv.Advance(4 * time.Minute)
	if srv.Live() != 0 {
		t.Errorf("%d sandboxes live past their auto-stop", srv.Live())
	}
}

func TestList(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	a, err := p.Create(context.Background(), sandbox.CreateOptions{Metadata: map[string]string{sandbox.MetadataContainerID: "cntr_a"}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Create(context.Background(), sandbox.CreateOptions{Metadata: map[string]string{sandbox.MetadataContainerID: "cntr_b"}})
	if err != nil {
		t.Fatal(err)
	}
	all, err := p.List(context.Background(), map[string]string{"created_by": "ciproxy"})
	if err != nil || len(all) != 2 {
		t.Fatalf("list: %v %v", all, err)
	}
	one, err := p.List(context.Background(), map[string]string{sandbox.MetadataContainerID: "cntr_b"})
	if err != nil || len(one) != 1 || one[0].Handle.ID != b.ID || one[0].StartedAt.IsZero() {
		t.Fatalf("list by label: %+v %v", one, err)
	}
	for _, h := range []sandbox.Handle{a, b} {
		if err := p.Delete(context.Background(), h); err != nil {
			t.Fatal(err)
		}
	}
	if srv.Live() != 0 {
		t.Errorf("live %d", srv.Live())
	}
}
