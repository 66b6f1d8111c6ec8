package agentsandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandboxtest"
	"github.com/ciproxy/ciproxy/internal/sandbox/kernel"
)

// imageFiles are the files the sandbox image carries (deploy/kubernetes/agent-sandbox/Dockerfile).
func imageFiles() map[string]string {
	return map[string]string{kernel.Path: string(kernel.Source()), kernel.DaemonPath: string(kernel.DaemonSource())}
}

// double starts the test double with a warm pool of the repository's template.
func double(t testing.TB, mod ...func(*agentsandboxtest.Options)) *agentsandboxtest.Server {
	t.Helper()
	o := agentsandboxtest.Options{Namespace: "sandboxes", Template: "ciproxy-python", WarmPool: "ciproxy-python",
		WarmPoolReplicas: 2, ImageFiles: imageFiles(), PodEnv: map[string]string{"MPLBACKEND": "Agg"}}
	for _, m := range mod {
		m(&o)
	}
	return agentsandboxtest.New(t, o)
}

// provider is a Provider on d, as a proxy replica would have it.
func provider(t testing.TB, d *agentsandboxtest.Server, mod ...func(*agentsandbox.Options)) *agentsandbox.Provider {
	t.Helper()
	o := agentsandbox.DefaultOptions()
	o.Kubeconfig, o.Namespace, o.WarmPool = d.Kubeconfig(), d.Namespace(), d.WarmPool()
	o.ProcessPort, o.FilesPort = d.ProcessPort(), d.FilesPort()
	o.ReadyTimeout, o.RunTimeout, o.RequestTimeout = 60*time.Second, 30*time.Second, 20*time.Second
	o.Tool = "k8s"
	for _, m := range mod {
		m(&o)
	}
	p, err := agentsandbox.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

func create(t testing.TB, p *agentsandbox.Provider, meta map[string]string) sandbox.Handle {
	t.Helper()
	h, err := p.Create(context.Background(), sandbox.CreateOptions{Metadata: meta})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = p.Delete(context.Background(), h) })
	return h
}

func run(t testing.TB, p *agentsandbox.Provider, h sandbox.Handle, code string) sandbox.Result {
	t.Helper()
	r, err := p.Run(context.Background(), h, code, sandbox.RunOptions{})
	if err != nil {
		t.Fatalf("Run(%q) = %+v, %v", code, r, err)
	}
	return r
}

// eventually polls cond until it holds or 20 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: not within 20s", what)
		}
	}
}

// claims is a dynamic client on the double's claims, for what the backend does not expose.
func claims(t *testing.T, d *agentsandboxtest.Server) dynamic.ResourceInterface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", d.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dyn.Resource(schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}).Namespace(d.Namespace())
}

func shutdownTime(t *testing.T, d *agentsandboxtest.Server, claim string) time.Time {
	t.Helper()
	obj, err := claims(t, d).Get(context.Background(), claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, _, _ := unstructured.NestedString(obj.Object, "spec", "lifecycle", "shutdownTime")
	at, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatalf("shutdownTime %q: %v", s, err)
	}
	return at
}

