package embedded

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/ciproxy/ciproxy/internal/ctxio"
	"github.com/ciproxy/ciproxy/internal/store"
)

// loadFiles reads every file record, then removes the blobs no record names (a crash between
// storing the bytes and the metadata, or between removing the metadata and the bytes).
func (s *Store) loadFiles() error {
	ids, err := s.records(dirFiles)
	if err != nil {
		return err
	}
	for _, id := range ids {
		var r store.File
		err := s.readRecord(dirFiles, id, &r)
		if err == nil && (r.ID != id || !store.FileKind.Valid(id)) {
			err = fmt.Errorf("the record names id %q", r.ID)
		}
		if err == nil {
			if info, serr := os.Lstat(s.path(dirBlobs, id)); serr != nil || !info.Mode().IsRegular() || info.Size() != r.Bytes {
				err = fmt.Errorf("its bytes are missing or of another size (%v)", serr)
			}
		}
		if err != nil {
			// The record and its bytes go aside together: what an operator may recover.
			s.quarantine(dirFiles, id+".json", err)
			if _, serr := os.Lstat(s.path(dirBlobs, id)); serr == nil {
				s.quarantine(dirBlobs, id, errors.New("its metadata could not be read"))
			}
			continue
		}
		s.indexFileLocked(&r)
	}
	blobs, err := os.ReadDir(s.path(dirBlobs))
	if err != nil {
		return fmt.Errorf("embedded store: %w", err)
	}
	for _, b := range blobs {
		if _, ok := s.files[b.Name()]; !ok {
			if err := os.RemoveAll(s.path(dirBlobs, b.Name())); err != nil {
				return fmt.Errorf("embedded store: removing an orphaned blob: %w", err)
			}
		}
	}
	return nil
}

func (s *Store) indexFileLocked(r *store.File) {
	s.ids.Observe(store.FileKind, r.ID)
	s.files[r.ID] = r
	of := s.ownerFiles[r.Owner]
	if of == nil {
		of = &ownerFiles{}
		s.ownerFiles[r.Owner] = of
	}
	of.ids.add(r.ID)
	of.bytes += r.Bytes
}

// dropFileLocked removes a file: metadata first, so that a crash in between leaves an orphaned
// blob (removed at Open), never metadata without bytes.
func (s *Store) dropFileLocked(id string) error {
	r, ok := s.files[id]
	if !ok {
		return nil
	}
	if err := s.removeRecord(dirFiles, id, synced); err != nil {
		return err
	}
	delete(s.files, id)
	of := s.ownerFiles[r.Owner]
	of.ids.remove(id)
	of.bytes -= r.Bytes
	if len(of.ids) == 0 {
		delete(s.ownerFiles, r.Owner)
	}
	return s.remove(dirBlobs, id, cached)
}

// liveFileLocked returns owner's unexpired file id.
func (s *Store) liveFileLocked(owner, id string) (*store.File, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	r, ok := s.files[id]
	if !ok || r.Owner != owner || r.Expired(s.now()) {
		return nil, fmt.Errorf("file %s: %w", id, store.ErrNotFound)
	}
	return r, nil
}

// usedLocked returns owner's bytes after dropping their expired files, so that a file past its
// expiry stops counting even before a sweep.
func (s *Store) usedLocked(owner string) (int64, error) {
	of := s.ownerFiles[owner]
	if of == nil {
		return 0, nil
	}
	now := s.now()
	var errs []error
	for _, id := range append(index(nil), of.ids...) {
		if s.files[id].Expired(now) {
			errs = append(errs, s.dropFileLocked(id))
		}
	}
	if of := s.ownerFiles[owner]; of != nil {
		return of.bytes, errors.Join(errs...)
	}
	return 0, errors.Join(errs...)
}

// ownerUploads is what one owner's uploads in flight hold (see store.Files): they live in this
// process only, so a process that dies takes them with it, and its temporary files go at the
// next Open.
type ownerUploads struct {
	n     int   // uploads in flight
	bytes int64 // the bytes they have written
}

// BeginFile implements [store.Files.BeginFile].
func (s *Store) BeginFile(ctx context.Context, owner string, lim store.FileLimits) (store.FileUpload, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	u := &upload{s: s, owner: owner, lim: lim}
	if err := u.hold(); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(s.path(dirTmp), "upload-*")
	if err != nil {
		u.release()
		return nil, fmt.Errorf("embedded store: %w", err)
	}
	u.f = f
	return u, nil
}

// upload is a file being written to tmp/.
type upload struct {
	s        *Store
	owner    string
	lim      store.FileLimits
	f        *os.File // nil once committed or aborted
	n        int64
	reserved int64 // bytes counted in flight for the upload: n, or more after a failed write
	held     bool  // the upload holds one of its owner's uploads in flight
	failed   bool
}

