package router

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2b"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
)

// TestContainerNetworkPolicyE2B: POST /v1/containers on an e2b tool with an operator bound: an
// allowlist inside it is created, sent to e2b as its allow list and shown on the container object
// (create, retrieve, list) with its type and domains; one outside it, and any domain secret (e2b
// cannot add them), is the 400 that names the domain or the backend, and creates nothing.
func TestContainerNetworkPolicyE2B(t *testing.T) {
	emu := e2btest.New(sandboxes.Provider(t))
	t.Cleanup(emu.Close)
	ep, err := e2b.New(e2b.Options{APIKey: emu.APIKey(), APIBase: emu.URL(), SandboxURL: emu.SandboxURL(), HTTPClient: emu.Client(), Tool: "cloud",
		Network: egress.Bound{Policy: egress.Policy{Domains: []string{"pypi.org", "files.pythonhosted.org", "*.example.com"}}}})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "cloud", Provider: ep, Backend: "e2b"})
	if err != nil {
		t.Fatal(err)
	}
	b := &containerBackend{name: "e2b", emu: emu, reg: reg}
	p := b.start(t, containersConfig(withMasterKey, func(*config.Config) {}), t.TempDir(), storetest.NewClock())
	auth := []string{"Authorization", "Bearer " + masterKey}

	status, _, body := p.do(t, http.MethodPost, "/v1/containers", `{"name":"n","network_policy":{"type":"allowlist","allowed_domains":["pypi.org","API.example.com"]}}`, auth...)
	const shown = `{"type":"allowlist","allowed_domains":["pypi.org","api.example.com"]}`
	if status != 200 || gjson.GetBytes(body, "network_policy").Raw != shown {
		t.Fatalf("create %d %s; want the container with network_policy %s", status, body, shown)
	}
	id := gjson.GetBytes(body, "id").String()
	if _, _, got := p.do(t, http.MethodGet, "/v1/containers/"+id, "", auth...); gjson.GetBytes(got, "network_policy").Raw != shown {
		t.Errorf("retrieve %s; want network_policy %s", got, shown)
	}
	if _, _, got := p.do(t, http.MethodGet, "/v1/containers", "", auth...); gjson.GetBytes(got, "data.0.network_policy").Raw != shown {
		t.Errorf("list %s; want network_policy %s", got, shown)
	}
	req, _ := emu.LastRequest("POST /sandboxes")
	if !strings.Contains(string(req.Body), `"network":{"allowOut":["pypi.org","api.example.com"],"denyOut":["0.0.0.0/0"]}`) {
		t.Errorf("e2b create body %s; want the allow list with all else denied", req.Body)
	}
	creates := emu.Creates()
	for _, tc := range []struct{ policy, param, says string }{
		{`{"type":"allowlist","allowed_domains":["pypi.org","evil.com"]}`, "network_policy.allowed_domains[1]", "'evil.com'"},
		{`{"type":"allowlist","allowed_domains":["api.example.com"],"domain_secrets":[{"domain":"api.example.com","name":"K","value":"s3cret"}]}`, "network_policy.domain_secrets", "e2b backend"},
	} {
		status, _, body := p.do(t, http.MethodPost, "/v1/containers", `{"name":"x","network_policy":`+tc.policy+`}`, auth...)
		if status != 400 || gjson.GetBytes(body, "error.param").String() != tc.param || !strings.Contains(string(body), tc.says) || strings.Contains(string(body), "s3cret") {
			t.Errorf("create with %s: %d %s; want the 400 at %s saying %s", tc.policy, status, body, tc.param, tc.says)
		}
	}
	if emu.Creates() != creates {
		t.Errorf("a refused policy created %d sandboxes", emu.Creates()-creates)
	}
}
