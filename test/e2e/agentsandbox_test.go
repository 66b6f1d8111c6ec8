package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandboxtest"
	"github.com/ciproxy/ciproxy/internal/sandbox/kernel"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// newAgentSandbox starts the agent-sandbox double (an API server with agent-sandbox's CRDs and
// controllers, bubblewrap pods with sandboxd, a router with scoped tokens) when tool is
// "agent_sandbox", else returns nil. Its pods carry what the repository's sandbox image does:
// the kernel and its daemon in /opt/ciproxy. It is closed after every proxy the test starts later.
func newAgentSandbox(t *testing.T, tool string) *agentsandboxtest.Server {
	t.Helper()
	if tool != "agent_sandbox" {
		return nil
	}
	// With an image under test, the kubeconfig is where the container sees it too (imageShare),
	// readable by the proxy's user there.
	dir, err := os.MkdirTemp(imageShare, "ciproxy-e2e-k8s-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := agentsandboxtest.New(t, agentsandboxtest.Options{
		Namespace: "ciproxy-sandboxes", Template: "ciproxy-python", WarmPool: "ciproxy-python", WarmPoolReplicas: 2,
		ImageFiles: map[string]string{kernel.Path: string(kernel.Source()), kernel.DaemonPath: string(kernel.DaemonSource())},
		PodEnv:     map[string]string{"MPLBACKEND": "Agg"},
		Router:     true, RouterAuthz: "scoped-token", Dir: dir,
	})
	if testImage != "" {
		for path, mode := range map[string]os.FileMode{dir: 0o755, d.Kubeconfig(): 0o644} {
			if err := os.Chmod(path, mode); err != nil {
				t.Fatal(err)
			}
		}
	}
	return d
}

// checkAgentSandboxAfterStop checks, once the proxy stopped, that it used the double and that
// no claim outlives its shutdown time (the container idle timeout and a margin): the claims'
// Delete policy then takes their Sandboxes and pods with them.
func checkAgentSandboxAfterStop(t *testing.T, d *agentsandboxtest.Server) {
	t.Helper()
	if d == nil {
		return
	}
	if !claimed(d) {
		t.Error("the agent_sandbox tool never created a claim in the double")
	}
	d.Advance(20*time.Minute + 2*time.Minute)
	testutil.Eventually(t, "every claim past its shutdown time deleted", func() bool { return len(d.LiveClaims()) == 0 })
}

// claimed reports whether a SandboxClaim was ever created in d.
func claimed(d *agentsandboxtest.Server) bool { return asCreates(d) > 0 }

func asCreates(d *agentsandboxtest.Server) int {
	n := 0
	for _, r := range d.Requests() {
		if r.Verb == "create" && r.Resource == "sandboxclaims" && r.Code/100 == 2 {
			n++
		}
	}
	return n
}

// asEngine adapts the agent-sandbox double to the suites that inject an engine's faults and
// account for its sandboxes and its key. Its "key" is the kubeconfig's bearer token.
type asEngine struct{ *agentsandboxtest.Server }

func (e asEngine) Tool() string { return "agent_sandbox" }
func (e asEngine) Key() string  { return e.Token() }
func (e asEngine) URL() string  { return e.APIURL() }

func (e asEngine) Configure(s *setup) []string {
	s.AgentSandbox = e.Server
	return nil
}

// Live counts the claims: a pool keeps its unclaimed sandboxes ready by design.
func (e asEngine) Live() int    { return len(e.LiveClaims()) }
func (e asEngine) Creates() int { return asCreates(e.Server) }

func (e asEngine) FailNextCreates(n, status int) { e.FailCreates(n, status) }

// Received is what reached the sandboxes' side: the command and environment of every process
// started in a pod (the API server's requests carry the token by design).
func (e asEngine) Received() []received {
	var out []received
	for _, p := range e.ProcessEnvs() {
		out = append(out, received{"Start " + strings.Join(p.Command, " "), strings.Join(p.Env, "\n"), true})
	}
	return out
}

var _ engineDouble = asEngine{}

// runningCell is a cell that says it runs (a file in /mnt/data), then runs for long.
const runningCell = "import time\nopen('running', 'w').close()\ntime.sleep(30)"

