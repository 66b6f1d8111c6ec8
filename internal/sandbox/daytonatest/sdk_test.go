package daytonatest_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestOfficialSDK runs Daytona's own TypeScript SDK (@daytonaio/sdk, pinned in test/node) against
// the double (testdata/sdk_check.cjs). It needs node and test/node's packages (scripts/deps.sh
// installs them); with CIPROXY_CLIENT_TESTS=1 (make test) their absence is a failure, else a skip.
func TestOfficialSDK(t *testing.T) {
	required := os.Getenv("CIPROXY_CLIENT_TESTS") == "1"
	dir, _ := filepath.Abs(filepath.Join("..", "..", "..", "test", "node"))
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "node_modules", "@daytonaio", "sdk"))
	}
	if err != nil {
		if required {
			t.Fatalf("the official Daytona SDK is needed (run scripts/deps.sh): %v", err)
		}
		t.Skipf("node or the official Daytona SDK is missing (run scripts/deps.sh): %v", err)
	}
	srv := newDouble(t)
	script, err := filepath.Abs("testdata/sdk_check.cjs")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node_modules"),
		"DAYTONA_API_URL="+srv.URL(), "DAYTONA_API_KEY="+srv.APIKey())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sdk_check: %v\n%s\n%s", err, out, stderr.String())
	}
	if srv.Live() != 0 {
		t.Errorf("Live = %d after the SDK deleted its sandbox", srv.Live())
	}
}
