package config

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// configWith returns a valid config whose only model is named name and whose master key is secret.
func configWith(name string) []byte {
	return fmt.Appendf(nil, "model_list:\n  - model_name: %s\n    litellm_params: {model: openai/%s, api_key: sk-upstream-secret}\ngeneral_settings:\n  master_key: sk-master-secret\n", name, name)
}

type reloadEvent struct {
	cfg *Config
	err error
}

type watchHarness struct {
	t       *testing.T
	path    string
	store   *Store
	reloads chan reloadEvent
	logs    *observer.ObservedLogs
	cancel  context.CancelFunc
	done    chan error
	stopped sync.Once
}

// startWatch watches path (which must exist) and waits until the watch is in place.
func startWatch(t *testing.T, path string) *watchHarness {
	t.Helper()
	cfg, err := Load(path)
	if err != nil {
		t.Fatalf("Load(%s): %v", path, err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	ctx, cancel := context.WithCancel(context.Background())
	h := &watchHarness{
		t: t, path: path, store: NewStore(cfg), logs: logs, cancel: cancel,
		reloads: make(chan reloadEvent, 16),
		done:    make(chan error, 1),
	}
	go func() {
		h.done <- Watch(ctx, path, h.store, WatchOptions{
			Debounce: 10 * time.Millisecond,
			Logger:   zap.New(core),
			OnReload: func(c *Config, err error) { h.reloads <- reloadEvent{c, err} },
		})
	}()
	t.Cleanup(h.stop)
	h.waitLog("watching config")
	return h
}

// stop cancels the watch and waits for Watch to return; it checks the log for secrets once.
func (h *watchHarness) stop() { h.stopped.Do(h.stopOnce) }

func (h *watchHarness) stopOnce() {
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Watch returned %v; want nil after cancel", err)
		}
	case <-time.After(5 * time.Second):
		h.t.Fatal("Watch did not return after its context was cancelled")
	}
	for _, e := range h.logs.All() {
		line := fmt.Sprint(e.Message, e.ContextMap())
		if strings.Contains(line, "secret") {
			h.t.Errorf("a log line reveals a secret: %s", line)
		}
	}
}

// next waits for the next OnReload call.
func (h *watchHarness) next() reloadEvent {
	h.t.Helper()
	select {
	case ev := <-h.reloads:
		return ev
	case <-time.After(5 * time.Second):
		h.t.Fatal("no reload within 5s")
		return reloadEvent{}
	}
}

// waitLogN waits until a log entry with message msg has been written n times in all.
func (h *watchHarness) waitLogN(msg string, n int) {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for h.logs.FilterMessage(msg).Len() < n {
		if time.Now().After(deadline) {
			h.t.Fatalf("no log %q within 5s; have %v", msg, h.logs.All())
		}
		time.Sleep(time.Millisecond) // polling a condition, not waiting for time to pass
	}
}

func (h *watchHarness) waitLog(msg string) { h.t.Helper(); h.waitLogN(msg, 1) }

// wantModel checks that ev is a successful reload to a config serving model, and that it is stored.
func (h *watchHarness) wantModel(ev reloadEvent, model string) {
	h.t.Helper()
	if ev.err != nil || ev.cfg == nil {
		h.t.Fatalf("reload = %v, %v; want a config", ev.cfg, ev.err)
	}
	if got := ev.cfg.Models[0].ModelName; got != model {
		h.t.Errorf("reloaded model = %q; want %q", got, model)
	}
	if h.store.Load() != ev.cfg {
		h.t.Error("the store does not hold the reloaded config")
	}
}

func (h *watchHarness) noReload() {
	h.t.Helper()
	select {
	case ev := <-h.reloads:
		h.t.Errorf("unexpected reload: %+v", ev)
	default:
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestWatchAppliesGoodEditAndRejectsBadOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, configWith("one"))
	h := startWatch(t, path)

	writeFile(t, path, configWith("two"))
	h.wantModel(h.next(), "two")
	good := h.store.Load()

	writeFile(t, path, []byte("model_list:\n  - model_name: three\n    litellm_params: {model: openai/three, api_bse: x}\n"))
	ev := h.next()
	var errs *Errors
	if ev.cfg != nil || !errors.As(ev.err, &errs) {
		t.Fatalf("bad edit: reload = %v, %v; want nil and *Errors", ev.cfg, ev.err)
	}
	if len(errs.Problems) != 1 || errs.Problems[0].Line != 3 {
		t.Errorf("bad edit problems = %v; want one on line 3", errs.Problems)
	}
	if h.store.Load() != good {
		t.Error("a rejected edit replaced the stored config")
	}
	h.waitLog("config reload failed; keeping the previous config")

	writeFile(t, path, configWith("four"))
	h.wantModel(h.next(), "four")
}

