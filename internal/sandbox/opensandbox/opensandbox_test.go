package opensandbox_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/sandbox/opensandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/opensandboxtest"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/localsandbox"
)

// sandboxes is the local sandbox every double of these tests executes through.
var sandboxes = localsandbox.New(local.Options{PoolSize: -1})

func TestMain(m *testing.M) { testutil.Main(m, sandboxes.Close) }

// newDouble starts a double over the shared local sandbox; at the end no local sandbox of it is
// left.
func newDouble(t testing.TB) *opensandboxtest.Server {
	t.Helper()
	exec := sandboxes.Provider(t)
	srv := opensandboxtest.New(exec)
	t.Cleanup(func() {
		srv.Close()
		if n := exec.Live(); n != 0 {
			t.Errorf("local sandboxes alive after the double closed: %d", n)
		}
	})
	return srv
}

func provider(t testing.TB, srv *opensandboxtest.Server, mod ...func(*opensandbox.Options)) *opensandbox.Provider {
	t.Helper()
	opts := opensandbox.Options{APIKey: srv.APIKey(), APIBase: srv.URL(), Tool: "osb", ReadyTimeout: 20 * time.Second}
	for _, m := range mod {
		m(&opts)
	}
	p, err := opensandbox.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

func create(t testing.TB, p *opensandbox.Provider, opts sandbox.CreateOptions) sandbox.Handle {
	t.Helper()
	h, err := p.Create(t.Context(), opts)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return h
}

func TestCreateRequest(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv, func(o *opensandbox.Options) { o.Image = "example/ci:1" })
	h := create(t, p, sandbox.CreateOptions{MemoryLimit: "4g", Lifetime: 90 * time.Second,
		Metadata: map[string]string{sandbox.MetadataContainerID: "cntr_0123", "bad value": "a b"},
		Network:  egress.Policy{Domains: []string{"pypi.org", "*.pythonhosted.org"}}})
	body := gjson.ParseBytes(srv.LastBody("POST /sandboxes"))
	for path, want := range map[string]string{
		"image.uri":                     "example/ci:1",
		"entrypoint.0":                  "/opt/code-interpreter/code-interpreter.sh",
		"resourceLimits.cpu":            "1",
		"resourceLimits.memory":         "4Gi",
		"timeout":                       "90",
		"metadata.ciproxy_container_id": "cntr_0123",
		"metadata.created_by":           "ciproxy",
		"networkPolicy.defaultAction":   "deny",
		"networkPolicy.egress.1.target": "*.pythonhosted.org",
		"networkPolicy.egress.0.action": "allow",
	} {
		if got := body.Get(path).String(); !body.Get(path).Exists() || got != want {
			t.Errorf("create body %s = %q, want %q (%s)", path, body.Get(path).String(), want, body.Raw)
		}
	}
	if body.Get("metadata.bad value").Exists() {
		t.Error("a metadata pair that is no Kubernetes label was sent")
	}
	token := body.Get("env.EXECD_ACCESS_TOKEN").String()
	if len(token) != 32 || token != h.AccessToken {
		t.Errorf("execd token %q, handle's %q", token, h.AccessToken)
	}
	if hdr := srv.LastHeader("POST /sandboxes"); hdr.Get("OPEN-SANDBOX-API-KEY") != srv.APIKey() {
		t.Error("the lifecycle request lacks the API key")
	}
	// execd never sees the lifecycle key.
	res, err := p.Run(t.Context(), h, "print(6 * 7)", sandbox.RunOptions{})
	if err != nil || res.Stdout != "42\n" {
		t.Fatalf("Run: %q %v", res.Stdout, err)
	}
	for _, route := range []string{"POST /code", "POST /code/context", "POST /directories"} {
		hdr := srv.LastHeader(route)
		if hdr == nil {
			t.Errorf("no %s request", route)
			continue
		}
		if hdr.Get("OPEN-SANDBOX-API-KEY") != "" || strings.Contains(strings.Join(flatten(hdr), " "), srv.APIKey()) {
			t.Errorf("%s carried the lifecycle API key", route)
		}
		if hdr.Get("X-EXECD-ACCESS-TOKEN") != h.AccessToken {
			t.Errorf("%s without the execd token", route)
		}
	}
	if err := p.Delete(t.Context(), h); err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(t.Context(), h); err != nil {
		t.Errorf("second delete: %v", err)
	}
	if n := srv.Live(); n != 0 {
		t.Errorf("%d sandboxes live after delete", n)
	}
}

