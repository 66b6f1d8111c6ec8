// Package egress is the only way out of a sandbox: an HTTP proxy that a sandbox's code reaches
// through a listener the backend hands it, which lets a request through only to the domains of the
// sandbox's container's network policy, resolves names itself and refuses private destinations,
// and adds the container's domain secrets to requests for their domain, so that the code never
// holds them. This file is the policy: which names a pattern matches and how a request's policy
// narrows the operator's bound.
package egress

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Policy is one container's network access. The zero value is no network at all.
type Policy struct {
	// Domains are the names the container's code may reach: exact names, or "*.example.com",
	// which matches every name below example.com (a.example.com, a.b.example.com) but not
	// example.com itself.
	Domains []string
	// Secrets are substituted into the headers of requests to their domain. Never stored, logged
	// or shown.
	Secrets []Secret
}

// Secret is one domain secret: "$Name" in a request header to Domain becomes Value.
type Secret struct {
	Domain string // an exact name or a "*." pattern, matched as Policy.Domains are
	Name   string
	Value  string
}

// String, GoString and MarshalJSON show a secret without its value, so that printing or logging
// a policy (or the settings holding one) never writes the value out.
func (s Secret) String() string {
	return fmt.Sprintf("{Domain:%s Name:%s Value:[redacted]}", s.Domain, s.Name)
}

func (s Secret) GoString() string { return "egress.Secret" + s.String() }

func (s Secret) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]string{"domain": s.Domain, "name": s.Name, "value": "[redacted]"})
}

// Open reports whether p lets anything out.
func (p Policy) Open() bool { return len(p.Domains) > 0 }

// Allows reports whether host (a name, not an address) is one of p's domains.
func (p Policy) Allows(host string) bool {
	host = Canonical(host)
	for _, d := range p.Domains {
		if Match(d, host) {
			return true
		}
	}
	return false
}

// SecretsFor returns the secrets to add to a request for host, or nil.
func (p Policy) SecretsFor(host string) []Secret {
	host = Canonical(host)
	var out []Secret
	for _, s := range p.Secrets {
		if Match(s.Domain, host) {
			out = append(out, s)
		}
	}
	return out
}

// Canonical is the form names are compared in: lower case, without a trailing dot.
func Canonical(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// Match reports whether pattern (an exact name or "*.suffix", canonical) matches host
// (canonical). The rule: an exact pattern matches that name alone; "*.example.com" matches any
// name that ends in ".example.com" and has at least one more label, never example.com itself.
func Match(pattern, host string) bool {
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok {
		return strings.HasSuffix(host, suffix) && len(host) > len(suffix)
	}
	return pattern == host
}

// covers reports whether every name pattern p matches is matched by bound pattern b.
func covers(b, p string) bool {
	if !strings.HasPrefix(p, "*.") {
		return Match(b, p)
	}
	// A wildcard is covered by the same wildcard or by one of a parent domain.
	return b == p || (strings.HasPrefix(b, "*.") && strings.HasSuffix(p, b[1:]))
}

// CheckPattern returns why s is not a domain pattern a policy can hold, or nil: a host name of
// letters, digits, hyphens and dots (each label 1 to 63 characters, 253 in all), optionally
// behind "*.", and never an IP address, which egress refuses whatever the policy.
func CheckPattern(s string) error {
	name := Canonical(s)
	name, _ = strings.CutPrefix(name, "*.")
	if name == "" || len(name) > 253 {
		return fmt.Errorf("%q is not a domain name", s)
	}
	digits := true
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("%q is not a domain name", s)
		}
		for _, c := range label {
			switch {
			case c >= 'a' && c <= 'z', c == '-':
				digits = false
			case c >= '0' && c <= '9':
			default:
				return fmt.Errorf("%q is not a domain name", s)
			}
		}
	}
	if digits {
		return fmt.Errorf("%q is an IP address; name a domain", s)
	}
	return nil
}

// Narrow returns the policy a request asks for (domains and secrets, as the client sent them),
// within the operator's bound: every domain the request names must be covered by one of the
// bound's, and every secret's domain must be one of the request's domains. The bound's own
// secrets for the domains the request keeps are added after the request's, so that a request's
// secret of the same name wins. The error names the first domain outside.
func (bound Policy) Narrow(domains []string, secrets []Secret) (Policy, error) {
	out := Policy{Domains: make([]string, 0, len(domains))}
	for _, d := range domains {
		c := Canonical(d)
		ok := false
		for _, b := range bound.Domains {
			if covers(b, c) {
				ok = true
				break
			}
		}
		if !ok {
			return Policy{}, &OutsideError{Domain: d}
		}
		out.Domains = append(out.Domains, c)
	}
	for _, s := range secrets {
		c := Canonical(s.Domain)
		if !containsPattern(out.Domains, c) {
			return Policy{}, &SecretDomainError{Domain: s.Domain}
		}
		out.Secrets = append(out.Secrets, Secret{Domain: c, Name: s.Name, Value: s.Value})
	}
	for _, s := range bound.Secrets {
		for _, d := range out.Domains {
			if covers(s.Domain, d) || covers(d, s.Domain) {
				out.Secrets = append(out.Secrets, s)
				break
			}
		}
	}
	return out, nil
}

func containsPattern(domains []string, d string) bool {
	for _, x := range domains {
		if covers(x, d) {
			return true
		}
	}
	return false
}

// OutsideError is a request's domain that the operator's bound does not cover.
type OutsideError struct{ Domain string }

func (e *OutsideError) Error() string {
	return fmt.Sprintf("domain %q is not in the allowlist this proxy's operator set", e.Domain)
}

// SecretDomainError is a domain secret for a domain the request's own allowlist does not name.
type SecretDomainError struct{ Domain string }

func (e *SecretDomainError) Error() string {
	return fmt.Sprintf("domain secret for '%s': the domain is not in allowed_domains", e.Domain)
}
