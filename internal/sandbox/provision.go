package sandbox

import (
	"context"

	"go.uber.org/zap"
)

// Provisioner is one sandbox tool's settings as its backend decoded them from the configuration
// (local.Options, e2b.Settings): plain values, compared across reloads to tell whether a tool
// changed, that know how to start the tool's Provider.
type Provisioner interface {
	// Provision returns the Provider of the tool named tool, ready to serve: it checks what can be
	// checked before a request needs it (the local backend starts one sandbox), so that a tool that
	// cannot work fails the configuration that asks for it. On error nothing is left running. log is
	// the tool's logger, never nil.
	Provision(ctx context.Context, tool string, log *zap.Logger) (Provider, error)
}

// HostChecker is implemented by the settings (a Provisioner) of a backend whose sandboxes run on
// this host (local), so that --check can tell whether the host can run the tool without
// provisioning it. A backend whose sandboxes run elsewhere (e2b) is not one.
type HostChecker interface {
	// CheckHost starts one sandbox under the tool's real limits, as Provision does, and reports the
	// isolation the host gives it; the error says why the tool cannot run on this host. Nothing is
	// left running.
	CheckHost(ctx context.Context) (HostReport, error)
}

// HostReport is what CheckHost found.
type HostReport struct {
	// Isolation says, for an operator, what holds the tool's sandboxes on this host.
	Isolation string
	// Weaker reports that the isolation is weaker than the backend's best (Isolation says how).
	Weaker bool
}

type registryKey struct{}

// WithRegistry returns ctx carrying reg: containers.Manager then creates and opens containers through
// reg (the registry of the configuration snapshot a request started with) rather than the current
// one, so that a request sees the sandbox tools of one configuration, whatever reloads happen
// meanwhile.
func WithRegistry(ctx context.Context, reg *Registry) context.Context {
	return context.WithValue(ctx, registryKey{}, reg)
}

// RegistryFrom returns the registry WithRegistry put in ctx, or nil.
func RegistryFrom(ctx context.Context) *Registry {
	reg, _ := ctx.Value(registryKey{}).(*Registry)
	return reg
}
