package opensandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Files in and out of /mnt/data go through execd's files API. execd runs as root and follows
// links, so nothing below /mnt/data is trusted: every directory on the way to a file and the file
// itself are looked at (GET /files/info, which reports a link as a link) before execd is asked to
// read or write there; only "file" entries are read, listings skip links and special files. What
// a link could reach is the sandbox container's own file system, never the proxy's; between the
// check and the transfer the code could swap a directory for a link, which its code, root in the
// same container, could have used anyway.

const (
	// listDepth is how many directory levels below /mnt/data a listing looks into.
	listDepth = 32
	// entryBudget is the most bytes one listed entry may take in the answer; examinedPerFile how
	// many entries of any kind a listing examines per file it may return.
	entryBudget     = 16 << 10
	examinedPerFile = 4
	examinedSlack   = 1024
	// uploadPrefix names the temporary file an upload goes to before it is moved into place.
	uploadPrefix = ".ciproxy-upload-"
)

// fileInfo is execd's FileInfo, as far as the client reads it.
type fileInfo struct {
	Path       string `json:"path"`
	Type       string `json:"type"`
	Size       int64  `json:"size"`
	ModifiedAt string `json:"modified_at"`
}

// dataPath turns a path relative to /mnt/data into the absolute one execd gets. execd expands "~"
// and "$VAR", so neither may appear.
func dataPath(rel string) (string, error) {
	if rel == "" || strings.HasPrefix(rel, "/") || strings.ContainsAny(rel, "\x00$~") {
		return "", fmt.Errorf("opensandbox: %q is not a path relative to %s", rel, sandbox.DataDir)
	}
	for _, el := range strings.Split(rel, "/") {
		if el == "" || el == "." || el == ".." {
			return "", fmt.Errorf("opensandbox: %q is not a clean path relative to %s", rel, sandbox.DataDir)
		}
	}
	return sandbox.DataDir + "/" + rel, nil
}

// info returns execd's entry for the absolute path full (a link reported as one); a missing path
// is ErrNotFound with missing true.
func (p *Provider) info(ctx context.Context, h sandbox.Handle, full string) (fi fileInfo, missing bool, err error) {
	raw, err := p.execdJSON(ctx, h, "stat", http.MethodGet, "/files/info?"+url.Values{"path": {full}}.Encode(), nil)
	if err != nil {
		return fileInfo{}, missingPath(err), err
	}
	v := gjson.GetBytes(raw, gjson.Escape(full))
	if !v.IsObject() {
		return fileInfo{}, false, fmt.Errorf("%w: opensandbox stat: the answer does not describe %s", sandbox.ErrUnavailable, full)
	}
	if err := json.Unmarshal([]byte(v.Raw), &fi); err != nil {
		return fileInfo{}, false, fmt.Errorf("%w: opensandbox stat: %w", sandbox.ErrUnavailable, err)
	}
	return fi, false, nil
}

// missingPath reports whether err is execd's word that a path does not exist, not the gateway's
// that the sandbox does not.
func missingPath(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.StatusCode == http.StatusNotFound && strings.Contains(e.Message, "FILE_NOT_FOUND")
}

