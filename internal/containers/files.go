package containers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
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

// Outputs is what an execution left under DataDir.
type Outputs struct {
	// Files were created or changed; each is now recorded with source "assistant" (a changed file
	// keeps its id).
	Files []store.ContainerFile
	// Skipped are the paths (relative to DataDir) of files created or changed that were not
	// recorded, because they were over a ContainerLimits limit.
	Skipped []string
}

// fileStamp is what tells a file changed: its size and modification time.
type fileStamp struct {
	size int64
	mod  time.Time
}

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

// Execute runs code (as Run) and then records the files it created or changed under DataDir as
// container files with source "assistant" (see CollectFiles), all under one hold of the run lock,
// so that no other execution's files are mistaken for this one's. When the container's files are
// unknown (opened from its record, or after files were placed), DataDir is listed before the run.
//
// res and err are Run's. When only the collection failed, err wraps ErrCollect and res is the
// execution's. A backend that cannot list files collects nothing.
func (c *Container) Execute(ctx context.Context, code string, opts sandbox.RunOptions, lim ContainerLimits) (sandbox.Result, Outputs, error) {
	if err := c.lock(ctx); err != nil {
		return sandbox.Result{}, Outputs{}, err
	}
	defer c.unlock()
	fs, fsErr := c.fileSystem()
	if fsErr == nil && c.baseline == nil {
		if l, err := fs.ListFiles(ctx, c.h, maxListed); err == nil {
			c.baseline = stamps(l)
		}
	}
	res, err := c.runLocked(ctx, code, opts)
	if err != nil || fsErr != nil {
		return res, Outputs{}, err
	}
	c.saveFigures(ctx, fs, res, lim)
	out, err := c.collectLocked(ctx, fs, lim)
	if err != nil {
		return res, out, fmt.Errorf("%w: %w", ErrCollect, err)
	}
	return res, out, nil
}

