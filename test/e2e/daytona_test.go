package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox/daytonatest"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// newDaytona starts a Daytona double executing through a real local sandbox when tool is
// "daytona", else returns nil (the other tools need none). It is closed after every proxy the
// test starts later.
func newDaytona(t *testing.T, tool string) *daytonatest.Server {
	t.Helper()
	if tool != "daytona" {
		return nil
	}
	exec, err := local.New(local.Options{PoolSize: 1})
	if err != nil {
		t.Fatalf("local sandbox for the Daytona double: %v", err)
	}
	dt := daytonatest.New(exec)
	t.Cleanup(func() {
		dt.Close()
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec.Close(c); err != nil {
			t.Errorf("closing the double's sandboxes: %v", err)
		}
	})
	return dt
}

// checkDaytonaAfterStop checks, once the proxy stopped, that it used the double and that no
// sandbox outlives its auto-stop (the container idle timeout): Daytona deletes a sandbox that
// stopped, so none is left.
func checkDaytonaAfterStop(t *testing.T, dt *daytonatest.Server) {
	t.Helper()
	if dt == nil {
		return
	}
	if dt.Creates() == 0 {
		t.Error("the daytona tool never created a sandbox in the double")
	}
	if n := dt.Live(); n > dt.Creates() {
		t.Errorf("%d daytona sandboxes live after the proxy stopped, more than it created", n)
	}
	dt.Advance(20*time.Minute + 2*time.Minute)
	if n := dt.Live(); n != 0 {
		t.Errorf("%d daytona sandboxes still live past their auto-stop after the proxy stopped", n)
	}
}

// TestDaytonaFaults runs the code interpreter on the daytona tool while the double misbehaves:
// a refused create, a slow one, a stream cut mid-execution, and the sandbox gone between two
// calls. Each is an OpenAI-shaped answer, and no sandbox is left afterwards.
func TestDaytonaFaults(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(t)
	up.Script(runUserCode)
	dt := newDaytona(t, "daytona")
	p := startProxy(t, setup{Upstream: up.URL(), Tool: "daytona", Daytona: dt, WorkDir: workDir(t)}.yaml())
	client := sdk(p, "sk-client-a")
	auth := "Authorization: Bearer sk-client-a"
	ci := func(code string) []byte {
		return []byte(`{"model":"` + clientModel + `","input":` + mustJSON(code) +
			`,"tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"include":["code_interpreter_call.outputs"]}`)
	}

	t.Run("create refused", func(t *testing.T) {
		dt.FailCreates(1, http.StatusForbidden)
		resp := do(t, http.MethodPost, p.URL+"/v1/responses", ci("print(1)"), auth)
		if resp.Status != http.StatusBadGateway {
			t.Fatalf("status %d: %.300s", resp.Status, resp.Body)
		}
		if _, code, _ := apiError(t, resp.Body); code != "sandbox_unavailable" {
			t.Errorf("code %q, want sandbox_unavailable: %s", code, resp.Body)
		}
		if strings.Contains(string(resp.Body), dt.APIKey()) {
			t.Error("the Daytona key is in the answer")
		}
	})

	t.Run("slow create", func(t *testing.T) {
		dt.SlowStarts(2 * time.Second)
		defer dt.SlowStarts(0)
		r, err := client.Responses.New(ctx(t, 90*time.Second), ciParams("print(6 * 7)", ""))
		if err != nil {
			t.Fatalf("Responses.New: %v", err)
		}
		checkSixTimesSeven(t, r)
	})

	t.Run("stream cut mid-execution", func(t *testing.T) {
		dt.CutStreams(1, 2)
		resp := do(t, http.MethodPost, p.URL+"/v1/responses", ci("for i in range(10):\n    print(i, flush=True)"), auth)
		if resp.Status != http.StatusOK && resp.Status != http.StatusBadGateway {
			t.Fatalf("status %d: %.300s", resp.Status, resp.Body)
		}
		t.Logf("status %d: %.300s", resp.Status, resp.Body)
		if resp.Status != http.StatusOK {
			if typ, _, _ := apiError(t, resp.Body); typ == "" {
				t.Errorf("not an OpenAI error: %s", resp.Body)
			}
		}
	})

	t.Run("sandbox gone between calls", func(t *testing.T) {
		first, err := client.Responses.New(ctx(t, 90*time.Second), ciParams("x = 1\nprint('set')", ""))
		if err != nil {
			t.Fatalf("first: %v", err)
		}
		cntr := ciCall(t, first).ContainerID
		for _, id := range dt.Sandboxes() {
			dt.Destroy(id)
		}
		// The router reports the execution failed because the sandbox is gone, as for e2b.
		r, err := client.Responses.New(ctx(t, 90*time.Second), ciParams("print(x)", cntr))
		if err != nil {
			t.Fatalf("second: %v", err)
		}
		call := ciCall(t, r)
		if call.Status != "failed" || len(call.Outputs) != 1 || !strings.Contains(call.Outputs[0].AsLogs().Logs, "sandbox is gone") {
			t.Errorf("call %s, want failed: the sandbox is gone", mustJSON(call))
		}
	})

	p.Stop()
	dt.Advance(25 * time.Minute)
	if n := dt.Live(); n != 0 {
		t.Errorf("%d daytona sandboxes left after the fault round", n)
	}
}
