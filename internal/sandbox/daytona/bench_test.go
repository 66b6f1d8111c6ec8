package daytona_test

import (
	"context"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2b"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
)

// The benchmarks run daytona and e2b side by side, each client against its double, both doubles
// executing in the same local sandbox provider: what differs is each wire protocol and each
// client (Daytona: create, poll until started, mkdir, a context, then a WebSocket per run with
// the wrapper; e2b: one create, then an NDJSON stream per run). They measure clients plus
// doubles on this host, not the hosted services.

const benchCell = "1+1"

// benchProviders returns one sandbox.Provider per backend, each talking to its own double.
func benchProviders(b *testing.B) map[string]sandbox.Provider {
	b.Helper()
	exec := sandboxes.Provider(b)
	dt := newDouble(b)
	emu := e2btest.New(exec)
	b.Cleanup(emu.Close)
	ep, err := e2b.New(e2b.Options{APIKey: emu.APIKey(), APIBase: emu.URL(), SandboxURL: emu.SandboxURL(), HTTPClient: emu.Client(), Tool: "e2b"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ep.Close(context.Background()) })
	return map[string]sandbox.Provider{"daytona": provider(b, dt), "e2b": ep}
}

func mustResult(b *testing.B, p sandbox.Provider, h sandbox.Handle) {
	r, err := p.Run(context.Background(), h, benchCell, sandbox.RunOptions{})
	if err != nil || len(r.Results) != 1 || r.Results[0].Text != "2" {
		b.Fatalf("Run = %+v, %v", r, err)
	}
}

// BenchmarkCreateToFirstResult: from Create to the result of a first trivial cell (the delete
// after it is not counted).
func BenchmarkCreateToFirstResult(b *testing.B) {
	for _, name := range []string{"daytona", "e2b"} {
		b.Run(name, func(b *testing.B) {
			p := benchProviders(b)[name]
			ctx := context.Background()
			var total time.Duration
			for b.Loop() {
				start := time.Now()
				h, err := p.Create(ctx, sandbox.CreateOptions{})
				if err != nil {
					b.Fatal(err)
				}
				mustResult(b, p, h)
				total += time.Since(start)
				b.StopTimer()
				if err := p.Delete(ctx, h); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/create-to-result")
		})
	}
}

// BenchmarkTrivialCell: the round trip of "1+1" in a sandbox made once.
func BenchmarkTrivialCell(b *testing.B) {
	for _, name := range []string{"daytona", "e2b"} {
		b.Run(name, func(b *testing.B) {
			p := benchProviders(b)[name]
			h, err := p.Create(context.Background(), sandbox.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = p.Delete(context.Background(), h) })
			mustResult(b, p, h) // the first run starts e2b's kernel lazily
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				mustResult(b, p, h)
			}
		})
	}
}
