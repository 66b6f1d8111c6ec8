package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/rest"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox/processv1"
	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandboxtest"
	"github.com/ciproxy/ciproxy/internal/sandbox/kernel"
)

// sandboxImage is the agent_sandbox backend's sandbox image under test
// (deploy/kubernetes/agent-sandbox/Dockerfile), as scripts/sandbox-image-test.sh builds it.
var sandboxImage = os.Getenv("CIPROXY_E2E_SANDBOX_IMAGE")

// TestSandboxImage runs the sandbox image as a sandbox pod runs it (its entrypoint, sandboxd,
// as its user 1000) and drives it with the agent_sandbox backend's code: the kernel daemon
// started as the backend starts it at create (and its checksums checked against this proxy's
// kernel), then the backend's Run, Exec, WriteFile, ReadFile and ListFiles against the
// container's sandboxd, as they would against a claimed pod's IP. Only the Kubernetes side of
// the backend (claims, readiness) is not exercised: there is no cluster here.
func TestSandboxImage(t *testing.T) {
	if sandboxImage == "" {
		t.Skip("CIPROXY_E2E_SANDBOX_IMAGE is not set: scripts/sandbox-image-test.sh (make image-test) builds the sandbox image and sets it")
	}
	grpcPort, restPort := loopbackPort(t), loopbackPort(t)
	name := "ciproxy-e2e-sandbox-" + newName()
	// Registered first: a failed podman run may leave a created container.
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := exec.Command("podman", "logs", name).CombinedOutput()
			t.Logf("container log:\n%s", logs)
		}
		if out, err := exec.Command("podman", "--runtime", "runc", "rm", "-f", "-t", "0", name).CombinedOutput(); err != nil {
			t.Errorf("podman rm: %v: %s", err, out)
		}
		left, _ := exec.Command("podman", "ps", "-a", "--filter", "name=^"+name+"$", "--format", "{{.Names}}").Output()
		if s := strings.TrimSpace(string(left)); s != "" {
			t.Errorf("the container is left: %s", s)
		}
	})
	// The host's network with ports of our own: nothing to publish, nothing shared with other
	// containers. The image's entrypoint and user are left as they are.
	var nofile syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("podman", "--runtime", "runc", "run", "-d", "--name", name, "--network", "host", "--no-healthcheck",
		// Within the hard limits podman itself has (runc refuses to raise them), as podmanRun.
		"--ulimit", fmt.Sprintf("nofile=%d:%d", nofile.Max, nofile.Max), "--ulimit", "nproc=16384:16384", sandboxImage,
		"--listen-host=127.0.0.1", fmt.Sprintf("--grpc-port=%d", grpcPort), fmt.Sprintf("--rest-port=%d", restPort)).CombinedOutput()
	if err != nil {
		t.Fatalf("podman run: %v: %s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// sandboxd's health, as the backend waits for it.
	health := fmt.Sprintf("http://127.0.0.1:%d/v1/health", restPort)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(health)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxd's health never answered 200: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	h := sandbox.Handle{Backend: "agent_sandbox", Tool: "sandbox-image", ID: "image-test", TrafficToken: newName(), Domain: "127.0.0.1"}

	// The kernel daemon, started as Provider.Create starts it (kerneld.py start, in /mnt/data,
	// its socket named after the sandbox): it answers the checksums of the image's kernel files,
	// which must be this proxy's.
	conn, err := grpc.NewClient(net.JoinHostPort("127.0.0.1", fmt.Sprint(grpcPort)), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cwd := sandbox.DataDir
	resp, err := processv1.NewProcessServiceClient(conn).Execute(ctx, &processv1.ExecuteRequest{Config: &processv1.ProcessConfig{
		Command: []string{"python3", "-S", kernel.DaemonPath, "start"},
		EnvVars: map[string]string{"CIPROXY_KERNELD_SOCKET": "/tmp/ciproxy-kerneld-" + h.TrafficToken + ".sock"},
		Cwd:     &cwd,
	}})
	if err != nil {
		t.Fatalf("kerneld.py start: %v", err)
	}
	if resp.GetExitCode() != 0 {
		t.Fatalf("kerneld.py start: exit %d: %s", resp.GetExitCode(), resp.GetStderr())
	}
	var sums struct{ Kernel, Daemon string }
	if err := json.Unmarshal(resp.GetStdout(), &sums); err != nil {
		t.Fatalf("kerneld.py start answered no checksums: %q", resp.GetStdout())
	}
	if want := sha256Hex(kernel.Source()); sums.Kernel != want {
		t.Errorf("the image's %s: sha256 %s, this proxy's %s", kernel.Path, sums.Kernel, want)
	}
	if want := sha256Hex(kernel.DaemonSource()); sums.Daemon != want {
		t.Errorf("the image's %s: sha256 %s, this proxy's %s", kernel.DaemonPath, sums.Daemon, want)
	}

	// The backend itself, dialling the "pod IP" at the container's ports. It needs a Kubernetes
	// client to be made, never used here.
	p, err := agentsandbox.New(agentsandbox.Options{
		WarmPool: "sandbox-image", Tool: h.Tool, ProcessPort: grpcPort, FilesPort: restPort,
		RestConfig: &rest.Config{Host: "http://127.0.0.1:1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())

	run := func(code string) sandbox.Result {
		t.Helper()
		res, err := p.Run(ctx, h, code, sandbox.RunOptions{Timeout: 2 * time.Minute})
		if err != nil {
			t.Fatalf("Run(%q): %v", code, err)
		}
		if res.Error != nil {
			t.Fatalf("Run(%q): %s: %s\n%s", code, res.Error.Name, res.Error.Value, res.Error.Traceback)
		}
		return res
	}
	if res := run("print(6*7)"); res.Stdout != "42\n" {
		t.Errorf("print(6*7): stdout %q", res.Stdout)
	}
	// State kept across cells: the daemon's one kernel runs them all.
	run("x = 6")
	if res := run("x * 7"); len(res.Results) != 1 || res.Results[0].Text != "42" {
		t.Errorf("x * 7 after x = 6: results %+v", res.Results)
	}
	if res := run("import numpy, pandas\nprint(numpy.arange(4).sum(), pandas.DataFrame({'a': [1, 2]})['a'].sum())"); res.Stdout != "6 3\n" {
		t.Errorf("numpy and pandas: stdout %q", res.Stdout)
	}
	res := run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
	png := ""
	for _, o := range res.Results {
		if o.PNG != "" {
			png = o.PNG
		}
	}
	if b, err := base64.StdEncoding.DecodeString(png); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("matplotlib: no PNG among %d results (%v)", len(res.Results), err)
	}
	// The processes run as the image's user, 1000, sandboxd too.
	if res := run("import os\nprint(os.getuid(), os.getgid(), os.getcwd())"); res.Stdout != "1000 1000 /mnt/data\n" {
		t.Errorf("the kernel's uid, gid and cwd: %q", res.Stdout)
	}
	var ids strings.Builder
	er, err := p.Exec(ctx, h, "id -u; id -g; stat -c %u /proc/1; cat /proc/1/cmdline | tr '\\0' ' '", sandbox.ExecOptions{
		OnOutput: func(_ sandbox.Stream, s string) { ids.WriteString(s) },
	})
	if err != nil || er.ExitCode != 0 {
		t.Fatalf("Exec: %+v, %v: %s", er, err, ids.String())
	}
	t.Logf("in the container: id -u, id -g, sandboxd's uid and command line: %q", ids.String())
	if got := ids.String(); !strings.HasPrefix(got, "1000\n1000\n1000\n/usr/local/bin/sandboxd --root-dir=/mnt/data ") {
		t.Errorf("a command's uid and gid, sandboxd's uid and command line: %q", got)
	}

	// A file the code writes under /mnt/data, read back through the files API; and one written
	// through it, read by the code.
	run("open('/mnt/data/from-code.txt', 'w').write('written by the code\\n')")
	var got bytes.Buffer
	if _, err := p.ReadFile(ctx, h, "from-code.txt", &got, 1<<20); err != nil || got.String() != "written by the code\n" {
		t.Errorf("ReadFile(from-code.txt): %q, %v", got.String(), err)
	}
	if err := p.WriteFile(ctx, h, "in/from-api.txt", strings.NewReader("written through the files API"), 1<<20); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if res := run("print(open('in/from-api.txt').read())"); res.Stdout != "written through the files API\n" {
		t.Errorf("the code reading a file the files API wrote: %q", res.Stdout)
	}
	l, err := p.ListFiles(ctx, h, 100)
	if err != nil {
		t.Fatalf("ListFiles: %v", err)
	}
	if s := fmt.Sprintf("%+v", l); !strings.Contains(s, "from-code.txt") || !strings.Contains(s, "from-api.txt") {
		t.Errorf("ListFiles: %s", s)
	}

	// The kernel files in the image are byte for byte the embedded ones.
	for path, want := range map[string][]byte{kernel.Path: kernel.Source(), kernel.DaemonPath: kernel.DaemonSource()} {
		var b strings.Builder
		if _, err := p.Exec(ctx, h, "cat "+path, sandbox.ExecOptions{OnOutput: func(_ sandbox.Stream, s string) { b.WriteString(s) }}); err != nil {
			t.Fatal(err)
		}
		if b.String() != string(want) {
			t.Errorf("%s in the image differs from internal/sandbox/kernel's (%d bytes, want %d)", path, b.Len(), len(want))
		}
	}

	// sandboxd ends on SIGTERM (podman stop), as a pod's does when it is deleted: exit 0 within
	// the grace period. The backend's relay is still connected, and a relay takes SIGTERM as an
	// interrupt, not an end: sandboxd kills it at its --shutdown-timeout (10 s).
	start := time.Now()
	if out, err := exec.Command("podman", "--runtime", "runc", "stop", "-t", "30", name).CombinedOutput(); err != nil {
		t.Fatalf("podman stop: %v: %s", err, out)
	}
	t.Logf("podman stop took %s", time.Since(start))
	code, _ := exec.Command("podman", "inspect", "--format", "{{.State.ExitCode}}", name).Output()
	if s := strings.TrimSpace(string(code)); s != "0" || time.Since(start) > 20*time.Second {
		t.Errorf("podman stop: sandboxd exited %s after %s", s, time.Since(start).Round(time.Millisecond))
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// loopbackPort is a TCP port free on 127.0.0.1 when it returns.
func loopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestSandboxImageClaims: the backend's whole life of a sandbox on pods that run the image: the
// agent-sandbox double's API server and controllers, its pods podman containers of the image
// (agentsandboxtest.Options.PodImage), so that Create claims one from the warm pool, waits for
// it, and starts the image's kernel daemon (checking its checksums) itself; then Run, Delete,
// and no container left once the double is closed.
func TestSandboxImageClaims(t *testing.T) {
	if sandboxImage == "" {
		t.Skip("CIPROXY_E2E_SANDBOX_IMAGE is not set: scripts/sandbox-image-test.sh (make image-test) builds the sandbox image and sets it")
	}
	if os.Geteuid() != 0 {
		t.Skip("the agent-sandbox double needs root")
	}
	pods := func() string {
		out, _ := exec.Command("podman", "ps", "-a", "--filter", "name=^ciproxy-asd-", "--format", "{{.Names}}").Output()
		return strings.TrimSpace(string(out))
	}
	before := pods()
	d := agentsandboxtest.New(t, agentsandboxtest.Options{
		Template: "ciproxy-python", WarmPool: "ciproxy-python", WarmPoolReplicas: 1, PodImage: sandboxImage,
	})
	t.Cleanup(func() {
		d.Close()
		if left := pods(); left != before {
			t.Errorf("pod containers left after the double closed: %q (before: %q)", left, before)
		}
	})
	o := agentsandbox.DefaultOptions()
	o.Kubeconfig, o.Namespace, o.WarmPool = d.Kubeconfig(), d.Namespace(), d.WarmPool()
	o.ProcessPort, o.FilesPort = d.ProcessPort(), d.FilesPort()
	o.ReadyTimeout, o.RunTimeout, o.RequestTimeout = 2*time.Minute, time.Minute, 20*time.Second
	o.Tool = "sandbox-image"
	p, err := agentsandbox.New(o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h, err := p.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	// The claimed pod is a container of the image (and the pool has made another).
	if now := pods(); now == before || !strings.Contains(now, "ciproxy-asd-") {
		t.Fatalf("no pod container after Create: %q", now)
	}
	t.Logf("pod containers after Create: %q; the claimed pod at %s", pods(), h.Domain)
	for _, c := range []struct{ code, want string }{{"x = 6*7", ""}, {"print(x)", "42\n"}} {
		res, err := p.Run(ctx, h, c.code, sandbox.RunOptions{})
		if err != nil || res.Error != nil || res.Stdout != c.want {
			t.Fatalf("Run(%q): %+v, %v", c.code, res, err)
		}
	}
	if err := p.WriteFile(ctx, h, "a.txt", strings.NewReader("claimed"), 1<<10); err != nil {
		t.Fatal(err)
	}
	if res, err := p.Run(ctx, h, "print(open('/mnt/data/a.txt').read())", sandbox.RunOptions{}); err != nil || res.Stdout != "claimed\n" {
		t.Fatalf("reading a.txt: %+v, %v", res, err)
	}
	if err := p.Delete(ctx, h); err != nil {
		t.Fatalf("Delete: %v", err)
	}
}
