package agentsandboxtest

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox/processv1"
)

func processClient(t *testing.T, s *Server, ip string) processv1.ProcessServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(net.JoinHostPort(ip, strconv.Itoa(s.ProcessPort())), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return processv1.NewProcessServiceClient(conn)
}

// run collects one Start stream: the process id, stdout, stderr and exit code.
type run struct {
	pid            int32
	stdout, stderr strings.Builder
	exit           *int32
	chunks         int
	maxChunk       int
}

func collect(t *testing.T, st processv1.ProcessService_StartClient) *run {
	t.Helper()
	return collectFrom(t, st, true)
}

// collectFrom collects the rest of a stream; first says whether its init is still to come.
func collectFrom(t *testing.T, st processv1.ProcessService_StartClient, first bool) *run {
	t.Helper()
	r := &run{}
	for {
		ev, err := st.Recv()
		if err != nil {
			if r.exit == nil {
				t.Fatalf("stream ended without exit: %v", err)
			}
			return r
		}
		if first != (ev.GetInit() != nil) {
			t.Fatalf("event %v: init must come first and once", ev)
		}
		first = false
		switch e := ev.Event.(type) {
		case *processv1.StartResponse_Init:
			r.pid = e.Init.ProcessId
		case *processv1.StartResponse_Stdout:
			r.stdout.Write(e.Stdout)
			r.chunks++
			r.maxChunk = max(r.maxChunk, len(e.Stdout))
		case *processv1.StartResponse_Stderr:
			r.stderr.Write(e.Stderr)
		case *processv1.StartResponse_Exit:
			c := e.Exit.ExitCode
			r.exit = &c
		}
	}
}