func TestLifecycle(t *testing.T) {
	d := double(t)
	p := provider(t, d)
	h := create(t, p, map[string]string{sandbox.MetadataContainerID: "cntr_abc"})
	if h.Backend != agentsandbox.Backend || h.Tool != "k8s" || h.ID == "" || h.TrafficToken == "" || h.Domain != d.PodIP(h.TrafficToken) || h.AccessToken != "" {
		t.Fatalf("handle %+v (pod IP %s)", h, d.PodIP(h.TrafficToken))
	}
	if !strings.HasPrefix(h.ID, "ciproxy-") {
		t.Errorf("claim %s: want generateName ciproxy-", h.ID)
	}

	var live []string
	r, err := p.Run(context.Background(), h, "x = 41\nprint('hi')", sandbox.RunOptions{OnMessage: func(m sandbox.Message) { live = append(live, m.Type) }})
	if err != nil || r.Stdout != "hi\n" || r.ExecutionCount != 1 {
		t.Fatalf("first cell = %+v, %v", r, err)
	}
	if !slices.Equal(live, []string{"number_of_executions", "stdout", "end_of_execution"}) {
		t.Errorf("messages %v", live)
	}
	if r := run(t, p, h, "x + 1"); len(r.Results) != 1 || r.Results[0].Text != "42" || !r.Results[0].IsMainResult {
		t.Errorf("state across runs: %+v", r)
	}
	r = run(t, p, h, "1/0")
	if r.Error == nil || r.Error.Name != "ZeroDivisionError" || !strings.Contains(r.Error.Traceback, "Cell In[3]") {
		t.Errorf("traceback: %+v", r.Error)
	}
	r = run(t, p, h, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
	if len(r.Results) != 1 || !strings.HasPrefix(r.Results[0].PNG, "iVBORw0KGgo") {
		t.Errorf("image: %+v %v", r.Results, r.Error)
	}

	// Another replica: its own Provider, the same handle, the same kernel.
	other := provider(t, d)
	if r := run(t, other, h, "x"); len(r.Results) != 1 || r.Results[0].Text != "41" || r.ExecutionCount != 5 {
		t.Errorf("the other replica's cell: %+v", r)
	}

	listed, err := p.List(context.Background(), map[string]string{sandbox.MetadataContainerID: "cntr_abc"})
	if err != nil || len(listed) != 1 || listed[0].Handle.ID != h.ID || listed[0].Metadata[sandbox.MetadataContainerID] != "cntr_abc" {
		t.Errorf("List = %+v, %v", listed, err)
	}
	if none, err := p.List(context.Background(), map[string]string{sandbox.MetadataContainerID: "cntr_other"}); err != nil || len(none) != 0 {
		t.Errorf("List of another container = %+v, %v", none, err)
	}

	before := shutdownTime(t, d, h.ID)
	if err := p.KeepAlive(context.Background(), h, 3*time.Hour); err != nil {
		t.Fatal(err)
	}
	if after := shutdownTime(t, d, h.ID); after.Sub(before) < 90*time.Minute {
		t.Errorf("KeepAlive moved shutdownTime from %s to %s", before, after)
	}

	for _, e := range d.ProcessEnvs() {
		for _, kv := range e.Env {
			if strings.Contains(strings.ToLower(kv), "token") || strings.Contains(kv, "KUBE") {
				t.Errorf("pod %s process %v has %s in its environment", e.Pod, e.Command, kv)
			}
		}
	}

	if err := p.Delete(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pod and the claim gone", func() bool {
		return !slices.Contains(d.LivePods(), h.TrafficToken) && !slices.Contains(d.LiveClaims(), h.ID)
	})
	if err := p.Delete(context.Background(), h); err != nil {
		t.Errorf("a second Delete = %v", err)
	}
	if _, err := p.Run(context.Background(), h, "1", sandbox.RunOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Run after Delete = %v; want ErrNotFound", err)
	}
	if err := p.KeepAlive(context.Background(), h, time.Hour); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("KeepAlive after Delete = %v; want ErrNotFound", err)
	}
}

