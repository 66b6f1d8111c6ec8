package kernel_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox/kernel"
)

// daemonDir writes kernel.py and kerneld.py into a directory, as the sandbox image has them, and
// returns kerneld.py's path and the environment naming a socket of the test's own.
func daemonDir(t *testing.T) (string, []string) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	dir := t.TempDir()
	for name, src := range map[string][]byte{"kernel.py": kernel.Source(), "kerneld.py": kernel.DaemonSource()} {
		if err := os.WriteFile(filepath.Join(dir, name), src, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(dir, "kd.sock")
	t.Cleanup(func() { stopDaemon(t, sock) })
	return filepath.Join(dir, "kerneld.py"), append(os.Environ(), "CIPROXY_KERNELD_SOCKET="+sock)
}

// stopDaemon ends the daemon behind sock: a cell that makes its kernel exit, which ends it.
func stopDaemon(t *testing.T, sock string) {
	if _, err := os.Stat(sock); err != nil {
		return
	}
	cmd := exec.Command("python3", "-S", filepath.Join(filepath.Dir(sock), "kerneld.py"), "run")
	cmd.Env = append(os.Environ(), "CIPROXY_KERNELD_SOCKET="+sock)
	cmd.Stdin = strings.NewReader(`{"code": "import os; os._exit(0)"}`)
	_ = cmd.Run()
}

func run(t *testing.T, script string, env []string, code string) ([]map[string]any, int) {
	t.Helper()
	cmd := exec.Command("python3", "-S", script, "run")
	cmd.Env = env
	req, _ := json.Marshal(map[string]string{"code": code})
	cmd.Stdin = bytes.NewReader(req)
	out, err := cmd.Output()
	rc := 0
	if ee, ok := err.(*exec.ExitError); ok {
		rc = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var msgs []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		var m map[string]any
		if len(l) > 0 {
			if err := json.Unmarshal(l, &m); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			msgs = append(msgs, m)
		}
	}
	return msgs, rc
}

func types(msgs []map[string]any) string {
	var ts []string
	for _, m := range msgs {
		ts = append(ts, m["type"].(string))
	}
	return strings.Join(ts, ",")
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestDaemonKeepsStateAcrossClients(t *testing.T) {
	script, env := daemonDir(t)
	cmd := exec.Command("python3", "-S", script, "start")
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	var sums struct{ Kernel, Daemon string }
	if err := json.Unmarshal(out, &sums); err != nil || sums.Kernel != sum(kernel.Source()) || sums.Daemon != sum(kernel.DaemonSource()) {
		t.Fatalf("start printed %q (%v)", out, err)
	}
	if msgs, rc := run(t, script, env, "x = 41\nprint('hi')"); rc != 0 || types(msgs) != "number_of_executions,stdout,end_of_execution" {
		t.Fatalf("first cell: rc %d, %v", rc, msgs)
	}
	msgs, rc := run(t, script, env, "x + 1")
	if rc != 0 || types(msgs) != "number_of_executions,result,end_of_execution" || msgs[1]["text"] != "42" || msgs[0]["execution_count"] != 2.0 {
		t.Fatalf("second cell: rc %d, %v", rc, msgs)
	}
	msgs, _ = run(t, script, env, "1/0")
	if types(msgs) != "number_of_executions,error,end_of_execution" || msgs[1]["name"] != "ZeroDivisionError" {
		t.Fatalf("traceback cell: %v", msgs)
	}
}

func TestDaemonInterrupts(t *testing.T) {
	script, env := daemonDir(t)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := exec.Command("python3", "-S", script, "run")
			cmd.Env = env
			cmd.Stdin = strings.NewReader(`{"code": "import time\nprint('go', flush=True)\ntime.sleep(60)"}`)
			stdout, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(stdout)
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("no output before the cut: %v", err)
				}
				if strings.Contains(line, `"go\n"`) {
					break
				}
			}
			start := time.Now()
			_ = cmd.Process.Signal(sig)
			rest, _ := bufio.NewReader(br).ReadString(0)
			_ = cmd.Wait()
			if sig == syscall.SIGINT && !strings.Contains(rest, "KeyboardInterrupt") {
				t.Errorf("after SIGINT: %q", rest)
			}
			// Either way the kernel is free again at once, with its state.
			msgs, rc := run(t, script, env, "'free'")
			if rc != 0 || types(msgs) != "number_of_executions,result,end_of_execution" || time.Since(start) > 20*time.Second {
				t.Errorf("next cell after %v: rc %d, %v, %s", sig, rc, msgs, time.Since(start))
			}
		})
	}
}

func TestDaemonRestartsAfterKernelExit(t *testing.T) {
	script, env := daemonDir(t)
	run(t, script, env, "x = 1")
	if msgs, rc := run(t, script, env, "import os; os._exit(3)"); rc != 1 || strings.Contains(types(msgs), "end_of_execution") {
		t.Fatalf("exit cell: rc %d, %v", rc, msgs)
	}
	msgs, rc := run(t, script, env, "x")
	if rc != 0 || types(msgs) != "number_of_executions,stderr,error,end_of_execution" || msgs[2]["name"] != "NameError" ||
		!strings.Contains(msgs[1]["text"].(string), "kernel had ended") {
		t.Fatalf("after the kernel's exit: rc %d, %v", rc, msgs)
	}
	if msgs, _ := run(t, script, env, "1"); types(msgs) != "number_of_executions,result,end_of_execution" {
		t.Errorf("the cell after: %v", msgs)
	}
}

func TestRelayAndRunShareTheKernel(t *testing.T) {
	script, env := daemonDir(t)
	relay := exec.Command("python3", "-S", script, "relay")
	relay.Env = env
	stdin, _ := relay.StdinPipe()
	stdout, _ := relay.StdoutPipe()
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = relay.Wait() }()
	br := bufio.NewReader(stdout)
	cell := func(code string) []string {
		req, _ := json.Marshal(map[string]string{"code": code})
		if _, err := stdin.Write(append(req, '\n')); err != nil {
			t.Fatal(err)
		}
		var lines []string
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("relay output after %q: %v", lines, err)
			}
			lines = append(lines, strings.TrimSpace(line))
			if strings.Contains(line, "end_of_execution") {
				return lines
			}
		}
	}
	cell("v = 10")
	if got := cell("v * 2"); len(got) != 3 || !strings.Contains(got[1], `"text": "20"`) {
		t.Fatalf("the relay's second cell: %q", got)
	}
	// Another replica's client, while the relay stays connected.
	if msgs, rc := run(t, script, env, "v + 1"); rc != 0 || types(msgs) != "number_of_executions,result,end_of_execution" || msgs[1]["text"] != "11" {
		t.Fatalf("a run beside the relay: rc %d, %v", rc, msgs)
	}
	if got := cell("v"); len(got) != 3 || !strings.Contains(got[0], `"execution_count": 4`) {
		t.Fatalf("the relay's cell after the run: %q", got)
	}
	// An interrupt through the relay ends its cell, and the relay goes on.
	req, _ := json.Marshal(map[string]string{"code": "import time\nprint('go', flush=True)\ntime.sleep(60)"})
	stdin.Write(append(req, '\n'))
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"go\n"`) {
			break
		}
	}
	_ = relay.Process.Signal(syscall.SIGINT)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, "end_of_execution") {
			break
		}
	}
	if got := cell("'after'"); len(got) != 3 || !strings.Contains(got[1], "after") {
		t.Fatalf("the relay after an interrupt: %q", got)
	}
}
