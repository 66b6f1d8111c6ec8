package intercept

import (
	"context"
	"slices"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/store/storetest"
)

// TestInterceptedToolsDecision: which hosted tools a request's model intercepts. The model's
// model_info.intercepted_tools (Request.InterceptedTools) replaces the global tools when set, an
// empty list intercepting nothing; interception must still apply (callbacks, enabled,
// enabled_providers). A tool not intercepted goes upstream as sent, beside the stand-ins of the
// others.
func TestInterceptedToolsDecision(t *testing.T) {
	const both = `{"model":"m","input":"x","tools":[{"type":"code_interpreter","container":{"type":"auto"}},{"type":"shell","environment":{"type":"container_auto"}}]}`
	const shellOnly = `{"model":"m","input":"x","tools":[{"type":"shell","environment":{"type":"container_auto"}}]}`
	cases := []struct {
		name      string
		global    []string // Interception.Tools; nil: as Defaults sets it (both)
		model     []string // Request.InterceptedTools
		providers []string // Interception.EnabledProviders; nil: every provider
		off       bool     // callbacks without code_interpreter_interception
		stateless bool
		body      string
		// intercepted is Plan.Intercepted; code and shell whether the proxy runs each tool;
		// upstream the types (function names for functions) of the tools sent upstream.
		intercepted, code, shell bool
		upstream                 []string
	}{
		{name: "absent: the global tools", body: both, intercepted: true, code: true, shell: true, upstream: []string{"python", "shell"}},
		{name: "code_interpreter only", model: []string{"code_interpreter"}, body: both, intercepted: true, code: true, upstream: []string{"python", "type:shell"}},
		{name: "shell only", model: []string{"shell"}, body: both, intercepted: true, shell: true, upstream: []string{"type:code_interpreter", "shell"}},
		{name: "code_interpreter only, a shell tool alone passes through", model: []string{"code_interpreter"}, body: shellOnly},
		{name: "empty: nothing", model: []string{}, body: both},
		{name: "absent, global code_interpreter only", global: []string{"code_interpreter"}, body: both, intercepted: true, code: true, upstream: []string{"python", "type:shell"}},
		{name: "the model's list replaces the global one", global: []string{"code_interpreter"}, model: []string{"shell"}, body: both, intercepted: true, shell: true, upstream: []string{"type:code_interpreter", "shell"}},
		{name: "global none, the model both", global: []string{}, model: []string{"shell", "code_interpreter"}, body: both, intercepted: true, code: true, shell: true, upstream: []string{"python", "shell"}},
		{name: "provider left out of enabled_providers", model: []string{"shell"}, providers: []string{"hosted_vllm"}, body: both},
		{name: "provider in enabled_providers", model: []string{"shell"}, providers: []string{"openai"}, body: shellOnly, intercepted: true, shell: true, upstream: []string{"shell"}},
		{name: "interception off", model: []string{"shell"}, off: true, body: both},
		{name: "stateless, empty: served, tools as sent", model: []string{}, stateless: true, body: both, intercepted: true, upstream: []string{"type:code_interpreter", "type:shell"}},
	}
	eng := New(Options{Store: storetest.NewMemResponses(nil)})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := activeConfig()
			if tc.global != nil {
				cfg.Interception.Tools = tc.global
			}
			cfg.Interception.EnabledProviders = tc.providers
			if tc.off {
				cfg.Callbacks = nil
			}
			plan, err := eng.Prepare(context.Background(), &Request{Config: cfg, Body: []byte(tc.body), Provider: "openai",
				InterceptedTools: tc.model, Stateless: tc.stateless, Caller: "alice"})
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			if plan.Intercepted != tc.intercepted {
				t.Fatalf("Intercepted = %v; want %v", plan.Intercepted, tc.intercepted)
			}
			if !tc.intercepted {
				return // passed through: the router sends the body as it came
			}
			r := plan.req
			if r.code != tc.code || (r.shellIndex >= 0) != tc.shell {
				t.Errorf("runs code_interpreter %v, shell %v; want %v, %v", r.code, r.shellIndex >= 0, tc.code, tc.shell)
			}
			var sent []string
			gjson.GetBytes(r.base, "tools").ForEach(func(_, tool gjson.Result) bool {
				if typ := tool.Get("type").String(); typ == "function" {
					sent = append(sent, tool.Get("name").String())
				} else {
					sent = append(sent, "type:"+typ)
				}
				return true
			})
			if !slices.Equal(sent, tc.upstream) {
				t.Errorf("tools sent upstream = %v; want %v", sent, tc.upstream)
			}
		})
	}
}
