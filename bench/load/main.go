// Command load measures how many concurrent sessions the proxy holds on this machine. It builds
// and starts the real proxy binary (a child process, temp config), with a scripted upstream that
// answers at once and an e2b emulator, both in this process on loopback. At each step N it holds
// N concurrent streaming intercepted sessions (the model runs -cells code cells in a fresh
// sandbox, deleted at the end) and N concurrent pass-through streams, for -step, and reports
// throughput, latency percentiles, the proxy's peak RSS and goroutines, and errors. N doubles
// until a step has errors, -max-n is passed, or the time budget is spent; each sandbox tool
// (local, e2b) gets half of the budget.
//
//	go run ./bench/load [-time 150s] [-step 5s] [-cells 3] [-max-n 256] [-tools local,e2b]
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ciproxy/ciproxy/bench/internal/proxyproc"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

type options struct {
	budget  time.Duration
	step    time.Duration
	cells   int
	maxN    int
	tools   []string
	timeout time.Duration
	text    int
}

func main() {
	var o options
	var tools string
	flag.DurationVar(&o.budget, "time", 150*time.Second, "total time budget (split between the tools)")
	flag.DurationVar(&o.step, "step", 5*time.Second, "how long each step keeps starting requests")
	flag.IntVar(&o.cells, "cells", 3, "code cells the model runs per intercepted session")
	flag.IntVar(&o.maxN, "max-n", 256, "largest concurrency tried")
	flag.StringVar(&tools, "tools", "local,e2b", "sandbox tools to load, in order")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Second, "a request slower than this counts as an error")
	flag.IntVar(&o.text, "text", 400, "bytes of text in each answer (streamed 4 bytes per event)")
	flag.Parse()
	o.tools = strings.Split(tools, ",")
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "load: %v\n", err)
		os.Exit(1)
	}
}

