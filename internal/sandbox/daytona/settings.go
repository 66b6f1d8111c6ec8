package daytona

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

// Keys are the litellm_params keys of a daytona sandbox tool (besides sandbox_provider).
func Keys() []string {
	return append([]string{"api_key", "api_base", "target", "snapshot", "image", "cpu", "memory", "disk",
		"timeout", "create_timeout", "allow_internet_access"}, egress.Keys()...)
}

// Settings are a daytona sandbox tool's settings as the configuration gives them.
type Settings struct {
	Options
	// KeyHash identifies the API key in fingerprints without holding it.
	KeyHash string
	// MissingEnv names the environment variable the API key was to be read from and that is not
	// set: every create then fails with a message naming it.
	MissingEnv string
}

// DecodeSettings reads a daytona sandbox tool's litellm_params from p, with the official SDKs'
// environment fallbacks: DAYTONA_API_KEY, DAYTONA_API_URL and DAYTONA_TARGET.
func DecodeSettings(p *settings.Map) Settings {
	s := Settings{Options: DefaultOptions()}
	key := p.String("api_key")
	switch {
	case key.Present:
		s.APIKey = key.S
	case key.Env != "":
		s.MissingEnv = key.Env
	default:
		if e, ok := p.LookupEnv("DAYTONA_API_KEY"); ok && e != "" {
			s.APIKey = e
		} else {
			p.Warnf("%s: no api_key, and DAYTONA_API_KEY, which it falls back to, is not set", p.Label())
			s.MissingEnv = "DAYTONA_API_KEY"
		}
	}
	if s.APIKey != "" {
		s.KeyHash = keyHash(s.APIKey)
	}
	if v := p.String("api_base"); v.Present {
		s.APIBase = p.BaseURL(v, p.ValueLine("api_base"), p.Key("api_base"))
	} else if v.Env != "" && s.MissingEnv == "" {
		s.MissingEnv = v.Env // never fall back to an endpoint the operator did not choose
	} else if e, ok := p.LookupEnv("DAYTONA_API_URL"); ok && e != "" {
		s.APIBase = p.BaseURL(settings.Value{S: e, Env: "DAYTONA_API_URL", Present: true}, p.Line(), p.Key("api_base"))
	}
	if v := p.String("target"); v.Present {
		s.Target = strings.TrimSpace(v.S)
	} else if e, ok := p.LookupEnv("DAYTONA_TARGET"); ok {
		s.Target = strings.TrimSpace(e)
	}
	if v := p.String("snapshot"); v.Present {
		s.Snapshot = strings.TrimSpace(v.S)
	}
	if v := p.String("image"); v.Present {
		s.Image = strings.TrimSpace(v.S)
		if strings.ContainsAny(s.Image, " \n\t") {
			p.Errorf(p.ValueLine("image"), "%s: %s is not an image name", p.Key("image"), v.Shown())
			s.Image = ""
		}
	}
	if s.Snapshot != "" && s.Image != "" {
		p.Errorf(p.ValueLine("image"), "%s: set snapshot or image, not both", p.Key("image"))
	}
	s.CPU = p.Int("cpu", 0, 1)
	s.Memory = p.Int("memory", 0, 1)
	s.Disk = p.Int("disk", 0, 1)
	for _, k := range []string{"cpu", "memory", "disk"} {
		if p.Has(k) && s.Image == "" {
			p.Errorf(p.ValueLine(k), "%s: Daytona takes resources only for sandboxes built from an image, not from a snapshot; set image or leave %s out", p.Key(k), k)
		}
	}
	s.Timeout = p.Duration("timeout", s.Timeout, false)
	s.CreateTimeout = p.Duration("create_timeout", s.CreateTimeout, false)
	s.AllowInternetAccess = p.Bool("allow_internet_access", false)
	s.Network = egress.DecodeSettings(p)
	switch {
	case s.AllowInternetAccess && s.Network.Policy.Open():
		p.Errorf(p.ValueLine("allowed_domains"), "%s: allow_internet_access opens the whole internet to every sandbox; set it or allowed_domains, not both", p.Key("allowed_domains"))
	case len(s.Network.Policy.Secrets) > 0:
		p.Errorf(p.ValueLine("domain_secrets"), "%s: Daytona sandboxes cannot be given domain secrets (their traffic does not pass through this proxy); use a local sandbox tool", p.Key("domain_secrets"))
	}
	return s
}

// Provision implements sandbox.Provisioner. It does not contact Daytona (--check does).
func (s Settings) Provision(_ context.Context, tool string, log *zap.Logger) (sandbox.Provider, error) {
	if s.MissingEnv != "" {
		return missingEnv{tool: tool, env: s.MissingEnv}, nil
	}
	o := s.Options
	o.Tool, o.Logger = tool, log
	return New(o)
}

// CheckHost implements sandbox.HostChecker for --check, although Daytona's sandboxes do not run on
// this host: it reaches Daytona with the tool's key (a listing of this proxy's sandboxes, which
// creates nothing) and reports what it found and what Daytona cannot do.
func (s Settings) CheckHost(ctx context.Context) (sandbox.HostReport, error) {
	if s.MissingEnv != "" {
		return sandbox.HostReport{}, fmt.Errorf("environment variable %s, which holds the API key, is not set", s.MissingEnv)
	}
	p, err := New(s.Options)
	if err != nil {
		return sandbox.HostReport{}, err
	}
	defer p.Close(ctx)
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	listed, err := p.List(ctx, map[string]string{labelCreatedBy: "ciproxy"})
	if err != nil {
		return sandbox.HostReport{}, fmt.Errorf("reaching Daytona at %s: %w", p.apiBase, err)
	}
	from := "the organization's default snapshot"
	switch {
	case s.Snapshot != "":
		from = "snapshot " + s.Snapshot
	case s.Image != "":
		from = "image " + s.Image
	}
	target := s.Target
	if target == "" {
		target = "the organization's default"
	}
	return sandbox.HostReport{
		Isolation: fmt.Sprintf("Daytona sandboxes at %s (key accepted; %d sandboxes of this proxy live; target %s; %s). "+
			"Daytona keeps Python state per interpreter context and streams output; it cannot interrupt a run "+
			"(a client that goes away has the context deleted, losing its state) and gives no rich results, which the proxy's wrapper adds",
			p.apiBase, len(listed), target, from),
		Weaker: false,
	}, nil
}

var (
	_ sandbox.Provisioner = Settings{}
	_ sandbox.HostChecker = Settings{}
)

// missingEnv stands in for a tool whose API key's environment variable is not set.
type missingEnv struct {
	tool, env string
}

var _ sandbox.Provider = missingEnv{}

func (m missingEnv) err() error {
	return fmt.Errorf("%w: sandbox tool %q needs environment variable %s, which is not set", sandbox.ErrUnavailable, m.tool, m.env)
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
