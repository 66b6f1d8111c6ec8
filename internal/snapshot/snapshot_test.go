package snapshot_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/backends"
	"github.com/ciproxy/ciproxy/internal/snapshot"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func noEnv(string) (string, bool) { return "", false }

// harness is a Current over a real file, parsed and provisioned by the real backends.
type harness struct {
	t       *testing.T
	path    string
	current *snapshot.Current
	logs    *observer.ObservedLogs
	reloads chan error // OnReload's argument, per call
}

func newHarness(t *testing.T, content string) *harness {
	t.Helper()
	h := &harness{t: t, path: filepath.Join(t.TempDir(), "config.yaml"), reloads: make(chan error, 100)}
	h.write(content)
	core, logs := observer.New(zapcore.DebugLevel)
	h.logs = logs
	cfg, err := config.Load(h.path, backends.ParseOptions(noEnv))
	if err != nil {
		t.Fatalf("config.Load: %v", err)
	}
	h.current, err = snapshot.New(context.Background(), cfg, snapshot.Options{
		Parse:     backends.ParseOptions(noEnv),
		Provision: backends.Build,
		Logger:    zap.New(core),
		OnReload:  func(err error) { h.reloads <- err },
	})
	if err != nil {
		t.Fatalf("snapshot.New: %v", err)
	}
	t.Cleanup(func() {
		if err := h.current.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

// write replaces the file atomically, as editors and Kubernetes do.
func (h *harness) write(content string) {
	h.t.Helper()
	tmp := h.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, h.path); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) reload() error { return h.current.Reload(context.Background()) }

// logged counts the log entries with message msg.
func (h *harness) logged(msg string) int { return h.logs.FilterMessage(msg).Len() }

// version is a configuration whose model names and sandbox tool names all carry its name, so that a
// snapshot can be checked to be all of one version.
func version(name string, models int, e2bBase string) string {
	var b strings.Builder
	b.WriteString("model_list:\n")
	for i := range models {
		fmt.Fprintf(&b, "  - model_name: %s-model-%d\n    litellm_params: {model: openai/x, api_key: sk-1}\n", name, i)
	}
	fmt.Fprintf(&b, `sandbox_tools:
  - sandbox_tool_name: %[1]s-tool
    litellm_params: {sandbox_provider: e2b, api_key: key-%[1]s, api_base: %[2]q}
litellm_settings:
  callbacks: [code_interpreter_interception]
  code_interpreter_interception_params: {sandbox_tool_name: %[1]s-tool}
general_settings: {master_key: sk-master}
`, name, e2bBase)
	return b.String()
}

// consistent reports what is wrong with snap: its models, sandbox tools and registry must all be of
// one version.
func consistent(snap *snapshot.Snapshot) error {
	if snap == nil || snap.Config == nil || snap.Sandboxes == nil {
		return fmt.Errorf("incomplete snapshot %+v", snap)
	}
	v, _, _ := strings.Cut(snap.Config.Interception.SandboxToolName, "-")
	for _, m := range snap.Config.Models {
		if !strings.HasPrefix(m.ModelName, v+"-") {
			return fmt.Errorf("model %q in a snapshot of version %q", m.ModelName, v)
		}
	}
	var tools []string
	for _, t := range snap.Config.SandboxTools {
		tools = append(tools, t.Name)
	}
	if names := snap.Sandboxes.Names(); !slices.Equal(names, tools) || !slices.Equal(names, []string{v + "-tool"}) {
		return fmt.Errorf("version %q: config tools %v, registry tools %v", v, tools, names)
	}
	// What a request's context carries is the same registry.
	ctx := snapshot.NewContext(context.Background(), snap)
	if snapshot.FromContext(ctx) != snap || sandbox.RegistryFrom(ctx) != snap.Sandboxes {
		return errors.New("the request context does not carry the snapshot it was made with")
	}
	return nil
}

// A reload that changes the models and the sandbox tools together is seen all at once or not at all:
// readers that take snapshots while reloads run never see one half-applied.
func TestReloadIsSeenAllAtOnceOrNotAtAll(t *testing.T) {
	a, b := version("alpha", 1, "http://127.0.0.1:1"), version("beta", 3, "http://127.0.0.1:1")
	h := newHarness(t, a)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Value
	var seen sync.Map
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				snap := h.current.Acquire()
				if err := consistent(snap); err != nil {
					bad.CompareAndSwap(nil, err)
				}
				seen.Store(snap, true)
				h.current.Release(snap)
				if err := consistent(h.current.Load()); err != nil {
					bad.CompareAndSwap(nil, err)
				}
			}
		})
	}
	const reloads = 40
	for i := range reloads {
		next := b
		if i%2 == 1 {
			next = a
		}
		h.write(next)
		if err := h.reload(); err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
	}
	close(stop)
	wg.Wait()
	if err, _ := bad.Load().(error); err != nil {
		t.Fatalf("a reader saw an inconsistent snapshot: %v", err)
	}
	n := 0
	seen.Range(func(any, any) bool { n++; return true })
	if n < 2 {
		t.Errorf("readers saw %d snapshots during %d reloads; want them to have seen reloads happen", n, reloads)
	}
	if got := h.logged("config reloaded"); got != reloads {
		t.Errorf("%d \"config reloaded\" lines for %d reloads; want one each", got, reloads)
	}
}

