package e2b

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/settings"
)

// Keys are the litellm_params keys of an e2b sandbox tool (besides sandbox_provider).
func Keys() []string {
	return append([]string{"api_key", "api_base", "domain", "sandbox_url", "template", "timeout", "allow_internet_access"}, egress.Keys()...)
}

// Settings are an e2b sandbox tool's settings as the configuration gives them.
type Settings struct {
	Options
	// MissingEnv names the environment variable the API key (or an endpoint) was to be read from and
	// that is not set. The tool then stays listed, and every sandbox creation fails with a message
	// naming the variable, rather than the configuration failing or a default endpoint being used.
	MissingEnv string
}

// DecodeSettings reads an e2b sandbox tool's litellm_params from p, with the official SDKs'
// environment fallbacks for what is not set: E2B_API_KEY, E2B_DOMAIN, E2B_API_URL (the whole
// control-plane base) and E2B_SANDBOX_URL (one data-plane base). Every other key it does not set keeps
// its DefaultOptions value; each wrong value is recorded in p with its line.
func DecodeSettings(p *settings.Map) Settings {
	s := Settings{Options: DefaultOptions()}
	// fallback returns the configured value, else the environment variable's, with its line.
	fallback := func(key, env string) (settings.Value, int) {
		v := p.String(key)
		if v.Env != "" && !v.Present && s.MissingEnv == "" {
			// Never fall back to a default endpoint the operator did not choose.
			s.MissingEnv = v.Env
		}
		if v.Present || v.Env != "" {
			return v, p.ValueLine(key)
		}
		if e, ok := p.LookupEnv(env); ok && e != "" {
			return settings.Value{S: e, Env: env, Present: true}, p.Line()
		}
		return settings.Value{}, 0
	}
	key := p.String("api_key")
	switch {
	case key.Present:
		s.APIKey = key.S
	case key.Env != "":
		s.MissingEnv = key.Env
	default:
		if e, ok := p.LookupEnv("E2B_API_KEY"); ok && e != "" {
			s.APIKey = e
		} else {
			p.Warnf("%s: no api_key, and E2B_API_KEY, which it falls back to, is not set", p.Label())
			s.MissingEnv = "E2B_API_KEY"
		}
	}
	if v, line := fallback("domain", "E2B_DOMAIN"); v.Present {
		dom := strings.TrimSpace(v.S)
		if dom == "" || strings.ContainsAny(dom, "/:@ ") {
			p.Errorf(line, "%s: %s is not a domain name (e.g. \"e2b.app\")", p.Key("domain"), v.Shown())
		} else {
			s.Domain = dom
		}
	}
	if v, line := fallback("api_base", "E2B_API_URL"); v.Present {
		s.APIBase = p.BaseURL(v, line, p.Key("api_base"))
	}
	if v, line := fallback("sandbox_url", "E2B_SANDBOX_URL"); v.Present {
		s.SandboxURL = p.BaseURL(v, line, p.Key("sandbox_url"))
	}
	if v := p.String("template"); v.Present && v.S != "" {
		s.Template = v.S
	}
	s.Timeout = p.Duration("timeout", s.Timeout, false)
	s.AllowInternetAccess = p.Bool("allow_internet_access", false)
	s.Network = egress.DecodeSettings(p)
	switch {
	case s.AllowInternetAccess && s.Network.Policy.Open():
		p.Errorf(p.ValueLine("allowed_domains"), "%s: allow_internet_access opens the whole internet to every sandbox; set it or allowed_domains, not both", p.Key("allowed_domains"))
	case len(s.Network.Policy.Secrets) > 0:
		// e2b's sandboxes reach the internet from e2b's network, not through this proxy.
		p.Errorf(p.ValueLine("domain_secrets"), "%s: e2b sandboxes cannot be given domain secrets (their traffic does not pass through this proxy); use a local sandbox tool", p.Key("domain_secrets"))
	}
	return s
}

// Provision implements sandbox.Provisioner. It does not contact e2b: a bad key shows on the first
// create, as with the SDKs.
func (s Settings) Provision(_ context.Context, tool string, log *zap.Logger) (sandbox.Provider, error) {
	if s.MissingEnv != "" {
		return missingEnv{tool: tool, env: s.MissingEnv}, nil
	}
	o := s.Options
	o.Tool, o.Logger = tool, log
	return New(o)
}

var _ sandbox.Provisioner = Settings{}

// missingEnv stands in for an e2b tool whose settings name an environment variable that is not set:
// every sandbox creation fails with a message naming the variable (not a secret).
type missingEnv struct {
	tool, env string
}

var _ sandbox.Provider = missingEnv{}

func (m missingEnv) err() error {
	return fmt.Errorf("%w: sandbox tool %q needs environment variable %s, which is not set",
		sandbox.ErrUnavailable, m.tool, m.env)
}

func (m missingEnv) Create(context.Context, sandbox.CreateOptions) (sandbox.Handle, error) {
	return sandbox.Handle{}, m.err()
}

func (m missingEnv) Run(context.Context, sandbox.Handle, string, sandbox.RunOptions) (sandbox.Result, error) {
	return sandbox.Result{}, fmt.Errorf("%w: no such sandbox", sandbox.ErrNotFound)
}

func (m missingEnv) Delete(context.Context, sandbox.Handle) error { return nil }

func (m missingEnv) KeepAlive(context.Context, sandbox.Handle, time.Duration) error {
	return fmt.Errorf("%w: no such sandbox", sandbox.ErrNotFound)
}