// checkDirs checks that every directory from /mnt/data down to full's parent that exists is a
// directory, not a link or a file; it stops at the first that does not exist.
func (p *Provider) checkDirs(ctx context.Context, h sandbox.Handle, rel, full string) error {
	dirs := []string{sandbox.DataDir}
	for d := path.Dir(full); d != sandbox.DataDir; d = path.Dir(d) {
		dirs = append(dirs, "")
		copy(dirs[2:], dirs[1:])
		dirs[1] = d
	}
	for _, d := range dirs {
		fi, missing, err := p.info(ctx, h, d)
		if missing {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.Type != "directory" {
			return fmt.Errorf("%w: %s is reached through %s, which is not a directory (%s)", sandbox.ErrNotFound, rel, d, fi.Type)
		}
	}
	return nil
}

// WriteFile implements [sandbox.FileSystem.WriteFile]: the bytes are uploaded to a hidden
// temporary file beside the target and moved into place once complete, so that a file past max or
// a source that fails leaves nothing at path.
func (p *Provider) WriteFile(ctx context.Context, h sandbox.Handle, rel string, r io.Reader, max int64) error {
	full, err := dataPath(rel)
	if err != nil {
		return err
	}
	if err := p.checkDirs(ctx, h, rel, full); err != nil {
		if errors.Is(err, sandbox.ErrNotFound) && !gone(err) {
			return fmt.Errorf("%w: %w", sandbox.ErrNameTaken, err)
		}
		return err
	}
	fi, missing, err := p.info(ctx, h, full)
	switch {
	case err == nil && fi.Type != "file":
		return fmt.Errorf("%w: %s", sandbox.ErrNameTaken, rel)
	case err != nil && !missing:
		return err
	}
	tmp := path.Dir(full) + "/" + uploadPrefix + randomHex(8)
	src := sandbox.NewCappedReader(r, max)
	err = p.upload(ctx, h, tmp, src)
	switch {
	case err == nil && src.Over():
		err = fmt.Errorf("%w: %s is larger than %d bytes", sandbox.ErrFileTooLarge, rel, max)
	case err == nil && src.Err() != nil:
		err = fmt.Errorf("opensandbox write file: reading %s: %w", rel, src.Err())
	case err == nil:
		if !missing {
			// execd's move refuses an existing destination.
			_, err = p.execdJSON(ctx, h, "remove", http.MethodDelete, "/files?"+url.Values{"path": {full}}.Encode(), nil)
		}
		if err == nil {
			_, err = p.execdJSON(ctx, h, "move", http.MethodPost, "/files/mv", []map[string]string{{"src": tmp, "dest": full}})
		}
	}
	if err != nil {
		p.removeQuietly(ctx, h, tmp)
	}
	return err
}

// upload streams r to dest as execd's multipart POST /files/upload: a metadata part (sent as a
// file part, which execd requires) and the file part, mode 644.
func (p *Provider) upload(ctx context.Context, h sandbox.Handle, dest string, r io.Reader) error {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	written := make(chan struct{})
	go func() {
		defer close(written)
		meta, err := json.Marshal(map[string]any{"path": dest, "mode": 644})
		var part io.Writer
		if err == nil {
			hdr := textproto.MIMEHeader{}
			hdr.Set("Content-Disposition", `form-data; name="metadata"; filename="metadata"`)
			hdr.Set("Content-Type", "application/json")
			part, err = mw.CreatePart(hdr)
		}
		if err == nil {
			_, err = part.Write(meta)
		}
		if err == nil {
			part, err = mw.CreateFormFile("file", path.Base(dest))
		}
		if err == nil {
			_, err = io.Copy(part, r)
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err) // nil: EOF
	}()
	defer func() {
		pr.Close() // unblocks the writer if the request ended before the body
		<-written
	}()
	resp, err := p.execd(ctx, h, "upload", http.MethodPost, "/files/upload", pr, mw.FormDataContentType())
	if err != nil {
		var e *APIError
		if errors.As(err, &e) && strings.Contains(strings.ToLower(e.Message), "no space left") {
			return fmt.Errorf("%w: %w", sandbox.ErrContainerFull, err)
		}
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, errBodyLimit))
	return nil
}

// ReadFile implements [sandbox.FileSystem.ReadFile]. Only a "file" entry reached through real
// directories is downloaded, bounded by RequestTimeout (a special file swapped in would block).
func (p *Provider) ReadFile(ctx context.Context, h sandbox.Handle, rel string, w io.Writer, max int64) (int64, error) {
	full, err := dataPath(rel)
	if err != nil {
		return 0, err
	}
	if err := p.checkDirs(ctx, h, rel, full); err != nil {
		return 0, err
	}
	fi, _, err := p.info(ctx, h, full)
	if err != nil {
		return 0, err
	}
	if fi.Type != "file" {
		return 0, fmt.Errorf("%w: %s is not a regular file (%s)", sandbox.ErrNotFound, rel, fi.Type)
	}
	if fi.Size < 0 || fi.Size > max {
		return 0, fmt.Errorf("%w: %s is larger than %d bytes", sandbox.ErrFileTooLarge, rel, max)
	}
	dctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	resp, err := p.execd(dctx, h, "read file", http.MethodGet, "/files/download?"+url.Values{"path": {full}}.Encode(), nil, "")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.ContentLength > max {
		return 0, fmt.Errorf("%w: %s is larger than %d bytes", sandbox.ErrFileTooLarge, rel, max)
	}
	n, err := io.Copy(w, io.LimitReader(resp.Body, max))
	if err != nil {
		return n, p.transportError(dctx, "read file", err)
	}
	if m, _ := resp.Body.Read(make([]byte, 1)); m > 0 {
		return n, fmt.Errorf("%w: %s grew past %d bytes while it was read", sandbox.ErrFileTooLarge, rel, max)
	}
	return n, nil
}

