// Package embedded is the default store.Store: one process, everything on local disk under one
// data directory, surviving a restart.
//
// Layout (all private to the proxy's user: directories 0700, files 0600):
//
//	LOCK               flock'd while a process has the store open; a second one is refused
//	FORMAT             the layout version
//	files/<id>.json    Files API metadata       blobs/<id>   its bytes
//	containers/<id>.json, cfiles/<id>.json      the container registry and container files
//	responses/<id>.json, calls/<id>.json        stored responses and their calls
//	tmp/               uploads and records being written (emptied at Open)
//	corrupt/           records that could not be read, set aside for an operator
//
// Every record is one JSON file, written whole to tmp/ and renamed into place, so a reader (or a
// restart after a crash) sees the old record or the new one, never part of one. A file's bytes
// are written to tmp/ while they arrive and renamed into blobs/ only once complete, and only then
// is its metadata written: nothing half-stored is ever visible. What a crash can leave behind (a
// blob without metadata, a container file without its container, a temporary file) is removed at
// the next Open.
//
// fsync: file bytes, file metadata, and the creation and deletion of containers and container
// files are synced (file and directory) before the call returns, so what a client was told is
// stored survives a power cut. Container updates (last_active_at moves on every use), stored
// responses and calls reach the kernel only: they survive the process dying, and a power cut
// loses at most the last seconds of them, which costs a container some idle time or a client a
// stored response, never a file.
//
// Files, containers and container files are indexed in memory (loaded at Open); responses and
// calls are read from disk on demand and never held in memory. Expired objects are invisible at
// once and removed by Sweep, which runs every Options.SweepEvery. A response's file has its
// modification time set to its expiry, so the sweeper finds expired ones from directory metadata
// without reading every record.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/store"
)

var errInvalid = store.ErrInvalid

// DefaultSweepEvery is how often expired objects are removed when Options.SweepEvery is 0.
const DefaultSweepEvery = time.Minute

// Options configure Open.
type Options struct {
	// Dir is the data directory; it is created (0700) when missing. Required.
	Dir string
	// Now is the clock that decides expiry and stamps ids. Nil: time.Now.
	Now func() time.Time
	// SweepEvery is how often a background sweep removes expired objects: 0 means
	// DefaultSweepEvery, negative means never (call Sweep).
	SweepEvery time.Duration
	// Logger receives what Open repairs and what a sweep fails to remove. Nil: no logging.
	Logger *zap.Logger
}

// Store is the embedded store. It is safe for concurrent use.
type Store struct {
	dir  string
	now  func() time.Time
	ids  *store.IDGenerator
	log  *zap.Logger
	lock *os.File

	mu         sync.Mutex
	closed     bool
	files      map[string]*store.File
	ownerFiles map[string]*ownerFiles
	containers map[string]*store.Container
	ownerCntrs map[string]*index
	cfiles     map[string]*store.ContainerFile
	cntrFiles  map[string]*index // container id -> its container files
	claims     map[string]claim
	places     map[string]map[string]time.Time // owner -> container id -> until when it holds a place
	shared     map[string]time.Time            // container id -> the same, for shared containers
	buckets    map[string]bucket
	uploads    map[string]*ownerUploads // owner -> its uploads in flight
	inFlight   int64                    // the bytes every upload in flight has written

	stopSweep chan struct{}
	swept     sync.WaitGroup
}

var _ store.Store = (*Store)(nil)

// ownerFiles is one owner's files: the list order and the bytes they take.
type ownerFiles struct {
	ids   index
	bytes int64
}

// Open opens the store in opts.Dir, creating it when needed, and repairs what a crash left
// behind. Only one process may have a data directory open.
func Open(opts Options) (*Store, error) {
	if opts.Dir == "" {
		return nil, errors.New("embedded store: no data directory")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("embedded store: %w", err)
	}
	s := &Store{
		dir:        dir,
		now:        opts.Now,
		ids:        store.NewIDGenerator(opts.Now),
		log:        opts.Logger,
		files:      map[string]*store.File{},
		ownerFiles: map[string]*ownerFiles{},
		containers: map[string]*store.Container{},
		ownerCntrs: map[string]*index{},
		cfiles:     map[string]*store.ContainerFile{},
		cntrFiles:  map[string]*index{},
		claims:     map[string]claim{},
		places:     map[string]map[string]time.Time{},
		shared:     map[string]time.Time{},
		buckets:    map[string]bucket{},
		uploads:    map[string]*ownerUploads{},
		stopSweep:  make(chan struct{}),
	}
	if err := s.prepare(); err != nil {
		return nil, err
	}
	if err := s.load(); err != nil {
		_ = s.lock.Close()
		return nil, err
	}
	every := opts.SweepEvery
	if every == 0 {
		every = DefaultSweepEvery
	}
	if every > 0 {
		s.swept.Go(func() { s.sweepLoop(every) })
	}
	return s, nil
}