func flatten(h http.Header) []string {
	var out []string
	for k, vs := range h {
		out = append(out, k+": "+strings.Join(vs, ","))
	}
	return out
}

func TestRun(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p, sandbox.CreateOptions{})
	t.Cleanup(func() { _ = p.Delete(context.Background(), h) })
	cases := []struct {
		name, code string
		check      func(t *testing.T, r sandbox.Result)
	}{
		{"stdout", "print('a'); import sys; print('b', file=sys.stderr)", func(t *testing.T, r sandbox.Result) {
			if r.Stdout != "a\n" || r.Stderr != "b\n" || r.Error != nil {
				t.Errorf("result %+v", r)
			}
		}},
		{"no execd token in the environment", "import os, subprocess; print('EXECD_ACCESS_TOKEN' in os.environ, subprocess.run('env', capture_output=True, text=True).stdout.count('EXECD_ACCESS_TOKEN'))", func(t *testing.T, r sandbox.Result) {
			if r.Stdout != "False 0\n" {
				t.Errorf("stdout %q", r.Stdout)
			}
		}},
		{"state kept", "x = 41", nil},
		{"state used", "x + 1", func(t *testing.T, r sandbox.Result) {
			if len(r.Results) != 1 || r.Results[0].Text != "42" || !r.Results[0].IsMainResult || r.ExecutionCount == 0 {
				t.Errorf("result %+v", r)
			}
		}},
		{"cwd", "import os; print(os.getcwd())", func(t *testing.T, r sandbox.Result) {
			if r.Stdout != "/mnt/data\n" {
				t.Errorf("cwd %q", r.Stdout)
			}
		}},
		{"error", "1/0", func(t *testing.T, r sandbox.Result) {
			if r.Error == nil || r.Error.Name != "ZeroDivisionError" || !strings.Contains(r.Error.Traceback, "ZeroDivisionError") ||
				strings.Contains(r.Error.Traceback, "\x1b[") {
				t.Errorf("error %+v", r.Error)
			}
		}},
		{"markers are not output", "print('\\x1e\\x1fnot a marker'); print('\\x1eplain')", func(t *testing.T, r sandbox.Result) {
			if r.Stdout != "\x1e\x1fnot a marker\n\x1eplain\n" || len(r.Results) != 0 {
				t.Errorf("stdout %q results %d", r.Stdout, len(r.Results))
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := p.Run(t.Context(), h, c.code, sandbox.RunOptions{})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if strings.Contains(res.Stderr, "kernel died") {
				t.Errorf("stderr %q", res.Stderr)
			}
			if c.check != nil {
				c.check(t, res)
			}
		})
	}
}

