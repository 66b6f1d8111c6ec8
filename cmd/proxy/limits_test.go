package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestLimitsThroughTheProcess: the per-response limits and a client key, as the process reads
// them from its file: a code argument over max_code_size and a call past max_calls_per_turn are not
// run, the model is told, the client gets the answer, and no key reaches the log.
func TestLimitsThroughTheProcess(t *testing.T) {
	up := upstreamtest.New(t)
	cfg := `model_list:
  - model_name: gpt-test
    litellm_params: {model: openai/gpt-up, api_base: ` + up.URL() + `, api_key: sk-upstream-SECRET}
sandbox_tools:
  - sandbox_tool_name: local
    litellm_params: {sandbox_provider: local, pool_size: 0}
litellm_settings:
  callbacks: ["code_interpreter_interception"]
  code_interpreter_interception_params: {max_code_size: 100, max_calls_per_turn: 1}
general_settings:
  master_key: sk-master-SECRET
  client_keys:
    - {name: alice, key: sk-alice-SECRET}
`
	r := start(t, "--config", writeConfig(t, t.TempDir(), cfg))
	big := `{"code":"` + strings.Repeat("x = 1; ", 100) + `"}`
	up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{
		upstreamtest.FunctionCall("python", big),
		upstreamtest.FunctionCall("python", `{"code":"1+1"}`),
	}}, upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("I could not run that.")}})

	req, _ := http.NewRequest(http.MethodPost, r.url+"/v1/responses", strings.NewReader(
		`{"model":"gpt-test","input":"go","tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`))
	req.Header.Set("Authorization", "Bearer sk-alice-SECRET")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	body := string(raw)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if st := gjson.Get(body, `output.#(type=="code_interpreter_call")#.status`).String(); st != `["failed","incomplete"]` {
		t.Errorf("call statuses = %s; want the oversized one failed, the second refused", st)
	}
	reqs := up.Requests()
	if len(reqs) != 2 {
		t.Fatalf("upstream calls = %d", len(reqs))
	}
	var outs []string
	for _, it := range reqs[1].InputItems("function_call_output") {
		outs = append(outs, gjson.GetBytes(it, "output").String())
	}
	if len(outs) != 2 || !strings.Contains(outs[0], "max_code_size") || !strings.Contains(outs[1], "max_calls_per_turn") {
		t.Errorf("the model saw %q", outs)
	}
	if strings.Contains(r.stderr.String(), "SECRET") {
		t.Errorf("a key reached the log:\n%s", r.stderr)
	}
}

// --check starts the local tool's sandbox under its limits and says which isolation it gets.
func TestCheckPrintsIsolation(t *testing.T) {
	path := writeConfig(t, t.TempDir(), configYAML("http://127.0.0.1:9", "m"))
	var stdout, stderr strings.Builder
	code := runOwnDir(t, context.Background(), []string{"--check", "--config", path}, &stdout, &stderr, nil)
	if code != 0 {
		if strings.Contains(stderr.String(), "cannot run on this host") {
			t.Skipf("needs a local sandbox: %s", stderr.String())
		}
		t.Fatalf("--check = %d: %s %s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	if !strings.Contains(out, `sandbox tool "local" (local): `) || !strings.Contains(out, "mode ") || !strings.Contains(out, "seccomp: true") {
		t.Errorf("--check output lacks the isolation line:\n%s", out)
	}
	weak := strings.Contains(out, "limits: rlimit") || strings.Contains(out, "mode non-root") || strings.Contains(out, "mode root-no-cgroups")
	if weak && !strings.Contains(out, "WEAKER ISOLATION") {
		t.Errorf("the weaker mode is not said loudly:\n%s", out)
	}
}
