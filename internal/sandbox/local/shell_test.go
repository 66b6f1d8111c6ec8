package local

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// output collects what Exec streams, per stream, checking that every piece is valid UTF-8.
type output struct {
	mu     sync.Mutex
	out    strings.Builder
	err    strings.Builder
	pieces int
	bad    []string
}

func (o *output) on(s sandbox.Stream, text string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.pieces++
	if !utf8.ValidString(text) {
		o.bad = append(o.bad, text)
	}
	if s == sandbox.Stderr {
		o.err.WriteString(text)
	} else {
		o.out.WriteString(text)
	}
}

func TestExec(t *testing.T) {
	p := sharedProvider(t)
	h := create(t, p, sandbox.CreateOptions{})
	t.Setenv("CIPROXY_TEST_SECRET", "ciproxy-secret-"+newID())
	for _, tc := range []struct {
		name, command        string
		timeout              time.Duration
		stdout, stderr       string
		exit                 int
		timedOut             bool
		stdoutHas, stdoutNot []string
	}{
		{name: "stdout and stderr", command: "echo hi; echo err >&2; exit 3", stdout: "hi\n", stderr: "err\n", exit: 3},
		{name: "exit 0", command: "true", exit: 0},
		{name: "exit 255", command: "exit 255", exit: 255},
		{name: "signalled", command: "kill -TERM $$", exit: 128 + 15},
		{name: "killed", command: "kill -KILL $$", exit: 128 + 9},
		{name: "timeout keeps partial output", command: "echo partial; sleep 30; echo never", timeout: 500 * time.Millisecond, stdout: "partial\n", timedOut: true},
		{name: "cwd is /mnt/data", command: "pwd", stdout: dataDir + "\n"},
		{name: "stdin is empty", command: "cat; echo done", stdout: "done\n"},
		{name: "no tty", command: "test -t 0 || test -t 1 || echo none", stdout: "none\n"},
		{name: "bash", command: `echo "${BASH_VERSION:+bash}"`, stdout: "bash\n"},
		{name: "no proxy environment", command: "env", stdoutHas: []string{"PATH=", "HOME=" + dataDir, "LANG=C.UTF-8"}, stdoutNot: []string{"CIPROXY", "ciproxy-secret"}},
		{name: "no network", command: "(exec 3<>/dev/tcp/1.1.1.1/53) 2>/dev/null && echo connected || echo offline", stdout: "offline\n"},
		{name: "utf-8 split across reads", command: `printf '\303'; sleep 0.3; printf '\251\n'`, stdout: "é\n"},
		{name: "invalid utf-8", command: `printf 'a\377b\n'`, stdout: "a\uFFFDb\n"},
		{name: "same uid as the kernel", command: "id -u", stdout: "1000\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o output
			timeout := tc.timeout
			if timeout == 0 {
				timeout = 30 * time.Second
			}
			res, err := p.Exec(context.Background(), h, tc.command, sandbox.ExecOptions{Timeout: timeout, OnOutput: o.on})
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if res.TimedOut != tc.timedOut || (!tc.timedOut && res.ExitCode != tc.exit) {
				t.Errorf("result %+v; want exit %d, timed out %v (stderr %q)", res, tc.exit, tc.timedOut, o.err.String())
			}
			if tc.stdoutHas == nil && o.out.String() != tc.stdout {
				t.Errorf("stdout %q; want %q", o.out.String(), tc.stdout)
			}
			if tc.stdoutHas == nil && o.err.String() != tc.stderr {
				t.Errorf("stderr %q; want %q", o.err.String(), tc.stderr)
			}
			for _, s := range tc.stdoutHas {
				if !strings.Contains(o.out.String(), s) {
					t.Errorf("stdout %q lacks %q", o.out.String(), s)
				}
			}
			for _, s := range tc.stdoutNot {
				if strings.Contains(o.out.String(), s) {
					t.Errorf("stdout %q holds %q", o.out.String(), s)
				}
			}
			if o.bad != nil {
				t.Errorf("pieces that are not UTF-8: %q", o.bad)
			}
		})
	}
}

