package intercept

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestNetworkPolicyNarrowed: a request's network_policy, on code_interpreter's auto container or
// the shell tool's container_auto, is narrowed to the tool's bound before anything is asked of the
// upstream: a domain outside is the 400 at its param, and what is granted reaches the container
// and the model's function descriptions (never a secret's value).
func TestNetworkPolicyNarrowed(t *testing.T) {
	bound := &egress.Bound{Policy: egress.Policy{Domains: []string{"pypi.org", "files.pythonhosted.org", "*.example.com"}}}
	ci := func(np string) string {
		return `{"model":"gpt-test","input":"x","tools":[{"type":"code_interpreter","container":{"type":"auto","network_policy":` + np + `}}]}`
	}
	shell := func(np string) string {
		return `{"model":"gpt-test","input":"x","tools":[{"type":"shell","environment":{"type":"container_auto","network_policy":` + np + `}}]}`
	}
	for _, tc := range []struct {
		name, body string
		bound      *egress.Bound
		param      string // of the 400; "" when served
		domains    []string
		note       string // in the descriptions when served
	}{
		{name: "allowed", body: ci(`{"type":"allowlist","allowed_domains":["pypi.org","files.pythonhosted.org"]}`), bound: bound,
			domains: []string{"pypi.org", "files.pythonhosted.org"}, note: "pip install works"},
		{name: "shell allowed", body: shell(`{"type":"allowlist","allowed_domains":["api.example.com"],"domain_secrets":[{"domain":"api.example.com","name":"API_KEY","value":"s3cret-value"}]}`), bound: bound,
			domains: []string{"api.example.com"}, note: "$API_KEY"},
		{name: "outside", body: ci(`{"type":"allowlist","allowed_domains":["pypi.org","evil.com"]}`), bound: bound,
			param: "tools[0].container.network_policy.allowed_domains[1]"},
		{name: "shell outside", body: shell(`{"type":"allowlist","allowed_domains":["example.com"]}`), bound: bound,
			param: "tools[0].environment.network_policy.allowed_domains[0]"},
		{name: "no network in the tool", body: ci(`{"type":"allowlist","allowed_domains":["pypi.org"]}`),
			param: "tools[0].container.network_policy"},
		{name: "disabled", body: ci(`{"type":"disabled"}`), bound: bound, note: noInternet},
		{name: "default allowlist", body: ci(`null`), bound: &egress.Bound{Policy: bound.Policy, Default: true},
			domains: bound.Policy.Domains, note: "*.example.com"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.fake.network = tc.bound
			if tc.param == "" {
				first := call("print(1)")
				if strings.Contains(tc.body, `"shell"`) {
					first = shellCall("echo 1")
				}
				h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{first}}, text("ok"))
			}
			status, resp := h.post(tc.body, "k1")
			if tc.param != "" {
				if status != 400 || gjson.GetBytes(resp, "error.param").String() != tc.param || len(h.up.Requests()) != 0 || h.fake.Created() != 0 {
					t.Fatalf("answer %d %s, %d upstream requests, %d containers; want the 400 at %s and nothing done", status, resp, len(h.up.Requests()), h.fake.Created(), tc.param)
				}
				return
			}
			if status != 200 {
				t.Fatalf("status %d: %s", status, resp)
			}
			reqs := h.up.Requests()
			if len(reqs) == 0 {
				t.Fatal("no upstream request")
			}
			tools := string(reqs[0].Body)
			if !strings.Contains(tools, tc.note) || strings.Contains(tools, "s3cret-value") {
				t.Errorf("upstream tools %s; want the note %q and no secret", tools, tc.note)
			}
			if tc.note != noInternet && strings.Contains(tools, noInternet) {
				t.Errorf("upstream tools still say %q: %s", noInternet, tools)
			}
			if h.fake.Created() != 1 {
				t.Fatalf("%d containers created; want 1", h.fake.Created())
			}
			if got := h.fake.created[0].Network.Domains; strings.Join(got, ",") != strings.Join(tc.domains, ",") {
				t.Errorf("container given domains %q; want %q", got, tc.domains)
			}
			if strings.Contains(string(resp), "s3cret-value") {
				t.Errorf("the response holds the secret: %s", resp)
			}
			if d := gjson.GetBytes(resp, "tools.0.environment.network_policy.allowed_domains.0").String(); strings.Contains(tc.name, "shell") && d != tc.domains[0] {
				t.Errorf("echoed tools %s; want the policy echoed without its secrets", gjson.GetBytes(resp, "tools"))
			}
		})
	}
}