func TestTimeoutAndInterrupt(t *testing.T) {
	d := double(t)
	p := provider(t, d)
	h := create(t, p, nil)
	run(t, p, h, "y = 7")

	start := time.Now()
	r, err := p.Run(context.Background(), h, "import time\nprint('go', flush=True)\ntime.sleep(60)", sandbox.RunOptions{Timeout: time.Second})
	if !errors.Is(err, sandbox.ErrTimeout) || r.Stdout != "go\n" || time.Since(start) > 15*time.Second {
		t.Fatalf("timeout: %+v, %v after %s", r, err, time.Since(start))
	}
	if r := run(t, p, h, "y"); len(r.Results) != 1 || r.Results[0].Text != "7" {
		t.Errorf("after the timeout: %+v", r)
	}

	ctx, cancel := context.WithCancel(context.Background())
	start = time.Now()
	_, err = p.Run(ctx, h, "import time\nprint('go', flush=True)\ntime.sleep(60)", sandbox.RunOptions{OnMessage: func(m sandbox.Message) {
		if m.Type == "stdout" {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) || time.Since(start) > 15*time.Second {
		t.Fatalf("cancelled run = %v after %s", err, time.Since(start))
	}
	r = run(t, p, h, "y + 1")
	if len(r.Results) != 1 || r.Results[0].Text != "8" {
		t.Errorf("after the interrupt: %+v", r)
	}
}

func TestShell(t *testing.T) {
	d := double(t)
	p := provider(t, d)
	h := create(t, p, nil)
	for _, c := range []struct {
		name, cmd   string
		timeout     time.Duration
		want        sandbox.ExecResult
		out, errOut string
	}{
		{"exit status", "echo out; echo err >&2; exit 3", 0, sandbox.ExecResult{ExitCode: 3}, "out\n", "err\n"},
		{"working directory", "pwd", 0, sandbox.ExecResult{}, "/mnt/data\n", ""},
		{"stdin closed", "cat; echo done", 0, sandbox.ExecResult{}, "done\n", ""},
		{"signal", "kill -TERM $$", 0, sandbox.ExecResult{ExitCode: 143}, "", ""},
		{"utf-8", "printf 'caf\\xc3\\xa9 \\xff'", 0, sandbox.ExecResult{}, "café \uFFFD", ""},
		{"timeout", "echo started; sleep 60", time.Second, sandbox.ExecResult{TimedOut: true}, "started\n", ""},
		{"background ended", "echo a; sleep 61 & sleep 62 >/dev/null 2>&1 &", 0, sandbox.ExecResult{}, "a\n", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut strings.Builder
			res, err := p.Exec(context.Background(), h, c.cmd, sandbox.ExecOptions{Timeout: c.timeout, OnOutput: func(s sandbox.Stream, text string) {
				if s == sandbox.Stdout {
					out.WriteString(text)
				} else {
					errOut.WriteString(text)
				}
			}})
			if err != nil || res != c.want || out.String() != c.out || errOut.String() != c.errOut {
				t.Errorf("Exec(%q) = %+v, %v, out %q, err %q; want %+v, %q, %q", c.cmd, res, err, out.String(), errOut.String(), c.want, c.out, c.errOut)
			}
		})
	}
	var left strings.Builder
	if _, err := p.Exec(context.Background(), h, "pgrep -f 'sleep 6[12]' || true", sandbox.ExecOptions{OnOutput: func(_ sandbox.Stream, s string) { left.WriteString(s) }}); err != nil || left.Len() != 0 {
		t.Errorf("processes left by a command: %q, %v", left.String(), err)
	}
	if r := run(t, p, h, "print('kernel still here')"); r.Stdout != "kernel still here\n" {
		t.Errorf("kernel after commands: %+v", r)
	}
}

func TestFiles(t *testing.T) {
	d := double(t)
	p := provider(t, d)
	h := create(t, p, nil)
	ctx := context.Background()
	if err := p.WriteFile(ctx, h, "in/data.csv", strings.NewReader("a,b\n1,2\n"), 1<<20); err != nil {
		t.Fatal(err)
	}
	r := run(t, p, h, `import os
print(open('/mnt/data/in/data.csv').read(), end='')
open('out.txt', 'w').write('result')
os.makedirs('deep/er', exist_ok=True)
open('deep/er/f.bin', 'wb').write(b'\x00' * 10)
os.symlink('/etc/passwd', 'passwd-link')
os.symlink('/mnt/data/out.txt', 'inner-link')
os.mkdir('adir')
os.mkfifo('pipe')`)
	if r.Stdout != "a,b\n1,2\n" {
		t.Fatalf("the sandbox read %q", r.Stdout)
	}
	l, err := p.ListFiles(ctx, h, 100)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range l.Files {
		paths = append(paths, f.Path)
	}
	slices.Sort(paths)
	for _, want := range []string{"deep/er/f.bin", "in/data.csv", "out.txt"} {
		if !slices.Contains(paths, want) {
			t.Errorf("ListFiles %v lacks %s", paths, want)
		}
	}
	if slices.Contains(paths, "passwd-link") {
		t.Errorf("ListFiles %v lists a link out of the sandbox", paths)
	}
	if l, err := p.ListFiles(ctx, h, 1); err != nil || len(l.Files) != 1 || !l.Truncated {
		t.Errorf("ListFiles limit 1 = %+v, %v", l, err)
	}

	var buf bytes.Buffer
	if n, err := p.ReadFile(ctx, h, "out.txt", &buf, 1<<20); err != nil || n != 6 || buf.String() != "result" {
		t.Errorf("ReadFile = %d, %q, %v", n, buf.String(), err)
	}
	if _, err := p.ReadFile(ctx, h, "passwd-link", &buf, 1<<20); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("ReadFile of a link out = %v; want ErrNotFound", err)
	}
	if _, err := p.ReadFile(ctx, h, "adir", &buf, 1<<20); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("ReadFile of a directory = %v; want ErrNotFound", err)
	}
	start := time.Now()
	if _, err := p.ReadFile(ctx, h, "pipe", &buf, 1<<20); !errors.Is(err, sandbox.ErrFileBusy) && !errors.Is(err, sandbox.ErrNotFound) || time.Since(start) > 15*time.Second {
		t.Errorf("ReadFile of a FIFO = %v after %s; want ErrFileBusy or ErrNotFound, soon", err, time.Since(start))
	}
	run(t, p, h, "open('pipe', 'w').close()") // the double's sandboxd still waits in its open
	if _, err := p.ReadFile(ctx, h, "missing", &buf, 1<<20); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("ReadFile of nothing = %v; want ErrNotFound", err)
	}
	if _, err := p.ReadFile(ctx, h, "out.txt", &buf, 3); !errors.Is(err, sandbox.ErrFileTooLarge) {
		t.Errorf("ReadFile past max = %v; want ErrFileTooLarge", err)
	}
	if err := p.WriteFile(ctx, h, "adir", strings.NewReader("x"), 10); !errors.Is(err, sandbox.ErrNameTaken) {
		t.Errorf("WriteFile over a directory = %v; want ErrNameTaken", err)
	}
	if err := p.WriteFile(ctx, h, "passwd-link", strings.NewReader("x"), 10); err == nil {
		t.Error("WriteFile through a link out succeeded")
	}
	if b, _ := os.ReadFile("/etc/passwd"); bytes.Equal(b, []byte("x")) {
		t.Fatal("the host's /etc/passwd was written")
	}
	if err := p.WriteFile(ctx, h, "big.bin", strings.NewReader(strings.Repeat("x", 100)), 10); !errors.Is(err, sandbox.ErrFileTooLarge) {
		t.Errorf("WriteFile past max = %v; want ErrFileTooLarge", err)
	}
	if _, err := os.Stat(filepath.Join(d.PodDataDir(h.TrafficToken), "big.bin")); err == nil {
		t.Error("a file past max was left in the sandbox")
	}
	if err := p.RemoveFile(ctx, h, "out.txt"); err != nil {
		t.Fatal(err)
	}
	if err := p.RemoveFile(ctx, h, "out.txt"); err != nil {
		t.Errorf("removing a missing file = %v", err)
	}
	if err := p.WriteFile(ctx, h, "../escape", strings.NewReader("x"), 10); err == nil {
		t.Error("a path with .. was accepted")
	}
}

