package e2b

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
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

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Files in and out of /mnt/data go through envd (port 49983) as e2b's SDKs move them: uploads are
// multipart POST /files?path=, downloads GET /files?path=, and listings, file information and
// /mnt/data itself come from the filesystem Connect service (ListDir, Stat, MakeDir, Move, Remove;
// unary calls, JSON codec). No user is named, so envd acts as the template's default user, as the
// SDKs do with envd >= 0.4.0.
//
// Everything envd reports was made by sandboxed code, so nothing it says is trusted:
//   - a link is reported with its target's type; symlinkTarget or an "L" in its permissions marks
//     it, and either makes the entry a link, which ReadFile refuses and ListFiles skips;
//   - sizes are only hints: ReadFile stops reading at max bytes whatever was announced, and a
//     listing with sizes that do not parse skips the entry;
//   - a listing is read as a stream and decoded entry by entry under a byte budget, so a tree of a
//     million entries costs what limit asks for, not what the sandbox made.
//
// What a link can reach is the sandbox's own file system (a VM at e2b), never the proxy's host;
// the checks keep the contract of sandbox.FileSystem, not the host, safe. Between ReadFile's Stat
// and its download the sandbox could swap a file for a link; the download then reads what the
// link points to inside the sandbox, which its code could have copied there anyway.

var _ sandbox.FileSystem = (*Provider)(nil)

const (
	// listDepth is how many directory levels below /mnt/data a listing looks into.
	listDepth = 32
	// entryBudget is the most bytes one listed entry may take in the response (a 4096-byte path,
	// its name and a link target, with room to spare), and examinedPerFile how many entries of any
	// kind a listing examines per file it may return.
	entryBudget     = 16 << 10
	examinedPerFile = 4
	examinedSlack   = 1024
	// rpcBodyLimit bounds the answer of a call other than ListDir.
	rpcBodyLimit = 64 << 10
	// uploadPrefix names the temporary file an upload goes to before it is moved into place.
	uploadPrefix = ".ciproxy-upload-"
)

// entryInfo is envd's EntryInfo in protojson.
type entryInfo struct {
	Name          string  `json:"name"`
	Type          string  `json:"type"`
	Path          string  `json:"path"`
	Size          string  `json:"size"` // int64 as a string
	Permissions   string  `json:"permissions"`
	ModifiedTime  string  `json:"modifiedTime"`
	SymlinkTarget *string `json:"symlinkTarget"`
}

// regular reports whether e is a regular file: a file by type and by its permissions (Go's
// FileMode string, whose letters before the nine rwx ones name the file's kind), and not a link.
func (e entryInfo) regular() bool {
	if e.Type != "FILE_TYPE_FILE" || e.SymlinkTarget != nil || len(e.Permissions) < 10 {
		return false
	}
	for _, c := range e.Permissions[:len(e.Permissions)-9] {
		if !strings.ContainsRune("-ugt", c) { // setuid, setgid and sticky are still regular files
			return false
		}
	}
	return true
}

func (e entryInfo) directory() bool {
	return e.Type == "FILE_TYPE_DIRECTORY" && e.SymlinkTarget == nil && strings.HasPrefix(e.Permissions, "d")
}

// size is the announced size; false when it does not parse or is negative.
func (e entryInfo) size() (int64, bool) {
	if e.Size == "" {
		return 0, true // protojson leaves zero out
	}
	n, err := strconv.ParseInt(e.Size, 10, 64)
	return n, err == nil && n >= 0
}

// dataPath turns a path relative to /mnt/data into the absolute one envd gets. Callers sanitise
// paths first; anything else is refused all the same.
func dataPath(rel string) (string, error) {
	if rel == "" || strings.HasPrefix(rel, "/") || strings.ContainsRune(rel, 0) {
		return "", fmt.Errorf("e2b: %q is not a path relative to %s", rel, sandbox.DataDir)
	}
	for _, el := range strings.Split(rel, "/") {
		if el == "" || el == "." || el == ".." {
			return "", fmt.Errorf("e2b: %q is not a clean path relative to %s", rel, sandbox.DataDir)
		}
	}
	return sandbox.DataDir + "/" + rel, nil
}

