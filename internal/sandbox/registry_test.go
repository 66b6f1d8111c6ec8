package sandbox

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// closingProvider is a provider that runs nothing and counts its closes.
type closingProvider struct {
	mu     sync.Mutex
	closes int
}

func (p *closingProvider) Create(context.Context, CreateOptions) (Handle, error) {
	return Handle{}, ErrUnavailable
}

func (p *closingProvider) Run(context.Context, Handle, string, RunOptions) (Result, error) {
	return Result{}, ErrNotFound
}

func (p *closingProvider) Delete(context.Context, Handle) error { return nil }

func (p *closingProvider) KeepAlive(context.Context, Handle, time.Duration) error { return nil }

func (p *closingProvider) Close(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closes++
	return nil
}

func (p *closingProvider) closed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closes
}

func TestRegistry(t *testing.T) {
	ctx := context.Background()
	a, b := &closingProvider{}, &closingProvider{}
	r1, err := NewRegistry(nil, RegistryEntry{Name: "a", Provider: a}, RegistryEntry{Name: "b", Provider: b})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r1.Names(), ","); got != "a,b" {
		t.Errorf("Names() = %q; want a,b", got)
	}
	if p, ok := r1.Get("a"); !ok || p != a {
		t.Errorf("Get(a) = %v, %v", p, ok)
	}
	if _, ok := r1.Get("zzz"); ok {
		t.Errorf("Get(zzz) ok; want false")
	}
	if _, err := NewRegistry(nil, RegistryEntry{Name: "a", Provider: a}, RegistryEntry{Name: "a", Provider: b}); err == nil {
		t.Errorf("NewRegistry(duplicate names) error = nil")
	}
	// b is kept, a replaced: only a is closed.
	a2 := &closingProvider{}
	r2, err := NewRegistry(r1, RegistryEntry{Name: "a", Provider: a2}, RegistryEntry{Name: "b", Provider: b})
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Retire(ctx, r2); err != nil {
		t.Fatal(err)
	}
	if c := a.closed(); c != 1 {
		t.Errorf("replaced provider closed %d times; want 1", c)
	}
	if c := b.closed(); c != 0 {
		t.Errorf("kept provider closed %d times; want 0", c)
	}
	if err := r2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]*closingProvider{"a": a, "a2": a2, "b": b} {
		if c := p.closed(); c != 1 {
			t.Errorf("provider %s closed %d times; want exactly 1", name, c)
		}
	}
	var nilReg *Registry
	if _, ok := nilReg.Get("a"); ok || nilReg.Names() != nil || nilReg.Close(ctx) != nil {
		t.Errorf("nil registry is not empty")
	}
}