// A reload whose sandbox tool cannot be provisioned keeps the previous snapshot serving, whole.
func TestReloadThatCannotProvisionKeepsThePreviousSnapshot(t *testing.T) {
	h := newHarness(t, version("alpha", 1, "http://127.0.0.1:1"))
	before := h.current.Load()

	broken := `model_list:
  - model_name: beta-model
    litellm_params: {model: openai/x, api_key: sk-1}
sandbox_tools:
  - sandbox_tool_name: beta-tool
    litellm_params: {sandbox_provider: local, python: /nonexistent/python3, pool_size: 0}
`
	h.write(broken)
	err := h.reload()
	if err == nil || !strings.Contains(err.Error(), `sandbox tool "beta-tool": cannot run on this host`) {
		t.Fatalf("Reload() = %v; want the local tool's provisioning error", err)
	}
	if got := <-h.reloads; got == nil {
		t.Error("OnReload(nil) after a failed reload; want its error")
	}
	if h.current.Load() != before {
		t.Fatal("a reload that failed to provision replaced the snapshot")
	}
	if err := consistent(h.current.Load()); err != nil {
		t.Errorf("after the failed reload: %v", err)
	}
	if got := h.logged("config reload failed; keeping the previous config"); got != 1 {
		t.Errorf("%d failure lines; want 1", got)
	}
	// The same bytes again (a spurious event) are not retried or reported again.
	if err := h.reload(); !errors.Is(err, snapshot.ErrUnchanged) {
		t.Errorf("Reload() of the rejected bytes again = %v; want ErrUnchanged", err)
	}
	if got := h.logged("config reload failed; keeping the previous config"); got != 1 {
		t.Errorf("%d failure lines after a spurious event; want still 1", got)
	}

	h.write(version("gamma", 2, "http://127.0.0.1:1"))
	if err := h.reload(); err != nil {
		t.Fatalf("Reload() of a good edit after the failure = %v", err)
	}
	if got := h.current.Load().Config.Models[0].ModelName; got != "gamma-model-0" {
		t.Errorf("model after the good edit = %q; want gamma-model-0", got)
	}
}

