package egress

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/ciproxy/ciproxy/internal/settings"
)

// decode reads src as a tool's litellm_params, with env as the environment.
func decode(t *testing.T, src string, env map[string]string) (Bound, *settings.Errors) {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	d := settings.NewDecoder(func(name string) (string, bool) { v, ok := env[name]; return v, ok })
	b := DecodeSettings(d.Map(doc.Content[0], "p", "p", Keys(), nil))
	err := d.Err("c.yaml")
	if err == nil {
		return b, nil
	}
	var errs *settings.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Err = %T %v; want *settings.Errors", err, err)
	}
	return b, errs
}

func TestDecodeSettingsAllowedDomains(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		want []string
	}{
		{"absent", "{}", nil},
		{"null", "allowed_domains: null", nil},
		{"empty", "allowed_domains: []", nil},
		{"flow list", "allowed_domains: [pypi.org, '*.example.com']", []string{"pypi.org", "*.example.com"}},
		{"block list canonicalised", "allowed_domains:\n  - PyPI.org.\n  - '*.Example.COM'\n", []string{"pypi.org", "*.example.com"}},
		{"from the environment", "allowed_domains: [os.environ/DOMAIN]", []string{"files.example.com"}},
	} {
		b, errs := decode(t, tc.src, map[string]string{"DOMAIN": "files.example.com"})
		if errs != nil {
			t.Errorf("%s: %v", tc.name, errs)
			continue
		}
		if !reflect.DeepEqual(b.Policy.Domains, tc.want) {
			t.Errorf("%s: Domains = %q; want %q", tc.name, b.Policy.Domains, tc.want)
		}
		if b.Default || len(b.Policy.Secrets) != 0 {
			t.Errorf("%s: bound %+v; want no default and no secrets", tc.name, b)
		}
	}
}

func TestDecodeSettingsBadDomain(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		line int
		msg  string
		want []string
	}{
		{
			name: "IP address in a flow list",
			src:  "allowed_domains: [pypi.org, '10.0.0.1']",
			line: 1, msg: `p.allowed_domains: "10.0.0.1" is an IP address`,
			want: []string{"pypi.org"},
		},
		{
			name: "bad name in a block list",
			src:  "default_network_policy: allowlist\nallowed_domains:\n  - pypi.org\n  - bad_name.com\n  - '*.example.com'\n",
			line: 4, msg: `p.allowed_domains: "bad_name.com" is not a domain name`,
			want: []string{"pypi.org", "*.example.com"},
		},
		{
			name: "bare wildcard",
			src:  "allowed_domains:\n  - '*'\n",
			line: 2, msg: `p.allowed_domains: "*" is not a domain name`,
			want: nil,
		},
	} {
		b, errs := decode(t, tc.src, nil)
		if errs == nil {
			t.Errorf("%s: no error; want %q at line %d", tc.name, tc.msg, tc.line)
			continue
		}
		if len(errs.Problems) != 1 {
			t.Errorf("%s: problems %+v; want one", tc.name, errs.Problems)
			continue
		}
		if p := errs.Problems[0]; p.Line != tc.line || !strings.HasPrefix(p.Msg, tc.msg) {
			t.Errorf("%s: problem %d: %q; want %d: %q", tc.name, p.Line, p.Msg, tc.line, tc.msg)
		}
		if !reflect.DeepEqual(b.Policy.Domains, tc.want) {
			t.Errorf("%s: Domains = %q; want %q (the bad one left out)", tc.name, b.Policy.Domains, tc.want)
		}
	}
}

