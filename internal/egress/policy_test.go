package egress

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, host string
		want          bool
	}{
		{"example.com", "example.com", true},
		{"example.com", "a.example.com", false},
		{"example.com", "example.org", false},
		{"example.com", "badexample.com", false},
		{"a.example.com", "example.com", false},
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "a.b.example.com", true},
		{"*.example.com", "example.com", false},
		{"*.example.com", "badexample.com", false},
		{"*.example.com", ".example.com", false},
		{"*.example.com", "example.com.evil.org", false},
		{"*.example.com", "a.example.org", false},
	} {
		if got := Match(tc.pattern, tc.host); got != tc.want {
			t.Errorf("Match(%q, %q) = %v; want %v", tc.pattern, tc.host, got, tc.want)
		}
	}
}

func TestCanonical(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"example.com", "example.com"},
		{"Example.COM", "example.com"},
		{"example.com.", "example.com"},
		{"API.Example.Com.", "api.example.com"},
		{"*.Example.com.", "*.example.com"},
	} {
		if got := Canonical(tc.in); got != tc.want {
			t.Errorf("Canonical(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}
}

func TestAllows(t *testing.T) {
	p := Policy{Domains: []string{"pypi.org", "*.example.com"}}
	for _, tc := range []struct {
		host string
		want bool
	}{
		{"pypi.org", true},
		{"PyPI.org", true},
		{"pypi.org.", true},
		{"PYPI.ORG.", true},
		{"files.pypi.org", false},
		{"pypi.org.evil.com", false},
		{"a.example.com", true},
		{"A.Example.Com.", true},
		{"a.b.example.com", true},
		{"example.com", false},
		{"example.com.", false},
		{"badexample.com", false},
		{"", false},
	} {
		if got := p.Allows(tc.host); got != tc.want {
			t.Errorf("Allows(%q) = %v; want %v", tc.host, got, tc.want)
		}
	}
	var none Policy
	if none.Open() || none.Allows("pypi.org") {
		t.Error("the zero Policy lets something out")
	}
	if !p.Open() {
		t.Error("a Policy with domains is not Open")
	}
}

func TestCheckPattern(t *testing.T) {
	label63 := strings.Repeat("a", 63)
	name253 := strings.Repeat("a", 61) + "." + label63 + "." + label63 + "." + label63 // 61+1+63+1+63+1+63
	if len(name253) != 253 {
		t.Fatalf("name253 is %d long", len(name253))
	}
	name254 := "a" + name253
	for _, tc := range []struct {
		in   string
		want string // "" for valid, otherwise a substring of the error
	}{
		{"example.com", ""},
		{"pypi.org", ""},
		{"a-b.example.com", ""},
		{"x1.example.com", ""},
		{"localhost", ""},
		{"Example.COM", ""},
		{"example.com.", ""},
		{"*.example.com", ""},
		{"*.Example.com.", ""},
		{label63 + ".com", ""},
		{name253, ""},
		{"*." + name253, ""},

		{"10.0.0.1", "is an IP address"},
		{"127.0.0.1", "is an IP address"},
		{"10.0.0.1.", "is an IP address"},
		{"*.10.0.0.1", "is an IP address"},
		{"::1", "is not a domain name"},
		{"2001:db8::1", "is not a domain name"},
		{"[::1]", "is not a domain name"},
		{"[2001:db8::1]", "is not a domain name"},
		{"", "is not a domain name"},
		{".", "is not a domain name"},
		{"*.", "is not a domain name"},
		{"*", "is not a domain name"},
		{"*.*.example.com", "is not a domain name"},
		{"a.*.com", "is not a domain name"},
		{"*example.com", "is not a domain name"},
		{"a..com", "is not a domain name"},
		{".example.com", "is not a domain name"},
		{"example.com..", "is not a domain name"},
		{strings.Repeat("a", 64) + ".com", "is not a domain name"},
		{name254, "is not a domain name"},
		{"-a.example.com", "is not a domain name"},
		{"a-.example.com", "is not a domain name"},
		{"a.example-", "is not a domain name"},
		{"_dmarc.example.com", "is not a domain name"},
		{"a_b.example.com", "is not a domain name"},
		{"example.com:443", "is not a domain name"},
		{"a b.com", "is not a domain name"},
		{"http://example.com", "is not a domain name"},
		{"exämple.com", "is not a domain name"},
	} {
		err := CheckPattern(tc.in)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckPattern(%q) = %v; want nil", tc.in, err)
		case tc.want != "" && err == nil:
			t.Errorf("CheckPattern(%q) = nil; want an error containing %q", tc.in, tc.want)
		case tc.want != "" && !strings.Contains(err.Error(), tc.want):
			t.Errorf("CheckPattern(%q) = %v; want an error containing %q", tc.in, err, tc.want)
		case tc.want != "" && !strings.Contains(err.Error(), strconv.Quote(tc.in)):
			t.Errorf("CheckPattern(%q) = %v; want it to name the pattern", tc.in, err)
		}
	}
}

func TestSecretsFor(t *testing.T) {
	api := Secret{Domain: "api.example.com", Name: "API", Value: "v-api"}
	wild := Secret{Domain: "*.example.com", Name: "WILD", Value: "v-wild"}
	pypi := Secret{Domain: "pypi.org", Name: "PYPI", Value: "v-pypi"}
	p := Policy{Domains: []string{"api.example.com", "*.example.com", "pypi.org"}, Secrets: []Secret{api, wild, pypi}}
	for _, tc := range []struct {
		host string
		want []Secret
	}{
		{"api.example.com", []Secret{api, wild}},
		{"API.Example.com.", []Secret{api, wild}},
		{"other.example.com", []Secret{wild}},
		{"example.com", nil},
		{"pypi.org", []Secret{pypi}},
		{"files.pypi.org", nil},
		{"api.example.com.evil.org", nil},
		{"badexample.com", nil},
	} {
		if got := p.SecretsFor(tc.host); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("SecretsFor(%q) = %+v; want %+v", tc.host, got, tc.want)
		}
	}
}