// TestExecStreams checks that output reaches OnOutput while the command still runs: the
// command waits for a file that the test creates only once it has seen the first line.
func TestExecStreams(t *testing.T) {
	p := sharedProvider(t)
	h := create(t, p, sandbox.CreateOptions{})
	var o output
	sawA := false
	res, err := p.Exec(context.Background(), h, "echo a; while [ ! -e gate ]; do sleep 0.02; done; echo b", sandbox.ExecOptions{
		Timeout: 60 * time.Second,
		OnOutput: func(s sandbox.Stream, text string) {
			o.on(s, text)
			if !sawA && strings.Contains(o.out.String(), "a\n") {
				sawA = true
				if err := p.WriteFile(context.Background(), h, "gate", strings.NewReader(""), 1); err != nil {
					t.Errorf("WriteFile: %v", err)
				}
			}
		},
	})
	if err != nil || res.ExitCode != 0 || res.TimedOut {
		t.Fatalf("Exec = %+v, %v", res, err)
	}
	if !sawA || o.out.String() != "a\nb\n" {
		t.Errorf("stdout %q (a seen while running: %v)", o.out.String(), sawA)
	}
}

// TestExecSharesTheContainer checks that a command sees and leaves the kernel's files and
// leaves its Python state alone.
func TestExecSharesTheContainer(t *testing.T) {
	p := sharedProvider(t)
	h := create(t, p, sandbox.CreateOptions{})
	run(t, p, h, "import os\nx = 41\nos.chdir('/tmp')\nopen('/mnt/data/from_py.txt', 'w').write('py')")
	var o output
	res, err := p.Exec(context.Background(), h, "cat from_py.txt; echo -n shell > from_sh.txt; x=0", sandbox.ExecOptions{Timeout: 30 * time.Second, OnOutput: o.on})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec = %+v, %v", res, err)
	}
	if o.out.String() != "py" {
		t.Errorf("the command read %q; want py", o.out.String())
	}
	if got := mainText(run(t, p, h, "x + 1, os.getcwd(), open('/mnt/data/from_sh.txt').read()")); got != "(42, '/tmp', 'shell')" {
		t.Errorf("the kernel after the command: %s", got)
	}
	var buf bytes.Buffer
	if _, err := p.ReadFile(context.Background(), h, "from_sh.txt", &buf, 1<<10); err != nil || buf.String() != "shell" {
		t.Errorf("ReadFile = %q, %v", buf.String(), err)
	}
}

