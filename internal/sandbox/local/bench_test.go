package local

import (
	"context"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// The start benchmarks wait seconds per iteration (a kernel start, pre-imports included): run them
// with a count, e.g. go test -run=^$ -bench='Start' -benchtime=5x ./internal/sandbox/local/

// BenchmarkColdStart measures Create (no pool) to the first result of 1+1.
func BenchmarkColdStart(b *testing.B) {
	p := newTestProvider(b, Options{PoolSize: -1})
	ctx := context.Background()
	for b.Loop() {
		h, err := p.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		res, err := p.Run(ctx, h, "1 + 1", sandbox.RunOptions{})
		if err != nil || mainText(res) != "2" {
			b.Fatalf("Run = %+v, %v", res, err)
		}
		if err := p.Delete(ctx, h); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWarmStart measures Create from a full warm pool to the first result of 1+1.
func BenchmarkWarmStart(b *testing.B) {
	p := newTestProvider(b, Options{PoolSize: 1})
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		waitPool(b, p, 1)
		b.StartTimer()
		h, err := p.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		res, err := p.Run(ctx, h, "1 + 1", sandbox.RunOptions{})
		if err != nil || mainText(res) != "2" {
			b.Fatalf("Run = %+v, %v", res, err)
		}
		b.StopTimer()
		if err := p.Delete(ctx, h); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkRoundTrip measures one execution of 1+1 in a started sandbox.
func BenchmarkRoundTrip(b *testing.B) {
	p := newTestProvider(b, Options{PoolSize: -1})
	ctx := context.Background()
	h, err := p.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		res, err := p.Run(ctx, h, "1 + 1", sandbox.RunOptions{})
		if err != nil || mainText(res) != "2" {
			b.Fatalf("Run = %+v, %v", res, err)
		}
	}
}

func waitPool(b *testing.B, p *Provider, n int) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		p.mu.Lock()
		have := len(p.pool)
		p.mu.Unlock()
		if have >= n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatal("warm pool not filled in time")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
