package agentsandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Files in and out of /mnt/data go through sandboxd's REST files API, whose root is /mnt/data
// (--root-dir): paths are sent relative to it. sandboxd resolves links and refuses a path that
// leaves the root (403), so a link the code made can reach nothing but the sandbox's own files;
// the proxy's side never touches a path of the sandbox. Listings are one level: the walk is done
// here, descending only into "directory" entries, taking only "file" entries, and each file is
// looked up in its directory's listing (type and size) before it is read. A FIFO lists as a file;
// a read whose answer does not start within readHeaderTimeout is ErrFileBusy.

const (
	// listDepth is how many directory levels below /mnt/data a listing looks into.
	listDepth = 32
	// examinedPerFile bounds how many entries of any kind a listing examines per file it may return.
	examinedPerFile = 4
	examinedSlack   = 1024
	// readHeaderTimeout bounds the wait for a read's answer to start.
	readHeaderTimeout = 5 * time.Second
)

// entry is one item of sandboxd's directory listing.
type entry struct {
	Name       string `json:"name"`
	Size       int64  `json:"size"`
	Type       string `json:"type"`
	ModifiedAt string `json:"modified_at"`
}

// checkPath refuses anything but a clean path relative to /mnt/data.
func checkPath(rel string) error {
	if rel == "" || strings.HasPrefix(rel, "/") || strings.ContainsRune(rel, 0) {
		return fmt.Errorf("agent_sandbox: %q is not a path relative to %s", rel, sandbox.DataDir)
	}
	for _, el := range strings.Split(rel, "/") {
		if el == "" || el == "." || el == ".." {
			return fmt.Errorf("agent_sandbox: %q is not a clean path relative to %s", rel, sandbox.DataDir)
		}
	}
	return nil
}

// filesPath is the API path of rel ("" is the root), each element escaped.
func filesPath(rel string) string {
	if rel == "" {
		return "/v1/files/"
	}
	els := strings.Split(rel, "/")
	for i, el := range els {
		els[i] = url.PathEscape(el)
	}
	return "/v1/files/" + strings.Join(els, "/")
}

// files sends one request to h's sandboxd REST API: at the pod IP, or through the router with a
// scoped token for the sandbox. A non-2xx answer is an *APIError.
func (p *Provider) files(ctx context.Context, h sandbox.Handle, op, method, apiPath string, body io.Reader, query string) (*http.Response, error) {
	var u string
	if p.opts.Connect == ConnectRouter {
		u = strings.TrimRight(p.opts.RouterURL, "/") + apiPath
	} else {
		if net.ParseIP(h.Domain) == nil {
			return nil, fmt.Errorf("%w: agent_sandbox %s: the handle has no pod IP", sandbox.ErrNotFound, op)
		}
		u = "http://" + net.JoinHostPort(h.Domain, fmt.Sprint(p.opts.FilesPort)) + apiPath
	}
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("%w: agent_sandbox %s: %w", sandbox.ErrUnavailable, op, err)
	}
	req.Header.Set("User-Agent", "ciproxy-agent-sandbox")
	if p.opts.Connect == ConnectRouter {
		tok, err := MintScopedToken(p.secret, p.opts.Namespace, h.TrafficToken, time.Now().Add(5*time.Minute))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("X-Sandbox-ID", h.TrafficToken)
		req.Header.Set("X-Sandbox-Namespace", p.opts.Namespace)
		req.Header.Set("X-Sandbox-Port", fmt.Sprint(p.opts.FilesPort))
	}
	resp, err := p.client.Do(req)
	if err != nil {
		// The transport's error names the URL, never a header: the token cannot leak through it.
		if ctx.Err() != nil {
			return nil, fmt.Errorf("agent_sandbox %s: %w", op, context.Cause(ctx))
		}
		if p.gone(ctx, h) {
			return nil, fmt.Errorf("%w: agent_sandbox %s: the sandbox is gone (claim %s)", sandbox.ErrNotFound, op, h.ID)
		}
		return nil, fmt.Errorf("%w: agent_sandbox %s: %w", sandbox.ErrUnavailable, op, err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, p.statusError(op, resp)
}

// APIError is an error status from sandboxd's REST API or the router. It wraps a sandbox
// sentinel (errors.Is works).
type APIError struct {
	Op         string
	StatusCode int
	// Code and Message are sandboxd's {"code","message"} or the router's {"detail"}.
	Code, Message string
	router        bool
	kind          error
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v: agent_sandbox %s: HTTP %d", e.kind, e.Op, e.StatusCode)
	if e.router {
		b.WriteString(" from the sandbox router")
	}
	if e.Code != "" {
		b.WriteString(": " + e.Code)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	return b.String()
}

// Unwrap returns the sandbox sentinel the status maps to.
func (e *APIError) Unwrap() error { return e.kind }

func (p *Provider) statusError(op string, resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, errBodyLimit))
	var body struct{ Code, Message, Detail string }
	_ = json.Unmarshal(raw, &body)
	e := &APIError{Op: op, StatusCode: resp.StatusCode, Code: body.Code, Message: body.Message}
	if body.Detail != "" {
		e.Message, e.router = body.Detail, true
	}
	if len(e.Message) > 300 {
		e.Message = e.Message[:300] + "..."
	}
	switch {
	case e.router && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden):
		e.Message = "the router refused the proxy's scoped token (" + e.Message + "): check scoped_token_secret against the router's --authz-scoped-token-secret-file"
		e.kind = sandbox.ErrUnavailable
	case resp.StatusCode == http.StatusNotFound, resp.StatusCode == http.StatusForbidden:
		e.kind = sandbox.ErrNotFound
	case resp.StatusCode == http.StatusTooManyRequests:
		e.kind = sandbox.ErrRateLimited
	default:
		e.kind = sandbox.ErrUnavailable
	}
	return e
}