// prepare creates the layout, takes the lock and checks the format.
func (s *Store) prepare() error {
	if err := os.MkdirAll(s.dir, dirMode); err != nil {
		return fmt.Errorf("embedded store: creating the data directory: %w", err)
	}
	lock, err := os.OpenFile(s.path(lockFile), os.O_RDWR|os.O_CREATE, fileMode)
	if err != nil {
		return fmt.Errorf("embedded store: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("embedded store: %s is in use by another process (one data directory per process)", s.dir)
		}
		return fmt.Errorf("embedded store: locking %s: %w", s.dir, err)
	}
	s.lock = lock
	fail := func(err error) error {
		_ = lock.Close()
		return err
	}
	switch b, err := os.ReadFile(s.path(formatFile)); {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.WriteFile(s.path(formatFile), []byte(formatText), fileMode); err != nil {
			return fail(fmt.Errorf("embedded store: %w", err))
		}
	case err != nil:
		return fail(fmt.Errorf("embedded store: %w", err))
	case string(b) != formatText:
		return fail(fmt.Errorf("embedded store: %s holds data in format %q, which this version does not read", s.dir, b))
	}
	for _, d := range allDirs {
		if err := os.MkdirAll(s.path(d), dirMode); err != nil {
			return fail(fmt.Errorf("embedded store: %w", err))
		}
	}
	// Whatever is in tmp/ belonged to a process that is gone (the lock says so).
	if err := os.RemoveAll(s.path(dirTmp)); err != nil {
		return fail(fmt.Errorf("embedded store: emptying tmp/: %w", err))
	}
	if err := os.Mkdir(s.path(dirTmp), dirMode); err != nil {
		return fail(fmt.Errorf("embedded store: %w", err))
	}
	return nil
}

// load builds the in-memory indexes and removes what a crash orphaned.
func (s *Store) load() error {
	if err := s.loadFiles(); err != nil {
		return err
	}
	if err := s.loadContainers(); err != nil {
		return err
	}
	return s.loadContainerFiles()
}

// Close stops the sweeper and releases the data directory. Uploads in progress fail.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stopSweep)
	s.swept.Wait()
	return s.lock.Close() // closing the descriptor drops the flock
}

// NewID implements [store.Store.NewID].
func (s *Store) NewID(k store.Kind) string { return s.ids.New(k) }

// Dir is the data directory.
func (s *Store) Dir() string { return s.dir }

// checkOpen is called with s.mu held.
func (s *Store) checkOpen() error {
	if s.closed {
		return store.ErrClosed
	}
	return nil
}

func (s *Store) sweepLoop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stopSweep:
			return
		case <-t.C:
			if err := s.Sweep(context.Background()); err != nil && !errors.Is(err, store.ErrClosed) {
				s.log.Warn("embedded store: sweep", zap.Error(err))
			}
		}
	}
}

// Sweep removes every object whose expiry has passed: files with their bytes, containers with
// their files, responses, calls and claims. Readers never see expired objects whether or not a
// sweep has run; sweeping frees the space.
func (s *Store) Sweep(ctx context.Context) error {
	now := s.now()
	s.mu.Lock()
	if err := s.checkOpen(); err != nil {
		s.mu.Unlock()
		return err
	}
	var errs []error
	for id, f := range s.files {
		if f.Expired(now) {
			errs = append(errs, s.dropFileLocked(id))
		}
	}
	for id, c := range s.containers {
		if expired(c.ForgetAt, now) {
			errs = append(errs, s.dropContainerLocked(id))
		}
	}
	for k, c := range s.claims {
		if !now.Before(c.until) {
			delete(s.claims, k)
		}
	}
	s.mu.Unlock()
	errs = append(errs, s.sweepTimed(ctx, dirResponses, now, responseExpiry), s.sweepTimed(ctx, dirCalls, now, callExpiry))
	return errors.Join(errs...)
}

func (s *Store) logf(format string, args ...any) {
	s.log.Warn(fmt.Sprintf(format, args...))
}

// DefaultDir is the data directory used when none is configured: /var/lib/ciproxy for root, else
// ciproxy/ in the user's cache directory ($XDG_CACHE_HOME or ~/.cache).
func DefaultDir() (string, error) {
	if os.Geteuid() == 0 {
		return "/var/lib/ciproxy", nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("embedded store: no default data directory (%w); set general_settings.data_dir", err)
	}
	return filepath.Join(cache, "ciproxy"), nil
}
