package agentsandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/settings"
)

// Keys are the litellm_params keys of an agent_sandbox sandbox tool (besides sandbox_provider).
func Keys() []string {
	return []string{"kubeconfig", "namespace", "warm_pool", "process_port", "files_port", "connect", "router_url",
		"scoped_token_secret", "ready_timeout", "timeout", "run_timeout"}
}

// Settings are an agent_sandbox sandbox tool's settings as the configuration gives them.
type Settings struct {
	Options
	// MissingEnv names the environment variable scoped_token_secret was to be read from and that
	// is not set: the tool stays listed, and every creation fails naming the variable.
	MissingEnv string
}

// DecodeSettings reads an agent_sandbox tool's litellm_params from p. Each wrong value is recorded
// in p with its line.
func DecodeSettings(p *settings.Map) Settings {
	s := Settings{Options: DefaultOptions()}
	if v := p.String("kubeconfig"); v.Present {
		s.Kubeconfig = strings.TrimSpace(v.S)
	} else if v.Env != "" {
		p.Errorf(p.ValueLine("kubeconfig"), "%s: %s is not set", p.Key("kubeconfig"), v.Env)
	}
	for _, n := range []struct {
		key string
		dst *string
	}{{"namespace", &s.Namespace}, {"warm_pool", &s.WarmPool}} {
		v := p.String(n.key)
		if !v.Present {
			continue
		}
		name := strings.TrimSpace(v.S)
		if errs := validation.IsDNS1123Label(name); n.key == "namespace" && len(errs) > 0 {
			p.Errorf(p.ValueLine(n.key), "%s: %s is not a namespace name: %s", p.Key(n.key), v.Shown(), errs[0])
			continue
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			p.Errorf(p.ValueLine(n.key), "%s: %s is not a resource name: %s", p.Key(n.key), v.Shown(), errs[0])
			continue
		}
		*n.dst = name
	}
	if s.WarmPool == "" && !p.Has("warm_pool") {
		p.Errorf(p.Line(), "%s: an agent_sandbox tool needs warm_pool (the SandboxWarmPool its claims name)", p.Label())
	}
	for _, port := range []struct {
		key string
		dst *int
	}{{"process_port", &s.ProcessPort}, {"files_port", &s.FilesPort}} {
		*port.dst = p.Int(port.key, *port.dst, 1)
		if *port.dst > 65535 {
			p.Errorf(p.ValueLine(port.key), "%s: %d is not a port", p.Key(port.key), *port.dst)
			*port.dst = 0
		}
	}
	if v := p.String("connect"); v.Present {
		switch c := strings.TrimSpace(v.S); c {
		case ConnectPodIP, ConnectRouter:
			s.Connect = c
		default:
			p.Errorf(p.ValueLine("connect"), "%s: %s is neither pod_ip nor router", p.Key("connect"), v.Shown())
		}
	}
	router := p.String("router_url")
	if router.Present {
		s.RouterURL = p.BaseURL(router, p.ValueLine("router_url"), p.Key("router_url"))
	}
	secret := p.String("scoped_token_secret")
	switch {
	case secret.Present:
		if len(normalizeSecret(secret.S)) < MinSecretLen {
			from := "the value"
			if secret.Env != "" {
				from = secret.Env
			}
			p.Errorf(p.ValueLine("scoped_token_secret"), "%s: %s holds fewer than %d bytes (the router refuses shorter secrets)", p.Key("scoped_token_secret"), from, MinSecretLen)
		}
		s.RouterSecret = Secret(secret.S)
		sum := sha256.Sum256(normalizeSecret(secret.S))
		s.RouterSecretSum = hex.EncodeToString(sum[:8])
	case secret.Env != "":
		s.MissingEnv = secret.Env
	}
	if s.Connect == ConnectRouter {
		if s.RouterURL == "" && !router.Present {
			p.Errorf(p.ValueLine("connect"), "%s: connect: router needs router_url (the sandbox-router, e.g. http://sandbox-router-svc.agent-sandbox-system:8080)", p.Label())
		}
		if !p.Has("scoped_token_secret") {
			p.Errorf(p.ValueLine("connect"), "%s: connect: router needs scoped_token_secret: os.environ/NAME (the router's --authz-scoped-token-secret-file)", p.Label())
		}
	} else if p.Has("router_url") || p.Has("scoped_token_secret") {
		p.Warnf("%s: router_url and scoped_token_secret are used only with connect: router", p.Label())
	}
	s.ReadyTimeout = p.Duration("ready_timeout", s.ReadyTimeout, false)
	s.Timeout = p.Duration("timeout", s.Timeout, false)
	s.RunTimeout = p.Duration("run_timeout", s.RunTimeout, false)
	return s
}

var (
	_ sandbox.Provisioner = Settings{}
	_ sandbox.HostChecker = Settings{}
)

// Provision implements sandbox.Provisioner. It reads the credentials but does not contact the
// cluster; --check does (CheckHost).
func (s Settings) Provision(_ context.Context, tool string, log *zap.Logger) (sandbox.Provider, error) {
	if s.MissingEnv != "" {
		return missingEnv{tool: tool, env: s.MissingEnv}, nil
	}
	o := s.Options
	o.Tool, o.Logger = tool, log
	return New(o)
}

// CheckHost implements sandbox.HostChecker for --check, although the sandboxes run in the
// cluster: it reads the warm pool and lists the namespace's claims, which proves the API
// reachable and the credentials allowed, and creates nothing.
func (s Settings) CheckHost(ctx context.Context) (sandbox.HostReport, error) {
	if s.MissingEnv != "" {
		return sandbox.HostReport{}, fmt.Errorf("environment variable %s, which scoped_token_secret names, is not set", s.MissingEnv)
	}
	p, err := New(s.Options)
	if err != nil {
		return sandbox.HostReport{}, err
	}
	defer p.Close(ctx)
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pool, err := p.dyn.Resource(warmPoolGVR).Namespace(s.Namespace).Get(ctx, s.WarmPool, metav1.GetOptions{})
	if err != nil {
		return sandbox.HostReport{}, fmt.Errorf("the warm pool %s/%s: %w", s.Namespace, s.WarmPool, p.apiError(ctx, "check", err))
	}
	if _, err := p.claims().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return sandbox.HostReport{}, fmt.Errorf("listing claims in %s: %w", s.Namespace, p.apiError(ctx, "check", err))
	}
	tmpl, _, _ := unstructured.NestedString(pool.Object, "spec", "sandboxTemplateRef", "name")
	where := "files and processes at each sandbox's pod IP"
	if s.Connect == ConnectRouter {
		u, _ := url.Parse(s.RouterURL)
		where = fmt.Sprintf("files through the router at %s with scoped tokens; the process service (gRPC, which the router cannot carry) at each pod IP", u.Redacted())
	}
	return sandbox.HostReport{Isolation: fmt.Sprintf("remote: agent-sandbox in namespace %s, warm pool %s (template %s; its RuntimeClass and NetworkPolicy isolate the sandboxes: the template must have egress: []); %s",
		s.Namespace, s.WarmPool, tmpl, where)}, nil
}

// missingEnv stands in for a tool whose scoped_token_secret names a variable that is not set.
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