func TestReloadOutcomes(t *testing.T) {
	good := version("alpha", 1, "http://127.0.0.1:1")
	h := newHarness(t, good)
	start := h.current.Load()
	if got := h.logged("config warning"); got != 0 {
		t.Errorf("%d warnings logged at start of a file without any; want 0", got)
	}

	t.Run("same bytes do nothing", func(t *testing.T) {
		h.write(good)
		if err := h.reload(); !errors.Is(err, snapshot.ErrUnchanged) {
			t.Errorf("Reload() = %v; want ErrUnchanged", err)
		}
		if h.current.Load() != start || len(h.reloads) != 0 || h.logged("config reloaded") != 0 {
			t.Error("rewriting the same bytes reloaded")
		}
	})
	t.Run("an edit with errors is rejected with its lines", func(t *testing.T) {
		h.write("model_list:\n  - model_name: x\n    litellm_params: {model: openai/x, api_bse: y}\n")
		err := h.reload()
		var errs *config.Errors
		if !errors.As(err, &errs) || len(errs.Problems) != 1 || errs.Problems[0].Line != 3 {
			t.Fatalf("Reload() = %v; want *config.Errors with one problem on line 3", err)
		}
		if got := <-h.reloads; !errors.Is(got, err) {
			t.Errorf("OnReload(%v); want the same error", got)
		}
		if h.current.Load() != start {
			t.Error("a rejected edit replaced the snapshot")
		}
	})
	t.Run("a missing file keeps the snapshot", func(t *testing.T) {
		if err := os.Remove(h.path); err != nil {
			t.Fatal(err)
		}
		if err := h.reload(); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Reload() = %v; want ErrNotExist", err)
		}
		<-h.reloads
		if h.current.Load() != start {
			t.Error("a missing file replaced the snapshot")
		}
	})
	t.Run("a good edit is published and its warnings logged once", func(t *testing.T) {
		h.write(strings.Replace(version("beta", 1, "http://127.0.0.1:1"), "callbacks: [code_interpreter_interception]", "callbacks: [code_interpreter_interception, langfuse]", 1))
		if err := h.reload(); err != nil {
			t.Fatalf("Reload() = %v", err)
		}
		if got := <-h.reloads; got != nil {
			t.Errorf("OnReload(%v); want nil", got)
		}
		snap := h.current.Load()
		if err := consistent(snap); err != nil || snap.Config.Models[0].ModelName != "beta-model-0" {
			t.Errorf("published %+v (%v); want version beta", snap.Config.Models, err)
		}
		if h.logged("config reloaded") != 1 || h.logged("config warning") != 1 {
			t.Errorf("logs = %v; want one reload line and one warning line", h.logs.All())
		}
	})
	for _, e := range h.logs.All() {
		if line := fmt.Sprint(e.Message, e.ContextMap()); strings.Contains(line, "key-") || strings.Contains(line, "sk-") {
			t.Errorf("a log line reveals a key: %s", line)
		}
	}
}

// A reload that changes settings read only at start (the data directory, Redis, the advertised
// address) publishes the rest of the edit and logs one warning naming each of them, for as long as
// the file differs from what the process started with.
func TestReloadWarnsOfStartOnlySettings(t *testing.T) {
	with := func(name, general, router string) string {
		return strings.Replace(version(name, 1, "http://127.0.0.1:1"), "general_settings: {master_key: sk-master}",
			"general_settings: {master_key: sk-master, container_secret: s3cret-s3cret-s3cret"+general+"}\nrouter_settings: {redis_url: \"redis://127.0.0.1:6379\""+router+"}", 1)
	}
	h := newHarness(t, with("alpha", ", data_dir: /var/lib/a", ""))
	const warning = "config reloaded; these settings apply only at the next start"
	settings := func() []string {
		var got []string
		for _, e := range h.logs.FilterMessage(warning).All() {
			for _, f := range e.Context {
				if f.Key == "settings" {
					got = append(got, fmt.Sprint(f.Interface))
				}
			}
		}
		return got
	}

	h.write(with("beta", ", data_dir: /var/lib/b, advertise_url: \"http://10.0.0.2:4000\"", ", redis_db: 3"))
	if err := h.reload(); err != nil {
		t.Fatalf("Reload() = %v", err)
	}
	if snap := h.current.Load(); snap.Config.Models[0].ModelName != "beta-model-0" || snap.Config.General.DataDir != "/var/lib/b" {
		t.Errorf("the rest of the edit was not published: %+v", snap.Config.Models)
	}
	want := "[general_settings.data_dir general_settings.advertise_url router_settings.redis_db]"
	if got := settings(); h.logged("config reloaded") != 1 || len(got) != 1 || got[0] != want {
		t.Errorf("warnings = %v; want one naming %s", got, want)
	}

	// Still not applied on the next reload; back to the start's values, nothing to warn of.
	h.write(with("gamma", ", data_dir: /var/lib/b", ""))
	if err := h.reload(); err != nil {
		t.Fatalf("Reload() = %v", err)
	}
	if got := settings(); len(got) != 2 || got[1] != "[general_settings.data_dir]" {
		t.Errorf("warnings = %v; want a second naming data_dir", got)
	}
	h.write(with("delta", ", data_dir: /var/lib/a", ""))
	if err := h.reload(); err != nil {
		t.Fatalf("Reload() = %v", err)
	}
	if got := settings(); len(got) != 2 {
		t.Errorf("warnings = %v; want none for a file back to the start's settings", got)
	}
}