func TestRouter(t *testing.T) {
	d := double(t, func(o *agentsandboxtest.Options) { o.Router, o.RouterAuthz = true, "scoped-token" })
	p := provider(t, d, func(o *agentsandbox.Options) {
		o.Connect, o.RouterURL, o.RouterSecret = agentsandbox.ConnectRouter, d.RouterURL(), agentsandbox.Secret(d.ScopedTokenSecret())
	})
	h := create(t, p, nil)
	ctx := context.Background()
	if err := p.WriteFile(ctx, h, "r.txt", strings.NewReader("via router"), 100); err != nil {
		t.Fatal(err)
	}
	if r := run(t, p, h, "print(open('r.txt').read())"); r.Stdout != "via router\n" {
		t.Errorf("the kernel read %q", r.Stdout)
	}
	d.RefuseRouterTokens(true)
	var buf bytes.Buffer
	_, err := p.ReadFile(ctx, h, "r.txt", &buf, 100)
	if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "scoped token") || strings.Contains(err.Error(), d.ScopedTokenSecret()) {
		t.Errorf("ReadFile with tokens refused = %v", err)
	}
	if _, err := p.Create(ctx, sandbox.CreateOptions{}); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("Create with tokens refused = %v", err)
	}
	eventually(t, "no claim but the first", func() bool { return len(d.LiveClaims()) == 1 })
}

