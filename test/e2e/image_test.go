package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// The container image under test. With CIPROXY_E2E_IMAGE naming an image, every proxy these tests
// start is that image run by podman in the way of running CIPROXY_E2E_MODE names (imageModes:
// the rows of docs/modes.md), with the host's network (the scripted upstream and the e2b emulator
// listen on 127.0.0.1), its configuration directory mounted at /etc/ciproxy and its data
// directory at /var/lib/ciproxy, as docs/modes.md tells operators to run it. scripts/image-test.sh
// (make image-test) runs the tests that apply in each mode.
var testImage = os.Getenv("CIPROXY_E2E_IMAGE")

// imageShare is a directory the containers see at the same path as the host (sandbox work
// directories, the probe binary), set by TestMain when an image is under test.
var imageShare string

// imageMode is one way of running the image.
type imageMode struct {
	// run is what podman run is given besides the mounts every mode has.
	run []string
	// sandbox is added to the local tool's settings.
	sandbox []string
	// isolation is what the proxy's start log must say of the local sandbox.
	isolation []string
	// probes are the local sandbox's isolation tests that must pass (not skip) in this mode, and
	// probeEnv their environment there.
	probes   []string
	probeEnv []string
	// skips are the isolation tests that must skip in this mode: what it does not give.
	skips []string
	// mapped: the container has a user namespace of its own, so its processes run as host uids
	// of the "containers" subordinate range, whatever uid they have inside.
	mapped bool
}

// probesEveryMode hold in every mode: the system call filter, the filesystem view, hostile code,
// the disk, the per-process limits (a fork bomb, a memory bomb), and no CPU burnt between cells
// (by the freezer or by SIGSTOP).
var probesEveryMode = []string{"TestProbeSyscalls", "TestProbeFilesystemView", "TestProbeDeepDirectory", "TestHostileKernel",
	"TestDiskLimit", "TestFallbackLimits", "TestLimits", "TestProbeLeftoverCPU", "TestSandboxesAreSeparate", "TestNoProxyEnvironment"}

