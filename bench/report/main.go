// Command report runs every benchmark of the repository and writes docs/benchmarks.md: the
// machine, the method, each figure, and each figure's ratio to its baseline measured in the same
// run where there is one. Run it from the module root on an otherwise idle machine:
//
//	go run ./bench/report [-out docs/benchmarks.md] [-benchtime 2s] [-load-time 150s]
//
// The Go benchmarks run one package at a time (so they do not compete for the CPUs), then the
// programs under bench/ (pass-through comparison, load steps) run with their defaults.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// suite is one `go test -bench` invocation.
type suite struct {
	title   string
	pkg     string
	bench   string
	time    string // -benchtime; "" for the default flag
	method  string
	results []bench
	env     []string // added to the environment of the run, and printed with its command
	out     string
	err     error
}

// bench is one benchmark line.
type bench struct {
	name    string
	n       int64
	metrics map[string]float64 // unit -> value ("ns/op", "B/op", "allocs/op", "MB/s", custom)
	units   []string           // in printed order
}

// program is one `go run` of a benchmark program.
type program struct {
	title, pkg, method string
	args               []string
	out                string
	err                error
	took               time.Duration
}

// ratio compares one benchmark figure with its baseline from the same run. unit is the unit of
// both figures, or "<sub's unit> over <base's unit>" for two figures of one benchmark.
type ratio struct {
	what, base, sub, unit, meaning string
}

// units are the sub's and the base's unit.
func (r ratio) units() (sub, base string) {
	if s, b, ok := strings.Cut(r.unit, " over "); ok {
		return s, b
	}
	return r.unit, r.unit
}

