package sandbox

import (
	"context"
	"errors"
	"io"
	"time"
)

// DataDir is where a sandbox's files live, as in OpenAI's containers: code reads its inputs there
// and what it writes there becomes container files.
const DataDir = "/mnt/data"

// ErrFileTooLarge: a file is larger than the caller allowed. Nothing was stored or returned.
var ErrFileTooLarge = errors.New("file too large")

// ErrContainerFull: a container's files would take more than its storage limit: its DataDir is full,
// or, in internal/containers, more than ContainerLimits.TotalBytes.
var ErrContainerFull = errors.New("the container's files would exceed its storage limit")

// ErrNameTaken: something that is not a regular file (a directory, a link the sandbox's code
// made) holds the path a file was to be written to. Nothing was written.
var ErrNameTaken = errors.New("the name is taken in the sandbox")

// ErrFileBusy: the sandbox holds a file in a way that refuses the access for now (a lease its
// code took); the backend tried a few times and gave up rather than wait on the sandbox.
var ErrFileBusy = errors.New("file busy in the sandbox")

// FileSystem moves files in and out of a sandbox's DataDir. Providers implement it beside Provider;
// it is safe for concurrent use.
//
// Paths are relative to DataDir and slash-separated. Callers sanitise them first (no "..", no NUL,
// no leading "/", no empty element); implementations refuse anything else all the same.
//
// Everything below DataDir was made by sandboxed code and is hostile: implementations never follow
// a symbolic link, never open a device, FIFO or socket, and never count a hard link to a file
// outside DataDir as the file's content. Such entries are skipped by ListFiles and are ErrNotFound
// for ReadFile.
type FileSystem interface {
	// WriteFile creates or replaces the regular file at path (creating missing parent
	// directories) with the content of r, at most max bytes: past max it fails with
	// ErrFileTooLarge and leaves no partial file. When something other than a regular file is at
	// path it fails with ErrNameTaken before reading r; when DataDir is full, with
	// ErrContainerFull.
	WriteFile(ctx context.Context, h Handle, path string, r io.Reader, max int64) error
	// ReadFile copies the regular file at path into w and returns the bytes written. A file larger
	// than max is ErrFileTooLarge before anything is written; a missing file, a link or a special
	// file is ErrNotFound; a file the sandbox keeps busy is ErrFileBusy, never a wait.
	ReadFile(ctx context.Context, h Handle, path string, w io.Writer, max int64) (int64, error)
	// ListFiles lists the regular files below DataDir, recursively, in no particular order. It
	// stops after limit entries and reports Truncated; entries it cannot measure safely are
	// skipped and counted in Skipped.
	ListFiles(ctx context.Context, h Handle, limit int) (Listing, error)
}

// FileRemover is implemented by FileSystems that can remove a file below DataDir, so that deleting
// a container file removes it from the sandbox too, and a placement that fails removes what it had
// written. Removing a missing file is not an error; a link is removed itself, never followed.
type FileRemover interface {
	RemoveFile(ctx context.Context, h Handle, path string) error
}

// SpaceChecker is implemented by FileSystems that can tell before writing whether files fit in
// DataDir, as it is now (what the code wrote counts).
type SpaceChecker interface {
	// Fit returns how many of files of these sizes, taken in order, DataDir can take.
	Fit(ctx context.Context, h Handle, sizes []int64) (int, error)
}

// Listing is what ListFiles found.
type Listing struct {
	Files     []FileInfo
	Truncated bool // more than limit entries exist
	Skipped   int  // links, special files, and entries that could not be measured
}

// FileInfo describes one regular file below DataDir.
type FileInfo struct {
	Path    string // relative to DataDir, slash-separated
	Size    int64
	ModTime time.Time
}
