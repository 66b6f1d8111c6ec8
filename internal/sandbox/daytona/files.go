package daytona

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Files in and out of /mnt/data go through the toolbox's files API (upload, download, move,
// delete), as Daytona's SDKs move them. That API runs as root inside the sandbox and follows
// links, and its listings and file information stat through them, so they cannot tell a link
// from its target: everything the sandbox's code made is examined first with find(1) and test(1)
// through the toolbox's process/execute, which do not follow links:
//   - a path is used only when every directory on the way below /mnt/data is a directory and not
//     a link, and the file itself is a regular file (not a link, FIFO, socket or device) with one
//     link (a hard link could be a file from outside /mnt/data);
//   - sizes are only hints: ReadFile stops at max bytes whatever was announced, and downloads
//     have a deadline (a file swapped for a FIFO would block the daemon);
//   - a listing is produced in the sandbox, cut there to a byte budget, so a tree of a million
//     entries costs what limit asks for.
//
// What a link can reach is the sandbox's own file system, never the proxy's host. Between a check
// and the transfer the code could swap a file for a link; the transfer then reaches what the link
// points to inside the sandbox, which the code could have copied there anyway.

var (
	_ sandbox.FileSystem  = (*Provider)(nil)
	_ sandbox.FileRemover = (*Provider)(nil)
)

const (
	// uploadPrefix names the temporary file an upload goes to before it is moved into place.
	uploadPrefix = ".ciproxy-upload-"
	// listDepth is how many directory levels below /mnt/data a listing looks into.
	listDepth = 32
	// entryBytes is the budget of one listed entry, examinedPerFile how many entries of any kind a
	// listing examines per file it may return.
	entryBytes      = 512
	examinedPerFile = 4
	examinedSlack   = 1024
	maxListBytes    = 4 << 20
)

// dataPath turns a path relative to /mnt/data into the absolute one. Callers sanitise paths
// first; anything else is refused all the same.
func dataPath(rel string) (string, error) {
	if rel == "" || strings.HasPrefix(rel, "/") || strings.ContainsRune(rel, 0) || strings.ContainsRune(rel, '\n') {
		return "", fmt.Errorf("daytona: %q is not a path relative to %s", rel, sandbox.DataDir)
	}
	for _, el := range strings.Split(rel, "/") {
		if el == "" || el == "." || el == ".." {
			return "", fmt.Errorf("daytona: %q is not a clean path relative to %s", rel, sandbox.DataDir)
		}
	}
	return sandbox.DataDir + "/" + rel, nil
}

// quote quotes s for a POSIX shell.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// parents returns /mnt/data and every directory between it and full, quoted.
func parents(full string) string {
	var dirs []string
	for d := path.Dir(full); ; d = path.Dir(d) {
		dirs = append([]string{quote(d)}, dirs...)
		if d == sandbox.DataDir || d == "/" {
			break
		}
	}
	return strings.Join(dirs, " ")
}

// execute runs a short command in the sandbox with the toolbox's process/execute (its output is
// stdout and stderr merged) and returns its exit code and output, at most limit bytes of answer.
func (p *Provider) execute(ctx context.Context, h sandbox.Handle, b *box, op, command string, limit int64) (int, string, error) {
	body, err := json.Marshal(map[string]any{"command": command, "timeout": seconds(p.opts.RequestTimeout)})
	if err != nil {
		return 0, "", fmt.Errorf("daytona %s: %w", op, err)
	}
	raw, _, err := p.do(ctx, op, http.MethodPost, b.toolbox+"/process/execute", body, "application/json", limit, toolboxError)
	if err != nil {
		return 0, "", p.gone(ctx, h, err)
	}
	if !gjson.ValidBytes(raw) {
		return 0, "", fmt.Errorf("%w: daytona %s: the answer is not JSON", sandbox.ErrUnavailable, op)
	}
	r := gjson.ParseBytes(raw)
	return int(r.Get("exitCode").Int()), r.Get("result").String(), nil
}

// check examines the way to full: "bad" when a directory on it is not one (or is a link), "taken"
// when something other than a regular file of one link is at full, "absent" when nothing is,
// else "f <size>".
func (p *Provider) check(ctx context.Context, h sandbox.Handle, b *box, op, full string) (string, error) {
	cmd := "for d in " + parents(full) + `; do if [ -L "$d" ]; then echo bad; exit 0; fi; if [ -e "$d" ] && [ ! -d "$d" ]; then echo bad; exit 0; fi; done; ` +
		"t=" + quote(full) + `; if [ -L "$t" ]; then echo taken; elif [ ! -e "$t" ]; then echo absent; elif [ ! -f "$t" ]; then echo taken; ` +
		`else find "$t" -maxdepth 0 -printf '%y %n %s\n' 2>/dev/null || echo taken; fi`
	_, out, err := p.execute(ctx, h, b, op, cmd, answerLimit)
	if err != nil {
		return "", err
	}
	out = strings.TrimSpace(out)
	if rest, ok := strings.CutPrefix(out, "f "); ok {
		n, size, _ := strings.Cut(rest, " ")
		if n != "1" {
			return "taken", nil
		}
		if _, err := strconv.ParseInt(size, 10, 64); err != nil {
			return "taken", nil
		}
		return "f " + size, nil
	}
	switch out {
	case "bad", "taken", "absent":
		return out, nil
	}
	if strings.HasPrefix(out, "d ") || strings.HasPrefix(out, "l ") || strings.HasPrefix(out, "p ") {
		return "taken", nil
	}
	return "", fmt.Errorf("%w: daytona %s: unexpected answer of the sandbox's shell: %.100q", sandbox.ErrUnavailable, op, out)
}

