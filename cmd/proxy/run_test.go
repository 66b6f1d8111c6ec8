package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

const testKey = "sk-master-test"

// upstreamServer answers every request with the model it was asked for; a request whose body
// contains "hold" waits until release is closed.
type upstreamServer struct {
	*httptest.Server
	held    chan struct{} // receives one value per held request that arrived
	release chan struct{}
}

func newUpstreamServer(t *testing.T) *upstreamServer {
	t.Helper()
	u := &upstreamServer{held: make(chan struct{}, 16), release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte("hold")) {
			u.held <- struct{}{}
			select {
			case <-u.release:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"chat.completion","path":%q,"body":%q}`, r.URL.Path, body)
	}))
	t.Cleanup(u.Close)
	return u
}

// writeConfig writes the configuration atomically (temp file + rename, as editors and
// Kubernetes do) and returns its path.
func writeConfig(t *testing.T, dir, content string) string {
	t.Helper()
	path := filepath.Join(dir, "config.yaml")
	tmp, err := os.CreateTemp(dir, ".config-*.tmp")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmp.WriteString(content); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		t.Fatal(err)
	}
	return path
}

func configYAML(upstreamURL string, models ...string) string {
	var b strings.Builder
	b.WriteString("model_list:\n")
	for _, m := range models {
		fmt.Fprintf(&b, "  - model_name: %s\n    litellm_params: {model: openai/%s-up, api_base: %s/v1, api_key: sk-upstream}\n", m, m, upstreamURL)
	}
	b.WriteString(`sandbox_tools:
  - sandbox_tool_name: local
    litellm_params: {sandbox_provider: local, pool_size: 0}
general_settings:
  master_key: ` + testKey + `
  shutdown_grace: 20s
`)
	return b.String()
}

// runIn is run with the data directory dir. Every test runs the proxy through it (runOwnDir,
// start, startIn), so that none opens the host's default directory (/var/lib/ciproxy,
// ~/.cache/ciproxy), whose lock another process may hold: --data-dir comes first, and a test's own
// arguments may not name another.
func runIn(t *testing.T, ctx context.Context, dir string, args []string, stdout, stderr io.Writer, listening func(net.Addr)) int {
	t.Helper()
	if dir == "" || slices.Contains(args, "--data-dir") {
		t.Errorf("runIn(%q, %v): the data directory is given once, as dir", dir, args) // not Fatal: start calls it from a goroutine
		return 2
	}
	return run(ctx, append([]string{"--data-dir", dir}, args...), stdout, stderr, listening)
}

// runOwnDir is runIn with a data directory of the test's own.
func runOwnDir(t *testing.T, ctx context.Context, args []string, stdout, stderr io.Writer, listening func(net.Addr)) int {
	t.Helper()
	return runIn(t, ctx, t.TempDir(), args, stdout, stderr, listening)
}

// running is a proxy started through run().
type running struct {
	url    string
	stderr *testutil.LockedBuffer
	cancel context.CancelFunc
	exit   chan int
}

// start starts the proxy with a data directory of the test's own.
func start(t *testing.T, args ...string) *running {
	t.Helper()
	return startIn(t, t.TempDir(), args...)
}

// startIn starts the proxy on the data directory dir (one process per directory).
func startIn(t *testing.T, dataDir string, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{stderr: &testutil.LockedBuffer{}, cancel: cancel, exit: make(chan int, 1)}
	addr := make(chan net.Addr, 1)
	go func() {
		r.exit <- runIn(t, ctx, dataDir, append([]string{"--host", "127.0.0.1", "--port", "0"}, args...), io.Discard, r.stderr, func(a net.Addr) { addr <- a })
	}()
	select {
	case a := <-addr:
		r.url = "http://" + a.String()
	case code := <-r.exit:
		t.Fatalf("run exited with %d before listening: %s", code, r.stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("run did not start listening: %s", r.stderr)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.exit:
		case <-time.After(30 * time.Second):
			t.Errorf("run did not return after cancel")
		}
	})
	return r
}

// post sends a chat completion for model and returns the status and body.
func (r *running) post(model, extra string) (int, string, error) {
	req, _ := http.NewRequest(http.MethodPost, r.url+"/v1/chat/completions", strings.NewReader(`{"model":"`+model+`","messages":[]`+extra+`}`))
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func (r *running) metrics(t *testing.T) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, r.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestHotReload(t *testing.T) {
	up := newUpstreamServer(t)
	dir := t.TempDir()
	path := writeConfig(t, dir, configYAML(up.URL, "gpt-a"))
	p := start(t, "--config", path)

	if status, body, err := p.post("gpt-a", ""); err != nil || status != http.StatusOK || !strings.Contains(body, "gpt-a-up") {
		t.Fatalf("gpt-a before reload = %d %s %v", status, body, err)
	}
	if status, body, _ := p.post("gpt-b", ""); status != http.StatusBadRequest || !strings.Contains(body, "model_not_found") {
		t.Fatalf("gpt-b before reload = %d %s; want 400 model_not_found", status, body)
	}

	// A request in flight across the reload, and a steady stream of requests during it.
	held := make(chan error, 1)
	go func() {
		status, body, err := p.post("gpt-a", `,"note":"hold"`)
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("held request = %d %s", status, body)
		}
		held <- err
	}()
	<-up.held
	stop := make(chan struct{})
	var steadyFailures atomic.Int64
	var steady sync.WaitGroup
	steady.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if status, _, err := p.post("gpt-a", ""); err != nil || status != http.StatusOK {
				steadyFailures.Add(1)
			}
		}
	})

	writeConfig(t, dir, configYAML(up.URL, "gpt-a", "gpt-b"))
	testutil.Eventually(t, "gpt-b is served", func() bool {
		status, _, _ := p.post("gpt-b", "")
		return status == http.StatusOK
	})
	if status, body, _ := p.post("gpt-b", ""); !strings.Contains(body, "gpt-b-up") {
		t.Errorf("gpt-b after reload = %d %s; want its upstream model", status, body)
	}
	// The new model list and its sandbox tools are published together; the count follows.
	testutil.Eventually(t, "the reload is counted as a success", func() bool {
		return strings.Contains(p.metrics(t), `ciproxy_config_reloads_total{result="success"} 1`)
	})

	// A bad edit is rejected: both models keep working.
	writeConfig(t, dir, configYAML(up.URL, "gpt-a")+"unknown_section: {}\n")
	testutil.Eventually(t, "the bad edit is counted", func() bool {
		return strings.Contains(p.metrics(t), `ciproxy_config_reloads_total{result="failure"} 1`)
	})
	for _, m := range []string{"gpt-a", "gpt-b"} {
		if status, body, err := p.post(m, ""); err != nil || status != http.StatusOK {
			t.Errorf("%s after a bad edit = %d %s %v; want the last good config", m, status, body, err)
		}
	}
	if !strings.Contains(p.stderr.String(), "unknown_section") {
		t.Errorf("the log does not say why the edit was rejected:\n%s", p.stderr)
	}

	// An edit whose sandbox tool cannot be provisioned is rejected whole: its new model is not served.
	broken := strings.Replace(configYAML(up.URL, "gpt-a", "gpt-c"), "pool_size: 0", "pool_size: 0, python: /nonexistent/python3", 1)
	writeConfig(t, dir, broken)
	testutil.Eventually(t, "the edit that cannot be provisioned is counted", func() bool {
		return strings.Contains(p.metrics(t), `ciproxy_config_reloads_total{result="failure"} 2`)
	})
	if status, body, _ := p.post("gpt-c", ""); status != http.StatusBadRequest || !strings.Contains(body, "model_not_found") {
		t.Errorf("gpt-c of the rejected edit = %d %s; want 400 model_not_found", status, body)
	}
	for _, m := range []string{"gpt-a", "gpt-b"} {
		if status, body, err := p.post(m, ""); err != nil || status != http.StatusOK {
			t.Errorf("%s after an edit that cannot be provisioned = %d %s %v; want the last good config", m, status, body, err)
		}
	}
	if n := strings.Count(p.stderr.String(), "config reload failed"); n != 2 {
		t.Errorf("%d reload failures logged; want one line for each of the 2:\n%s", n, p.stderr)
	}
	if n := strings.Count(p.stderr.String(), `"config reloaded"`); n != 1 {
		t.Errorf("%d successful reloads logged; want 1:\n%s", n, p.stderr)
	}

	close(stop)
	steady.Wait()
	close(up.release)
	if err := <-held; err != nil {
		t.Errorf("request in flight during reloads: %v", err)
	}
	if n := steadyFailures.Load(); n != 0 {
		t.Errorf("%d requests failed during reloads", n)
	}
	if strings.Contains(p.stderr.String(), testKey) || strings.Contains(p.stderr.String(), "sk-upstream") {
		t.Errorf("a key reached the log")
	}
}

func TestGracefulShutdown(t *testing.T) {
	up := newUpstreamServer(t)
	path := writeConfig(t, t.TempDir(), configYAML(up.URL, "gpt-a"))
	p := start(t, "--config", path)

	type result struct {
		status int
		body   string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		status, body, err := p.post("gpt-a", `,"note":"hold"`)
		done <- result{status, body, err}
	}()
	<-up.held
	p.cancel() // what SIGTERM does in main

	// New connections are refused once the listener is closed.
	testutil.Eventually(t, "the listener is closed", func() bool {
		c, err := net.Dial("tcp", strings.TrimPrefix(p.url, "http://"))
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case code := <-p.exit:
		t.Fatalf("run returned %d with a request in flight", code)
	default:
	}
	close(up.release)
	res := <-done
	if res.err != nil || res.status != http.StatusOK || !strings.Contains(res.body, "gpt-a-up") {
		t.Errorf("in-flight request = %d %q %v; want it completed", res.status, res.body, res.err)
	}
	select {
	case code := <-p.exit:
		if code != 0 {
			t.Errorf("run = %d; want 0 after a graceful shutdown", code)
		}
		p.exit <- code // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after the last request")
	}
}

func TestCommandLine(t *testing.T) {
	dir := t.TempDir()
	good := writeConfig(t, dir, `model_list:
  - model_name: m
    litellm_params: {model: openai/m, api_key: sk-x}
`)
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("model_list:\n  - model_name: m\n    litellm_params: {model: openai/m, colour: blue}\ngeneral_settings:\n  shutdown_grace: soon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badSandbox := filepath.Join(dir, "bad-sandbox.yaml")
	if err := os.WriteFile(badSandbox, []byte("sandbox_tools:\n  - sandbox_tool_name: local\n    litellm_params:\n      sandbox_provider: local\n      pool_size: two\n      api_key: k\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	litellm := filepath.Join(dir, "litellm.yaml")
	if err := os.WriteFile(litellm, []byte(`model_list:
  - model_name: claude
    litellm_params: {model: bedrock/anthropic.claude-3, aws_region_name: us-east-1}
  - model_name: gpt-4o
    litellm_params: {model: gpt-4o, api_key: sk-x, rpm: 10}
router_settings:
  routing_strategy: least-busy
`), 0o600); err != nil {
		t.Fatal(err)
	}
	litellmTypo := filepath.Join(dir, "litellm-typo.yaml")
	if err := os.WriteFile(litellmTypo, []byte("model_list:\n  - model_name: m\n    litellm_params: {model: openai/m, rpm: 1}\nrouter_settings:\n  routing_stratgy: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Replicas sharing Redis without container_secret agree on one through it: --check accepts it.
	redisNoSecret := filepath.Join(dir, "redis-no-secret.yaml")
	if err := os.WriteFile(redisNoSecret, []byte("model_list:\n  - model_name: m\n    litellm_params: {model: openai/m, api_key: sk-x}\n"+
		"router_settings:\n  redis_host: 127.0.0.1\n  redis_port: 6379\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	brokenSandbox := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(brokenSandbox, []byte("sandbox_tools:\n  - sandbox_tool_name: local\n    litellm_params: {sandbox_provider: local, python: /nonexistent/python3, pool_size: 0}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout []string
		wantStderr []string
	}{
		{"version", []string{"--version"}, 0, []string{"ciproxy dev"}, nil},
		{"check passes and prints warnings", []string{"--check", "--config", good}, 0, []string{"warning: ", "master_key", good + ": OK"}, nil},
		{"check lists the ignored LiteLLM keys and unusable deployments, and passes", []string{"--check", "--config", litellm}, 0, []string{
			"errors: none",
			"ignored LiteLLM keys (accepted, not implemented) (3):",
			"ignored: model_list[].litellm_params.aws_region_name (line 3), AWS credentials",
			"ignored: model_list[].litellm_params.rpm (line 5)",
			"ignored: router_settings.routing_strategy (line 7), LiteLLM's load-balancing strategy; this proxy balances round-robin",
			"unusable deployments (loaded; requests for them get an error) (1):",
			`unusable: model_list entry "claude" at line 2 (bedrock/anthropic.claude-3): provider bedrock calls AWS's native API with AWS SigV4 signing`,
			"warning: general_settings.master_key is not set",
			litellm + ": OK",
		}, nil},
		{"check fails on a misspelt LiteLLM key and still lists the rest", []string{"--check", "--config", litellmTypo}, 1,
			[]string{"ignored: model_list[].litellm_params.rpm (line 3)", "unusable deployments (loaded; requests for them get an error): none"},
			[]string{"errors (1)", litellmTypo + `:5: router_settings: unknown key "routing_stratgy" (did you mean "routing_strategy"?)`}},
		{"check lists every problem with its line", []string{"--check", "--config", bad}, 1, nil, []string{bad + ":3:", "colour", bad + ":5:", "shutdown_grace"}},
		{"check reports the backends' keys with their lines", []string{"--check", "--config", badSandbox}, 1, nil, []string{badSandbox + ":5:", "pool_size", badSandbox + ":6:", `"api_key" does not apply to sandbox_provider local`}},
		{"check accepts Redis without container_secret, as the start does", []string{"--check", "--config", redisNoSecret}, 0,
			[]string{"errors: none", "ignored LiteLLM keys (accepted, not implemented): none", redisNoSecret + ": OK"}, nil},
		{"start refuses an invalid file", []string{"--config", bad}, 1, nil, []string{bad + ":3:"}},
		{"start refuses a missing file", []string{"--config", filepath.Join(dir, "none.yaml")}, 1, nil, []string{"none.yaml"}},
		{"config is required", nil, 2, nil, []string{"--config is required"}},
		{"bad log format", []string{"--config", good, "--log-format", "xml"}, 2, nil, []string{"--log-format"}},
		{"a sandbox that cannot work here stops the start", []string{"--config", brokenSandbox, "--port", "0", "--host", "127.0.0.1"}, 1, nil, []string{"nonexistent"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr testutil.LockedBuffer
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			code := runOwnDir(t, ctx, tc.args, &stdout, &stderr, func(net.Addr) {
				t.Error("the proxy started listening")
				cancel()
			})
			if code != tc.wantCode {
				t.Errorf("run(%v) = %d; want %d\nstdout: %s\nstderr: %s", tc.args, code, tc.wantCode, stdout.String(), stderr.String())
			}
			for _, w := range tc.wantStdout {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout.String())
				}
			}
			for _, w := range tc.wantStderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

