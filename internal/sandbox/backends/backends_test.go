package backends

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// needBubblewrap skips when this machine cannot start local sandboxes (CI installs bubblewrap).
func needBubblewrap(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bubblewrap is not installed")
	}
	if err := local.Check(context.Background(), local.Options{}); err != nil {
		t.Skipf("bubblewrap cannot start a sandbox here: %v", err)
	}
}

// parseTools parses a sandbox_tools section with every backend and no environment.
func parseTools(t testing.TB, section string) []config.SandboxTool {
	t.Helper()
	cfg, err := config.ParseWith([]byte("sandbox_tools:\n"+section), "c.yaml", ParseOptions(func(string) (string, bool) { return "", false }))
	if err != nil {
		t.Fatalf("parsing the sandbox tools: %v", err)
	}
	return cfg.SandboxTools
}

func mustBuild(t testing.TB, tools []config.SandboxTool, prev *sandbox.Registry) *sandbox.Registry {
	t.Helper()
	reg, err := Build(context.Background(), tools, prev, nil)
	if err != nil {
		t.Fatalf("Build() error = %v", err)
	}
	return reg
}

func TestBuildErrors(t *testing.T) {
	e2bTool := func(name string) config.SandboxTool {
		return config.SandboxTool{Name: name, Backend: "e2b", Settings: parseTools(t, "  - {sandbox_tool_name: x, litellm_params: {sandbox_provider: e2b, api_key: k}}\n")[0].Settings}
	}
	tests := []struct {
		name  string
		tools []config.SandboxTool
		want  string
	}{
		{"settings not decoded", []config.SandboxTool{{Name: "x", Backend: "local"}}, `sandbox tool "x": sandbox_provider "local" has no settings to provision`},
		{"duplicate names", []config.SandboxTool{e2bTool("x"), e2bTool("x")}, `listed twice`},
		{"a local tool that cannot run here", parseTools(t, "  - {sandbox_tool_name: py, litellm_params: {sandbox_provider: local, python: /nonexistent/python3, pool_size: 0}}\n"),
			`sandbox tool "py": cannot run on this host`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg, err := Build(context.Background(), tt.tools, nil, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Build() = %v, %v; want an error containing %q", reg, err, tt.want)
			}
		})
	}
}

func TestBuildEmpty(t *testing.T) {
	reg := mustBuild(t, nil, nil)
	if len(reg.Names()) != 0 {
		t.Errorf("Names() = %v; want none", reg.Names())
	}
}

// An e2b tool whose key names an unset variable stays listed and fails each create clearly.
func TestBuildMissingEnv(t *testing.T) {
	tools := parseTools(t, "  - {sandbox_tool_name: cloud, litellm_params: {sandbox_provider: e2b}}\n")
	reg := mustBuild(t, tools, nil)
	defer reg.Close(context.Background())
	s := newSessions(t, t.TempDir(), func() *sandbox.Registry { return reg })
	_, err := s.Create(context.Background(), "cloud", "", sandbox.CreateOptions{}, time.Minute)
	if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "E2B_API_KEY") {
		t.Errorf("Create() error = %v; want ErrUnavailable naming E2B_API_KEY", err)
	}
}

// Sessions create through the registry a request carries (sandbox.WithRegistry), not the current
// one: a request sees the sandbox tools of the configuration it started with.
func TestSessionsUseTheRequestsRegistry(t *testing.T) {
	current := mustBuild(t, parseTools(t, "  - {sandbox_tool_name: t, litellm_params: {sandbox_provider: e2b, api_key: os.environ/CURRENT_KEY}}\n"), nil)
	defer current.Close(context.Background())
	request := mustBuild(t, parseTools(t, "  - {sandbox_tool_name: t, litellm_params: {sandbox_provider: e2b, api_key: os.environ/REQUEST_KEY}}\n"), nil)
	defer request.Close(context.Background())
	s := newSessions(t, t.TempDir(), func() *sandbox.Registry { return current })

	for _, tc := range []struct {
		name string
		ctx  context.Context
		want string
	}{
		{"without a registry of its own", context.Background(), "CURRENT_KEY"},
		{"with the request's registry", sandbox.WithRegistry(context.Background(), request), "REQUEST_KEY"},
	} {
		_, err := s.Create(tc.ctx, "t", "", sandbox.CreateOptions{}, time.Minute)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Create() error = %v; want the tool that needs %s", tc.name, err, tc.want)
		}
	}
}

