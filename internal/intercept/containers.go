package intercept

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

// containerManager is what the loop needs of containers.Manager: containers by owner, created,
// opened and released, and the files of a held container. Tests that run no code fake it.
type containerManager interface {
	Create(ctx context.Context, tool, owner string, opts sandbox.CreateOptions, idle time.Duration) (runner, error)
	Open(ctx context.Context, id, owner string) (runner, error)
	Release(ctx context.Context, c runner, idle time.Duration)

	// PlaceFiles places files into owner's container c as containers.Container.Place does,
	// deduplication and *containers.FileError included.
	PlaceFiles(ctx context.Context, c runner, owner string, files []containers.Placement, lim containers.ContainerLimits) ([]store.ContainerFile, error)
	// Execute runs code in c, then records the regular files the execution created or changed
	// under /mnt/data as container files (source "assistant"). res and err are the run's, except
	// that an execution whose files alone could not be collected returns its result and an
	// error wrapping containers.ErrCollect.
	Execute(ctx context.Context, c runner, code string, opts sandbox.RunOptions, lim containers.ContainerLimits) (res sandbox.Result, written containers.Outputs, err error)
	// ContainerFiles returns the files recorded for owner's container c.
	ContainerFiles(ctx context.Context, c runner, owner string) ([]store.ContainerFile, error)
}

// runner is one held container.
type runner interface {
	ID() string
	Run(ctx context.Context, code string, opts sandbox.RunOptions) (sandbox.Result, error)
}

// sessions adapts *containers.Manager to containerManager.
type sessions struct {
	s *containers.Manager
}

func adaptSessions(s *containers.Manager) sessions { return sessions{s: s} }

// created is a container this engine's request created: released with idle 0 (its id never
// reached anyone), it is discarded, whatever idle timeout it was created with. Any other
// container keeps the idle timeout it was created with (a container made through the Containers
// API keeps its own expires_after).
type created struct{ *containers.Container }

func (a sessions) Create(ctx context.Context, tool, owner string, opts sandbox.CreateOptions, idle time.Duration) (runner, error) {
	c, err := a.s.Create(ctx, tool, owner, opts, idle)
	if err != nil {
		return nil, err
	}
	return created{c}, nil
}

func (a sessions) Open(ctx context.Context, id, owner string) (runner, error) {
	c, err := a.s.Open(ctx, id, owner)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (a sessions) Release(ctx context.Context, c runner, idle time.Duration) {
	switch c := c.(type) {
	case created:
		if idle <= 0 {
			a.s.Discard(ctx, c.Container)
			return
		}
		a.s.Release(ctx, c.Container)
	case *containers.Container:
		a.s.Release(ctx, c)
	}
}

// held returns the sandbox container behind a runner this adapter returned.
func held(c runner) *containers.Container {
	switch c := c.(type) {
	case created:
		return c.Container
	case *containers.Container:
		return c
	}
	return nil
}

func (a sessions) PlaceFiles(ctx context.Context, c runner, _ string, files []containers.Placement, lim containers.ContainerLimits) ([]store.ContainerFile, error) {
	sc := held(c)
	if sc == nil {
		return nil, fmt.Errorf("%w: not a sandbox container", sandbox.ErrUnavailable)
	}
	return sc.Place(ctx, files, lim)
}

func (a sessions) Execute(ctx context.Context, c runner, code string, opts sandbox.RunOptions, lim containers.ContainerLimits) (sandbox.Result, containers.Outputs, error) {
	sc := held(c)
	if sc == nil {
		res, err := c.Run(ctx, code, opts)
		return res, containers.Outputs{}, err
	}
	return sc.Execute(ctx, code, opts, lim)
}

func (a sessions) ContainerFiles(ctx context.Context, c runner, owner string) ([]store.ContainerFile, error) {
	l, err := a.s.Files(ctx, owner, c.ID(), store.ContainerFileQuery{Page: store.Page{Order: store.Asc}})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// noSessions is the containers of an Engine without Sessions: nothing can be created.
type noSessions struct{}

func (noSessions) Create(context.Context, string, string, sandbox.CreateOptions, time.Duration) (runner, error) {
	return nil, fmt.Errorf("%w: no sandbox sessions configured", sandbox.ErrUnavailable)
}

func (noSessions) Open(context.Context, string, string) (runner, error) {
	return nil, sandbox.ErrNotFound
}

func (noSessions) Release(context.Context, runner, time.Duration) {}

func (noSessions) PlaceFiles(context.Context, runner, string, []containers.Placement, containers.ContainerLimits) ([]store.ContainerFile, error) {
	return nil, sandbox.ErrNotFound
}

func (noSessions) Execute(context.Context, runner, string, sandbox.RunOptions, containers.ContainerLimits) (sandbox.Result, containers.Outputs, error) {
	return sandbox.Result{}, containers.Outputs{}, sandbox.ErrNotFound
}

func (noSessions) ContainerFiles(context.Context, runner, string) ([]store.ContainerFile, error) {
	return nil, nil
}

// containerFuture is the request's container, opened or being created.
type containerFuture struct {
	done    chan struct{}
	cancel  context.CancelFunc
	c       runner
	err     error
	created bool // this request created the sandbox (it is not the client's already)
	stored  bool // its id reached the response store
}

// get waits for the container.
func (f *containerFuture) get(ctx context.Context) (runner, error) {
	select {
	case <-f.done:
		return f.c, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ready returns the container if it is open already, without waiting.
func (f *containerFuture) ready() (runner, bool) {
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
	if !r.req.code {
		// No code_interpreter tool: no code runs, so no container is opened.
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
				return apierror.NotFound("Container with id '"+id+"' not found.", "tools["+strconv.Itoa(r.req.container.toolIndex)+"].container")
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
		f.c, f.err = r.e.sessions.Create(cctx, r.tool, r.caller, sandbox.CreateOptions{MemoryLimit: r.req.container.memoryLimit, KernelIdle: r.ic.KernelIdleTimeout}, r.ic.ContainerIdleTimeout)
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
	files, err := r.e.sessions.ContainerFiles(ctx, c, r.caller)
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
		idle := r.ic.ContainerIdleTimeout
		if f.created && !f.stored && !r.tr.startedCalls() {
			idle = 0
		}
		r.e.sessions.Release(rctx, f.c, idle)
	}
}

// errNoContainer is the container of a request without a code_interpreter tool.
var errNoContainer = errors.New("the request has no code_interpreter tool")

func sandboxUnavailable(err error) *apierror.Error {
	if q := quotaExceeded(err); q != nil {
		return q
	}
	return apierror.BadGateway("The code interpreter sandbox is unavailable.", apierror.CodeSandboxUnavailable, err)
}
