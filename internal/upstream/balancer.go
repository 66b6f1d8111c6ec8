package upstream

import (
	"sync"
	"sync/atomic"

	"github.com/ciproxy/ciproxy/internal/config"
)

// Balancer spreads requests over a model's deployments, round-robin per model name. It is safe for
// concurrent use, and its zero value is ready. It lives as long as the process, across config
// reloads: a reload that changes the number of deployments just continues the rotation.
type Balancer struct {
	next sync.Map // model name → *atomic.Uint64
}

// NewBalancer returns an empty Balancer.
func NewBalancer() *Balancer { return &Balancer{} }

// Order returns a copy of deps rotated to start at the next deployment in turn for their model
// name (deps[0].ModelName); the rest follow in file order, for failover. deps is not modified. A
// nil Balancer returns an unrotated copy.
func (b *Balancer) Order(deps []config.Deployment) []config.Deployment {
	if len(deps) == 0 {
		return nil
	}
	out := make([]config.Deployment, len(deps))
	if b == nil || len(deps) == 1 {
		copy(out, deps)
		return out
	}
	key := deps[0].ModelName
	v, ok := b.next.Load(key)
	if !ok {
		v, _ = b.next.LoadOrStore(key, new(atomic.Uint64))
	}
	n := v.(*atomic.Uint64).Add(1) - 1
	start := int(n % uint64(len(deps)))
	k := copy(out, deps[start:])
	copy(out[k:], deps[:start])
	return out
}