// sandboxProcesses returns the command lines of the sandbox's processes.
func sandboxProcesses(t *testing.T, p *Provider, h sandbox.Handle) []string {
	t.Helper()
	var cmds []string
	for _, pid := range descendants(sandboxPID(t, p, h)) {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err == nil {
			cmds = append(cmds, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return cmds
}

// TestExecLeavesNothing checks that what a command starts is gone when Exec returns, however it
// detached, after a normal exit, a timeout and a cancel.
func TestExecLeavesNothing(t *testing.T) {
	p := sharedProvider(t)
	h := create(t, p, sandbox.CreateOptions{})
	const spawn = "sleep 1047 & setsid sleep 1048 & (sleep 1049 &) ; nohup sleep 1050 >/dev/null 2>&1 & echo started; "
	for _, tc := range []struct {
		name    string
		command string
		timeout time.Duration
		cancel  bool
	}{
		{name: "exit", command: spawn + "exit 0"},
		{name: "timeout", command: spawn + "sleep 30", timeout: time.Second},
		{name: "cancel", command: spawn + "sleep 30", cancel: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			timeout := tc.timeout
			if timeout == 0 {
				timeout = 30 * time.Second
			}
			res, err := p.Exec(ctx, h, tc.command, sandbox.ExecOptions{Timeout: timeout, OnOutput: func(s sandbox.Stream, text string) {
				if tc.cancel && strings.Contains(text, "started") {
					cancel()
				}
			}})
			switch {
			case tc.cancel && !errors.Is(err, context.Canceled):
				t.Errorf("Exec after cancel = %+v, %v; want context.Canceled", res, err)
			case !tc.cancel && err != nil:
				t.Errorf("Exec: %v", err)
			case tc.timeout > 0 && !res.TimedOut:
				t.Errorf("Exec = %+v; want TimedOut", res)
			}
			for _, cmd := range sandboxProcesses(t, p, h) {
				if strings.Contains(cmd, "sleep") {
					t.Errorf("left running: %q", cmd)
				}
			}
		})
	}
	// The sandbox still serves.
	if got := mainText(run(t, p, h, "1 + 1")); got != "2" {
		t.Errorf("1 + 1 = %s after the commands", got)
	}
}

// TestExecHugeOutput checks that output is streamed through, not held: 50 MB to stdout does
// not grow the proxy's heap by anything near that.
func TestExecHugeOutput(t *testing.T) {
	p := sharedProvider(t)
	h := create(t, p, sandbox.CreateOptions{})
	const size = 50 << 20
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapInuse, ms.HeapInuse
	var n, next int
	res, err := p.Exec(context.Background(), h, "head -c 52428800 /dev/zero | tr '\\0' x", sandbox.ExecOptions{
		Timeout: 120 * time.Second,
		OnOutput: func(s sandbox.Stream, text string) {
			n += len(text)
			if n >= next {
				next += 2 << 20
				runtime.ReadMemStats(&ms)
				peak = max(peak, ms.HeapInuse)
			}
		},
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec = %+v, %v", res, err)
	}
	if n != size {
		t.Errorf("streamed %d bytes; want %d", n, size)
	}
	if grew := int64(peak) - int64(base); grew > 16<<20 {
		t.Errorf("the heap grew by %d MiB while streaming 50 MiB", grew>>20)
	}
}

func TestExecGone(t *testing.T) {
	p := sharedProvider(t)
	h, err := p.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(context.Background(), h, "true", sandbox.ExecOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Exec on a deleted sandbox = %v; want ErrNotFound", err)
	}
	if _, err := p.Exec(context.Background(), sandbox.Handle{Backend: Backend, ID: "nosuch"}, "true", sandbox.ExecOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Exec on an unknown sandbox = %v; want ErrNotFound", err)
	}
}

// TestExecAfterTheCodeKilledItsServer checks that a kernel whose shell server the code killed
// starts another one for the next command.
func TestExecAfterTheCodeKilledItsServer(t *testing.T) {
	p := sharedProvider(t)
	h := create(t, p, sandbox.CreateOptions{})
	run(t, p, h, `import glob, os, signal
for f in glob.glob('/proc/self/task/*/children'):
    for pid in open(f).read().split():
        os.kill(int(pid), signal.SIGKILL)`)
	var o output
	res, err := p.Exec(context.Background(), h, "echo again", sandbox.ExecOptions{Timeout: 30 * time.Second, OnOutput: o.on})
	if err != nil || res.ExitCode != 0 || o.out.String() != "again\n" {
		t.Errorf("Exec = %+v, %v, %q", res, err, o.out.String())
	}
}

// TestExecCancelAnyTime cancels commands at various points of their start and checks that each
// next command gets its own output and status, never a stale answer of a cancelled one.
func TestExecCancelAnyTime(t *testing.T) {
	p := sharedProvider(t)
	h := create(t, p, sandbox.CreateOptions{})
	for i := range 12 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i)*time.Millisecond)
		_, err := p.Exec(ctx, h, "echo x; sleep 5; exit 4", sandbox.ExecOptions{Timeout: 30 * time.Second})
		cancel()
		if err == nil {
			t.Fatalf("cancel after %d ms: no error", i)
		}
		var o output
		res, err := p.Exec(context.Background(), h, "echo ok "+strconv.Itoa(i), sandbox.ExecOptions{Timeout: 30 * time.Second, OnOutput: o.on})
		if want := "ok " + strconv.Itoa(i) + "\n"; err != nil || res.ExitCode != 0 || o.out.String() != want {
			t.Fatalf("after a cancel at %d ms: Exec = %+v, %v, %q; want %q", i, res, err, o.out.String(), want)
		}
	}
}

// TestExecHostRuntime: a runtime the operator binds with host_paths is on the commands' PATH,
// and read-only.
func TestExecHostRuntime(t *testing.T) {
	rt := hostRuntime(t)
	p := newTestProviderWith(t, Options{PoolSize: -1, HostPaths: []string{rt}}, knobs{})
	h := create(t, p, sandbox.CreateOptions{})
	var o output
	res, err := p.Exec(context.Background(), h, "hello-runtime; touch "+rt+"/bin/x 2>&1 | grep -c 'Read-only file system'", sandbox.ExecOptions{Timeout: 30 * time.Second, OnOutput: o.on})
	if err != nil || res.ExitCode != 0 || o.out.String() != "hello from the runtime\n1\n" {
		t.Errorf("Exec = %+v, %v; stdout %q stderr %q; want the runtime's greeting and a read-only bind", res, err, o.out.String(), o.err.String())
	}
}