// missing reports whether err is sandboxd's word that a path does not exist (or leaves the root).
func missing(err error) bool {
	var e *APIError
	return errors.As(err, &e) && !e.router && (e.StatusCode == http.StatusNotFound || e.StatusCode == http.StatusForbidden)
}

// list returns the entries of directory rel ("" the root); a path that is not a directory
// returns isDir false.
func (p *Provider) list(ctx context.Context, h sandbox.Handle, rel string) (entries []entry, isDir bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	resp, err := p.files(ctx, h, "list files", http.MethodGet, filesPath(rel), nil, "")
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return nil, false, nil
	}
	var dir struct {
		Entries *[]entry `json:"entries"`
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, jsonBodyLimit))
	if err := dec.Decode(&dir); err != nil || dir.Entries == nil {
		return nil, false, nil // a file whose content is JSON
	}
	return *dir.Entries, true, nil
}

// stat returns rel's entry in its directory's listing; ok false when there is none.
func (p *Provider) stat(ctx context.Context, h sandbox.Handle, rel string) (entry, bool, error) {
	dir, name := path.Split(rel)
	entries, isDir, err := p.list(ctx, h, strings.TrimSuffix(dir, "/"))
	if missing(err) || (err == nil && !isDir) {
		return entry{}, false, nil
	}
	if err != nil {
		return entry{}, false, err
	}
	for _, e := range entries {
		if e.Name == name {
			return e, true, nil
		}
	}
	return entry{}, false, nil
}

// WriteFile implements [sandbox.FileSystem.WriteFile] with PUT /v1/files/{path}?mode=0644, which
// sandboxd writes to a temporary file renamed into place once the body is complete (parents
// created): a body past max is cut off with an error, so nothing is renamed.
func (p *Provider) WriteFile(ctx context.Context, h sandbox.Handle, rel string, r io.Reader, max int64) error {
	if err := checkPath(rel); err != nil {
		return err
	}
	for d := path.Dir(rel); ; d = path.Dir(d) {
		if d == "." {
			break
		}
		if e, ok, err := p.stat(ctx, h, d); err != nil {
			return err
		} else if ok && e.Type != "directory" {
			return fmt.Errorf("%w: %s is reached through %s, which is not a directory", sandbox.ErrNameTaken, rel, d)
		}
	}
	if e, ok, err := p.stat(ctx, h, rel); err != nil {
		return err
	} else if ok && e.Type != "file" {
		return fmt.Errorf("%w: %s", sandbox.ErrNameTaken, rel)
	}
	src := sandbox.NewCappedReader(r, max)
	pr, pw := io.Pipe()
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, err := io.Copy(pw, src)
		switch {
		case err == nil && src.Over():
			err = sandbox.ErrFileTooLarge
		case err == nil && src.Err() != nil:
			err = src.Err()
		}
		pw.CloseWithError(err)
	}()
	resp, err := p.files(ctx, h, "write file", http.MethodPut, filesPath(rel), pr, "mode=0644")
	pr.Close() // a body the request did not read whole
	<-copied
	switch {
	case src.Over():
		return fmt.Errorf("%w: %s is larger than %d bytes", sandbox.ErrFileTooLarge, rel, max)
	case src.Err() != nil:
		return fmt.Errorf("agent_sandbox write file: reading %s: %w", rel, src.Err())
	case err != nil:
		var e *APIError
		if errors.As(err, &e) && strings.Contains(strings.ToLower(e.Message), "no space left") {
			return fmt.Errorf("%w: %w", sandbox.ErrContainerFull, err)
		}
		if errors.As(err, &e) && !e.router && (e.StatusCode == http.StatusBadRequest || e.StatusCode == http.StatusForbidden) {
			// A directory at the path (400), or a link there that leaves the root (403).
			return fmt.Errorf("%w: %w", sandbox.ErrNameTaken, err)
		}
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, errBodyLimit))
	resp.Body.Close()
	return nil
}

