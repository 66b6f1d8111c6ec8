package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/snapshot"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// Keys of the quota tests' callers. None may appear in a log line.
const (
	aliceKey = "sk-alice-SECRET-0123456789"
	bobKey   = "sk-bob-SECRET-0123456789"
	carolKey = "sk-carol-SECRET-0123456789"
	quotaMK  = "sk-master-SECRET-0123456789"
)

// quotaYAML is a configuration with interception on, the three client keys and the master key;
// extra is appended to general_settings.
func quotaYAML(base, extra string) string {
	return `model_list:
  - model_name: gpt-test
    litellm_params: {model: openai/gpt-up, api_base: ` + base + `, api_key: sk-upstream-SECRET}
litellm_settings:
  callbacks: ["code_interpreter_interception"]
general_settings:
  master_key: ` + quotaMK + `
  client_keys:
    - {name: alice, key: ` + aliceKey + `, max_concurrent_requests: 1, max_containers: 1}
    - {name: bob, key: os.environ/BOB_KEY}
    - {name: carol, key: ` + carolKey + `, container_create_burst: 1, container_creates_per_minute: 1}
` + extra
}

// quotaProxy is the real router in front of the real engine, over the configuration file it
// reloads, with the local sandbox when sandboxed is set (skipping where it cannot run).
type quotaProxy struct {
	*proxy
	up   *upstreamtest.Server
	path string
	sess *containers.Manager
}

func newQuotaProxy(t *testing.T, extra string, sandboxed bool) *quotaProxy {
	t.Helper()
	return newConfiguredProxy(t, func(base string) string { return quotaYAML(base, extra) }, sandboxed)
}

// newConfiguredProxy is newQuotaProxy over the configuration yaml returns for the upstream's URL.
func newConfiguredProxy(t *testing.T, yaml func(base string) string, sandboxed bool) *quotaProxy {
	t.Helper()
	up := upstreamtest.New(t)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(yaml(up.URL())), 0o600); err != nil {
		t.Fatal(err)
	}
	parse := config.ParseOptions{LookupEnv: func(n string) (string, bool) {
		if n == "BOB_KEY" {
			return bobKey, true
		}
		return "", false
	}}
	cfg, err := config.Load(path, parse)
	if err != nil {
		t.Fatal(err)
	}
	var entries []sandbox.RegistryEntry
	if sandboxed {
		opts := local.Options{Tool: "local", PoolSize: 0}
		if err := local.Check(context.Background(), opts); err != nil {
			t.Skipf("needs a local sandbox: %v", err)
		}
		p, err := local.New(opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close(context.Background()) })
		entries = append(entries, sandbox.RegistryEntry{Name: "local", Provider: p, Backend: "local"})
	}
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	store, err := snapshot.New(context.Background(), cfg, snapshot.Options{
		Parse: parse,
		Provision: func(_ context.Context, _ []config.SandboxTool, prev *sandbox.Registry, _ *zap.Logger) (*sandbox.Registry, error) {
			return sandbox.NewRegistry(prev, entries...)
		},
		Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := embedded.Open(embedded.Options{Dir: t.TempDir(), SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := containers.New(context.Background(), containers.Options{Store: st, Registry: func() *sandbox.Registry { return store.Load().Sandboxes }, Logger: log, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sess.Close(context.Background())
		_ = st.Close()
	})
	eng := intercept.New(intercept.Options{Containers: sess, Store: storetest.NewMemResponses(nil), Logger: log})
	p := newProxy(t, cfg, func(o *Options) {
		o.Store = store
		o.Interceptor = eng
		o.Containers = sess
		o.Logger = log
	})
	p.logs = logs
	return &quotaProxy{proxy: p, up: up, path: path, sess: sess}
}

func (q *quotaProxy) post(t *testing.T, key, body string) (int, http.Header, []byte) {
	t.Helper()
	return q.do(t, http.MethodPost, "/v1/responses", body, "Authorization", "Bearer "+key)
}

const ciBody = `{"model":"gpt-test","input":"compute","tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`

// want429 checks an OpenAI-shaped rate limit naming limit.
func want429(t *testing.T, what string, status int, body []byte, limit string) {
	t.Helper()
	if status != http.StatusTooManyRequests {
		t.Fatalf("%s: status %d %s; want 429", what, status, body)
	}
	msg, typ, _, code := decodeError(t, body)
	if typ != "requests" || code != "rate_limit_exceeded" || !strings.Contains(msg, limit) {
		t.Errorf("%s: %s; want type requests, code rate_limit_exceeded, a message naming %s", what, body, limit)
	}
}

// noSecretLogged fails when a log line (message or field) holds a key.
func noSecretLogged(t *testing.T, logs *observer.ObservedLogs) {
	t.Helper()
	if logs.Len() == 0 {
		t.Fatal("nothing was logged: the check would prove nothing")
	}
	for _, e := range logs.All() {
		line := e.Message
		for k, v := range e.ContextMap() {
			line += " " + k + "=" + strings.ReplaceAll(strings.ReplaceAll(toString(v), "\n", " "), "\t", " ")
		}
		if strings.Contains(line, "SECRET") {
			t.Errorf("a log line holds a key: %s", line)
		}
	}
}

func toString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

func TestQuotaConcurrentRequests(t *testing.T) {
	q := newQuotaProxy(t, "  max_concurrent_requests: 2\n", false)
	gate, arrived := make(chan struct{}), make(chan struct{}, 4)
	q.up.Script(func(r upstreamtest.Request) upstreamtest.Turn {
		if !strings.Contains(string(r.Body), `"python"`) {
			return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("passed through")}}
		}
		arrived <- struct{}{}
		<-gate
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("done")}}
	})
	var wg sync.WaitGroup
	statuses := make([]int, 2)
	for i, key := range []string{aliceKey, bobKey} {
		wg.Go(func() { statuses[i], _, _ = q.post(t, key, ciBody) })
		<-arrived // held at the upstream
	}
	status, _, body := q.post(t, aliceKey, ciBody)
	want429(t, "alice's second request", status, body, "max_concurrent_requests_per_key")
	status, _, body = q.post(t, carolKey, ciBody)
	want429(t, "a third caller past the total", status, body, "max_concurrent_requests")
	// A request that is not intercepted is not counted.
	if status, _, body := q.post(t, carolKey, `{"model":"gpt-test","input":"hi"}`); status != http.StatusOK {
		t.Errorf("pass-through while the quota is full: %d %s", status, body)
	}
	close(gate)
	wg.Wait()
	if statuses[0] != 200 || statuses[1] != 200 {
		t.Errorf("the admitted requests ended with %v", statuses)
	}
	if status, _, body := q.post(t, aliceKey, ciBody); status != 200 {
		t.Errorf("alice after her request ended: %d %s", status, body)
	}
	noSecretLogged(t, q.logs)
}

