// Package ctxio stops a copy when its context ends.
package ctxio

import (
	"context"
	"io"
)

// Reader returns a reader of r that fails with ctx's error, before each read, once ctx has
// ended. A read already waiting is not interrupted: r's own deadline bounds it.
func Reader(ctx context.Context, r io.Reader) io.Reader { return reader{ctx, r} }

type reader struct {
	ctx context.Context
	r   io.Reader
}

func (c reader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
