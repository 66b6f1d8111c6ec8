package intercept

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// containers is what the loop needs of sandbox.Sessions: containers by owner, created, opened and
// released. Tests that run no code fake it.
type containers interface {
	Create(ctx context.Context, tool, owner string, opts sandbox.CreateOptions, idle time.Duration) (runner, error)
	Open(ctx context.Context, id, owner string) (runner, error)
	Release(ctx context.Context, c runner, idle time.Duration)
}

// runner is one held container.
type runner interface {
	ID() string
	Run(ctx context.Context, code string, opts sandbox.RunOptions) (sandbox.Result, error)
}

// sessions adapts *sandbox.Sessions to containers.
type sessions struct{ s *sandbox.Sessions }

// created is a container this engine's request created: released with idle 0 (its id never
// reached anyone), it is discarded, whatever idle timeout it was created with. Any other
// container keeps the idle timeout it was created with (a container made through the Containers
// API keeps its own expires_after).
type created struct{ *sandbox.Container }

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
	case *sandbox.Container:
		a.s.Release(ctx, c)
	}
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
		if prev := r.req.prevContainer; prev != "" {
			// A conversation keeps its container while it lives.
			if c, err := r.e.sessions.Open(cctx, prev, r.caller); err == nil {
				f.c = c
				return
			}
		}
		f.c, f.err = r.e.sessions.Create(cctx, r.tool, r.caller, sandbox.CreateOptions{MemoryLimit: r.req.container.memoryLimit}, r.ic.ContainerIdleTimeout)
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
	return apierror.BadGateway("The code interpreter sandbox is unavailable.", "sandbox_unavailable", err)
}
