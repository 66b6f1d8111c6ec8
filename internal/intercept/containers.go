package intercept

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

// containerManager is what the loop needs of containers.Manager: containers by owner, created
// and opened, and the files recorded for one. Tests that run no code fake it.
type containerManager interface {
	Create(ctx context.Context, tool, owner string, opts sandbox.CreateOptions, idle time.Duration) (heldContainer, error)
	Open(ctx context.Context, id, owner string) (heldContainer, error)
	// Files lists the files recorded for owner's container id, as containers.Manager.Files.
	Files(ctx context.Context, owner, id string, q store.ContainerFileQuery) (store.List[store.ContainerFile], error)
	// CheckNetwork returns the policy tool gives a new container for the network policy asked,
	// as containers.Manager.CheckNetwork.
	CheckNetwork(ctx context.Context, tool string, asked *egress.Policy) (egress.Policy, error)
}

// heldContainer is what the loop does with the container it holds; *containers.Container
// implements it.
type heldContainer interface {
	ID() string
	// Place places files as containers.Container.Place does, deduplication and
	// *containers.FileError included.
	Place(ctx context.Context, files []containers.Placement, lim containers.ContainerLimits) ([]store.ContainerFile, error)
	// Execute runs code, then records the files it created or changed under /mnt/data, as
	// containers.Container.Execute does (an execution whose files alone could not be collected
	// returns its result and an error wrapping containers.ErrCollect).
	Execute(ctx context.Context, code string, opts sandbox.RunOptions, lim containers.ContainerLimits) (sandbox.Result, containers.Outputs, error)
	// Shell runs shell commands one after the other, then records the files they wrote, as
	// containers.Container.Shell does.
	Shell(ctx context.Context, commands []string, opts func(i int) sandbox.ExecOptions, ended func(i int, res sandbox.ExecResult), lim containers.ContainerLimits) (containers.Outputs, error)
	// Release ends the request's use of the container; Discard also deletes it once nobody else
	// holds it (its id never reached anyone).
	Release(ctx context.Context)
	Discard(ctx context.Context)
}

var _ heldContainer = (*containers.Container)(nil)

// manager is *containers.Manager as a containerManager: Create and Open return the interface.
type manager struct{ *containers.Manager }