// waitRunning waits until runningCell runs in one of d's pods.
func waitRunning(t *testing.T, d *agentsandboxtest.Server) {
	t.Helper()
	testutil.Eventually(t, "the cell running", func() bool {
		for _, sb := range d.LivePods() {
			if _, err := os.Stat(filepath.Join(d.PodDataDir(sb), "running")); err == nil {
				return true
			}
		}
		return false
	})
}

// TestAgentSandboxFaults runs the intercepted tool on the agent_sandbox tool while the double
// misbehaves: a create refused, a claim that never becomes ready, a watch dropped while a claim
// waits, the sandbox's pod killed under a running cell, its claim deleted under a running cell, the router refusing the proxy's token
// for a file. Each request ends with an OpenAI-shaped error or a response whose call reports the
// failure, the proxy keeps serving, and no claim is left after the round.
func TestAgentSandboxFaults(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(t)
	up.Script(runUserCode)
	d := newAgentSandbox(t, "agent_sandbox")
	s := setup{Upstream: up.URL(), Tool: "agent_sandbox", AgentSandbox: d, WorkDir: workDir(t),
		AgentSandboxSettings: []string{"ready_timeout: 8s", "connect: router", "router_url: " + d.RouterURL(),
			"scoped_token_secret: os.environ/E2E_ROUTER_SECRET"}}
	p := startProxy(t, s.yaml(), "E2E_ROUTER_SECRET="+d.ScopedTokenSecret())
	auth := "Authorization: Bearer sk-as"
	ask := func(t *testing.T, code, container string) rawResponse {
		t.Helper()
		tool := map[string]any{"type": "code_interpreter", "container": map[string]any{"type": "auto"}}
		if container != "" {
			tool["container"] = container
		}
		body, _ := json.Marshal(map[string]any{"model": clientModel, "input": code, "tools": []any{tool},
			"include": []string{"code_interpreter_call.outputs"}})
		return do(t, http.MethodPost, p.URL+"/v1/responses", body, auth)
	}
	// askAsync asks in the background. The test waits for the answer before it completes, even
	// when it fails early, so that nothing reports to a test that has ended.
	askAsync := func(t *testing.T, code, container string) <-chan rawResponse {
		done, finished := make(chan rawResponse, 1), make(chan struct{})
		go func() {
			var r rawResponse // Status 0 if ask failed the test and ended this goroutine
			defer func() {
				done <- r
				close(finished)
			}()
			r = ask(t, code, container)
		}()
		t.Cleanup(func() { <-finished })
		return done
	}
	failed := func(t *testing.T, r rawResponse, wantStatus int, wantCode string) {
		t.Helper()
		if r.Status == http.StatusOK {
			call := gjson.GetBytes(r.Body, `output.#(type=="code_interpreter_call")`)
			if !call.Exists() || call.Get("status").String() == "completed" && !strings.Contains(call.Raw, "rror") {
				t.Errorf("a fault that went unnoticed: %.600s", r.Body)
			}
			return
		}
		if wantStatus != 0 && r.Status != wantStatus {
			t.Errorf("status %d, want %d: %.300s", r.Status, wantStatus, r.Body)
		}
		_, code, msg := apiError(t, r.Body)
		if code == "" || msg == "" || strings.Contains(msg, d.Token()) || strings.Contains(msg, d.ScopedTokenSecret()) {
			t.Errorf("error %.300s", r.Body)
		}
		if wantCode != "" && code != wantCode {
			t.Errorf("code %q, want %q", code, wantCode)
		}
	}
	healthy := func(t *testing.T) string {
		t.Helper()
		r := ask(t, "print(6 * 7)", "")
		if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `42\n`) {
			t.Fatalf("the proxy no longer serves: %d %.500s", r.Status, r.Body)
		}
		return gjson.GetBytes(r.Body, `output.#(type=="code_interpreter_call").container_id`).String()
	}

	t.Run("create refused", func(t *testing.T) {
		d.FailCreates(3, http.StatusForbidden)
		failed(t, ask(t, "print(1)", ""), http.StatusBadGateway, "sandbox_unavailable")
		d.FailCreates(0)
		healthy(t)
	})
	t.Run("claim never ready", func(t *testing.T) {
		before := len(d.LiveClaims())
		d.StallClaims(true)
		start := time.Now()
		failed(t, ask(t, "print(1)", ""), http.StatusBadGateway, "sandbox_unavailable")
		d.StallClaims(false)
		if time.Since(start) > 30*time.Second {
			t.Errorf("a claim that never became ready took %s to fail; ready_timeout is 8s", time.Since(start))
		}
		testutil.Eventually(t, "the unready claim deleted", func() bool { return len(d.LiveClaims()) <= before })
		healthy(t)
	})
	t.Run("watch dropped while waiting", func(t *testing.T) {
		before := len(d.LiveClaims())
		d.StallClaims(true)
		done := askAsync(t, "print(6 * 7)", "")
		testutil.Eventually(t, "a claim waiting for its sandbox", func() bool { return len(d.LiveClaims()) > before })
		time.Sleep(500 * time.Millisecond) // the proxy is in its watch
		drops := d.WatchDrops()
		d.DropWatches()
		if d.WatchDrops() <= drops {
			t.Error("no watch was open to drop while the claim waited")
		}
		d.StallClaims(false)
		if r := <-done; r.Status != http.StatusOK || !strings.Contains(string(r.Body), `42\n`) {
			t.Errorf("after a dropped watch: %d %.500s", r.Status, r.Body)
		}
	})
	t.Run("pod killed under a running cell", func(t *testing.T) {
		cntr := healthy(t)
		done := askAsync(t, runningCell, cntr)
		waitRunning(t, d)
		for _, claim := range d.LivePods() {
			_ = d.KillPod(claim)
		}
		select {
		case r := <-done:
			failed(t, r, 0, "")
		case <-time.After(60 * time.Second):
			t.Fatal("a cell whose pod was killed did not end")
		}
		healthy(t)
	})
	t.Run("claim deleted under a running cell", func(t *testing.T) {
		cntr := healthy(t)
		claimsBefore := d.LiveClaims()
		done := askAsync(t, runningCell, cntr)
		waitRunning(t, d)
		// What an operator's kubectl delete does: through the API, with the kubeconfig.
		cfg, err := clientcmd.BuildConfigFromFlags("", d.Kubeconfig())
		if err != nil {
			t.Fatal(err)
		}
		dyn, err := dynamic.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		claims := dyn.Resource(schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}).Namespace(d.Namespace())
		for _, name := range claimsBefore {
			if err := claims.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case r := <-done:
			failed(t, r, 0, "")
		case <-time.After(60 * time.Second):
			t.Fatal("a cell whose claim was deleted did not end")
		}
		// The container is gone with its sandbox: asking for it again is OpenAI's answer for a
		// container that does not exist, not a hang.
		if r := ask(t, "print(1)", cntr); r.Status/100 != 4 || !strings.Contains(string(r.Body), "Container with id '"+cntr+"' not found") {
			t.Errorf("the deleted claim's container: %d %.300s", r.Status, r.Body)
		}
		healthy(t)
	})
	t.Run("router refuses the token", func(t *testing.T) {
		cntr := healthy(t)
		put := func() rawResponse {
			var body bytes.Buffer
			mw := multipart.NewWriter(&body)
			fw, _ := mw.CreateFormFile("file", "through-router.txt")
			fw.Write([]byte("files go through the router"))
			mw.Close()
			return do(t, http.MethodPost, p.URL+"/v1/containers/"+cntr+"/files", body.Bytes(), auth, "Content-Type: "+mw.FormDataContentType())
		}
		d.RefuseRouterTokens(true)
		failed(t, put(), 0, "")
		d.RefuseRouterTokens(false)
		if r := put(); r.Status != http.StatusOK {
			t.Errorf("the upload once the router takes the token again: %d %.300s", r.Status, r.Body)
		}
	})
	healthy(t)
	p.Stop()
	for _, secret := range []string{d.Token(), d.ScopedTokenSecret()} {
		if strings.Contains(p.Log(), secret) {
			t.Errorf("a secret of the agent_sandbox tool (%.6s…) appears in the proxy's log", secret)
		}
	}
	for _, e := range d.ProcessEnvs() {
		env := strings.Join(e.Env, "\n")
		if strings.Contains(env, d.Token()) || strings.Contains(env, d.ScopedTokenSecret()) {
			t.Errorf("a pod's process %v got a secret of the proxy in its environment", e.Command)
		}
	}
	checkAgentSandboxAfterStop(t, d)
}
