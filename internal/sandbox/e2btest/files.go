package e2btest

import (
	"compress/gzip"
	"context"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// envd's file API on port 49983: GET/POST /files (download, upload) and the filesystem Connect
// service (ListDir, Stat, MakeDir, Move, Remove, unary JSON), as envd serves them. The files live
// in the exec sandbox of the default Python context and are reached by hidden cells running
// envd_fs.py there; the context hides those runs from its execution_count, so user-visible counts
// stay as e2b's. A file operation waits for an execution running in that context (envd does not:
// the emulator's one kernel is the sandbox's only process).
//
// Bodies stream: an upload is written in chunks as it arrives and a download is read in chunks,
// so neither is held whole, as with envd.

//go:embed envd_fs.py
var envdFS string

// fsChunk is how much of a file one hidden cell moves (base64 in the cell's code or stdout).
const fsChunk = 2 << 20

// defaultUser is the template's user; envd also knows root.
const defaultUser = "user"

func (s *Server) fileRoutes() {
	s.handleStream(s.envd, "49983 ", "GET /files", s.download)
	s.handleStream(s.envd, "49983 ", "POST /files", s.upload)
	for _, m := range []string{"ListDir", "Stat", "MakeDir", "Move", "Remove"} {
		s.handleStream(s.envd, "49983 ", "POST /filesystem.Filesystem/"+m, func(w http.ResponseWriter, r *http.Request) { s.rpc(w, r, m) })
	}
}

// handleStream registers a route whose request is recorded without its body (which the handler reads
// as a stream).
func (s *Server) handleStream(mux *http.ServeMux, prefix, pattern string, fn http.HandlerFunc) {
	mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests[prefix+pattern] = Request{Method: r.Method, URL: r.URL, Host: r.Host, Header: r.Header.Clone()}
		s.mu.Unlock()
		fn(w, r)
	})
}

// envdAuthorized checks X-Access-Token as envd does for every route but /health.
func (s *Server) envdAuthorized(w http.ResponseWriter, r *http.Request, sb *emuSandbox) bool {
	s.mu.Lock()
	token := sb.accessToken
	s.mu.Unlock()
	if token != "" && r.Header.Get("X-Access-Token") != token {
		apiError(w, http.StatusUnauthorized, "unauthorized access, please provide a valid access token or method signing if supported")
		return false
	}
	return true
}

// knownUser reports whether envd would find the user (the template's user and root; "" is the
// default user).
func knownUser(u string) bool { return u == "" || u == defaultUser || u == "root" }

// hiddenRun runs a helper cell in the default Python context and returns its stdout.
func (s *Server) hiddenRun(ctx context.Context, sb *emuSandbox, code string) (string, error) {
	s.mu.Lock()
	var kc *kernelContext
	for _, c := range sb.contexts {
		if c.isDflt && c.language == "python" {
			kc = c
			break
		}
	}
	s.mu.Unlock()
	if kc == nil {
		return "", errors.New("no python context")
	}
	h, err := s.startContext(ctx, sb, kc)
	if err != nil {
		return "", err
	}
	select {
	case kc.lock <- struct{}{}:
		defer func() { <-kc.lock }()
	case <-ctx.Done():
		return "", ctx.Err()
	}
	s.mu.Lock()
	kc.hidden++
	s.mu.Unlock()
	res, err := s.exec.Run(ctx, h, code, sandbox.RunOptions{})
	if err != nil {
		return "", err
	}
	if res.Error != nil {
		return "", fmt.Errorf("%s: %s", res.Error.Name, res.Error.Value)
	}
	return res.Stdout, nil
}

// fsAnswer is what envd_fs.py prints.
type fsAnswer struct {
	Status  int             `json:"status"`
	Body    json.RawMessage `json:"body"`
	Code    string          `json:"code"`
	Message string          `json:"message"`
}

