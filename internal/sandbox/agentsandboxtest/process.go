package agentsandboxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox/processv1"
)

// Timing of upstream's server.go.
const (
	streamChunkSize = 4096
	pipeDrainGrace  = 5 * time.Second
	waitDelay       = 10 * time.Second
)

// processServer is sandboxd's ProcessService, after upstream's
// packages/sandboxd/pkg/server/process.go: the same order of events, chunking, exit codes and
// status codes. How a command is started is its launcher's: inside a pod of the double (nsenter
// into its namespaces, setpriv to uid 1000; podLauncher), or as a plain child process of this
// one, as sandboxd runs them in its container (directLauncher, cmd/sandboxd). Either way each
// command runs in its own process group.
type processServer struct {
	processv1.UnimplementedProcessServiceServer
	// env is the environment that the commands' own is merged over (the daemon's);
	// dataDir the directory of the files API's root here, root the same directory as the
	// commands see it (podRoot in a pod; dataDir itself for directLauncher).
	env     []string
	dataDir string
	root    string
	launch  launcher

	next  atomic.Int32
	mu    sync.Mutex
	procs map[int32]*managedProcess
	// wg counts the commands that run; once stopped (under mu) no more are counted, so that a
	// handler that starts while the pod stops never adds to a WaitGroup being waited on.
	wg      sync.WaitGroup
	stopped bool
}

// launcher starts the commands of a processServer.
type launcher interface {
	// lookPath reports whether argv0 can be run with env's PATH where the commands run,
	// with an error that mapCommandError maps as upstream's exec errors are.
	lookPath(argv0 string, env []string) error
	// command is the exec.Cmd that runs argv in cwd (a path as the commands see it) with env.
	command(ctx context.Context, argv []string, cwd string, env []string) *exec.Cmd
	// signal sends sig to the command whose exec.Cmd's process is pid, and to its group.
	signal(pid int, sig syscall.Signal) error
}

// podLauncher runs commands in a pod of the double: nsenter into its namespaces, setpriv to uid
// 1000. nsenter heads the process group.
type podLauncher struct {
	pod *pod
	srv *Server
}

func (l podLauncher) lookPath(argv0 string, env []string) error {
	return l.srv.lookPath(l.pod, argv0, env)
}

// command: nsenter opens --wd before it enters the namespaces: through /proc/<pid>/root the
// path is resolved in the pod's mount namespace.
func (l podLauncher) command(ctx context.Context, argv []string, cwd string, env []string) *exec.Cmd {
	init := strconv.Itoa(l.pod.initPID)
	args := []string{"-t", init, "-p", "-m", "-i", "-u", "-n", "-r", "--wd=/proc/" + init + "/root" + cwd, "--",
		"setpriv", "--reuid=" + strconv.Itoa(podUID), "--regid=" + strconv.Itoa(podUID), "--clear-groups",
		"--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"}
	args = append(args, argv...)
	l.srv.recordEnv(l.pod.name, argv, env)
	return exec.CommandContext(ctx, l.srv.nsenter, args...)
}

func (l podLauncher) signal(pid int, sig syscall.Signal) error { return signalGroup(pid, sig) }

// directLauncher runs commands as plain child processes, as sandboxd does in its container
// (upstream's buildCommand): the command is looked up with this process's PATH when it starts
// (exec's error, mapped as upstream maps it), and a signal goes to its whole group, as
// upstream's kill(-pgid).
type directLauncher struct{}

func (directLauncher) lookPath(string, []string) error { return nil }

func (directLauncher) command(ctx context.Context, argv []string, cwd string, _ []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = cwd
	return cmd
}

func (directLauncher) signal(pid int, sig syscall.Signal) error { return syscall.Kill(-pid, sig) }

type managedProcess struct {
	cmd    *exec.Cmd
	launch launcher

	mu        sync.Mutex
	stdin     *os.File
	completed bool
}

func (p *managedProcess) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.completed || p.cmd.Process == nil {
		return nil
	}
	return p.launch.signal(p.cmd.Process.Pid, sig)
}

// signalGroup sends sig to the process group that nsenter (leader) heads, except nsenter
// itself: the command and what it started get it, as upstream's kill(-pgid); nsenter then exits
// as its child did (re-raising a fatal signal on itself). SIGKILL goes to the whole group at
// once, nsenter included: a walk of /proc misses a process forked while it runs, which would
// then outlive the kill.
func signalGroup(leader int, sig syscall.Signal) error {
	if sig == syscall.SIGKILL {
		return syscall.Kill(-leader, sig)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == leader {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 2 && f[2] == strconv.Itoa(leader) {
			_ = syscall.Kill(pid, sig)
		}
	}
	return nil
}

func (p *managedProcess) closeStdin() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stdin == nil {
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	return err
}

// begin counts one more running command, or reports that the pod has stopped.
func (s *processServer) begin() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return status.Error(codes.Unavailable, "the pod is stopping")
	}
	s.wg.Add(1)
	return nil
}