// imageModes are the rows of docs/modes.md. Paths in run are relative to the repository root.
func imageModes() map[string]imageMode {
	// bubblewrap mounts a /proc of its own in each sandbox, which the kernel allows in a user
	// namespace only where the container's /proc is not partly masked.
	common := []string{"--security-opt", "seccomp=deploy/seccomp.json", "--security-opt", "unmask=/proc/*", "--security-opt", "no-new-privileges"}
	rootless := imageMode{
		run:       common,
		isolation: []string{`"mode":"non-root"`, `"limits":"rlimit"`, "sandboxes share one host uid"},
		probes:    probesEveryMode,
		// No aggregate memory bound, no bound on socket buffers beyond the per-process ones, no
		// CPU limit, no per-tenant kernel counts.
		skips: []string{"TestProbeMemoryAggregate", "TestProbeSocketFlood", "TestCPULimit", "TestProbeInotifyPerTenant"},
	}
	pod := rootless
	// The pod in a user namespace of its own, as hostUsers: false gives it (the manifest's): its
	// uids are unprivileged host uids. The host's /sys bound read-only, as in the container mode,
	// because the network is the host's here (a pod has its own).
	pod.run = append([]string{"--user", "10001:10001", "--userns", "auto:size=65536", "-v", "/sys:/sys:ro", "--read-only", "--cap-drop", "ALL"}, common...)
	pod.mapped = true
	container := imageMode{
		run: append([]string{"--user", "0:0", "--userns", "auto:size=65536", "--cap-add", "SYS_ADMIN,NET_ADMIN",
			"--annotation", "io.ciproxy.delegate-cgroup=true", "-v", "/sys:/sys:ro", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
			"--cgroupns", "host"}, common...),
		// The sandboxes' uids must be inside the namespace's 65536 (above the image's own users).
		sandbox:   []string{"uid_base: 20480", "uid_count: 40960"},
		isolation: []string{`"mode":"root"`, `"limits":"cgroup1"`, "cgroup v1 (memory, pids, cpu)", "one host uid per sandbox"},
		probeEnv:  []string{"CIPROXY_TEST_UIDS=20480:40960"},
		// Not TestProbeInotifyPerTenant: the kernel charges a user namespace's counts to its
		// creator at every level above, so at the host's level every sandbox of the container
		// counts as the container's owner (docs/modes.md).
		probes: append([]string{"TestProbeMemoryAggregate", "TestProbeSocketFlood", "TestCPULimit", "TestCgroupFilesWritten"}, probesEveryMode...),
		mapped: true,
	}
	if hostCgroup2() {
		// The container's cgroup, handed over by the hook, with the memory, pids and cpu
		// controllers its parents enable for it (runc creating it does so for those the parents
		// have): the v2 mode, which CIPROXY_TEST_CGROUP2 makes the sandbox tests require rather
		// than fall back to another.
		container.isolation = []string{`"mode":"root"`, `"limits":"cgroup2"`, "cgroup v2 (kill, freeze, cpu, memory, pids)", "one host uid per sandbox"}
		container.probeEnv = append(container.probeEnv, "CIPROXY_TEST_CGROUP2=1")
	}
	return map[string]imageMode{
		"rootless": rootless,
		"pod":      pod,
		// Root in a user namespace of its own (65536 uids from /etc/subuid's "containers" range),
		// with the capabilities the fork server keeps, its cgroups handed to that root by the OCI
		// hook (podman delegates none), the host's cgroup tree mounted writable (only what the hook
		// handed over can be written) and, because the network is the host's, its /sys bound
		// read-only (a user namespace cannot mount the sysfs of a network namespace it does not
		// own). --cgroupns host because the tree mounted is the host's: in a cgroup namespace of
		// its own (podman's default on a v2 host) the proxy's /proc/self/cgroup says "0::/", which
		// names no directory of that tree (the proxy then finds no cgroup of its own and falls back
		// to per-process limits). On a hybrid host podman's default is already the host's.
		"container": container,
	}
}

// hostCgroup2 tells whether this host has the unified hierarchy alone at /sys/fs/cgroup.
func hostCgroup2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// currentImageMode is the mode CIPROXY_E2E_MODE names; it fails the test on an unknown one.
func currentImageMode(t *testing.T) imageMode {
	t.Helper()
	name := os.Getenv("CIPROXY_E2E_MODE")
	m, ok := imageModes()[name]
	if !ok {
		t.Fatalf("CIPROXY_E2E_MODE=%q: want one of rootless, pod, container", name)
	}
	return m
}

// imageSandboxSettings are the mode's additions to the local tool's settings (none without an image).
func imageSandboxSettings() []string {
	if testImage == "" {
		return nil
	}
	return imageModes()[os.Getenv("CIPROXY_E2E_MODE")].sandbox
}