// WriteFile implements [sandbox.FileSystem.WriteFile]. The bytes are uploaded to a temporary
// file beside the target and moved into place once complete, so that a file past max or a source
// that fails leaves no partial file at path. In those two cases the upload is still ended
// cleanly (with what was read so far), so that envd has finished with the temporary file when
// it is removed; only a write whose ctx ends mid-upload can leave one behind, hidden
// (uploadPrefix) and skipped by ListFiles.
func (p *Provider) WriteFile(ctx context.Context, h sandbox.Handle, rel string, r io.Reader, max int64) error {
	full, err := dataPath(rel)
	if err != nil {
		return err
	}
	// envd's upload overwrites a file and its move replaces one, but something else the code
	// made there (a directory, a link) is the code's: refused before anything is read.
	switch e, err := p.stat(ctx, h, full); {
	case err == nil && !e.regular():
		return fmt.Errorf("%w: %s", sandbox.ErrNameTaken, rel)
	case err != nil && !missingPath(err):
		return err
	}
	tmp := path.Dir(full) + "/" + uploadPrefix + randomSuffix()
	src := sandbox.NewCappedReader(r, max)
	err = p.upload(ctx, h, tmp, src)
	switch {
	case err == nil && src.Over():
		err = fmt.Errorf("%w: %s is larger than %d bytes", sandbox.ErrFileTooLarge, rel, max)
	case err == nil && src.Err() != nil:
		err = fmt.Errorf("e2b write file: reading %s: %w", rel, src.Err())
	case err == nil:
		err = p.rpc(ctx, h, "move", "Move", map[string]string{"source": tmp, "destination": full}, nil)
	}
	if err != nil {
		p.removeQuietly(ctx, h, tmp)
	}
	return err
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
	// One byte past max is read, to tell a source of exactly max bytes from a longer one; written
	// so that a max of math.MaxInt64 (no limit) does not overflow.
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

// upload streams r to dest as a multipart POST /files, as the SDK's files.write does. It returns
// once the goroutine writing the body has finished with r.
func (p *Provider) upload(ctx context.Context, h sandbox.Handle, dest string, r io.Reader) error {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	written := make(chan struct{})
	go func() {
		defer close(written)
		fw, err := mw.CreateFormFile("file", dest)
		if err == nil {
			_, err = io.Copy(fw, r)
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

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.dataURL(h, EnvdPort, "/files?"+url.Values{"path": {dest}}.Encode()), pr)
	if err != nil {
		return fmt.Errorf("%w: e2b upload: %w", sandbox.ErrUnavailable, err)
	}
	p.envdHeaders(req, h)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := p.client.Do(req)
	if err != nil {
		return p.transportError(ctx, "upload", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return p.envdStatusError("upload", resp)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, rpcBodyLimit))
	return nil
}

// ReadFile implements [sandbox.FileSystem.ReadFile]. A file announced (by Stat or
// Content-Length) as larger than max is ErrFileTooLarge before anything is written; one that
// turns out larger while it is read is cut at max bytes and ErrFileTooLarge, w having received
// those max bytes.
func (p *Provider) ReadFile(ctx context.Context, h sandbox.Handle, rel string, w io.Writer, max int64) (int64, error) {
	full, err := dataPath(rel)
	if err != nil {
		return 0, err
	}
	// Every directory on the way must be one, not a link to one, and the file a regular file.
	for dir := path.Dir(full); ; dir = path.Dir(dir) {
		e, err := p.stat(ctx, h, dir)
		if err != nil {
			return 0, err
		}
		if !e.directory() {
			return 0, fmt.Errorf("%w: %s is reached through %s, which is not a directory (%s)", sandbox.ErrNotFound, rel, dir, e.Permissions)
		}
		if dir == sandbox.DataDir {
			break
		}
	}
	st, err := p.stat(ctx, h, full)
	if err != nil {
		return 0, err
	}
	if !st.regular() {
		return 0, fmt.Errorf("%w: %s is not a regular file (%s)", sandbox.ErrNotFound, rel, st.Permissions)
	}
	if n, ok := st.size(); !ok || n > max {
		return 0, fmt.Errorf("%w: %s is larger than %d bytes", sandbox.ErrFileTooLarge, rel, max)
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.dataURL(h, EnvdPort, "/files?"+url.Values{"path": {full}}.Encode()), nil)
	if err != nil {
		return 0, fmt.Errorf("%w: e2b read file: %w", sandbox.ErrUnavailable, err)
	}
	p.envdHeaders(req, h)
	// Plain bytes: a declared length can be checked before anything is copied, and a compressed
	// body cannot inflate past what was checked.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, p.transportError(ctx, "read file", err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusBadRequest: // a directory now
		return 0, fmt.Errorf("%w: %s is not a regular file", sandbox.ErrNotFound, rel)
	case resp.StatusCode != http.StatusOK:
		return 0, p.envdStatusError("read file", resp)
	case resp.ContentLength > max:
		return 0, fmt.Errorf("%w: %s is larger than %d bytes", sandbox.ErrFileTooLarge, rel, max)
	}
	if enc := resp.Header.Get("Content-Encoding"); enc != "" && enc != "identity" {
		return 0, fmt.Errorf("%w: e2b read file: the sandbox answered with Content-Encoding %q", sandbox.ErrUnavailable, enc)
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

// ListFiles implements [sandbox.FileSystem.ListFiles] with a Stat of /mnt/data and one ListDir
// of it. Directories are walked by envd (links are listed, not followed); links, special files
// and entries whose path or size does not make sense are skipped and counted. A /mnt/data that is
// itself a link (envd would list what it points to) lists nothing and counts as skipped.
func (p *Provider) ListFiles(ctx context.Context, h sandbox.Handle, limit int) (sandbox.Listing, error) {
	var out sandbox.Listing
	if limit <= 0 {
		return out, nil
	}
	root, err := p.stat(ctx, h, sandbox.DataDir)
	if missingPath(err) {
		return out, nil // no /mnt/data yet: no files
	}
	if err != nil {
		return out, err
	}
	if !root.directory() {
		out.Skipped = 1
		return out, nil
	}
	resp, cancel, err := p.rpcCall(ctx, h, "list files", "ListDir", map[string]any{"path": sandbox.DataDir, "depth": listDepth})
	if missingPath(err) {
		return out, nil // removed since the Stat
	}
	if err != nil {
		return out, err
	}
	defer cancel()
	defer resp.Body.Close()

	maxExamined := limit*examinedPerFile + examinedSlack
	budget := &capReader{r: resp.Body, max: int64(maxExamined) * entryBudget}
	examined := 0
	err = decodeEntries(json.NewDecoder(budget), func(e entryInfo) bool {
		if examined++; examined > maxExamined {
			out.Truncated = true
			return false
		}
		rel, ok := strings.CutPrefix(e.Path, sandbox.DataDir+"/")
		switch {
		case ok && e.directory():
			return true
		case ok && strings.HasPrefix(path.Base(rel), uploadPrefix):
			return true // an upload of ours in flight
		}
		size, sizeOK := e.size()
		if _, err := dataPath(rel); !ok || err != nil || !e.regular() || !sizeOK {
			out.Skipped++
			return true
		}
		if len(out.Files) == limit {
			out.Truncated = true
			return false
		}
		mod, _ := time.Parse(time.RFC3339Nano, e.ModifiedTime)
		out.Files = append(out.Files, sandbox.FileInfo{Path: rel, Size: size, ModTime: mod})
		return true
	})
	if budget.over {
		out.Truncated = true // the listing is larger than any that limit needs
		return out, nil
	}
	if err != nil {
		return out, p.transportError(ctx, "list files", fmt.Errorf("decoding the listing: %w", err))
	}
	return out, nil
}

// stat returns envd's entry for the absolute path full (not following a link there).
func (p *Provider) stat(ctx context.Context, h sandbox.Handle, full string) (entryInfo, error) {
	var st struct{ Entry entryInfo }
	err := p.rpc(ctx, h, "stat", "Stat", map[string]string{"path": full}, &st)
	return st.Entry, err
}

// missingPath reports whether err says a path does not exist, as opposed to the sandbox being
// gone (a 502 from e2b's edge, also ErrNotFound).
func missingPath(err error) bool {
	var apiErr *APIError
	return errors.As(err, &apiErr) && apiErr.StatusCode != http.StatusBadGateway && errors.Is(err, sandbox.ErrNotFound)
}

// decodeEntries reads {"entries":[...]} one entry at a time, calling each until it returns false.
func decodeEntries(dec *json.Decoder, each func(entryInfo) bool) error {
	if err := expectDelim(dec, '{'); err != nil {
		return err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if key, _ := tok.(string); key != "entries" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return err
			}
			continue
		}
		if err := expectDelim(dec, '['); err != nil {
			return err
		}
		for dec.More() {
			var e entryInfo
			if err := dec.Decode(&e); err != nil {
				return err
			}
			if !each(e) {
				return nil
			}
		}
		if _, err := dec.Token(); err != nil { // ']'
			return err
		}
	}
	return nil
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

// removeQuietly removes what a failed write left, even when ctx has ended; a failure only means
// a hidden temporary file stays in the sandbox.
func (p *Provider) removeQuietly(ctx context.Context, h sandbox.Handle, full string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.RequestTimeout)
	defer cancel()
	_ = p.rpc(ctx, h, "remove", "Remove", map[string]string{"path": full}, nil)
}

// makeDataDir makes /mnt/data in a new sandbox with envd's MakeDir, as the template's user (envd
// gives what it makes to that user), so that the kernel and the file operations alike can write
// there. A template that has it already answers 409 already_exists, which is fine.
func (p *Provider) makeDataDir(ctx context.Context, h sandbox.Handle) error {
	err := p.rpc(ctx, h, "mkdir", "MakeDir", map[string]string{"path": sandbox.DataDir}, nil)
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusConflict {
		return nil
	}
	return err
}

// rpc makes one unary call of the filesystem service and decodes its answer into out (when not
// nil).
func (p *Provider) rpc(ctx context.Context, h sandbox.Handle, op, method string, in, out any) error {
	resp, cancel, err := p.rpcCall(ctx, h, op, method, in)
	if err != nil {
		return err
	}
	defer cancel()
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, rpcBodyLimit+1))
	if err != nil {
		return p.transportError(ctx, op, err)
	}
	if len(raw) > rpcBodyLimit {
		return fmt.Errorf("%w: e2b %s: the answer is larger than %d bytes", sandbox.ErrUnavailable, op, rpcBodyLimit)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("%w: e2b %s: decoding the answer: %w", sandbox.ErrUnavailable, op, err)
		}
	}
	return nil
}

