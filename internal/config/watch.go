package config

import (
	"context"
	"fmt"
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
	// Debounce is the quiet time after the last event before reload is called; <= 0 means
	// DefaultDebounce. Editors and Kubernetes produce several events per change.
	Debounce time.Duration
	// Logger receives the watcher's own lines (what is watched, watch errors); nil means no logging.
	// Reloads are reload's to log.
	Logger *zap.Logger
}

// Watch calls reload whenever the file at path may have changed, until ctx ends; then it returns nil.
// It watches the file's directory rather than the file, because editors replace a file by renaming a
// new one over it and Kubernetes swaps a ConfigMap by renaming its "..data" symlink; neither is seen by
// a watch on the old file. When path is a symlink into another directory, that directory is watched
// too.
//
// reload is called once when the watch is in place (the file may have changed since the caller read
// it) and then once per burst of events, after the burst has been quiet for the debounce time. It runs
// on Watch's goroutine, so calls never overlap; events queue behind a slow one. It must read the file
// itself and tell an unchanged file (a spurious event) from a changed one, as internal/snapshot's
// Store.Reload does. An error is returned only when the watch cannot be set up.
func Watch(ctx context.Context, path string, reload func(context.Context), opts WatchOptions) error {
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

	r := &watcher{path: path, log: log, w: w, dir: filepath.Clean(filepath.Dir(path))}
	if err := w.Add(r.dir); err != nil {
		return fmt.Errorf("watching config directory %s: %w", r.dir, err)
	}
	r.followSymlink()
	log.Info("watching config", zap.String("dir", r.dir), zap.String("also", r.targetDir))
	reload(ctx)

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
			reload(ctx)
			r.followSymlink()
		}
	}
}

// watcher is the state of one Watch call; only Watch's goroutine uses it.
type watcher struct {
	path string
	log  *zap.Logger
	w    *fsnotify.Watcher

	dir string // the directory of path, always watched
	// target is the resolved file when path is a symlink into another directory, targetDir its
	// directory (watched as well); both "" otherwise.
	target, targetDir string
}

// relevant reports whether ev may have changed what path reads: an event on the file itself, on a
// Kubernetes "..data"-style entry, or on the symlink's target. Chmod alone changes no content.
func (r *watcher) relevant(ev fsnotify.Event) bool {
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
func (r *watcher) followSymlink() {
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