func TestQuotaContainers(t *testing.T) {
	// An explicit share: by default 4 keys would share the 3 containers, one each.
	q := newQuotaProxy(t, "  max_containers: 3\n  max_containers_per_key: 3\n", true)
	code := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", `{"code":"1+1"}`)}}
	done := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("2")}}
	ok := func(who, key string) {
		t.Helper()
		q.up.Enqueue(code, done)
		if status, _, body := q.post(t, key, ciBody); status != 200 {
			t.Fatalf("%s: %d %s", who, status, body)
		}
	}
	ok("alice's first container", aliceKey)
	q.up.Enqueue(code)
	status, _, body := q.post(t, aliceKey, ciBody)
	want429(t, "alice's second container (max_containers: 1 for her key)", status, body, "max_containers_per_key")
	status, _, body = q.do(t, http.MethodPost, "/v1/containers", `{"name":"more"}`, "Authorization", "Bearer "+aliceKey)
	want429(t, "alice's second container through the Containers API", status, body, "max_containers_per_key")

	ok("carol's first container", carolKey)
	q.up.Enqueue(code)
	status, hdr, body := q.post(t, carolKey, ciBody)
	want429(t, "carol's second container within the minute", status, body, "container_creates_per_minute")
	if hdr.Get("Retry-After") == "" {
		t.Error("the creation rate's 429 has no Retry-After")
	}

	ok("bob's first container", bobKey)
	q.up.Enqueue(code)
	status, _, body = q.post(t, quotaMK, ciBody)
	want429(t, "a fourth container past max_containers: 3", status, body, "max_containers")

	// A hot reload raises the total: the next request gets the new quota.
	data, _ := os.ReadFile(q.path)
	if err := os.WriteFile(q.path, []byte(strings.Replace(string(data), "max_containers: 3", "max_containers: 4", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := q.store.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	q.up.Requests() // the refused request left its turn unused: drop it
	q.up.Enqueue(done)
	if status, _, body := q.post(t, quotaMK, ciBody); status != 200 {
		t.Fatalf("after the reload: %d %s", status, body)
	}
	noSecretLogged(t, q.logs)
}

// TestOneKeyReachesMaxContainers: with the master key alone, a client suite that leaves an auto
// container behind per case, as clients of OpenAI do, gets no 429 before max_containers: one key
// has no cap of its own below the host's.
func TestOneKeyReachesMaxContainers(t *testing.T) {
	const cases = 38 // past the old per-key default of 32
	q := newConfiguredProxy(t, func(base string) string {
		return `model_list:
  - model_name: gpt-test
    litellm_params: {model: openai/gpt-up, api_base: ` + base + `, api_key: sk-upstream-SECRET}
litellm_settings:
  callbacks: ["code_interpreter_interception"]
general_settings:
  master_key: ` + quotaMK + "\n"
	}, true)
	code := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", `{"code":"1+1"}`)}}
	done := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("2")}}
	containers := map[string]bool{}
	for i := range cases {
		q.up.Enqueue(code, done)
		status, _, body := q.post(t, quotaMK, ciBody)
		if status != http.StatusOK {
			t.Fatalf("case %d: %d %s", i+1, status, body)
		}
		containers[gjson.GetBytes(body, `output.#(type=="code_interpreter_call").container_id`).String()] = true
	}
	if len(containers) != cases {
		t.Errorf("%d cases made %d containers; want one each", cases, len(containers))
	}
	if live := q.sess.Live(); live != cases {
		t.Errorf("%d containers live; want %d", live, cases)
	}
}