func TestNarrowWithin(t *testing.T) {
	bound := Policy{Domains: []string{"pypi.org", "*.example.com", "api.other.org"}}
	for _, tc := range []struct {
		name    string
		domains []string
		want    []string
	}{
		{"nothing", nil, []string{}},
		{"exact", []string{"pypi.org"}, []string{"pypi.org"}},
		{"exact canonicalised", []string{"PyPI.org."}, []string{"pypi.org"}},
		{"exact under wildcard", []string{"api.example.com"}, []string{"api.example.com"}},
		{"deep exact under wildcard", []string{"a.b.example.com"}, []string{"a.b.example.com"}},
		{"same wildcard", []string{"*.example.com"}, []string{"*.example.com"}},
		{"wildcard under parent wildcard", []string{"*.api.example.com"}, []string{"*.api.example.com"}},
		{"several, order kept", []string{"api.other.org", "*.Example.com", "pypi.org"}, []string{"api.other.org", "*.example.com", "pypi.org"}},
	} {
		got, err := bound.Narrow(tc.domains, nil)
		if err != nil {
			t.Errorf("%s: Narrow(%q) error %v", tc.name, tc.domains, err)
			continue
		}
		if !reflect.DeepEqual(got.Domains, tc.want) {
			t.Errorf("%s: Narrow(%q).Domains = %q; want %q", tc.name, tc.domains, got.Domains, tc.want)
		}
		if len(got.Secrets) != 0 {
			t.Errorf("%s: Narrow(%q).Secrets = %+v; want none", tc.name, tc.domains, got.Secrets)
		}
	}
}

