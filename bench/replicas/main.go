// Command replicas measures what sharing state in Redis costs, and what several replicas bring.
// It builds the real proxy binary and starts a real redis-server, a scripted upstream that answers
// at once, and proxy processes on loopback with the local sandbox tool, then reports, in one run:
//
//  1. Latency per request, one at a time, interleaved between a proxy on the embedded store and a
//     proxy on Redis: pass-through (no state); intercepted without code (the code_interpreter tool
//     with an explicit container and a previous_response_id: the store's reads and writes of an
//     intercepted request, no sandbox call); intercepted with one code cell; and, with Redis, the
//     same cell sent to a replica that does not host the container (forwarded).
//
//  2. Intercepted sessions per second (a fresh container, one cell, deleted at the end) from -n
//     concurrent clients for -time, against one replica and against three, on one Redis.
//
// Usage:
//
//	go run ./bench/replicas [-requests 1000] [-time 10s] [-n 8]
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ciproxy/ciproxy/bench/internal/proxyproc"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

const (
	masterKey = "sk-bench"
	secret    = "bench-replicas-secret"
)

func main() {
	requests := flag.Int("requests", 1000, "requests per latency series")
	dur := flag.Duration("time", 10*time.Second, "length of each throughput run")
	n := flag.Int("n", 8, "concurrent clients of the throughput runs")
	flag.Parse()
	if err := run(*requests, *dur, *n); err != nil {
		fmt.Fprintf(os.Stderr, "replicas: %v\n", err)
		os.Exit(1)
	}
}