func TestWatchRenameReplace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	writeFile(t, path, configWith("one"))
	h := startWatch(t, path)

	// What editors do: write a new file beside the old one, then rename it over the old one.
	tmp := filepath.Join(dir, ".config.yaml.tmp")
	writeFile(t, tmp, configWith("two"))
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	h.wantModel(h.next(), "two")
}

func TestWatchKubernetesSymlinkSwap(t *testing.T) {
	// The layout of a mounted ConfigMap: config.yaml -> ..data/config.yaml, ..data -> ..<timestamp>.
	dir := t.TempDir()
	mustDo(t, os.Mkdir(filepath.Join(dir, "..2026_01"), 0o755))
	writeFile(t, filepath.Join(dir, "..2026_01", "config.yaml"), configWith("one"))
	mustDo(t, os.Symlink("..2026_01", filepath.Join(dir, "..data")))
	mustDo(t, os.Symlink(filepath.Join("..data", "config.yaml"), filepath.Join(dir, "config.yaml")))
	path := filepath.Join(dir, "config.yaml")
	h := startWatch(t, path)

	// An update: a new timestamped directory, a new ..data_tmp link renamed over ..data, the old
	// directory removed. config.yaml itself never changes.
	mustDo(t, os.Mkdir(filepath.Join(dir, "..2026_02"), 0o755))
	writeFile(t, filepath.Join(dir, "..2026_02", "config.yaml"), configWith("two"))
	mustDo(t, os.Symlink("..2026_02", filepath.Join(dir, "..data_tmp")))
	mustDo(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	mustDo(t, os.RemoveAll(filepath.Join(dir, "..2026_01")))
	h.wantModel(h.next(), "two")
}

func TestWatchSymlinkIntoOtherDirectory(t *testing.T) {
	real := filepath.Join(t.TempDir(), "real.yaml")
	writeFile(t, real, configWith("one"))
	path := filepath.Join(t.TempDir(), "config.yaml")
	mustDo(t, os.Symlink(real, path))
	h := startWatch(t, path)

	writeFile(t, real, configWith("two"))
	h.wantModel(h.next(), "two")
}

func TestWatchSameBytesDoNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, configWith("one"))
	h := startWatch(t, path)
	before := h.store.Load()

	// The first "unchanged" is Watch's own check at start.
	h.waitLog("config file unchanged")
	writeFile(t, path, configWith("one"))
	h.waitLogN("config file unchanged", 2)
	h.noReload()
	if h.store.Load() != before {
		t.Error("rewriting the same bytes replaced the stored config")
	}

	// A rejected edit written again is not reported again.
	bad := []byte("model_list: 3\n")
	writeFile(t, path, bad)
	if ev := h.next(); ev.err == nil {
		t.Fatalf("bad edit accepted: %+v", ev.cfg)
	}
	writeFile(t, path, bad)
	h.waitLog("config file unchanged since the rejected edit")
	h.noReload()
}

func TestWatchMissingFileKeepsConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, configWith("one"))
	h := startWatch(t, path)
	before := h.store.Load()

	mustDo(t, os.Remove(path))
	ev := h.next()
	if ev.cfg != nil || !errors.Is(ev.err, os.ErrNotExist) {
		t.Fatalf("removed file: reload = %v, %v; want nil and ErrNotExist", ev.cfg, ev.err)
	}
	if h.store.Load() != before {
		t.Error("a missing file replaced the stored config")
	}
	writeFile(t, path, configWith("two"))
	h.wantModel(h.next(), "two")
}

func TestWatchStopsWhenContextEnds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, configWith("one"))
	h := startWatch(t, path)
	writeFile(t, path, configWith("two"))
	h.wantModel(h.next(), "two")
	h.stop()
	goleak.VerifyNone(t)
}

func TestWatchAppliesChangeMadeBeforeItStarted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, configWith("one"))
	cfg, err := Load(path)
	mustDo(t, err)
	writeFile(t, path, configWith("two"))
	store := NewStore(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	reloads := make(chan *Config, 1)
	go func() {
		done <- Watch(ctx, path, store, WatchOptions{OnReload: func(c *Config, _ error) { reloads <- c }})
	}()
	select {
	case c := <-reloads:
		if c == nil || c.Models[0].ModelName != "two" || store.Load() != c {
			t.Errorf("reload = %+v; want the edited config, stored", c)
		}
	case <-time.After(5 * time.Second):
		t.Error("the edit made before Watch started was not applied")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Watch = %v; want nil", err)
	}
}

func TestWatchFailsWithoutDirectory(t *testing.T) {
	err := Watch(context.Background(), filepath.Join(t.TempDir(), "missing", "config.yaml"), NewStore(nil), WatchOptions{})
	if err == nil {
		t.Fatal("Watch on a missing directory returned nil; want an error")
	}
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
