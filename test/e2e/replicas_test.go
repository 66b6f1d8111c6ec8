package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/redisserver"
	"github.com/ciproxy/ciproxy/internal/testutil/streamcheck"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// Several replicas, one service. Three processes of the real binary share one real redis-server;
// the client sends each request to the next replica in turn. Per sandbox backend: a conversation
// moves across replicas by previous_response_id and by container id, streams through a forwarded
// request, and its files go in on one replica, are used on another and come out of a third; then
// one replica is killed (kill -9) under load, Redis restarts, and at the end nothing is left: no
// sandbox in the engine or in the local work_dir, no Redis key without its TTL, and no failed request that should have
// succeeded. The orphan sweep must have found the sandboxes whose records Redis lost, on each
// engine.

const (
	replicaKey    = "sk-replicas-master"
	replicaSecret = "replicas-share-this-secret"
	// replicaIdle is the containers' idle timeout: short, so that the janitors reap within the test.
	replicaIdle = 4 * time.Second
)

func TestReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("three proxies and a redis-server: not in -short")
	}
	for _, tool := range sandboxTools {
		t.Run(tool, func(t *testing.T) { testReplicas(t, tool) })
	}
}

// cluster is the replicas of one deployment and the client's round robin over them.
type cluster struct {
	t    *testing.T
	cfg  string
	args []string
	env  []string

	mu       sync.Mutex
	reps     []*proxy
	dead     []bool   // the client's view: a replica it could not reach is out of its rotation
	replaced []*proxy // replicas restarted since, with their logs
	next     int
}

// newCluster starts n replicas of cfg with the command-line arguments args and env added to the
// environment.
func newCluster(t *testing.T, cfg string, n int, env []string, args ...string) *cluster {
	c := &cluster{t: t, cfg: cfg, args: args, env: env}
	for range n {
		c.reps = append(c.reps, startProxyArgs(t, cfg, args, env...))
		c.dead = append(c.dead, false)
	}
	return c
}

// pick returns the next replica in the client's rotation.
func (c *cluster) pick() (int, *proxy) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for range c.reps {
		i := c.next % len(c.reps)
		c.next++
		if !c.dead[i] {
			return i, c.reps[i]
		}
	}
	c.t.Fatal("no replica is left")
	return 0, nil
}

func (c *cluster) markDead(i int) {
	c.mu.Lock()
	c.dead[i] = true
	c.mu.Unlock()
}

func (c *cluster) isDead(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead[i]
}

// restart replaces replica i by a new process with the same configuration.
func (c *cluster) restart(i int) {
	p := startProxyArgs(c.t, c.cfg, c.args, c.env...)
	c.mu.Lock()
	c.replaced = append(c.replaced, c.reps[i])
	c.reps[i], c.dead[i] = p, false
	c.mu.Unlock()
}

// kill ends the process with SIGKILL, as a crash does; Stop then does nothing.
func (p *proxy) kill() {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
	})
}

// replicaYAML is the configuration of every replica: the e2e setup, the shared secret, a short
// idle timeout and the Redis server.
func replicaYAML(s setup, redisURL string) string {
	cfg := s.yaml()
	cfg = strings.Replace(cfg, "code_interpreter_interception_params:\n", fmt.Sprintf("code_interpreter_interception_params:\n    container_idle_timeout: %s\n", replicaIdle), 1)
	// The load starts containers faster than they idle out: room above the default quotas.
	cfg += "  max_containers: 512\n  max_containers_per_key: 512\n  container_create_burst: 1000\n"
	return cfg + "  container_secret: " + replicaSecret + "\nrouter_settings:\n  redis_url: " + redisURL + "\n"
}

// answer is what a test reads of one Responses request.
type answer struct {
	status    int
	body      []byte
	id        string
	container string
	logs      string
	err       error // the request did not get an answer (transport error)
}

func ciRequest(code, container, previous string, stream bool) []byte {
	var c any = map[string]any{"type": "auto"}
	if container != "" {
		c = container
	}
	body := map[string]any{
		"model": clientModel, "input": code,
		"tools":   []any{map[string]any{"type": "code_interpreter", "container": c}},
		"include": []string{"code_interpreter_call.outputs"},
	}
	if previous != "" {
		body["previous_response_id"] = previous
	}
	if stream {
		body["stream"] = true
	}
	b, _ := json.Marshal(body)
	return b
}