func main() {
	out := flag.String("out", "docs/benchmarks.md", "the report to write")
	benchtime := flag.String("benchtime", "2s", "-benchtime of the fast Go benchmarks")
	loadTime := flag.String("load-time", "150s", "time budget of bench/load")
	flag.Parse()

	suites := []*suite{
		{title: "Pass-through in process (internal/upstream)", pkg: "./internal/upstream", bench: ".", time: *benchtime,
			method: "`Target.Proxy` behind an httptest server versus the same upstream called directly, one request at a time over loopback: a JSON answer, and a 20-event SSE stream flushed per event. Also the surgical model rewrite of a request body (`ChatRequest/native-baseline` is the same rewrite of the chat translation's request)."},
		{title: "SSE reader (internal/sse)", pkg: "./internal/sse", bench: ".", time: *benchtime,
			method: "The server-sent event reader alone over a 20-event Responses stream held in memory."},
		{title: "Chat Completions translation (internal/upstream/chat)", pkg: "./internal/upstream/chat", bench: ".", time: *benchtime,
			method: "The Responses ⇄ Chat Completions translation in process, no I/O: `ChatRequest` translates a request and a completion, `ChatStream` whole streams (per upstream event, the SSE reader included), `ChatStreamDelta` one chunk; `ResponsesSSEBaseline` is the native path's reading of the same number of events."},
		{title: "Interception engine (internal/intercept)", pkg: "./internal/intercept", bench: ".", time: *benchtime, env: tmpfsEnv(),
			method: "The engine's own cost with an upstream and a sandbox that answer at once (recorded upstream bodies, an instant sandbox provider): `Iteration` is one request of 5 upstream calls (4 run code, 1 answers), reported per iteration; `StreamEvent` is a text answer of many deltas translated, numbered and written to the client, reported per event; `RequestByAPI` and `StreamEventByAPI` are the same over a Responses and a Chat Completions upstream. The embedded store's directory is on a tmpfs (TMPDIR=/dev/shm, where there is one), so the fsyncs of a disk are not counted here: the store's own cost is under Shared store. Every container of these requests is recorded in that store (so that replicas share it): one request of `Iteration` creates the container's record, then reads it and writes it back after each of the 4 executions and when the container is released: six writes, five reads; `IterationStore` is `Iteration/json` with those calls timed (`store-ns/iteration`), the rest being the engine's own (`engine-ns/iteration`). When the JSON iteration grew from 45.9 µs (726 allocs/op) to 64 µs (837) between two reports, changes had added work to each request, all of it deliberate; counted in instructions (valgrind --tool=callgrind, user space, per request of 5 iterations, the benchmark at each commit) the request went from 1.43 M to 2.47 M, the program's own code from 0.79 M to 1.34 M and the rest the Go runtime, mostly the collector: the guard against deeply nested JSON (`jsondepth.Within` over the request and every upstream answer, +0.11 M), the check that a JSON answer is whole, valid JSON (`gjson.Valid`, +0.09 M), and the container's record in the store (+0.21 M, mostly its JSON encoding and file paths, plus the six writes' system calls: a create, write and rename of a file each, kernel time that instructions do not count and that `IterationStore` times), and more field lookups in the translator of the new pipeline (+0.1 M)."},
		{title: "Code argument decoder (internal/intercept/argstream)", pkg: "./internal/intercept/argstream", bench: ".", time: *benchtime,
			method: "Decoding the `code` field out of streamed function-call arguments (16 KiB of code with escapes and multi-byte text) fed in chunks of 4 bytes, 64 bytes, or all at once."},
		{title: "Execution decoder (internal/sandbox)", pkg: "./internal/sandbox", bench: "DecodeExecution", time: *benchtime,
			method: "`sandbox.DecodeExecution` on NDJSON transcripts of the code-interpreter protocol: a short print-and-result, 100 stdout chunks, one 512 KiB figure."},
		{title: "Local sandbox start (internal/sandbox/local)", pkg: "./internal/sandbox/local", bench: "Start", time: "5x",
			method: "Create to the first result of `1 + 1`: cold (a kernel forked from the zygote into a new bubblewrap sandbox, its imports already done) versus warm (a kernel taken from the warm pool). 5 iterations each; the ratio compares the medians (time/op also counts the pool's refill between iterations)."},
		{title: "Local sandbox isolation (internal/sandbox/local)", pkg: "./internal/sandbox/local", bench: "Seccomp|Cgroup", time: "20x",
			method: "What the seccomp filter and the cgroups cost a local sandbox. `Seccomp/*/create` and `Cgroup/with_cgroups` / `without_cgroups` are create to the first result of `1 + 1` with no warm pool, with and without the filter or the cgroups (medians compared; without cgroups, as on a host that has none, a sandbox is paused by stopping its processes one by one instead of by the cgroup freezer, so that pair compares the two setups whole); `Seccomp/*/syscall` is a loop of `getppid` in the kernel, per system call; `Cgroup/setup` is the cgroup work of one create alone (the sandbox's cgroups made with their limits, a process placed, killed, the cgroups removed); `SeccompAssemble` builds the kernels' filter program (built once per provider, at its start; every kernel installs it on itself, which the create pair counts). 20 iterations each."},
		{title: "New-file scan (internal/sandbox/backends)", pkg: "./internal/sandbox/backends", bench: "CollectFiles/local", time: *benchtime,
			method: "What finding the new files after an execution costs a local container holding 0, 100 or 1000 files in /mnt/data that the execution did not change: one listing compared with the last one, no store access (`Container.CollectFiles`)."},
		{title: "A 10 MB file into and out of a local container (internal/sandbox/backends)", pkg: "./internal/sandbox/backends", bench: "PlaceFile10MB/(local|copy|read)", time: "20x",
			method: "A 10 MB Files API file placed into a new local container's /mnt/data (`Container.PlaceFiles`: the embedded store's bytes into the sandbox, and the record; the container's creation is not timed) and downloaded as the Containers API does (`containers.Manager.ReadFile`), against the floor: the same bytes copied from the store into a file of a fresh directory on the host, and read back from one. 20 iterations each."},
		{title: "Local sandbox round trip (internal/sandbox/local)", pkg: "./internal/sandbox/local", bench: "RoundTrip", time: *benchtime,
			method: "One execution of `1 + 1` in a started kernel: the local backend's floor per execution."},
		{title: "e2b client overhead (internal/sandbox/e2b)", pkg: "./internal/sandbox/e2b", bench: ".", time: *benchtime,
			method: "The same cell in the same local kernel, through the e2b client and the e2b emulator (HTTP, NDJSON re-encoding and decoding) versus calling the local provider directly."},
		{title: "agent-sandbox backend over its double (internal/sandbox/agentsandbox)", pkg: "./internal/sandbox/agentsandbox", bench: ".", time: "20x",
			method: "agent_sandbox against its test double (a Kubernetes API server and controller in this process, bubblewrap pods entered with nsenter, a sandboxd of Go) beside e2b against its emulator (a local sandbox), in the same benchmark functions: a creation through the first result (a claim adopting a warm sandbox, readiness by watch, the kernel daemon's start), a trivial cell in an existing sandbox (through the replica's relay to the kernel daemon), and a `true` command. The creation figure is bounded by the double's controller, not a cluster's. 20 iterations each."},
		{title: "Shared store (internal/store/redisstore)", pkg: "./internal/store/redisstore", bench: ".", time: *benchtime,
			method: "The store calls an intercepted request makes (read the previous response, read and touch its container, store the new response; `request` is the four in a row) on the embedded store and on Redis over loopback (a redis-server started by the benchmark), with the median and 99th percentile of single calls; and a 64 MiB file stored and read back through each."},
	}
	programs := []*program{
		{title: "Pass-through, whole proxy (bench/passthrough)", pkg: "./bench/passthrough",
			method: "The proxy binary against a direct call to the same upstream; see its own output for the method. " +
				"Memory: RSS is anonymous pages (the Go heap, stacks, the runtime) plus file pages, nearly all of them the executable's code and read-only data mapped from the page cache (clean, shared by every process running that executable, given back under memory pressure): they follow the executable's size, which the bare ReverseProxy's small executable shows. " +
				"When the peak grew from about 23 to 28 MiB (idle 12.6 to 15.9 MiB) between two rounds, the two executables run by this program one after the other (2026-12-01) showed where: the executable grew from 15.7 to 21.3 MiB (the Redis client and store, the embedded store, the Containers API, the Chat Completions translation, forwarding between replicas), which is 2.3 MiB more file pages idle and 2.6 MiB at the end of the load; " +
				"and the heap live at idle grew from 0.46 to 0.94 MB, all of it package initialisation (the seccomp library's syscall tables of every architecture 161 kB, the Redis store's Lua scripts 92 kB, compiled regular expressions 127 kB, of which the two stores' id patterns, 100 kB, now compile small: 0.81 MB live at idle since), which the collector's goal (twice the live heap) doubles: 1.0 MiB more anonymous pages idle and 0.7 to 1.6 MiB at the end. Under load the live heap is about 3 MB in both (GODEBUG=gctrace=1), and a pass-through request allocates 5% more than then (21.8 to 22.9 kB in internal/router's Passthrough benchmark): 35 kB for the 32 requests in flight."},
		{title: "Replicas (bench/replicas)", pkg: "./bench/replicas",
			method: "The proxy binary on a real redis-server against the same binary on the embedded store (data directory), local sandbox tool, a scripted upstream answering at once, all on loopback. Latency: 1000 requests per series, one at a time, interleaved between the two proxies: pass-through; intercepted without code (explicit container and previous_response_id: the store's reads and writes, no sandbox call); intercepted with one cell; with Redis, the same cell sent to a replica that does not host the container (forwarded). Throughput: 8 clients for 10 s of intercepted sessions (a new container, one cell, deleted at the end) against one replica, then three, on one Redis; the load generator and all replicas share the same 2 cores."},
		{title: "Load (bench/load)", pkg: "./bench/load", args: []string{"-time", *loadTime},
			method: "The proxy binary as a child process (temp config, the local tool then the e2b tool through the emulator, a scripted upstream in this process answering at once, all on loopback). At each step N: N concurrent streaming intercepted sessions (the model runs 3 cells in a fresh sandbox, deleted when the session ends) and N concurrent pass-through streams, started back to back for 5 s. Latencies are whole requests (to `response.completed`). RSS is the proxy process alone (the sandboxes are separate processes); goroutines from its `/metrics`. N doubles until a step has an error or the time budget (split between the tools) would be overrun. The load generator runs on the same 2 cores. Session throughput is bounded by sandbox starts: every session takes a fresh kernel (see the cold start above; the warm pool only hides the first few), so past the saturation point latency grows with N while sessions/s stays flat, and pass-through latency shows the CPU the starting kernels take from the proxy."},
	}

	start := time.Now()
	for _, s := range suites {
		args := []string{"test", "-run", "^$", "-bench", s.bench, "-benchmem", "-count", "1"}
		if s.time != "" {
			args = append(args, "-benchtime", s.time)
		}
		args = append(args, s.pkg)
		fmt.Fprintf(os.Stderr, "report: %s go %s\n", strings.Join(s.env, " "), strings.Join(args, " "))
		s.out, s.err = runCmdEnv(s.env, "go", args...)
		s.results = parseBench(s.out)
	}
	for _, p := range programs {
		if _, err := os.Stat(strings.TrimPrefix(p.pkg, "./")); err != nil {
			p.err = fmt.Errorf("not in this checkout")
			continue
		}
		args := append([]string{"run", p.pkg}, p.args...)
		fmt.Fprintf(os.Stderr, "report: go %s\n", strings.Join(args, " "))
		t0 := time.Now()
		p.out, p.err = runCmd("go", args...)
		p.took = time.Since(t0)
	}

	ratios := []ratio{
		{"pass-through JSON", "BenchmarkProxyJSON/direct", "BenchmarkProxyJSON/proxy", "ns/op", "proxy / direct time per request"},
		{"pass-through SSE, 20 events", "BenchmarkProxySSE20/direct", "BenchmarkProxySSE20/proxy", "ns/op", "proxy / direct time per stream"},
		{"local sandbox start", "BenchmarkWarmStart", "BenchmarkColdStart", "p50-ms", "cold / warm median time to first result (what the warm pool saves)"},
		{"e2b execution", "BenchmarkRunDirect", "BenchmarkRunViaEmulator", "ns/op", "via e2b client and emulator / direct"},
		{"agent-sandbox cell", "BenchmarkTrivialCell/e2b", "BenchmarkTrivialCell/agent_sandbox", "ns/op", "a trivial cell over agent_sandbox and its double / over e2b and its emulator"},
		{"argument decoder, 4-byte chunks", "BenchmarkDecoder/chunk=", "BenchmarkDecoder/chunk=4", "ns/op", "4-byte chunks / one chunk (baseline: the largest chunk size)"},
		{"argument decoder, 64-byte chunks", "BenchmarkDecoder/chunk=", "BenchmarkDecoder/chunk=64", "ns/op", "64-byte chunks / one chunk"},
		{"engine iteration, streaming", "BenchmarkIteration/json", "BenchmarkIteration/stream", "ns/iteration", "stream / JSON rendering per iteration"},
		{"shared store per intercepted request", "BenchmarkHotCalls/embedded/request", "BenchmarkHotCalls/redis/request", "p50-µs", "Redis over loopback / embedded store, median of the four store calls of one request"},
		{"engine per streamed event vs SSE reading", "BenchmarkSSEReader", "BenchmarkStreamEvent", "ns/event", "engine ns per event / SSE reader ns per event (the reader alone: 20 events per op)"},
		{"Chat Completions upstream, per streamed event", "BenchmarkStreamEventByAPI/responses", "BenchmarkStreamEventByAPI/chat", "ns/event", "engine ns per event, chat chunks translated / a Responses upstream's events"},
		{"Chat Completions upstream, streamed request", "BenchmarkRequestByAPI/responses/stream", "BenchmarkRequestByAPI/chat/stream", "ns/op", "one intercepted request of two upstream calls, chat / Responses upstream"},
		{"Chat Completions upstream, JSON request", "BenchmarkRequestByAPI/responses/json", "BenchmarkRequestByAPI/chat/json", "ns/op", "the same request answered in JSON, chat / Responses upstream"},
		{"engine iteration, container registry", "BenchmarkIterationStore", "BenchmarkIterationStore", "store-ns/iteration over ns/iteration", "the store calls' share of a JSON iteration (the container's record created, then read and written back after each execution and at release)"},
		{"seccomp filter per create", "BenchmarkSeccomp/unfiltered/create", "BenchmarkSeccomp/filtered/create", "p50-ms", "median create to first result, with / without the filter"},
		{"seccomp filter per system call", "BenchmarkSeccomp/unfiltered/syscall", "BenchmarkSeccomp/filtered/syscall", "ns/syscall", "getppid in the sandbox, with / without the filter"},
		{"cgroups per create", "BenchmarkCgroup/without_cgroups", "BenchmarkCgroup/with_cgroups", "p50-ms", "median create to first result, with / without cgroups"},
		{"new-file scan, 1000 files", "BenchmarkCollectFiles/local/files=0", "BenchmarkCollectFiles/local/files=1000", "ns/op", "scan of a container holding 1000 files / holding none"},
		{"new-file scan, 100 files", "BenchmarkCollectFiles/local/files=0", "BenchmarkCollectFiles/local/files=100", "ns/op", "scan of a container holding 100 files / holding none"},
		{"10 MB placed into a local container", "BenchmarkPlaceFile10MBDirect/copy", "BenchmarkPlaceFile10MB/local/place", "ns/op", "placement / a copy from the store to a host file"},
		{"10 MB downloaded from a local container", "BenchmarkPlaceFile10MBDirect/read", "BenchmarkPlaceFile10MB/local/download", "ns/op", "download / a read of a host file"},
	}

	var doc bytes.Buffer
	w := func(format string, a ...any) { fmt.Fprintf(&doc, format, a...) }
	w("# Benchmarks\n\n")
	w("Generated by `go run ./bench/report` on %s (%s in all). Every figure below comes from that one run, on the machine described; ratios compare figures measured in the same run. Rerun the command to refresh this file; figures move by several percent between runs on a shared 2-core machine, so read ratios, not digits.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), time.Since(start).Round(time.Second))
	w("## Machine\n\n%s\n", machine())
	w("## Ratios to baselines\n\n| what | ratio | meaning | figure | baseline |\n|---|---|---|---|---|\n")
	for _, r := range ratios {
		base, sub, ok := r.values(suites)
		if !ok {
			w("| %s | n/a | %s | (not measured) | |\n", r.what, r.meaning)
			continue
		}
		subUnit, baseUnit := r.units()
		w("| %s | %.3g× | %s | %s | %s |\n", r.what, sub/base, r.meaning, human(sub, subUnit), human(base, baseUnit))
	}
	w("\n")
	for _, s := range suites {
		w("## %s\n\n%s\n\n", s.title, s.method)
		w("`")
		for _, e := range s.env {
			w("%s ", e)
		}
		w("go test -run '^$' -bench '%s' -benchmem", s.bench)
		if s.time != "" {
			w(" -benchtime %s", s.time)
		}
		w(" %s`\n\n", s.pkg)
		if s.err != nil && len(s.results) == 0 {
			w("Not measured: %v\n\n```\n%s\n```\n\n", s.err, tailLines(s.out, 15))
			continue
		}
		w("| benchmark | iterations | time/op | other |\n|---|---|---|---|\n")
		for _, b := range s.results {
			var other []string
			for _, u := range b.units {
				if u != "ns/op" {
					other = append(other, fmt.Sprintf("%s %s", trim(b.metrics[u]), u))
				}
			}
			w("| %s | %d | %s | %s |\n", strings.TrimPrefix(b.name, "Benchmark"), b.n, human(b.metrics["ns/op"], "ns/op"), strings.Join(other, ", "))
		}
		w("\n")
	}
	for _, p := range programs {
		w("## %s\n\n%s\n\n`go run %s %s`", p.title, p.method, p.pkg, strings.Join(p.args, " "))
		if p.took > 0 {
			w(" (took %s)", p.took.Round(time.Second))
		}
		w("\n\n")
		if p.err != nil {
			w("Not measured: %v\n\n", p.err)
			if p.out == "" {
				continue
			}
		}
		w("```\n%s\n```\n\n", strings.TrimSpace(p.out))
	}
	if err := os.WriteFile(*out, doc.Bytes(), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "report: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "report: wrote %s\n", *out)
}

// values finds the two figures of a ratio. A base ending in "=" means the largest chunk size of
// that family (the sub-benchmark with the highest number after "=").
func (r ratio) values(suites []*suite) (base, sub float64, ok bool) {
	find := func(name string) (bench, bool) {
		var best bench
		found := false
		bestN := -1
		for _, s := range suites {
			for _, b := range s.results {
				if strings.HasSuffix(name, "=") && strings.HasPrefix(b.name, name) {
					n, _ := strconv.Atoi(strings.TrimPrefix(b.name, name))
					if n > bestN {
						best, bestN, found = b, n, true
					}
				} else if b.name == name {
					return b, true
				}
			}
		}
		return best, found
	}
	bb, ok1 := find(r.base)
	sb, ok2 := find(r.sub)
	if !ok1 || !ok2 {
		return 0, 0, false
	}
	subUnit, baseUnit := r.units()
	sub, ok2 = sb.metrics[subUnit]
	if !ok2 {
		return 0, 0, false
	}
	base, ok1 = bb.metrics[baseUnit]
	if !ok1 && baseUnit == "ns/event" {
		// The SSE reader benchmark reads 20 events per op.
		base, ok1 = bb.metrics["ns/op"]
		base /= 20
	}
	return base, sub, ok1 && base > 0
}

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$`)

func parseBench(out string) []bench {
	var res []bench
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		n, _ := strconv.ParseInt(m[2], 10, 64)
		b := bench{name: m[1], n: n, metrics: map[string]float64{}}
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			b.metrics[f[i+1]] = v
			b.units = append(b.units, f[i+1])
		}
		res = append(res, b)
	}
	return res
}

func runCmd(name string, args ...string) (string, error) { return runCmdEnv(nil, name, args...) }

func runCmdEnv(env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var buf bytes.Buffer
	cmd.Stdout = io.MultiWriter(&buf, os.Stderr)
	cmd.Stderr = io.MultiWriter(&buf, os.Stderr)
	err := cmd.Run()
	return buf.String(), err
}

// tmpfsEnv points TMPDIR at /dev/shm when it is a writable directory, else changes nothing.
func tmpfsEnv() []string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return []string{"TMPDIR=/dev/shm"}
	}
	return nil
}

func machine() string {
	var b strings.Builder
	model := "unknown"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := "unknown"
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				mem = fmt.Sprintf("%.1f GiB", kb/(1<<20))
			}
		}
	}
	goVersion, _ := runQuiet("go", "version")
	kernel, _ := runQuiet("uname", "-sr")
	py, _ := runQuiet("/usr/bin/python3", "--version")
	bw, _ := runQuiet("bwrap", "--version")
	fmt.Fprintf(&b, "- CPUs: %d (`nproc`), %s\n", runtime.NumCPU(), model)
	fmt.Fprintf(&b, "- Memory: %s\n", mem)
	fmt.Fprintf(&b, "- OS: %s, %s/%s\n", strings.TrimSpace(kernel), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(&b, "- Go: %s\n", strings.TrimSpace(goVersion))
	fmt.Fprintf(&b, "- Sandbox: %s, %s\n", strings.TrimSpace(bw), strings.TrimSpace(py))
	return b.String()
}

func runQuiet(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

func human(v float64, unit string) string {
	if what, ns, ok := strings.Cut(unit, "-ns/"); ok {
		return human(v, "ns/"+ns) + " (" + what + ")" // "store-ns/iteration": 1.20 µs/iteration (store)
	}
	if !strings.HasPrefix(unit, "ns/") {
		return trim(v) + " " + unit
	}
	per := strings.TrimPrefix(unit, "ns/")
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.2f s/%s", v/1e9, per)
	case v >= 1e6:
		return fmt.Sprintf("%.2f ms/%s", v/1e6, per)
	case v >= 1e3:
		return fmt.Sprintf("%.2f µs/%s", v/1e3, per)
	}
	return fmt.Sprintf("%.0f ns/%s", v, per)
}

func trim(v float64) string {
	if v == float64(int64(v)) {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
