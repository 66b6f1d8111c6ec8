package config_test

import (
	"os"
	"testing"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox/backends"
)

// The example documents the defaults of the quotas and limits, and its client_keys block is valid
// as written.
func TestExampleConfigQuotas(t *testing.T) {
	data, err := os.ReadFile("../../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	data = uncomment(t, data, "  # client_keys:")
	env := map[string]string{"ANALYTICS_KEY": "sk-analytics"}
	c, err := config.ParseWith(data, "config.example.yaml", backends.ParseOptions(func(n string) (string, bool) { v, ok := env[n]; return v, ok }))
	if err != nil {
		t.Fatalf("config.example.yaml with client_keys uncommented: %v", err)
	}
	d := config.Defaults()
	// With its client key uncommented the example has one key (its master_key is commented
	// out), whose share is the totals.
	if c.General.Quotas != d.General.Quotas {
		t.Errorf("the example's quotas = %+v; want the defaults %+v", c.General.Quotas, d.General.Quotas)
	}
	ic, di := c.Interception, d.Interception
	if ic.MaxCallsPerTurn != di.MaxCallsPerTurn || ic.MaxExecutions != di.MaxExecutions || ic.MaxCodeSize != di.MaxCodeSize || ic.MaxResponseOutput != di.MaxResponseOutput {
		t.Errorf("the example's limits = %+v; want the defaults %+v", ic, di)
	}
	k, ok := c.General.ClientKeyFor("sk-analytics")
	want := d.General.Quotas
	want.MaxContainersPerKey, want.ContainerCreatesPerMinute, want.ContainerCreateBurst, want.MaxConcurrentRequestsPerKey = 8, 10, 5, 4
	if !ok || k.Name != "analytics" || k.Quotas != want {
		t.Errorf("the example's client key = %+v, %v", k, ok)
	}
}
