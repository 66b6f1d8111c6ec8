// Command passthrough measures what the proxy adds to a pass-through request. It starts an
// OpenAI-like upstream in this process (JSON /v1/responses, JSON /v1/chat/completions, and a
// 20-event SSE stream for "stream":true), builds the real proxy binary and runs it as a child
// process pointed at that upstream, then alternates direct and proxied phases of each workload:
//
//   - throughput at saturation: -conns keep-alive connections for -duration, proxied/direct ratio;
//   - the proxy's CPU time per request: utime+stime from /proc/<pid>/stat around each proxied
//     phase, divided by the requests it served;
//   - its memory from /proc/<pid>/status: the resident set when idle after the start and at the
//     end, split into anonymous pages (heap, stacks, runtime) and file pages (the executable's
//     code and read-only data, mapped from the page cache), and the peak (VmHWM); with the size of
//     the executable, which the file pages follow;
//   - added latency, p50 and p99, over one connection (-latency-requests per side).
//
// With -bare (the default) a bare httputil.ReverseProxy child (no routing, auth, body read, log or
// metrics) is measured the same way: the floor of what any Go proxy adds on this machine.
//
// The load generator, the upstream and the proxy share this machine's cores, so the throughput
// ratio is a lower bound of what the proxy allows on dedicated hardware.
//
//	go run ./bench/passthrough [-duration 1.5s] [-conns 32] [-rounds 2] [-latency-requests 1500] [-bare=false]
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const masterKey = "sk-bench-master"

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat (100 on Linux).
const clockTicks = 100

type options struct {
	duration    time.Duration
	conns       int
	rounds      int
	latencyReqs int
	proxyBin    string
	bare        bool
}

func main() {
	var o options
	flag.DurationVar(&o.duration, "duration", 1500*time.Millisecond, "length of each throughput phase")
	flag.IntVar(&o.conns, "conns", 32, "concurrent keep-alive connections in the throughput phases")
	flag.IntVar(&o.rounds, "rounds", 2, "direct/proxied alternations per workload")
	flag.IntVar(&o.latencyReqs, "latency-requests", 1500, "sequential requests per side in the latency phase")
	flag.StringVar(&o.proxyBin, "proxy-bin", "", "use this proxy binary instead of building ./cmd/proxy")
	flag.BoolVar(&o.bare, "bare", true, "also measure a bare httputil.ReverseProxy child, as the floor of what any Go proxy adds")
	flag.Parse()
	var err error
	if flag.Arg(0) == "serve-bare" && flag.NArg() == 3 {
		err = serveBare(flag.Arg(1), flag.Arg(2))
	} else {
		err = run(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "passthrough:", err)
		os.Exit(1)
	}
}

// workload is one kind of request.
type workload struct {
	name string
	path string
	body []byte
}

var workloads = []workload{
	{"responses JSON", "/v1/responses", []byte(`{"model":"bench","input":"Say hello in five words.","store":false}`)},
	{"chat JSON", "/v1/chat/completions", []byte(`{"model":"bench","messages":[{"role":"user","content":"Say hello in five words."}]}`)},
	{"responses SSE x20", "/v1/responses", []byte(`{"model":"bench","input":"Say hello in five words.","stream":true}`)},
}

// side is one way to reach the upstream: directly, or through a proxy child process (pid > 0)
// run from the executable bin.
type side struct {
	name string
	url  string
	pid  int
	bin  string
	idle memory // once ready, before any request
}

// figures are one side's measurements of one workload.
type figures struct {
	reqs, errors int64
	took         time.Duration
	cpuTicks     int64
	lat          []time.Duration
}

func (f *figures) rps() float64 { return float64(f.reqs) / f.took.Seconds() }

func (f *figures) cpuPerReq() time.Duration {
	if f.reqs == 0 {
		return 0
	}
	return time.Duration(float64(f.cpuTicks) * float64(time.Second) / clockTicks / float64(f.reqs))
}