func procStart(t *testing.T, pc processv1.ProcessServiceClient, ctx context.Context, cfg *processv1.ProcessConfig) processv1.ProcessService_StartClient {
	t.Helper()
	st, err := pc.Start(ctx, &processv1.StartRequest{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestProcessStart(t *testing.T) {
	s := New(t, Options{Template: "tmpl", WarmPool: "pool", PodEnv: map[string]string{"SANDBOX_X": "1"},
		ImageFiles: map[string]string{"/opt/ciproxy/hello.txt": "hello image\n"}})
	c := client(t, s)
	_, sb, ip := readyClaim(t, s, c, newClaim("pool"))
	pc := processClient(t, s, ip)
	ctx := context.Background()
	if err := os.Mkdir(s.PodDataDir(sb)+"/sub", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", s.PodDataDir(sb)+"/out"); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		cfg      *processv1.ProcessConfig
		stdout   string
		stderr   string
		exit     int32
		wantCode codes.Code
	}{
		{name: "identity", cfg: &processv1.ProcessConfig{Command: []string{"/bin/sh", "-c", "id -u; id -g; pwd; hostname; echo $SANDBOX_X $EXTRA"}, EnvVars: map[string]string{"EXTRA": "e"}},
			stdout: "1000\n1000\n/mnt/data\n" + sb + "\n1 e\n"},
		{name: "pid namespace", cfg: &processv1.ProcessConfig{Command: []string{"/bin/sh", "-c", "ls /proc | grep -c '^[0-9]' >/dev/null; cat /proc/1/comm"}}, stdout: "bwrap\n"},
		{name: "image file", cfg: &processv1.ProcessConfig{Command: []string{"cat", "/opt/ciproxy/hello.txt"}}, stdout: "hello image\n"},
		{name: "image read-only", cfg: &processv1.ProcessConfig{Command: []string{"/bin/sh", "-c", "echo x > /opt/ciproxy/hello.txt"}}, exit: 2, stderr: "*"},
		{name: "stderr and exit", cfg: &processv1.ProcessConfig{Command: []string{"/bin/sh", "-c", "echo oops >&2; exit 3"}}, stderr: "oops\n", exit: 3},
		{name: "cwd", cfg: &processv1.ProcessConfig{Command: []string{"pwd"}, Cwd: new("sub")}, stdout: "/mnt/data/sub\n"},
		{name: "cwd absolute", cfg: &processv1.ProcessConfig{Command: []string{"pwd"}, Cwd: new("/mnt/data/sub")}, stdout: "/mnt/data/sub\n"},
		{name: "cwd escapes", cfg: &processv1.ProcessConfig{Command: []string{"pwd"}, Cwd: new("../..")}, wantCode: codes.PermissionDenied},
		{name: "cwd symlink escapes", cfg: &processv1.ProcessConfig{Command: []string{"pwd"}, Cwd: new("out")}, wantCode: codes.PermissionDenied},
		{name: "cwd missing", cfg: &processv1.ProcessConfig{Command: []string{"pwd"}, Cwd: new("nope")}, wantCode: codes.NotFound},
		{name: "empty command", cfg: &processv1.ProcessConfig{}, wantCode: codes.InvalidArgument},
		{name: "missing binary", cfg: &processv1.ProcessConfig{Command: []string{"no-such-binary"}}, wantCode: codes.NotFound},
		{name: "missing absolute", cfg: &processv1.ProcessConfig{Command: []string{"/nope/bin"}}, wantCode: codes.NotFound},
		{name: "signal exit", cfg: &processv1.ProcessConfig{Command: []string{"/bin/sh", "-c", "kill -9 $$"}}, exit: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := procStart(t, pc, ctx, tc.cfg)
			if tc.wantCode != codes.OK {
				_, err := st.Recv()
				if status.Code(err) != tc.wantCode {
					t.Fatalf("Start(%v) = %v; want %v", tc.cfg, err, tc.wantCode)
				}
				return
			}
			r := collect(t, st)
			if r.stdout.String() != tc.stdout || (tc.stderr != "*" && r.stderr.String() != tc.stderr) || *r.exit != tc.exit {
				t.Errorf("Start(%v) = %q, %q, %d; want %q, %q, %d", tc.cfg.Command, r.stdout.String(), r.stderr.String(), *r.exit, tc.stdout, tc.stderr, tc.exit)
			}
		})
	}

	t.Run("chunks", func(t *testing.T) {
		r := collect(t, procStart(t, pc, ctx, &processv1.ProcessConfig{Command: []string{"head", "-c", "100000", "/dev/zero"}}))
		if r.stdout.Len() != 100000 || r.maxChunk > 4096 || r.chunks < 25 {
			t.Errorf("%d bytes in %d chunks of at most %d", r.stdout.Len(), r.chunks, r.maxChunk)
		}
	})

	t.Run("stdin", func(t *testing.T) {
		st := procStart(t, pc, ctx, &processv1.ProcessConfig{Command: []string{"cat"}})
		ev, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		pid := ev.GetInit().GetProcessId()
		if _, err := pc.WriteStdin(ctx, &processv1.WriteStdinRequest{ProcessId: pid, Payload: &processv1.WriteStdinRequest_Input{Input: []byte("ping\n")}}); err != nil {
			t.Fatal(err)
		}
		ev, err = st.Recv()
		if err != nil || string(ev.GetStdout()) != "ping\n" {
			t.Fatalf("after WriteStdin: %v, %v", ev, err)
		}
		if _, err := pc.WriteStdin(ctx, &processv1.WriteStdinRequest{ProcessId: pid, Payload: &processv1.WriteStdinRequest_Eof{}}); err != nil {
			t.Fatal(err)
		}
		ev, err = st.Recv()
		if err != nil || ev.GetExit() == nil || ev.GetExit().ExitCode != 0 {
			t.Fatalf("after EOF: %v, %v", ev, err)
		}
		// The process leaves the registry when its stream's handler returns, just after exit
		// is sent (as upstream's deferred Remove); until then its closed stdin is
		// FAILED_PRECONDITION.
		waitFor(t, "ended process unknown", func() bool {
			_, err := pc.WriteStdin(ctx, &processv1.WriteStdinRequest{ProcessId: pid, Payload: &processv1.WriteStdinRequest_Input{Input: []byte("x")}})
			if c := status.Code(err); c != codes.NotFound && c != codes.FailedPrecondition {
				t.Fatalf("WriteStdin to an ended process = %v", err)
			}
			return status.Code(err) == codes.NotFound
		})
		if _, err := pc.SendSignal(ctx, &processv1.SendSignalRequest{ProcessId: 999, Signal: processv1.Signal_SIGNAL_SIGINT}); status.Code(err) != codes.NotFound {
			t.Errorf("SendSignal to an unknown process = %v; want NotFound", err)
		}
	})

	t.Run("signal group", func(t *testing.T) {
		st := procStart(t, pc, ctx, &processv1.ProcessConfig{Command: []string{"/bin/sh", "-c", "trap 'echo int; exit 7' INT; echo up; while :; do sleep 0.01; done"}})
		ev, _ := st.Recv()
		pid := ev.GetInit().GetProcessId()
		if ev, err := st.Recv(); err != nil || string(ev.GetStdout()) != "up\n" {
			t.Fatalf("%v %v", ev, err)
		}
		if _, err := pc.SendSignal(ctx, &processv1.SendSignalRequest{ProcessId: pid, Signal: processv1.Signal_SIGNAL_UNSPECIFIED}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("SendSignal(unspecified) = %v; want InvalidArgument", err)
		}
		if _, err := pc.SendSignal(ctx, &processv1.SendSignalRequest{ProcessId: pid, Signal: processv1.Signal_SIGNAL_SIGINT}); err != nil {
			t.Fatal(err)
		}
		r := collectFrom(t, st, false)
		if !strings.Contains(r.stdout.String(), "int") || *r.exit != 7 {
			t.Errorf("after SIGINT: %q exit %d", r.stdout.String(), *r.exit)
		}
	})

	t.Run("cancel kills", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		st := procStart(t, pc, cctx, &processv1.ProcessConfig{Command: []string{"/bin/sh", "-c", "echo $$ > /mnt/data/pid; exec sleep 1000"}})
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
		var hostPID int
		waitFor(t, "sleep running", func() bool {
			hostPID = findHostPID(t, s, sb, "sleep 1000")
			return hostPID != 0
		})
		cancel()
		waitFor(t, "sleep killed", func() bool { return !procAlive(hostPID) })
	})

	t.Run("pty", func(t *testing.T) {
		st, err := pc.Start(ctx, &processv1.StartRequest{Config: &processv1.ProcessConfig{Command: []string{"true"}}, Pty: &processv1.PTY{Cols: 80, Rows: 24}})
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("Start with a PTY = %v; want FailedPrecondition", err)
		}
	})

	t.Run("execute", func(t *testing.T) {
		r, err := pc.Execute(ctx, &processv1.ExecuteRequest{Config: &processv1.ProcessConfig{Command: []string{"/bin/sh", "-c", "echo a; echo b >&2; exit 4"}}})
		if err != nil || string(r.Stdout) != "a\n" || string(r.Stderr) != "b\n" || r.ExitCode != 4 {
			t.Errorf("Execute = %v, %v", r, err)
		}
	})

	if envs := s.ProcessEnvs(); len(envs) == 0 || envs[0].Pod != sb {
		t.Errorf("ProcessEnvs = %v", envs)
	}
}

// findHostPID finds a process whose command line is cmdline among the pod's processes (in its pid namespace).
func findHostPID(t *testing.T, s *Server, sb, cmdline string) int {
	t.Helper()
	init := s.PodInitPID(sb)
	ns, err := os.Readlink("/proc/" + strconv.Itoa(init) + "/ns/pid")
	if err != nil {
		return 0
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == init {
			continue
		}
		if l, _ := os.Readlink("/proc/" + e.Name() + "/ns/pid"); l != ns {
			continue
		}
		if b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline"); strings.ReplaceAll(string(b), "\x00", " ") == cmdline+" " {
			return pid
		}
	}
	return 0
}

// procAlive reports whether pid runs (a zombie does not count).
func procAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z" && syscall.Kill(pid, 0) == nil
}

var _ = time.Second
