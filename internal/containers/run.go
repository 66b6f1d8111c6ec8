package containers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// lock takes c's run lock, or gives up with ctx.
func (c *Container) lock(ctx context.Context) error {
	select {
	case c.runMu <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Container) unlock() { <-c.runMu }

// Run executes code in the container's kernel: one run at a time per container (a second waits for
// the first, or for ctx), never reaped while running. Errors are the provider's (see Provider.Run);
// a container found gone is ErrNotFound and is expired.
func (c *Container) Run(ctx context.Context, code string, opts sandbox.RunOptions) (sandbox.Result, error) {
	if err := c.lock(ctx); err != nil {
		return sandbox.Result{}, err
	}
	defer c.unlock()
	return c.runLocked(ctx, code, opts)
}

func (c *Container) runLocked(ctx context.Context, code string, opts sandbox.RunOptions) (sandbox.Result, error) {
	var res sandbox.Result
	restarted, err := c.use(ctx, opRun, opts.Timeout, func() error {
		var err error
		res, err = c.ent.Provider.Run(ctx, c.h, code, opts)
		return err
	})
	res.KernelRestarted = restarted
	return res, err
}

// use does op (one execution, run lock held) on the container: counted busy, so never reaped
// meanwhile; its backend's lease first extended to outlast need (0: 5 minutes); afterwards the
// use recorded, or, when op found the sandbox gone, the container expired. restarted reports
// that its kernel was restarted while idle since its last use.
func (c *Container) use(ctx context.Context, name string, need time.Duration, op func() error) (restarted bool, err error) {
	s := c.s
	s.mu.Lock()
	if c.deleting {
		s.mu.Unlock()
		return false, fmt.Errorf("%w: container deleted", sandbox.ErrNotFound)
	}
	c.busy++
	restarted = c.restarted
	c.restarted = false
	now := s.now()
	if need <= 0 {
		need = 5 * time.Minute
	}
	extend := c.backendUntil.Before(now.Add(need + keepAliveMargin))
	keep := max(c.idle, need) + keepAliveMargin
	s.mu.Unlock()

	if extend {
		s.keepAlive(ctx, c, keep)
	}
	start := time.Now()
	err = op()
	s.m.observe(name, c.h.Tool, start, err)

	s.mu.Lock()
	c.busy--
	c.lastUse = s.now()
	s.mu.Unlock()
	if errors.Is(err, sandbox.ErrNotFound) {
		s.dropGone(ctx, c)
		return restarted, err
	}
	if terr := s.touch(ctx, c); terr != nil && !errors.Is(terr, ErrExpired) {
		s.log.Warn("recording a container's use", zap.String("container", c.id), zap.Error(terr))
	}
	return restarted, err
}

// ErrNoShell: the container's backend runs no shell commands (its provider is not a
// sandbox.Shell).
var ErrNoShell = errors.New("this sandbox backend cannot run shell commands")

// Shell runs commands in the container one after the other, each as sandbox.Shell.Exec with
// opts(i) as its options and ended(i, result) called when it has ended, and then records the
// files they created or changed under DataDir as Execute does, all under one hold of the run
// lock: a shell call and a code execution of one container never run at once. It stops at the
// first command that could not run, with its error (ErrNoShell for a backend without commands).
// When only the collection failed, err wraps ErrCollect.
func (c *Container) Shell(ctx context.Context, commands []string, opts func(i int) sandbox.ExecOptions, ended func(i int, res sandbox.ExecResult), lim ContainerLimits) (Outputs, error) {
	sh, ok := c.ent.Provider.(sandbox.Shell)
	if !ok {
		return Outputs{}, ErrNoShell
	}
	if err := c.lock(ctx); err != nil {
		return Outputs{}, err
	}
	defer c.unlock()
	fs, fsErr := c.fileSystem()
	if fsErr == nil && c.baseline == nil {
		if l, err := fs.ListFiles(ctx, c.h, maxListed); err == nil {
			c.baseline = stamps(l)
		}
	}
	if len(commands) == 0 {
		return Outputs{}, nil
	}
	// One use for the call: its lease outlasts every command's timeout, its record is written once.
	first := opts(0)
	_, err := c.use(ctx, opShell, first.Timeout*time.Duration(len(commands)), func() error {
		for i, cmd := range commands {
			o := first
			if i > 0 {
				o = opts(i)
			}
			res, err := sh.Exec(ctx, c.h, cmd, o)
			if err != nil {
				return err
			}
			ended(i, res)
		}
		return nil
	})
	if err != nil {
		return Outputs{}, err
	}
	if fsErr != nil {
		return Outputs{}, nil
	}
	out, err := c.collectLocked(ctx, fs, lim)
	if err != nil {
		return out, fmt.Errorf("%w: %w", ErrCollect, err)
	}
	return out, nil
}