func TestCreateFaults(t *testing.T) {
	d := double(t)
	ctx := context.Background()

	t.Run("create refused", func(t *testing.T) {
		p := provider(t, d)
		d.FailCreates(1)
		if _, err := p.Create(ctx, sandbox.CreateOptions{}); !errors.Is(err, sandbox.ErrUnavailable) {
			t.Errorf("Create = %v; want ErrUnavailable", err)
		}
	})

	t.Run("never ready", func(t *testing.T) {
		p := provider(t, d, func(o *agentsandbox.Options) { o.ReadyTimeout = 2 * time.Second })
		d.StallClaims(true)
		defer d.StallClaims(false)
		_, err := p.Create(ctx, sandbox.CreateOptions{})
		if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "not ready within") {
			t.Errorf("Create = %v; want ErrUnavailable (not ready)", err)
		}
		if c := d.LiveClaims(); len(c) != 0 {
			t.Errorf("claims left: %v", c)
		}
	})

	t.Run("caller gone while waiting", func(t *testing.T) {
		p := provider(t, d)
		d.StallClaims(true)
		defer d.StallClaims(false)
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := p.Create(cctx, sandbox.CreateOptions{})
			done <- err
		}()
		eventually(t, "a claim", func() bool { return len(d.LiveClaims()) > 0 })
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Create = %v; want context.Canceled", err)
		}
		if c := d.LiveClaims(); len(c) != 0 {
			t.Errorf("claims left: %v", c)
		}
	})

	t.Run("watch resumed past compaction", func(t *testing.T) {
		p := provider(t, d)
		d.StallClaims(true)
		done := make(chan error, 1)
		var h sandbox.Handle
		go func() {
			var err error
			h, err = p.Create(ctx, sandbox.CreateOptions{})
			done <- err
		}()
		// Requests logs a watch once it ends: a dropped watch is the sign that one was open.
		drops := d.WatchDrops()
		eventually(t, "a watch dropped", func() bool { d.DropWatches(); return d.WatchDrops() > drops })
		lists := func() (n int) {
			for _, r := range d.Requests() {
				if r.Verb == "list" && r.Resource == "sandboxclaims" {
					n++
				}
			}
			return n
		}
		before := lists()
		// Another object's change moves the resource version on; compaction then makes the
		// watch's last one too old (410 Gone) when it resumes after the drop. A bookmark that
		// reaches the watch in between brings it up to date, so the three are repeated.
		other := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
			"metadata": map[string]any{"name": "bystander"},
			"spec":     map[string]any{"warmPoolRef": map[string]any{"name": d.WarmPool()}},
		}}
		if _, err := claims(t, d).Create(ctx, other, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = claims(t, d).Delete(context.Background(), "bystander", metav1.DeleteOptions{}) })
		n := 0
		eventually(t, "a fresh list after 410", func() bool {
			n++
			patch := []byte(`{"metadata":{"labels":{"n":"` + strconv.Itoa(n) + `"}}}`)
			if _, err := claims(t, d).Patch(ctx, "bystander", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			d.Compact()
			d.DropWatches()
			return lists() > before
		})
		d.StallClaims(false)
		if err := <-done; err != nil {
			t.Fatalf("Create after 410 = %v", err)
		}
		t.Cleanup(func() { _ = p.Delete(ctx, h) })
	})

	t.Run("watch dropped", func(t *testing.T) {
		p := provider(t, d)
		d.StallClaims(true)
		type created struct {
			h   sandbox.Handle
			err error
		}
		done := make(chan created, 1)
		go func() {
			h, err := p.Create(ctx, sandbox.CreateOptions{})
			done <- created{h, err}
		}()
		drops := d.WatchDrops()
		// Requests logs a watch once it ends: a dropped watch is the sign that one was open.
		eventually(t, "a watch dropped", func() bool { d.DropWatches(); return d.WatchDrops() > drops })
		d.StallClaims(false)
		c := <-done
		if c.err != nil {
			t.Fatalf("Create after a dropped watch = %v", c.err)
		}
		t.Cleanup(func() { _ = p.Delete(ctx, c.h) })
		if r := run(t, p, c.h, "1 + 1"); len(r.Results) != 1 || r.Results[0].Text != "2" {
			t.Errorf("run: %+v", r)
		}
	})
}

func TestSessions(t *testing.T) {
	d := double(t)
	p := provider(t, d)
	h := create(t, p, nil)
	run(t, p, h, "w = 5")

	// Concurrent executions of one replica take turns on its session.
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			r, err := p.Run(context.Background(), h, "import time\ntime.sleep(0.2)\nw", sandbox.RunOptions{})
			if err == nil && (len(r.Results) != 1 || r.Results[0].Text != "5") {
				err = fmt.Errorf("result %+v", r)
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Run: %v", err)
		}
	}

	// A relay that dies while idle is replaced at the next execution; the kernel keeps its state.
	res, err := p.Exec(context.Background(), h, "kill $(pgrep -f 'kerneld.py rela[y]')", sandbox.ExecOptions{})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("killing the relay: %+v, %v", res, err)
	}
	if r := run(t, p, h, "w + 1"); len(r.Results) != 1 || r.Results[0].Text != "6" {
		t.Errorf("after the relay's end: %+v", r)
	}
}