func TestNarrowOutside(t *testing.T) {
	bound := Policy{Domains: []string{"pypi.org", "*.example.com", "api.other.org"}}
	for _, tc := range []struct {
		name    string
		domains []string
		outside string
	}{
		{"unknown name", []string{"evil.org"}, "evil.org"},
		{"wildcard's own apex", []string{"example.com"}, "example.com"},
		{"suffix without dot", []string{"badexample.com"}, "badexample.com"},
		{"below an exact name", []string{"files.pypi.org"}, "files.pypi.org"},
		{"wildcard over an exact name", []string{"*.pypi.org"}, "*.pypi.org"},
		{"wildcard over the bound's parent", []string{"*.other.org"}, "*.other.org"},
		{"wildcard broader than the bound's", []string{"*.com"}, "*.com"},
		{"first outside is named", []string{"pypi.org", "Evil.org", "bad.org"}, "Evil.org"},
	} {
		got, err := bound.Narrow(tc.domains, nil)
		var oe *OutsideError
		if !errors.As(err, &oe) {
			t.Errorf("%s: Narrow(%q) = %+v, %v; want an *OutsideError", tc.name, tc.domains, got, err)
			continue
		}
		if oe.Domain != tc.outside {
			t.Errorf("%s: OutsideError.Domain = %q; want %q", tc.name, oe.Domain, tc.outside)
		}
		if !strings.Contains(err.Error(), tc.outside) {
			t.Errorf("%s: error %q does not name %q", tc.name, err, tc.outside)
		}
		if got.Open() || got.Secrets != nil {
			t.Errorf("%s: Narrow returned %+v with its error; want the zero Policy", tc.name, got)
		}
	}
	var none Policy
	if _, err := none.Narrow([]string{"pypi.org"}, nil); !errors.As(err, new(*OutsideError)) {
		t.Errorf("an empty bound narrowed to pypi.org: %v", err)
	}
}

func TestNarrowSecrets(t *testing.T) {
	bound := Policy{
		Domains: []string{"pypi.org", "*.example.com"},
		Secrets: []Secret{
			{Domain: "pypi.org", Name: "PYPI", Value: "bound-pypi"},
			{Domain: "api.example.com", Name: "TOKEN", Value: "bound-api"},
			{Domain: "*.example.com", Name: "WILD", Value: "bound-wild"},
		},
	}
	for _, tc := range []struct {
		name    string
		domains []string
		secrets []Secret
		want    []Secret
	}{
		{
			name:    "bound secret for a kept exact domain only",
			domains: []string{"pypi.org"},
			want:    []Secret{{Domain: "pypi.org", Name: "PYPI", Value: "bound-pypi"}},
		},
		{
			name:    "bound secrets for a domain under a wildcard",
			domains: []string{"api.example.com"},
			want: []Secret{
				{Domain: "api.example.com", Name: "TOKEN", Value: "bound-api"},
				{Domain: "*.example.com", Name: "WILD", Value: "bound-wild"},
			},
		},
		{
			name:    "bound exact secret under a kept wildcard",
			domains: []string{"*.example.com"},
			want: []Secret{
				{Domain: "api.example.com", Name: "TOKEN", Value: "bound-api"},
				{Domain: "*.example.com", Name: "WILD", Value: "bound-wild"},
			},
		},
		{
			name:    "other name under the wildcard drops the exact secret",
			domains: []string{"www.example.com"},
			want:    []Secret{{Domain: "*.example.com", Name: "WILD", Value: "bound-wild"}},
		},
		{
			name:    "request secret canonicalised and before the bound's of the same name",
			domains: []string{"api.example.com"},
			secrets: []Secret{{Domain: "API.example.com.", Name: "TOKEN", Value: "request-api"}},
			want: []Secret{
				{Domain: "api.example.com", Name: "TOKEN", Value: "request-api"},
				{Domain: "api.example.com", Name: "TOKEN", Value: "bound-api"},
				{Domain: "*.example.com", Name: "WILD", Value: "bound-wild"},
			},
		},
		{
			name:    "request secret for a name under its wildcard",
			domains: []string{"*.example.com"},
			secrets: []Secret{{Domain: "www.example.com", Name: "MINE", Value: "request-www"}},
			want: []Secret{
				{Domain: "www.example.com", Name: "MINE", Value: "request-www"},
				{Domain: "api.example.com", Name: "TOKEN", Value: "bound-api"},
				{Domain: "*.example.com", Name: "WILD", Value: "bound-wild"},
			},
		},
	} {
		got, err := bound.Narrow(tc.domains, tc.secrets)
		if err != nil {
			t.Errorf("%s: error %v", tc.name, err)
			continue
		}
		if !reflect.DeepEqual(got.Secrets, tc.want) {
			t.Errorf("%s: Secrets = %+v; want %+v", tc.name, got.Secrets, tc.want)
		}
	}
	// The request's secret is the first one SecretsFor gives, so it is the one that wins.
	p, err := bound.Narrow([]string{"api.example.com"}, []Secret{{Domain: "api.example.com", Name: "TOKEN", Value: "request-api"}})
	if err != nil {
		t.Fatal(err)
	}
	if s := p.SecretsFor("api.example.com"); len(s) == 0 || s[0].Value != "request-api" {
		t.Errorf("SecretsFor after Narrow = %+v; want the request's TOKEN first", s)
	}
	if s := p.SecretsFor("pypi.org"); len(s) != 0 {
		t.Errorf("SecretsFor(pypi.org) after dropping it = %+v; want none", s)
	}
}

