package containers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/filename"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

// Container files: the files under DataDir that the store records for a container (cfile_ ids),
// with source "user" (placed from the Files API, or uploaded) or "assistant" (made by code). The
// bytes live in the sandbox; the records say what is there. Placing, collecting and removing files
// take the container's run lock, so that no execution runs meanwhile and what changed is known.

// Container file sources.
const (
	SourceUser      = "user"
	SourceAssistant = "assistant"
)

// DefaultMaxContainerFiles is how many files a container may hold unless told otherwise.
const DefaultMaxContainerFiles = 1000

// unlimited is the byte limit given to a backend when there is none: far beyond any file, and
// far enough from math.MaxInt64 that a backend may add to it.
const unlimited = 1 << 62

// maxListed bounds one listing of DataDir: files past it are not seen (and not collected).
const maxListed = 10000

// Errors of the container file operations. Limit errors come wrapped in a FileError when they
// concern one of several files.
var (
	// ErrTooManyFiles: the container would hold more than ContainerLimits.Files files.
	ErrTooManyFiles = errors.New("the container holds as many files as it may")
	// ErrInvalidFilename: a name that cannot be a file's (see internal/filename).
	ErrInvalidFilename = errors.New("invalid filename")
	// ErrNoSuchFile: the container exists but holds no file of that id. Errors that wrap it wrap
	// ErrNotFound too.
	ErrNoSuchFile = errors.New("no such container file")
	// ErrCollect: an execution ran, but what it wrote could not be collected.
	ErrCollect = errors.New("collecting the files an execution wrote")
)

// ContainerLimits bound what a container's files may take. Zero fields mean no limit.
type ContainerLimits struct {
	// FileBytes is the largest one file may be (general_settings.max_file_upload_size).
	FileBytes int64
	// TotalBytes is what all of a container's files may take together.
	TotalBytes int64
	// Files is how many files a container may hold.
	Files int
}

// FileError says which of a list of files failed (index and id as given) and why.
type FileError struct {
	Index  int
	FileID string
	Err    error
}

func (e *FileError) Error() string {
	return fmt.Sprintf("file %d (%s): %v", e.Index, e.FileID, e.Err)
}

func (e *FileError) Unwrap() error { return e.Err }

func (c *Container) fileSystem() (sandbox.FileSystem, error) {
	fs, ok := c.ent.Provider.(sandbox.FileSystem)
	if !ok {
		return nil, fmt.Errorf("%w: sandbox tool %q cannot move files in or out of its sandboxes", sandbox.ErrUnavailable, c.h.Tool)
	}
	return fs, nil
}

// StatFiles returns owner's Files API files ids, in order, checking each: an id that is malformed,
// unknown or another owner's is a FileError wrapping ErrNotFound, a file larger than
// lim.FileBytes one wrapping ErrFileTooLarge. A repeated id counts once.
func (s *Manager) StatFiles(ctx context.Context, owner string, ids []string, lim ContainerLimits) ([]store.File, error) {
	out := make([]store.File, 0, len(ids))
	seen := make(map[string]bool, len(ids))
	for i, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		if !store.FileKind.Valid(id) {
			return nil, &FileError{Index: i, FileID: id, Err: sandbox.ErrNotFound}
		}
		f, err := s.st.File(ctx, owner, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return nil, &FileError{Index: i, FileID: id, Err: sandbox.ErrNotFound}
		case err != nil:
			return nil, fmt.Errorf("%w: reading the file store: %w", sandbox.ErrUnavailable, err)
		case lim.FileBytes > 0 && f.Bytes > lim.FileBytes:
			return nil, &FileError{Index: i, FileID: id, Err: sandbox.ErrFileTooLarge}
		}
		out = append(out, f)
	}
	return out, nil
}

// records lists every file the store records for c: path → record.
func (s *Manager) records(ctx context.Context, c *Container) (map[string]store.ContainerFile, int64, error) {
	l, err := s.st.ListContainerFiles(ctx, c.owner, c.id, store.ContainerFileQuery{Page: store.Page{Order: store.Asc}})
	if err != nil {
		return nil, 0, fmt.Errorf("%w: reading the container's files: %w", sandbox.ErrUnavailable, err)
	}
	byPath := make(map[string]store.ContainerFile, len(l.Items))
	var total int64
	for _, f := range l.Items {
		byPath[f.Path] = f
		total += f.Bytes
	}
	return byPath, total, nil
}