func TestRunFigures(t *testing.T) {
	srv := newDouble(t)
	localsandbox.PythonModules(t, "", "matplotlib")
	p := provider(t, srv)
	h := create(t, p, sandbox.CreateOptions{})
	t.Cleanup(func() { _ = p.Delete(context.Background(), h) })
	for _, c := range []struct {
		name, code string
		images     int
	}{
		{"show", "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nprint('after')", 1},
		{"left open", "import matplotlib.pyplot as plt\nplt.figure(); plt.plot([1]); plt.figure(); plt.plot([2])", 2},
		{"none", "print('no figure')", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var live []string
			res, err := p.Run(t.Context(), h, c.code, sandbox.RunOptions{OnMessage: func(m sandbox.Message) { live = append(live, m.Type) }})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, o := range res.Results {
				if o.PNG != "" {
					n++
					if !strings.HasPrefix(o.PNG, "iVBORw0KGgo") {
						t.Errorf("png %.20q", o.PNG)
					}
				}
			}
			if n != c.images || strings.Contains(res.Stdout, "\x1e") {
				t.Errorf("%d images, want %d; stdout %q", n, c.images, res.Stdout)
			}
			if live[len(live)-1] != sandbox.MessageEndOfExecution {
				t.Errorf("live messages %v", live)
			}
		})
	}
}

func TestRunLive(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p, sandbox.CreateOptions{})
	t.Cleanup(func() { _ = p.Delete(context.Background(), h) })
	first := make(chan time.Time, 1)
	start := time.Now()
	res, err := p.Run(t.Context(), h, "import time\nprint('one', flush=True)\ntime.sleep(1.5)\nprint('two')", sandbox.RunOptions{OnMessage: func(m sandbox.Message) {
		if m.Type == sandbox.MessageStdout && strings.Contains(m.Text, "one") {
			select {
			case first <- time.Now():
			default:
			}
		}
	}})
	if err != nil || res.Stdout != "one\ntwo\n" {
		t.Fatalf("%q %v", res.Stdout, err)
	}
	if d := (<-first).Sub(start); d > time.Second+200*time.Millisecond && time.Since(start) < d+time.Second {
		t.Errorf("the first line arrived %s after the start, with the rest: not live", d)
	}
}

func TestRunTimeoutAndCancel(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p, sandbox.CreateOptions{})
	t.Cleanup(func() { _ = p.Delete(context.Background(), h) })
	_, err := p.Run(t.Context(), h, "import time\nwhile True: time.sleep(0.1)", sandbox.RunOptions{Timeout: time.Second})
	if !errors.Is(err, sandbox.ErrTimeout) {
		t.Fatalf("err %v, want ErrTimeout", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_, err = p.Run(ctx, h, "import time\nwhile True: time.sleep(0.1)", sandbox.RunOptions{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the caller's deadline", err)
	}
	// The kernel was interrupted both times and keeps its state.
	res, err := p.Run(t.Context(), h, "y = 5\nprint(y)", sandbox.RunOptions{Timeout: 20 * time.Second})
	if err != nil || res.Stdout != "5\n" {
		t.Fatalf("after the interrupts: %q %v", res.Stdout, err)
	}
}

func TestFaults(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	t.Run("create refused", func(t *testing.T) {
		for _, status := range []int{http.StatusInternalServerError, http.StatusServiceUnavailable, http.StatusBadRequest} {
			srv.FailNextCreates(status)
			_, err := p.Create(t.Context(), sandbox.CreateOptions{})
			if !errors.Is(err, sandbox.ErrUnavailable) {
				t.Errorf("%d: %v, want ErrUnavailable", status, err)
			}
		}
	})
	t.Run("bad key", func(t *testing.T) {
		bad := provider(t, srv, func(o *opensandbox.Options) { o.APIKey = "wrong-key-123" })
		_, err := bad.Create(t.Context(), sandbox.CreateOptions{})
		if !errors.Is(err, sandbox.ErrUnavailable) || strings.Contains(err.Error(), "wrong-key-123") {
			t.Errorf("%v", err)
		}
	})
	t.Run("pending then running", func(t *testing.T) {
		srv.SetPending(600 * time.Millisecond)
		defer srv.SetPending(0)
		h := create(t, p, sandbox.CreateOptions{})
		defer p.Delete(context.Background(), h)
		if res, err := p.Run(t.Context(), h, "print(1)", sandbox.RunOptions{}); err != nil || res.Stdout != "1\n" {
			t.Errorf("%q %v", res.Stdout, err)
		}
	})
	t.Run("slow create", func(t *testing.T) {
		srv.SetCreateDelay(3 * time.Second)
		defer srv.SetCreateDelay(0)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if _, err := p.Create(ctx, sandbox.CreateOptions{}); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%v, want the caller's deadline", err)
		}
	})
	t.Run("stream cut", func(t *testing.T) {
		h := create(t, p, sandbox.CreateOptions{})
		defer p.Delete(context.Background(), h)
		srv.CutNextRuns(1, 3)
		res, err := p.Run(t.Context(), h, "print('a', flush=True)\nimport time; time.sleep(1); print('b')", sandbox.RunOptions{})
		if !errors.Is(err, sandbox.ErrIncomplete) {
			t.Errorf("%v, want ErrIncomplete", err)
		}
		if res.Stdout != "a\n" {
			t.Errorf("what arrived: %q", res.Stdout)
		}
	})
	t.Run("sandbox gone", func(t *testing.T) {
		h := create(t, p, sandbox.CreateOptions{})
		srv.Remove(h.ID)
		if _, err := p.Run(t.Context(), h, "print(1)", sandbox.RunOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("run: %v, want ErrNotFound", err)
		}
		if err := p.KeepAlive(t.Context(), h, time.Minute); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("keepalive: %v, want ErrNotFound", err)
		}
		if _, err := p.ReadFile(t.Context(), h, "x", &bytes.Buffer{}, 10); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("read file: %v, want ErrNotFound", err)
		}
		if err := p.Delete(t.Context(), h); err != nil {
			t.Errorf("delete: %v", err)
		}
	})
	if n := srv.Live(); n != 0 {
		t.Errorf("%d sandboxes left after the faults", n)
	}
}

