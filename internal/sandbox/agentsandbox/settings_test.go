package agentsandbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/backends"
)

const testSecret = "0123456789abcdef0123456789abcdef"

// decode parses one agent_sandbox tool with the given litellm_params lines and environment.
func decode(t *testing.T, env map[string]string, lines ...string) (agentsandbox.Settings, error) {
	t.Helper()
	yaml := "sandbox_tools:\n  - sandbox_tool_name: k8s\n    litellm_params:\n      sandbox_provider: agent_sandbox\n"
	for _, l := range lines {
		yaml += "      " + l + "\n"
	}
	cfg, err := config.ParseWith([]byte(yaml), "c.yaml", backends.ParseOptions(func(k string) (string, bool) { v, ok := env[k]; return v, ok }))
	if err != nil {
		return agentsandbox.Settings{}, err
	}
	return cfg.SandboxTools[0].Settings.(agentsandbox.Settings), nil
}

func TestDecodeSettings(t *testing.T) {
	for _, c := range []struct {
		name  string
		env   map[string]string
		lines []string
		err   string
		check func(t *testing.T, s agentsandbox.Settings)
	}{
		{"defaults", nil, []string{"warm_pool: ciproxy-python"}, "", func(t *testing.T, s agentsandbox.Settings) {
			if s.Namespace != "default" || s.WarmPool != "ciproxy-python" || s.ProcessPort != 9090 || s.FilesPort != 8080 ||
				s.Connect != agentsandbox.ConnectPodIP || s.ReadyTimeout != 180*time.Second || s.Kubeconfig != "" {
				t.Errorf("%+v", s)
			}
		}},
		{"router", map[string]string{"RS": testSecret + "\n"}, []string{"warm_pool: p", "namespace: sb", "connect: router", "router_url: http://router:8080", "scoped_token_secret: os.environ/RS", "timeout: 2h"}, "", func(t *testing.T, s agentsandbox.Settings) {
			if s.Connect != agentsandbox.ConnectRouter || s.RouterURL != "http://router:8080" || string(s.RouterSecret) != testSecret+"\n" || s.Timeout != 2*time.Hour || s.RouterSecretSum == "" {
				t.Errorf("%+v", s)
			}
			if shown := fmt.Sprintf("%+v %#v %v", s, s, s); strings.Contains(shown, testSecret) {
				t.Errorf("the secret is printed: %s", shown)
			}
		}},
		{"short secret", map[string]string{"RS": "short"}, []string{"warm_pool: p", "connect: router", "router_url: http://r", "scoped_token_secret: os.environ/RS"}, "fewer than 32 bytes", nil},
		{"literal secret", nil, []string{"warm_pool: p", "connect: router", "router_url: http://r", "scoped_token_secret: " + testSecret}, "", func(t *testing.T, s agentsandbox.Settings) {
			if string(s.RouterSecret) != testSecret {
				t.Errorf("%+v", s)
			}
		}},
		{"short literal secret", nil, []string{"warm_pool: p", "connect: router", "router_url: http://r", "scoped_token_secret: short"}, "the value holds fewer than 32 bytes", nil},
		{"no warm pool", nil, nil, "needs warm_pool", nil},
		{"unknown key", nil, []string{"warm_pool: p", "api_key: x"}, `key "api_key" does not apply`, nil},
		{"unset secret variable", nil, []string{"warm_pool: p", "connect: router", "router_url: http://r", "scoped_token_secret: os.environ/NOPE"}, "", func(t *testing.T, s agentsandbox.Settings) {
			if s.MissingEnv != "NOPE" {
				t.Fatalf("%+v", s)
			}
			p, err := s.Provision(context.Background(), "k8s", nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Create(context.Background(), sandbox.CreateOptions{}); !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "NOPE") {
				t.Errorf("Create = %v", err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := decode(t, c.env, c.lines...)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("decode = %v; want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, s)
		})
	}
}

func TestNewRefusesIncompleteRouter(t *testing.T) {
	o := agentsandbox.DefaultOptions()
	o.WarmPool, o.Connect, o.RouterURL = "p", agentsandbox.ConnectRouter, "http://r"
	o.Kubeconfig = "/nonexistent"
	if _, err := agentsandbox.New(o); err == nil || !strings.Contains(err.Error(), "scoped_token_secret") {
		t.Errorf("New without a secret = %v", err)
	}
	o.RouterSecret = testSecret
	if _, err := agentsandbox.New(o); err == nil || strings.Contains(err.Error(), testSecret) {
		t.Errorf("New with a missing kubeconfig = %v", err)
	}
}
