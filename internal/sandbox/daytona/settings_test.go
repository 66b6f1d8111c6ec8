package daytona_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/backends"
	"github.com/ciproxy/ciproxy/internal/sandbox/daytona"
)

func parse(t *testing.T, params string, env map[string]string) (daytona.Settings, error) {
	t.Helper()
	y := "sandbox_tools:\n  - sandbox_tool_name: d\n    litellm_params:\n      sandbox_provider: daytona\n"
	for _, l := range strings.Split(strings.TrimSpace(params), "\n") {
		if l != "" {
			y += "      " + l + "\n"
		}
	}
	cfg, err := config.ParseWith([]byte(y), "c.yaml", backends.ParseOptions(func(k string) (string, bool) { v, ok := env[k]; return v, ok }))
	if err != nil {
		return daytona.Settings{}, err
	}
	return cfg.SandboxTools[0].Settings.(daytona.Settings), nil
}

func TestDecodeSettings(t *testing.T) {
	for _, tc := range []struct {
		name, params string
		env          map[string]string
		err          string
		check        func(t *testing.T, s daytona.Settings)
	}{
		{"defaults from the environment", "", map[string]string{"DAYTONA_API_KEY": "k1", "DAYTONA_TARGET": "eu"}, "", func(t *testing.T, s daytona.Settings) {
			if s.APIKey != "k1" || s.APIBase != daytona.DefaultAPIBase || s.Target != "eu" || s.Timeout != daytona.DefaultTimeout || s.MissingEnv != "" {
				t.Errorf("%+v", s)
			}
		}},
		{"LiteLLM style", "api_key: os.environ/MY_KEY\napi_base: https://dtn.example/api/\nsnapshot: py\ntimeout: 30m\ncreate_timeout: 2m", map[string]string{"MY_KEY": "k2"}, "", func(t *testing.T, s daytona.Settings) {
			if s.APIKey != "k2" || s.APIBase != "https://dtn.example/api" || s.Snapshot != "py" || s.Timeout != 30*time.Minute || s.CreateTimeout != 2*time.Minute {
				t.Errorf("%+v", s)
			}
		}},
		{"missing variable", "api_key: os.environ/NOPE", nil, "", func(t *testing.T, s daytona.Settings) {
			if s.MissingEnv != "NOPE" {
				t.Errorf("%+v", s)
			}
			p, err := s.Provision(context.Background(), "d", nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Create(context.Background(), sandbox.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "NOPE") {
				t.Errorf("create: %v", err)
			}
		}},
		{"image with resources", "api_key: k\nimage: python:3.12\ncpu: 2\nmemory: 4\ndisk: 10", nil, "", func(t *testing.T, s daytona.Settings) {
			if s.Image != "python:3.12" || s.CPU != 2 || s.Memory != 4 || s.Disk != 10 {
				t.Errorf("%+v", s)
			}
		}},
		{"resources with a snapshot", "api_key: k\nsnapshot: s\ncpu: 2", nil, "only for sandboxes built from an image", nil},
		{"snapshot and image", "api_key: k\nsnapshot: s\nimage: i", nil, "not both", nil},
		{"domain secrets", "api_key: k\nallowed_domains: [\"api.example.com\"]\ndomain_secrets:\n  - domain: api.example.com\n    name: TOKEN\n    value: v", nil, "cannot be given domain secrets", nil},
		{"a key of another backend", "api_key: k\ntemplate: x", nil, `key "template" does not apply to sandbox_provider daytona`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := parse(t, tc.params, tc.env)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, s)
		})
	}
}

func TestCheckHost(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p)
	defer p.Delete(context.Background(), h)
	s := daytona.Settings{Options: daytona.Options{APIKey: srv.APIKey(), APIBase: srv.URL(), Snapshot: "py"}}
	rep, err := s.CheckHost(context.Background())
	if err != nil || !strings.Contains(rep.Isolation, "1 sandboxes of this proxy live") || !strings.Contains(rep.Isolation, "snapshot py") {
		t.Errorf("%+v %v", rep, err)
	}
	s.APIKey = "wrong"
	if _, err := s.CheckHost(context.Background()); err == nil || !strings.Contains(err.Error(), "rejected the API key") {
		t.Errorf("bad key: %v", err)
	}
}
