package containers

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

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