// podman returns the podman command line for args: runc, which this host's hybrid cgroups need
// (crun refuses them), and the repository's OCI hooks.
func podman(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	hooks := filepath.Join(imageShare, "hooks")
	if _, err := os.Stat(hooks); err != nil {
		if err := os.MkdirAll(hooks, 0o755); err != nil {
			t.Fatal(err)
		}
		def, err := os.ReadFile(filepath.Join(repoRoot, "deploy/oci-hooks/ciproxy-delegate-cgroup.json"))
		if err != nil {
			t.Fatal(err)
		}
		def = bytes.ReplaceAll(def, []byte("/usr/local/libexec/ciproxy-delegate-cgroup"), []byte(filepath.Join(repoRoot, "deploy/oci-hooks/ciproxy-delegate-cgroup")))
		if err := os.WriteFile(filepath.Join(hooks, "ciproxy-delegate-cgroup.json"), def, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("podman", append([]string{"--runtime", "runc", "--hooks-dir", hooks}, args...)...)
	cmd.Dir = repoRoot
	return cmd
}

// podmanRun is podman run of the image in the current mode, with the limits every mode has.
func podmanRun(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	var nofile syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	run := []string{"run", "--rm", "--name", name, "--network", "host",
		// podman's health check timers need systemd, which this host lacks.
		"--no-healthcheck",
		// Within the hard limits podman itself has (runc refuses to raise them).
		"--ulimit", fmt.Sprintf("nofile=%d:%d", nofile.Max, nofile.Max), "--ulimit", "nproc=16384:16384",
		"-v", imageShare + ":" + imageShare}
	run = append(run, currentImageMode(t).run...)
	t.Cleanup(func() { _ = podman(t, "rm", "--force", "--time", "0", name).Run() })
	return podman(t, append(run, args...)...)
}

// imageCommand is the podman run of the image in place of the binary: config is mounted with its
// directory (so that a rename in it, as the kubelet's ConfigMap update does, reaches the proxy),
// dataDir as the image's volume, handed to the container's user (":U": with --userns=auto each
// container has other host uids, so the next one could not open what the last one wrote). It
// returns the command and the container's name.
func imageCommand(t *testing.T, config, dataDir string, args, env []string) (*exec.Cmd, string) {
	t.Helper()
	// The proxy runs as the image's user, or as root of a user namespace: neither is the host's
	// root, which owns these.
	for _, perm := range []struct {
		path string
		mode os.FileMode
	}{{filepath.Dir(config), 0o755}, {config, 0o644}} {
		if err := os.Chmod(perm.path, perm.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(dataDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dataDir, 0o777); err != nil {
		t.Fatal(err)
	}
	var run []string
	for _, kv := range env {
		run = append(run, "-e", kv)
	}
	run = append(run, "-v", filepath.Dir(config)+":/etc/ciproxy:ro", "-v", dataDir+":/var/lib/ciproxy:U", testImage,
		"--config", "/etc/ciproxy/"+filepath.Base(config), "--host", "127.0.0.1", "--port", "0", "--data-dir", "/var/lib/ciproxy")
	name := "ciproxy-e2e-" + newName()
	return podmanRun(t, name, append(run, args...)...), name
}

// newName is a random container name suffix.
func newName() string {
	b := make([]byte, 6)
	f, err := os.Open("/dev/urandom")
	if err == nil {
		_, _ = io.ReadFull(f, b)
		f.Close()
	}
	return fmt.Sprintf("%x", b)
}

func skipWithoutImage(t *testing.T) {
	t.Helper()
	if testImage == "" {
		t.Skip("CIPROXY_E2E_IMAGE is not set: the image tests run under make image-test")
	}
}

// TestImageHealthAndIsolation: the container answers /healthz and /readyz, and its start log
// says what the local sandbox's isolation is in this mode.
func TestImageHealthAndIsolation(t *testing.T) {
	skipWithoutImage(t)
	t.Parallel()
	mode := currentImageMode(t)
	up := upstreamtest.New(t)
	up.Script(runUserCode)
	p := startProxy(t, setup{Upstream: up.URL(), WorkDir: workDir(t)}.yaml())
	for _, path := range []string{"/healthz", "/readyz"} {
		if r := do(t, http.MethodGet, p.URL+path, nil); r.Status != http.StatusOK {
			t.Errorf("GET %s = %d %s", path, r.Status, r.Body)
		}
	}
	var line string
	for l := range strings.SplitSeq(p.Log(), "\n") {
		if strings.Contains(l, "local sandbox isolation") || strings.Contains(l, "WEAKER ISOLATION") {
			line = l
		}
	}
	for _, want := range mode.isolation {
		if !strings.Contains(line, want) {
			t.Errorf("the isolation the proxy logged lacks %q: %s", want, line)
		}
	}
	if mode.mapped {
		checkMappedUIDs(t)
	}
}

// TestImageDelegatedCgroup, in the container mode on a cgroup v2 host, reads from outside the
// container what the kernel holds once a code interpreter call has run: the container's cgroup
// handed to the root of its user namespace (the hook's work), the proxy moved into its leaf below
// it (which it does only once it may write the cgroup's cgroup.procs), the controllers enabled for
// the sandboxes, and each sandbox's cgroup made by that root with the configured memory.max,
// pids.max and cpu.max and the sandbox's processes in it. On a hybrid host TestCgroupFilesWritten
// reads the v1 files back inside the container (TestImageSandboxProbes).
func TestImageDelegatedCgroup(t *testing.T) {
	skipWithoutImage(t)
	if os.Getenv("CIPROXY_E2E_MODE") != "container" || !hostCgroup2() {
		t.Skip("the container mode on a cgroup v2 host only")
	}
	t.Parallel()
	up := upstreamtest.New(t)
	up.Script(runUserCode)
	p := startProxy(t, setup{Upstream: up.URL(), WorkDir: workDir(t),
		LocalSettings: []string{"memory_limit: 300m", "max_processes: 20", "cpu_limit: 0.5"}}.yaml())
	client := sdk(p, "sk-cgroup")
	r, err := client.Responses.New(ctx(t, 90*time.Second), ciParams("print(6 * 7)", ""))
	if err != nil {
		t.Fatalf("Responses.New: %v; log:\n%s", err, p.Log())
	}
	checkSixTimesSeven(t, r)

	out, err := podman(t, "inspect", "--format", "{{.State.Pid}}", p.Container).Output()
	if err != nil {
		t.Fatalf("podman inspect: %v", err)
	}
	pid := strings.TrimSpace(string(out))
	var inside, root, count int
	if m, err := os.ReadFile("/proc/" + pid + "/uid_map"); err != nil {
		t.Fatal(err)
	} else if _, err := fmt.Sscan(string(m), &inside, &root, &count); err != nil || inside != 0 || root == 0 {
		t.Fatalf("the container's uid_map %q: want its root mapped to a host uid other than 0", m)
	}
	line, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	path, ok := strings.CutPrefix(strings.TrimSpace(string(line)), "0::")
	leaf := "/ciproxy-proxy"
	if !ok || !strings.HasSuffix(path, leaf) {
		t.Fatalf("the proxy's cgroup is %q; want the leaf %s below its container's cgroup", line, leaf)
	}
	own := "/sys/fs/cgroup" + strings.TrimSuffix(path, leaf)
	t.Logf("the container's cgroup %s (its root is host uid %d)", own, root)
	owner := func(path string) int {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return int(fi.Sys().(*syscall.Stat_t).Uid)
	}
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	for _, f := range []string{own, own + "/cgroup.procs", own + "/cgroup.subtree_control"} {
		if u := owner(f); u != root {
			t.Errorf("%s is owned by host uid %d; want %d, the container's root (the hook hands it over)", f, u, root)
		}
	}
	if u := owner(own + "/memory.max"); u != 0 {
		t.Errorf("%s/memory.max is owned by host uid %d: the container's own limit must stay the host's", own, u)
	}
	if got := read(own + "/cgroup.subtree_control"); got != "cpu memory pids" {
		t.Errorf("%s/cgroup.subtree_control = %q; want cpu memory pids", own, got)
	}
	want := map[string]string{"memory.max": "314572800", "pids.max": "23", "cpu.max": "50000 100000"}
	sandboxes, running := 0, 0
	_ = filepath.WalkDir(own, func(dir string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if _, err := os.Stat(dir + "/box"); err != nil || dir == own {
			return nil
		}
		sandboxes++
		if u := owner(dir); u != root {
			t.Errorf("the sandbox cgroup %s is owned by host uid %d; want the container's root, %d", dir, u, root)
		}
		for file, v := range want {
			if got := read(dir + "/" + file); got != v {
				t.Errorf("%s/%s = %q; want %q", dir, file, got, v)
			}
		}
		if read(dir+"/box/cgroup.procs") != "" {
			running++
		}
		t.Logf("%s: memory.max %s, pids.max %s, cpu.max %s, %d processes", strings.TrimPrefix(dir, own+"/"), read(dir+"/memory.max"),
			read(dir+"/pids.max"), read(dir+"/cpu.max"), len(strings.Fields(read(dir+"/box/cgroup.procs"))))
		return filepath.SkipDir
	})
	if sandboxes == 0 || running == 0 {
		t.Errorf("%d sandbox cgroups below %s, %d with processes; want the one that ran the code at least", sandboxes, own, running)
	}
}

// checkMappedUIDs fails the test unless every proxy process of the image on this host runs as a
// host uid of the "containers" subordinate range (scripts/image-test.sh adds it to /etc/subuid):
// the container's own users, root among them, are no user of the host's.
func checkMappedUIDs(t *testing.T) {
	t.Helper()
	var first, count uint64
	b, err := os.ReadFile("/etc/subuid")
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if _, err := fmt.Sscanf(l, "containers:%d:%d", &first, &count); err == nil {
			break
		}
	}
	if count == 0 {
		t.Fatal(`/etc/subuid has no "containers" range`)
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	seen := 0
	for _, dir := range dirs {
		if exe, err := os.Readlink(dir + "/exe"); err != nil || exe != "/usr/local/bin/proxy" {
			continue
		}
		status, err := os.ReadFile(dir + "/status")
		if err != nil {
			continue // gone meanwhile
		}
		var uid uint64
		for l := range strings.SplitSeq(string(status), "\n") {
			if rest, ok := strings.CutPrefix(l, "Uid:"); ok {
				_, _ = fmt.Sscan(rest, &uid)
			}
		}
		seen++
		if uid < first || uid >= first+count {
			t.Errorf("%s runs the image's proxy as host uid %d; want one of the containers range %d-%d", dir, uid, first, first+count-1)
		}
	}
	if seen == 0 {
		t.Error("no process of this host runs the image's /usr/local/bin/proxy")
	}
}

// TestImageReload: an edit of the mounted configuration, written as the kubelet writes a
// ConfigMap's (a new file renamed over the old one), is loaded by the running container.
func TestImageReload(t *testing.T) {
	skipWithoutImage(t)
	t.Parallel()
	up := upstreamtest.New(t)
	up.Script(runUserCode)
	s := setup{Upstream: up.URL(), WorkDir: workDir(t)}
	p := startProxy(t, s.yaml())
	s.ExtraModels = "  - model_name: gpt-reloaded\n    litellm_params:\n      model: openai/other\n      api_base: " + up.URL() + "\n"
	next := p.ConfigPath + ".new"
	if err := os.WriteFile(next, []byte(s.yaml()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, p.ConfigPath); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the reloaded model is listed", func() bool {
		return bytes.Contains(do(t, http.MethodGet, p.URL+"/v1/models", nil).Body, []byte(`"gpt-reloaded"`))
	})
	// The log comes through podman after the new configuration is in use.
	testutil.Eventually(t, "the reload is logged", func() bool { return strings.Contains(p.Log(), "config reloaded") })
}

// TestImageSIGTERM: SIGTERM (what podman stop and the kubelet send) while a code interpreter
// stream waits on the model: past shutdown_grace the stream ends with the error event and
// response.failed, the container exits 0 (checked by Stop), and no sandbox is left.
func TestImageSIGTERM(t *testing.T) {
	skipWithoutImage(t)
	t.Parallel()
	up := upstreamtest.New(t)
	hang := func(ctx context.Context, seq int, _ string) error {
		if seq < 2 {
			return nil
		}
		<-ctx.Done() // mid-stream, until the proxy lets go
		return ctx.Err()
	}
	up.Script(func(req upstreamtest.Request) upstreamtest.Turn {
		if n := len(req.History); n > 0 && itemType(req.History[n-1]) == "function_call_output" {
			return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("never finished")}, BeforeEvent: hang}
		}
		return runUserCode(req)
	})
	wd := workDir(t)
	p := startProxy(t, setup{Upstream: up.URL(), WorkDir: wd}.yaml())
	body := `{"model":"` + clientModel + `","input":"print(6*7)","stream":true,"tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`
	req, err := http.NewRequestWithContext(ctx(t, 2*time.Minute), http.MethodPost, p.URL+"/v1/responses", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rest := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(resp.Body)
		rest <- b
	}()
	if _, err := up.Wait(ctx(t, time.Minute), 2); err != nil {
		t.Fatalf("the code ran but the model was not asked again: %v; log:\n%s", err, p.Log())
	}
	p.Stop()
	stream := string(<-rest)
	var errEvent, failed string
	for line := range strings.SplitSeq(stream, "\n") {
		switch {
		case strings.HasPrefix(line, `data: {"type":"error"`):
			errEvent = line
		case strings.HasPrefix(line, `data: {"type":"response.failed"`):
			failed = line
		}
	}
	if !strings.Contains(errEvent, "shutting down") || !strings.Contains(failed, `"status":"failed"`) || !strings.Contains(failed, "shutting down") {
		t.Errorf("the stream did not end with the error event and response.failed saying the proxy is shutting down:\n%s", stream)
	}
	checkNoLeftovers(t, wd)
}

// TestImageDataVolume: what the proxy keeps (a Files API file) is still there when a new
// container starts on the same data volume.
func TestImageDataVolume(t *testing.T) {
	skipWithoutImage(t)
	t.Parallel()
	up := upstreamtest.New(t)
	up.Script(runUserCode)
	data := filepath.Join(t.TempDir(), "data")
	want := []byte("region,amount\nnorth,3\n")
	// A work dir each: with --userns=auto the second container's root is another host uid.
	first := startProxyData(t, setup{Upstream: up.URL(), WorkDir: workDir(t)}.yaml(), data, nil)
	id := uploadUserData(t, sdk(first, "sk-volume"), "kept.csv", "text/csv", want)
	first.Stop()

	second := startProxyData(t, setup{Upstream: up.URL(), WorkDir: workDir(t)}.yaml(), data, nil)
	client := sdk(second, "sk-volume")
	r, err := client.Files.Content(ctx(t, 30*time.Second), id)
	if err != nil {
		t.Fatalf("the file uploaded before the restart: %v", err)
	}
	defer r.Body.Close()
	if got, _ := io.ReadAll(r.Body); !bytes.Equal(got, want) {
		t.Errorf("the file after the restart = %q, want %q", got, want)
	}
}

// TestImageSandboxProbes runs the local sandbox's isolation tests (probe_test.go, hostile_test.go
// and the limit tests) inside a container of the image, run as the mode runs the proxy, and
// requires the mode's probes to pass, not skip: what holds in each mode is what docs/modes.md says.
func TestImageSandboxProbes(t *testing.T) {
	skipWithoutImage(t)
	t.Parallel()
	mode := currentImageMode(t)
	if only := os.Getenv("CIPROXY_E2E_PROBES"); only != "" {
		// A subset, where each sandbox test is slow (make test-cgroup2's emulated guest): only
		// names of the mode's lists, so that a probe the mode must pass cannot be turned into one
		// it must skip.
		var probes, skips []string
		for name := range strings.SplitSeq(only, ",") {
			switch {
			case slices.Contains(mode.probes, name):
				probes = append(probes, name)
			case slices.Contains(mode.skips, name):
				skips = append(skips, name)
			default:
				t.Fatalf("CIPROXY_E2E_PROBES names %s, which is none of this mode's probes", name)
			}
		}
		mode.probes, mode.skips = probes, skips
	}
	bin := filepath.Join(imageShare, "local.test")
	if prebuilt := os.Getenv("CIPROXY_E2E_SANDBOX_TESTS"); prebuilt != "" {
		// Compiled elsewhere (CGO_ENABLED=0 go test -c ./internal/sandbox/local), for a machine
		// without Go: make test-cgroup2's guest.
		b, err := os.ReadFile(prebuilt)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
	} else {
		build := exec.Command("go", "test", "-c", "-o", bin, "./internal/sandbox/local")
		build.Dir = repoRoot
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building the sandbox tests: %v\n%s", err, out)
		}
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	run := "^(" + strings.Join(append(mode.probes, mode.skips...), "|") + "|TestIsolationMode)$"
	args := []string{"--entrypoint", bin, "-w", "/tmp"}
	if v := os.Getenv("CIPROXY_TEST_START_TIMEOUT"); v != "" {
		// The sandbox tests' own bound on a kernel's start, for an emulated machine
		// (internal/sandbox/local): the container gets what this process was given.
		args = append(args, "-e", "CIPROXY_TEST_START_TIMEOUT="+v)
	}
	for _, kv := range mode.probeEnv {
		args = append(args, "-e", kv)
	}
	cmd := podmanRun(t, "ciproxy-probes-"+newName(), append(args, testImage, "-test.v", "-test.count=1", "-test.run", run)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the sandbox tests failed in the container (%v):\n%s", err, out)
	}
	results := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	result := regexp.MustCompile(`^--- (PASS|SKIP|FAIL): (Test\w+) `)
	for sc.Scan() {
		if m := result.FindStringSubmatch(sc.Text()); m != nil {
			results[m[2]] = m[1]
		}
		if _, host, ok := strings.Cut(sc.Text(), "this host: "); ok {
			t.Logf("in the container: %s", host)
		}
	}
	for _, name := range mode.probes {
		if results[name] != "PASS" {
			t.Errorf("%s: %q in the container, want PASS; output:\n%s", name, results[name], out)
		}
	}
	for _, name := range mode.skips {
		if results[name] != "SKIP" {
			t.Errorf("%s: %q in the container, want SKIP (docs/modes.md says this mode does not give it); output:\n%s", name, results[name], out)
		}
	}
}

// TestSeccompProfile: deploy/seccomp.json, the profile the container and pod modes ship, allows
// what bubblewrap and the fork server need without conditions and never what no part of the
// proxy uses (the local sandbox's own filters refuse these too); the image tests prove it works.
func TestSeccompProfile(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "deploy/seccomp.json"))
	if err != nil {
		t.Fatal(err)
	}
	var profile struct {
		DefaultAction string `json:"defaultAction"`
		Syscalls      []struct {
			Names    []string `json:"names"`
			Action   string   `json:"action"`
			Args     []any    `json:"args"`
			Includes struct {
				Caps   []string `json:"caps"`
				Arches []string `json:"arches"`
			} `json:"includes"`
		} `json:"syscalls"`
	}
	if err := json.Unmarshal(raw, &profile); err != nil {
		t.Fatal(err)
	}
	if profile.DefaultAction != "SCMP_ACT_ERRNO" {
		t.Errorf("defaultAction %q, want SCMP_ACT_ERRNO", profile.DefaultAction)
	}
	allowed := map[string]bool{}     // without a condition
	conditional := map[string]bool{} // on a capability, an architecture or arguments
	for _, s := range profile.Syscalls {
		if s.Action != "SCMP_ACT_ALLOW" {
			continue
		}
		for _, n := range s.Names {
			if len(s.Args) == 0 && len(s.Includes.Caps) == 0 && len(s.Includes.Arches) == 0 {
				allowed[n] = true
			} else {
				conditional[n] = true
			}
		}
	}
	for _, n := range []string{"clone", "clone3", "unshare", "mount", "umount2", "pivot_root", "sethostname", "seccomp", "prctl", "capset", "setuid", "setgid", "pidfd_open"} {
		if !allowed[n] {
			t.Errorf("%s is not allowed: bubblewrap or the fork server needs it", n)
		}
	}
	for _, n := range []string{"bpf", "perf_event_open", "kexec_load", "kexec_file_load", "init_module", "finit_module", "keyctl", "add_key",
		"request_key", "setns", "io_uring_setup", "userfaultfd", "syslog", "open_by_handle_at", "fanotify_init", "quotactl"} {
		if allowed[n] {
			t.Errorf("%s is allowed", n)
		}
		if conditional[n] && n != "open_by_handle_at" {
			t.Errorf("%s is allowed under a condition", n)
		}
	}
}