// TestShutdownPastTheGrace: requests still running when shutdown_grace is over are ended, not cut:
// a stream of the engine gets the error event and response.failed (server_error, saying the proxy
// is shutting down) and its end, a JSON request (the engine's or passed through) an OpenAI-shaped
// 503; then the process exits 0.
func TestShutdownPastTheGrace(t *testing.T) {
	up := upstreamtest.New(t)
	cfg := `model_list:
  - model_name: gpt-chat
    litellm_params: {model: hosted_vllm/m, api_base: ` + up.URL() + `, api_key: sk-upstream, use_chat_completions_api: true}
  - model_name: gpt-pass
    litellm_params: {model: hosted_vllm/m, api_base: ` + up.URL() + `, api_key: sk-upstream}
general_settings:
  master_key: ` + testKey + `
  shutdown_grace: 1s
`
	p := start(t, "--config", writeConfig(t, t.TempDir(), cfg))
	hang := func(ctx context.Context, seq int, _ string) error {
		if seq < 2 {
			return nil
		}
		<-ctx.Done() // mid-stream, until the proxy lets go
		return ctx.Err()
	}
	never := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("never")}, Hold: make(chan struct{})}
	up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("a long answer that never ends")}, BeforeEvent: hang}, never, never)

	post := func(body string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/responses", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	stream := post(`{"model":"gpt-chat","input":"go on","stream":true}`)
	events := bufio.NewReader(stream.Body)
	for { // the stream is under way: its first events have reached the client
		line, err := events.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before it began: %v", err)
		}
		if strings.HasPrefix(line, "event: response.in_progress") {
			break
		}
	}
	type answer struct {
		status int
		body   []byte
		err    error
	}
	models := []string{"gpt-chat", "gpt-pass"}
	jsonDone := make(chan answer, len(models))
	for _, model := range models {
		go func() {
			req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/responses", strings.NewReader(`{"model":"`+model+`","input":"wait"}`))
			req.Header.Set("Authorization", "Bearer "+testKey)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				jsonDone <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			jsonDone <- answer{resp.StatusCode, b, err}
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := up.Wait(ctx, 3); err != nil {
		t.Fatalf("the JSON requests did not reach the upstream: %v", err)
	}

	p.cancel() // SIGTERM; both requests outlive the grace
	rest, err := io.ReadAll(events)
	if err != nil {
		t.Fatalf("the stream was cut (%v) after:\n%s\nlog:\n%s", err, rest, p.stderr)
	}
	var errEvent, failed gjson.Result
	for _, line := range strings.Split(string(rest), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		switch ev := gjson.Parse(data); ev.Get("type").Str {
		case "error":
			errEvent = ev
		case "response.failed":
			failed = ev
		}
	}
	if e := errEvent.Get("error"); e.Get("type").Str != "server_error" || !strings.Contains(e.Get("message").Str, "shutting down") {
		t.Errorf("error event = %s; want a server_error saying the proxy is shutting down; stream:\n%s", errEvent.Raw, rest)
	}
	if e := failed.Get("response.error"); failed.Get("response.status").Str != "failed" || e.Get("code").Str != "server_error" ||
		!strings.Contains(e.Get("message").Str, "shutting down") || !strings.HasSuffix(strings.TrimSpace(string(rest)), "}") {
		t.Errorf("response.failed = %s; want status failed, code server_error, last; stream:\n%s", failed.Raw, rest)
	}

	for range models {
		a := <-jsonDone
		if e := gjson.GetBytes(a.body, "error"); a.err != nil || a.status != http.StatusServiceUnavailable || e.Get("type").Str != "server_error" ||
			!strings.Contains(e.Get("message").Str, "shutting down") || !e.Get("param").Exists() || !e.Get("code").Exists() {
			t.Errorf("JSON request = %d %s %v; want an OpenAI-shaped 503 saying the proxy is shutting down", a.status, a.body, a.err)
		}
	}
	select {
	case code := <-p.exit:
		if code != 0 {
			t.Errorf("run = %d; want 0; log:\n%s", code, p.stderr)
		}
		p.exit <- code // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after the grace")
	}
}