func run(o options) error {
	tmp, err := os.MkdirTemp("", "ciproxy-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	up, err := startUpstream()
	if err != nil {
		return err
	}
	defer up.Close()

	bin := o.proxyBin
	if bin == "" {
		bin = filepath.Join(tmp, "proxy")
		fmt.Fprintln(os.Stderr, "building ./cmd/proxy ...")
		build := exec.Command("go", "build", "-o", bin, "github.com/ciproxy/ciproxy/cmd/proxy")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("building the proxy: %w", err)
		}
	}
	child, proxyURL, err := startProxy(bin, tmp, "http://"+up.Addr)
	if err != nil {
		return err
	}
	defer stop(child)
	sides := []side{{name: "direct", url: "http://" + up.Addr}, {name: "ciproxy", url: proxyURL, pid: child.Process.Pid, bin: bin}}
	if o.bare {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		bare, bareURL, err := startChild(exec.Command(self, "serve-bare"), tmp, "http://"+up.Addr)
		if err != nil {
			return err
		}
		defer stop(bare)
		sides = append(sides, side{name: "bare ReverseProxy", url: bareURL, pid: bare.Process.Pid, bin: self})
	}
	for i := range sides {
		if sides[i].pid > 0 {
			if sides[i].idle, err = readMemory(sides[i].pid); err != nil {
				return err
			}
		}
	}

	all := make([][]figures, len(workloads))
	for wi, w := range workloads {
		figs := make([]figures, len(sides))
		fmt.Fprintf(os.Stderr, "%s: throughput ...\n", w.name)
		for _, s := range sides { // warm connections and pools before measuring
			load(s.url, w, o.conns, o.duration/5)
		}
		for range o.rounds {
			for i, s := range sides {
				var before int64
				if s.pid > 0 {
					if before, err = cpuTime(s.pid); err != nil {
						return err
					}
				}
				n, errs, took := load(s.url, w, o.conns, o.duration)
				f := &figs[i]
				f.reqs, f.errors, f.took = f.reqs+n, f.errors+errs, f.took+took
				if s.pid > 0 {
					after, err := cpuTime(s.pid)
					if err != nil {
						return err
					}
					f.cpuTicks += after - before
				}
			}
		}
		fmt.Fprintf(os.Stderr, "%s: latency ...\n", w.name)
		clients := make([]*http.Client, len(sides))
		for i, s := range sides {
			clients[i] = newClient(1)
			latencies(clients[i], s.url, w, 100) // warm-up
		}
		// Alternate in blocks so that drift (frequency scaling, other load) hits every side alike.
		const block = 100
		for done := 0; done < o.latencyReqs; done += block {
			for i, s := range sides {
				figs[i].lat = append(figs[i].lat, latencies(clients[i], s.url, w, block)...)
			}
		}
		all[wi] = figs
	}
	end := make([]memory, len(sides))
	for i, s := range sides {
		if s.pid > 0 {
			if end[i], err = readMemory(s.pid); err != nil {
				return err
			}
		}
	}
	report(os.Stdout, o, sides, all, end)
	return nil
}

func report(out io.Writer, o options, sides []side, all [][]figures, end []memory) {
	fmt.Fprintf(out, "\npass-through vs direct: throughput with %d keep-alive conns, %d rounds x %s per side; latency over 1 conn, %d requests per side\n\n",
		o.conns, o.rounds, o.duration, o.latencyReqs)
	fmt.Fprintf(out, "%-19s %-18s %10s %7s %10s %10s %10s %10s %10s %7s\n",
		"workload", "path", "req/s", "ratio", "cpu/req", "p50", "+p50", "p99", "+p99", "errors")
	for wi, w := range workloads {
		figs := all[wi]
		d := &figs[0]
		dp50, dp99 := percentile(d.lat, 50), percentile(d.lat, 99)
		for i, s := range sides {
			f := &figs[i]
			p50, p99 := percentile(f.lat, 50), percentile(f.lat, 99)
			cpu, add50, add99 := "-", "-", "-"
			if s.pid > 0 {
				cpu, add50, add99 = us(f.cpuPerReq()), us(p50-dp50), us(p99-dp99)
			}
			name := w.name
			if i > 0 {
				name = ""
			}
			fmt.Fprintf(out, "%-19s %-18s %10.0f %6.0f%% %10s %10s %10s %10s %10s %7d\n",
				name, s.name, f.rps(), 100*f.rps()/d.rps(), cpu, us(p50), add50, us(p99), add99, f.errors)
		}
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "memory of each proxy process, MiB: RSS = anonymous (heap, stacks, runtime) + file (its executable's pages)")
	fmt.Fprintf(out, "%-19s %10s %22s %22s %10s\n", "process", "executable", "idle RSS (anon+file)", "end RSS (anon+file)", "peak RSS")
	for i, s := range sides {
		if s.pid == 0 {
			continue
		}
		size := "?"
		if st, err := os.Stat(s.bin); err == nil {
			size = mib(st.Size())
		}
		fmt.Fprintf(out, "%-19s %10s %22s %22s %10s\n", s.name, size, s.idle.split(), end[i].split(), mib(end[i].hwm))
	}
	for i, s := range sides {
		if s.pid > 0 {
			fmt.Fprintf(out, "%s peak RSS (VmHWM): %s MiB\n", s.name, mib(end[i].hwm))
		}
	}
	fmt.Fprintln(out, "targets for ciproxy: cpu/req < 80µs (JSON), < 300µs (20-event SSE); +p50 < 100µs; ratio >= 40%")
}

