package local

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/egress/egresstest"
	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// TestEgress runs real code in a real sandbox against servers on this host's loopback, named
// through a DNS server the test controls: what the policy allows is reached through the egress
// proxy and nothing else is; pip installs a package from an index; a domain secret reaches its
// server and never the sandbox.
func TestEgress(t *testing.T) {
	const secret = "sk-egress-test-5b1f0c"
	roots := egresstest.NewPKI(t)
	cert := roots.Issue(t, "api.secret.test")
	var mu sync.Mutex
	var auth []string
	api := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		io.WriteString(w, "api ok")
	}))
	api.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	api.StartTLS()
	defer api.Close()
	index := httptest.NewServer(egresstest.Index(t, "ciproxy-hello", "1.0", "GREETING = 'hello from a wheel'\n"))
	defer index.Close()
	dns := egresstest.NewDNS(t)
	loop := netip.MustParseAddr("127.0.0.1")
	for _, n := range []string{"pypi.test", "api.secret.test", "refused.test"} {
		dns.Set(n, loop)
	}
	indexPort, apiPort := index.Listener.Addr().(*net.TCPAddr).Port, api.Listener.Addr().(*net.TCPAddr).Port

	p, err := newProvider(testOptions(Options{
		Tool:    "egress-test",
		Network: egress.Bound{Policy: egress.Policy{Domains: []string{"pypi.test", "*.secret.test", "refused.test"}}},
		Egress: egress.Settings{AllowPrivate: true, DNSServer: dns.Addr(), HTTPPorts: []int{indexPort},
			TLSPorts: []int{apiPort}, MaxConnections: 16},
	}), testKnobs(knobs{egressRoots: roots.Pool}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	h := create(t, p, sandbox.CreateOptions{Network: egress.Policy{
		Domains: []string{"pypi.test", "api.secret.test"},
		Secrets: []egress.Secret{{Domain: "api.secret.test", Name: "API_TOKEN", Value: secret}},
	}})

	t.Run("pip install", func(t *testing.T) {
		res := run(t, p, h, fmt.Sprintf(`import subprocess, sys
r = subprocess.run([sys.executable, "-m", "pip", "install", "--index-url", "http://pypi.test:%d/simple/",
    "--trusted-host", "pypi.test", "ciproxy-hello"], capture_output=True, text=True)
print(r.returncode, r.stdout[-2000:], r.stderr[-2000:])
import ciproxy_hello
ciproxy_hello.GREETING, ciproxy_hello.__file__`, indexPort))
		if got := mainText(res); !strings.Contains(got, "'hello from a wheel'") || !strings.Contains(got, "'/tmp/.local/lib/python3.") {
			t.Fatalf("import after pip install: %s\n%s%v", got, res.Stdout, res.Error)
		}
	})
	t.Run("secret", func(t *testing.T) {
		res := run(t, p, h, fmt.Sprintf(`import urllib.request
req = urllib.request.Request("https://api.secret.test:%d/v1", headers={"Authorization": "Bearer $API_TOKEN"})
urllib.request.urlopen(req, timeout=20).read().decode()`, apiPort))
		if got := mainText(res); got != "api ok" {
			t.Fatalf("%s %v", got, res.Error)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(auth) != 1 || auth[0] != "Bearer "+secret {
			t.Errorf("the server saw %q", auth)
		}
	})
	t.Run("refused", func(t *testing.T) {
		res := run(t, p, h, `import urllib.request, urllib.error, socket
out = []
for url in ["http://refused.test/", "https://refused.test/", "http://10.0.0.1/"]:
    try:
        urllib.request.urlopen(url, timeout=20)
        out.append("reached " + url)
    except urllib.error.HTTPError as e:
        out.append("%d %s" % (e.code, e.read().decode().strip()))
    except Exception as e:
        out.append("%s: %s" % (type(e).__name__, e))
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("1.1.1.1", 80))
    out.append("direct connection made")
except OSError as e:
    out.append("direct: " + e.strerror)
out`)
		got := mainText(res)
		for _, want := range []string{
			"403 ciproxy egress: refused.test is not in this container's allowed domains",
			"Tunnel connection failed: 403 Forbidden",
			"403 ciproxy egress: 10.0.0.1 is an IP address",
			"direct: Network is unreachable",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("missing %q in %s", want, got)
			}
		}
	})
	t.Run("secret not in the sandbox", func(t *testing.T) {
		res := run(t, p, h, fmt.Sprintf(`import os
secret = %q
found = []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for name in ("environ", "cmdline"):
        try:
            if secret.encode() in open(f"/proc/{pid}/{name}", "rb").read():
                found.append(f"/proc/{pid}/{name}")
        except OSError:
            pass
for root in ("/mnt/data", "/tmp", "/etc", "/opt", "/dev/shm"):
    for d, _, files in os.walk(root):
        for f in files:
            try:
                if secret.encode() in open(os.path.join(d, f), "rb").read():
                    found.append(os.path.join(d, f))
            except OSError:
                pass
found, os.environ["HTTPS_PROXY"]`, secret))
		if got := mainText(res); got != "([], 'http://127.0.0.1:3128')" {
			t.Errorf("%s", got)
		}
	})
	t.Run("disabled", func(t *testing.T) {
		off := create(t, p, sandbox.CreateOptions{})
		res := run(t, p, off, fmt.Sprintf(`import urllib.request, urllib.error
try:
    urllib.request.urlopen("http://pypi.test:%d/simple/", timeout=20)
    r = "reached"
except urllib.error.HTTPError as e:
    r = "%%d %%s" %% (e.code, e.read().decode().strip())
r`, indexPort))
		if got := mainText(res); !strings.Contains(got, "403 ciproxy egress: this container has no network access") {
			t.Errorf("%s", got)
		}
	})
}

// TestEgressNPM: with node offered from the host (host_paths) and a registry allowlisted, npm
// install works through the egress proxy and the package loads.
func TestEgressNPM(t *testing.T) {
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skip("no npm on this host")
	}
	cli, err := filepath.EvalSymlinks(npm)
	if err != nil {
		t.Fatal(err)
	}
	modules := cli
	for filepath.Base(modules) != "node_modules" && modules != "/" {
		modules = filepath.Dir(modules)
	}
	if modules == "/" {
		t.Skipf("npm (%s) is not in a node_modules directory", cli)
	}
	registry := httptest.NewUnstartedServer(nil)
	port := registry.Listener.Addr().(*net.TCPAddr).Port
	registry.Config.Handler = egresstest.NPMRegistry(t, fmt.Sprintf("http://npm.test:%d", port), "ciproxy-hello", "1.0.0",
		"module.exports = {greeting: 'hello from npm'};\n")
	registry.Start()
	defer registry.Close()
	dns := egresstest.NewDNS(t)
	dns.Set("npm.test", netip.MustParseAddr("127.0.0.1"))
	p, err := newProvider(testOptions(Options{
		Tool: "egress-npm", HostPaths: []string{modules},
		Network: egress.Bound{Policy: egress.Policy{Domains: []string{"npm.test"}}},
		Egress:  egress.Settings{AllowPrivate: true, DNSServer: dns.Addr(), HTTPPorts: []int{port}, TLSPorts: []int{443}},
	}), testKnobs(knobs{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	h := create(t, p, sandbox.CreateOptions{Network: egress.Policy{Domains: []string{"npm.test"}}})
	res := run(t, p, h, fmt.Sprintf(`import subprocess
r = subprocess.run(["npm", "install", "--registry", "http://npm.test:%d/", "ciproxy-hello"], cwd="/mnt/data", capture_output=True, text=True)
n = subprocess.run(["node", "-e", "console.log(require('ciproxy-hello').greeting)"], cwd="/mnt/data", capture_output=True, text=True)
print(r.returncode, r.stdout[-1500:], r.stderr[-1500:], n.stdout, n.stderr[-1500:])`, port))
	if !strings.Contains(res.Stdout, "hello from npm") {
		t.Fatalf("npm install: %s %v", res.Stdout, res.Error)
	}
}