// Items StringList gives no value for (null, a variable that is not set) do not shift the line a
// later bad domain is reported at.
func TestDecodeSettingsBadDomainLines(t *testing.T) {
	b, errs := decode(t, `allowed_domains:
  - os.environ/UNSET
  - ~
  - pypi.org
  - os.environ/BAD
  - '*.example.com'
  - -bad.example.com
`, map[string]string{"BAD": "10.0.0.1"})
	var got []string
	if errs != nil {
		for _, p := range errs.Problems {
			got = append(got, fmt.Sprintf("%d: %s", p.Line, p.Msg))
		}
	}
	want := []string{
		"3: p.allowed_domains[1]: must not be empty",
		`5: p.allowed_domains: "10.0.0.1" is an IP address; name a domain`,
		`7: p.allowed_domains: "-bad.example.com" is not a domain name`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !reflect.DeepEqual(b.Policy.Domains, []string{"pypi.org", "*.example.com"}) {
		t.Errorf("Domains = %q; want pypi.org and *.example.com", b.Policy.Domains)
	}
}

func TestDecodeSettingsDomainSecrets(t *testing.T) {
	const domains = "allowed_domains: [pypi.org, '*.example.com']\n"
	b, errs := decode(t, domains+`domain_secrets:
  - {domain: PyPI.org, name: PYPI_TOKEN, value: pypi-value}
  - {domain: api.example.com, name: _API, value: os.environ/API_KEY}
  - {domain: '*.example.com', name: Wild1, value: wild-value}
`, map[string]string{"API_KEY": "api-value"})
	if errs != nil {
		t.Fatal(errs)
	}
	want := []Secret{
		{Domain: "pypi.org", Name: "PYPI_TOKEN", Value: "pypi-value"},
		{Domain: "api.example.com", Name: "_API", Value: "api-value"},
		{Domain: "*.example.com", Name: "Wild1", Value: "wild-value"},
	}
	if !reflect.DeepEqual(b.Policy.Secrets, want) {
		t.Errorf("Secrets = %+v; want %+v", b.Policy.Secrets, want)
	}

	const value = "s3cr3t-VALUE-do-not-show"
	for _, tc := range []struct {
		name string
		item string
		msg  string
	}{
		{"domain not in allowed_domains", "{domain: evil.org, name: K, value: " + value + "}", `p.domain_secrets[0].domain: "evil.org" is not in allowed_domains`},
		{"apex of a wildcard", "{domain: example.com, name: K, value: " + value + "}", `p.domain_secrets[0].domain: "example.com" is not in allowed_domains`},
		{"below an exact domain", "{domain: files.pypi.org, name: K, value: " + value + "}", `p.domain_secrets[0].domain: "files.pypi.org" is not in allowed_domains`},
		{"wildcard over an exact domain", "{domain: '*.pypi.org', name: K, value: " + value + "}", `p.domain_secrets[0].domain: "*.pypi.org" is not in allowed_domains`},
		{"bad domain", "{domain: '10.0.0.1', name: K, value: " + value + "}", `p.domain_secrets[0].domain: "10.0.0.1" is an IP address`},
		{"no domain", "{name: K, value: " + value + "}", `p.domain_secrets[0].domain: "" is not a domain name`},
		{"name starting with a digit", "{domain: pypi.org, name: 1K, value: " + value + "}", `p.domain_secrets[0].name: "1K" is not a secret name`},
		{"name with a hyphen", "{domain: pypi.org, name: A-B, value: " + value + "}", `p.domain_secrets[0].name: "A-B" is not a secret name`},
		{"name too long", "{domain: pypi.org, name: " + strings.Repeat("N", 129) + ", value: " + value + "}", `p.domain_secrets[0].name: "` + strings.Repeat("N", 129) + `" is not a secret name`},
		{"no name", "{domain: pypi.org, value: " + value + "}", `p.domain_secrets[0].name: "" is not a secret name`},
		{"empty value", "{domain: pypi.org, name: K, value: ''}", `p.domain_secrets[0].value: must not be empty`},
		{"no value", "{domain: pypi.org, name: K}", `p.domain_secrets[0].value: must not be empty`},
		{"value from an unset variable", "{domain: pypi.org, name: K, value: os.environ/UNSET}", `p.domain_secrets[0].value: must not be empty`},
	} {
		b, errs := decode(t, domains+"domain_secrets:\n  - "+tc.item+"\n", nil)
		if errs == nil {
			t.Errorf("%s: no error; want %q", tc.name, tc.msg)
			continue
		}
		if len(errs.Problems) != 1 {
			t.Errorf("%s: problems %+v; want one", tc.name, errs.Problems)
			continue
		}
		if p := errs.Problems[0]; p.Line != 3 || !strings.HasPrefix(p.Msg, tc.msg) {
			t.Errorf("%s: problem %d: %q; want 3: %q", tc.name, p.Line, p.Msg, tc.msg)
		}
		if strings.Contains(errs.Error(), value) {
			t.Errorf("%s: error %q holds the secret's value", tc.name, errs)
		}
		if len(b.Policy.Secrets) != 0 {
			t.Errorf("%s: Secrets = %+v; want the bad one left out", tc.name, b.Policy.Secrets)
		}
		if !reflect.DeepEqual(b.Policy.Domains, []string{"pypi.org", "*.example.com"}) {
			t.Errorf("%s: Domains = %q; want them unchanged", tc.name, b.Policy.Domains)
		}
	}

	// A bad entry is left out and the good ones around it are kept, each problem on its own line.
	b, errs = decode(t, domains+`domain_secrets:
  - {domain: pypi.org, name: GOOD1, value: good-1}
  - {domain: evil.org, name: BAD, value: `+value+`}
  - {domain: pypi.org, name: GOOD2, value: good-2}
  - domain: pypi.org
    name: bad-name
    value: `+value+`
`, nil)
	if errs == nil || len(errs.Problems) != 2 || errs.Problems[0].Line != 4 || errs.Problems[1].Line != 6 {
		t.Errorf("mixed domain_secrets: errors %v; want one at line 4 and one at line 6", errs)
	} else if strings.Contains(errs.Error(), value) {
		t.Errorf("mixed domain_secrets: error %q holds the secret's value", errs)
	}
	if got := b.Policy.Secrets; len(got) != 2 || got[0].Name != "GOOD1" || got[1].Name != "GOOD2" {
		t.Errorf("mixed domain_secrets: Secrets = %+v; want GOOD1 and GOOD2", got)
	}

	// Secrets with no allowed_domains at all, or domain_secrets that is not a list.
	for _, tc := range []struct{ src, msg string }{
		{"domain_secrets: [{domain: pypi.org, name: K, value: " + value + "}]", `"pypi.org" is not in allowed_domains`},
		{"allowed_domains: ['10.0.0.1']\ndomain_secrets: [{domain: '10.0.0.1', name: K, value: " + value + "}]", "is an IP address"},
		{domains + "domain_secrets: {domain: pypi.org, name: K, value: " + value + "}", "p.domain_secrets: must be a list of {domain, name, value}"},
		{domains + "domain_secrets: " + value, "p.domain_secrets: must be a list of {domain, name, value}"},
		{domains + "domain_secrets: [{domain: pypi.org, name: K, value: " + value + ", extra: 1}]", `unknown key "extra"`},
	} {
		b, errs := decode(t, tc.src, nil)
		if errs == nil || !strings.Contains(errs.Error(), tc.msg) {
			t.Errorf("%s: error %v; want %q", tc.src, errs, tc.msg)
			continue
		}
		if strings.Contains(errs.Error(), value) {
			t.Errorf("%s: error %q holds the secret's value", tc.src, errs)
		}
		if strings.Contains(tc.msg, "must be a list") && len(b.Policy.Secrets) != 0 {
			t.Errorf("%s: Secrets = %+v; want none", tc.src, b.Policy.Secrets)
		}
	}
}

func TestDecodeSettingsDefaultNetworkPolicy(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want bool
		msg  string
	}{
		{"{}", false, ""},
		{"default_network_policy: null", false, ""},
		{"default_network_policy: disabled", false, ""},
		{"default_network_policy: allowlist", true, ""},
		{"default_network_policy: os.environ/POLICY", true, ""},
		{"default_network_policy: open", false, `c.yaml:1: p.default_network_policy: "open" is not disabled or allowlist`},
		{"default_network_policy: Allowlist", false, `c.yaml:1: p.default_network_policy: "Allowlist" is not disabled or allowlist`},
		{"default_network_policy: ''", false, `c.yaml:1: p.default_network_policy: "" is not disabled or allowlist`},
		{"default_network_policy: os.environ/OTHER", false, `c.yaml:1: p.default_network_policy: "everything" (from OTHER) is not disabled or allowlist`},
	} {
		b, errs := decode(t, tc.src, map[string]string{"POLICY": "allowlist", "OTHER": "everything"})
		switch {
		case tc.msg == "" && errs != nil:
			t.Errorf("%s: %v", tc.src, errs)
		case tc.msg != "" && (errs == nil || errs.Error() != tc.msg):
			t.Errorf("%s: error %v; want %q", tc.src, errs, tc.msg)
		}
		if b.Default != tc.want {
			t.Errorf("%s: Default = %v; want %v", tc.src, b.Default, tc.want)
		}
	}
}

func TestCheckSecretName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"K", true},
		{"_", true},
		{"API_KEY_2", true},
		{"lower", true},
		{strings.Repeat("A", 128), true},
		{strings.Repeat("A", 129), false},
		{"", false},
		{"2KEY", false},
		{"A-B", false},
		{"A B", false},
		{"$KEY", false},
		{"KÉY", false},
	} {
		if err := CheckSecretName(tc.name); (err == nil) != tc.ok {
			t.Errorf("CheckSecretName(%q) = %v; want ok %v", tc.name, err, tc.ok)
		}
	}
}