// WriteFile implements [sandbox.FileSystem.WriteFile]: the bytes go to a temporary file beside
// the target, which is moved into place once complete, so that a file past max or a source that
// fails leaves no partial file at path.
func (p *Provider) WriteFile(ctx context.Context, h sandbox.Handle, rel string, r io.Reader, max int64) error {
	full, err := dataPath(rel)
	if err != nil {
		return err
	}
	b, err := p.lookup(ctx, h)
	if err != nil {
		return err
	}
	switch st, err := p.check(ctx, h, b, "write file", full); {
	case err != nil:
		return err
	case st == "bad" || st == "taken":
		return fmt.Errorf("%w: %s", sandbox.ErrNameTaken, rel)
	}
	tmp := path.Dir(full) + "/" + uploadPrefix + randomHex(8)
	src := sandbox.NewCappedReader(r, max)
	err = p.upload(ctx, h, b, tmp, src)
	switch {
	case err == nil && src.Over():
		err = fmt.Errorf("%w: %s is larger than %d bytes", sandbox.ErrFileTooLarge, rel, max)
	case err == nil && src.Err() != nil:
		err = fmt.Errorf("daytona write file: reading %s: %w", rel, src.Err())
	case err == nil:
		_, err = p.toolbox(ctx, b, "move", http.MethodPost, "/files/move?"+url.Values{"source": {tmp}, "destination": {full}}.Encode(), nil, "")
		err = p.gone(ctx, h, err)
	}
	if err != nil {
		p.removeQuietly(ctx, b, tmp)
	}
	return err
}

// upload streams r to dest as the multipart POST /files/upload the SDKs send.
func (p *Provider) upload(ctx context.Context, h sandbox.Handle, b *box, dest string, r io.Reader) error {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	written := make(chan struct{})
	go func() {
		defer close(written)
		fw, err := mw.CreateFormFile("file", path.Base(dest))
		if err == nil {
			_, err = io.Copy(fw, r)
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	defer func() {
		pr.Close()
		<-written
	}()
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.toolbox+"/files/upload?"+url.Values{"path": {dest}}.Encode(), pr)
	if err != nil {
		return fmt.Errorf("%w: daytona upload: %w", sandbox.ErrUnavailable, err)
	}
	p.headers(req.Header)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := p.client.Do(req)
	if err != nil {
		return p.gone(ctx, h, p.transportError(ctx, "upload", err))
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, errBodyLimit))
		e := toolboxError("upload", resp.StatusCode, raw, resp.Header)
		e.Message = scrub(e.Message, p.opts.APIKey)
		if strings.Contains(strings.ToLower(e.Message), "no space left") {
			e.kind = sandbox.ErrContainerFull
		}
		return p.gone(ctx, h, e)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, errBodyLimit))
	return nil
}

// ReadFile implements [sandbox.FileSystem.ReadFile].
func (p *Provider) ReadFile(ctx context.Context, h sandbox.Handle, rel string, w io.Writer, max int64) (int64, error) {
	full, err := dataPath(rel)
	if err != nil {
		return 0, err
	}
	b, err := p.lookup(ctx, h)
	if err != nil {
		return 0, err
	}
	st, err := p.check(ctx, h, b, "read file", full)
	if err != nil {
		return 0, err
	}
	size, ok := strings.CutPrefix(st, "f ")
	if !ok {
		return 0, fmt.Errorf("%w: %s is not a regular file in %s", sandbox.ErrNotFound, rel, sandbox.DataDir)
	}
	if n, _ := strconv.ParseInt(size, 10, 64); n > max {
		return 0, fmt.Errorf("%w: %s is larger than %d bytes", sandbox.ErrFileTooLarge, rel, max)
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.toolbox+"/files/download?"+url.Values{"path": {full}}.Encode(), nil)
	if err != nil {
		return 0, fmt.Errorf("%w: daytona read file: %w", sandbox.ErrUnavailable, err)
	}
	p.headers(req.Header)
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, p.gone(ctx, h, p.transportError(ctx, "read file", err))
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusBadRequest: // a directory now
		return 0, fmt.Errorf("%w: %s is not a regular file", sandbox.ErrNotFound, rel)
	case resp.StatusCode != http.StatusOK:
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, errBodyLimit))
		e := toolboxError("read file", resp.StatusCode, raw, resp.Header)
		e.Message = scrub(e.Message, p.opts.APIKey)
		return 0, p.gone(ctx, h, e)
	case resp.ContentLength > max:
		return 0, fmt.Errorf("%w: %s is larger than %d bytes", sandbox.ErrFileTooLarge, rel, max)
	}
	if enc := resp.Header.Get("Content-Encoding"); enc != "" && enc != "identity" {
		return 0, fmt.Errorf("%w: daytona read file: the toolbox answered with Content-Encoding %q", sandbox.ErrUnavailable, enc)
	}
	n, err := io.Copy(w, io.LimitReader(resp.Body, max))
	if err != nil {
		return n, p.transportError(ctx, "read file", err)
	}
	if m, _ := resp.Body.Read(make([]byte, 1)); m > 0 {
		return n, fmt.Errorf("%w: %s grew past %d bytes while it was read", sandbox.ErrFileTooLarge, rel, max)
	}
	return n, nil
}

