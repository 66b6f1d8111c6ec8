package e2btest

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// templatePy makes a new kernel of a sandbox's default Python context see the template's file
// system rather than the exec sandbox's: code-interpreter-v1 has no /mnt/data (docs/wire-e2b.md).
//
//go:embed template.py
var templatePy string

// prepareKernel runs templatePy in h, the new exec sandbox of a default Python context, as a
// hidden cell (the caller counts it in the context's hidden runs).
func (s *Server) prepareKernel(ctx context.Context, h sandbox.Handle) error {
	res, err := s.exec.Run(ctx, h, templatePy, sandbox.RunOptions{})
	if err == nil && res.Error != nil {
		err = fmt.Errorf("%s: %s", res.Error.Name, res.Error.Value)
	}
	if err != nil {
		return fmt.Errorf("preparing the kernel: %w", err)
	}
	return nil
}