// PlaceFiles copies owner's Files API files ids into c's DataDir under their own names (a name
// already taken gets "-1", "-2", ... before its extension) and records them with source "user".
// Every id is checked (StatFiles) and the limits too before anything is written; a failure
// afterwards removes what was written (when the backend can remove files) and records nothing.
func (c *Container) PlaceFiles(ctx context.Context, ids []string, lim ContainerLimits) ([]store.ContainerFile, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	s := c.s
	files, err := s.StatFiles(ctx, c.owner, ids, lim)
	if err != nil {
		return nil, err
	}
	fs, err := c.fileSystem()
	if err != nil {
		return nil, err
	}
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	defer c.unlock()
	byPath, total, err := s.records(ctx, c)
	if err != nil {
		return nil, err
	}
	taken := c.takenLocked(byPath)
	count := len(byPath)
	names := make([]string, len(files))
	for i, f := range files {
		idx := slices.Index(ids, f.ID)
		if lim.Files > 0 && count+1 > lim.Files {
			return nil, &FileError{Index: idx, FileID: f.ID, Err: ErrTooManyFiles}
		}
		if lim.TotalBytes > 0 && total+f.Bytes > lim.TotalBytes {
			return nil, &FileError{Index: idx, FileID: f.ID, Err: sandbox.ErrContainerFull}
		}
		name, err := filename.Clean(f.Filename)
		if err != nil {
			name = "file" // the Files API cleaned it at upload; a record from elsewhere may not be
		}
		names[i] = freeName(name, taken)
		taken[names[i]] = true
		count++
		total += f.Bytes
	}
	if sc, ok := fs.(sandbox.SpaceChecker); ok {
		sizes := make([]int64, len(files))
		for i, f := range files {
			sizes[i] = f.Bytes
		}
		n, err := sc.Fit(ctx, c.h, sizes)
		if err != nil {
			return nil, err
		}
		if n < len(files) {
			return nil, &FileError{Index: slices.Index(ids, files[n].ID), FileID: files[n].ID, Err: sandbox.ErrContainerFull}
		}
	}
	var written []string
	undo := func() {
		for _, name := range written {
			c.removeQuietly(ctx, fs, name)
		}
	}
	for i, f := range files {
		base, _ := filename.Clean(f.Filename)
		if base == "" {
			base = "file"
		}
		name, err := writeFree(base, names[i], taken, func(name string) (bool, error) {
			err := c.copyStored(ctx, fs, f, name)
			return errors.Is(err, sandbox.ErrNameTaken), err
		})
		if err != nil {
			undo()
			return nil, &FileError{Index: slices.Index(ids, f.ID), FileID: f.ID, Err: err}
		}
		names[i] = name
		written = append(written, name)
	}
	out := make([]store.ContainerFile, 0, len(files))
	for i, f := range files {
		rec, err := s.st.PutContainerFile(ctx, store.ContainerFile{ContainerID: c.id, Owner: c.owner,
			Path: sandbox.DataDir + "/" + names[i], Bytes: f.Bytes, Source: SourceUser, Origin: FileOrigin(f.ID)})
		if err != nil {
			undo()
			for _, r := range out {
				_ = s.st.DeleteContainerFile(context.WithoutCancel(ctx), c.owner, c.id, r.ID)
			}
			return nil, fmt.Errorf("%w: recording the container's files: %w", sandbox.ErrUnavailable, err)
		}
		out = append(out, rec)
	}
	c.baseline = nil // the next execution lists the directory first
	return out, nil
}

// copyStored writes the bytes of stored file f to name in c's DataDir.
func (c *Container) copyStored(ctx context.Context, fs sandbox.FileSystem, f store.File, name string) error {
	_, rc, err := c.s.st.OpenFile(ctx, c.owner, f.ID)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return sandbox.ErrNotFound // deleted since StatFiles
		}
		return fmt.Errorf("%w: reading file %s: %w", sandbox.ErrUnavailable, f.ID, err)
	}
	defer rc.Close()
	return fs.WriteFile(ctx, c.h, name, rc, f.Bytes)
}