// wait stops counting commands and waits for those that run.
func (s *processServer) wait() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.wg.Wait()
}

func mapCommandError(err error, defaultCode codes.Code, msg string) error {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return status.Errorf(codes.NotFound, "%s: command or path not found: %v", msg, err)
	}
	if errors.Is(err, fs.ErrPermission) {
		return status.Errorf(codes.PermissionDenied, "%s: permission denied: %v", msg, err)
	}
	return status.Errorf(defaultCode, "%s: %v", msg, err)
}

// buildCommand is upstream's: env merged over the daemon's (the pod's) environment, cwd confined
// to the root with symlinks evaluated. The exec.Cmd is the launcher's; cancelling ctx kills the
// command's whole process group (upstream kills the command alone; in a pod the command is
// nsenter's child, so its group is what "the process" is).
func (s *processServer) buildCommand(ctx context.Context, config *processv1.ProcessConfig) (*exec.Cmd, error) {
	if config == nil || len(config.GetCommand()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "command is required")
	}
	env := append([]string(nil), s.env...)
	keys := make([]string, 0, len(config.GetEnvVars()))
	for k := range config.GetEnvVars() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, fmt.Sprintf("%s=%s", k, config.GetEnvVars()[k]))
	}
	env = dedupEnv(env)

	cwd := s.root
	if c := config.GetCwd(); c != "" {
		user := c
		if user == s.root || strings.HasPrefix(user, s.root+"/") {
			user = strings.TrimPrefix(strings.TrimPrefix(user, s.root), "/")
		}
		resolved, err := sanitizePath(s.dataDir, user)
		if err != nil {
			if errors.Is(err, errPathEscapes) {
				return nil, status.Errorf(codes.PermissionDenied, "cwd: %v", err)
			}
			return nil, status.Errorf(codes.Internal, "cwd: %v", err)
		}
		if _, err := os.Stat(resolved); err != nil {
			return nil, mapCommandError(&fs.PathError{Op: "chdir", Path: c, Err: err}, codes.Internal, "failed to start command")
		}
		cwd = s.root + strings.TrimPrefix(resolved, realDir(s.dataDir))
	}
	if err := s.launch.lookPath(config.GetCommand()[0], env); err != nil {
		return nil, mapCommandError(err, codes.Internal, "failed to start command")
	}
	cmd := s.launch.command(ctx, config.GetCommand(), cwd, env)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = waitDelay
	return cmd, nil
}

// dedupEnv keeps the last value of each name, as os/exec does.
func dedupEnv(env []string) []string {
	idx := map[string]int{}
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			_ = f.Close()
		}
	}
}

// Start runs a command and streams its output until it exits. A PTY is not supported: a
// request with one gets FAILED_PRECONDITION.
func (s *processServer) Start(req *processv1.StartRequest, stream processv1.ProcessService_StartServer) error {
	if req.Pty != nil {
		return status.Error(codes.FailedPrecondition, "agentsandboxtest: PTY is not supported by the double")
	}
	cmd, err := s.buildCommand(stream.Context(), req.GetConfig())
	if err != nil {
		return err
	}
	if err := s.begin(); err != nil {
		return err
	}
	defer s.wg.Done()
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		return status.Errorf(codes.Internal, "failed to create stdout pipe: %v", err)
	}
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		closeAll(stdoutR, stdoutW)
		return status.Errorf(codes.Internal, "failed to create stderr pipe: %v", err)
	}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		closeAll(stdoutR, stdoutW, stderrR, stderrW)
		return status.Errorf(codes.Internal, "failed to create stdin pipe: %v", err)
	}
	cmd.Stdout, cmd.Stderr, cmd.Stdin = stdoutW, stderrW, stdinR
	if err := cmd.Start(); err != nil {
		closeAll(stdoutR, stdoutW, stderrR, stderrW, stdinR, stdinW)
		return mapCommandError(err, codes.Internal, "failed to start command")
	}
	closeAll(stdoutW, stderrW, stdinR)

	pid := s.next.Add(1)
	proc := &managedProcess{cmd: cmd, launch: s.launch, stdin: stdinW}
	s.mu.Lock()
	if s.procs == nil {
		s.procs = map[int32]*managedProcess{}
	}
	s.procs[pid] = proc
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.procs, pid)
		s.mu.Unlock()
		_ = proc.closeStdin()
	}()

	if err := stream.Send(&processv1.StartResponse{Event: &processv1.StartResponse_Init{Init: &processv1.InitEvent{ProcessId: pid}}}); err != nil {
		_ = proc.signal(syscall.SIGKILL)
		closeAll(stdoutR, stderrR)
		_ = cmd.Wait()
		return status.Errorf(codes.Internal, "failed to send InitEvent: %v", err)
	}

	var streamWg sync.WaitGroup
	var sendMu sync.Mutex
	streamOutput := func(reader io.Reader, isStderr bool) {
		defer streamWg.Done()
		buf := make([]byte, streamChunkSize)
		for {
			n, rErr := reader.Read(buf)
			if n > 0 {
				chunk := bytes.Clone(buf[:n])
				ev := &processv1.StartResponse{Event: &processv1.StartResponse_Stdout{Stdout: chunk}}
				if isStderr {
					ev = &processv1.StartResponse{Event: &processv1.StartResponse_Stderr{Stderr: chunk}}
				}
				sendMu.Lock()
				sErr := stream.Send(ev)
				sendMu.Unlock()
				if sErr != nil {
					return
				}
			}
			if rErr != nil {
				return
			}
		}
	}
	streamWg.Add(2)
	go streamOutput(stdoutR, false)
	go streamOutput(stderrR, true)
	waitErr := cmd.Wait()
	proc.mu.Lock()
	proc.completed = true
	proc.mu.Unlock()
	readersDone := make(chan struct{})
	go func() {
		streamWg.Wait()
		close(readersDone)
	}()
	select {
	case <-readersDone:
	case <-time.After(pipeDrainGrace):
		closeAll(stdoutR, stderrR)
		<-readersDone
	}
	closeAll(stdoutR, stderrR)

	exitCode := int32(0)
	if waitErr != nil {
		var exitErr *exec.ExitError
		if errors.As(waitErr, &exitErr) {
			exitCode = int32(exitErr.ExitCode())
		} else {
			exitCode = -1
		}
	}
	if err := stream.Send(&processv1.StartResponse{Event: &processv1.StartResponse_Exit{Exit: &processv1.ExitEvent{ExitCode: exitCode}}}); err != nil {
		return status.Errorf(codes.Internal, "failed to send ExitEvent: %v", err)
	}
	return nil
}

