// Package e2e runs the real proxy binary, the way a user runs it, against a scripted upstream and
// the doubles of the remote sandbox engines (e2b, Daytona, OpenSandbox) in the test process, and
// drives it with the official OpenAI clients (openai-go here, the openai npm package through
// test/node) and with hostile raw HTTP. The suites that run code do so on every sandbox backend
// (sandboxTools).
//
// TestMain builds ./cmd/proxy once (with the race detector when the tests run under it, so a race
// in the binary fails the test through its exit status). Every test starts its own proxy process
// with its own configuration file and stops it with SIGTERM, checking that it exits 0.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/testutil"
)

// proxyBin is the binary TestMain built.
var proxyBin string

// repoRoot is the module root, two levels above this package.
var repoRoot = func() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}()

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ciproxy-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	if testImage != "" {
		// The tests run the image: only the directory its sandboxes share with the host is needed.
		code := 1
		if err := os.Chmod(dir, 0o755); err == nil {
			imageShare = dir
			code = m.Run()
		} else {
			fmt.Fprintln(os.Stderr, "e2e:", err)
		}
		_ = os.RemoveAll(dir)
		os.Exit(code)
	}
	proxyBin = filepath.Join(dir, "proxy")
	args := []string{"build", "-o", proxyBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	build := exec.Command(gobin, append(args, "./cmd/proxy")...)
	build.Dir = repoRoot
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building the proxy:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// proxy is one running proxy process.
type proxy struct {
	t    *testing.T
	URL  string // http://127.0.0.1:port, without /v1
	Addr string // 127.0.0.1:port
	// ConfigPath is the configuration file it was started with (in a directory of its own, which
	// a container mounts: a rename in it reaches the proxy as on the host).
	ConfigPath string
	// Container is the podman container's name when the proxy is the image ("" otherwise).
	Container string
	cmd       *exec.Cmd
	log       *testutil.LockedBuffer

	stopOnce sync.Once
	exited   chan struct{} // closed when the process has exited
	waitErr  error
}

// startProxy writes cfg to a temporary file and starts the binary on a free port with env added
// to the test's environment. It returns once /readyz answers 200. The proxy is stopped (SIGTERM,
// exit status 0 required) by t.Cleanup unless the test stops it first.
func startProxy(t *testing.T, cfg string, env ...string) *proxy {
	t.Helper()
	return startProxyArgs(t, cfg, nil, env...)
}

// startProxyArgs is startProxy with more command-line arguments.
func startProxyArgs(t *testing.T, cfg string, args []string, env ...string) *proxy {
	t.Helper()
	return startProxyData(t, cfg, filepath.Join(t.TempDir(), "data"), args, env...)
}

// startProxyData is startProxyArgs with the data directory given, to start a proxy again on the
// data of an earlier one.
func startProxyData(t *testing.T, cfg, dataDir string, args []string, env ...string) *proxy {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var cmd *exec.Cmd
	var container string
	if testImage != "" {
		cmd, container = imageCommand(t, path, dataDir, args, env)
	} else {
		cmd = exec.Command(proxyBin, append([]string{"--config", path, "--host", "127.0.0.1", "--port", "0", "--data-dir", dataDir}, args...)...)
		cmd.Env = append(os.Environ(), env...)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	p := &proxy{t: t, cmd: cmd, log: &testutil.LockedBuffer{}, exited: make(chan struct{}), ConfigPath: path, Container: container}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the proxy: %v", err)
	}

	addr := make(chan string, 1)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		found := false
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = p.log.Write(append(line, '\n'))
			if found {
				continue
			}
			var entry struct{ Msg, Addr string }
			if json.Unmarshal(line, &entry) == nil && entry.Msg == "listening" && entry.Addr != "" {
				found = true
				addr <- entry.Addr
			}
		}
		_, _ = io.Copy(p.log, stderr)
	}()
	go func() {
		<-copied // Wait closes the pipe: read everything first
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.Stop)

	select {
	case a := <-addr:
		p.Addr = a
		p.URL = "http://" + a
	case <-p.exited:
		t.Fatalf("the proxy exited before listening (%v); its log:\n%s", p.waitErr, p.log)
	case <-time.After(startWait):
		t.Fatalf("the proxy did not log its address within %v; its log:\n%s", startWait, p.log)
	}

	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(p.URL + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz did not answer 200 within 20s (last: %v); log:\n%s", err, p.log)
		}
		select {
		case <-p.exited:
			t.Fatalf("the proxy exited (%v); its log:\n%s", p.waitErr, p.log)
		case <-time.After(20 * time.Millisecond): // poll interval
		}
	}
}