func (m manager) Create(ctx context.Context, tool, owner string, opts sandbox.CreateOptions, idle time.Duration) (heldContainer, error) {
	c, err := m.Manager.Create(ctx, tool, owner, opts, idle)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (m manager) Open(ctx context.Context, id, owner string) (heldContainer, error) {
	c, err := m.Manager.Open(ctx, id, owner)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// noSessions is the containers of an Engine without Containers: nothing can be created.
type noSessions struct{}

func (noSessions) Create(context.Context, string, string, sandbox.CreateOptions, time.Duration) (heldContainer, error) {
	return nil, fmt.Errorf("%w: no sandbox sessions configured", sandbox.ErrUnavailable)
}

func (noSessions) Open(context.Context, string, string) (heldContainer, error) {
	return nil, sandbox.ErrNotFound
}

func (noSessions) CheckNetwork(_ context.Context, tool string, asked *egress.Policy) (egress.Policy, error) {
	return sandbox.NetworkPolicy(nil, tool, "", asked)
}

func (noSessions) Files(context.Context, string, string, store.ContainerFileQuery) (store.List[store.ContainerFile], error) {
	return store.List[store.ContainerFile]{}, nil
}

// containerFuture is the request's container, opened or being created.
type containerFuture struct {
	done    chan struct{}
	cancel  context.CancelFunc
	c       heldContainer
	err     error
	created bool // this request created the sandbox (it is not the client's already)
	stored  bool // its id reached the response store
}

// get waits for the container.
func (f *containerFuture) get(ctx context.Context) (heldContainer, error) {
	select {
	case <-f.done:
		return f.c, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ready returns the container if it is open already, without waiting.
func (f *containerFuture) ready() (heldContainer, bool) {
	select {
	case <-f.done:
		return f.c, f.err == nil && f.c != nil
	default:
		return nil, false
	}
}

// startContainer opens the container the request names (synchronously: a wrong id must be a 404
// before anything is written) or starts creating one beside the first upstream call, so the
// model's first code does not wait for a cold start.
func (r *run) startContainer(ctx context.Context) *apierror.Error {
	f := &containerFuture{done: make(chan struct{})}
	r.cont = f
	if !r.req.sandboxed() {
		// Neither code nor hosted shell commands run, so no container is opened.
		f.cancel = func() {}
		f.err = errNoContainer
		close(f.done)
		return nil
	}
	if id := r.req.container.id; id != "" {
		f.cancel = func() {}
		f.c, f.err = r.e.sessions.Open(ctx, id, r.caller)
		close(f.done)
		if f.err != nil {
			if errors.Is(f.err, sandbox.ErrNotFound) {
				return apierror.NotFound("Container with id '"+id+"' not found.", r.req.container.param)
			}
			r.e.m.sandboxErr.WithLabelValues("open").Inc()
			return sandboxUnavailable(f.err)
		}
		return nil
	}
	cctx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	go func() {
		defer close(f.done)
		// A conversation keeps its container while it lives (Plan.Container): live opens each
		// one it asks, and the first that opens is the request's.
		_, _ = r.req.containerFor(cctx, func(ctx context.Context, id string) (bool, error) {
			c, err := r.e.sessions.Open(ctx, id, r.caller)
			if err != nil {
				return false, nil
			}
			f.c = c
			return true, nil
		})
		if f.c != nil {
			return
		}
		f.c, f.err = r.e.sessions.Create(cctx, r.tool, r.caller, sandbox.CreateOptions{MemoryLimit: r.req.container.memoryLimit, NetworkPolicy: r.req.container.network, KernelIdle: r.ic.KernelIdleTimeout}, r.ic.ContainerIdleTimeout)
		f.created = f.err == nil
	}()
	return nil
}

// handContainer gives the translator the container's id when the first stand-in call starts,
// waiting for the container if it is still being created.
func (r *run) handContainer(ctx context.Context) error {
	c, err := r.cont.get(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.e.m.sandboxErr.WithLabelValues("create").Inc()
		return sandboxUnavailable(err)
	}
	r.tr.setContainer(c.ID())
	if r.cont.created {
		r.tr.setAllFiles(nil) // a new container holds only what this request placed and collects
	}
	return nil
}

// handFiles gives the translator every file of the container, when a message links a file the
// request has not seen (one written in an earlier turn). Without a container there is none.
func (r *run) handFiles(ctx context.Context) error {
	c, err := r.cont.get(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.tr.setAllFiles(nil)
		return nil
	}
	l, err := r.e.sessions.Files(ctx, r.caller, c.ID(), store.ContainerFileQuery{Page: store.Page{Order: store.Asc}})
	files := l.Items
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.e.m.sandboxErr.WithLabelValues("files").Inc()
		r.e.log.Warn("listing the container's files failed; its links are not cited", zap.Error(err))
	}
	r.tr.setAllFiles(files)
	return nil
}

// releaseContainer ends the request's use of its container, on every path. A creation still in
// progress is cancelled (nothing needs it any more) and waited for, so nothing is lost. A sandbox
// this request created but whose id never reached anyone (no call item showed it and no stored
// response names it) is deleted at once: nobody could ever reuse it.
func (r *run) releaseContainer(ctx context.Context) {
	f := r.cont
	if f == nil {
		return
	}
	f.cancel()
	<-f.done
	if f.c != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		release(rctx, f.c, f.created, f.stored || r.tr.startedCalls(), r.ic.ContainerIdleTimeout)
	}
}

// release ends a request's use of c. A container the request created is discarded when its id
// reached nobody, or when it was made to live no longer than the request (idle 0, the
// request's container_idle_timeout). Any other keeps the idle timeout it was created with (one
// made through the Containers API keeps its own expires_after, whatever the request's idle).
func release(ctx context.Context, c heldContainer, created, reached bool, idle time.Duration) {
	if created && (!reached || idle <= 0) {
		c.Discard(ctx)
		return
	}
	c.Release(ctx)
}

// errNoContainer is the container of a request without a code_interpreter tool.
var errNoContainer = errors.New("the request has no code_interpreter tool")

func sandboxUnavailable(err error) *apierror.Error {
	if q := quotaExceeded(err); q != nil {
		return q
	}
	return apierror.BadGateway("The code interpreter sandbox is unavailable.", apierror.CodeSandboxUnavailable, err)
}
