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
	s := c.s
	s.mu.Lock()
	if c.deleting {
		s.mu.Unlock()
		return sandbox.Result{}, fmt.Errorf("%w: container deleted", sandbox.ErrNotFound)
	}
	c.busy++
	restarted := c.restarted
	c.restarted = false
	now := s.now()
	need := opts.Timeout
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
	res, err := c.ent.Provider.Run(ctx, c.h, code, opts)
	s.m.observe(opRun, c.h.Tool, start, err)
	res.KernelRestarted = restarted

	s.mu.Lock()
	c.busy--
	c.lastUse = s.now()
	s.mu.Unlock()
	if errors.Is(err, sandbox.ErrNotFound) {
		s.dropGone(ctx, c)
		return res, err
	}
	if terr := s.touch(ctx, c); terr != nil && !errors.Is(terr, ErrExpired) {
		s.log.Warn("recording a container's use", zap.String("container", c.id), zap.Error(terr))
	}
	return res, err
}
