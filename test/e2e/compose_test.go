package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// composeBin is the Docker Compose v2 binary that runs docs/compose.yaml for TestCompose, with
// DOCKER_HOST naming the engine's socket (podman's Docker-compatible service under
// scripts/compose-test.sh, which make image-test runs). The image names the file takes from the
// environment (CIPROXY_IMAGE, GO_IMAGE, RUNTIME_IMAGE, REDIS_IMAGE, NGINX_IMAGE) are passed through.
var composeBin = os.Getenv("CIPROXY_E2E_COMPOSE")

// composeProject is the project name the test runs the file under, rather than the file's own
// "ciproxy": a deployment of that name on the same engine is left alone.
const composeProject = "ciproxy-e2e"

// The model the compose file's configuration declares, and the secrets the test gives it.
const (
	composeModel       = "gpt-4.1"
	composeMasterKey   = "sk-compose-master"
	composeUpstreamKey = "sk-compose-upstream"
)

// TestCompose runs docs/compose.yaml as an operator does (three replicas sharing one Redis, nginx
// in front on port 4000, e2b sandboxes), with the model and e2b given by the environment
// variables the file reads: the scripted upstream and the e2b emulator of this process. It drives
// nginx with openai-go (a pass-through request, a streamed one that must arrive live, a code
// interpreter conversation whose turns land on different replicas, a file through the Containers
// API), checks each replica's /readyz, then deletes the containers through the API, stops the
// project (every replica exits 0) and takes it down, leaving no sandbox, container, volume or
// network behind.
func TestCompose(t *testing.T) {
	if composeBin == "" {
		t.Skip("CIPROXY_E2E_COMPOSE is not set: scripts/compose-test.sh (make image-test) runs this test")
	}
	emu, _ := newEmulator(t)
	up := upstreamtest.New(t, upstreamtest.WithAPIKey(composeUpstreamKey))
	// The streamed answer's upstream stops after its first text delta until the client has seen
	// that delta through nginx and the proxy (or streamHold passes): an answer buffered on the
	// way reaches the client only when the upstream is done, too late.
	const streamHold = 20 * time.Second
	seen := make(chan struct{})
	var seenOnce sync.Once
	var heldTooLong bool // guarded by holdMu
	var holdMu sync.Mutex
	up.Script(func(req upstreamtest.Request) upstreamtest.Turn {
		if lastUserText(req) != "stream to me" {
			return runUserCode(req)
		}
		deltas := 0
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("live through nginx")}, TextChunk: 4,
			BeforeEvent: func(ctx context.Context, _ int, typ string) error {
				if typ != "response.output_text.delta" {
					return nil
				}
				if deltas++; deltas != 2 {
					return nil
				}
				select {
				case <-seen:
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(streamHold):
					holdMu.Lock()
					heldTooLong = true
					holdMu.Unlock()
				}
				return nil
			}}
	})

	upURL, err := url.Parse(up.URL())
	if err != nil {
		t.Fatal(err)
	}
	if emu.SandboxURL() != emu.URL() {
		t.Fatalf("the emulator's data plane %s is not its control plane %s: relay both", emu.SandboxURL(), emu.URL())
	}
	host := hostAddress(t)
	e2bURL := "http://" + hostRelay(t, host, strings.TrimPrefix(emu.URL(), "http://"))
	env := []string{
		"CIPROXY_MASTER_KEY=" + composeMasterKey,
		"CIPROXY_CONTAINER_SECRET=" + strings.Repeat("c0ffee", 8),
		"REDIS_PASSWORD=compose-redis-password",
		"OPENAI_API_KEY=" + composeUpstreamKey,
		"OPENAI_API_BASE=http://" + hostRelay(t, host, upURL.Host) + upURL.Path,
		"E2B_API_KEY=" + emu.APIKey(),
		// The emulator's one listener serves e2b's control plane and its data plane, to which, as
		// e2b's edge does, it routes a request by its E2b-Sandbox-Id header when the request's
		// host is an IP address (else by a host name {port}-{id}.{domain}).
		"E2B_API_URL=" + e2bURL,
		"E2B_SANDBOX_URL=" + e2bURL,
	}

	// A run cut short leaves its project behind: start from nothing.
	if out, err := compose(t.Context(), env, "down", "--volumes", "--timeout", "0").CombinedOutput(); err != nil {
		t.Fatalf("docker compose down (before): %v\n%s", err, out)
	}
	stopChecks := runHealthChecks(t)
	t.Cleanup(func() {
		stopChecks()
		// Not the test's context: it has ended when cleanups run.
		c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if t.Failed() {
			logs, _ := compose(c, env, "logs", "--no-color").CombinedOutput()
			t.Logf("docker compose logs:\n%s", logs)
		}
		if out, err := compose(c, env, "down", "--volumes", "--timeout", "10").CombinedOutput(); err != nil {
			t.Errorf("docker compose down: %v\n%s", err, out)
		}
	})
	// What `up --build` does, in two steps, each with its own bound: the build (from the
	// Dockerfile, with the bases GO_IMAGE and RUNTIME_IMAGE name; on 2 cores it took 3 to 4
	// minutes, most of it compiling the proxy and its modules afresh) and the start, which
	// --wait ends when every container runs and every health check passes.
	if out, err := compose(ctx(t, 10*time.Minute), env, "build").CombinedOutput(); err != nil {
		t.Fatalf("docker compose build: %v\n%s", err, out)
	}
	if out, err := compose(ctx(t, 3*time.Minute), env, "up", "--detach", "--wait", "--no-build", "--pull", "never").CombinedOutput(); err != nil {
		logs, _ := compose(t.Context(), env, "logs", "--no-color").CombinedOutput()
		t.Fatalf("docker compose up --wait: %v\n%s\nlogs:\n%s", err, out, logs)
	}

	replicas := projectContainers(t, "proxy")
	if len(replicas) != 3 {
		t.Fatalf("%d proxy containers, want the file's 3 replicas: %v", len(replicas), replicas)
	}
	for _, name := range replicas {
		// The replicas run what the build above tagged, not an image made otherwise.
		if want := os.Getenv("CIPROXY_IMAGE"); want != "" {
			if img := strings.TrimSpace(podmanOut(t, "inspect", "--format", "{{.ImageName}}", name)); img != want {
				t.Errorf("%s runs %s, want CIPROXY_IMAGE=%s, which docker compose build tagged", name, img, want)
			}
		}
		ip := strings.TrimSpace(podmanOut(t, "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", name))
		if r := do(t, http.MethodGet, "http://"+net.JoinHostPort(ip, "4000")+"/readyz", nil); r.Status != http.StatusOK || !bytes.Contains(r.Body, []byte(`"ready"`)) {
			t.Errorf("%s: GET /readyz = %d %s", name, r.Status, r.Body)
		}
	}

	const lb = "http://127.0.0.1:4000"
	client := openai.NewClient(option.WithBaseURL(lb+"/v1/"), option.WithAPIKey(composeMasterKey),
		option.WithMaxRetries(0), option.WithRequestTimeout(90*time.Second))
	// Every request carries an id of its own, which the proxy that serves it logs.
	var ids []string
	reqID := func(name string) option.RequestOption {
		id := "compose-" + name + "-" + newName()
		ids = append(ids, id)
		return option.WithHeader("X-Request-Id", id)
	}

	// Pass-through: no code interpreter, the model's answer as it is, with the upstream's key.
	plain, err := client.Responses.New(ctx(t, time.Minute), responses.ResponseNewParams{Model: composeModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")}}, reqID("plain"))
	if err != nil {
		t.Fatalf("pass-through: %v", err)
	}
	if plain.OutputText() != "plain answer" {
		t.Errorf("pass-through answer %q, want the model's \"plain answer\"", plain.OutputText())
	}

	// A streamed pass-through answer: each event as the upstream sends it.
	stream := client.Responses.NewStreaming(ctx(t, time.Minute), responses.ResponseNewParams{Model: composeModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("stream to me")}}, reqID("stream"))
	var text strings.Builder
	completed := false
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
			seenOnce.Do(func() { close(seen) })
		case "response.completed":
			completed = true
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	holdMu.Lock()
	if heldTooLong {
		t.Errorf("the first text delta did not reach the client through nginx within %s of the upstream sending it: the stream is buffered", streamHold)
	}
	holdMu.Unlock()
	if text.String() != "live through nginx" || !completed {
		t.Errorf("streamed text %q (completed %v), want \"live through nginx\" and response.completed", text.String(), completed)
	}

	// A code interpreter conversation: each turn a new request, which nginx sends to the next
	// replica; the kernel's state must be there whichever serves it.
	turn, err := client.Responses.New(ctx(t, 2*time.Minute), withModel(ciParams("x = 6 * 7\nprint(x)", "")), reqID("turn1"))
	if err != nil {
		t.Fatalf("code interpreter, turn 1: %v", err)
	}
	ciContainer := ciCall(t, turn).ContainerID
	if !strings.Contains(turn.OutputText(), "42") {
		t.Errorf("turn 1 answered %q, want the output 42", turn.OutputText())
	}
	for i, want := range []string{"43", "44", "45"} {
		p := withModel(ciParams(fmt.Sprintf("print(x + %d)", i+1), ciContainer))
		p.PreviousResponseID = openai.String(turn.ID)
		turn, err = client.Responses.New(ctx(t, 2*time.Minute), p, reqID(fmt.Sprintf("turn%d", i+2)))
		if err != nil {
			t.Fatalf("code interpreter, turn %d: %v", i+2, err)
		}
		if got := ciCall(t, turn).ContainerID; got != ciContainer {
			t.Errorf("turn %d ran in container %s, want %s", i+2, got, ciContainer)
		}
		if !strings.Contains(turn.OutputText(), want) {
			t.Errorf("turn %d answered %q, want the output %s (x kept from turn 1)", i+2, turn.OutputText(), want)
		}
	}
	turns := ids[2:]

	// A file through the Containers API, read back, and read by code in that container.
	data := []byte("region,amount\nnorth,3\nsouth,4\n")
	made, err := client.Containers.New(ctx(t, time.Minute), openai.ContainerNewParams{Name: "compose"}, reqID("container"))
	if err != nil {
		t.Fatalf("Containers.New: %v", err)
	}
	f, err := client.Containers.Files.New(ctx(t, time.Minute), made.ID,
		openai.ContainerFileNewParams{File: openai.File(bytes.NewReader(data), "sales.csv", "text/csv")}, reqID("upload"))
	if err != nil {
		t.Fatalf("Containers.Files.New: %v", err)
	}
	content, err := client.Containers.Files.Content.Get(ctx(t, time.Minute), made.ID, f.ID, reqID("download"))
	if err != nil {
		t.Fatalf("Containers.Files.Content.Get: %v", err)
	}
	got, err := io.ReadAll(content.Body)
	content.Body.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("the file read back = %q (%v), want %q", got, err, data)
	}
	read, err := client.Responses.New(ctx(t, 2*time.Minute),
		withModel(ciParams(fmt.Sprintf("print(len(open(%q).read()))", f.Path), made.ID)), reqID("read"))
	if err != nil {
		t.Fatalf("reading the uploaded file in its container: %v", err)
	}
	if want := fmt.Sprint(len(data)); !strings.Contains(read.OutputText(), want) {
		t.Errorf("the code read %q of %s, want its %s bytes", read.OutputText(), f.Path, want)
	}

	for _, id := range []string{ciContainer, made.ID} {
		if err := client.Containers.Delete(ctx(t, time.Minute), id, reqID("delete")); err != nil {
			t.Errorf("Containers.Delete(%s): %v", id, err)
		}
	}
	testutil.Eventually(t, "every e2b sandbox deleted", func() bool { return emu.Live() == 0 })

	// Each request is in exactly one replica's log; the conversation's turns in at least two.
	logs, err := compose(t.Context(), env, "logs", "--no-color", "proxy").Output()
	if err != nil {
		t.Fatalf("docker compose logs: %v", err)
	}
	served := requestReplicas(logs, ids)
	for _, id := range ids {
		if len(served[id]) != 1 {
			t.Errorf("request %s is in the logs of %d replicas %v, want 1", id, len(served[id]), served[id])
		}
	}
	byTurn := map[string]bool{}
	for _, id := range turns {
		for _, r := range served[id] {
			byTurn[r] = true
		}
	}
	if len(byTurn) < 2 {
		t.Errorf("the conversation's %d turns were all served by %v, want at least two replicas", len(turns), byTurn)
	}
	t.Logf("replicas that served each request: %v", served)

	// docker compose stop: SIGTERM; each replica drains and exits 0 with its final log line.
	if out, err := compose(ctx(t, 2*time.Minute), env, "stop").CombinedOutput(); err != nil {
		t.Fatalf("docker compose stop: %v\n%s", err, out)
	}
	for _, name := range replicas {
		if code := strings.TrimSpace(podmanOut(t, "inspect", "--format", "{{.State.ExitCode}}", name)); code != "0" {
			t.Errorf("%s exited with %s after SIGTERM, want 0", name, code)
		}
		log, _ := exec.Command("podman", "logs", name).CombinedOutput()
		if !bytes.Contains(log, []byte(`"msg":"stopped"`)) || bytes.Contains(log, []byte("panic")) {
			t.Errorf("%s: the log lacks the final \"stopped\" line or holds a panic:\n%s", name, log)
		}
	}
	stopChecks()
	if out, err := compose(ctx(t, 2*time.Minute), env, "down", "--volumes").CombinedOutput(); err != nil {
		t.Fatalf("docker compose down --volumes: %v\n%s", err, out)
	}
	label := "label=com.docker.compose.project=" + composeProject
	for _, what := range [][]string{{"ps", "--all"}, {"volume", "ls"}, {"network", "ls"}, {"pod", "ps"}} {
		if left := strings.TrimSpace(podmanOut(t, append(what, "--quiet", "--filter", label)...)); left != "" {
			t.Errorf("podman %s: the project left %s", strings.Join(what, " "), strings.ReplaceAll(left, "\n", " "))
		}
	}
	if n := emu.Live(); n != 0 {
		t.Errorf("%d e2b sandboxes left in the emulator", n)
	}
}