func run(o options) error {
	dir, err := os.MkdirTemp("", "ciproxy-load-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// bubblewrap runs as nobody when started by root: it must be able to cross the directory.
	if err := os.Chmod(dir, 0o711); err != nil {
		return err
	}

	bin := filepath.Join(dir, "proxy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/proxy")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building the proxy (run from the module root): %w", err)
	}

	up := upstreamtest.New(nil)
	defer up.Close()
	text := strings.Repeat("All good. ", o.text/10+1)[:o.text]
	up.Script(func(r upstreamtest.Request) upstreamtest.Turn {
		if r.Tool("python") == nil { // pass-through: no code_interpreter in the client's request
			return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text(text)}}
		}
		done := 0
		for _, it := range r.History {
			if bytes.Contains(it, []byte(`"function_call_output"`)) {
				done++
			}
		}
		if done >= o.cells {
			return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text(text)}}
		}
		args, _ := json.Marshal(map[string]string{"code": fmt.Sprintf("x = %d\nprint(x * x)", done+1)})
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", string(args))}}
	})

	exe, err := local.New(local.Options{PoolSize: 2, WorkDir: filepath.Join(dir, "emu"), Tool: "emu"})
	if err != nil {
		return fmt.Errorf("local sandbox for the e2b emulator: %w", err)
	}
	emu := e2btest.New(exe)
	defer func() {
		emu.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = exe.Close(ctx)
	}()

	cfgPath := filepath.Join(dir, "config.yaml")
	writeConfig := func(tool string) error {
		cfg := fmt.Sprintf(`model_list:
  - model_name: load
    litellm_params:
      model: openai/load-model
      api_base: %s
sandbox_tools:
  - sandbox_tool_name: local
    litellm_params:
      sandbox_provider: local
      work_dir: %s
      pool_size: 2
      memory_limit: 512m
  - sandbox_tool_name: e2b
    litellm_params:
      sandbox_provider: e2b
      api_key: %s
      api_base: %s
      sandbox_url: %s
litellm_settings:
  callbacks: ["code_interpreter_interception"]
  code_interpreter_interception_params:
    sandbox_tool_name: %s
    container_idle_timeout: 0
general_settings:
  data_dir: %s
  shutdown_grace: 10s
  # The load comes from one key at up to max-n at once: the quotas are lifted, since this
  # measures the proxy's capacity, not its fairness.
  max_containers: 100000
  max_containers_per_key: 100000
  container_creates_per_minute: 10000000
  container_create_burst: 100000
  max_concurrent_requests: 100000
  max_concurrent_requests_per_key: 100000
`, up.URL(), filepath.Join(dir, "sandboxes"), emu.APIKey(), emu.URL(), emu.SandboxURL(), tool, filepath.Join(dir, "state"))
		tmp := cfgPath + ".tmp"
		if err := os.WriteFile(tmp, []byte(cfg), 0o600); err != nil {
			return err
		}
		return os.Rename(tmp, cfgPath)
	}
	if err := writeConfig(o.tools[0]); err != nil {
		return err
	}

	p, err := startProxy(bin, cfgPath, filepath.Join(dir, "proxy.log"))
	if err != nil {
		return err
	}
	defer p.Stop()

	fmt.Printf("machine: %d CPUs; proxy pid %d at %s; step %s, %d cells per session, budget %s\n\n",
		proxyproc.CPUs(), p.Cmd.Process.Pid, p.Base, o.step, o.cells, o.budget)
	fmt.Println(header)
	largest := map[string]int{}
	stops := map[string]string{}
	for i, tool := range o.tools {
		if i > 0 {
			before := p.metric("ciproxy_config_reloads_total{result=\"success\"}")
			if err := writeConfig(tool); err != nil {
				return err
			}
			if err := p.waitMetricAbove("ciproxy_config_reloads_total{result=\"success\"}", before, 10*time.Second); err != nil {
				return fmt.Errorf("switching to the %s tool: %w", tool, err)
			}
		}
		deadline := time.Now().Add(o.budget / time.Duration(len(o.tools)))
		var last time.Duration
		stop := fmt.Sprintf("reached -max-n %d", o.maxN)
		for n := 1; n <= o.maxN; n *= 2 {
			// Sessions are CPU-bound (each starts a sandbox), so a step at 2N takes about twice as
			// long as the step at N once the machine is saturated: skip one that would overrun.
			if left := time.Until(deadline); left < 2*last || left <= 0 {
				stop = fmt.Sprintf("time budget: N=%d would not finish in time", n)
				break
			}
			st := step(p, tool, n, o)
			last = st.elapsed
			fmt.Println(st.row())
			if st.errors > 0 {
				fmt.Printf("  first errors: %s\n", strings.Join(st.firstErrors, "; "))
				stop = fmt.Sprintf("errors at N=%d", n)
				break
			}
			largest[tool] = n
		}
		stops[tool] = stop
	}
	fmt.Println()
	for _, tool := range o.tools {
		fmt.Printf("largest N without errors (%s): %d (stopped: %s)\n", tool, largest[tool], stops[tool])
	}
	if err := p.Stop(); err != nil {
		return err
	}
	fmt.Printf("proxy stopped cleanly; peak RSS over the run %.1f MiB\n", float64(p.hwm)/1024)
	return nil
}

const header = "tool   N   | sessions  sess/s  p50 ms  p90 ms  p99 ms | streams  str/s   p50 ms  p90 ms  p99 ms | errors | RSS MiB (peak) | goroutines (max)"

type stepResult struct {
	tool              string
	n                 int
	elapsed           time.Duration
	sessions, streams []time.Duration
	errors            int
	firstErrors       []string
	rssKiB, hwmKiB    int64
	goroutines        float64
}

func (s stepResult) row() string {
	sec := s.elapsed.Seconds()
	ps, pt := proxyproc.Percentiles(s.sessions), proxyproc.Percentiles(s.streams)
	return fmt.Sprintf("%-6s %-3d | %8d  %6.1f  %6.0f  %6.0f  %6.0f | %7d  %6.1f  %6.0f  %6.0f  %6.0f | %6d | %6.1f (%6.1f) | %5.0f",
		s.tool, s.n, len(s.sessions), float64(len(s.sessions))/sec, ps[0], ps[1], ps[2],
		len(s.streams), float64(len(s.streams))/sec, pt[0], pt[1], pt[2], s.errors,
		float64(s.rssKiB)/1024, float64(s.hwmKiB)/1024, s.goroutines)
}