// send posts body to path on p and reads the answer, without failing the test on a transport
// error (the load phase expects some).
func send(ctx context.Context, p *proxy, method, path, contentType string, body []byte) answer {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.URL+path, rd)
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+replicaKey)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, body: b, err: err}
	if resp.StatusCode == http.StatusOK && gjson.ValidBytes(b) {
		a.id = gjson.GetBytes(b, "id").String()
		gjson.GetBytes(b, "output").ForEach(func(_, it gjson.Result) bool {
			if it.Get("type").String() == "code_interpreter_call" {
				a.container = it.Get("container_id").String()
				a.logs = it.Get("outputs.0.logs").String()
			}
			return true
		})
	}
	return a
}

// run sends code through the code interpreter on p and requires a completed answer.
func (c *cluster) run(t *testing.T, p *proxy, code, container, previous string) answer {
	t.Helper()
	a := send(ctx(t, 60*time.Second), p, http.MethodPost, "/v1/responses", "application/json", ciRequest(code, container, previous, false))
	if a.err != nil || a.status != http.StatusOK || a.container == "" {
		t.Fatalf("%q on %s = %d %v %.400s", code, p.Addr, a.status, a.err, a.body)
	}
	return a
}

func testReplicas(t *testing.T, tool string) {
	rs := redisserver.Start(t)
	eng := newEngine(t, tool)
	up := upstreamtest.New(t)
	up.Script(runUserCode)
	work := workDir(t)
	s := setup{Upstream: up.URL(), MasterKey: replicaKey, Tool: tool, WorkDir: work}
	var env []string
	if eng != nil {
		env = eng.Configure(&s)
	}
	c := newCluster(t, replicaYAML(s, rs.URL()), 3, env, "--sweep-interval", "500ms")
	r := c.reps

	// A conversation across the replicas: created on the first, continued by previous_response_id
	// on the second and by container id on the third, all in one kernel.
	first := c.run(t, r[0], "x = 41\nprint('set')", "", "")
	if first.logs != "set\n" {
		t.Fatalf("first turn logs %q", first.logs)
	}
	second := c.run(t, r[1], "print(x + 1)", "", first.id)
	if second.logs != "42\n" || second.container != first.container {
		t.Errorf("second turn on another replica: logs %q in %s; want 42 in %s", second.logs, second.container, first.container)
	}
	third := c.run(t, r[2], "print(x)", first.container, "")
	if third.logs != "41\n" || third.container != first.container {
		t.Errorf("third turn by container id: logs %q in %s; want 41 in %s", third.logs, third.container, first.container)
	}

	// A remote engine's sandbox is reached by every replica: its container's record names no
	// host, so no request for it is ever forwarded (a local sandbox's names its replica).
	if host := containerHost(t, rs, first.container); (tool == "local") != (host != "") {
		t.Errorf("the %s container's record names host %q", tool, host)
	}

	// Streaming through another replica than the container's.
	st := send(ctx(t, 60*time.Second), r[1], http.MethodPost, "/v1/responses", "application/json", ciRequest("print(x * 2)", first.container, "", true))
	if st.err != nil || st.status != http.StatusOK {
		t.Fatalf("stream = %d %v %.300s", st.status, st.err, st.body)
	}
	rep := streamcheck.Must(t, st.body)
	if rep.Terminal != "response.completed" || !strings.Contains(string(rep.Response), `82\n`) ||
		gjson.GetBytes(rep.Response, `output.#(type=="code_interpreter_call").container_id`).String() != first.container {
		t.Errorf("streamed response = %s %.400s", rep.Terminal, rep.Response)
	}

	// Files: uploaded on one replica, read back on the others, placed in the container through
	// another, used by code on a third; a file the code wrote comes out anywhere.
	fileID := uploadFile(t, r[2], "data.csv", "a,b\n1,2\n")
	if a := send(ctx(t, 30*time.Second), r[0], http.MethodGet, "/v1/files/"+fileID, "", nil); a.status != http.StatusOK || gjson.GetBytes(a.body, "filename").String() != "data.csv" {
		t.Errorf("file metadata on another replica = %d %s", a.status, a.body)
	}
	if a := send(ctx(t, 30*time.Second), r[1], http.MethodGet, "/v1/files/"+fileID+"/content", "", nil); a.status != http.StatusOK || string(a.body) != "a,b\n1,2\n" {
		t.Errorf("file content on a third replica = %d %q", a.status, a.body)
	}
	placed := send(ctx(t, 30*time.Second), r[1], http.MethodPost, "/v1/containers/"+first.container+"/files", "application/json", []byte(`{"file_id":"`+fileID+`"}`))
	if placed.status != http.StatusOK || gjson.GetBytes(placed.body, "path").String() != "/mnt/data/data.csv" {
		t.Fatalf("placing the file in the container through another replica = %d %s", placed.status, placed.body)
	}
	used := c.run(t, r[2], "print(open('/mnt/data/data.csv').read().count(','))", first.container, "")
	if used.logs != "2\n" {
		t.Errorf("code reading the placed file printed %q", used.logs)
	}
	list := send(ctx(t, 30*time.Second), r[0], http.MethodGet, "/v1/containers/"+first.container+"/files", "", nil)
	cfileID := gjson.GetBytes(list.body, `data.#(path=="/mnt/data/data.csv").id`).String()
	if list.status != http.StatusOK || cfileID != gjson.GetBytes(placed.body, "id").String() {
		t.Fatalf("container files on another replica = %d %s", list.status, list.body)
	}
	if a := send(ctx(t, 30*time.Second), r[0], http.MethodGet, "/v1/containers/"+first.container+"/files/"+cfileID+"/content", "", nil); a.status != http.StatusOK || string(a.body) != "a,b\n1,2\n" {
		t.Errorf("container file content on a third replica = %d %q", a.status, a.body)
	}
	// A file the code writes becomes a container file, listed and downloaded anywhere.
	c.run(t, r[1], "_ = open('/mnt/data/out.txt', 'w').write('written in the container')\nprint('w')", first.container, "")
	list = send(ctx(t, 30*time.Second), r[2], http.MethodGet, "/v1/containers/"+first.container+"/files", "", nil)
	outID := gjson.GetBytes(list.body, `data.#(path=="/mnt/data/out.txt").id`).String()
	if list.status != http.StatusOK || outID == "" {
		t.Fatalf("the code's file listed on another replica = %d %s", list.status, list.body)
	}
	if a := send(ctx(t, 30*time.Second), r[0], http.MethodGet, "/v1/containers/"+first.container+"/files/"+outID+"/content", "", nil); a.status != http.StatusOK || string(a.body) != "written in the container" {
		t.Errorf("the code's file downloaded on a third replica = %d %q", a.status, a.body)
	}
	if a := send(ctx(t, 30*time.Second), r[2], http.MethodGet, "/v1/containers/"+first.container, "", nil); a.status != http.StatusOK || gjson.GetBytes(a.body, "status").String() != "running" {
		t.Errorf("the container on another replica = %d %s", a.status, a.body)
	}
	if a := send(ctx(t, 30*time.Second), r[0], http.MethodGet, "/v1/containers?limit=100", "", nil); !strings.Contains(string(a.body), first.container) {
		t.Errorf("container list = %d %s; want %s", a.status, a.body, first.container)
	}

	// Load, and one replica killed in the middle of it.
	stats := loadWithKill(t, c, tool, 2)

	// Redis restarts, empty: what needs state fails meanwhile, and then everything works again.
	rs.Restart()
	for i, p := range c.reps {
		if c.isDead(i) {
			continue
		}
		testutil.Eventually(t, "replica "+p.Addr+" ready again", func() bool {
			a := send(t.Context(), p, http.MethodGet, "/readyz", "", nil)
			return a.status == http.StatusOK && !strings.Contains(string(a.body), "degraded")
		})
	}
	_, p0 := c.pick()
	again := c.run(t, p0, "y = 7\nprint('again')", "", "")
	_, p1 := c.pick()
	if a := c.run(t, p1, "print(y * 6)", "", again.id); a.logs != "42\n" {
		t.Errorf("a conversation after the Redis restart printed %q", a.logs)
	}
	// A response from before the restart is forgotten: an OpenAI-shaped client error, not a hang
	// or a 5xx.
	_, p2 := c.pick()
	if a := send(ctx(t, 30*time.Second), p2, http.MethodPost, "/v1/responses", "application/json", ciRequest("print(1)", "", first.id, false)); a.status < 400 || a.status >= 500 {
		t.Errorf("continuing a response forgotten with Redis = %d %.300s; want a 4xx", a.status, a.body)
	}

	// The killed replica comes back (as an orchestrator restarts it): it sweeps what its
	// predecessor left in the shared work_dir.
	c.restart(2)

	// Leak accounting. Every container expires after replicaIdle and is reaped by its janitor; the
	// engine's sandboxes whose records Redis lost are orphans, swept by one replica.
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range c.reps {
				dumpSandboxState(t, p)
			}
		}
	})
	if eng != nil {
		testutil.Eventually(t, "every "+tool+" sandbox deleted", func() bool { return eng.Live() == 0 })
	}
	for _, p := range c.reps {
		testutil.Eventually(t, "replica "+p.Addr+" holds no sandbox", func() bool {
			a := send(t.Context(), p, http.MethodGet, "/metrics", "", nil)
			return a.status == http.StatusOK && strings.Contains(string(a.body), "\nciproxy_sandbox_containers 0\n")
		})
	}
	for _, p := range c.reps {
		p.Stop()
	}
	checkNoLeftovers(t, work)
	if procs := processesUnder(work); len(procs) > 0 {
		t.Errorf("sandbox processes left after every replica stopped: %v", procs)
	}
	checkRedisKeys(t, rs)
	if eng != nil {
		// The sandboxes whose records Redis lost can only have been found by the orphan sweep.
		orphans := 0
		for _, p := range append(c.reps, c.replaced...) {
			for _, line := range strings.Split(p.Log(), "\n") {
				if strings.Contains(line, "orphan sandbox deleted") && strings.Contains(line, `"tool":"`+tool+`"`) {
					orphans++
				}
			}
		}
		if orphans == 0 {
			t.Error("no orphan sandbox was swept, though Redis forgot live containers")
		}
		t.Logf("%s: %d orphan sandboxes swept", tool, orphans)
	}
	t.Logf("%s: load: %d requests, %d succeeded, %d expected failures (on or hosted by the killed replica)",
		tool, stats.sent.Load(), stats.ok.Load(), stats.expected.Load())
}