// hold takes one of the owner's uploads in flight, if the limits leave one.
func (u *upload) hold() error {
	s := u.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(); err != nil {
		return err
	}
	used, err := s.usedLocked(u.owner)
	if err != nil {
		return err
	}
	ou := s.uploads[u.owner]
	if ou == nil {
		ou = &ownerUploads{}
	}
	switch lim := u.lim; {
	case lim.MaxUploads > 0 && ou.n >= lim.MaxUploads:
		return fmt.Errorf("%w: %d of %d", store.ErrTooManyUploads, ou.n, lim.MaxUploads)
	case lim.OwnerBytes > 0 && used+ou.bytes >= lim.OwnerBytes:
		return fmt.Errorf("%w: %d bytes in files and %d in uploads of %d", store.ErrQuota, used, ou.bytes, lim.OwnerBytes)
	case lim.MaxInFlight > 0 && s.inFlight >= lim.MaxInFlight:
		return fmt.Errorf("%w: %d of %d bytes", store.ErrInFlightFull, s.inFlight, lim.MaxInFlight)
	}
	ou.n++
	s.uploads[u.owner] = ou
	u.held = true
	return nil
}

// reserve counts n more bytes of the upload, if its owner's quota and the bytes in flight leave
// room for them. The owner's bytes are taken as they stand, without dropping expired files
// first (which costs a pass over them all): an expired file still counting is a refusal too
// many, never a byte too many, and BeginFile and Commit drop them.
func (u *upload) reserve(n int64) error {
	s := u.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var used int64
	if of := s.ownerFiles[u.owner]; of != nil {
		used = of.bytes
	}
	ou := s.uploads[u.owner]
	switch lim := u.lim; {
	case lim.OwnerBytes > 0 && used+ou.bytes+n > lim.OwnerBytes:
		return fmt.Errorf("%w: %d bytes in files and %d in uploads, %d more asked, %d allowed", store.ErrQuota, used, ou.bytes, n, lim.OwnerBytes)
	case lim.MaxInFlight > 0 && s.inFlight+n > lim.MaxInFlight:
		return fmt.Errorf("%w: %d bytes in flight, %d more asked, %d allowed", store.ErrInFlightFull, s.inFlight, n, lim.MaxInFlight)
	}
	ou.bytes += n
	s.inFlight += n
	u.reserved += n
	return nil
}

// releaseLocked gives back what the upload holds: its place among its owner's uploads and the
// bytes it reserved.
func (u *upload) releaseLocked() {
	if !u.held {
		return
	}
	s := u.s
	ou := s.uploads[u.owner]
	ou.bytes -= u.reserved
	s.inFlight -= u.reserved
	if ou.n--; ou.n == 0 {
		delete(s.uploads, u.owner)
	}
	u.held = false
}

func (u *upload) release() {
	u.s.mu.Lock()
	defer u.s.mu.Unlock()
	u.releaseLocked()
}

// Write implements [store.FileUpload.Write]: each block is reserved before it is written.
func (u *upload) Write(ctx context.Context, r io.Reader) (int64, error) {
	if u.f == nil || u.failed {
		return 0, fmt.Errorf("%w: the upload is finished", errInvalid)
	}
	src := r
	if u.lim.MaxBytes > 0 {
		// One byte past the limit tells "exactly max" from "more than max".
		src = io.LimitReader(r, u.lim.MaxBytes-u.n+1)
	}
	n, err := io.Copy(reservedWriter{u}, ctxio.Reader(ctx, src))
	switch {
	case errors.Is(err, store.ErrQuota) || errors.Is(err, store.ErrInFlightFull):
		u.failed = true
		return n, err
	case err != nil:
		u.failed = true
		return n, fmt.Errorf("embedded store: storing a file: %w", err)
	case u.lim.MaxBytes > 0 && u.n > u.lim.MaxBytes:
		u.failed = true
		return n, fmt.Errorf("%w: more than %d bytes", store.ErrTooLarge, u.lim.MaxBytes)
	}
	return n, nil
}

// reservedWriter writes to the upload's file what it has reserved first.
type reservedWriter struct{ u *upload }

func (w reservedWriter) Write(p []byte) (int, error) {
	if err := w.u.reserve(int64(len(p))); err != nil {
		return 0, err
	}
	n, err := w.u.f.Write(p)
	w.u.n += int64(n)
	return n, err
}