func run(requests int, dur time.Duration, n int) error {
	dir, err := os.MkdirTemp("", "ciproxy-bench-replicas-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o711); err != nil { // bubblewrap's sandbox user must cross it
		return err
	}
	bin := filepath.Join(dir, "proxy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/proxy")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building the proxy (run from the module root): %w", err)
	}
	redisAddr, stopRedis, err := startRedis(dir)
	if err != nil {
		return err
	}
	defer stopRedis()

	up := upstreamtest.New(nil)
	defer up.Close()
	up.Script(script)

	cfg := func(name, redis string, idle string) (string, error) {
		c := fmt.Sprintf(`model_list:
  - model_name: bench
    litellm_params: {model: openai/bench-model, api_base: %s}
sandbox_tools:
  - sandbox_tool_name: local
    litellm_params: {sandbox_provider: local, work_dir: %s, pool_size: 2}
litellm_settings:
  callbacks: ["code_interpreter_interception"]
  code_interpreter_interception_params: {sandbox_tool_name: local, container_idle_timeout: %s}
general_settings:
  master_key: %s
  container_secret: %s
  data_dir: %s
  shutdown_grace: 10s
  # One key drives every session: the quotas are lifted, since this measures capacity, not
  # fairness.
  max_containers: 100000
  max_containers_per_key: 100000
  container_creates_per_minute: 10000000
  container_create_burst: 100000
  max_concurrent_requests: 100000
  max_concurrent_requests_per_key: 100000
`, up.URL(), filepath.Join(dir, "sandboxes"), idle, masterKey, secret, filepath.Join(dir, name+"-state"))
		if redis != "" {
			c += "router_settings:\n  redis_url: redis://" + redis + "\n"
		}
		path := filepath.Join(dir, name+".yaml")
		return path, os.WriteFile(path, []byte(c), 0o600)
	}
	var procs []*proxy
	defer func() {
		for _, p := range procs {
			_ = p.Stop()
		}
	}()
	start := func(name, cfgPath string) (*proxy, error) {
		p, err := startProxy(bin, cfgPath, name)
		if err == nil {
			procs = append(procs, p)
		}
		return p, err
	}

	fmt.Printf("machine: %d CPUs; %d requests per latency series; throughput: %d clients for %s\n\n", proxyproc.CPUs(), requests, n, dur)

	// 1. Latency, embedded against Redis, interleaved.
	embCfg, err := cfg("embedded", "", "20m")
	if err != nil {
		return err
	}
	redCfg, err := cfg("redis", redisAddr, "20m")
	if err != nil {
		return err
	}
	emb, err := start("embedded", embCfg)
	if err != nil {
		return err
	}
	red, err := start("redis-a", redCfg)
	if err != nil {
		return err
	}
	redB, err := start("redis-b", redCfg)
	if err != nil {
		return err
	}
	type target struct {
		name      string
		p         *proxy
		container string
		previous  string
	}
	var targets []*target
	for _, t := range []*target{{name: "embedded", p: emb}, {name: "redis", p: red}} {
		if t.container, err = t.p.createContainer(); err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		if t.previous, err = t.p.intercepted("hi", t.container, ""); err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		targets = append(targets, t)
	}
	series := map[string][]time.Duration{}
	measure := func(key string, f func() error) error {
		t0 := time.Now()
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		series[key] = append(series[key], time.Since(t0))
		return nil
	}
	const warmup = 50
	for i := range requests + warmup {
		for _, t := range targets {
			steps := []struct {
				kind string
				f    func() error
			}{
				{"pass-through", func() error { return t.p.passThrough() }},
				{"intercepted, no code", func() error { _, err := t.p.intercepted("hi", t.container, t.previous); return err }},
				{"intercepted, one cell", func() error { _, err := t.p.intercepted("run", t.container, t.previous); return err }},
			}
			if t.name == "redis" {
				steps = append(steps, struct {
					kind string
					f    func() error
				}{"intercepted, one cell, forwarded", func() error { _, err := redB.intercepted("run", t.container, t.previous); return err }})
			}
			for _, s := range steps {
				key := s.kind + "|" + t.name
				if i < warmup {
					if err := s.f(); err != nil {
						return fmt.Errorf("%s: %w", key, err)
					}
					continue
				}
				if err := measure(key, s.f); err != nil {
					return err
				}
			}
		}
	}
	fmt.Println("latency per request, one at a time (ms)")
	fmt.Println("request                            store     p50     p90     p99 | Redis p50 - embedded p50")
	for _, kind := range []string{"pass-through", "intercepted, no code", "intercepted, one cell", "intercepted, one cell, forwarded"} {
		e, r := proxyproc.Percentiles(series[kind+"|embedded"]), proxyproc.Percentiles(series[kind+"|redis"])
		if len(series[kind+"|embedded"]) > 0 {
			fmt.Printf("%-34s %-8s %6.3f  %6.3f  %6.3f |\n", kind, "embedded", e[0], e[1], e[2])
		}
		diff := ""
		if len(series[kind+"|embedded"]) > 0 {
			diff = fmt.Sprintf("%+.3f", r[0]-e[0])
		} else {
			base := proxyproc.Percentiles(series["intercepted, one cell|redis"])
			diff = fmt.Sprintf("(%+.3f against the same cell on its host)", r[0]-base[0])
		}
		fmt.Printf("%-34s %-8s %6.3f  %6.3f  %6.3f | %s\n", kind, "redis", r[0], r[1], r[2], diff)
	}
	for _, p := range procs {
		if err := p.Stop(); err != nil {
			return err
		}
	}
	procs = nil

	// 2. Sessions per second, one replica against three, on one Redis.
	sessCfg, err := cfg("sessions", redisAddr, "0")
	if err != nil {
		return err
	}
	var replicas []*proxy
	for i := range 3 {
		p, err := start(fmt.Sprintf("replica-%d", i), sessCfg)
		if err != nil {
			return err
		}
		replicas = append(replicas, p)
	}
	fmt.Println()
	fmt.Println("intercepted sessions (a new container, one cell, deleted at the end), concurrent clients")
	fmt.Println("replicas  clients  sessions  sess/s   p50 ms  p90 ms  p99 ms  errors")
	var rates [2]float64
	for i, k := range []int{1, 3} {
		st := throughput(replicas[:k], n, dur)
		ps := proxyproc.Percentiles(st.lat)
		rates[i] = float64(len(st.lat)) / st.elapsed.Seconds()
		fmt.Printf("%-8d  %-7d  %8d  %6.1f   %6.0f  %6.0f  %6.0f  %6d\n", k, n, len(st.lat), rates[i], ps[0], ps[1], ps[2], st.errors)
		if st.errors > 0 {
			fmt.Printf("  first error: %s\n", st.firstErr)
		}
	}
	if rates[0] > 0 {
		fmt.Printf("three replicas against one: %.2fx the sessions per second\n", rates[1]/rates[0])
	}
	for _, p := range procs {
		if err := p.Stop(); err != nil {
			return err
		}
	}
	procs = nil
	return nil
}