// takenLocked is the set of names (relative to DataDir) that a new file must not take: the
// recorded files and those the last listing saw. runMu is held.
func (c *Container) takenLocked(byPath map[string]store.ContainerFile) map[string]bool {
	taken := make(map[string]bool, len(byPath)+len(c.baseline))
	for p := range byPath {
		taken[strings.TrimPrefix(p, sandbox.DataDir+"/")] = true
	}
	for p := range c.baseline {
		taken[p] = true
	}
	return taken
}

// removeQuietly removes name from c's DataDir when the backend can, logging a failure.
func (c *Container) removeQuietly(ctx context.Context, fs sandbox.FileSystem, name string) {
	rm, ok := fs.(sandbox.FileRemover)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.s.opts.DeleteTimeout)
	defer cancel()
	if err := rm.RemoveFile(ctx, c.h, name); err != nil {
		c.s.log.Warn("removing a container file", zap.String("container", c.id), zap.String("path", name), zap.Error(err))
	}
}

// freeName returns name, or when taken reports it used, name with "-1", "-2", ... before its
// extension, kept within filename.MaxLen bytes.
func freeName(name string, taken map[string]bool) string {
	if !taken[name] {
		return name
	}
	stem, ext := name, ""
	if i := strings.LastIndexByte(name, '.'); i > 0 {
		stem, ext = name[:i], name[i:]
	}
	for n := 1; ; n++ {
		suffix := "-" + strconv.Itoa(n) + ext
		s := stem
		for len(s)+len(suffix) > filename.MaxLen {
			_, size := utf8.DecodeLastRuneInString(s)
			s = s[:len(s)-size]
		}
		if cand := s + suffix; !taken[cand] && len(cand) <= filename.MaxLen {
			return cand
		}
	}
}

// maxNameTries bounds the names writeFree tries.
const maxNameTries = 16

// writeFree calls write with name and, while write reports the name taken and the write may be
// tried again (ErrNameTaken: a directory or link the code made, which no listing records), with
// the next name freeName gives for base; taken learns each name met. It returns the name written.
func writeFree(base, name string, taken map[string]bool, write func(name string) (again bool, err error)) (string, error) {
	for try := 1; ; try++ {
		again, err := write(name)
		if !again || try == maxNameTries {
			return name, err
		}
		taken[name] = true
		name = freeName(base, taken)
	}
}

// FileOrigin is the store.ContainerFile.Origin of a file placed from the Files API file id.
func FileOrigin(id string) string { return "file:" + id }

// DataOrigin is the store.ContainerFile.Origin of inline bytes placed under name.
func DataOrigin(name string, data []byte) string {
	h := sha256.New()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write(data)
	return "data:" + hex.EncodeToString(h.Sum(nil))
}