// Commit implements [store.FileUpload.Commit].
func (u *upload) Commit(ctx context.Context, f store.File) (store.File, error) {
	if u.f == nil || u.failed {
		return store.File{}, fmt.Errorf("%w: the upload is finished", errInvalid)
	}
	if err := ctx.Err(); err != nil {
		return store.File{}, err
	}
	defer func() { _ = u.Abort() }()
	s := u.s
	if f.ID != "" && !store.FileKind.Valid(f.ID) {
		return store.File{}, fmt.Errorf("%w: %q is not a file id", errInvalid, f.ID)
	}
	// The bytes are made durable outside the lock; the lock covers the checks and the rename.
	if err := u.f.Sync(); err != nil {
		return store.File{}, fmt.Errorf("embedded store: %w", err)
	}
	if err := u.f.Close(); err != nil {
		return store.File{}, fmt.Errorf("embedded store: %w", err)
	}
	tmp := u.f.Name()
	u.f = nil
	defer os.Remove(tmp) // gone already after the rename

	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(); err != nil {
		return store.File{}, err
	}
	if f.ID == "" {
		f.ID = s.ids.New(store.FileKind)
	} else if _, taken := s.files[f.ID]; taken {
		return store.File{}, fmt.Errorf("file %s: %w", f.ID, store.ErrExists)
	}
	used, err := s.usedLocked(u.owner)
	if err != nil {
		return store.File{}, err
	}
	// The upload's own bytes are reserved already: what the others hold counts beside them.
	others := s.uploads[u.owner].bytes - u.reserved
	if u.lim.OwnerBytes > 0 && used+others+u.n > u.lim.OwnerBytes {
		return store.File{}, fmt.Errorf("%w: %d bytes in files and %d in other uploads, %d more asked, %d allowed", store.ErrQuota, used, others, u.n, u.lim.OwnerBytes)
	}
	if f.CreatedAt.IsZero() {
		f.CreatedAt = s.now()
	}
	f.Owner, f.Bytes = u.owner, u.n
	r := &f
	blob := s.path(dirBlobs, f.ID)
	if err := os.Rename(tmp, blob); err != nil {
		return store.File{}, fmt.Errorf("embedded store: %w", err)
	}
	if err := s.syncDir(dirBlobs); err != nil {
		_ = os.Remove(blob)
		return store.File{}, err
	}
	if err := s.writeRecord(dirFiles, f.ID, r, synced, time.Time{}); err != nil {
		_ = os.Remove(blob)
		return store.File{}, err
	}
	u.releaseLocked()
	s.indexFileLocked(r)
	return *r, nil
}

// Abort implements [store.FileUpload.Abort].
func (u *upload) Abort() error {
	u.release()
	if u.f == nil {
		return nil
	}
	name := u.f.Name()
	_ = u.f.Close()
	u.f = nil
	if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("embedded store: %w", err)
	}
	return nil
}

// File implements [store.Files.File].
func (s *Store) File(_ context.Context, owner, id string) (store.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.liveFileLocked(owner, id)
	if err != nil {
		return store.File{}, err
	}
	return *r, nil
}

// OpenFile implements [store.Files.OpenFile].
func (s *Store) OpenFile(_ context.Context, owner, id string) (store.File, io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.liveFileLocked(owner, id)
	if err != nil {
		return store.File{}, nil, err
	}
	// Opened under the lock, so that a delete cannot come between the check and the open; once
	// open, the bytes stay readable after a delete.
	f, err := os.Open(filepath.Join(s.dir, dirBlobs, id))
	if err != nil {
		return store.File{}, nil, fmt.Errorf("embedded store: %w", err)
	}
	return *r, f, nil
}

// ListFiles implements [store.Files.ListFiles].
func (s *Store) ListFiles(_ context.Context, owner string, q store.FileQuery) (store.List[store.File], error) {
	if q.After != "" && !store.FileKind.Valid(q.After) {
		return store.List[store.File]{}, fmt.Errorf("%w: after %q is not a file id", errInvalid, q.After)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(); err != nil {
		return store.List[store.File]{}, err
	}
	of := s.ownerFiles[owner]
	if of == nil {
		return store.List[store.File]{}, nil
	}
	now := s.now()
	return page(of.ids, q.Page, func(id string) (store.File, bool) {
		r := s.files[id]
		if r.Expired(now) || (q.Purpose != "" && r.Purpose != q.Purpose) {
			return store.File{}, false
		}
		return *r, true
	}), nil
}

// DeleteFile implements [store.Files.DeleteFile].
func (s *Store) DeleteFile(_ context.Context, owner, id string) (store.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.liveFileLocked(owner, id)
	if err != nil {
		return store.File{}, err
	}
	return *r, s.dropFileLocked(id)
}

// Usage implements [store.Files.Usage].
func (s *Store) Usage(_ context.Context, owner string) (store.Usage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(); err != nil {
		return store.Usage{}, err
	}
	used, err := s.usedLocked(owner)
	if of := s.ownerFiles[owner]; of != nil {
		return store.Usage{Files: len(of.ids), Bytes: used}, err
	}
	return store.Usage{}, err
}