func TestKernelExitIsSaid(t *testing.T) {
	d := double(t)
	p := provider(t, d)
	h := create(t, p, nil)
	run(t, p, h, "z = 1")
	if _, err := p.Run(context.Background(), h, "import os; os._exit(1)", sandbox.RunOptions{}); !errors.Is(err, sandbox.ErrIncomplete) {
		t.Errorf("a cell that ends the kernel = %v; want ErrIncomplete", err)
	}
	r, err := p.Run(context.Background(), h, "z", sandbox.RunOptions{})
	if err != nil || r.Error == nil || r.Error.Name != "NameError" || !strings.Contains(r.Stderr, "kernel had ended") {
		t.Errorf("the next cell = %+v, %v; want a NameError and the restart said", r, err)
	}
}

func TestExecCancelled(t *testing.T) {
	d := double(t)
	p := provider(t, d)
	h := create(t, p, nil)
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	_, err := p.Exec(ctx, h, "echo go; sleep 60", sandbox.ExecOptions{OnOutput: func(sandbox.Stream, string) { cancel() }})
	if !errors.Is(err, context.Canceled) || time.Since(start) > 15*time.Second {
		t.Errorf("Exec = %v after %s", err, time.Since(start))
	}
	var out strings.Builder
	eventually(t, "the command killed", func() bool {
		out.Reset()
		res, err := p.Exec(context.Background(), h, "pgrep -fc 'sleep 6[0]' || true", sandbox.ExecOptions{OnOutput: func(_ sandbox.Stream, s string) { out.WriteString(s) }})
		return err == nil && res.ExitCode == 0 && strings.TrimSpace(out.String()) == "0"
	})
}

func TestCheckHost(t *testing.T) {
	d := double(t)
	s := agentsandbox.Settings{Options: agentsandbox.DefaultOptions()}
	s.Kubeconfig, s.Namespace, s.WarmPool = d.Kubeconfig(), d.Namespace(), d.WarmPool()
	rep, err := s.CheckHost(context.Background())
	if err != nil || !strings.Contains(rep.Isolation, "warm pool ciproxy-python") || !strings.Contains(rep.Isolation, "egress: []") {
		t.Errorf("CheckHost = %+v, %v", rep, err)
	}
	s.WarmPool = "nope"
	if _, err := s.CheckHost(context.Background()); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("CheckHost of a missing pool = %v", err)
	}
	if c := d.LiveClaims(); len(c) != 0 {
		t.Errorf("--check made claims: %v", c)
	}
}

func TestCreateFailsFast(t *testing.T) {
	ctx := context.Background()
	t.Run("pod failed before ready", func(t *testing.T) {
		d := double(t, func(o *agentsandboxtest.Options) { o.WarmPoolReplicas, o.ReadyDelay = 1, 2*time.Second })
		d.HoldReadiness(true)
		p := provider(t, d)
		done := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := p.Create(ctx, sandbox.CreateOptions{})
			done <- err
		}()
		var sb string
		eventually(t, "a bound claim", func() bool {
			for _, name := range d.LiveClaims() {
				obj, err := claims(t, d).Get(ctx, name, metav1.GetOptions{})
				if err == nil {
					sb, _, _ = unstructured.NestedString(obj.Object, "status", "sandbox", "name")
				}
			}
			return sb != ""
		})
		// Once its processes run (KillPod reads the pod the controller is still launching unlocked).
		eventually(t, "the pod up", func() bool { return slices.Contains(d.LivePods(), sb) })
		if err := d.KillPod(sb); err != nil {
			t.Fatal(err)
		}
		err := <-done
		if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "PodFailed") || time.Since(start) > 30*time.Second {
			t.Errorf("Create = %v after %s; want ErrUnavailable naming PodFailed, at once", err, time.Since(start))
		}
		eventually(t, "no claim left", func() bool { return len(d.LiveClaims()) == 0 })
	})
	t.Run("claim deleted while waiting", func(t *testing.T) {
		d := double(t)
		d.StallClaims(true)
		p := provider(t, d)
		done := make(chan error, 1)
		go func() {
			_, err := p.Create(ctx, sandbox.CreateOptions{})
			done <- err
		}()
		eventually(t, "a claim", func() bool { return len(d.LiveClaims()) == 1 })
		if err := claims(t, d).Delete(ctx, d.LiveClaims()[0], metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "deleted") {
			t.Errorf("Create = %v; want ErrUnavailable (claim deleted)", err)
		}
	})
}

