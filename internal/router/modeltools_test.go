package router

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestModelInterceptedTools: a model whose entry says model_info.intercepted_tools:
// [code_interpreter] passes a shell tool through untouched, while another model, on the global
// tools, intercepts it: its upstream is offered the shell stand-in function instead.
func TestModelInterceptedTools(t *testing.T) {
	up := upstreamtest.New(t)
	cfg := testConfig(up.URL(), func(c *config.Config) {
		c.Interception = config.Defaults().Interception
		c.Callbacks = []string{"code_interpreter_interception"}
		ci := deployment("ci-only", up.URL())
		ci.InterceptedTools = []string{"code_interpreter"}
		c.Models = append(c.Models, ci)
	})
	p := newProxy(t, cfg, func(o *Options) {
		o.Interceptor = intercept.New(intercept.Options{Store: storetest.NewMemResponses(nil)})
	})
	auth := []string{"Authorization", "Bearer alice"}
	const shell = `{"type":"shell","environment":{"type":"container_auto"}}`
	body := func(model string) string {
		return `{"model":"` + model + `","input":"list the files","tools":[` + shell + `]}`
	}

	up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Passed through.")}})
	status, _, got := p.do(t, http.MethodPost, "/v1/responses", body("ci-only"), auth...)
	if status != http.StatusOK || !strings.Contains(string(got), "Passed through.") {
		t.Fatalf("ci-only = %d %s", status, got)
	}
	reqs := up.Requests()
	if len(reqs) != 1 {
		t.Fatalf("ci-only: the upstream got %d requests; want 1", len(reqs))
	}
	if got := reqs[0].ToolNames(); len(got) != 1 || got[0] != "shell" || reqs[0].Tool("shell") == nil {
		t.Errorf("ci-only: tools sent upstream = %v; want the shell tool alone", got)
	} else if sent := compact(t, reqs[0].Tool("shell")); sent != shell {
		t.Errorf("ci-only: the shell tool went upstream as %s; want it as sent, %s", sent, shell)
	}
	if gjson.GetBytes(reqs[0].Body, "tools.0.type").String() != "shell" {
		t.Errorf("ci-only: upstream body tools = %s; want the hosted shell tool", gjson.GetBytes(reqs[0].Body, "tools"))
	}

	up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Intercepted.")}})
	status, _, got = p.do(t, http.MethodPost, "/v1/responses", body("gpt-test"), auth...)
	if status != http.StatusOK || !strings.Contains(string(got), "Intercepted.") {
		t.Fatalf("gpt-test = %d %s", status, got)
	}
	reqs = up.Requests()
	if len(reqs) != 2 {
		t.Fatalf("the upstream got %d requests in all; want 2", len(reqs))
	}
	last := reqs[1]
	if typ := gjson.GetBytes(last.Body, "tools.0.type").String(); typ != "function" {
		t.Errorf("gpt-test: upstream body tools = %s; want the shell stand-in function", gjson.GetBytes(last.Body, "tools"))
	}
	if got := last.ToolNames(); len(got) != 1 || got[0] != config.DefaultShellFunctionName {
		t.Errorf("gpt-test: tools sent upstream = %v; want the %q stand-in alone", got, config.DefaultShellFunctionName)
	}
}

// compact returns raw JSON without insignificant space.
func compact(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