// Two client keys own their files and stored responses apart; a key's entry keeps its owner
// name when its key changes.
func TestClientKeysScopeFilesAndResponses(t *testing.T) {
	up := upstreamtest.New(t)
	yml := quotaYAML(up.URL(), "")
	env := func(n string) (string, bool) { return bobKey, n == "BOB_KEY" }
	cfg, err := config.ParseWith([]byte(yml), "t.yaml", config.ParseOptions{LookupEnv: env})
	if err != nil {
		t.Fatal(err)
	}
	st, err := embedded.Open(embedded.Options{Dir: t.TempDir(), SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	p := newProxy(t, cfg, func(o *Options) {
		o.Files = st
		o.Interceptor = intercept.New(intercept.Options{Store: storetest.NewMemResponses(nil)})
	})
	fp := &filesProxy{proxy: p, store: st}
	ctx := context.Background()
	alice, bob, master := client(fp, aliceKey), client(fp, bobKey), client(fp, quotaMK)

	f, err := alice.Files.New(ctx, openai.FileNewParams{File: openai.File(bytes.NewReader([]byte("a,b\n1,2\n")), "data.csv", "text/csv"), Purpose: openai.FilePurposeAssistants})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bob.Files.Get(ctx, f.ID); !isStatus(err, 404) {
		t.Errorf("bob reads alice's file: %v; want 404", err)
	}
	if list, err := bob.Files.List(ctx, openai.FileListParams{}); err != nil || len(list.Data) != 0 {
		t.Errorf("bob's list = %v, %v; want empty", list, err)
	}
	if _, err := master.Files.Get(ctx, f.ID); !isStatus(err, 404) {
		t.Errorf("the master key reads alice's file: %v; want 404 (it is its own owner)", err)
	}
	if _, err := alice.Files.Get(ctx, f.ID); err != nil {
		t.Errorf("alice reads her file: %v", err)
	}

	up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("hello")}})
	status, _, body := p.do(t, http.MethodPost, "/v1/responses", ciBody, "Authorization", "Bearer "+aliceKey)
	id := gjson.GetBytes(body, "id").String()
	if status != 200 || id == "" {
		t.Fatalf("alice's response: %d %s", status, body)
	}
	if status, _, body := p.do(t, http.MethodGet, "/v1/responses/"+id, "", "Authorization", "Bearer "+bobKey); status != 404 {
		t.Errorf("bob gets alice's response: %d %s; want 404", status, body)
	}
	if status, _, body := p.do(t, http.MethodGet, "/v1/responses/"+id, "", "Authorization", "Bearer "+aliceKey); status != 200 {
		t.Errorf("alice gets her response: %d %s", status, body)
	}

	// Alice's key is rotated: her name still owns what she made.
	rotated := strings.Replace(yml, aliceKey, "sk-alice-SECRET-rotated", 1)
	cfg2, err := config.ParseWith([]byte(rotated), "t.yaml", config.ParseOptions{LookupEnv: env})
	if err != nil {
		t.Fatal(err)
	}
	p2 := newProxy(t, cfg2, func(o *Options) { o.Files = st })
	fp2 := &filesProxy{proxy: p2, store: st}
	rotatedAlice, oldAlice := client(fp2, "sk-alice-SECRET-rotated"), client(fp2, aliceKey)
	if _, err := rotatedAlice.Files.Get(ctx, f.ID); err != nil {
		t.Errorf("alice's rotated key reads her file: %v", err)
	}
	if _, err := oldAlice.Files.Get(ctx, f.ID); !isStatus(err, 401) {
		t.Errorf("alice's old key: %v; want 401", err)
	}
	noSecretLogged(t, p.logs)
	noSecretLogged(t, p2.logs)
}

// isStatus reports whether err is an API error with the given status.
func isStatus(err error, status int) bool {
	var ae *openai.Error
	return errors.As(err, &ae) && ae.StatusCode == status
}