// A failed Build closes what it started: the local provider it had made leaves nothing in work_dir.
func TestBuildFailureClosesWhatItStarted(t *testing.T) {
	needBubblewrap(t)
	dir := t.TempDir()
	tools := parseTools(t, "  - {sandbox_tool_name: good, litellm_params: {sandbox_provider: local, pool_size: 1, work_dir: "+dir+"}}\n"+
		"  - {sandbox_tool_name: bad, litellm_params: {sandbox_provider: local, python: /nonexistent/python3, work_dir: "+dir+"}}\n")
	if reg, err := Build(context.Background(), tools, nil, nil); err == nil {
		reg.Close(context.Background())
		t.Fatal("Build() succeeded; want the bad tool to fail it")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("work_dir after a failed Build holds %v; want nothing left", entries)
	}
}

// A reload keeps the provider of an unchanged tool, and a changed tool's old provider serves its
// containers until the last one is deleted.
func TestBuildReload(t *testing.T) {
	needBubblewrap(t)
	ctx := context.Background()
	const py = "  - sandbox_tool_name: py\n    litellm_params: {sandbox_provider: local, pool_size: 0%s}\n"
	const cloud = "  - sandbox_tool_name: cloud\n    litellm_params: {sandbox_provider: e2b, api_key: %s, api_base: \"http://127.0.0.1:1\"}\n"
	r1 := mustBuild(t, parseTools(t, fmt.Sprintf(py, "")+fmt.Sprintf(cloud, "k1")), nil)
	p1, _ := r1.Get("py")
	c1, _ := r1.Get("cloud")

	// The entries moved in the file (other lines, other order): same settings.
	r2 := mustBuild(t, parseTools(t, "\n\n"+fmt.Sprintf(cloud, "k1")+fmt.Sprintf(py, "")), r1)
	if p, _ := r2.Get("py"); p != p1 {
		t.Errorf("unchanged local tool got a new provider; want the previous one kept")
	}
	if p, _ := r2.Get("cloud"); p != c1 {
		t.Errorf("unchanged e2b tool got a new provider; want the previous one kept")
	}
	if err := r1.Retire(ctx, r2); err != nil {
		t.Fatal(err)
	}

	var current = r2
	s := newSessions(t, t.TempDir(), func() *sandbox.Registry { return current })
	c, err := s.Create(ctx, "py", "alice", sandbox.CreateOptions{}, time.Minute)
	if err != nil {
		t.Fatalf("Create() error = %v", err)
	}
	if _, err := c.Run(ctx, "x = 41", sandbox.RunOptions{}); err != nil {
		t.Fatalf("Run() error = %v", err)
	}

	r3 := mustBuild(t, parseTools(t, fmt.Sprintf(py, ", max_processes: 32")+fmt.Sprintf(cloud, "k2")), r2)
	current = r3
	if p, _ := r3.Get("py"); p == p1 {
		t.Fatalf("changed local tool kept its provider; want a new one")
	}
	if p, _ := r3.Get("cloud"); p == c1 {
		t.Errorf("changed e2b key kept its provider; want a new one")
	}
	// Build leaves the old registry alone: it still creates until it is retired.
	if _, err := p1.Create(ctx, sandbox.CreateOptions{}); err != nil {
		t.Fatalf("the old provider stopped before its registry was retired: %v", err)
	}
	if err := r2.Retire(ctx, r3); err != nil {
		t.Fatal(err)
	}
	// The container made before the reload still runs, on the old provider, with its state.
	res, err := c.Run(ctx, "x + 1", sandbox.RunOptions{})
	if err != nil || len(res.Results) != 1 || res.Results[0].Text != "42" {
		t.Fatalf("Run() after reload = %+v, %v; want 42", res, err)
	}
	old := p1.(*local.Provider)
	s.Discard(ctx, c)
	// Retired and unused: closed, so it starts nothing any more (and the sandbox made above is gone).
	if old.Live() != 0 {
		t.Errorf("old provider Live() = %d after the last container; want 0", old.Live())
	}
	if _, err := old.Create(ctx, sandbox.CreateOptions{}); err == nil {
		t.Errorf("retired provider still creates sandboxes; want it closed")
	}
	if err := r3.Close(ctx); err != nil {
		t.Errorf("Close() error = %v", err)
	}
}