// ListFiles implements [sandbox.FileSystem.ListFiles] with one find(1) in the sandbox, which
// walks /mnt/data without following links and prints regular files of one link with their size
// and time, and anything else but directories as skipped; its output is cut in the sandbox to
// what limit needs.
func (p *Provider) ListFiles(ctx context.Context, h sandbox.Handle, limit int) (sandbox.Listing, error) {
	var out sandbox.Listing
	if limit <= 0 {
		return out, nil
	}
	b, err := p.lookup(ctx, h)
	if err != nil {
		return out, err
	}
	budget := min(int64(limit*examinedPerFile+examinedSlack)*entryBytes, maxListBytes)
	cmd := "d=" + quote(sandbox.DataDir) + `; if [ -L "$d" ]; then echo link; exit 0; fi; if [ ! -d "$d" ]; then exit 0; fi; cd "$d" && ` +
		"find . -mindepth 1 -maxdepth " + strconv.Itoa(listDepth) +
		` \( -type d -printf '' \) -o \( -type f -links 1 -printf 'f %s %T@ %P\0' \) -o -printf 's %P\0' 2>/dev/null | head -c ` + strconv.FormatInt(budget, 10)
	_, res, err := p.execute(ctx, h, b, "list files", cmd, budget*6+answerLimit)
	if err != nil {
		return out, err
	}
	if strings.TrimSpace(res) == "link" {
		out.Skipped = 1
		return out, nil
	}
	entries := strings.Split(res, "\x00")
	if int64(len(res)) >= budget {
		out.Truncated = true
	}
	last := len(entries) - 1 // after the last NUL: empty, or an entry cut by the budget
	for i, e := range entries {
		if i == last {
			break
		}
		kind, rest, _ := strings.Cut(e, " ")
		if kind != "f" {
			if strings.HasPrefix(path.Base(rest), uploadPrefix) {
				continue
			}
			out.Skipped++
			continue
		}
		size, rest, _ := strings.Cut(rest, " ")
		mtime, rel, _ := strings.Cut(rest, " ")
		if strings.HasPrefix(path.Base(rel), uploadPrefix) {
			continue // an upload of ours in flight
		}
		n, serr := strconv.ParseInt(size, 10, 64)
		if _, perr := dataPath(rel); perr != nil || serr != nil || n < 0 || strings.ContainsRune(rel, '\uFFFD') {
			out.Skipped++
			continue
		}
		if len(out.Files) == limit {
			out.Truncated = true
			break
		}
		var mod time.Time
		if f, err := strconv.ParseFloat(mtime, 64); err == nil {
			sec := int64(f)
			mod = time.Unix(sec, int64((f-float64(sec))*1e9))
		}
		out.Files = append(out.Files, sandbox.FileInfo{Path: rel, Size: n, ModTime: mod})
	}
	return out, nil
}

// RemoveFile implements [sandbox.FileRemover] with the toolbox's DELETE /files (not recursive:
// a link is removed itself). A path reached through something that is not a directory of
// /mnt/data, or a missing one, is not there: nothing to remove.
func (p *Provider) RemoveFile(ctx context.Context, h sandbox.Handle, rel string) error {
	full, err := dataPath(rel)
	if err != nil {
		return err
	}
	b, err := p.lookup(ctx, h)
	if err != nil {
		return err
	}
	switch st, err := p.check(ctx, h, b, "remove", full); {
	case err != nil:
		return err
	case st == "bad" || st == "absent":
		return nil
	}
	_, err = p.toolbox(ctx, b, "remove", http.MethodDelete, "/files?"+url.Values{"path": {full}}.Encode(), nil, "")
	if isDaemonError(err) && errors.Is(err, sandbox.ErrNotFound) {
		return nil
	}
	return p.gone(ctx, h, err)
}

// removeQuietly removes what a failed write left, even when ctx has ended.
func (p *Provider) removeQuietly(ctx context.Context, b *box, full string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.RequestTimeout)
	defer cancel()
	_, _ = p.toolbox(ctx, b, "remove", http.MethodDelete, "/files?"+url.Values{"path": {full}}.Encode(), nil, "")
}
