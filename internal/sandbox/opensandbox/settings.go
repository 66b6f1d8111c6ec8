package opensandbox

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/settings"
)

// Keys are the litellm_params keys of an opensandbox sandbox tool (besides sandbox_provider).
func Keys() []string {
	return append([]string{"api_key", "api_base", "image", "entrypoint", "cpu", "memory", "timeout", "ready_timeout"}, egress.Keys()...)
}

// Settings are an opensandbox sandbox tool's settings as the configuration gives them.
type Settings struct {
	Options
	// MissingEnv names the environment variable the API key was to be read from and that is not
	// set: the tool stays listed, and every creation fails naming the variable.
	MissingEnv string
}

// quantity is a Kubernetes quantity as resourceLimits takes it ("1", "500m", "2Gi").
var quantity = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$`)

// DecodeSettings reads an opensandbox tool's litellm_params from p, LiteLLM's way: api_key and
// api_base (each may be os.environ/NAME), falling back to OPEN_SANDBOX_API_KEY and
// OPEN_SANDBOX_API_BASE. api_base is the lifecycle base, /v1 included, and has no default. Each wrong
// value is recorded in p with its line.
func DecodeSettings(p *settings.Map) Settings {
	s := Settings{Options: DefaultOptions()}
	key := p.String("api_key")
	switch {
	case key.Present:
		s.APIKey = key.S
	case key.Env != "":
		s.MissingEnv = key.Env
	default:
		if e, ok := p.LookupEnv("OPEN_SANDBOX_API_KEY"); ok {
			s.APIKey = e // may be empty: a server without a key
		}
	}
	base, line := p.String("api_base"), p.ValueLine("api_base")
	if !base.Present && base.Env == "" {
		if e, ok := p.LookupEnv("OPEN_SANDBOX_API_BASE"); ok && e != "" {
			base, line = settings.Value{S: e, Env: "OPEN_SANDBOX_API_BASE", Present: true}, p.Line()
		}
	}
	switch {
	case base.Present:
		s.APIBase = p.BaseURL(base, line, p.Key("api_base"))
	case base.Env != "":
		p.Errorf(line, "%s: %s is not set", p.Key("api_base"), base.Env)
	default:
		p.Errorf(p.Line(), "%s: an opensandbox tool needs api_base (the lifecycle API, /v1 included, e.g. http://127.0.0.1:8080/v1) or OPEN_SANDBOX_API_BASE", p.Label())
	}
	if v := p.String("image"); v.Present && strings.TrimSpace(v.S) != "" {
		s.Image = strings.TrimSpace(v.S)
	}
	if ep, ok := p.StringList("entrypoint"); ok {
		if len(ep) == 0 {
			p.Errorf(p.ValueLine("entrypoint"), "%s: must name a command", p.Key("entrypoint"))
		} else {
			s.Entrypoint = ep
		}
	}
	for _, q := range []struct {
		key string
		dst *string
	}{{"cpu", &s.CPU}, {"memory", &s.Memory}} {
		if v := p.String(q.key); v.Present {
			if !quantity.MatchString(strings.TrimSpace(v.S)) {
				p.Errorf(p.ValueLine(q.key), "%s: %s is not a Kubernetes quantity (e.g. \"1\", \"500m\", \"2Gi\")", p.Key(q.key), v.Shown())
			} else {
				*q.dst = strings.TrimSpace(v.S)
			}
		}
	}
	s.Timeout = p.Duration("timeout", s.Timeout, false)
	if s.Timeout < minTimeout {
		p.Errorf(p.ValueLine("timeout"), "%s: OpenSandbox keeps a sandbox at least %s", p.Key("timeout"), minTimeout)
		s.Timeout = DefaultTimeout
	}
	s.ReadyTimeout = p.Duration("ready_timeout", s.ReadyTimeout, false)
	s.Network = egress.DecodeSettings(p)
	if len(s.Network.Policy.Secrets) > 0 {
		p.Errorf(p.ValueLine("domain_secrets"), "%s: OpenSandbox sandboxes cannot be given domain secrets (its egress rules filter by name and have no credential vault); use a local sandbox tool", p.Key("domain_secrets"))
	}
	return s
}

var (
	_ sandbox.Provisioner = Settings{}
	_ sandbox.HostChecker = Settings{}
)

// Provision implements sandbox.Provisioner. It does not contact the server; --check does
// (CheckHost).
func (s Settings) Provision(_ context.Context, tool string, log *zap.Logger) (sandbox.Provider, error) {
	if s.MissingEnv != "" {
		return missingEnv{tool: tool, env: s.MissingEnv}, nil
	}
	o := s.Options
	o.Tool, o.Logger = tool, log
	return New(o)
}

// CheckHost implements sandbox.HostChecker for --check, although the sandboxes run on the
// OpenSandbox server, not on this host: it asks the lifecycle API for one page of sandboxes, which
// proves the server reachable and the API key accepted, and creates nothing.
func (s Settings) CheckHost(ctx context.Context) (sandbox.HostReport, error) {
	if s.MissingEnv != "" {
		return sandbox.HostReport{}, fmt.Errorf("environment variable %s, which api_key names, is not set", s.MissingEnv)
	}
	p, err := New(s.Options)
	if err != nil {
		return sandbox.HostReport{}, err
	}
	defer p.Close(ctx)
	ctx, cancel := context.WithTimeout(ctx, min(p.opts.RequestTimeout, 15*time.Second))
	defer cancel()
	if _, err := p.lifecycle(ctx, "check", http.MethodGet, "/sandboxes?page=1&pageSize=1", nil); err != nil {
		return sandbox.HostReport{}, fmt.Errorf("the OpenSandbox server at %s: %w", s.APIBase, err)
	}
	return sandbox.HostReport{Isolation: fmt.Sprintf("remote: OpenSandbox server at %s answers and accepts the API key; sandboxes from %s", s.APIBase, s.Image)}, nil
}

// missingEnv stands in for a tool whose api_key names an environment variable that is not set.
type missingEnv struct {
	tool, env string
}

var _ sandbox.Provider = missingEnv{}

func (m missingEnv) Create(context.Context, sandbox.CreateOptions) (sandbox.Handle, error) {
	return sandbox.Handle{}, fmt.Errorf("%w: sandbox tool %q needs environment variable %s, which is not set",
		sandbox.ErrUnavailable, m.tool, m.env)
}

func (m missingEnv) Run(context.Context, sandbox.Handle, string, sandbox.RunOptions) (sandbox.Result, error) {
	return sandbox.Result{}, fmt.Errorf("%w: no such sandbox", sandbox.ErrNotFound)
}

func (m missingEnv) Delete(context.Context, sandbox.Handle) error { return nil }

func (m missingEnv) KeepAlive(context.Context, sandbox.Handle, time.Duration) error {
	return fmt.Errorf("%w: no such sandbox", sandbox.ErrNotFound)
}