// rpcCall sends a unary Connect call (JSON codec) bounded by RequestTimeout; on success the
// caller reads and closes the body, then calls cancel.
func (p *Provider) rpcCall(ctx context.Context, h sandbox.Handle, op, method string, in any) (*http.Response, context.CancelFunc, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return nil, nil, fmt.Errorf("e2b %s: %w", op, err)
	}
	path := "/filesystem.Filesystem/" + method
	if strings.Contains(method, "/") { // another service's: process.Process/SendSignal
		path = "/" + method
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.dataURL(h, EnvdPort, path), bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("%w: e2b %s: %w", sandbox.ErrUnavailable, op, err)
	}
	p.envdHeaders(req, h)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connect-Protocol-Version", "1")
	resp, err := p.client.Do(req)
	if err != nil {
		cancel()
		return nil, nil, p.transportError(ctx, op, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel()
		defer resp.Body.Close()
		return nil, nil, p.envdStatusError(op, resp)
	}
	return resp, cancel, nil
}

// envdHeaders adds what every envd request carries: routing and the sandbox's access token.
func (p *Provider) envdHeaders(req *http.Request, h sandbox.Handle) {
	p.dataHeaders(req, h, EnvdPort)
	if h.AccessToken != "" {
		req.Header.Set("X-Access-Token", h.AccessToken)
	}
}