// proc is one proxy process's containers.Manager over an embedded store in a data directory; another proc
// on the same directory after the first stopped is that process restarted.
type proc struct {
	*containers.Manager
	st      *embedded.Store
	stopped bool
}

// newSessions starts a proc on dir; it is stopped at the end of the test.
func newSessions(t testing.TB, dir string, reg func() *sandbox.Registry) *proc {
	t.Helper()
	st, err := embedded.Open(embedded.Options{Dir: dir, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	s, err := containers.New(context.Background(), containers.Options{Store: st, Registry: reg, SweepInterval: -1})
	if err != nil {
		_ = st.Close()
		t.Fatal(err)
	}
	p := &proc{Manager: s, st: st}
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop shuts the process down gracefully: the manager first, then the store.
func (p *proc) stop(t testing.TB) {
	t.Helper()
	if p.stopped {
		return
	}
	p.stopped = true
	if err := p.Close(context.Background()); err != nil {
		t.Errorf("Sessions.Close() error = %v", err)
	}
	if err := p.st.Close(); err != nil {
		t.Errorf("store Close() error = %v", err)
	}
}

// restart stops p and starts a new process on dir.
func restart(t testing.TB, p *proc, dir string, reg func() *sandbox.Registry) *proc {
	t.Helper()
	p.stop(t)
	return newSessions(t, dir, reg)
}

// Sessions over the real local backend: state persists across runs, ids are owner-bound, and
// nothing outlives Release of an idle-0 container or Close; after a restart the local container
// is expired (its sandbox died with the process).
func TestSessionsLocal(t *testing.T) {
	needBubblewrap(t)
	ctx := context.Background()
	reg := mustBuild(t, parseTools(t, "  - {sandbox_tool_name: py, litellm_params: {sandbox_provider: local, pool_size: 0}}\n"), nil)
	defer reg.Close(ctx)
	p, _ := reg.Get("py")
	lp := p.(*local.Provider)
	dir := t.TempDir()
	regf := func() *sandbox.Registry { return reg }
	s := newSessions(t, dir, regf)

	c, err := s.Create(ctx, "py", "alice", sandbox.CreateOptions{}, 20*time.Minute)
	if err != nil {
		t.Fatalf("Create() error = %v", err)
	}
	if _, err := c.Run(ctx, "import math\nv = math.sqrt(16)", sandbox.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Release(ctx, c)

	c2, err := s.Open(ctx, c.ID(), "alice")
	if err != nil {
		t.Fatalf("Open() error = %v", err)
	}
	var chunks []string
	res, err := c2.Run(ctx, "print('v is', v)\nv * 2", sandbox.RunOptions{OnMessage: func(m sandbox.Message) {
		if m.Type == sandbox.MessageStdout {
			chunks = append(chunks, m.Text)
		}
	}})
	if err != nil || res.Stdout != "v is 4.0\n" || len(res.Results) != 1 || res.Results[0].Text != "8.0" {
		t.Fatalf("Run() = %+v, %v; want stdout 'v is 4.0' and result 8.0", res, err)
	}
	if strings.Join(chunks, "") != "v is 4.0\n" {
		t.Errorf("OnMessage stdout = %q; want the printed line", chunks)
	}
	if _, err := s.Open(ctx, c.ID(), "mallory"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Open(other owner) error = %v; want ErrNotFound", err)
	}
	s.Release(ctx, c2)

	d, err := s.Create(ctx, "py", "bob", sandbox.CreateOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if lp.Live() != 2 {
		t.Errorf("Live() = %d; want 2", lp.Live())
	}
	s.Release(ctx, d)
	if lp.Live() != 1 {
		t.Errorf("Live() after Release(idle 0) = %d; want 1", lp.Live())
	}

	// A restart: the local sandbox is deleted at shutdown, and its id is expired, not unknown.
	s2 := restart(t, s, dir, regf)
	if lp.Live() != 0 {
		t.Errorf("Live() after Close = %d; want 0", lp.Live())
	}
	if _, err := s2.Open(ctx, c.ID(), "alice"); !errors.Is(err, containers.ErrExpired) {
		t.Errorf("Open() in a new process error = %v; want ErrExpired", err)
	}
	if info, err := s2.Get(ctx, "alice", c.ID()); err != nil || info.Status != containers.StatusExpired {
		t.Errorf("Get() in a new process = %+v, %v; want expired", info, err)
	}
}

// e2bEnv is the e2b emulator (executing through a local kernel) and a registry with one e2b tool
// named "cloud" on it.
type e2bEnv struct {
	srv *e2btest.Server
	reg *sandbox.Registry
}

func newE2BEnv(t testing.TB) *e2bEnv {
	t.Helper()
	ctx := context.Background()
	lp, err := local.New(local.Options{Tool: "exec"})
	if err != nil {
		t.Fatal(err)
	}
	srv := e2btest.New(lp)
	tools := parseTools(t, fmt.Sprintf("  - {sandbox_tool_name: cloud, litellm_params: {sandbox_provider: e2b, api_key: %s, api_base: %q, sandbox_url: %q}}\n",
		srv.APIKey(), srv.URL(), srv.SandboxURL()))
	reg, err := Build(ctx, tools, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = reg.Close(ctx)
		srv.Close()
		_ = lp.Close(ctx)
	})
	return &e2bEnv{srv: srv, reg: reg}
}

func (e *e2bEnv) registry() *sandbox.Registry { return e.reg }

// Sessions over e2b (the emulator, executing through the local kernel): the sandbox outlives the
// proxy process; after a restart the container opens again by its id with its state, and the new
// process deletes it when it expires.
func TestSessionsE2B(t *testing.T) {
	needBubblewrap(t)
	ctx := context.Background()
	e := newE2BEnv(t)
	dir := t.TempDir()
	s1 := newSessions(t, dir, e.registry)

	c, err := s1.Create(ctx, "cloud", "alice", sandbox.CreateOptions{}, 20*time.Minute)
	if err != nil {
		t.Fatalf("Create() error = %v", err)
	}
	if _, err := c.Run(ctx, "n = 6 * 7", sandbox.RunOptions{}); err != nil {
		t.Fatalf("Run() error = %v", err)
	}
	s1.Release(ctx, c)

	s2 := restart(t, s1, dir, e.registry)
	if e.srv.Live() != 1 {
		t.Fatalf("server Live() after the proxy stopped = %d; want the sandbox still running", e.srv.Live())
	}
	c2, err := s2.Open(ctx, c.ID(), "alice")
	if err != nil {
		t.Fatalf("Open() after a restart error = %v", err)
	}
	res, err := c2.Run(ctx, "n", sandbox.RunOptions{})
	if err != nil || len(res.Results) != 1 || res.Results[0].Text != "42" {
		t.Fatalf("Run() after a restart = %+v, %v; want 42: the same kernel", res, err)
	}
	if _, err := s2.Open(ctx, c.ID(), "mallory"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Open(other owner) error = %v; want ErrNotFound", err)
	}
	s2.Release(ctx, c2)
	if err := s2.Delete(ctx, "alice", c.ID()); err != nil {
		t.Fatal(err)
	}
	if e.srv.Live() != 0 {
		t.Errorf("server Live() after Delete = %d; want 0", e.srv.Live())
	}
	// A sandbox that e2b ended meanwhile (its own timeout) is expired, not an error.
	d, err := s2.Create(ctx, "cloud", "alice", sandbox.CreateOptions{}, 20*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s2.Release(ctx, d)
	s3 := restart(t, s2, dir, e.registry)
	e.srv.Advance(time.Hour)
	if _, err := s3.Open(ctx, d.ID(), "alice"); !errors.Is(err, containers.ErrExpired) {
		t.Errorf("Open() of a sandbox e2b ended error = %v; want ErrExpired", err)
	}
}
