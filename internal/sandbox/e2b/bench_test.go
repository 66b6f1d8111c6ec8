package e2b_test

import (
	"context"
	"testing"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// The two benchmarks run the same cell in the same local kernel, once through the e2b client and
// the emulator (HTTP, NDJSON re-encoding and decoding) and once by calling the local provider
// directly. The difference is the e2b path's overhead per execution.

const benchCode = "1+1"

func BenchmarkRunViaEmulator(b *testing.B) {
	_, srv := newEnv(b)
	p := provider(b, srv)
	h := create(b, p)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r, err := p.Run(ctx, h, benchCode, sandbox.RunOptions{})
		if err != nil || len(r.Results) != 1 {
			b.Fatalf("Run = %+v, %v", r, err)
		}
	}
}

func BenchmarkRunDirect(b *testing.B) {
	ctx := context.Background()
	execProvider := sandboxes.Provider(b)
	h, err := execProvider.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = execProvider.Delete(context.Background(), h) })
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r, err := execProvider.Run(ctx, h, benchCode, sandbox.RunOptions{})
		if err != nil || len(r.Results) != 1 {
			b.Fatalf("Run = %+v, %v", r, err)
		}
	}
}
