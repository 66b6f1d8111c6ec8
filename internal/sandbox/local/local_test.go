package local

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"image/png"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// shared serves the tests that need no special options; its warm pool keeps Create fast. It is
// started on first use (benchmarks do not want its pool competing for the CPU) and closed by
// TestMain.
var (
	sharedOnce sync.Once
	sharedP    *Provider
	sharedErr  error
)

func sharedProvider(t testing.TB) *Provider {
	t.Helper()
	sharedOnce.Do(func() {
		sharedP, sharedErr = newProvider(testOptions(Options{Tool: "local-test", PoolSize: DefaultPoolSize}), testKnobs(knobs{}))
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return sharedP
}

func TestMain(m *testing.M) {
	ctx := context.Background()
	if dir := os.Getenv(sweepHelperEnv); dir != "" {
		sweepHelper(dir) // never returns
	}
	if _, err := checkWith(ctx, testOptions(Options{}), testKnobs(knobs{})); err != nil {
		fmt.Fprintln(os.Stderr, "local sandbox tests need a working bubblewrap:", err)
		os.Exit(1)
	}
	code := m.Run()
	if sharedP != nil {
		if err := sharedP.Close(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "close:", err)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// startTimeoutEnv, a Go duration, is how long the tests' providers wait for a kernel or the
// zygote to start (an emulated machine, make test-cgroup2's, takes about a minute).
const startTimeoutEnv = "CIPROXY_TEST_START_TIMEOUT"

func testKnobs(k knobs) knobs {
	if d, err := time.ParseDuration(os.Getenv(startTimeoutEnv)); err == nil {
		k.startTimeout = d
	}
	return k
}

// uidsEnv, "base:count", is the range of sandbox uids the tests' providers lease instead of the
// default: a user namespace of a container (make image-test's) maps 65536 uids, not the default's.
const uidsEnv = "CIPROXY_TEST_UIDS"

func testOptions(o Options) Options {
	var base, count uint32
	if _, err := fmt.Sscanf(os.Getenv(uidsEnv), "%d:%d", &base, &count); err == nil && o.UIDBase == 0 {
		o.UIDBase, o.UIDCount = base, count
	}
	return o
}

func newTestProvider(t testing.TB, opts Options) *Provider {
	t.Helper()
	p, err := newProvider(testOptions(opts), testKnobs(knobs{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

func create(t testing.TB, p *Provider, opts sandbox.CreateOptions) sandbox.Handle {
	t.Helper()
	h, err := p.Create(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Delete(context.Background(), h); err != nil {
			t.Errorf("Delete: %v", err)
		}
	})
	return h
}

func run(t testing.TB, p *Provider, h sandbox.Handle, code string) sandbox.Result {
	t.Helper()
	res, err := p.Run(context.Background(), h, code, sandbox.RunOptions{Timeout: 60 * time.Second})
	if err != nil {
		t.Fatalf("Run(%q) error: %v (result %+v)", code, err, res)
	}
	return res
}

// mainText returns the text of the main result, or "<none>".
func mainText(r sandbox.Result) string {
	for _, o := range r.Results {
		if o.IsMainResult {
			return o.Text
		}
	}
	return "<none>"
}

func TestKernel(t *testing.T) {
	shared := sharedProvider(t)
	h := create(t, shared, sandbox.CreateOptions{})
	cases := []struct {
		name, code string
		check      func(t *testing.T, r sandbox.Result, types []string)
	}{
		{"state is kept: define", "x = 40\ndef inc(v):\n    return v + 1", func(t *testing.T, r sandbox.Result, _ []string) {
			if len(r.Results) != 0 || r.Error != nil {
				t.Errorf("got %+v; want no results, no error", r)
			}
		}},
		{"state is kept: use", "inc(x) + 1", func(t *testing.T, r sandbox.Result, _ []string) {
			if got := mainText(r); got != "42" {
				t.Errorf("main result = %q; want 42", got)
			}
		}},
		{"print then expression, in order", "print('hello')\n'a' + 'b'", func(t *testing.T, r sandbox.Result, types []string) {
			if r.Stdout != "hello\n" || mainText(r) != "ab" {
				t.Errorf("stdout %q, main %q; want %q, %q", r.Stdout, mainText(r), "hello\n", "ab")
			}
			want := []string{"number_of_executions", "stdout", "result", "end_of_execution"}
			if strings.Join(types, ",") != strings.Join(want, ",") {
				t.Errorf("messages %v; want %v", types, want)
			}
		}},
		{"None gives no result", "None", func(t *testing.T, r sandbox.Result, _ []string) {
			if len(r.Results) != 0 {
				t.Errorf("results %+v; want none", r.Results)
			}
		}},
		{"trailing semicolon hides the value", "1 + 1;", func(t *testing.T, r sandbox.Result, _ []string) {
			if len(r.Results) != 0 {
				t.Errorf("results %+v; want none", r.Results)
			}
		}},
		{"stderr and subprocess output are captured", "import sys, subprocess\nprint('err', file=sys.stderr)\nsubprocess.run(['echo', 'from child'])\nimport os\nos.system('echo raw >&2')", func(t *testing.T, r sandbox.Result, _ []string) {
			if r.Stdout != "from child\n" || r.Stderr != "err\nraw\n" {
				t.Errorf("stdout %q stderr %q; want %q %q", r.Stdout, r.Stderr, "from child\n", "err\nraw\n")
			}
		}},
		{"figure comes after the main result", "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.title('t')", func(t *testing.T, r sandbox.Result, _ []string) {
			if len(r.Results) != 2 {
				t.Fatalf("got %d results; want 2", len(r.Results))
			}
			if !r.Results[0].IsMainResult || r.Results[0].Text != "Text(0.5, 1.0, 't')" {
				t.Errorf("results[0] = %+v; want main result Text(0.5, 1.0, 't')", r.Results[0])
			}
			fig := r.Results[1]
			if fig.IsMainResult || fig.PNG == "" || !strings.HasPrefix(fig.Text, "<Figure size") {
				t.Fatalf("results[1] = text %q main %v png %d bytes; want a figure", fig.Text, fig.IsMainResult, len(fig.PNG))
			}
			raw, err := base64.StdEncoding.DecodeString(fig.PNG)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := png.Decode(bytes.NewReader(raw)); err != nil {
				t.Errorf("png.Decode: %v", err)
			}
		}},
		{"figures are closed after being shown", "import matplotlib.pyplot as plt\nlen(plt.get_fignums())", func(t *testing.T, r sandbox.Result, _ []string) {
			if got := mainText(r); got != "0" || len(r.Results) != 1 {
				t.Errorf("main %q, %d results; want 0 open figures and no image", got, len(r.Results))
			}
		}},
		{"NameError", "print('before')\nundefined_name", func(t *testing.T, r sandbox.Result, types []string) {
			if r.Error == nil {
				t.Fatal("no error")
			}
			e := r.Error
			if e.Name != "NameError" || e.Value != "name 'undefined_name' is not defined" {
				t.Errorf("error %q: %q", e.Name, e.Value)
			}
			if !strings.Contains(e.Traceback, "Traceback (most recent call last)") || !strings.Contains(e.Traceback, "undefined_name") {
				t.Errorf("traceback %q", e.Traceback)
			}
			if strings.Contains(e.Traceback, "kernel.py") {
				t.Errorf("traceback shows the kernel's own frames: %q", e.Traceback)
			}
			if r.Stdout != "before\n" || types[len(types)-1] != "end_of_execution" {
				t.Errorf("stdout %q, messages %v", r.Stdout, types)
			}
		}},
		{"error inside a function shows both frames", "def f():\n    return 1 / 0\nf()", func(t *testing.T, r sandbox.Result, _ []string) {
			if r.Error == nil || r.Error.Name != "ZeroDivisionError" || strings.Count(r.Error.Traceback, "Cell In[") != 2 {
				t.Errorf("error %+v", r.Error)
			}
		}},
		{"syntax error", "x = (", func(t *testing.T, r sandbox.Result, _ []string) {
			if r.Error == nil || r.Error.Name != "SyntaxError" || !strings.Contains(r.Error.Traceback, "x = (") {
				t.Errorf("error %+v", r.Error)
			}
			if strings.Contains(r.Error.Traceback, "ast.py") {
				t.Errorf("traceback shows the parser's frames: %q", r.Error.Traceback)
			}
		}},
		{"state survives errors", "x", func(t *testing.T, r sandbox.Result, _ []string) {
			if got := mainText(r); got != "40" {
				t.Errorf("main result = %q; want 40", got)
			}
		}},
		{"DataFrame has text and html", "import pandas as pd\npd.DataFrame({'a': [1, 2]})", func(t *testing.T, r sandbox.Result, _ []string) {
			if len(r.Results) != 1 || !strings.Contains(r.Results[0].HTML, "<table") || !strings.Contains(r.Results[0].Text, "a") {
				t.Errorf("results %+v", r.Results)
			}
		}},
		{"working directory and identity", "import os\n(os.getcwd(), os.environ['HOME'], os.getuid(), os.getgid())", func(t *testing.T, r sandbox.Result, _ []string) {
			if got := mainText(r); got != "('/mnt/data', '/mnt/data', 1000, 1000)" {
				t.Errorf("main result = %q", got)
			}
		}},
	}
	prevCount := 0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var types []string
			res, err := shared.Run(context.Background(), h, tc.code, sandbox.RunOptions{
				Timeout:   60 * time.Second,
				OnMessage: func(m sandbox.Message) { types = append(types, m.Type) },
			})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.ExecutionCount != prevCount+1 {
				t.Errorf("execution count %d; want %d", res.ExecutionCount, prevCount+1)
			}
			prevCount = res.ExecutionCount
			if len(types) < 2 || types[0] != "number_of_executions" || types[len(types)-1] != "end_of_execution" {
				t.Errorf("messages %v; want number_of_executions first, end_of_execution last", types)
			}
			tc.check(t, res, types)
		})
	}
}

func TestHandle(t *testing.T) {
	shared := sharedProvider(t)
	h := create(t, shared, sandbox.CreateOptions{})
	if h.Backend != "local" || h.Tool != "local-test" || !validID(h.ID) {
		t.Errorf("handle %+v", h)
	}
	if err := shared.KeepAlive(context.Background(), h, time.Minute); err != nil {
		t.Errorf("KeepAlive: %v", err)
	}
	tree := descendants(sandboxPID(t, shared, h))
	if len(tree) < 2 {
		t.Fatalf("sandbox process tree %v; want init and python", tree)
	}
	if err := shared.Delete(context.Background(), h); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	// Gone, not even left as zombies.
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range tree {
		for {
			if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("process %d of the deleted sandbox still exists", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := shared.Delete(context.Background(), h); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	if _, err := shared.Run(context.Background(), h, "1", sandbox.RunOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Run after Delete: %v; want ErrNotFound", err)
	}
	if err := shared.KeepAlive(context.Background(), h, time.Minute); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("KeepAlive after Delete: %v; want ErrNotFound", err)
	}
	if _, err := os.Stat(filepath.Join(shared.base, h.ID)); !os.IsNotExist(err) {
		t.Errorf("working directory left behind: %v", err)
	}
	other := h
	other.Backend = "e2b"
	if _, err := shared.Run(context.Background(), other, "1", sandbox.RunOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Run with a foreign handle: %v; want ErrNotFound", err)
	}
}

func TestTimeout(t *testing.T) {
	p := newTestProvider(t, Options{PoolSize: -1})
	p.grace = 500 * time.Millisecond
	h := create(t, p, sandbox.CreateOptions{})
	run(t, p, h, "kept = 'yes'")

	t.Run("interrupt keeps the kernel", func(t *testing.T) {
		res, err := p.Run(context.Background(), h, "import time\nprint('start')\ntime.sleep(60)", sandbox.RunOptions{Timeout: 500 * time.Millisecond})
		if !errors.Is(err, sandbox.ErrTimeout) {
			t.Fatalf("err = %v; want ErrTimeout", err)
		}
		if res.Error == nil || res.Error.Name != "KeyboardInterrupt" || res.Stdout != "start\n" {
			t.Errorf("result %+v; want the partial output and KeyboardInterrupt", res)
		}
		if got := mainText(run(t, p, h, "kept")); got != "yes" {
			t.Errorf("state after interrupt: %q; want yes", got)
		}
	})
	t.Run("ignored interrupt kills the sandbox", func(t *testing.T) {
		start := time.Now()
		_, err := p.Run(context.Background(), h, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.01)", sandbox.RunOptions{Timeout: 500 * time.Millisecond})
		if !errors.Is(err, sandbox.ErrTimeout) {
			t.Fatalf("err = %v; want ErrTimeout", err)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("Run took %s", d)
		}
		if _, err := p.Run(context.Background(), h, "kept", sandbox.RunOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("Run after kill: %v; want ErrNotFound", err)
		}
		if n := p.Live(); n != 0 {
			t.Errorf("Live() = %d; want 0", n)
		}
	})
}

func TestContextCancelInterrupts(t *testing.T) {
	shared := sharedProvider(t)
	h := create(t, shared, sandbox.CreateOptions{})
	run(t, shared, h, "n = 1")
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	var once bool
	go func() {
		<-started
		cancel()
	}()
	_, err := shared.Run(ctx, h, "import time\nprint('go', flush=True)\ntime.sleep(60)", sandbox.RunOptions{
		OnMessage: func(m sandbox.Message) {
			if m.Type == "stdout" && !once {
				once = true
				close(started)
			}
		},
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v; want context.Canceled", err)
	}
	res := run(t, shared, h, "n + 1")
	if got := mainText(res); got != "2" {
		t.Errorf("after cancel: %q; want 2", got)
	}
}

// TestInterruptAfterSignalCheck: a SIGINT that lands after the interpreter last looked for
// signals and before a blocking call starts leaves the handler queued while the call blocks; the
// kernel must still stop the call, or the sandbox is killed at the end of the grace period and
// loses its state. The cell makes that state certain instead of rare: with SA_RESTART on SIGINT
// (siginterrupt False), the signal is taken and the read goes on, exactly as a read entered just
// after the signal.
func TestInterruptAfterSignalCheck(t *testing.T) {
	p := newTestProvider(t, Options{PoolSize: -1})
	p.grace = 2 * time.Second
	h := create(t, p, sandbox.CreateOptions{})
	run(t, p, h, "n = 1")
	res, err := p.Run(context.Background(), h, `import os, signal
signal.siginterrupt(signal.SIGINT, False)
r, w = os.pipe()
os.read(r, 1)`, sandbox.RunOptions{Timeout: 300 * time.Millisecond})
	if !errors.Is(err, sandbox.ErrTimeout) || res.Error == nil || res.Error.Name != "KeyboardInterrupt" {
		t.Fatalf("err = %v, result error %+v; want ErrTimeout and KeyboardInterrupt", err, res.Error)
	}
	if strings.Contains(res.Error.Traceback, "kernel.py") {
		t.Errorf("traceback shows the kernel's frames:\n%s", res.Error.Traceback)
	}
	res, err = p.Run(context.Background(), h, "n + 1", sandbox.RunOptions{})
	if err != nil || mainText(res) != "2" {
		t.Fatalf("after the interrupt: %q, %v; want 2 (the sandbox kept)", mainText(res), err)
	}

	// The wakes that follow the SIGINT only make a blocking call retry: cleanup code that caught
	// the KeyboardInterrupt sleeps its whole time. And SIGINT keeps Python's own handler, which
	// asyncio.run looks for.
	res, err = p.Run(context.Background(), h, `import signal, time
try:
    time.sleep(60)
except KeyboardInterrupt:
    t0 = time.monotonic()
    time.sleep(0.5)
    print("cleanup slept", time.monotonic() - t0 >= 0.5)
signal.getsignal(signal.SIGINT) is signal.default_int_handler`, sandbox.RunOptions{Timeout: 300 * time.Millisecond})
	if !errors.Is(err, sandbox.ErrTimeout) || res.Error != nil || res.Stdout != "cleanup slept True\n" || mainText(res) != "True" {
		t.Errorf("caught interrupt: err %v, result %+v; want the cleanup's whole sleep and the default handler", err, res)
	}

	// Code that sets every signal to its default action (which for the wake signal ends the
	// process) gets no wakes, and its sandbox lives on.
	res, err = p.Run(context.Background(), h, `import signal, time
for s in range(signal.SIGRTMIN, signal.SIGRTMAX + 1):
    signal.signal(s, signal.SIG_DFL)
try:
    time.sleep(60)
except KeyboardInterrupt:
    time.sleep(0.3)
print("done")`, sandbox.RunOptions{Timeout: 300 * time.Millisecond})
	if !errors.Is(err, sandbox.ErrTimeout) || res.Stdout != "done\n" {
		t.Errorf("signals reset: err %v, result %+v; want the cell to end on its own", err, res)
	}
	if res, err := p.Run(context.Background(), h, "n + 2", sandbox.RunOptions{}); err != nil || mainText(res) != "3" {
		t.Errorf("after the signals were reset: %q, %v; want 3 (the sandbox kept)", mainText(res), err)
	}
}

// TestIsolation checks that code in a sandbox cannot reach the host: each case prints lines that
// name what it could reach; an empty output is a pass.
func TestIsolation(t *testing.T) {
	shared := sharedProvider(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	secretDir := t.TempDir()
	secretFile := filepath.Join(secretDir, "secret.txt")
	if err := os.WriteFile(secretFile, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(secretDir, 0o755)

	h := create(t, shared, sandbox.CreateOptions{})
	cases := []struct{ name, code string }{
		{"no network", fmt.Sprintf(`import socket
for addr in [("127.0.0.1", %d), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(addr)
        print("connected to", addr)
    except OSError:
        pass
    finally:
        s.close()
names = [n for _, n in socket.if_nameindex()]
if names != ["lo"]:
    print("interfaces", names)
`, port)},
		{"no host processes", fmt.Sprintf(`import os
pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
if %d in pids or len(pids) > 5:
    print("sees processes", pids)
`, os.Getpid())},
		{"host files are out of reach", fmt.Sprintf(`import os
for p in [%q, %q, "/root", "/home", "/etc/shadow", "/work", "/var", "/run", "/sys/fs/cgroup"]:
    try:
        if os.path.isdir(p):
            print("listed", p, os.listdir(p))
        else:
            print("read", p, open(p).read()[:40])
    except OSError:
        pass
`, secretFile, secretDir)},
		{"nothing is writable outside /mnt/data and /tmp", `import os
ok = ("/mnt/data", "/tmp", "/dev/shm", "/dev/pts", "/proc", "/sys")
for root, dirs, files in os.walk("/"):
    if root.startswith(ok):
        dirs[:] = []
        continue
    if os.access(root, os.W_OK):
        print("writable dir", root)
for p in ["/x", "/usr/x", "/etc/passwd", "/opt/ciproxy/kernel.py", "/dev/x", "/dev/pts/x", "/bin/x"]:
    try:
        with open(p, "a") as f:
            f.write("x")
        print("wrote", p)
    except OSError:
        pass
`},
		{"unprivileged inside", `import os
if os.getuid() == 0 or os.geteuid() == 0:
    print("root inside")
caps = [l for l in open("/proc/self/status") if l.startswith("CapEff")]
if caps != ["CapEff:\t0000000000000000\n"]:
    print("capabilities", caps)
import subprocess
try:
    if subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True).returncode == 0:
        print("can create a user namespace (and become root in it)")
except FileNotFoundError:
    pass
`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, shared, h, tc.code)
			if res.Error != nil {
				t.Fatalf("probe failed: %s: %s", res.Error.Name, res.Error.Traceback)
			}
			if res.Stdout != "" {
				t.Errorf("sandbox reached the host:\n%s", res.Stdout)
			}
		})
	}
}

// TestNoProxyEnvironment starts a sandbox after putting a secret in the proxy's environment and
// looks for it everywhere the sandbox can read.
func TestNoProxyEnvironment(t *testing.T) {
	shared := sharedProvider(t)
	secret := "ciproxy-secret-" + newID()
	t.Setenv("CIPROXY_TEST_SECRET", secret)
	// A non-default memory limit skips the pool: this sandbox starts after Setenv.
	h := create(t, shared, sandbox.CreateOptions{MemoryLimit: "900m"})
	res := run(t, shared, h, fmt.Sprintf(`import os
secret = %q
found = []
if any(secret in k or secret in v for k, v in os.environ.items()):
    found.append("os.environ")
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for name in ("environ", "cmdline"):
        try:
            if secret.encode() in open(f"/proc/{pid}/{name}", "rb").read():
                found.append(f"/proc/{pid}/{name}")
        except OSError:
            pass
for root in ("/mnt/data", "/tmp", "/etc", "/opt"):
    for d, _, files in os.walk(root):
        for f in files:
            try:
                if secret.encode() in open(os.path.join(d, f), "rb").read():
                    found.append(os.path.join(d, f))
            except OSError:
                pass
sorted(os.environ), found
`, secret))
	text := mainText(res)
	if !strings.HasSuffix(text, "[])") {
		t.Errorf("the secret reached the sandbox: %s", text)
	}
	if strings.Contains(text, "CIPROXY") {
		t.Errorf("proxy variables in the sandbox: %s", text)
	}
}

func TestSandboxesAreSeparate(t *testing.T) {
	shared := sharedProvider(t)
	a := create(t, shared, sandbox.CreateOptions{})
	b := create(t, shared, sandbox.CreateOptions{})
	run(t, shared, a, `import subprocess
open("/mnt/data/a.txt", "w").write("from a")
open("/tmp/a.txt", "w").write("from a")
subprocess.Popen(["sleep", "300"])
`)
	res := run(t, shared, b, `import os
seen = [p for p in ("/mnt/data/a.txt", "/tmp/a.txt") if os.path.exists(p)]
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        if b"sleep" in open(f"/proc/{pid}/cmdline", "rb").read():
            seen.append(pid)
    except OSError:
        pass
print(*seen)
`)
	if strings.TrimSpace(res.Stdout) != "" || res.Error != nil {
		t.Errorf("sandbox b sees sandbox a: %q %+v", res.Stdout, res.Error)
	}
	// The probe must be able to see what it looks for: a sees its own.
	res = run(t, shared, a, `import os
print(os.path.exists("/mnt/data/a.txt"), any(b"sleep" in open(f"/proc/{p}/cmdline", "rb").read() for p in os.listdir("/proc") if p.isdigit()))`)
	if res.Stdout != "True True\n" {
		t.Errorf("sandbox a does not see its own file and process: %q", res.Stdout)
	}
}

func TestLimits(t *testing.T) {
	shared := sharedProvider(t)
	p := newTestProvider(t, Options{
		PoolSize: 2, MaxProcesses: 32, MemoryLimit: 768 << 20, MaxFileSize: 4 << 20, MaxDiskSize: 10 << 20,
	})
	p.grace = time.Second
	// memory, file size and /tmp share one sandbox: none of them stops it.
	limited := create(t, p, sandbox.CreateOptions{})

	t.Run("fork bomb is contained", func(t *testing.T) {
		h := create(t, p, sandbox.CreateOptions{})
		res := run(t, p, h, `import os, time
children = 0
for i in range(1000):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    children += 1
children`)
		n, err := strconv.Atoi(mainText(res))
		if err != nil || n <= 0 || n >= 32 {
			t.Errorf("forked %q children; want between 1 and 31", mainText(res))
		}
		// A recursive bomb: every child forks too. It must fail or be stopped, and the host must
		// stay healthy.
		_, err = p.Run(context.Background(), h, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", sandbox.RunOptions{Timeout: 2 * time.Second})
		if !errors.Is(err, sandbox.ErrTimeout) {
			t.Errorf("recursive bomb: %v; want ErrTimeout", err)
		}
		if err := exec.Command("true").Run(); err != nil {
			t.Errorf("host cannot start a process after the bomb: %v", err)
		}
		if got := mainText(run(t, shared, create(t, shared, sandbox.CreateOptions{}), "1 + 1")); got != "2" {
			t.Errorf("another sandbox after the bomb: %q", got)
		}
	})
	t.Run("memory bomb gets MemoryError", func(t *testing.T) {
		h := limited
		res := run(t, p, h, "x = bytearray(4 * 1024**3)")
		if res.Error == nil || res.Error.Name != "MemoryError" {
			t.Fatalf("error %+v; want MemoryError", res.Error)
		}
		res = run(t, p, h, "blocks = []\nwhile True:\n    blocks.append(bytearray(64 * 1024**2))")
		if res.Error == nil || res.Error.Name != "MemoryError" {
			t.Fatalf("error %+v; want MemoryError", res.Error)
		}
		if got := mainText(run(t, p, h, "del blocks\n1 + 1")); got != "2" {
			t.Errorf("after MemoryError: %q", got)
		}
	})
	t.Run("file size", func(t *testing.T) {
		h := limited
		res := run(t, p, h, "open('/mnt/data/big', 'wb').write(b'x' * (5 << 20))")
		if res.Error == nil || !strings.Contains(res.Error.Value, "File too large") {
			t.Errorf("error %+v; want File too large", res.Error)
		}
	})
	t.Run("data directory is a full disk at its size", func(t *testing.T) {
		h := create(t, p, sandbox.CreateOptions{})
		res := run(t, p, h, "for i in range(4):\n    open(f'/mnt/data/f{i}', 'wb').write(b'x' * (3 << 20))")
		if res.Error == nil || !strings.Contains(res.Error.Value, "No space left on device") {
			t.Errorf("error %+v; want No space left on device", res.Error)
		}
		if got := mainText(run(t, p, h, "import os\nos.remove('/mnt/data/f0')\n1 + 1")); got != "2" {
			t.Errorf("after the full disk: %q", got)
		}
	})
	t.Run("tmp is bounded", func(t *testing.T) {
		h := limited
		res := run(t, p, h, "import os\nfor i in range(300):\n    open(f'/tmp/f{i}', 'wb').write(b'x' * (3 << 20))")
		if res.Error == nil || !strings.Contains(res.Error.Value, "No space left") {
			t.Errorf("error %+v; want No space left on device", res.Error)
		}
	})
}

func TestOutputFlood(t *testing.T) {
	shared := sharedProvider(t)
	h := create(t, shared, sandbox.CreateOptions{})
	res := run(t, shared, h, "for i in range(12000):\n    print('x' * 1000)\n'done'")
	if !res.Truncated {
		t.Errorf("Truncated = false; want true")
	}
	if n := len(res.Stdout); n > sandbox.DefaultOutputLimit+200 || n < sandbox.DefaultOutputLimit/2 {
		t.Errorf("stdout is %d bytes; want about %d", n, sandbox.DefaultOutputLimit)
	}
	if got := mainText(run(t, shared, h, "1 + 1")); got != "2" {
		t.Errorf("after the flood: %q", got)
	}
}

func TestMemoryLimitOption(t *testing.T) {
	shared := sharedProvider(t)
	cases := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"", DefaultMemoryLimit, true},
		{"1g", 1 << 30, true},
		{"4G", 4 << 30, true},
		{"512m", 512 << 20, true},
		{"16g", DefaultMaxMemory, true}, // capped
		{"1gb", 1 << 30, true},
		{"lots", 0, false},
		{"-1g", 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := shared.memoryFor(tc.in)
			if (err == nil) != tc.ok || got != tc.want {
				t.Errorf("memoryFor(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
			}
		})
	}
	if _, err := shared.Create(context.Background(), sandbox.CreateOptions{MemoryLimit: "lots"}); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("Create with a bad memory_limit: %v; want ErrUnavailable", err)
	}
}

func TestPoolAndClose(t *testing.T) {
	p, err := New(Options{PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	poolID := func() string {
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.pool) == 0 {
			return ""
		}
		return p.pool[0].id
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("a warm kernel", func() bool { return poolID() != "" })
	warm := poolID()
	h, err := p.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h.ID != warm {
		t.Errorf("Create returned %s; want the warm kernel %s", h.ID, warm)
	}
	if got := mainText(run(t, p, h, "import sys\n'numpy' in sys.modules and 'matplotlib.pyplot' in sys.modules")); got != "True" {
		t.Errorf("warm kernel has not pre-imported numpy and pyplot: %q", got)
	}
	waitFor("a refill", func() bool { id := poolID(); return id != "" && id != warm })
	if n := p.Live(); n != 1 {
		t.Errorf("Live() = %d; want 1", n)
	}
	base := p.base
	p.zmu.Lock()
	tree := descendants(p.zyg.cmd.Process.Pid)
	p.zmu.Unlock()
	if len(tree) < 7 { // bubblewrap, its init, the zygote; per sandbox its init and kernel
		t.Errorf("process tree %v; want bubblewrap, its init, the zygote, and init and python for two sandboxes", tree)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := p.Live(); n != 0 {
		t.Errorf("Live() after Close = %d; want 0", n)
	}
	// No process of this provider may survive.
	waitFor("no sandbox processes", func() bool {
		for _, pid := range tree {
			if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil {
				return false
			}
		}
		return true
	})
	if _, err := os.Stat(base); !os.IsNotExist(err) {
		t.Errorf("work dir left behind: %v", err)
	}
	if _, err := p.Create(context.Background(), sandbox.CreateOptions{}); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("Create after Close: %v; want ErrUnavailable", err)
	}
}

// sandboxPID is the host pid of the init of h's sandbox.
func sandboxPID(t testing.TB, p *Provider, h sandbox.Handle) int {
	t.Helper()
	b, err := p.lookup(h)
	if err != nil {
		t.Fatal(err)
	}
	return b.pid
}

func TestCheckWithoutBubblewrap(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := Check(context.Background(), Options{})
	if err == nil || !strings.Contains(err.Error(), "apt-get install bubblewrap") {
		t.Errorf("Check = %v; want the install hint", err)
	}
	if _, err := New(Options{}); err == nil {
		t.Error("New without bwrap succeeded")
	}
}

// descendants returns pid and every process below it.

func TestConcurrentRuns(t *testing.T) {
	shared := sharedProvider(t)
	h := create(t, shared, sandbox.CreateOptions{})
	const n = 6
	type out struct {
		i   int
		res sandbox.Result
		err error
	}
	results := make(chan out, n)
	for i := range n {
		go func() {
			res, err := shared.Run(context.Background(), h, fmt.Sprintf("import time\ntime.sleep(0.01)\n%d * 10", i), sandbox.RunOptions{Timeout: time.Minute})
			results <- out{i: i, res: res, err: err}
		}()
	}
	seen := map[int]bool{}
	for range n {
		o := <-results
		if o.err != nil {
			t.Fatalf("Run %d: %v", o.i, o.err)
		}
		if got, want := mainText(o.res), strconv.Itoa(o.i*10); got != want {
			t.Errorf("Run %d = %q; want %q (outputs crossed between executions)", o.i, got, want)
		}
		if seen[o.res.ExecutionCount] {
			t.Errorf("execution count %d seen twice", o.res.ExecutionCount)
		}
		seen[o.res.ExecutionCount] = true
	}
}