// fsOp runs one operation of envd_fs.py with args.
func (s *Server) fsOp(ctx context.Context, sb *emuSandbox, op string, args any) (fsAnswer, error) {
	argsJSON, err := json.Marshal(args)
	if err != nil {
		return fsAnswer{}, err
	}
	// A JSON string literal is a Python string literal.
	opLit, _ := json.Marshal(op)
	argsLit, _ := json.Marshal(string(argsJSON))
	code := envdFS + fmt.Sprintf("\n__e2b_fs_answer(%s, __import__('json').loads(%s))\ndel __e2b_fs, __E2bFsError, __e2b_fs_answer\n", opLit, argsLit)
	out, err := s.hiddenRun(ctx, sb, code)
	if err != nil {
		return fsAnswer{}, err
	}
	var a fsAnswer
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &a); err != nil {
		return fsAnswer{}, fmt.Errorf("file operation output %q: %w", out, err)
	}
	return a, nil
}

// download serves GET /files?path=: the file's bytes, gzip-encoded when the client prefers it.
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	sb := r.Context().Value(ctxKeySandbox{}).(*emuSandbox)
	if !s.envdAuthorized(w, r, sb) {
		return
	}
	q := r.URL.Query()
	if !knownUser(q.Get("username")) {
		apiError(w, http.StatusUnauthorized, fmt.Sprintf("error looking up user '%s': user: unknown user %s", q.Get("username"), q.Get("username")))
		return
	}
	p := q.Get("path")
	if p == "" {
		apiError(w, http.StatusBadRequest, "path is required")
		return
	}
	a, err := s.fsOp(r.Context(), sb, "stat", map[string]string{"path": p})
	switch {
	case err != nil:
		apiError(w, http.StatusInternalServerError, "error checking if path exists: "+err.Error())
		return
	case a.Status != http.StatusOK:
		apiError(w, a.Status, a.Message)
		return
	}
	var st struct {
		Path  string `json:"path"`
		Dir   bool   `json:"dir"`
		Size  int64  `json:"size"`
		MTime int64  `json:"mtime"`
	}
	if err := json.Unmarshal(a.Body, &st); err != nil {
		apiError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if st.Dir {
		apiError(w, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", st.Path))
		return
	}
	gz, ok := acceptsGzip(r.Header.Get("Accept-Encoding"))
	if !ok {
		apiError(w, http.StatusNotAcceptable, "error parsing Accept-Encoding: no acceptable encoding found, supported: [gzip]")
		return
	}
	// The first chunk is read before the headers: without a type by extension, the content decides
	// it, as http.ServeContent does.
	first, err := s.readChunk(r.Context(), sb, st.Path, 0, min(st.Size, fsChunk))
	if err != nil {
		apiError(w, http.StatusInternalServerError, "error opening file: "+err.Error())
		return
	}
	h := w.Header()
	ct := mime.TypeByExtension(path.Ext(st.Path))
	if ct == "" {
		ct = http.DetectContentType(first)
	}
	h.Set("Content-Type", ct)
	h.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(st.Path)}))
	h.Set("Vary", "Accept-Encoding")
	h.Set("Last-Modified", time.Unix(0, st.MTime).UTC().Format(http.TimeFormat))
	var out io.Writer = w
	if gz {
		h.Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		defer zw.Close()
		out = zw
	} else {
		h.Set("Content-Length", strconv.FormatInt(st.Size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	// The size at the stat is what is sent, as ServeContent does for a file that changes meanwhile.
	chunk := first
	for off := int64(0); off < st.Size && len(chunk) > 0; {
		if _, err := out.Write(chunk); err != nil {
			return
		}
		off += int64(len(chunk))
		if off >= st.Size {
			break
		}
		if chunk, err = s.readChunk(r.Context(), sb, st.Path, off, min(st.Size-off, fsChunk)); err != nil {
			panic(http.ErrAbortHandler) // the body is cut short, as a failing read in envd would
		}
	}
}

func (s *Server) readChunk(ctx context.Context, sb *emuSandbox, p string, off, n int64) ([]byte, error) {
	if n <= 0 {
		return nil, nil
	}
	a, err := s.fsOp(ctx, sb, "read", map[string]any{"path": p, "offset": off, "n": n})
	if err != nil {
		return nil, err
	}
	var d struct {
		Data []byte `json:"data"`
	}
	if err := json.Unmarshal(a.Body, &d); err != nil {
		return nil, err
	}
	return d.Data, nil
}

// acceptsGzip applies envd's Accept-Encoding rules: the supported encoding of highest quality
// (only gzip), identity unless refused (identity;q=0, or *;q=0 without identity); ok is false when
// nothing acceptable is left.
func acceptsGzip(header string) (gz, ok bool) {
	if strings.TrimSpace(header) == "" {
		return false, true
	}
	type enc struct {
		name string
		q    float64
	}
	var encs []enc
	identityRefused, identityAccepted, wildcardRefused := false, false, false
	for _, v := range strings.Split(header, ",") {
		name, params, _ := strings.Cut(v, ";")
		e := enc{strings.ToLower(strings.TrimSpace(name)), 1}
		for _, p := range strings.Split(params, ";") {
			if k, val, found := strings.Cut(strings.TrimSpace(p), "="); found && strings.EqualFold(k, "q") {
				if q, err := strconv.ParseFloat(val, 64); err == nil {
					e.q = q
				}
			}
		}
		switch {
		case e.name == "identity" && e.q == 0:
			identityRefused = true
		case e.name == "identity":
			identityAccepted = true
		case e.name == "*" && e.q == 0:
			wildcardRefused = true
		}
		encs = append(encs, e)
	}
	if wildcardRefused && !identityAccepted {
		identityRefused = true
	}
	sort.SliceStable(encs, func(i, j int) bool { return encs[i].q > encs[j].q })
	for _, e := range encs {
		switch {
		case e.q == 0:
		case e.name == "identity":
			return false, true
		case e.name == "*":
			return identityRefused, true
		case e.name == "gzip":
			return true, true
		}
	}
	return false, !identityRefused
}

type uploadedEntry struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// upload serves POST /files: multipart parts named "file" (the part's filename, path included, is
// the destination when path is absent), or an application/octet-stream body with path. Parents are
// created and an existing file is overwritten. A body that breaks off leaves what was written, as
// envd does.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	sb := r.Context().Value(ctxKeySandbox{}).(*emuSandbox)
	if !s.envdAuthorized(w, r, sb) {
		return
	}
	q := r.URL.Query()
	if !knownUser(q.Get("username")) {
		apiError(w, http.StatusUnauthorized, fmt.Sprintf("error looking up user '%s': user: unknown user %s", q.Get("username"), q.Get("username")))
		return
	}
	body := io.Reader(r.Body)
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			apiError(w, http.StatusBadRequest, "error decompressing request body: "+err.Error())
			return
		}
		body = zr
	default:
		apiError(w, http.StatusBadRequest, fmt.Sprintf("error decompressing request body: unsupported Content-Encoding: %s, supported: [gzip]", enc))
		return
	}
	dest := q.Get("path")
	out := []uploadedEntry{}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "application/octet-stream" {
		if dest == "" {
			apiError(w, http.StatusBadRequest, "path is required for octet-stream upload")
			return
		}
		e, status, err := s.writeFile(r.Context(), sb, dest, body)
		if err != nil {
			apiError(w, status, err.Error())
			return
		}
		b, _ := json.Marshal(append(out, e))
		writeJSON(w, http.StatusOK, b)
		return
	}
	mr := multipart.NewReader(body, params["boundary"])
	seen := map[string]bool{}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			apiError(w, http.StatusBadRequest, "error parsing multipart form: "+err.Error())
			return
		}
		if part.FormName() != "file" {
			continue
		}
		p := dest
		if p == "" {
			_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			p = dp["filename"]
		}
		if p == "" {
			apiError(w, http.StatusBadRequest, "error resolving path: no file name")
			return
		}
		if seen[p] {
			apiError(w, http.StatusBadRequest, fmt.Sprintf("you cannot upload multiple files to the same path '%s' in one upload request, only the first specified file was uploaded", p))
			return
		}
		seen[p] = true
		e, status, err := s.writeFile(r.Context(), sb, p, part)
		if err != nil {
			apiError(w, status, err.Error())
			return
		}
		out = append(out, e)
	}
	b, _ := json.Marshal(out)
	writeJSON(w, http.StatusOK, b)
}