// ListFiles implements [sandbox.FileSystem.ListFiles] with GET /directories/list of /mnt/data
// (links are listed as links, never descended into), decoded entry by entry under a byte budget.
func (p *Provider) ListFiles(ctx context.Context, h sandbox.Handle, limit int) (sandbox.Listing, error) {
	var out sandbox.Listing
	if limit <= 0 {
		return out, nil
	}
	root, missing, err := p.info(ctx, h, sandbox.DataDir)
	if missing {
		return out, nil
	}
	if err != nil {
		return out, err
	}
	if root.Type != "directory" {
		out.Skipped = 1
		return out, nil
	}
	lctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	q := url.Values{"path": {sandbox.DataDir}, "depth": {fmt.Sprint(listDepth)}}
	resp, err := p.execd(lctx, h, "list files", http.MethodGet, "/directories/list?"+q.Encode(), nil, "")
	if missingPath(err) {
		return out, nil
	}
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	maxExamined := limit*examinedPerFile + examinedSlack
	budget := &capReader{r: resp.Body, max: int64(maxExamined) * entryBudget}
	dec := json.NewDecoder(budget)
	err = expectDelim(dec, '[')
	examined := 0
	for err == nil && dec.More() {
		var e fileInfo
		if err = dec.Decode(&e); err != nil {
			break
		}
		if examined++; examined > maxExamined {
			out.Truncated = true
			break
		}
		rel, ok := strings.CutPrefix(e.Path, sandbox.DataDir+"/")
		switch {
		case ok && e.Type == "directory":
			continue
		case ok && strings.HasPrefix(path.Base(rel), uploadPrefix):
			continue // an upload of ours in flight
		}
		if _, perr := dataPath(rel); !ok || perr != nil || e.Type != "file" || e.Size < 0 {
			out.Skipped++
			continue
		}
		if len(out.Files) == limit {
			out.Truncated = true
			break
		}
		mod, _ := time.Parse(time.RFC3339Nano, e.ModifiedAt)
		out.Files = append(out.Files, sandbox.FileInfo{Path: rel, Size: e.Size, ModTime: mod})
	}
	if budget.over {
		out.Truncated = true
		return out, nil
	}
	if err != nil {
		return out, p.transportError(lctx, "list files", fmt.Errorf("decoding the listing: %w", err))
	}
	return out, nil
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("expected %q, got %v", want, tok)
	}
	return nil
}

var _ sandbox.FileRemover = (*Provider)(nil)

// RemoveFile implements [sandbox.FileRemover] with execd's DELETE /files, which removes a link
// itself and ignores a missing path.
func (p *Provider) RemoveFile(ctx context.Context, h sandbox.Handle, rel string) error {
	full, err := dataPath(rel)
	if err != nil {
		return err
	}
	_, err = p.execdJSON(ctx, h, "remove", http.MethodDelete, "/files?"+url.Values{"path": {full}}.Encode(), nil)
	if missingPath(err) {
		return nil
	}
	return err
}

// removeQuietly removes what a failed write left, even once ctx has ended.
func (p *Provider) removeQuietly(ctx context.Context, h sandbox.Handle, full string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.RequestTimeout)
	defer cancel()
	_, _ = p.execdJSON(ctx, h, "remove", http.MethodDelete, "/files?"+url.Values{"path": {full}}.Encode(), nil)
}

// capReader fails once more than max bytes were read from r.
type capReader struct {
	r    io.Reader
	max  int64
	n    int64
	over bool
}

var errOverCap = errors.New("over the size limit")

func (c *capReader) Read(b []byte) (int, error) {
	if c.over {
		return 0, errOverCap
	}
	if room := c.max - c.n; room < int64(len(b))-1 {
		b = b[:room+1]
	}
	n, err := c.r.Read(b)
	c.n += int64(n)
	if c.n > c.max {
		c.over = true
		return 0, errOverCap
	}
	return n, err
}
