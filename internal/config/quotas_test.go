package config

import (
	"strings"
	"testing"
)

func TestClientKeysAndQuotas(t *testing.T) {
	env := map[string]string{"ALICE_KEY": "sk-alice-SECRET"}
	in := `
general_settings:
  master_key: sk-master-SECRET
  max_containers: 50
  max_containers_per_key: 5
  container_creates_per_minute: 7
  client_keys:
    - name: alice
      key: os.environ/ALICE_KEY
      max_containers: 2
      max_concurrent_requests: 3
    - name: bob
      key: sk-bob-SECRET
    - name: carol
      key: os.environ/CAROL_KEY
litellm_settings:
  code_interpreter_interception_params:
    max_calls_per_turn: 4
    max_executions: 9
    max_code_size: 2k
    max_response_output: 1m
`
	cfg, err := ParseWith([]byte(in), "t.yaml", ParseOptions{LookupEnv: func(n string) (string, bool) { v, ok := env[n]; return v, ok }})
	if err != nil {
		t.Fatal(err)
	}
	g := cfg.General
	if g.Quotas.MaxContainers != 50 || g.Quotas.MaxContainersPerKey != 5 || g.Quotas.ContainerCreatesPerMinute != 7 ||
		g.Quotas.ContainerCreateBurst != DefaultContainerCreateBurst || g.Quotas.MaxConcurrentRequestsPerKey != DefaultMaxConcurrentRequests/4 {
		t.Errorf("quotas = %+v", g.Quotas)
	}
	for _, tc := range []struct {
		key, name     string
		ok            bool
		containers    int
		creates, conc int
	}{
		{"sk-alice-SECRET", "alice", true, 2, 7, 3},
		{"sk-bob-SECRET", "bob", true, 5, 7, DefaultMaxConcurrentRequests / 4}, // a fair share among 4 keys
		{"sk-master-SECRET", "", false, 0, 0, 0},                               // the master key is not a client key
		{"", "", false, 0, 0, 0},                                               // carol's unset variable matches nothing
		{"sk-nobody", "", false, 0, 0, 0},
	} {
		k, ok := g.ClientKeyFor(tc.key)
		if ok != tc.ok || k.Name != tc.name {
			t.Errorf("ClientKeyFor(%q) = %q, %v; want %q, %v", tc.key, k.Name, ok, tc.name, tc.ok)
			continue
		}
		if ok && (k.Quotas.MaxContainersPerKey != tc.containers || k.Quotas.ContainerCreatesPerMinute != tc.creates || k.Quotas.MaxConcurrentRequestsPerKey != tc.conc || k.Quotas.MaxContainers != 50) {
			t.Errorf("%s: quotas = %+v", tc.name, k.Quotas)
		}
	}
	if g.Open() {
		t.Error("a proxy with keys reports itself open")
	}
	ic := cfg.Interception
	if ic.MaxCallsPerTurn != 4 || ic.MaxExecutions != 9 || ic.MaxCodeSize != 2048 || ic.MaxResponseOutput != 1<<20 {
		t.Errorf("limits = %+v", ic)
	}
	warn := strings.Join(cfg.Warnings, "\n")
	if !strings.Contains(warn, "CAROL_KEY") || !strings.Contains(warn, "refused until it is set") {
		t.Errorf("warnings = %q; want carol's unset variable named", warn)
	}
}

// TestPerKeyDefaults: unset, the per-key quotas are the totals when one key or none is configured
// (a client that uses the only key as it would use OpenAI reaches the host's capacity first), and
// an equal share, rounded up, among several; an explicit value wins.
func TestPerKeyDefaults(t *testing.T) {
	for _, tc := range []struct {
		name, general        string
		containers, requests int
	}{
		{"open", "max_request_body_size: 1m\n", DefaultMaxContainers, DefaultMaxConcurrentRequests},
		{"master key", "master_key: sk-m\n", DefaultMaxContainers, DefaultMaxConcurrentRequests},
		{"one client key", "client_keys: [{name: a, key: k1}]\n", DefaultMaxContainers, DefaultMaxConcurrentRequests},
		{"master and a client key", "master_key: sk-m\nclient_keys: [{name: a, key: k1}]\n", 64, 128},
		{"three keys of 100", "max_containers: 100\nclient_keys: [{name: a, key: k1}, {name: b, key: k2}, {name: c, key: k3}]\n", 34, 86},
		{"explicit", "max_containers_per_key: 7\nmax_concurrent_requests_per_key: 9\n", 7, 9},
		{"explicit with keys", "master_key: sk-m\nmax_containers_per_key: 200\nclient_keys: [{name: a, key: k1}]\n", 200, 128},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte("general_settings:\n  "+strings.ReplaceAll(strings.TrimSuffix(tc.general, "\n"), "\n", "\n  ")+"\n"), "t.yaml")
			if err != nil {
				t.Fatal(err)
			}
			q := cfg.General.Quotas
			if q.MaxContainersPerKey != tc.containers || q.MaxConcurrentRequestsPerKey != tc.requests {
				t.Errorf("per key: %d containers, %d requests; want %d, %d", q.MaxContainersPerKey, q.MaxConcurrentRequestsPerKey, tc.containers, tc.requests)
			}
			for _, k := range cfg.General.ClientKeys {
				if k.Quotas.MaxContainersPerKey != tc.containers || k.Quotas.MaxConcurrentRequestsPerKey != tc.requests {
					t.Errorf("client key %s: %+v", k.Name, k.Quotas)
				}
			}
		})
	}
}

func TestClientKeysOnlyIsNotOpen(t *testing.T) {
	cfg, err := Parse([]byte("general_settings:\n  client_keys:\n    - {name: a, key: k1}\n"), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.General.Open() || strings.Contains(strings.Join(cfg.Warnings, "\n"), "open") {
		t.Errorf("open = %v, warnings %q", cfg.General.Open(), cfg.Warnings)
	}
}

func TestClientKeyErrorsNeverQuoteKeys(t *testing.T) {
	in := `general_settings:
  master_key: sk-SECRET-1
  client_keys:
    - {name: a, key: sk-SECRET-1}
    - {name: a, key: sk-SECRET-2}
    - {name: "bad name", key: sk-SECRET-3}
    - {name: 0123456789abcdef0123456789abcdef, key: sk-SECRET-4}
    - {name: b, key: sk-SECRET-2, max_containers: 0}
    - {key: sk-SECRET-5}
    - {name: c}
    - {name: d, key: sk-SECRET-6, bogus: 1}
`
	_, err := Parse([]byte(in), "t.yaml")
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	for _, want := range []string{
		"t.yaml:4:", "same key as master_key",
		"t.yaml:5:", `"a" is already the name of general_settings.client_keys[0]`, "same key as",
		"t.yaml:6:", "not a valid name",
		"t.yaml:7:", "32 hex digits",
		"t.yaml:8:", "must be at least 1",
		"t.yaml:9:", "name is required",
		"t.yaml:10:", "key is required",
		"t.yaml:11:", "bogus",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("errors lack %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "SECRET") {
		t.Errorf("an error quotes a key:\n%s", msg)
	}
}

func TestLimitsRefused(t *testing.T) {
	in := "litellm_settings:\n  code_interpreter_interception_params:\n    max_calls_per_turn: 0\n    max_executions: x\n    max_code_size: 2g\n    max_response_output: 0\n"
	_, err := Parse([]byte(in), "t.yaml")
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"t.yaml:3:", "t.yaml:4:", "t.yaml:5:", "t.yaml:6:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("errors lack %q:\n%v", want, err)
		}
	}
}
