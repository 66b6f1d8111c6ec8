package embedded

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
)

// Directories below the data directory. Every name inside them is an id that passed store.SafeID, so
// no caller-supplied string ever becomes more than one path element.
const (
	dirTmp        = "tmp"        // uploads and records being written; emptied at Open
	dirBlobs      = "blobs"      // file bytes, named by file id
	dirFiles      = "files"      // file metadata, <id>.json
	dirContainers = "containers" // container records, <id>.json
	dirCFiles     = "cfiles"     // container file records, <id>.json
	dirResponses  = "responses"  // stored responses, <id>.json
	dirCalls      = "calls"      // code_interpreter_call records, <id>.json
	dirCorrupt    = "corrupt"    // records that could not be read, moved aside for an operator

	lockFile   = "LOCK"
	formatFile = "FORMAT"
	formatText = "ciproxy-store 1\n"

	dirMode  = 0o700
	fileMode = 0o600
)

var allDirs = []string{dirTmp, dirBlobs, dirFiles, dirContainers, dirCFiles, dirResponses, dirCalls, dirCorrupt}

// durability says whether a write must reach the disk before it returns (fsync of the file and of
// its directory) or only the kernel (it then survives the process, not a power cut).
type durability bool

const (
	synced durability = true
	cached durability = false
)

// writeAtomic writes data to dir/name so that a reader sees either the old content or the new,
// never a mix: the bytes go to a temporary file in tmp/ (same file system), then rename replaces
// the target. mtime, when not zero, becomes the file's modification time (the sweeper reads it).
func (s *Store) writeAtomic(dir, name string, data []byte, d durability, mtime time.Time) error {
	f, err := os.CreateTemp(s.path(dirTmp), "rec-*")
	if err != nil {
		return fmt.Errorf("embedded store: %w", err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("embedded store: writing %s: %w", name, err)
	}
	if d == synced {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("embedded store: syncing %s: %w", name, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("embedded store: writing %s: %w", name, err)
	}
	if !mtime.IsZero() {
		if err := os.Chtimes(tmp, mtime, mtime); err != nil {
			return fmt.Errorf("embedded store: %w", err)
		}
	}
	if err := os.Rename(tmp, filepath.Join(s.path(dir), name)); err != nil {
		return fmt.Errorf("embedded store: %w", err)
	}
	ok = true
	if d == synced {
		return s.syncDir(dir)
	}
	return nil
}

// writeRecord encodes v as JSON and writes it to dir/<id>.json.
func (s *Store) writeRecord(dir, id string, v any, d durability, mtime time.Time) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("%w: encoding %s: %w", errInvalid, id, err)
	}
	return s.writeAtomic(dir, id+".json", b, d, mtime)
}

// readRecord decodes dir/<id>.json into v. A missing file is fs.ErrNotExist.
func (s *Store) readRecord(dir, id string, v any) error {
	b, err := os.ReadFile(filepath.Join(s.path(dir), id+".json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("embedded store: %s/%s.json: %w", dir, id, err)
	}
	return nil
}

// removeRecord deletes dir/<id>.json; a file already gone is not an error.
func (s *Store) removeRecord(dir, id string, d durability) error {
	return s.remove(dir, id+".json", d)
}

func (s *Store) remove(dir, name string, d durability) error {
	err := os.Remove(filepath.Join(s.path(dir), name))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("embedded store: %w", err)
	}
	if d == synced {
		return s.syncDir(dir)
	}
	return nil
}

// syncDir makes the renames and removals in dir durable.
func (s *Store) syncDir(dir string) error {
	f, err := os.Open(s.path(dir))
	if err != nil {
		return fmt.Errorf("embedded store: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("embedded store: syncing %s: %w", dir, err)
	}
	return nil
}

// quarantine moves a record that cannot be read to corrupt/, where an operator can look at it,
// instead of failing the whole store or deleting what may be recoverable.
func (s *Store) quarantine(dir, name string, cause error) {
	err := os.Rename(filepath.Join(s.path(dir), name), filepath.Join(s.path(dirCorrupt), dir+"-"+name))
	s.logf("embedded store: moved %s/%s to %s/ (%v; move failed: %v)", dir, name, dirCorrupt, cause, err)
}

func (s *Store) path(elem ...string) string {
	return filepath.Join(append([]string{s.dir}, elem...)...)
}

// records lists the ids of dir's records (<id>.json with a safe id); other names are skipped.
func (s *Store) records(dir string) ([]string, error) {
	entries, err := os.ReadDir(s.path(dir))
	if err != nil {
		return nil, fmt.Errorf("embedded store: %w", err)
	}
	var ids []string
	for _, e := range entries {
		id, ok := cutJSON(e.Name())
		if ok && e.Type().IsRegular() {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func cutJSON(name string) (string, bool) {
	if len(name) <= 5 || name[len(name)-5:] != ".json" {
		return "", false
	}
	id := name[:len(name)-5]
	return id, store.SafeID(id)
}