// saveFigures writes each image the execution displayed (a matplotlib figure, an
// IPython.display image) into DataDir as <cfile id>.<ext>, so that it becomes a container file as
// in OpenAI's containers, where a figure the text does not link is cited as "cfile_….png". The
// collection that follows records it under that id. Only ids minted here are honoured: a file code
// names cfile_….png itself gets an id of its own. A figure that cannot be written (limits, a full
// /mnt/data) stays an image output only.
func (c *Container) saveFigures(ctx context.Context, fs sandbox.FileSystem, res sandbox.Result, lim ContainerLimits) {
	c.figures = nil
	for _, o := range res.Results {
		ext, data := ".png", o.PNG
		if data == "" {
			ext, data = ".jpeg", o.JPEG
		}
		if data == "" {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(data)
		if err != nil || (lim.FileBytes > 0 && int64(len(b)) > lim.FileBytes) {
			continue
		}
		id := c.s.st.NewID(store.ContainerFileKind)
		name := id + ext
		if fs.WriteFile(ctx, c.h, name, bytes.NewReader(b), int64(len(b))) != nil {
			continue
		}
		if c.figures == nil {
			c.figures = make(map[string]string)
		}
		c.figures[name] = id
	}
}

// CollectFiles lists DataDir and records every regular file created or changed (size or
// modification time) since the last listing as a container file with source "assistant"; a
// recorded file that is gone loses its record. Hidden files (a path element starting with ".")
// are left out, and so are files over lim (in Outputs.Skipped). A container whose files are
// unknown takes this listing as the baseline and reports nothing. Listing is bounded (10000
// files); nothing but the listing is done when nothing changed.
func (c *Container) CollectFiles(ctx context.Context, lim ContainerLimits) (Outputs, error) {
	fs, err := c.fileSystem()
	if err != nil {
		return Outputs{}, err
	}
	if err := c.lock(ctx); err != nil {
		return Outputs{}, err
	}
	defer c.unlock()
	return c.collectLocked(ctx, fs, lim)
}

// stamps is the baseline a listing gives, hidden files left out.
func stamps(l sandbox.Listing) map[string]fileStamp {
	m := make(map[string]fileStamp, len(l.Files))
	for _, f := range l.Files {
		if !hidden(f.Path) {
			m[f.Path] = fileStamp{f.Size, f.ModTime}
		}
	}
	return m
}

// hidden reports whether a path relative to DataDir has an element starting with ".".
func hidden(p string) bool {
	return strings.HasPrefix(p, ".") || strings.Contains(p, "/.")
}

func (c *Container) collectLocked(ctx context.Context, fs sandbox.FileSystem, lim ContainerLimits) (Outputs, error) {
	l, err := fs.ListFiles(ctx, c.h, maxListed)
	if err != nil {
		if errors.Is(err, sandbox.ErrNotFound) {
			c.s.dropGone(ctx, c)
		}
		return Outputs{}, err
	}
	now := stamps(l)
	prev := c.baseline
	if prev == nil {
		c.baseline = now
		return Outputs{}, nil
	}
	var changed []sandbox.FileInfo
	for _, f := range l.Files {
		if old, ok := prev[f.Path]; !hidden(f.Path) && (!ok || old.size != f.Size || !old.mod.Equal(f.ModTime)) {
			changed = append(changed, f)
		}
	}
	var vanished []string
	if !l.Truncated {
		for p := range prev {
			if _, ok := now[p]; !ok {
				vanished = append(vanished, p)
			}
		}
	}
	if len(changed) == 0 && len(vanished) == 0 {
		c.baseline = now
		return Outputs{}, nil
	}
	out, err := c.recordChanges(ctx, changed, vanished, lim)
	if err != nil {
		return out, err // the baseline stays: the next collection records these changes again
	}
	c.baseline = now
	return out, nil
}

// recordChanges records files created or changed and forgets the records of files gone.
func (c *Container) recordChanges(ctx context.Context, changed []sandbox.FileInfo, vanished []string, lim ContainerLimits) (Outputs, error) {
	s := c.s
	byPath, total, err := s.records(ctx, c)
	if err != nil {
		return Outputs{}, err
	}
	count := len(byPath)
	for _, p := range vanished {
		if r, ok := byPath[sandbox.DataDir+"/"+p]; ok {
			if err := s.st.DeleteContainerFile(ctx, c.owner, c.id, r.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
				return Outputs{}, fmt.Errorf("%w: forgetting a container file: %w", sandbox.ErrUnavailable, err)
			}
			count--
			total -= r.Bytes
		}
	}
	slices.SortFunc(changed, func(a, b sandbox.FileInfo) int { return strings.Compare(a.Path, b.Path) })
	var out Outputs
	for _, f := range changed {
		full := sandbox.DataDir + "/" + path.Clean(f.Path)
		old, had := byPath[full]
		grow := f.Size - old.Bytes
		if (lim.FileBytes > 0 && f.Size > lim.FileBytes) ||
			(!had && lim.Files > 0 && count+1 > lim.Files) ||
			(lim.TotalBytes > 0 && total+grow > lim.TotalBytes) {
			out.Skipped = append(out.Skipped, f.Path)
			if had {
				// Its record would announce a size and bytes the download refuses: not available.
				if err := s.st.DeleteContainerFile(ctx, c.owner, c.id, old.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
					return out, fmt.Errorf("%w: forgetting a container file: %w", sandbox.ErrUnavailable, err)
				}
				count--
				total -= old.Bytes
			}
			continue
		}
		rec := store.ContainerFile{ContainerID: c.id, Owner: c.owner, Path: full, Bytes: f.Size, Source: SourceAssistant}
		if had {
			rec.ID, rec.CreatedAt = old.ID, old.CreatedAt
		} else if id, ok := c.figures[f.Path]; ok {
			rec.ID = id // a figure saveFigures wrote: its name is its id
		}
		rec, err := s.st.PutContainerFile(ctx, rec)
		if err != nil {
			return out, fmt.Errorf("%w: recording a container file: %w", sandbox.ErrUnavailable, err)
		}
		out.Files = append(out.Files, rec)
		if !had {
			count++
		}
		total += grow
	}
	return out, nil
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
