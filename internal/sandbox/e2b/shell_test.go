package e2b_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
)

type shellOutput struct {
	mu       sync.Mutex
	out, err strings.Builder
	bad      []string
}

func (o *shellOutput) on(s sandbox.Stream, text string) {
	o.mu.Lock()
	defer o.mu.Unlock()
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
	_, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	t.Setenv("CIPROXY_TEST_SECRET", "ciproxy-secret")
	for _, tc := range []struct {
		name, command  string
		timeout        time.Duration
		stdout, stderr string
		exit           int
		timedOut       bool
		notIn          string
	}{
		{name: "stdout and stderr", command: "echo hi; echo err >&2; exit 3", stdout: "hi\n", stderr: "err\n", exit: 3},
		{name: "exit 0", command: "true"},
		{name: "signalled", command: "kill -TERM $$", exit: 128 + 15},
		{name: "timeout keeps partial output", command: "echo partial; sleep 30", timeout: time.Second, stdout: "partial\n", timedOut: true},
		{name: "cwd is /mnt/data", command: "pwd", stdout: "/mnt/data\n"},
		{name: "no proxy environment", command: "env | grep -c CIPROXY", stdout: "0\n", exit: 1},
		{name: "no network", command: "(exec 3<>/dev/tcp/1.1.1.1/53) 2>/dev/null && echo connected || echo offline", stdout: "offline\n"},
		{name: "utf-8 split across reads", command: `printf '\303'; sleep 0.3; printf '\251\n'`, stdout: "é\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o shellOutput
			timeout := tc.timeout
			if timeout == 0 {
				timeout = 30 * time.Second
			}
			res, err := p.Exec(context.Background(), h, tc.command, sandbox.ExecOptions{Timeout: timeout, OnOutput: o.on})
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if res.TimedOut != tc.timedOut || (!tc.timedOut && res.ExitCode != tc.exit) {
				t.Errorf("result %+v; want exit %d, timed out %v", res, tc.exit, tc.timedOut)
			}
			if o.out.String() != tc.stdout || o.err.String() != tc.stderr {
				t.Errorf("stdout %q, stderr %q; want %q, %q", o.out.String(), o.err.String(), tc.stdout, tc.stderr)
			}
			if o.bad != nil {
				t.Errorf("pieces that are not UTF-8: %q", o.bad)
			}
		})
	}
	req, ok := srv.LastRequest("49983 POST /process.Process/Start")
	if !ok {
		t.Fatal("no Start request")
	}
	for k, want := range map[string]string{"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1", "Connect-Timeout-Ms": "30000", "X-Access-Token": h.AccessToken, "E2b-Sandbox-Port": "49983"} {
		if got := req.Header.Get(k); got != want {
			t.Errorf("Start header %s = %q; want %q", k, got, want)
		}
	}
	// Every Start carries a tag of its own (StartRequest's tag), for a kill before its pid is known.
	if len(req.Body) < 5 || !regexp.MustCompile(`^\{"process":\{[^}]*\},"tag":"ciproxy-[0-9a-f]{32}","stdin":false\}$`).Match(req.Body[5:]) {
		t.Errorf("Start body %q; want a unique tag", req.Body)
	}
}

// TestExecCancelBeforeStart cancels a command after its Start reached envd but before the start
// event (with the pid) reached the client: the emulator holds the start event back. The command
// is found by its tag and killed, with what it started.
func TestExecCancelBeforeStart(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	srv.DelayNextStarts(1, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := make(chan e2btest.Process, 1)
	go func() {
		defer cancel()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if ps := srv.Processes(h.ID); len(ps) == 1 {
				// Give the command time to start its child.
				time.Sleep(300 * time.Millisecond)
				seen <- ps[0]
				return
			}
		}
		close(seen)
	}()
	start := time.Now()
	var o shellOutput
	_, err := p.Exec(ctx, h, "sleep 1048 & sleep 30; echo late", sandbox.ExecOptions{Timeout: time.Minute, OnOutput: o.on})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Exec after cancel = %v; want context.Canceled", err)
	}
	proc, ok := <-seen
	if !ok {
		t.Fatal("the command was never listed")
	}
	if !strings.HasPrefix(proc.Tag, "ciproxy-") {
		t.Errorf("the command's tag = %q", proc.Tag)
	}
	if o.out.String() != "" {
		t.Errorf("stdout %q before the start event", o.out.String())
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Exec returned after %v", d)
	}
	// Killed, not left to its own end (30 s later): no longer listed.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ps := srv.Processes(h.ID)
		if len(ps) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still running after the cancel: %+v", ps)
		}
	}
	if _, ok := srv.LastRequest("49983 POST /process.Process/List"); !ok {
		t.Error("no List to find the tag's pid")
	}
	if sig, ok := srv.LastRequest("49983 POST /process.Process/SendSignal"); !ok || string(sig.Body) != fmt.Sprintf(`{"process":{"pid":%d},"signal":"SIGNAL_SIGKILL"}`, proc.PID) {
		t.Errorf("SendSignal %q; want SIGKILL to pid %d", sig.Body, proc.PID)
	}
	var left shellOutput
	if _, err := p.Exec(context.Background(), h, `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$f"; echo; done | grep -c '^sleep 1048 ' || true`, sandbox.ExecOptions{Timeout: 30 * time.Second, OnOutput: left.on}); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(left.out.String()) != "0" {
		t.Errorf("processes left by the cancelled command: %q", left.out.String())
	}
}

func TestExecStreamsAndCancel(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	// The emulator runs a command in the sandbox's kernel, which serves nothing else meanwhile (a
	// file write would wait for the command): live output is seen by cancelling on the first line
	// of a command that would otherwise run for 30 s and print a second one.
	var o shellOutput
	ctx, cancel := context.WithCancel(context.Background())
	_, err := p.Exec(ctx, h, "sleep 1047 & echo started; sleep 30; echo late", sandbox.ExecOptions{Timeout: time.Minute, OnOutput: func(s sandbox.Stream, text string) {
		o.on(s, text)
		if strings.Contains(text, "started") {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Exec after cancel = %v; want context.Canceled", err)
	}
	if o.out.String() != "started\n" {
		t.Errorf("stdout %q; want the first line only", o.out.String())
	}
	// The command was killed with what it started: the next command finds no sleep.
	var left shellOutput
	if _, err := p.Exec(context.Background(), h, `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$f"; echo; done | grep -c '^sleep 1047 ' || true`, sandbox.ExecOptions{Timeout: 30 * time.Second, OnOutput: left.on}); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(left.out.String()) != "0" {
		t.Errorf("processes left by the cancelled command: %q", left.out.String())
	}
}

func TestExecGone(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	if err := p.Delete(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(context.Background(), h, "true", sandbox.ExecOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Exec on a deleted sandbox = %v; want ErrNotFound", err)
	}
	bad := h
	bad.AccessToken = "wrong"
	h2 := create(t, p)
	bad.ID = h2.ID
	if _, err := p.Exec(context.Background(), bad, "true", sandbox.ExecOptions{}); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("Exec with a wrong access token = %v; want ErrUnavailable", err)
	}
}