// AddFile writes the content of r into c's DataDir as name (cleaned by internal/filename; a name
// already taken gets a "-n" suffix) and records it with source "user" and origin ("" for an
// upload; see store.ContainerFile.Origin). Past lim.FileBytes it is ErrFileTooLarge, past what
// lim.TotalBytes leaves ErrContainerFull; then nothing is stored.
func (c *Container) AddFile(ctx context.Context, name, origin string, r io.Reader, lim ContainerLimits) (store.ContainerFile, error) {
	s := c.s
	clean, err := filename.Clean(name)
	if err != nil {
		return store.ContainerFile{}, fmt.Errorf("%w: %w", ErrInvalidFilename, err)
	}
	fs, err := c.fileSystem()
	if err != nil {
		return store.ContainerFile{}, err
	}
	if err := c.lock(ctx); err != nil {
		return store.ContainerFile{}, err
	}
	defer c.unlock()
	byPath, total, err := s.records(ctx, c)
	if err != nil {
		return store.ContainerFile{}, err
	}
	if lim.Files > 0 && len(byPath)+1 > lim.Files {
		return store.ContainerFile{}, ErrTooManyFiles
	}
	limit, byTotal := int64(unlimited), false
	if lim.FileBytes > 0 {
		limit = lim.FileBytes
	}
	if lim.TotalBytes > 0 && lim.TotalBytes-total < limit {
		limit, byTotal = max(lim.TotalBytes-total, 0), true
	}
	cr := &countingReader{r: r}
	taken := c.takenLocked(byPath)
	clean, err = writeFree(clean, freeName(clean, taken), taken, func(name string) (bool, error) {
		err := fs.WriteFile(ctx, c.h, name, cr, limit)
		// Only a write that read nothing of r can be made again under another name.
		return errors.Is(err, sandbox.ErrNameTaken) && cr.n == 0, err
	})
	if err != nil {
		if errors.Is(err, sandbox.ErrFileTooLarge) && byTotal {
			return store.ContainerFile{}, sandbox.ErrContainerFull
		}
		return store.ContainerFile{}, err
	}
	rec, err := s.st.PutContainerFile(ctx, store.ContainerFile{ContainerID: c.id, Owner: c.owner,
		Path: sandbox.DataDir + "/" + clean, Bytes: cr.n, Source: SourceUser, Origin: origin})
	if err != nil {
		c.removeQuietly(ctx, fs, clean)
		return store.ContainerFile{}, fmt.Errorf("%w: recording the container's file: %w", sandbox.ErrUnavailable, err)
	}
	c.baseline = nil
	return rec, nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// fileRecord returns owner's file fileID of container containerID. A missing file of an existing
// container wraps ErrNoSuchFile; a missing container does not.
func (s *Manager) fileRecord(ctx context.Context, owner, containerID, fileID string) (store.ContainerFile, error) {
	if !store.ContainerKind.Valid(containerID) {
		return store.ContainerFile{}, fmt.Errorf("%w: unknown container id", sandbox.ErrNotFound)
	}
	var f store.ContainerFile
	err := store.ErrNotFound
	if store.ContainerFileKind.Valid(fileID) {
		f, err = s.st.ContainerFile(ctx, owner, containerID, fileID)
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		if _, err := s.record(ctx, owner, containerID); err != nil {
			return store.ContainerFile{}, err
		}
		return store.ContainerFile{}, fmt.Errorf("%w: %w", sandbox.ErrNotFound, ErrNoSuchFile)
	case err != nil:
		return store.ContainerFile{}, fmt.Errorf("%w: reading the container's files: %w", sandbox.ErrUnavailable, err)
	}
	return f, nil
}

// useIfRunning is use that skips f for an expired container (still returning nil).
func (s *Manager) useIfRunning(ctx context.Context, owner, id string, f func(c *Container) error) error {
	if err := s.use(ctx, owner, id, f); err != nil && !errors.Is(err, ErrExpired) {
		return err
	}
	return nil
}

// Files lists the files of owner's container id by creation (an expired container's too);
// listing a running container's files is a use.
func (s *Manager) Files(ctx context.Context, owner, id string, q store.ContainerFileQuery) (store.List[store.ContainerFile], error) {
	if !store.ContainerKind.Valid(id) {
		return store.List[store.ContainerFile]{}, fmt.Errorf("%w: unknown container id", sandbox.ErrNotFound)
	}
	if err := s.useIfRunning(ctx, owner, id, func(*Container) error { return nil }); err != nil {
		return store.List[store.ContainerFile]{}, err
	}
	l, err := s.st.ListContainerFiles(ctx, owner, id, q)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return l, fmt.Errorf("%w: unknown container id", sandbox.ErrNotFound)
	case errors.Is(err, store.ErrInvalid):
		return l, err
	case err != nil:
		return l, fmt.Errorf("%w: reading the container's files: %w", sandbox.ErrUnavailable, err)
	}
	return l, nil
}

// File returns file fileID of owner's container id (an expired container's too); retrieving a
// running container's file is a use.
func (s *Manager) File(ctx context.Context, owner, id, fileID string) (store.ContainerFile, error) {
	f, err := s.fileRecord(ctx, owner, id, fileID)
	if err != nil {
		return f, err
	}
	return f, s.useIfRunning(ctx, owner, id, func(*Container) error { return nil })
}

// ReadFile copies the bytes of file fileID of owner's container id into w, at most max bytes
// (ErrFileTooLarge before anything is written when it is larger), and returns its record and the
// bytes written. The bytes are what the sandbox holds now. A file that is gone from the sandbox,
// or that its code replaced by a link or a special file, wraps ErrNoSuchFile; an expired
// container wraps ErrExpired.
func (s *Manager) ReadFile(ctx context.Context, owner, id, fileID string, w io.Writer, max int64) (store.ContainerFile, int64, error) {
	f, err := s.fileRecord(ctx, owner, id, fileID)
	if err != nil {
		return f, 0, err
	}
	var n int64
	err = s.use(ctx, owner, id, func(c *Container) error {
		fs, err := c.fileSystem()
		if err != nil {
			return err
		}
		n, err = fs.ReadFile(ctx, c.h, strings.TrimPrefix(f.Path, sandbox.DataDir+"/"), w, max)
		if errors.Is(err, sandbox.ErrNotFound) && n == 0 {
			return fmt.Errorf("%w: %w: %s is not in the container any more", sandbox.ErrNotFound, ErrNoSuchFile, f.Path)
		}
		return err
	})
	return f, n, err
}

