package e2b_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2b"
	"github.com/ciproxy/ciproxy/internal/settings"
)

// TestCreateNetwork: a container's policy becomes e2b's create fields: an allowlist is
// network.allowOut with every other destination denied; a request that asked for no network gets
// none even where the operator turned the internet on; one that asked nothing gets the operator's
// switch. The emulator keeps what was sent and shows it in the sandbox's detail, as e2b does.
func TestCreateNetwork(t *testing.T) {
	for _, tc := range []struct {
		name         string
		operatorOpen bool
		opts         sandbox.CreateOptions
		internet     bool
		network      string // the create body's network, "" when absent
	}{
		{name: "allowlist", opts: sandbox.CreateOptions{NetworkPolicy: &egress.Policy{Domains: []string{"pypi.org"}},
			Network: egress.Policy{Domains: []string{"pypi.org", "*.pythonhosted.org"}}},
			internet: true, network: `{"allowOut":["pypi.org","*.pythonhosted.org"],"denyOut":["0.0.0.0/0"]}`},
		{name: "disabled asked, internet on", operatorOpen: true, opts: sandbox.CreateOptions{NetworkPolicy: &egress.Policy{}}},
		{name: "nothing asked, internet on", operatorOpen: true, internet: true},
		{name: "nothing asked, internet off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, srv := newEnv(t)
			p := provider(t, srv, func(o *e2b.Options) { o.AllowInternetAccess = tc.operatorOpen })
			h, err := p.Create(context.Background(), tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			req, _ := srv.LastRequest("POST /sandboxes")
			var body struct {
				Internet bool            `json:"allow_internet_access"`
				Network  json.RawMessage `json:"network"`
			}
			if err := json.Unmarshal(req.Body, &body); err != nil {
				t.Fatal(err)
			}
			if body.Internet != tc.internet || string(body.Network) != tc.network {
				t.Errorf("create sent allow_internet_access %v, network %s; want %v, %s", body.Internet, body.Network, tc.internet, tc.network)
			}
			detail := getDetail(t, srv.URL(), srv.APIKey(), h.ID)
			if got := string(detail["network"]); (tc.network == "") != (got == "") || !strings.Contains(got, strings.TrimSuffix(strings.TrimPrefix(tc.network, "{"), "}")) {
				t.Errorf("sandbox detail network %s; want what was sent, %s", got, tc.network)
			}
		})
	}
}

func getDetail(t *testing.T, base, key, id string) map[string]json.RawMessage {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/sandboxes/"+id, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]json.RawMessage
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("sandbox detail %s: %v", b, err)
	}
	return out
}

// TestNetworkSettings: the operator's bound is read with the other settings; the whole internet
// and a bound together, or domain secrets (which e2b cannot add), are configuration errors.
func TestNetworkSettings(t *testing.T) {
	for _, tc := range []struct{ src, err string }{
		{"{api_key: k, allowed_domains: [pypi.org, '*.example.com'], default_network_policy: allowlist}", ""},
		{"{api_key: k, allow_internet_access: true, allowed_domains: [pypi.org]}", "set it or allowed_domains, not both"},
		{"{api_key: k, allowed_domains: [api.example.com], domain_secrets: [{domain: api.example.com, name: K, value: v}]}", "cannot be given domain secrets"},
		{"{api_key: k, allowed_domains: ['10.0.0.1']}", "is an IP address"},
		{"{api_key: k, default_network_policy: open}", "is not disabled or allowlist"},
	} {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(tc.src), &doc); err != nil {
			t.Fatal(err)
		}
		d := settings.NewDecoder(func(string) (string, bool) { return "", false })
		s := e2b.DecodeSettings(d.Map(doc.Content[0], "p", "p", e2b.Keys(), nil))
		err := d.Err("c.yaml")
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.src, err)
		case tc.err == "" && (strings.Join(s.Network.Policy.Domains, ",") != "pypi.org,*.example.com" || !s.Network.Default):
			t.Errorf("%s: bound %+v", tc.src, s.Network)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v; want %q", tc.src, err, tc.err)
		}
	}
	p, err := e2b.New(e2b.Options{APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if p.DomainSecrets() {
		t.Error("the e2b provider says it can add domain secrets")
	}
}