func us(d time.Duration) string { return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond)) }

// load runs conns workers against base for d and returns completed requests, errors and the time taken.
func load(base string, w workload, conns int, d time.Duration) (int64, int64, time.Duration) {
	client := newClient(conns)
	defer client.CloseIdleConnections()
	var done, failed atomic.Int64
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if err := do(client, base, w); err != nil {
					failed.Add(1)
					continue
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	return done.Load(), failed.Load(), time.Since(start)
}

// latencies times n sequential requests over client's one connection.
func latencies(client *http.Client, base string, w workload, n int) []time.Duration {
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := do(client, base, w); err != nil {
			continue
		}
		out = append(out, time.Since(start))
	}
	return out
}

func newClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		DisableCompression:  true,
	}}
}

// do sends one request and reads the whole answer, as a client would.
func do(client *http.Client, base string, w workload) error {
	req, err := http.NewRequest(http.MethodPost, base+w.path, bytes.NewReader(w.body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+masterKey)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}

// cpuTime returns utime+stime of pid in clock ticks.
func cpuTime(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces; the fields after its ")" are fixed.
	rest := string(b[bytes.LastIndexByte(b, ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return utime + stime, nil
}

// memory is a process's resident set, in bytes: now (rss = anon + file + shmem), and its peak.
type memory struct {
	rss, anon, file, hwm int64
}

func (m memory) split() string {
	return fmt.Sprintf("%s (%s+%s)", mib(m.rss), mib(m.anon), mib(m.file))
}

func mib(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

// readMemory reads VmRSS, RssAnon, RssFile and VmHWM of pid.
func readMemory(pid int) (memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, err
	}
	var m memory
	fields := map[string]*int64{"VmRSS:": &m.rss, "RssAnon:": &m.anon, "RssFile:": &m.file, "VmHWM:": &m.hwm}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, "\t")
		dst := fields[k]
		if !ok || dst == nil {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("%s of %d: %w", k, pid, err)
		}
		*dst = kb << 10
		delete(fields, k)
	}
	if len(fields) > 0 {
		return memory{}, fmt.Errorf("/proc/%d/status: no %d of VmRSS, RssAnon, RssFile, VmHWM", pid, len(fields))
	}
	return m, nil
}

// startProxy writes a config pointing at upstream, starts bin and waits until it is ready.
func startProxy(bin, dir, upstream string) (*exec.Cmd, string, error) {
	// Interception is off (no callbacks): this measures pass-through. The e2b tool only keeps the
	// proxy from checking for a local sandbox; nothing calls it. The state is in a data directory of
	// its own, not the host's.
	cfg := fmt.Sprintf(`model_list:
  - model_name: bench
    litellm_params: {model: openai/bench-upstream, api_base: %s/v1, api_key: sk-bench-upstream}
sandbox_tools:
  - sandbox_tool_name: unused
    litellm_params: {sandbox_provider: e2b, api_key: e2b-unused, api_base: "http://127.0.0.1:9"}
general_settings:
  master_key: %s
  data_dir: %s
`, upstream, masterKey, filepath.Join(dir, "state"))
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, "", err
	}
	return startChild(exec.Command(bin, "--config", path, "--host", "127.0.0.1", "--data-dir", filepath.Join(dir, "data")), dir, upstream)
}

// startChild starts cmd with "--port P" (or, for the bare proxy, the address and upstream)
// appended, its output in a log file, and waits until it answers /readyz.
func startChild(cmd *exec.Cmd, dir, upstream string) (*exec.Cmd, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	logFile, err := os.CreateTemp(dir, "child-*.log")
	if err != nil {
		return nil, "", err
	}
	if len(cmd.Args) > 1 && cmd.Args[1] == "serve-bare" {
		cmd.Args = append(cmd.Args, "127.0.0.1:"+strconv.Itoa(port), upstream)
	} else {
		cmd.Args = append(cmd.Args, "--port", strconv.Itoa(port))
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile // the access log is part of the cost measured
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return cmd, url, nil
			}
		}
		select {
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			log, _ := os.ReadFile(logFile.Name())
			return nil, "", fmt.Errorf("the proxy did not become ready: %s", log)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop ends a child process gracefully.
func stop(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(os.Interrupt)
	_ = cmd.Wait()
}

// serveBare is the comparison floor: httputil.ReverseProxy with nothing else (no routing, auth,
// body read, log or metrics). /readyz is answered by the upstream through it.
func serveBare(addr, upstream string) error {
	u, err := url.Parse(upstream)
	if err != nil {
		return err
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
		// As many idle upstream connections as the load uses, as ciproxy's transport keeps.
		Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 256},
	}
	srv := &http.Server{Addr: addr, Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}
