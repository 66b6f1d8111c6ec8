package agentsandbox_test

import (
	"context"
	"testing"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandboxtest"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2b"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/testutil/localsandbox"
)

// The benchmarks compare agent_sandbox against the test double (a Kubernetes API server, a
// controller, bubblewrap pods with a sandboxd of Go) with e2b against its emulator (HTTP to a
// local sandbox), both in this process on this host: the figures bound the proxies' own cost per
// cell and per creation, not a cluster's.

var locals = localsandbox.New(local.Options{PoolSize: -1})

func backendsFor() map[string]func(b *testing.B) sandbox.Provider {
	return map[string]func(b *testing.B) sandbox.Provider{
		"agent_sandbox": func(b *testing.B) sandbox.Provider {
			d := double(b, func(o *agentsandboxtest.Options) { o.WarmPoolReplicas = 2 })
			return provider(b, d)
		},
		"e2b": func(b *testing.B) sandbox.Provider {
			srv := e2btest.New(locals.Provider(b))
			b.Cleanup(srv.Close)
			p, err := e2b.New(e2b.Options{APIKey: srv.APIKey(), APIBase: srv.URL(), SandboxURL: srv.SandboxURL(), HTTPClient: srv.Client(), Tool: "e2b"})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = p.Close(context.Background()) })
			return p
		},
	}
}

// BenchmarkCreateToFirstResult is a creation (a claim adopting a warm sandbox, its readiness, the
// kernel daemon's start) through the first cell's result.
func BenchmarkCreateToFirstResult(b *testing.B) {
	for _, name := range []string{"agent_sandbox", "e2b"} {
		b.Run(name, func(b *testing.B) {
			p := backendsFor()[name](b)
			ctx := context.Background()
			for b.Loop() {
				h, err := p.Create(ctx, sandbox.CreateOptions{})
				if err != nil {
					b.Fatal(err)
				}
				r, err := p.Run(ctx, h, "1+1", sandbox.RunOptions{})
				if err != nil || len(r.Results) != 1 {
					b.Fatalf("Run = %+v, %v", r, err)
				}
				b.StopTimer()
				if err := p.Delete(ctx, h); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkTrivialCell is one cell ("1+1") in a sandbox that exists: the per-cell cost.
func BenchmarkTrivialCell(b *testing.B) {
	for _, name := range []string{"agent_sandbox", "e2b"} {
		b.Run(name, func(b *testing.B) {
			p := backendsFor()[name](b)
			ctx := context.Background()
			h, err := p.Create(ctx, sandbox.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = p.Delete(context.Background(), h) })
			b.ReportAllocs()
			for b.Loop() {
				r, err := p.Run(ctx, h, "1+1", sandbox.RunOptions{})
				if err != nil || len(r.Results) != 1 {
					b.Fatalf("Run = %+v, %v", r, err)
				}
			}
		})
	}
}

// BenchmarkTrueCommand is one shell command ("true"): the cost of starting a process in the
// sandbox and reading its exit, without Python. Over agent_sandbox a cell is one such process
// (the kernel daemon's client) plus the cell's work.
func BenchmarkTrueCommand(b *testing.B) {
	for _, name := range []string{"agent_sandbox", "e2b"} {
		b.Run(name, func(b *testing.B) {
			p := backendsFor()[name](b)
			sh, ok := p.(sandbox.Shell)
			if !ok {
				b.Skip("no shell")
			}
			ctx := context.Background()
			h, err := p.Create(ctx, sandbox.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = p.Delete(context.Background(), h) })
			for b.Loop() {
				if res, err := sh.Exec(ctx, h, "true", sandbox.ExecOptions{}); err != nil || res.ExitCode != 0 {
					b.Fatalf("Exec = %+v, %v", res, err)
				}
			}
		})
	}
}