// Execute runs a command to completion and returns its buffered output.
func (s *processServer) Execute(ctx context.Context, req *processv1.ExecuteRequest) (*processv1.ExecuteResponse, error) {
	cmd, err := s.buildCommand(ctx, req.GetConfig())
	if err != nil {
		return nil, err
	}
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.wg.Done()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	exitCode := int32(0)
	if runErr != nil {
		var exitErr *exec.ExitError
		if !errors.As(runErr, &exitErr) {
			return nil, mapCommandError(runErr, codes.Internal, "failed to execute command")
		}
		exitCode = int32(exitErr.ExitCode())
	}
	return &processv1.ExecuteResponse{ExitCode: exitCode, Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}, nil
}

func (s *processServer) get(id int32) (*managedProcess, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.procs[id]
	return p, ok
}

// WriteStdin sends bytes or EOF to a running process.
func (s *processServer) WriteStdin(_ context.Context, req *processv1.WriteStdinRequest) (*processv1.WriteStdinResponse, error) {
	proc, ok := s.get(req.GetProcessId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "process %d not found", req.GetProcessId())
	}
	if req.GetEof() != nil {
		if err := proc.closeStdin(); err != nil {
			return nil, status.Errorf(codes.Internal, "failed to close stdin: %v", err)
		}
		return &processv1.WriteStdinResponse{}, nil
	}
	proc.mu.Lock()
	stdin := proc.stdin
	proc.mu.Unlock()
	if stdin == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "process %d has no stdin", req.GetProcessId())
	}
	if input := req.GetInput(); len(input) > 0 {
		if _, err := stdin.Write(input); err != nil {
			return nil, status.Errorf(codes.Internal, "failed to write stdin: %v", err)
		}
	}
	return &processv1.WriteStdinResponse{}, nil
}

// SendSignal delivers SIGINT, SIGTERM or SIGKILL to a running process's group.
func (s *processServer) SendSignal(_ context.Context, req *processv1.SendSignalRequest) (*processv1.SendSignalResponse, error) {
	proc, ok := s.get(req.GetProcessId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "process %d not found", req.GetProcessId())
	}
	var sig syscall.Signal
	switch req.GetSignal() {
	case processv1.Signal_SIGNAL_SIGINT:
		sig = syscall.SIGINT
	case processv1.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	case processv1.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	default:
		return nil, status.Errorf(codes.InvalidArgument, "unsupported or unspecified signal: %v", req.GetSignal())
	}
	if err := proc.signal(sig); err != nil {
		return nil, status.Errorf(codes.Internal, "failed to send signal: %v", err)
	}
	return &processv1.SendSignalResponse{}, nil
}

// ResizeTTY: no process here has a PTY, so it is FAILED_PRECONDITION for a running one, as
// upstream answers for a process started without a PTY.
func (s *processServer) ResizeTTY(_ context.Context, req *processv1.ResizeTTYRequest) (*processv1.ResizeTTYResponse, error) {
	if _, ok := s.get(req.GetProcessId()); !ok {
		return nil, status.Errorf(codes.NotFound, "process %d not found", req.GetProcessId())
	}
	return nil, status.Errorf(codes.FailedPrecondition, "failed to resize TTY: process %d has no PTY", req.GetProcessId())
}
