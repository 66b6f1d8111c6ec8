package e2e

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ciproxy/ciproxy/internal/egress/egresstest"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestNetworkPolicy runs the binary with a local tool whose operator opened a package index and
// an API (with a secret of the operator's), named through a DNS server the test controls, and
// asks for containers with network policies: the code pip-installs a package the test built and
// calls the API with the request's and the operator's secrets, which reach the API alone; a
// policy outside the operator's bound is OpenAI's 400; the container shows its policy without
// secrets; nothing secret reaches the response, the container or the log.
func TestNetworkPolicy(t *testing.T) {
	t.Parallel()
	const (
		requestSecret  = "sk-request-7f3a9c"
		operatorSecret = "sk-operator-c41d2e"
	)
	roots := egresstest.NewPKI(t)
	// The proxy verifies the API's certificate against this file alone (Go reads SSL_CERT_FILE).
	// Where an image under test sees it too (imageShare), readable by its user.
	dir, err := os.MkdirTemp(imageShare, "ciproxy-e2e-roots-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	rootsFile := filepath.Join(dir, "roots.pem")
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rootsFile, roots.PEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	cert := roots.Issue(t, "api.secret.test")
	var mu sync.Mutex
	var seen []string
	api := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization")+" "+r.Header.Get("X-Operator"))
		mu.Unlock()
		io.WriteString(w, "api ok")
	}))
	api.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	api.StartTLS()
	t.Cleanup(api.Close)
	index := httptest.NewServer(egresstest.Index(t, "ciproxy-hello", "1.0", "GREETING = 'hello from a wheel'\n"))
	t.Cleanup(index.Close)
	dns := egresstest.NewDNS(t)
	for _, n := range []string{"pypi.test", "api.secret.test"} {
		dns.Set(n, netip.MustParseAddr("127.0.0.1"))
	}
	indexPort, apiPort := index.Listener.Addr().(*net.TCPAddr).Port, api.Listener.Addr().(*net.TCPAddr).Port

	up := upstreamtest.New(t)
	up.Script(func(req upstreamtest.Request) upstreamtest.Turn {
		if req.Tool("shell") == nil || itemType(req.History[len(req.History)-1]) == "function_call_output" {
			return runUserCode(req)
		}
		// As runUserCommands, with time for pip in the slowest way of running (no cgroups).
		args, _ := json.Marshal(map[string]any{"commands": strings.Split(lastUserText(req), "\n"), "timeout_ms": 60000, "max_output_length": nil})
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("shell", string(args))}, Usage: callUsage}
	})
	cfg := setup{Upstream: up.URL(), WorkDir: workDir(t), LocalSettings: []string{
		`allowed_domains: ["pypi.test", "*.secret.test"]`,
		`domain_secrets: [{domain: "*.secret.test", name: OP_TOKEN, value: os.environ/E2E_OPERATOR_TOKEN}]`,
		`allow_private_destinations: true`,
		fmt.Sprintf(`dns_server: "%s"`, dns.Addr()),
		fmt.Sprintf(`egress_http_ports: [%d]`, indexPort),
		fmt.Sprintf(`egress_tls_ports: [%d]`, apiPort),
	}}.yaml()
	p := startProxy(t, cfg, "E2E_OPERATOR_TOKEN="+operatorSecret, "SSL_CERT_FILE="+rootsFile)

	code := fmt.Sprintf(`import subprocess, sys, urllib.request
r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--index-url", "http://pypi.test:%d/simple/",
    "--trusted-host", "pypi.test", "ciproxy-hello"], capture_output=True, text=True)
print("pip", r.returncode, r.stderr[-500:])
import ciproxy_hello
print(ciproxy_hello.GREETING)
req = urllib.request.Request("https://api.secret.test:%d/v1", headers={"Authorization": "Bearer $API_TOKEN", "X-Operator": "$OP_TOKEN"})
print(urllib.request.urlopen(req, timeout=20).read().decode())
try:
    urllib.request.urlopen("http://example.com/", timeout=20)
except Exception as e:
    print("refused:", e.read().decode().strip() if hasattr(e, "read") else e)`, indexPort, apiPort)
	policy := map[string]any{"type": "allowlist", "allowed_domains": []string{"pypi.test", "api.secret.test"},
		"domain_secrets": []map[string]string{{"domain": "api.secret.test", "name": "API_TOKEN", "value": requestSecret}}}
	body, _ := json.Marshal(map[string]any{
		"model": clientModel, "input": code,
		"tools": []any{map[string]any{"type": "code_interpreter", "container": map[string]any{"type": "auto", "network_policy": policy}}},
	})
	r := do(t, http.MethodPost, p.URL+"/v1/responses", body)
	if r.Status != 200 {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	out := string(r.Body)
	for _, want := range []string{`pip 0`, "hello from a wheel", "api ok", "ciproxy egress: example.com is not in this container's allowed domains"} {
		if !strings.Contains(out, want) {
			t.Errorf("the answer lacks %q: %.3000s", want, out)
		}
	}
	mu.Lock()
	if len(seen) != 1 || seen[0] != "Bearer "+requestSecret+" "+operatorSecret {
		t.Errorf("the API saw %q", seen)
	}
	mu.Unlock()
	var resp struct {
		Tools []json.RawMessage `json:"tools"`
	}
	json.Unmarshal(r.Body, &resp)
	if len(resp.Tools) != 1 || strings.Contains(string(resp.Tools[0]), "domain_secrets") || !strings.Contains(string(resp.Tools[0]), `"allowed_domains"`) {
		t.Errorf("the echoed tool: %s", resp.Tools)
	}

	// The container, as the Containers API shows it.
	var ids []string
	for _, m := range strings.Split(out, `"container_id":"`)[1:] {
		ids = append(ids, m[:strings.Index(m, `"`)])
	}
	if len(ids) == 0 {
		t.Fatal("no container id in the response")
	}
	c := do(t, http.MethodGet, p.URL+"/v1/containers/"+ids[0], nil)
	var shown struct {
		NetworkPolicy map[string]any `json:"network_policy"`
	}
	if err := json.Unmarshal(c.Body, &shown); err != nil || c.Status != 200 ||
		fmt.Sprint(shown.NetworkPolicy) != "map[allowed_domains:[pypi.test api.secret.test] type:allowlist]" {
		t.Errorf("container: %d %s", c.Status, c.Body)
	}

	// Outside the operator's bound: OpenAI's 400, and the model is never asked.
	calls := len(up.Requests())
	body, _ = json.Marshal(map[string]any{
		"model": clientModel, "input": "1",
		"tools": []any{map[string]any{"type": "code_interpreter", "container": map[string]any{"type": "auto",
			"network_policy": map[string]any{"type": "allowlist", "allowed_domains": []string{"evil.test"}}}}},
	})
	bad := do(t, http.MethodPost, p.URL+"/v1/responses", body)
	if typ, _, msg := apiError(t, bad.Body); bad.Status != 400 || typ != "invalid_request_error" || !strings.Contains(msg, "evil.test") {
		t.Errorf("outside the bound: %d %s", bad.Status, bad.Body)
	}
	if len(up.Requests()) != calls {
		t.Error("the upstream was called for a refused policy")
	}
	// A container created with a policy through the Containers API.
	body, _ = json.Marshal(map[string]any{"name": "net", "network_policy": policy})
	created := do(t, http.MethodPost, p.URL+"/v1/containers", body)
	if created.Status != 200 || strings.Contains(string(created.Body), requestSecret) || !strings.Contains(string(created.Body), `"allowed_domains":["pypi.test","api.secret.test"]`) {
		t.Errorf("POST /v1/containers: %d %s", created.Status, created.Body)
	}

	// The shell tool's container_auto: the commands go out the same way.
	body, _ = json.Marshal(map[string]any{
		"model": clientModel,
		"input": fmt.Sprintf("python3 -m pip install -q --index-url http://pypi.test:%d/simple/ --trusted-host pypi.test ciproxy-hello && python3 -c 'import ciproxy_hello; print(ciproxy_hello.GREETING)'\n"+
			"python3 -c 'import urllib.request; urllib.request.urlopen(\"http://example.com/\")' 2>&1 | tail -1", indexPort),
		"tools": []any{map[string]any{"type": "shell", "environment": map[string]any{"type": "container_auto",
			"network_policy": map[string]any{"type": "allowlist", "allowed_domains": []string{"pypi.test"}}}}},
	})
	sh := do(t, http.MethodPost, p.URL+"/v1/responses", body)
	if sh.Status != 200 || !strings.Contains(string(sh.Body), "hello from a wheel") || !strings.Contains(string(sh.Body), "HTTP Error 403: Forbidden") {
		t.Errorf("shell: %d %.3000s", sh.Status, sh.Body)
	}

	p.Stop()
	for _, secret := range []string{requestSecret, operatorSecret} {
		if strings.Contains(p.Log(), secret) {
			t.Errorf("the log holds a secret")
		}
		if strings.Contains(out, secret) {
			t.Errorf("the response holds a secret")
		}
	}
	if !strings.Contains(p.Log(), "egress refused") || !strings.Contains(p.Log(), ids[0]) {
		t.Errorf("the log lacks the egress decisions with the container id:\n%s", p.Log())
	}
}
