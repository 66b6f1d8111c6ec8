package local

import (
	"context"
	"os/exec"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Run the start benchmarks with a count, e.g.
//   go test -run='^$' -bench='Start|Sessions|Seccomp|Cgroup' -benchtime=50x ./internal/sandbox/local/
// Every provider's fork server is started (and its first sandbox made) before the timer runs: it
// is paid once per provider, at New, not per container.

// firstResult creates a sandbox, runs 1+1 and returns how long that took; the sandbox is deleted.
func firstResult(b *testing.B, p *Provider) time.Duration {
	ctx := context.Background()
	start := time.Now()
	h, err := p.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	res, err := p.Run(ctx, h, "1 + 1", sandbox.RunOptions{})
	took := time.Since(start)
	if err != nil || mainText(res) != "2" {
		b.Fatalf("Run = %+v, %v", res, err)
	}
	b.StopTimer()
	if err := p.Delete(ctx, h); err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	return took
}

// reportPercentiles adds p50 and p99 of ds, in milliseconds.
func reportPercentiles(b *testing.B, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2])/1e6, "p50-ms")
	b.ReportMetric(float64(ds[len(ds)*99/100])/1e6, "p99-ms")
}

func warmedProvider(b *testing.B, opts Options, k knobs) *Provider {
	p, err := newProvider(opts, k)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close(context.Background()) })
	firstResult(b, p) // starts the fork server
	return p
}

// BenchmarkColdStart measures Create with no warm pool to the first result of 1+1.
func BenchmarkColdStart(b *testing.B) {
	p := warmedProvider(b, Options{PoolSize: -1}, knobs{})
	var ds []time.Duration
	for b.Loop() {
		ds = append(ds, firstResult(b, p))
	}
	reportPercentiles(b, ds)
}

// BenchmarkWarmStart measures Create from a full warm pool to the first result of 1+1.
func BenchmarkWarmStart(b *testing.B) {
	p := warmedProvider(b, Options{PoolSize: 1}, knobs{})
	var ds []time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		waitPool(b, p, 1)
		b.StartTimer()
		ds = append(ds, firstResult(b, p))
	}
	reportPercentiles(b, ds)
}

// BenchmarkSessions runs whole sessions (Create, 1+1, Delete) from 8 goroutines at once, with no
// warm pool, and reports how many finish per second.
func BenchmarkSessions(b *testing.B) {
	p := warmedProvider(b, Options{PoolSize: -1}, knobs{})
	ctx := context.Background()
	var failed atomic.Int64
	b.SetParallelism(4)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h, err := p.Create(ctx, sandbox.CreateOptions{})
			if err != nil {
				failed.Add(1)
				continue
			}
			if res, err := p.Run(ctx, h, "1 + 1", sandbox.RunOptions{}); err != nil || mainText(res) != "2" {
				failed.Add(1)
			}
			p.Delete(ctx, h)
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "sessions/s")
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d sessions failed", n)
	}
}

// BenchmarkRoundTrip measures one execution of 1+1 in a started sandbox (thawing and freezing it
// included).
func BenchmarkRoundTrip(b *testing.B) {
	p := warmedProvider(b, Options{PoolSize: -1}, knobs{})
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

// BenchmarkSeccomp measures what the filter costs: per create (sandboxes with and without it),
// and per system call (a loop of getppid inside the sandbox; ns per call).
func BenchmarkSeccomp(b *testing.B) {
	for _, tc := range []struct {
		name string
		k    knobs
	}{{"filtered", knobs{}}, {"unfiltered", knobs{noSeccomp: true}}} {
		b.Run(tc.name+"/create", func(b *testing.B) {
			p := warmedProvider(b, Options{PoolSize: -1}, tc.k)
			var ds []time.Duration
			for b.Loop() {
				ds = append(ds, firstResult(b, p))
			}
			reportPercentiles(b, ds)
		})
		b.Run(tc.name+"/syscall", func(b *testing.B) {
			p := warmedProvider(b, Options{PoolSize: -1}, tc.k)
			h := create(b, p, sandbox.CreateOptions{})
			const calls = 200000
			var total float64
			for b.Loop() {
				res := run(b, p, h, "import os, time\nt = time.perf_counter_ns()\nfor _ in range(200000):\n    os.getppid()\n(time.perf_counter_ns() - t)")
				ns, err := strconv.ParseFloat(mainText(res), 64)
				if err != nil {
					b.Fatal(mainText(res))
				}
				total += ns / calls
			}
			b.ReportMetric(total/float64(b.N), "ns/syscall")
		})
	}
}

// BenchmarkCgroup measures the cgroup setup per create: making a sandbox's cgroups with their
// limits, placing a process, killing it and removing them; and create to first result with and
// without cgroups.
func BenchmarkCgroup(b *testing.B) {
	p := warmedProvider(b, Options{PoolSize: -1}, knobs{})
	if p.cg == nil {
		b.Skip("no writable cgroup on this host")
	}
	b.Run("setup", func(b *testing.B) {
		for b.Loop() {
			cmd := exec.Command("sleep", "60")
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			cg, err := p.cg.create(newID(), cgroupSettings{memory: 1 << 30, processes: 65, cpus: 1})
			if err != nil {
				b.Fatal(err)
			}
			if err := cg.place(cmd.Process.Pid); err != nil {
				b.Fatal(err)
			}
			cg.kill()
			cmd.Wait()
			cg.remove()
		}
	})
	for _, tc := range []struct {
		name string
		k    knobs
	}{{"with cgroups", knobs{}}, {"without cgroups", knobs{noCgroups: true}}} {
		b.Run(tc.name, func(b *testing.B) {
			p := warmedProvider(b, Options{PoolSize: -1}, tc.k)
			var ds []time.Duration
			for b.Loop() {
				ds = append(ds, firstResult(b, p))
			}
			reportPercentiles(b, ds)
		})
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

// BenchmarkExecRoundTrip measures one shell command (echo) in a started sandbox, beside
// BenchmarkRoundTrip's 1+1 in its kernel, and the time to its first output piece.
func BenchmarkExecRoundTrip(b *testing.B) {
	p := warmedProvider(b, Options{PoolSize: -1}, knobs{})
	ctx := context.Background()
	h, err := p.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var first time.Duration
	for b.Loop() {
		start := time.Now()
		var got time.Duration
		res, err := p.Exec(ctx, h, "echo hi", sandbox.ExecOptions{OnOutput: func(sandbox.Stream, string) {
			if got == 0 {
				got = time.Since(start)
			}
		}})
		if err != nil || res.ExitCode != 0 || got == 0 {
			b.Fatalf("Exec = %+v, %v", res, err)
		}
		first += got
	}
	b.ReportMetric(float64(first.Microseconds())/float64(b.N), "µs-to-first-output")
}