// envdStatusError maps an envd answer that is not 200: a Connect error {"code","message"}, envd's
// {"code":<status>,"message"}, or the edge proxy's 502 for a sandbox that no longer exists.
func (p *Provider) envdStatusError(op string, resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, errBodyLimit))
	var e struct {
		Code    any    `json:"code"`
		Message string `json:"message"`
	}
	msg := strings.TrimSpace(string(raw))
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		msg = e.Message
	}
	if len(msg) > 300 {
		msg = msg[:300] + "..."
	}
	code, _ := e.Code.(string)
	apiErr := &APIError{Op: op, StatusCode: resp.StatusCode, Message: msg}
	switch {
	case resp.StatusCode == http.StatusBadGateway:
		apiErr.Message = "container expired: " + msg
		apiErr.kind = sandbox.ErrNotFound
	case resp.StatusCode == http.StatusNotFound || code == "not_found":
		apiErr.kind = sandbox.ErrNotFound
	case resp.StatusCode == http.StatusInsufficientStorage: // an upload: not enough disk
		apiErr.kind = sandbox.ErrContainerFull
	case resp.StatusCode == http.StatusTooManyRequests || code == "resource_exhausted":
		apiErr.RetryAfter = retryAfter(resp.Header)
		apiErr.kind = sandbox.ErrRateLimited
	default:
		apiErr.kind = sandbox.ErrUnavailable
	}
	return apiErr
}

// transportError maps a failed exchange: the caller's own cancellation stays itself, anything
// else means the sandbox could not be reached.
func (p *Provider) transportError(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("e2b %s: %w", op, context.Cause(ctx))
	}
	return fmt.Errorf("%w: e2b %s: %w", sandbox.ErrUnavailable, op, err)
}

func randomSuffix() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var _ sandbox.FileRemover = (*Provider)(nil)

// RemoveFile implements [sandbox.FileRemover] with envd's Remove, which removes what is at the
// path (a link itself, never its target). A missing path is not an error; a sandbox that is gone
// is (ErrNotFound from e2b's edge).
func (p *Provider) RemoveFile(ctx context.Context, h sandbox.Handle, rel string) error {
	full, err := dataPath(rel)
	if err != nil {
		return err
	}
	err = p.rpc(ctx, h, "remove", "Remove", map[string]string{"path": full}, nil)
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.StatusCode != http.StatusBadGateway && errors.Is(err, sandbox.ErrNotFound) {
		return nil
	}
	return err
}