// ReadFile implements [sandbox.FileSystem.ReadFile]: only a "file" entry of its directory's
// listing, no larger than max, is read, within RequestTimeout.
func (p *Provider) ReadFile(ctx context.Context, h sandbox.Handle, rel string, w io.Writer, max int64) (int64, error) {
	if err := checkPath(rel); err != nil {
		return 0, err
	}
	e, ok, err := p.stat(ctx, h, rel)
	if err != nil {
		return 0, err
	}
	if !ok || e.Type != "file" {
		return 0, fmt.Errorf("%w: %s is not a regular file in the sandbox", sandbox.ErrNotFound, rel)
	}
	if e.Size < 0 || e.Size > max {
		return 0, fmt.Errorf("%w: %s is larger than %d bytes", sandbox.ErrFileTooLarge, rel, max)
	}
	dctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	// sandboxd opens the file before it answers: a FIFO (listed as a file) holds the answer back
	// until a writer comes, so an answer that does not start soon is a busy file.
	hctx, hcancel := context.WithCancelCause(dctx)
	defer hcancel(nil)
	slow := time.AfterFunc(readHeaderTimeout, func() { hcancel(sandbox.ErrFileBusy) })
	resp, err := p.files(hctx, h, "read file", http.MethodGet, filesPath(rel), nil, "")
	if !slow.Stop() && err != nil && ctx.Err() == nil {
		return 0, fmt.Errorf("%w: agent_sandbox read file: %s did not start within %s (a FIFO?)", sandbox.ErrFileBusy, rel, readHeaderTimeout)
	}
	if missing(err) {
		return 0, fmt.Errorf("%w: %s", sandbox.ErrNotFound, rel)
	}
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.ContentLength > max {
		return 0, fmt.Errorf("%w: %s is larger than %d bytes", sandbox.ErrFileTooLarge, rel, max)
	}
	n, err := io.Copy(w, io.LimitReader(resp.Body, max))
	if err != nil {
		if dctx.Err() != nil && ctx.Err() == nil {
			return n, fmt.Errorf("%w: agent_sandbox read file: %s did not arrive within %s", sandbox.ErrFileBusy, rel, p.opts.RequestTimeout)
		}
		return n, fmt.Errorf("%w: agent_sandbox read file: %w", sandbox.ErrUnavailable, err)
	}
	if m, _ := resp.Body.Read(make([]byte, 1)); m > 0 {
		return n, fmt.Errorf("%w: %s grew past %d bytes while it was read", sandbox.ErrFileTooLarge, rel, max)
	}
	return n, nil
}

// ListFiles implements [sandbox.FileSystem.ListFiles] by walking the one-level listings from
// /mnt/data down, at most listDepth levels.
func (p *Provider) ListFiles(ctx context.Context, h sandbox.Handle, limit int) (sandbox.Listing, error) {
	var out sandbox.Listing
	if limit <= 0 {
		return out, nil
	}
	maxExamined := limit*examinedPerFile + examinedSlack
	examined := 0
	type dir struct {
		rel   string
		depth int
	}
	queue := []dir{{"", 0}}
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		entries, isDir, err := p.list(ctx, h, d.rel)
		if missing(err) {
			continue
		}
		if err != nil {
			return out, err
		}
		if !isDir {
			out.Skipped++
			continue
		}
		for _, e := range entries {
			if examined++; examined > maxExamined {
				out.Truncated = true
				return out, nil
			}
			rel := e.Name
			if d.rel != "" {
				rel = d.rel + "/" + e.Name
			}
			if strings.Contains(e.Name, "/") || checkPath(rel) != nil {
				out.Skipped++
				continue
			}
			switch e.Type {
			case "directory":
				if d.depth+1 < listDepth {
					queue = append(queue, dir{rel, d.depth + 1})
				} else {
					out.Skipped++
				}
				continue
			case "file":
			default:
				out.Skipped++
				continue
			}
			if e.Size < 0 {
				out.Skipped++
				continue
			}
			if len(out.Files) == limit {
				out.Truncated = true
				return out, nil
			}
			mod, _ := time.Parse(time.RFC3339Nano, e.ModifiedAt)
			out.Files = append(out.Files, sandbox.FileInfo{Path: rel, Size: e.Size, ModTime: mod})
		}
	}
	return out, nil
}

var _ sandbox.FileRemover = (*Provider)(nil)

// RemoveFile implements [sandbox.FileRemover] with DELETE /v1/files/{path}; a missing path is not
// an error.
func (p *Provider) RemoveFile(ctx context.Context, h sandbox.Handle, rel string) error {
	if err := checkPath(rel); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	resp, err := p.files(ctx, h, "remove file", http.MethodDelete, filesPath(rel), nil, "")
	if missing(err) {
		return nil
	}
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}