func TestKeepAliveAndList(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p, sandbox.CreateOptions{Lifetime: time.Minute, Metadata: map[string]string{"ciproxy_deployment": "d1", sandbox.MetadataContainerID: "cntr_a"}})
	other := create(t, p, sandbox.CreateOptions{Lifetime: time.Minute, Metadata: map[string]string{"ciproxy_deployment": "d2"}})
	if err := p.KeepAlive(t.Context(), h, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := p.List(t.Context(), map[string]string{"ciproxy_deployment": "d1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Handle.ID != h.ID || got[0].Metadata[sandbox.MetadataContainerID] != "cntr_a" || got[0].StartedAt.IsZero() {
		t.Errorf("listed %+v", got)
	}
	srv.Advance(2 * time.Minute) // other expires, h was renewed
	if ids := srv.IDs(); len(ids) != 1 || ids[0] != h.ID {
		t.Errorf("live after 2 minutes: %v (renewed %s, other %s)", ids, h.ID, other.ID)
	}
	srv.Advance(10 * time.Minute)
	if n := srv.Live(); n != 0 {
		t.Errorf("%d live past the renewed expiry", n)
	}
}

// TestKernelDies: execd reports the end of a run whose kernel died and keeps the stream open; the
// run ends at execution_complete all the same, says the state is lost, and the next runs have the
// figure hook again.
func TestKernelDies(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p, sandbox.CreateOptions{})
	t.Cleanup(func() { _ = p.Delete(context.Background(), h) })
	if _, err := p.Run(t.Context(), h, "x = 1", sandbox.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := p.Run(t.Context(), h, "import os\nos._exit(1)", sandbox.RunOptions{Timeout: 30 * time.Second})
	if err != nil || !strings.Contains(res.Stderr, "kernel died") {
		t.Fatalf("%+v %v", res, err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the run took %s: it waited for the stream's end", d)
	}
	res, err = p.Run(t.Context(), h, "print('x' in dir())", sandbox.RunOptions{})
	if err != nil || res.Stdout != "False\n" || strings.Contains(res.Stderr, "kernel died") {
		t.Errorf("after the restart: %+v %v", res, err)
	}
}