func TestNarrowSecretDomainError(t *testing.T) {
	bound := Policy{Domains: []string{"pypi.org", "*.example.com"}}
	for _, tc := range []struct {
		name    string
		domains []string
		secrets []Secret
		bad     string
	}{
		{"no domains at all", nil, []Secret{{Domain: "pypi.org", Name: "K", Value: "secret-1"}}, "pypi.org"},
		{"domain in the bound, not the request", []string{"pypi.org"}, []Secret{{Domain: "api.example.com", Name: "K", Value: "secret-2"}}, "api.example.com"},
		{"wildcard broader than the request's exact name", []string{"api.example.com"}, []Secret{{Domain: "*.example.com", Name: "K", Value: "secret-3"}}, "*.example.com"},
		{"apex of the request's wildcard", []string{"*.example.com"}, []Secret{{Domain: "example.com", Name: "K", Value: "secret-4"}}, "example.com"},
		{"first bad one named", []string{"pypi.org"}, []Secret{{Domain: "pypi.org", Name: "A", Value: "secret-5"}, {Domain: "Evil.org", Name: "B", Value: "secret-6"}}, "Evil.org"},
	} {
		got, err := bound.Narrow(tc.domains, tc.secrets)
		var se *SecretDomainError
		if !errors.As(err, &se) {
			t.Errorf("%s: Narrow = %+v, %v; want a *SecretDomainError", tc.name, got, err)
			continue
		}
		if se.Domain != tc.bad {
			t.Errorf("%s: SecretDomainError.Domain = %q; want %q", tc.name, se.Domain, tc.bad)
		}
		if got.Open() || got.Secrets != nil {
			t.Errorf("%s: Narrow returned %+v with its error; want the zero Policy", tc.name, got)
		}
		for _, s := range tc.secrets {
			if strings.Contains(err.Error(), s.Value) {
				t.Errorf("%s: error %q holds a secret's value", tc.name, err)
			}
		}
	}
}

// TestSecretNotPrinted: however a policy is printed or encoded, the value stays out.
func TestSecretNotPrinted(t *testing.T) {
	p := Policy{Domains: []string{"api.test"}, Secrets: []Secret{{Domain: "api.test", Name: "KEY", Value: "the-value"}}}
	js, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{fmt.Sprint(p), fmt.Sprintf("%+v", p), fmt.Sprintf("%#v", p), fmt.Sprint(&p), string(js)} {
		if strings.Contains(out, "the-value") || !strings.Contains(out, "KEY") {
			t.Errorf("printed as %s", out)
		}
	}
}
