package opensandboxtest_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/sandbox/opensandboxtest"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/localsandbox"
)

var sandboxes = localsandbox.New(local.Options{PoolSize: -1})

func TestMain(m *testing.M) { testutil.Main(m, sandboxes.Close) }

// TestOfficialSDK drives the double with OpenSandbox's own JavaScript SDK
// (@alibaba-group/opensandbox 0.1.11, testdata/sdk_check.mjs): create with its readiness check,
// info, commands, files, renew, kill. It needs node and the package testdata/sdk pins
// (scripts/deps.sh installs it); CIPROXY_CLIENT_TESTS=1 makes their absence a failure.
func TestOfficialSDK(t *testing.T) {
	required := os.Getenv("CIPROXY_CLIENT_TESTS") == "1"
	dir, err := filepath.Abs(filepath.Join("testdata", "sdk"))
	if err != nil {
		t.Fatal(err)
	}
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "node_modules", "@alibaba-group", "opensandbox"))
	}
	if err != nil {
		if required {
			t.Fatalf("the official OpenSandbox SDK is needed (run scripts/deps.sh): %v", err)
		}
		t.Skipf("node or the official OpenSandbox SDK is missing (run scripts/deps.sh): %v", err)
	}
	srv := opensandboxtest.New(sandboxes.Provider(t))
	defer srv.Close()
	script, err := filepath.Abs(filepath.Join("testdata", "sdk_check.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	// An ES module resolves packages from its own directory upwards: run a copy inside sdk/.
	src, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(dir, ".sdk_check.mjs")
	if err := os.WriteFile(run, src, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(run)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, run)
	cmd.Env = append(os.Environ(), "OSB_API_BASE="+srv.URL(), "OSB_API_KEY="+srv.APIKey())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sdk_check: %v\n%s\n%s", err, out, stderr.String())
	}
	t.Logf("sdk_check: %s", out)
	if n := srv.Live(); n != 0 {
		t.Errorf("%d sandboxes live after the SDK killed its sandbox", n)
	}
	if srv.Creates() != 1 {
		t.Errorf("%d creates, want the SDK's one", srv.Creates())
	}
}