// e2bControlPlane answers every create as e2b does a bad key (401), counting the keys it was sent: a
// create reaching it proves which provider served it.
// newManager is a containers.Manager over an embedded store in a temporary directory.
func newManager(t *testing.T, opts containers.Options) *containers.Manager {
	t.Helper()
	st, err := embedded.Open(embedded.Options{Dir: t.TempDir(), SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	opts.Store = st
	s, err := containers.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func e2bControlPlane(t *testing.T) (*httptest.Server, func(key string) int) {
	var mu sync.Mutex
	keys := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys[r.Header.Get("X-API-Key")]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"code":401,"message":"Invalid API key"}`))
	}))
	t.Cleanup(srv.Close)
	return srv, func(key string) int { mu.Lock(); defer mu.Unlock(); return keys[key] }
}

// A request keeps the sandbox tools of the snapshot it holds across a reload that replaces them;
// they are retired once the last request holding them is done.
func TestRequestKeepsItsSandboxToolsUntilItIsDone(t *testing.T) {
	srv, hits := e2bControlPlane(t)
	withKey := func(key string) string {
		return strings.Replace(version("alpha", 1, srv.URL), "api_key: key-alpha", "api_key: "+key, 1)
	}
	h := newHarness(t, withKey("old-key"))
	mgr := newManager(t, containers.Options{Registry: func() *sandbox.Registry { return h.current.Load().Sandboxes }, SweepInterval: -1})
	defer mgr.Close(context.Background())
	create := func(snap *snapshot.Snapshot) error {
		_, err := mgr.Create(snapshot.NewContext(context.Background(), snap), "alpha-tool", "alice", sandbox.CreateOptions{}, time.Minute)
		return err
	}

	held := h.current.Acquire()
	h.write(withKey("new-key"))
	if err := h.reload(); err != nil {
		t.Fatal(err)
	}
	current := h.current.Acquire()
	defer h.current.Release(current)
	if current == held {
		t.Fatal("the reload did not publish a new snapshot")
	}

	if err := create(held); err == nil || !strings.Contains(err.Error(), "e2b rejected the API key") || hits("old-key") != 1 {
		t.Errorf("create under the held snapshot = %v (old key used %d times); want it sent with the old key", err, hits("old-key"))
	}
	if err := create(current); err == nil || hits("new-key") != 1 {
		t.Errorf("create under the new snapshot = %v (new key used %d times); want it sent with the new key", err, hits("new-key"))
	}

	h.current.WaitRetired()
	if err := create(held); err == nil || strings.Contains(err.Error(), "being reconfigured") || hits("old-key") != 2 {
		t.Errorf("create under the held snapshot after the reload settled = %v; want its provider still open", err)
	}
	h.current.Release(held)
	h.current.WaitRetired()
	if err := create(held); err == nil || !strings.Contains(err.Error(), "being reconfigured") || hits("old-key") != 2 {
		t.Errorf("create on the retired tool = %v (old key used %d times); want it refused without reaching e2b", err, hits("old-key"))
	}
	if err := create(current); err == nil || strings.Contains(err.Error(), "being reconfigured") || hits("new-key") != 2 {
		t.Errorf("create under the new snapshot after the retirement = %v; want it served by the new provider", err)
	}
}

// A tool an old snapshot shares with a newer one stays open while a request holds the old one, even
// after the newer one is replaced in turn: snapshots are retired oldest first.
func TestHeldSnapshotKeepsAToolAcrossTwoReloads(t *testing.T) {
	srv, hits := e2bControlPlane(t)
	cfg := func(models int, key string) string {
		return strings.Replace(version("alpha", models, srv.URL), "api_key: key-alpha", "api_key: "+key, 1)
	}
	h := newHarness(t, cfg(1, "first-key"))
	mgr := newManager(t, containers.Options{SweepInterval: -1})
	defer mgr.Close(context.Background())
	create := func(snap *snapshot.Snapshot) error {
		_, err := mgr.Create(snapshot.NewContext(context.Background(), snap), "alpha-tool", "", sandbox.CreateOptions{}, time.Minute)
		return err
	}

	held := h.current.Acquire()
	h.write(cfg(2, "first-key")) // the tool is unchanged: this snapshot shares the provider
	mustReload(t, h)
	h.write(cfg(2, "second-key")) // the tool changes: the shared provider leaves the current snapshot
	mustReload(t, h)
	h.current.WaitRetired()
	if err := create(held); err == nil || strings.Contains(err.Error(), "being reconfigured") || hits("first-key") != 1 {
		t.Errorf("create under the held snapshot after two reloads = %v; want it served by its own provider", err)
	}
	h.current.Release(held)
	h.current.WaitRetired()
	if err := create(held); err == nil || !strings.Contains(err.Error(), "being reconfigured") {
		t.Errorf("create under the released snapshot = %v; want its provider retired", err)
	}
}

func mustReload(t *testing.T, h *harness) {
	t.Helper()
	if err := h.reload(); err != nil {
		t.Fatalf("Reload() = %v", err)
	}
}

// Close closes the providers of the current snapshot and of replaced ones that requests still hold.
func TestCloseClosesHeldSnapshots(t *testing.T) {
	h := newHarness(t, version("alpha", 1, "http://127.0.0.1:1"))
	held := h.current.Acquire()
	defer h.current.Release(held)
	h.write(version("beta", 1, "http://127.0.0.1:1"))
	if err := h.reload(); err != nil {
		t.Fatal(err)
	}
	mgr := newManager(t, containers.Options{SweepInterval: -1})
	defer mgr.Close(context.Background())
	if err := h.current.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, snap := range []*snapshot.Snapshot{held, h.current.Load()} {
		tool := snap.Config.SandboxTools[0].Name
		_, err := mgr.Create(snapshot.NewContext(context.Background(), snap), tool, "", sandbox.CreateOptions{}, time.Minute)
		if err == nil || !strings.Contains(err.Error(), "being reconfigured") {
			t.Errorf("create on %s after Close = %v; want its provider closed", tool, err)
		}
	}
}

func TestFixedWithoutFile(t *testing.T) {
	cfg := config.Defaults()
	s := snapshot.Fixed(&snapshot.Snapshot{Config: cfg})
	if s.Load().Config != cfg {
		t.Error("Load() does not return the snapshot given")
	}
	if err := s.Reload(context.Background()); err == nil {
		t.Error("Reload() of a Current without a file succeeded")
	}
	snap := s.Acquire()
	s.Release(snap)
	if snap.Config != cfg {
		t.Error("Acquire() does not return the snapshot given")
	}
	if snapshot.FromContext(context.Background()) != nil {
		t.Error("FromContext() of a bare context is not nil")
	}
}