// withModel is p for the compose file's model.
func withModel(p responses.ResponseNewParams) responses.ResponseNewParams {
	p.Model = composeModel
	return p
}

// compose is the docker compose command for docs/compose.yaml under the test's project, with env
// added to the test's environment, killed when c ends.
func compose(c context.Context, env []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(c, composeBin, append([]string{"--file", filepath.Join(repoRoot, "docs", "compose.yaml"), "--project-name", composeProject}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = repoRoot
	return cmd
}

// podmanOut runs podman with args and returns its output, failing the test on an error.
func podmanOut(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("podman", append([]string{"--runtime", "runc"}, args...)...).Output()
	if err != nil {
		t.Fatalf("podman %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// projectContainers names the project's containers of service (all of them for "").
func projectContainers(t *testing.T, service string) []string {
	t.Helper()
	args := []string{"ps", "--all", "--format", "{{.Names}}", "--filter", "label=com.docker.compose.project=" + composeProject}
	if service != "" {
		args = append(args, "--filter", "label=com.docker.compose.service="+service)
	}
	return strings.Fields(podmanOut(t, args...))
}

// runHealthChecks runs the health check of each of the project's containers every second until
// the returned function is called. podman runs them from systemd timers, and this machine (like
// CI's) has no systemd: without this loop no check would ever run, the proxies would wait forever
// for Redis to be healthy (depends_on: condition: service_healthy) and `up --wait` for them. It
// stands in for the timer, more often than the file's intervals so that the start is not
// slowed; a failing check counts against its retries as one from the timer does.
func runHealthChecks(t *testing.T) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Second):
			}
			out, err := exec.Command("podman", "ps", "--quiet", "--filter", "label=com.docker.compose.project="+composeProject).Output()
			if err != nil {
				continue
			}
			for _, id := range strings.Fields(string(out)) {
				// A failing check exits 1 and is recorded in the container's health log; one of a
				// container that has just stopped fails too. Either way there is nothing to do here.
				_ = exec.Command("podman", "--runtime", "runc", "healthcheck", "run", id).Run()
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		<-exited
	}
}

// hostAddress is the address of this host on its default route, which the project's containers
// reach through their network's gateway. Not host.containers.internal (podman's name for that
// gateway): the emulator routes a data-plane request by its headers only when the host it names
// is an IP address.
func hostAddress(t *testing.T) string {
	t.Helper()
	// Connecting a UDP socket sends nothing: it picks the route, and with it the source address.
	c, err := net.Dial("udp4", "203.0.113.1:9")
	if err != nil {
		t.Fatalf("no default route, hence no address of this host for the containers to reach: %v", err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String()
}

// hostRelay makes target, a listener of this process on 127.0.0.1, reachable from the project's
// containers: a TCP relay on host, an address of this host they can reach. It returns the
// relay's address.
func hostRelay(t *testing.T, host, target string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	track := func(c net.Conn, on bool) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			track(in, true)
			track(out, true)
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				// Half-close, so that the other direction can finish its answer.
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			}
			go pipe(out, in)
			go func() {
				pipe(in, out)
				in.Close()
				out.Close()
				track(in, false)
				track(out, false)
			}()
		}
	}()
	return l.Addr().String()
}

// logPrefix is docker compose logs' prefix of a line: the container's service and index.
var logPrefix = regexp.MustCompile(`^(proxy-\d+)\s*\| ?(.*)$`)

// requestReplicas maps each of ids to the replicas ("proxy-1", ...) whose request log line has it.
func requestReplicas(logs []byte, ids []string) map[string][]string {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	seen := map[string]map[string]bool{}
	for line := range strings.SplitSeq(string(logs), "\n") {
		m := logPrefix.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var entry struct {
			Msg       string `json:"msg"`
			RequestID string `json:"request_id"`
		}
		if json.Unmarshal([]byte(m[2]), &entry) != nil || entry.Msg != "request" || !want[entry.RequestID] {
			continue
		}
		if seen[entry.RequestID] == nil {
			seen[entry.RequestID] = map[string]bool{}
		}
		seen[entry.RequestID][m[1]] = true
	}
	out := map[string][]string{}
	for id, replicas := range seen {
		for r := range replicas {
			out[id] = append(out[id], r)
		}
	}
	return out
}