// loadStats counts the requests of the load phase.
type loadStats struct {
	sent, ok, expected atomic.Int64
}

// loadWithKill runs conversations of two turns on successive replicas, and plain pass-through
// requests, from several clients, and kills replica victim once a third of the requests are done.
// A request may fail only when it went to the victim once it was killed, or (local) when its
// container lived in the victim; every other one must succeed.
func loadWithKill(t *testing.T, c *cluster, tool string, victim int) *loadStats {
	const (
		clients       = 4
		conversations = 12 // per client
	)
	var stats loadStats
	var killOnce sync.Once
	var killed atomic.Bool
	killAt := int64(clients * conversations) // a third of the requests: each conversation makes three
	var wg sync.WaitGroup
	unexpected := make(chan string, clients*conversations*3)
	for w := range clients {
		wg.Go(func() {
			for n := range conversations {
				if stats.sent.Load() >= killAt {
					killOnce.Do(func() {
						killed.Store(true) // before the kill: a request failing from now on may be its victim
						c.reps[victim].kill()
					})
				}
				v := w*1000 + n
				// Turn one: a new container on whichever replica comes next.
				i1, p1 := c.pick()
				a1 := send(t.Context(), p1, http.MethodPost, "/v1/responses", "application/json", ciRequest(fmt.Sprintf("v = %d\nprint('ok')", v), "", "", false))
				stats.sent.Add(1)
				if a1.err != nil || a1.status != http.StatusOK || a1.logs != "ok\n" {
					if i1 == victim && killed.Load() {
						stats.expected.Add(1)
						c.markDead(i1)
						continue
					}
					unexpected <- fmt.Sprintf("turn 1 on replica %d: %d %v logs %q %.300s", i1, a1.status, a1.err, a1.logs, gjson.GetBytes(a1.body, "output").Raw)
					continue
				}
				stats.ok.Add(1)
				// Turn two, on the next replica, by previous_response_id: the same kernel.
				i2, p2 := c.pick()
				a2 := send(t.Context(), p2, http.MethodPost, "/v1/responses", "application/json", ciRequest("print(v)", "", a1.id, false))
				stats.sent.Add(1)
				switch {
				case a2.err == nil && a2.status == http.StatusOK && a2.logs == fmt.Sprintf("%d\n", v):
					stats.ok.Add(1)
				case i2 == victim && killed.Load():
					stats.expected.Add(1)
					c.markDead(i2)
				case tool == "local" && i1 == victim && killed.Load():
					// Its kernel died with the victim: the conversation goes on in a new container.
					stats.expected.Add(1)
				default:
					unexpected <- fmt.Sprintf("turn 2 on replica %d (turn 1 on %d): %d %v logs %q %.300s", i2, i1, a2.status, a2.err, a2.logs, a2.body)
				}
				// A pass-through request between the conversations.
				i3, p3 := c.pick()
				plain, _ := json.Marshal(map[string]any{"model": clientModel, "input": "hello"})
				a3 := send(t.Context(), p3, http.MethodPost, "/v1/responses", "application/json", plain)
				stats.sent.Add(1)
				switch {
				case a3.err == nil && a3.status == http.StatusOK && strings.Contains(string(a3.body), "plain answer"):
					stats.ok.Add(1)
				case i3 == victim && killed.Load():
					stats.expected.Add(1)
					c.markDead(i3)
				default:
					unexpected <- fmt.Sprintf("pass-through on replica %d: %d %v %.300s", i3, a3.status, a3.err, a3.body)
				}
			}
		})
	}
	wg.Wait()
	close(unexpected)
	for u := range unexpected {
		t.Errorf("a request that should have succeeded failed: %s", u)
	}
	if !killed.Load() {
		t.Fatal("the victim was never killed: the test proves nothing")
	}
	if stats.ok.Load() < clients*conversations {
		t.Errorf("only %d of %d requests succeeded", stats.ok.Load(), stats.sent.Load())
	}
	c.markDead(victim)
	return &stats
}

