// Package backends builds the sandbox tool registry from the configuration: the one place that
// knows every backend, so that a new backend is one new folder and one case here.
package backends

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2b"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
)

// closeTimeout bounds closing the providers that a failed Build had already started, and the
// providers that a reload retires at once.
const closeTimeout = 30 * time.Second

// Build returns the registry for tools. A tool whose settings are unchanged since prev (nil at
// start) keeps prev's provider, so a reload neither restarts the local warm pool nor forgets the
// containers that run on it. Every provider of prev that the new registry does not keep is retired:
// no new container starts on it, the containers that already run on it keep working with the
// settings and credentials they were created with, and it is closed when the last of them is
// deleted. Call Build only to apply its result: retiring is not undone.
//
// On error (a backend that cannot be set up), the providers started by this call are closed, prev is
// left as it was, and the error names the tool.
func Build(tools []config.SandboxTool, prev *sandbox.Registry, log *zap.Logger) (*sandbox.Registry, error) {
	if log == nil {
		log = zap.NewNop()
	}
	var (
		entries []sandbox.RegistryEntry
		started []sandbox.RegistryEntry
		errs    []error
	)
	for _, t := range tools {
		fp := fingerprint(t)
		if old, ok := prev.Entry(t.Name); ok && old.Fingerprint == fp {
			entries = append(entries, old)
			continue
		}
		p, err := newProvider(t, log)
		if err != nil {
			errs = append(errs, fmt.Errorf("sandbox tool %q: %w", t.Name, err))
			continue
		}
		e := sandbox.RegistryEntry{Name: t.Name, Provider: p, Fingerprint: fp, Backend: t.Provider}
		entries = append(entries, e)
		started = append(started, e)
	}
	reg, err := sandbox.NewRegistry(prev, entries...)
	if err != nil {
		errs = append(errs, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if len(errs) > 0 {
		for _, e := range started {
			if c, ok := e.Provider.(interface{ Close(context.Context) error }); ok {
				if err := c.Close(ctx); err != nil {
					log.Warn("closing sandbox tool", zap.String("tool", e.Name), zap.Error(err))
				}
			}
		}
		return nil, errors.Join(errs...)
	}
	if err := prev.Retire(ctx, reg); err != nil {
		log.Warn("closing retired sandbox tools", zap.Error(err))
	}
	return reg, nil
}

// newProvider starts the backend of one tool.
func newProvider(t config.SandboxTool, log *zap.Logger) (sandbox.Provider, error) {
	tlog := log.With(zap.String("sandbox_tool", t.Name))
	switch t.Provider {
	case "local":
		pool := t.PoolSize
		if pool == 0 {
			pool = -1 // the config's 0 means no warm pool; local.Options' 0 means its default
		}
		return local.New(local.Options{
			Python:       t.Python,
			WorkDir:      t.WorkDir,
			MemoryLimit:  t.MemoryLimitBytes,
			MaxMemory:    t.MaxMemoryBytes,
			MaxFileSize:  t.MaxFileSizeBytes,
			MaxDiskSize:  t.MaxDiskSizeBytes,
			MaxProcesses: t.MaxProcesses,
			PoolSize:     pool,
			Tool:         t.Name,
			Logger:       tlog,
		})
	case "e2b":
		if t.MissingEnv != "" {
			// The tool stays listed, so requests get a clear 502 instead of a config error at start.
			return missingEnv{name: t.Name, env: t.MissingEnv}, nil
		}
		return e2b.New(e2b.Options{
			APIKey:              t.APIKey,
			APIBase:             t.APIBase,
			Domain:              t.Domain,
			SandboxURL:          t.SandboxURL,
			Template:            t.Template,
			Timeout:             t.Timeout,
			AllowInternetAccess: t.AllowInternetAccess,
			Tool:                t.Name,
			Logger:              tlog,
		})
	default:
		return nil, fmt.Errorf("unknown sandbox_provider %q (want local or e2b)", t.Provider)
	}
}

// fingerprint identifies a tool's settings without holding its API key in clear. Line is left out:
// moving an entry in the file changes nothing.
func fingerprint(t config.SandboxTool) string {
	t.Line = 0
	b, err := json.Marshal(t)
	if err != nil {
		panic(fmt.Sprintf("backends: marshal sandbox tool: %v", err)) // plain fields: cannot fail
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// missingEnv stands in for an e2b tool whose API key names an environment variable that is not set:
// every sandbox creation fails with a message naming the variable (not a secret).
type missingEnv struct {
	name, env string
}

var _ sandbox.Provider = missingEnv{}

func (m missingEnv) err() error {
	return fmt.Errorf("%w: sandbox tool %q needs environment variable %s, which is not set",
		sandbox.ErrUnavailable, m.name, m.env)
}

func (m missingEnv) Create(context.Context, sandbox.CreateOptions) (sandbox.Handle, error) {
	return sandbox.Handle{}, m.err()
}

func (m missingEnv) Run(context.Context, sandbox.Handle, string, sandbox.RunOptions) (sandbox.Result, error) {
	return sandbox.Result{}, fmt.Errorf("%w: no such sandbox", sandbox.ErrNotFound)
}

func (m missingEnv) Delete(context.Context, sandbox.Handle) error { return nil }

func (m missingEnv) KeepAlive(context.Context, sandbox.Handle, time.Duration) error {
	return fmt.Errorf("%w: no such sandbox", sandbox.ErrNotFound)
}
