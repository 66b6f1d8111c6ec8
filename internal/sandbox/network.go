package sandbox

import (
	"fmt"

	"github.com/ciproxy/ciproxy/internal/egress"
)

// NetworkError is a network policy that a tool cannot give a container: one domain outside the
// operator's bound, a secret for a domain the policy does not allow, or anything at all asked
// of a tool that enforces no policy. Field names the part of the policy it is about
// ("allowed_domains[1]", "domain_secrets[0].domain"; "" for the whole policy).
type NetworkError struct {
	Field string
	Msg   string
}

func (e *NetworkError) Error() string { return e.Msg }

// NetworkPolicy returns the policy a container created on p gets when a request asks for asked:
// nil asked for none, and gets the tool's default (its whole bound when the operator made that
// the default, else no network); an empty policy is no network; an allowlist is narrowed to the
// bound. The returned policy holds secrets: it goes to the provider and nowhere else.
// backend names the tool's backend in the refusal of secrets.
func NetworkPolicy(p Provider, tool, backend string, asked *egress.Policy) (egress.Policy, error) {
	n, ok := p.(Networked)
	var bound egress.Bound
	if ok {
		bound = n.NetworkBound()
	}
	switch {
	case asked == nil && bound.Default:
		return bound.Policy, nil
	case asked == nil || !asked.Open():
		return egress.Policy{}, nil
	case !bound.Policy.Open():
		return egress.Policy{}, &NetworkError{Msg: fmt.Sprintf("sandbox tool '%s' gives its containers no network: its operator has set no allowed_domains", tool)}
	case len(asked.Secrets) > 0 && !n.DomainSecrets():
		return egress.Policy{}, &NetworkError{Field: "domain_secrets", Msg: fmt.Sprintf("sandbox tool '%s' runs on the %s backend, which cannot add domain secrets to its sandboxes' requests; use a local sandbox tool for them", tool, backend)}
	}
	policy, err := bound.Policy.Narrow(asked.Domains, asked.Secrets)
	if err == nil {
		return policy, nil
	}
	if oe, ok := err.(*egress.OutsideError); ok {
		return egress.Policy{}, &NetworkError{Field: fmt.Sprintf("allowed_domains[%d]", index(asked.Domains, oe.Domain)),
			Msg: fmt.Sprintf("domain '%s' is not in the allowlist of sandbox tool '%s'", oe.Domain, tool)}
	}
	if se, ok := err.(*egress.SecretDomainError); ok {
		i := 0
		for j, s := range asked.Secrets {
			if s.Domain == se.Domain {
				i = j
				break
			}
		}
		return egress.Policy{}, &NetworkError{Field: fmt.Sprintf("domain_secrets[%d].domain", i), Msg: se.Error()}
	}
	return egress.Policy{}, &NetworkError{Msg: err.Error()}
}

func index(xs []string, x string) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return 0
}
