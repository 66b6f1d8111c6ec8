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
