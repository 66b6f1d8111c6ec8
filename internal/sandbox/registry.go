package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// closer is implemented by providers that hold resources (local's warm pool, e2b's HTTP client).
type closer interface {
	Close(ctx context.Context) error
}

// RegistryEntry is one sandbox tool of a Registry.
type RegistryEntry struct {
	// Name is the sandbox_tool_name.
	Name string
	// Provider serves the tool. It must be comparable (a pointer), so that a provider carried over
	// from the previous registry is recognised.
	Provider Provider
	// Fingerprint identifies the settings the provider was built from, so that a reload can tell
	// whether they changed. It must not contain secrets in clear (use a hash).
	Fingerprint string
	// Backend is the kind of provider ("local", "e2b"), matched against Handle.Backend when an id is
	// opened from its token alone, so that a tool name moved to another backend is not handed a
	// foreign sandbox id. "" matches any.
	Backend string
	// HostBound reports that the tool's sandboxes run in this process and die with it (local), so
	// that only this process can reach them and none outlives a restart.
	HostBound bool
}

// Tool is one sandbox tool of a Registry: its entry and its provider's use count, shared by every
// Registry that holds the provider, so that a reload that keeps a tool keeps its containers'
// accounting too.
type Tool struct {
	RegistryEntry

	mu      sync.Mutex
	refs    int  // containers using the provider
	retired bool // no new containers; closed when refs reaches 0
	closed  bool
}

// Acquire counts one more container on the provider; false once it is retired. Each true is
// matched by one Release.
func (e *Tool) Acquire() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.retired {
		return false
	}
	e.refs++
	return true
}

// Release counts one container less, closing a retired provider that nothing uses any more.
func (e *Tool) Release(ctx context.Context) error {
	e.mu.Lock()
	e.refs--
	last := e.retired && e.refs <= 0
	e.mu.Unlock()
	if last {
		return e.close(ctx)
	}
	return nil
}

// retire stops new containers and closes the provider now if nothing uses it.
func (e *Tool) retire(ctx context.Context) error {
	e.mu.Lock()
	e.retired = true
	idle := e.refs <= 0
	e.mu.Unlock()
	if idle {
		return e.close(ctx)
	}
	return nil
}

// close closes the provider once.
func (e *Tool) close(ctx context.Context) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed, e.retired = true, true
	e.mu.Unlock()
	if c, ok := e.Provider.(closer); ok {
		if err := c.Close(ctx); err != nil {
			return fmt.Errorf("sandbox: closing tool %q: %w", e.Name, err)
		}
	}
	return nil
}

// Registry maps sandbox tool names to Providers. It does not change once built; a reload builds a
// new one (see internal/sandbox/backends). Safe for concurrent use.
type Registry struct {
	entries map[string]*Tool
	names   []string
}

// NewRegistry builds a Registry from entries, in order. An entry whose Provider is the very
// provider prev holds under the same name shares prev's use count (prev may be nil).
func NewRegistry(prev *Registry, entries ...RegistryEntry) (*Registry, error) {
	r := &Registry{entries: make(map[string]*Tool, len(entries))}
	for _, in := range entries {
		if in.Name == "" || in.Provider == nil {
			return nil, fmt.Errorf("sandbox: registry entry %q without a name or provider", in.Name)
		}
		if _, dup := r.entries[in.Name]; dup {
			return nil, fmt.Errorf("sandbox: sandbox tool %q listed twice", in.Name)
		}
		e := &Tool{RegistryEntry: in}
		if prev != nil {
			if old, ok := prev.entries[in.Name]; ok && old.Provider == in.Provider {
				e = old
			}
		}
		r.entries[in.Name] = e
		r.names = append(r.names, in.Name)
	}
	return r, nil
}

// Get returns the provider of the named tool.
func (r *Registry) Get(name string) (Provider, bool) {
	if r == nil {
		return nil, false
	}
	e, ok := r.entries[name]
	if !ok {
		return nil, false
	}
	return e.Provider, true
}

// Entry returns the named tool's entry (for reuse checks across reloads).
func (r *Registry) Entry(name string) (RegistryEntry, bool) {
	if r == nil {
		return RegistryEntry{}, false
	}
	e, ok := r.entries[name]
	if !ok {
		return RegistryEntry{}, false
	}
	return e.RegistryEntry, true
}

// Names returns the tool names in configuration order.
func (r *Registry) Names() []string {
	if r == nil {
		return nil
	}
	return append([]string(nil), r.names...)
}

// Tool returns the named tool with its shared use count.
func (r *Registry) Tool(name string) (*Tool, bool) {
	if r == nil {
		return nil, false
	}
	e, ok := r.entries[name]
	return e, ok
}

// Retire retires every provider of r that next does not hold: no container can be created on it any
// more, the containers that use it keep running, and it is closed when the last of them is deleted
// (at once if there is none). Call it when next replaces r.
func (r *Registry) Retire(ctx context.Context, next *Registry) error {
	if r == nil {
		return nil
	}
	var errs []error
	for _, name := range r.names {
		e := r.entries[name]
		if kept, ok := next.Tool(name); ok && kept == e {
			continue
		}
		errs = append(errs, e.retire(ctx))
	}
	return errors.Join(errs...)
}

// Close closes every provider of r now, even one that containers still use (their later deletes
// then fail or do nothing): it is for shutdown, after containers.Manager.Close has deleted the containers.
func (r *Registry) Close(ctx context.Context) error {
	if r == nil {
		return nil
	}
	var errs []error
	for _, name := range r.names {
		errs = append(errs, r.entries[name].close(ctx))
	}
	return errors.Join(errs...)
}
