package intercept

import (
	"context"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// containers is what the loop needs of sandbox.Sessions.
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

func (a sessions) Create(ctx context.Context, tool, owner string, opts sandbox.CreateOptions, idle time.Duration) (runner, error) {
	c, err := a.s.Create(ctx, tool, owner, opts, idle)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (a sessions) Open(ctx context.Context, id, owner string) (runner, error) {
	c, err := a.s.Open(ctx, id, owner)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (a sessions) Release(ctx context.Context, c runner, idle time.Duration) {
	if sc, ok := c.(*sandbox.Container); ok {
		a.s.Release(ctx, sc, idle)
	}
}