// startWait bounds a proxy's start until it listens, its check of the local sandbox included
// (the fork server's imports): 30 s, or CIPROXY_TEST_START_TIMEOUT, the local sandbox tests' own
// bound on that start, on an emulated machine where it takes a minute (make test-cgroup2's guest).
var startWait = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("CIPROXY_TEST_START_TIMEOUT")); err == nil && d > 0 {
		return d
	}
	return 30 * time.Second
}()

// Stop sends SIGTERM and requires exit status 0 within 60s, a log without a data race or a
// panic, and the final "stopped" line. It may be called more than once.
func (p *proxy) Stop() {
	p.t.Helper()
	p.stopOnce.Do(func() {
		select {
		case <-p.exited:
			p.t.Errorf("the proxy exited before it was stopped (%v); log:\n%s", p.waitErr, p.log)
			return
		default:
		}
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			p.t.Errorf("SIGTERM: %v", err)
		}
		select {
		case <-p.exited:
		case <-time.After(60 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
			p.t.Errorf("the proxy did not exit within 60s of SIGTERM; log:\n%s", p.log)
			return
		}
		log := p.log.String()
		if p.waitErr != nil {
			p.t.Errorf("the proxy exited with %v after SIGTERM, want status 0; log:\n%s", p.waitErr, log)
		}
		for _, bad := range []string{"DATA RACE", "panic", "goroutine "} {
			if strings.Contains(log, bad) {
				p.t.Errorf("the proxy's log holds %q:\n%s", bad, log)
				break
			}
		}
		if !strings.Contains(log, `"msg":"stopped"`) {
			p.t.Errorf("the proxy's log lacks the final \"stopped\" line:\n%s", log)
		}
	})
}

// Log returns the proxy's stderr so far.
func (p *proxy) Log() string { return p.log.String() }

// Alive reports whether the process still runs and /healthz answers 200.
func (p *proxy) Alive(t *testing.T) bool {
	t.Helper()
	select {
	case <-p.exited:
		t.Errorf("the proxy has exited (%v); log:\n%s", p.waitErr, p.log)
		return false
	default:
	}
	resp, err := http.Get(p.URL + "/healthz")
	if err != nil {
		t.Errorf("/healthz: %v", err)
		return false
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: status %d", resp.StatusCode)
		return false
	}
	return true
}

// ctx returns a context that ends with the test or after d.
func ctx(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return c
}

// rawResponse is a response read in full.
type rawResponse struct {
	Status int
	Header http.Header
	Body   []byte
}

// do sends one request with the given body and headers ("Key: value") and reads the answer.
func do(t *testing.T, method, url string, body []byte, headers ...string) rawResponse {
	t.Helper()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx(t, 60*time.Second), method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		if strings.EqualFold(k, "Host") {
			req.Host = strings.TrimSpace(v)
			continue
		}
		req.Header.Set(k, strings.TrimSpace(v))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	return rawResponse{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// apiError decodes an OpenAI-shaped error body, failing the test when the body is not one.
func apiError(t *testing.T, body []byte) (typ, code, message string) {
	t.Helper()
	var e struct {
		Error *struct {
			Message *string `json:"message"`
			Type    *string `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || e.Error.Message == nil || e.Error.Type == nil {
		t.Errorf("not an OpenAI-shaped error: %.300s", body)
		return "", "", ""
	}
	if e.Error.Code != nil {
		code = *e.Error.Code
	}
	return *e.Error.Type, code, *e.Error.Message
}