func uploadFile(t *testing.T, p *proxy, name, content string) string {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "user_data")
	fw, _ := mw.CreateFormFile("file", name)
	_, _ = io.WriteString(fw, content)
	_ = mw.Close()
	a := send(ctx(t, 30*time.Second), p, http.MethodPost, "/v1/files", mw.FormDataContentType(), body.Bytes())
	id := gjson.GetBytes(a.body, "id").String()
	if a.status != http.StatusOK || !strings.HasPrefix(id, "file-") {
		t.Fatalf("upload = %d %s", a.status, a.body)
	}
	return id
}

// processesUnder lists the processes whose command line names dir.
func processesUnder(dir string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err == nil && bytes.Contains(b, []byte(dir)) {
			out = append(out, f+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

// checkRedisKeys lists every key left in Redis once every replica has stopped: each must expire
// (a TTL, and none longer than the longest-lived object, a day), except the keys of the Files API
// files the test uploaded (which never expire unless asked to); no replica lease may be left.
func checkRedisKeys(t *testing.T, rs *redisserver.Server) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rdb.Close()
	c := context.Background()
	keys, err := rdb.Keys(c, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) == 0 {
		t.Fatal("no key in Redis at all: the replicas did not use it")
	}
	t.Logf("%d keys left in Redis, each with its TTL", len(keys))
	for _, k := range keys {
		ttl, err := rdb.PTTL(c, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.HasPrefix(k, "ciproxy:claim:peer:"):
			t.Errorf("a replica's lease outlived every replica: %s (ttl %s)", k, ttl)
		case ttl > 0 && ttl <= 24*time.Hour+time.Minute:
		case ttl < 0 && isFileKey(k):
		case k == "ciproxy:secret": // the secret the replicas agreed on outlives them by design
		default:
			t.Errorf("key %s has ttl %s; want it to expire within a day", k, ttl)
		}
	}
}

// containerHost is the host in id's record in Redis: the replica that holds its sandbox, "" when
// any replica reaches it.
func containerHost(t *testing.T, rs *redisserver.Server, id string) string {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rdb.Close()
	rest, err := rdb.HGet(context.Background(), "ciproxy:cntr:"+id, "r").Result()
	if err != nil {
		t.Fatalf("the record of %s in Redis: %v", id, err)
	}
	return gjson.Get(rest, "host").String()
}

func isFileKey(k string) bool {
	for _, p := range []string{"ciproxy:file:", "ciproxy:blob:"} {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return strings.HasPrefix(k, "ciproxy:owner:") && strings.Contains(k, ":files")
}

// dumpSandboxState logs what a replica says of its sandboxes (its sandbox metrics, and its log's
// warnings and errors and the lines that name a container), for a leak check that failed.
func dumpSandboxState(t *testing.T, p *proxy) {
	t.Helper()
	var b strings.Builder
	// Not t.Context(): this runs in a Cleanup, after the test's context is cancelled.
	mctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if a := send(mctx, p, http.MethodGet, "/metrics", "", nil); a.status != http.StatusOK {
		fmt.Fprintf(&b, "metrics: %d %v\n", a.status, a.err)
	} else {
		for _, line := range strings.Split(string(a.body), "\n") {
			if strings.HasPrefix(line, "ciproxy_sandbox") {
				b.WriteString(line + "\n")
			}
		}
	}
	for _, line := range strings.Split(p.log.String(), "\n") {
		if strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`) || strings.Contains(line, `"container":`) {
			b.WriteString(line + "\n")
		}
	}
	t.Logf("replica %s:\n%s", p.Addr, b.String())
}