// step runs n intercepted-session workers and n pass-through workers; each starts requests
// back to back until o.step has passed, then finishes the one it holds.
func step(p *proxy, tool string, n int, o options) stepResult {
	st := stepResult{tool: tool, n: n}
	var mu sync.Mutex
	record := func(intercepted bool, d time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil:
			st.errors++
			if len(st.firstErrors) < 3 {
				st.firstErrors = append(st.firstErrors, err.Error())
			}
		case intercepted:
			st.sessions = append(st.sessions, d)
		default:
			st.streams = append(st.streams, d)
		}
	}

	// Sample the proxy's memory and goroutines while the step runs.
	stopSampling := make(chan struct{})
	var sampler sync.WaitGroup
	var maxRSS atomic.Int64
	var maxG atomic.Int64
	sampler.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			if rss, _ := p.memory(); rss > maxRSS.Load() {
				maxRSS.Store(rss)
			}
			if g := int64(p.metric("go_goroutines")); g > maxG.Load() {
				maxG.Store(g)
			}
			select {
			case <-stopSampling:
				return
			case <-t.C:
			}
		}
	})

	start := time.Now()
	end := start.Add(o.step)
	var wg sync.WaitGroup
	for i := range 2 * n {
		intercepted := i < n
		wg.Go(func() {
			for time.Now().Before(end) {
				t0 := time.Now()
				err := p.request(intercepted, o)
				record(intercepted, time.Since(t0), err)
			}
		})
	}
	wg.Wait()
	st.elapsed = time.Since(start)
	// Idle keep-alive connections each hold a server goroutine: close them so the next step
	// starts from a quiet proxy.
	p.Client.CloseIdleConnections()
	close(stopSampling)
	sampler.Wait()
	st.rssKiB = maxRSS.Load()
	_, st.hwmKiB = p.memory()
	p.hwm = max(p.hwm, st.hwmKiB)
	st.goroutines = float64(maxG.Load())
	return st
}

// proxy is the proxy binary running as a child process.
type proxy struct {
	*proxyproc.Proxy
	hwm int64 // the peak RSS seen, KiB
}

func startProxy(bin, cfg, logPath string) (*proxy, error) {
	// A data directory of its own, beside the log: never the host's default one.
	dataDir := filepath.Join(filepath.Dir(logPath), "data")
	pp, err := proxyproc.Start(bin, []string{"--config", cfg, "--data-dir", dataDir}, logPath, &http.Client{Transport: &http.Transport{
		MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024,
	}})
	if err != nil {
		return nil, err
	}
	return &proxy{Proxy: pp}, nil
}

// memory returns the proxy's VmRSS and VmHWM in KiB.
func (p *proxy) memory() (rss, hwm int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Cmd.Process.Pid))
	if err != nil {
		return 0, 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = v
		case "VmHWM:":
			hwm = v
		}
	}
	return rss, hwm
}

// metric reads one sample of the proxy's /metrics; -1 when it cannot.
func (p *proxy) metric(name string) float64 {
	resp, err := p.Client.Get(p.Base + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return 0
}

func (p *proxy) waitMetricAbove(name string, v float64, within time.Duration) error {
	deadline := time.Now().Add(within)
	for p.metric(name) <= v {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s stayed at %v", name, v)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// request sends one streaming request, intercepted (code_interpreter tool) or pass-through, and
// reads it to the end; anything but a stream ending in response.completed is an error.
func (p *proxy) request(intercepted bool, o options) error {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	body := map[string]any{"model": "load", "input": "Compute the squares.", "stream": true}
	if intercepted {
		body["tools"] = []any{map[string]any{"type": "code_interpreter", "container": map[string]any{"type": "auto"}}}
	}
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.Base+"/v1/responses", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, msg)
	}
	var last string
	calls := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		if ev, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			last = ev
			if ev == "response.code_interpreter_call.completed" {
				calls++
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading the stream: %w", err)
	}
	if last != "response.completed" {
		return fmt.Errorf("stream ended with %q", last)
	}
	if intercepted && calls != o.cells {
		return fmt.Errorf("%d code executions completed, want %d", calls, o.cells)
	}
	return nil
}
