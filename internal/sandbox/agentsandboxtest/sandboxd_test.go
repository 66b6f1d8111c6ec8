package agentsandboxtest

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox/processv1"
)

// serveSandboxd serves a Sandboxd rooted at a new directory on loopback, as cmd/sandboxd does.
func serveSandboxd(t *testing.T) (processv1.ProcessServiceClient, string, string, *Sandboxd) {
	t.Helper()
	root := t.TempDir()
	d := NewSandboxd(root, append(os.Environ(), "SANDBOX_NAME=direct", "SANDBOX_TOKEN=hidden"))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	d.RegisterGRPC(gs)
	go func() { _ = gs.Serve(lis) }()
	hs := httptest.NewServer(d.RESTHandler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.ShutdownProcesses(ctx)
		gs.Stop()
		hs.Close()
	})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return processv1.NewProcessServiceClient(conn), hs.URL, root, d
}

// TestSandboxdDirect: commands run as this process's children, in the root or a cwd under it,
// with the request's environment over the daemon's; what they write is served by the files API
// and the other way round; a signal reaches the command's whole group.
func TestSandboxdDirect(t *testing.T) {
	c, url, root, _ := serveSandboxd(t)
	ctx := context.Background()
	if err := os.Mkdir(filepath.Join(root, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	sub := "sub"
	resp, err := c.Execute(ctx, &processv1.ExecuteRequest{Config: &processv1.ProcessConfig{
		Command: []string{"sh", "-c", `echo "$PPID $SANDBOX_NAME $X"; pwd; echo out > made.txt`},
		EnvVars: map[string]string{"X": "from-request"},
		Cwd:     &sub,
	}})
	if err != nil {
		t.Fatal(err)
	}
	realRoot, _ := filepath.EvalSymlinks(root)
	want := strings.Join([]string{strconv.Itoa(os.Getpid()) + " direct from-request", filepath.Join(realRoot, "sub"), ""}, "\n")
	if resp.GetExitCode() != 0 || string(resp.GetStdout()) != want {
		t.Errorf("Execute: exit %d, stdout %q (want %q), stderr %q", resp.GetExitCode(), resp.GetStdout(), want, resp.GetStderr())
	}
	got := httpGet(t, url+"/v1/files/sub/made.txt")
	if got != "out\n" {
		t.Errorf("files API read of what the command wrote: %q", got)
	}
	req, _ := http.NewRequest(http.MethodPut, url+"/v1/files/new/dir/in.txt?mode=0600", strings.NewReader("in"))
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode/100 != 2 {
		t.Fatalf("PUT: %s", r.Status)
	}
	if b, err := os.ReadFile(filepath.Join(root, "new/dir/in.txt")); err != nil || string(b) != "in" {
		t.Errorf("PUT wrote %q, %v", b, err)
	}
	if m := httpGet(t, url+"/v1/metadata"); !strings.Contains(m, `"SANDBOX_NAME":"direct"`) || strings.Contains(m, "hidden") {
		t.Errorf("metadata: %s", m)
	}

	// Escaping cwd and unknown commands: upstream's codes.
	up := "../.."
	if _, err := c.Execute(ctx, &processv1.ExecuteRequest{Config: &processv1.ProcessConfig{Command: []string{"true"}, Cwd: &up}}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("cwd ../..: %v", err)
	}
	if _, err := c.Execute(ctx, &processv1.ExecuteRequest{Config: &processv1.ProcessConfig{Command: []string{"no-such-command-here"}}}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown command: %v", err)
	}

	// SIGTERM to a running command reaches its group: the shell and its sleep both end.
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	st, err := c.Start(sctx, &processv1.StartRequest{Config: &processv1.ProcessConfig{Command: []string{"sh", "-c", "sleep 30 & echo started; wait"}}})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := st.Recv()
	if err != nil || ev.GetInit() == nil {
		t.Fatalf("first event: %v, %v", ev, err)
	}
	pid := ev.GetInit().GetProcessId()
	if ev, err := st.Recv(); err != nil || string(ev.GetStdout()) != "started\n" {
		t.Fatalf("second event: %v, %v", ev, err)
	}
	if _, err := c.SendSignal(ctx, &processv1.SendSignalRequest{ProcessId: pid, Signal: processv1.Signal_SIGNAL_SIGTERM}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		ev, err := st.Recv()
		if err == io.EOF {
			t.Fatal("no exit event")
		}
		if err != nil {
			t.Fatal(err)
		}
		if e := ev.GetExit(); e != nil {
			if e.GetExitCode() != -1 || time.Since(start) > 5*time.Second {
				t.Errorf("exit %d after %s", e.GetExitCode(), time.Since(start))
			}
			break
		}
	}
}

// TestSandboxdShutdown: ShutdownProcesses ends the commands that run (SIGTERM, then SIGKILL for
// those that ignore it) and refuses new ones.
func TestSandboxdShutdown(t *testing.T) {
	c, _, _, d := serveSandboxd(t)
	ctx := context.Background()
	st, err := c.Start(ctx, &processv1.StartRequest{Config: &processv1.ProcessConfig{Command: []string{"sh", "-c", "trap '' TERM; echo up; sleep 60"}}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	d.ShutdownProcesses(sctx)
	if time.Since(start) > 5*time.Second {
		t.Errorf("ShutdownProcesses took %s", time.Since(start))
	}
	if _, err := c.Execute(ctx, &processv1.ExecuteRequest{Config: &processv1.ProcessConfig{Command: []string{"true"}}}); status.Code(err) != codes.Unavailable {
		t.Errorf("Execute after shutdown: %v", err)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	r, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return string(b)
}
