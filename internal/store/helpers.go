package store

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// modifyAttempts bounds Modify's retries: each one lost a race to a writer that succeeded, so
// running out means the record is written continuously.
const modifyAttempts = 16

// Modify reads owner's container id, lets change edit it, and writes it back, again from a fresh
// read whenever another writer got there first (ErrConflict). change may be called several times;
// an error from it stops Modify and is returned as is.
func Modify(ctx context.Context, s Containers, owner, id string, change func(*Container) error) (Container, error) {
	for range modifyAttempts {
		c, err := s.Container(ctx, owner, id)
		if err != nil {
			return Container{}, err
		}
		if err := change(&c); err != nil {
			return Container{}, err
		}
		c, err = s.UpdateContainer(ctx, c)
		if !errors.Is(err, ErrConflict) {
			return c, err
		}
		if err := ctx.Err(); err != nil {
			return Container{}, err
		}
	}
	return Container{}, fmt.Errorf("container %s: %w %d times in a row", id, ErrConflict, modifyAttempts)
}

// CreateFile stores the content of r as one file: BeginFile, Write, Commit, and Abort on any
// failure, so that a failed call stores nothing.
func CreateFile(ctx context.Context, s Files, f File, r io.Reader, lim FileLimits) (File, error) {
	up, err := s.BeginFile(ctx, f.Owner, lim)
	if err != nil {
		return File{}, err
	}
	defer func() { _ = up.Abort() }()
	if _, err := up.Write(ctx, r); err != nil {
		return File{}, err
	}
	return up.Commit(ctx, f)
}
