package containers

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// netProvider is a recProvider that enforces network policies within a bound.
type netProvider struct {
	*recProvider
	bound   egress.Bound
	secrets bool
}

func (p *netProvider) NetworkBound() egress.Bound { return p.bound }
func (p *netProvider) DomainSecrets() bool        { return p.secrets }

func newNetFixture(t *testing.T, bound egress.Bound, secrets bool) (*fixture, *netProvider) {
	t.Helper()
	f := newFixture(t)
	np := &netProvider{recProvider: f.p, bound: bound, secrets: secrets}
	reg, err := sandbox.NewRegistry(nil, sandbox.RegistryEntry{Name: "net", Provider: np, Backend: "rec", HostBound: true})
	if err != nil {
		t.Fatal(err)
	}
	f.reg = reg
	return f, np
}

// TestCreateNetworkPolicy: what a container is given is the request's policy narrowed to the
// tool's bound; its record and Info show the type and domains, never a secret; what the bound
// does not cover is a NetworkError and creates nothing.
func TestCreateNetworkPolicy(t *testing.T) {
	bound := egress.Bound{Policy: egress.Policy{
		Domains: []string{"pypi.org", "files.pythonhosted.org", "*.example.com"},
		Secrets: []egress.Secret{{Domain: "api.example.com", Name: "OP_KEY", Value: "operator-secret"}},
	}}
	for _, tc := range []struct {
		name        string
		bound       egress.Bound
		secrets     bool
		asked       *egress.Policy
		wantDomains []string // what the provider is given
		wantSecrets []string // names given to the provider
		shown       string   // the record's network_policy as JSON; "" for none
		field       string   // a NetworkError's field; "-" for success
	}{
		{name: "none asked, default disabled", bound: bound, asked: nil, shown: "", field: "-"},
		{name: "none asked, default allowlist", bound: egress.Bound{Policy: bound.Policy, Default: true}, asked: nil,
			wantDomains: bound.Policy.Domains, wantSecrets: []string{"OP_KEY"},
			shown: `{"type":"allowlist","allowed_domains":["pypi.org","files.pythonhosted.org","*.example.com"]}`, field: "-"},
		{name: "disabled", bound: bound, asked: &egress.Policy{}, shown: `{"type":"disabled"}`, field: "-"},
		{name: "narrowed", bound: bound, secrets: true,
			asked:       &egress.Policy{Domains: []string{"PyPI.org.", "api.example.com"}, Secrets: []egress.Secret{{Domain: "api.example.com", Name: "KEY", Value: "client-secret"}}},
			wantDomains: []string{"pypi.org", "api.example.com"}, wantSecrets: []string{"KEY", "OP_KEY"},
			shown: `{"type":"allowlist","allowed_domains":["pypi.org","api.example.com"]}`, field: "-"},
		{name: "outside the bound", bound: bound, asked: &egress.Policy{Domains: []string{"pypi.org", "evil.com"}}, field: "allowed_domains[1]"},
		{name: "wider wildcard", bound: bound, asked: &egress.Policy{Domains: []string{"*.com"}}, field: "allowed_domains[0]"},
		{name: "no bound", asked: &egress.Policy{Domains: []string{"pypi.org"}}, field: ""},
		{name: "secrets unsupported", bound: bound, secrets: false,
			asked: &egress.Policy{Domains: []string{"pypi.org"}, Secrets: []egress.Secret{{Domain: "pypi.org", Name: "K", Value: "v"}}}, field: "domain_secrets"},
		{name: "secret outside the request's domains", bound: bound, secrets: true,
			asked: &egress.Policy{Domains: []string{"pypi.org"}, Secrets: []egress.Secret{{Domain: "api.example.com", Name: "K", Value: "v"}}}, field: "domain_secrets[0].domain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, np := newNetFixture(t, tc.bound, tc.secrets)
			ctx := context.Background()
			_, checkErr := f.s.CheckNetwork(ctx, "net", tc.asked)
			c, err := f.s.Create(ctx, "net", "alice", sandbox.CreateOptions{NetworkPolicy: tc.asked}, time.Minute)
			if tc.field != "-" {
				var ne *sandbox.NetworkError
				if !errors.As(err, &ne) || ne.Field != tc.field || !errors.As(checkErr, &ne) {
					t.Fatalf("Create = %v, CheckNetwork = %v; want a NetworkError about %q from both", err, checkErr, tc.field)
				}
				if np.creates != 0 {
					t.Errorf("%d sandboxes created for a refused policy", np.creates)
				}
				return
			}
			if err != nil || checkErr != nil {
				t.Fatalf("Create = %v, CheckNetwork = %v", err, checkErr)
			}
			defer f.s.Release(ctx, c)
			got := np.lastCreate.Network
			var names []string
			for _, s := range got.Secrets {
				names = append(names, s.Name)
			}
			if !slices.Equal(got.Domains, tc.wantDomains) || !slices.Equal(names, tc.wantSecrets) {
				t.Errorf("provider given domains %q, secrets %q; want %q, %q", got.Domains, names, tc.wantDomains, tc.wantSecrets)
			}
			rec := f.record(t, "alice", c.ID())
			raw, _ := json.Marshal(rec)
			shown := ""
			if rec.Network != nil {
				b, _ := json.Marshal(rec.Network)
				shown = string(b)
			}
			if info := c.Info(); shown != tc.shown || (info.Network == nil) != (tc.shown == "") {
				t.Errorf("recorded network_policy %s, Info %v; want %s", shown, info.Network, tc.shown)
			}
			if strings.Contains(string(raw), "secret") || strings.Contains(string(raw), "KEY") {
				t.Errorf("the record holds a secret: %s", raw)
			}
		})
	}
}
