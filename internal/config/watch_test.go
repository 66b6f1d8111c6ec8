package config_test

import (
	"context"
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

	. "github.com/ciproxy/ciproxy/internal/config"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// watchHarness runs Watch with a reload that reads the file and reports what it read.
type watchHarness struct {
	t       *testing.T
	path    string
	reads   chan string // the file's content at each reload call
	logs    *observer.ObservedLogs
	cancel  context.CancelFunc
	done    chan error
	stopped sync.Once
}

// startWatch watches path (which must exist) and waits for the reload Watch makes once the watch is
// in place, which must read want.
func startWatch(t *testing.T, path, want string) *watchHarness {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	ctx, cancel := context.WithCancel(context.Background())
	h := &watchHarness{
		t: t, path: path, logs: logs, cancel: cancel,
		reads: make(chan string, 64),
		done:  make(chan error, 1),
	}
	reload := func(ctx context.Context) {
		if ctx.Err() != nil {
			t.Error("reload called with an ended context")
		}
		b, err := os.ReadFile(path)
		if err != nil {
			h.reads <- "error: " + err.Error()
			return
		}
		h.reads <- string(b)
	}
	go func() {
		h.done <- Watch(ctx, path, reload, WatchOptions{Debounce: 10 * time.Millisecond, Logger: zap.New(core)})
	}()
	t.Cleanup(h.stop)
	h.wantRead(want)
	if logs.FilterMessage("watching config").Len() != 1 {
		t.Errorf("logs = %v; want one \"watching config\"", logs.All())
	}
	return h
}

// stop cancels the watch and waits for Watch to return.
func (h *watchHarness) stop() {
	h.stopped.Do(func() {
		h.cancel()
		select {
		case err := <-h.done:
			if err != nil {
				h.t.Errorf("Watch returned %v; want nil after cancel", err)
			}
		case <-time.After(5 * time.Second):
			h.t.Fatal("Watch did not return after its context was cancelled")
		}
	})
}

// wantRead waits until a reload call reads content containing want. Reload calls that read
// something else (an intermediate state of an update) are skipped.
func (h *watchHarness) wantRead(want string) {
	h.t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case got := <-h.reads:
			if strings.Contains(got, want) {
				return
			}
		case <-deadline:
			h.t.Fatalf("no reload read %q within 5s", want)
		}
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestWatchCallsReloadOnEdit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, "one")
	h := startWatch(t, path, "one")
	writeFile(t, path, "two")
	h.wantRead("two")
	writeFile(t, path, "three")
	h.wantRead("three")
}

func TestWatchIgnoresOtherFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	writeFile(t, path, "one")
	h := startWatch(t, path, "one")
	writeFile(t, filepath.Join(dir, "other.yaml"), "noise")
	writeFile(t, path, "two")
	if got := <-h.reads; got != "two" {
		t.Errorf("reload after an unrelated file and an edit read %q; want only the edit's reload", got)
	}
}

func TestWatchRenameReplace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	writeFile(t, path, "one")
	h := startWatch(t, path, "one")

	// What editors do: write a new file beside the old one, then rename it over the old one.
	tmp := filepath.Join(dir, ".config.yaml.tmp")
	writeFile(t, tmp, "two")
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	h.wantRead("two")
}

func TestWatchKubernetesSymlinkSwap(t *testing.T) {
	// The layout of a mounted ConfigMap: config.yaml -> ..data/config.yaml, ..data -> ..<timestamp>.
	dir := t.TempDir()
	mustDo(t, os.Mkdir(filepath.Join(dir, "..2026_01"), 0o755))
	writeFile(t, filepath.Join(dir, "..2026_01", "config.yaml"), "one")
	mustDo(t, os.Symlink("..2026_01", filepath.Join(dir, "..data")))
	mustDo(t, os.Symlink(filepath.Join("..data", "config.yaml"), filepath.Join(dir, "config.yaml")))
	path := filepath.Join(dir, "config.yaml")
	h := startWatch(t, path, "one")

	// An update: a new timestamped directory, a new ..data_tmp link renamed over ..data, the old
	// directory removed. config.yaml itself never changes.
	mustDo(t, os.Mkdir(filepath.Join(dir, "..2026_02"), 0o755))
	writeFile(t, filepath.Join(dir, "..2026_02", "config.yaml"), "two")
	mustDo(t, os.Symlink("..2026_02", filepath.Join(dir, "..data_tmp")))
	mustDo(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	mustDo(t, os.RemoveAll(filepath.Join(dir, "..2026_01")))
	h.wantRead("two")

	// And the next update, once the watcher has followed the first.
	mustDo(t, os.Mkdir(filepath.Join(dir, "..2026_03"), 0o755))
	writeFile(t, filepath.Join(dir, "..2026_03", "config.yaml"), "three")
	mustDo(t, os.Symlink("..2026_03", filepath.Join(dir, "..data_tmp")))
	mustDo(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	mustDo(t, os.RemoveAll(filepath.Join(dir, "..2026_02")))
	h.wantRead("three")
}

func TestWatchSymlinkIntoOtherDirectory(t *testing.T) {
	real := filepath.Join(t.TempDir(), "real.yaml")
	writeFile(t, real, "one")
	path := filepath.Join(t.TempDir(), "config.yaml")
	mustDo(t, os.Symlink(real, path))
	h := startWatch(t, path, "one")

	writeFile(t, real, "two")
	h.wantRead("two")
}

func TestWatchMissingFileAndBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, "one")
	h := startWatch(t, path, "one")

	mustDo(t, os.Remove(path))
	h.wantRead("error: ")
	writeFile(t, path, "two")
	h.wantRead("two")
}

func TestWatchStopsWhenContextEnds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, "one")
	h := startWatch(t, path, "one")
	writeFile(t, path, "two")
	h.wantRead("two")
	h.stop()
	goleak.VerifyNone(t)
}

// The first reload call comes as soon as the watch is in place, without any event, so that an edit
// made between the caller's first read and the watch is not missed.
func TestWatchReloadsOnceAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, "edited before the watch")
	startWatch(t, path, "edited before the watch")
}

func TestWatchFailsWithoutDirectory(t *testing.T) {
	err := Watch(context.Background(), filepath.Join(t.TempDir(), "missing", "config.yaml"), func(context.Context) {
		t.Error("reload called without a watch")
	}, WatchOptions{})
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
