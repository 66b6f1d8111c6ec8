package opensandbox_test

import (
	"context"
	"testing"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2b"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
)

// OpenSandbox against e2b, each through its client and its double, in one run over the same local
// kernel: create to the first result (create, readiness, and for OpenSandbox /mnt/data, the
// context and its prepared hook, then a first "1+1"), and the round trip of a trivial cell. The
// doubles run code in the same local sandbox, so the difference is the protocols' and the
// clients' (SSE and its translation, the hook's marker against e2b's NDJSON), not the services'.

const benchCell = "1+1"

// backend is one client and its double, ready to create.
type backend struct {
	p sandbox.Provider
}

func benchBackends(b *testing.B) map[string]backend {
	osb := newDouble(b)
	exec := sandboxes.Provider(b)
	emu := e2btest.New(exec)
	b.Cleanup(emu.Close)
	ep, err := e2b.New(e2b.Options{APIKey: emu.APIKey(), APIBase: emu.URL(), SandboxURL: emu.SandboxURL(), HTTPClient: emu.Client(), Tool: "e2b"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ep.Close(context.Background()) })
	return map[string]backend{"opensandbox": {provider(b, osb)}, "e2b": {ep}}
}

func firstResult(b *testing.B, p sandbox.Provider, h sandbox.Handle) {
	r, err := p.Run(context.Background(), h, benchCell, sandbox.RunOptions{})
	if err != nil || len(r.Results) != 1 || r.Results[0].Text != "2" {
		b.Fatalf("Run = %+v, %v", r, err)
	}
}

func BenchmarkCreateToFirstResult(b *testing.B) {
	all := benchBackends(b)
	for _, name := range []string{"opensandbox", "e2b"} {
		p := all[name].p
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				h, err := p.Create(context.Background(), sandbox.CreateOptions{})
				if err != nil {
					b.Fatal(err)
				}
				firstResult(b, p, h)
				b.StopTimer()
				if err := p.Delete(context.Background(), h); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

func BenchmarkTrivialCell(b *testing.B) {
	all := benchBackends(b)
	for _, name := range []string{"opensandbox", "e2b"} {
		p := all[name].p
		b.Run(name, func(b *testing.B) {
			h, err := p.Create(context.Background(), sandbox.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = p.Delete(context.Background(), h) })
			b.ReportAllocs()
			for b.Loop() {
				firstResult(b, p, h)
			}
		})
	}
}