// DeleteFile deletes file fileID of owner's container id: from the sandbox (when its backend can
// remove files and the container is running) and its record.
func (s *Manager) DeleteFile(ctx context.Context, owner, id, fileID string) error {
	f, err := s.fileRecord(ctx, owner, id, fileID)
	if err != nil {
		return err
	}
	err = s.useIfRunning(ctx, owner, id, func(c *Container) error {
		fs, err := c.fileSystem()
		if err != nil {
			return nil // nothing to remove it with: the record goes
		}
		rm, ok := fs.(sandbox.FileRemover)
		if !ok {
			return nil
		}
		if err := c.lock(ctx); err != nil {
			return err
		}
		defer c.unlock()
		rel := strings.TrimPrefix(f.Path, sandbox.DataDir+"/")
		if err := rm.RemoveFile(ctx, c.h, rel); err != nil {
			return err
		}
		delete(c.baseline, rel)
		return nil
	})
	if err != nil {
		return err
	}
	if err := s.st.DeleteContainerFile(ctx, owner, id, fileID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: deleting the container file's record: %w", sandbox.ErrUnavailable, err)
	}
	return nil
}

// Placement is one file to place into a container: a Files API file of the container's owner, or
// bytes given inline.
type Placement struct {
	Name   string // the file's name, one safe path element (filename.Clean)
	FileID string // the owner's Files API file; "" for inline bytes
	Data   []byte // the inline bytes (FileID "")
}

// Place puts files into c's DataDir, each under its name made unique against the files already
// there, records them as container files (source "user") and returns the records in the order of
// files. A file placed in c before from the same Files API id, or the same inline bytes and name,
// and still recorded, is not placed again: its record is returned (the store's records are read,
// so a file placed by another replica, or before a restart, is found too). An error about one of
// the files is a *FileError whose Index is its index in files, wrapping the reason
// (sandbox.ErrFileTooLarge, ErrContainerFull, ErrTooManyFiles, ErrNotFound for a Files API file
// gone meanwhile, ...).
func (c *Container) Place(ctx context.Context, files []Placement, lim ContainerLimits) ([]store.ContainerFile, error) {
	have, err := c.s.Files(ctx, c.owner, c.id, store.ContainerFileQuery{Page: store.Page{Order: store.Asc}})
	if err != nil {
		return nil, err
	}
	byOrigin := make(map[string]store.ContainerFile, len(have.Items))
	for _, f := range have.Items {
		if f.Origin != "" {
			byOrigin[f.Origin] = f
		}
	}
	out := make([]store.ContainerFile, len(files))
	origins := make([]string, len(files))
	var ids []string
	var idAt []int
	for i, p := range files {
		origins[i] = FileOrigin(p.FileID)
		if p.FileID == "" {
			origins[i] = DataOrigin(p.Name, p.Data)
		}
		if rec, ok := byOrigin[origins[i]]; ok {
			out[i] = rec
			continue
		}
		if p.FileID != "" {
			ids = append(ids, p.FileID)
			idAt = append(idAt, i)
		}
	}
	if len(ids) > 0 {
		recs, err := c.PlaceFiles(ctx, ids, lim)
		var fe *FileError
		switch {
		case errors.As(err, &fe) && fe.Index >= 0 && fe.Index < len(idAt):
			return nil, &FileError{Index: idAt[fe.Index], FileID: fe.FileID, Err: fe.Err}
		case err != nil:
			return nil, err
		case len(recs) != len(ids):
			return nil, fmt.Errorf("%w: %d files placed for %d ids", sandbox.ErrUnavailable, len(recs), len(ids))
		}
		for j, rec := range recs {
			out[idAt[j]] = rec
		}
	}
	for i, p := range files {
		if p.FileID != "" || out[i].ID != "" {
			continue
		}
		rec, err := c.AddFile(ctx, p.Name, origins[i], bytes.NewReader(p.Data), lim)
		if err != nil {
			return nil, &FileError{Index: i, Err: err}
		}
		out[i] = rec
	}
	return out, nil
}