// script is the model: input "run" calls the python function once, then answers once it has
// seen the output; anything else is answered at once.
func script(r upstreamtest.Request) upstreamtest.Turn {
	for _, it := range r.History {
		if bytes.Contains(it, []byte(`"function_call_output"`)) {
			return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("done")}}
		}
	}
	if r.Tool("python") != nil && bytes.Contains(r.Body, []byte(`"input":"run"`)) {
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", `{"code":"x = 6 * 7\nprint(x)"}`)}}
	}
	return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("hello")}}
}

type runStats struct {
	lat      []time.Duration
	errors   int
	firstErr string
	elapsed  time.Duration
}

// throughput runs n clients, each sending sessions back to back (to the replicas in turn) until
// d has passed.
func throughput(replicas []*proxy, n int, d time.Duration) runStats {
	var st runStats
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for c := range n {
		wg.Go(func() {
			for i := c; time.Now().Before(end); i++ {
				p := replicas[i%len(replicas)]
				t0 := time.Now()
				_, err := p.intercepted("run", "", "")
				mu.Lock()
				if err != nil {
					st.errors++
					if st.firstErr == "" {
						st.firstErr = err.Error()
					}
				} else {
					st.lat = append(st.lat, time.Since(t0))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	st.elapsed = time.Since(start)
	return st
}

// proxy is one proxy process.
type proxy struct{ *proxyproc.Proxy }

func startProxy(bin, cfg, name string) (*proxy, error) {
	dir := filepath.Dir(cfg)
	pp, err := proxyproc.Start(bin, []string{"--config", cfg, "--data-dir", filepath.Join(dir, name+"-data")},
		filepath.Join(dir, name+".log"), &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proxy{pp}
	// Ready: config loaded (the store was reached at start, or the process would have exited).
	deadline := time.Now().Add(20 * time.Second)
	for {
		if st, _, _ := p.do(http.MethodGet, "/readyz", nil); st == http.StatusOK {
			return p, nil
		}
		if time.Now().After(deadline) {
			_ = p.Stop()
			return nil, fmt.Errorf("%s not ready within 20s", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *proxy) do(method, path string, body any) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.Base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+masterKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.Client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func (p *proxy) passThrough() error {
	st, b, err := p.do(http.MethodPost, "/v1/responses", map[string]any{"model": "bench", "input": "hello"})
	if err == nil && st != http.StatusOK {
		err = fmt.Errorf("HTTP %d: %.200s", st, b)
	}
	return err
}

func (p *proxy) createContainer() (string, error) {
	st, b, err := p.do(http.MethodPost, "/v1/containers", map[string]any{"name": "bench"})
	if err == nil && st != http.StatusOK {
		err = fmt.Errorf("creating a container: HTTP %d: %.200s", st, b)
	}
	var c struct{ ID string }
	_ = json.Unmarshal(b, &c)
	return c.ID, err
}

// intercepted sends input with the code_interpreter tool (container "" for an auto one) and
// returns the response id; input "run" must come back with one completed call.
func (p *proxy) intercepted(input, container, previous string) (string, error) {
	var c any = map[string]any{"type": "auto"}
	if container != "" {
		c = container
	}
	body := map[string]any{"model": "bench", "input": input, "tools": []any{map[string]any{"type": "code_interpreter", "container": c}}}
	if previous != "" {
		body["previous_response_id"] = previous
	}
	st, b, err := p.do(http.MethodPost, "/v1/responses", body)
	if err != nil {
		return "", err
	}
	if st != http.StatusOK {
		return "", fmt.Errorf("HTTP %d: %.300s", st, b)
	}
	var r struct {
		ID     string
		Output []struct{ Type, Status string }
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return "", err
	}
	if input == "run" {
		calls := 0
		for _, it := range r.Output {
			if it.Type == "code_interpreter_call" && it.Status == "completed" {
				calls++
			}
		}
		if calls != 1 {
			return "", fmt.Errorf("%d completed calls: %.300s", calls, b)
		}
	}
	return r.ID, nil
}

// startRedis runs redis-server on a free loopback port, without persistence.
func startRedis(dir string) (string, func(), error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, errors.New("redis-server is not installed (scripts/deps.sh installs it)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := ln.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	_ = ln.Close()
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_, _ = c.Write([]byte("PING\r\n"))
			line, _ := bufio.NewReader(c).ReadString('\n')
			_ = c.Close()
			if strings.HasPrefix(line, "+PONG") {
				return addr, stop, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server did not answer at %s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
