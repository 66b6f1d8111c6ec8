package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestOpenSandboxFaults runs the intercepted tool on the opensandbox tool while its double
// misbehaves: creates refused, a stream cut mid-execution, the sandbox removed between two calls
// of one container, a slow create. Each request ends (an OpenAI-shaped error, or a response whose
// call reports the failure), the proxy keeps serving, and no sandbox is left once it stopped.
func TestOpenSandboxFaults(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(t)
	up.Script(runUserCode)
	osb, env := newOpenSandbox(t, "opensandbox")
	p := startProxy(t, setup{Upstream: up.URL(), Tool: "opensandbox", OSB: osb, WorkDir: workDir(t)}.yaml(), env...)
	ask := func(t *testing.T, code, container string) rawResponse {
		t.Helper()
		tool := map[string]any{"type": "code_interpreter", "container": map[string]any{"type": "auto"}}
		if container != "" {
			tool["container"] = container
		}
		body, _ := json.Marshal(map[string]any{"model": clientModel, "input": code, "tools": []any{tool},
			"include": []string{"code_interpreter_call.outputs"}})
		return do(t, http.MethodPost, p.URL+"/v1/responses", body, "Authorization: Bearer sk-osb")
	}
	// failed checks an answer that reports a failure: an OpenAI error with a code, or a response
	// whose code interpreter call did not complete.
	failed := func(t *testing.T, r rawResponse, wantStatus int) {
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
		if _, code, msg := apiError(t, r.Body); code == "" || msg == "" || strings.Contains(msg, osb.APIKey()) {
			t.Errorf("error %.300s", r.Body)
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
		osb.FailNextCreates(http.StatusInternalServerError)
		r := ask(t, "print(1)", "")
		failed(t, r, http.StatusBadGateway)
		if _, code, _ := apiError(t, r.Body); code != "sandbox_unavailable" {
			t.Errorf("code %q, want sandbox_unavailable", code)
		}
		healthy(t)
	})
	t.Run("stream cut mid-execution", func(t *testing.T) {
		cntr := healthy(t)
		osb.CutNextRuns(1, 3)
		failed(t, ask(t, "print('a', flush=True)\nimport time; time.sleep(1); print('b')", cntr), 0)
		healthy(t)
	})
	t.Run("sandbox gone between calls", func(t *testing.T) {
		cntr := healthy(t)
		for _, id := range osb.IDs() {
			osb.Remove(id)
		}
		failed(t, ask(t, "print(1)", cntr), 0)
		healthy(t)
	})
	t.Run("slow create", func(t *testing.T) {
		osb.SetCreateDelay(2 * time.Second)
		defer osb.SetCreateDelay(0)
		start := time.Now()
		healthy(t)
		if time.Since(start) < 2*time.Second {
			t.Error("the create was not slowed")
		}
	})
	p.Stop()
	if strings.Contains(p.Log(), osb.APIKey()) {
		t.Error("the OpenSandbox API key appears in the proxy's log")
	}
	// execd (the sandbox's side) never saw the lifecycle key.
	for _, route := range []string{"POST /code", "POST /code/context", "POST /directories", "GET /files/info"} {
		if h := osb.LastHeader(route); h == nil {
			t.Errorf("no %s reached the double", route)
		} else if strings.Contains(mustJSON(h), osb.APIKey()) {
			t.Errorf("%s carried the OpenSandbox API key to execd", route)
		}
	}
	osb.Advance(20*time.Minute + 2*time.Minute)
	if n := osb.Live(); n != 0 {
		t.Errorf("%d OpenSandbox sandboxes left after the fault round", n)
	}
}
