// Package backends is the one place that knows every sandbox backend: All hands config each
// backend's keys and decoder, and Build provisions the sandbox registry from the decoded tools. A new
// backend is one new folder (its Keys, DecodeSettings and a sandbox.Provisioner) and one line in All.
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
	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/daytona"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2b"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/sandbox/opensandbox"
	"github.com/ciproxy/ciproxy/internal/settings"
)

// closeTimeout bounds closing the providers that a failed Build had already started.
const closeTimeout = 30 * time.Second

// All returns every sandbox backend, for config.ParseOptions.Backends, in the order messages list
// them ("local, e2b, daytona, opensandbox or agent_sandbox").
func All() []config.SandboxBackend {
	return []config.SandboxBackend{
		{Name: local.Backend, Keys: local.Keys(), Decode: decoder(local.DecodeSettings)},
		{Name: "e2b", Keys: e2b.Keys(), Decode: decoder(e2b.DecodeSettings)},
		{Name: daytona.Backend, Keys: daytona.Keys(), Decode: decoder(daytona.DecodeSettings)},
		{Name: opensandbox.Backend, Keys: opensandbox.Keys(), Decode: decoder(opensandbox.DecodeSettings)},
		{Name: agentsandbox.Backend, Keys: agentsandbox.Keys(), Decode: decoder(agentsandbox.DecodeSettings)},
	}
}

// decoder adapts a backend's DecodeSettings to config.SandboxBackend.Decode.
func decoder[S sandbox.Provisioner](decode func(*settings.Map) S) func(*settings.Map) any {
	return func(p *settings.Map) any { return decode(p) }
}

// ParseOptions are the options to parse a configuration file with every backend and the given
// environment (nil: the process's).
func ParseOptions(lookup func(string) (string, bool)) config.ParseOptions {
	return config.ParseOptions{LookupEnv: lookup, Backends: All()}
}

// Build provisions the registry for tools, which must have been parsed with All. A tool whose
// backend and settings are unchanged since prev (nil at start) keeps prev's provider, so a reload
// neither restarts the local warm pool nor forgets the containers that run on it; every other tool
// is provisioned anew (the local backend checks its host then).
//
// Build does not touch prev: once the new registry is published in prev's place, the caller retires
// what it no longer holds with prev.Retire. On error (a tool that cannot be provisioned), the
// providers started by this call are closed and the error names each tool that failed.
func Build(ctx context.Context, tools []config.SandboxTool, prev *sandbox.Registry, log *zap.Logger) (*sandbox.Registry, error) {
	if log == nil {
		log = zap.NewNop()
	}
	var (
		entries []sandbox.RegistryEntry
		started []sandbox.RegistryEntry
		errs    []error
	)
	for _, t := range tools {
		p, ok := t.Settings.(sandbox.Provisioner)
		if !ok {
			errs = append(errs, fmt.Errorf("sandbox tool %q: sandbox_provider %q has no settings to provision (the configuration was not parsed with its backend)", t.Name, t.Backend))
			continue
		}
		fp, err := fingerprint(t)
		if err != nil {
			errs = append(errs, fmt.Errorf("sandbox tool %q: %w", t.Name, err))
			continue
		}
		if old, ok := prev.Entry(t.Name); ok && old.Fingerprint == fp {
			entries = append(entries, old)
			continue
		}
		prov, err := p.Provision(ctx, t.Name, log.With(zap.String("sandbox_tool", t.Name)))
		if err != nil {
			errs = append(errs, fmt.Errorf("sandbox tool %q: %w", t.Name, err))
			continue
		}
		e := sandbox.RegistryEntry{Name: t.Name, Provider: prov, Fingerprint: fp, Backend: t.Backend, HostBound: t.Backend == local.Backend}
		entries = append(entries, e)
		started = append(started, e)
	}
	reg, err := sandbox.NewRegistry(prev, entries...)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return reg, nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	for _, e := range started {
		if c, ok := e.Provider.(interface{ Close(context.Context) error }); ok {
			if err := c.Close(cctx); err != nil {
				log.Warn("closing sandbox tool", zap.String("tool", e.Name), zap.Error(err))
			}
		}
	}
	return nil, errors.Join(errs...)
}

// fingerprint identifies a tool's backend and settings without holding its API key in clear. The
// name and line are left out: the registry matches by name, and moving an entry in the file changes
// nothing.
func fingerprint(t config.SandboxTool) (string, error) {
	b, err := json.Marshal(struct {
		Backend  string
		Settings any
	}{t.Backend, t.Settings})
	if err != nil {
		return "", fmt.Errorf("fingerprinting its settings: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}