func TestPodKilledUnderACell(t *testing.T) {
	d := double(t)
	p := provider(t, d)
	h := create(t, p, nil)
	started := make(chan struct{})
	type ran struct {
		r   sandbox.Result
		err error
	}
	done := make(chan ran, 1)
	go func() {
		var once bool
		r, err := p.Run(context.Background(), h, "import time\nprint('go', flush=True)\ntime.sleep(60)", sandbox.RunOptions{OnMessage: func(m sandbox.Message) {
			if m.Type == "stdout" && !once {
				once = true
				close(started)
			}
		}})
		done <- ran{r, err}
	}()
	<-started
	if err := d.KillPod(h.TrafficToken); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-done:
		if !errors.Is(got.err, sandbox.ErrNotFound) && !errors.Is(got.err, sandbox.ErrIncomplete) {
			t.Errorf("Run under a killed pod = %v; want ErrNotFound or ErrIncomplete", got.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run hangs after the pod was killed")
	}
	if _, err := p.Run(context.Background(), h, "1", sandbox.RunOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("the next Run = %v; want ErrNotFound", err)
	}
	if _, err := p.Exec(context.Background(), h, "true", sandbox.ExecOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Exec = %v; want ErrNotFound", err)
	}
}

// TestMemoryLimitRecorded: a claim cannot change the template's resources, so a container's
// memory_limit is recorded on its claim, and a claim without one carries no annotation.
func TestMemoryLimitRecorded(t *testing.T) {
	d := double(t)
	p := provider(t, d)
	for _, limit := range []string{"4g", ""} {
		h, err := p.Create(context.Background(), sandbox.CreateOptions{MemoryLimit: limit})
		if err != nil {
			t.Fatal(err)
		}
		obj, err := claims(t, d).Get(context.Background(), h.ID, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := obj.GetAnnotations()["ciproxy.io/memory-limit"]; got != limit {
			t.Errorf("memory_limit %q: the claim's annotation is %q", limit, got)
		}
		if err := p.Delete(context.Background(), h); err != nil {
			t.Fatal(err)
		}
	}
}

// TestExecFastCommand: a command that exits before the end of its stdin reaches sandboxd (which
// then no longer knows the process: NOT_FOUND) still gives its output and exit status. The
// stand-in sandboxd runs commands as its children, fast enough to lose that race often, where
// the double's pods (nsenter) seldom do.
func TestExecFastCommand(t *testing.T) {
	// Rooted elsewhere than /mnt/data, the cwd the backend asks resolves under the root.
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "mnt/data"), 0o755); err != nil {
		t.Fatal(err)
	}
	sd := agentsandboxtest.NewSandboxd(root, os.Environ())
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	sd.RegisterGRPC(gs)
	go func() { _ = gs.Serve(gl) }()
	t.Cleanup(gs.Stop)
	hs := httptest.NewServer(sd.RESTHandler())
	t.Cleanup(hs.Close)
	o := agentsandbox.DefaultOptions()
	o.WarmPool, o.RestConfig = "unused", &rest.Config{Host: "http://127.0.0.1:1"}
	o.ProcessPort = gl.Addr().(*net.TCPAddr).Port
	o.FilesPort = hs.Listener.Addr().(*net.TCPAddr).Port
	p, err := agentsandbox.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	h := sandbox.Handle{Backend: "agent_sandbox", ID: "direct", TrafficToken: "direct", Domain: "127.0.0.1"}
	for i := range 200 {
		var out strings.Builder
		res, err := p.Exec(context.Background(), h, "echo fast", sandbox.ExecOptions{OnOutput: func(_ sandbox.Stream, s string) { out.WriteString(s) }})
		if err != nil || res.ExitCode != 0 || out.String() != "fast\n" {
			t.Fatalf("Exec %d: %+v, %v, output %q", i, res, err, out.String())
		}
	}
}
