package config

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
)

// DefaultDebounce is how long Watch waits after the last file event before it reads the file.
const DefaultDebounce = 100 * time.Millisecond

// WatchOptions adjusts Watch.
type WatchOptions struct {
	// Debounce is the quiet time after the last event before the file is read; <= 0 means
	// DefaultDebounce. Editors and Kubernetes produce several events per change.
	Debounce time.Duration
	// OnReload, if not nil, is called by Watch's goroutine after every reload attempt whose bytes
	// differ from the config in the store: with the new config after it is stored, or with nil and
	// the error when the file could not be read or parsed (the old config then stays). It must not
	// block for long: events queue behind it.
	OnReload func(c *Config, err error)
	// Logger receives one line per attempt; nil means no logging. Values of keys are never logged.
	Logger *zap.Logger
}

// Watch keeps s in step with the file at path until ctx ends, then returns nil. It watches the
// file's directory rather than the file, because editors replace a file by renaming a new one over
// it and Kubernetes swaps a ConfigMap by renaming its "..data" symlink; neither is seen by a watch on
// the old file. When path is a symlink into another directory, that directory is watched too.
//
// Watch first checks the file once, then each burst of events is debounced, and the file is read and compared with the bytes the
// current config was parsed from: identical bytes do nothing. Otherwise the file is parsed and validated, and
// only a valid config replaces the current one. An error is returned only when the watch cannot be
// set up.
func Watch(ctx context.Context, path string, s *Store, opts WatchOptions) error {
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("path", path))

	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching config: %w", err)
	}
	defer w.Close()

	r := &reloader{path: path, store: s, opts: opts, log: log, w: w, dir: filepath.Clean(filepath.Dir(path))}
	if err := w.Add(r.dir); err != nil {
		return fmt.Errorf("watching config directory %s: %w", r.dir, err)
	}
	r.followSymlink()
	// The file may have changed between the caller's Load and the watch being in place.
	r.reload()
	log.Info("watching config", zap.String("dir", r.dir), zap.String("also", r.targetDir))

	timer := time.NewTimer(opts.Debounce)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if r.relevant(ev) {
				timer.Reset(opts.Debounce)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			log.Warn("config watch error", zap.Error(err))
		case <-timer.C:
			r.reload()
			r.followSymlink()
		}
	}
}

// reloader is the state of one Watch call; only Watch's goroutine uses it.
type reloader struct {
	path  string
	store *Store
	opts  WatchOptions
	log   *zap.Logger
	w     *fsnotify.Watcher

	dir string // the directory of path, always watched
	// target is the resolved file when path is a symlink into another directory, targetDir its
	// directory (watched as well); both "" otherwise.
	target, targetDir string
	// failed holds the bytes of the last rejected file, so that a spurious event does not report the
	// same error again.
	failed []byte
}

// relevant reports whether ev may have changed what path reads: an event on the file itself, on a
// Kubernetes "..data"-style entry, or on the symlink's target. Chmod alone changes no content.
func (r *reloader) relevant(ev fsnotify.Event) bool {
	if ev.Op == fsnotify.Chmod {
		return false
	}
	dir, base := filepath.Dir(ev.Name), filepath.Base(ev.Name)
	switch {
	case dir == r.dir:
		return base == filepath.Base(r.path) || strings.HasPrefix(base, "..") ||
			(r.target != "" && base == filepath.Base(r.target))
	case r.targetDir != "" && dir == r.targetDir:
		return base == filepath.Base(r.target)
	}
	return false
}

// followSymlink records the file that path currently resolves to, watches its directory when that
// is not path's own directory (or a direct subdirectory of it, as Kubernetes' ..data targets are,
// whose swaps show up as events on ..data), and drops the watch on a directory no longer pointed
// into.
func (r *reloader) followSymlink() {
	target, err := filepath.EvalSymlinks(r.path)
	if err != nil {
		return // the file is missing for now; the directory watch sees it come back
	}
	r.target = target
	realDir, err := filepath.EvalSymlinks(r.dir)
	if err != nil {
		realDir = r.dir
	}
	dir := filepath.Dir(target)
	if dir == realDir || childOf(realDir, dir) {
		dir = ""
	}
	if dir == r.targetDir {
		return
	}
	if r.targetDir != "" {
		_ = r.w.Remove(r.targetDir) // it may be gone already, and its watch with it
		r.targetDir = ""
	}
	if dir == "" {
		return
	}
	if err := r.w.Add(dir); err != nil {
		r.log.Warn("cannot watch the directory the config symlink points into", zap.String("dir", dir), zap.Error(err))
		return
	}
	r.targetDir = dir
}

// childOf reports whether dir is a direct subdirectory of parent.
func childOf(parent, dir string) bool {
	rel, err := filepath.Rel(parent, dir)
	return err == nil && rel != "." && rel != ".." &&
		!strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !strings.ContainsRune(rel, filepath.Separator)
}

// reload reads, compares, parses and stores the file once.
func (r *reloader) reload() {
	data, err := os.ReadFile(r.path)
	if err != nil {
		r.failed = nil
		r.report(nil, fmt.Errorf("reading config: %w", err))
		return
	}
	if cur := r.store.Load(); cur != nil && cur.raw != nil && bytes.Equal(cur.raw, data) {
		r.failed = nil
		r.log.Debug("config file unchanged")
		return
	}
	if r.failed != nil && bytes.Equal(r.failed, data) {
		r.log.Debug("config file unchanged since the rejected edit")
		return
	}
	cfg, err := Parse(data, r.path)
	if err != nil {
		r.failed = data
		r.report(nil, err)
		return
	}
	r.failed = nil
	r.store.swap(cfg)
	r.report(cfg, nil)
}

func (r *reloader) report(cfg *Config, err error) {
	if err != nil {
		// Problems name keys and lines, never values of secrets.
		r.log.Error("config reload failed; keeping the previous config", zap.Error(err))
	} else {
		r.log.Info("config reloaded",
			zap.Int("models", len(cfg.Models)),
			zap.Int("sandbox_tools", len(cfg.SandboxTools)),
			zap.Bool("interception", cfg.InterceptionActive()))
		for _, w := range cfg.Warnings {
			r.log.Warn("config warning", zap.String("warning", w))
		}
	}
	if r.opts.OnReload != nil {
		r.opts.OnReload(cfg, err)
	}
}
