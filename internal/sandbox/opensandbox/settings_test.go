package opensandbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/backends"
	"github.com/ciproxy/ciproxy/internal/sandbox/opensandbox"
)

// decode parses one opensandbox tool with the given litellm_params lines and environment.
func decode(t *testing.T, env map[string]string, lines ...string) (opensandbox.Settings, error) {
	t.Helper()
	yaml := "sandbox_tools:\n  - sandbox_tool_name: osb\n    litellm_params:\n      sandbox_provider: opensandbox\n"
	for _, l := range lines {
		yaml += "      " + l + "\n"
	}
	cfg, err := config.ParseWith([]byte(yaml), "c.yaml", backends.ParseOptions(func(k string) (string, bool) { v, ok := env[k]; return v, ok }))
	if err != nil {
		return opensandbox.Settings{}, err
	}
	if len(cfg.SandboxTools) != 1 {
		t.Fatalf("%d tools", len(cfg.SandboxTools))
	}
	return cfg.SandboxTools[0].Settings.(opensandbox.Settings), nil
}

func TestDecodeSettings(t *testing.T) {
	for _, c := range []struct {
		name  string
		env   map[string]string
		lines []string
		err   string
		check func(t *testing.T, s opensandbox.Settings)
	}{
		{"litellm style", map[string]string{"OPENSANDBOX_API_KEY": "k1"}, []string{"api_key: os.environ/OPENSANDBOX_API_KEY", "api_base: http://osb:8080/v1"}, "", func(t *testing.T, s opensandbox.Settings) {
			if s.APIKey != "k1" || s.APIBase != "http://osb:8080/v1" || s.Image != opensandbox.DefaultImage || s.CPU != "1" || s.Memory != "2Gi" || s.Timeout != opensandbox.DefaultTimeout {
				t.Errorf("%+v", s)
			}
		}},
		{"env fallbacks", map[string]string{"OPEN_SANDBOX_API_KEY": "k2", "OPEN_SANDBOX_API_BASE": "https://osb.example/v1"}, nil, "", func(t *testing.T, s opensandbox.Settings) {
			if s.APIKey != "k2" || s.APIBase != "https://osb.example/v1" {
				t.Errorf("%+v", s)
			}
		}},
		{"everything", nil, []string{"api_base: http://h/v1", "image: me/ci:2", "entrypoint: [\"/bin/start\", \"-x\"]", "cpu: 500m", "memory: 4Gi", "timeout: 10m", "ready_timeout: 90s", "allowed_domains: [\"pypi.org\"]"}, "", func(t *testing.T, s opensandbox.Settings) {
			if s.Image != "me/ci:2" || strings.Join(s.Entrypoint, " ") != "/bin/start -x" || s.CPU != "500m" || s.Memory != "4Gi" ||
				s.Timeout != 10*time.Minute || s.ReadyTimeout != 90*time.Second || len(s.Network.Policy.Domains) != 1 {
				t.Errorf("%+v", s)
			}
		}},
		{"unset key variable", nil, []string{"api_key: os.environ/NOPE", "api_base: http://h/v1"}, "", func(t *testing.T, s opensandbox.Settings) {
			p, err := s.Provision(context.Background(), "osb", nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Create(context.Background(), sandbox.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "NOPE") {
				t.Errorf("create: %v", err)
			}
		}},
		{"no api_base", nil, nil, "needs api_base", nil},
		{"bad api_base", nil, []string{"api_base: osb:8080"}, "not an absolute http(s) URL", nil},
		{"short timeout", nil, []string{"api_base: http://h/v1", "timeout: 30s"}, "at least 1m0s", nil},
		{"bad quantity", nil, []string{"api_base: http://h/v1", "memory: lots"}, "not a Kubernetes quantity", nil},
		{"domain secrets", nil, []string{"api_base: http://h/v1", "allowed_domains: [\"api.example.com\"]", "domain_secrets: [{domain: api.example.com, name: TOKEN, value: x}]"}, "cannot be given domain secrets", nil},
		{"another backend's key", nil, []string{"api_base: http://h/v1", "template: x"}, `key "template" does not apply`, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := decode(t, c.env, c.lines...)
			switch {
			case c.err == "" && err != nil:
				t.Fatal(err)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("%v, want %q", err, c.err)
			}
			if c.check != nil {
				c.check(t, s)
			}
		})
	}
}

func TestCheckHost(t *testing.T) {
	srv := newDouble(t)
	s := opensandbox.Settings{Options: opensandbox.Options{APIKey: srv.APIKey(), APIBase: srv.URL(), Image: "x"}}
	rep, err := s.CheckHost(t.Context())
	if err != nil || !strings.Contains(rep.Isolation, srv.URL()) {
		t.Errorf("%+v %v", rep, err)
	}
	s.APIKey = "not-the-key"
	if _, err := s.CheckHost(t.Context()); err == nil || strings.Contains(err.Error(), "not-the-key") || !strings.Contains(err.Error(), "401") {
		t.Errorf("bad key: %v", err)
	}
	if srv.Creates() != 0 {
		t.Error("the check created a sandbox")
	}
}