// writeFile creates (or truncates) p and appends what src yields, chunk by chunk.
func (s *Server) writeFile(ctx context.Context, sb *emuSandbox, p string, src io.Reader) (uploadedEntry, int, error) {
	a, err := s.fsOp(ctx, sb, "create", map[string]string{"path": p})
	switch {
	case err != nil:
		return uploadedEntry{}, http.StatusInternalServerError, fmt.Errorf("error opening file: %w", err)
	case a.Status != http.StatusOK:
		return uploadedEntry{}, a.Status, errors.New(a.Message)
	}
	var created struct {
		Path string `json:"path"`
	}
	_ = json.Unmarshal(a.Body, &created)
	buf := make([]byte, fsChunk)
	for {
		n, rerr := fill(src, buf)
		if n > 0 {
			a, err := s.fsOp(ctx, sb, "append", map[string]string{"path": created.Path, "data": base64.StdEncoding.EncodeToString(buf[:n])})
			switch {
			case err != nil:
				return uploadedEntry{}, http.StatusInternalServerError, fmt.Errorf("error writing file: %w", err)
			case a.Status != http.StatusOK:
				return uploadedEntry{}, a.Status, fmt.Errorf("error writing file: %s", a.Message)
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return uploadedEntry{}, http.StatusInternalServerError, fmt.Errorf("error writing file: %w", rerr)
		}
	}
	return uploadedEntry{Path: created.Path, Name: path.Base(created.Path), Type: "file"}, http.StatusOK, nil
}

// fill reads into buf until it is full or the reader ends; the error is the reader's (io.EOF at a
// clean end, anything else when the body broke off).
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// rpc serves one unary call of the filesystem Connect service with the JSON codec.
func (s *Server) rpc(w http.ResponseWriter, r *http.Request, method string) {
	sb := r.Context().Value(ctxKeySandbox{}).(*emuSandbox)
	if !s.envdAuthorized(w, r, sb) {
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		w.Header().Set("Accept-Post", "application/json, application/proto")
		w.WriteHeader(http.StatusUnsupportedMediaType)
		return
	}
	if u, err := basicUser(r.Header.Get("Authorization")); err != nil || !knownUser(u) {
		connectError(w, http.StatusUnauthorized, "unauthenticated", fmt.Sprintf("invalid username: '%s'", u))
		return
	}
	var args map[string]any
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.UseNumber()
	if err := dec.Decode(&args); err != nil {
		connectError(w, http.StatusBadRequest, "invalid_argument", "unmarshal into filesystem."+method+"Request: "+err.Error())
		return
	}
	if d, ok := args["depth"].(json.Number); ok {
		n, err := d.Int64()
		if err != nil || n < 0 || n > 1<<32-1 {
			connectError(w, http.StatusBadRequest, "invalid_argument", "unmarshal into filesystem.ListDirRequest: invalid value for uint32 field depth")
			return
		}
		args["depth"] = n
	}
	a, err := s.fsOp(r.Context(), sb, method, args)
	switch {
	case err != nil:
		connectError(w, http.StatusInternalServerError, "internal", err.Error())
	case a.Status != http.StatusOK:
		connectError(w, a.Status, a.Code, a.Message)
	default:
		writeJSON(w, http.StatusOK, a.Body)
	}
}

// basicUser reads the user of "Authorization: Basic base64(user:)"; "" when absent.
func basicUser(h string) (string, error) {
	if h == "" {
		return "", nil
	}
	scheme, cred, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", errors.New("not basic auth")
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", err
	}
	u, _, _ := strings.Cut(string(raw), ":")
	return u, nil
}

// connectError writes a Connect error as connect-go does for the JSON codec.
func connectError(w http.ResponseWriter, status int, code, msg string) {
	b, _ := json.Marshal(struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{code, msg})
	writeJSON(w, status, b)
}
