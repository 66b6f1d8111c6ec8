package agentsandboxtest

import (
	"context"
	"net/http"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox/processv1"
)

// Sandboxd is the double's sandboxd (its ProcessService and files API) for commands run as
// plain child processes of this one, in their own process group, as the real sandboxd runs them
// as the process of its container: no pod of the double around them, the files API rooted at a
// directory that is the commands' own. cmd/sandboxd serves it as a stand-in for agent-sandbox's
// sandboxd, to build and test the sandbox image (deploy/kubernetes/agent-sandbox/Dockerfile)
// without agent-sandbox's own image.
type Sandboxd struct {
	procs *processServer
	files *filesServer
}

// NewSandboxd is a Sandboxd rooted at rootDir, which must exist: commands start there and the
// files API serves it; env is the environment commands' own is merged over (usually
// os.Environ()), and what GET /v1/metadata shows (its SANDBOX_ variables).
func NewSandboxd(rootDir string, env []string) *Sandboxd {
	files := newFilesServer(rootDir, env)
	files.podRoot = ""
	files.owner = -1
	return &Sandboxd{
		procs: &processServer{env: env, dataDir: rootDir, root: rootDir, launch: directLauncher{}},
		files: files,
	}
}

// RegisterGRPC registers the ProcessService on s.
func (d *Sandboxd) RegisterGRPC(s *grpc.Server) { processv1.RegisterProcessServiceServer(s, d.procs) }

// RESTHandler is the files API (and /v1/health, /v1/metadata).
func (d *Sandboxd) RESTHandler() http.Handler { return d.files.handler() }

// ShutdownProcesses refuses new commands, sends SIGTERM to the groups of those that run, and
// SIGKILL to what is left when ctx ends, then waits for them (upstream's shutdown sweep).
func (d *Sandboxd) ShutdownProcesses(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		d.procs.wait()
		close(done)
	}()
	d.procs.signalAll(syscall.SIGTERM)
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	for {
		d.procs.signalAll(syscall.SIGKILL)
		select {
		case <-done:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// signalAll sends sig to every running command.
func (s *processServer) signalAll(sig syscall.Signal) {
	s.mu.Lock()
	procs := make([]*managedProcess, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		_ = p.signal(sig)
	}
}
