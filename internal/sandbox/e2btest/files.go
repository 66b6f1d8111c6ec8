package e2btest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strings"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// envd's file API (GET/POST /files on port 49983). The files live in the default Python context's
// exec sandbox, reached by running small hidden cells there; the context hides those runs from
// its execution_count, so user-visible counts stay as e2b's. Relative paths resolve against the
// kernel's working directory (e2b: the user's home).

func (s *Server) fileRoutes() {
	s.handle(s.envd, "49983 ", "GET /files", s.download)
	s.handle(s.envd, "49983 ", "POST /files", s.upload)
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

// fileOp is the Python run for a file operation; its one stdout line is a JSON object.
const fileOp = `def __e2b_file_op(op, p, data):
    import base64, json, os
    if not os.path.isabs(p):
        p = os.path.join(os.getcwd(), p)
    p = os.path.normpath(p)
    if op == "read":
        if os.path.isdir(p):
            return {"error": "dir", "path": p}
        if not os.path.exists(p):
            return {"error": "missing", "path": p}
        with open(p, "rb") as f:
            return {"path": p, "data": base64.b64encode(f.read()).decode("ascii")}
    os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
    with open(p, "wb") as f:
        f.write(base64.b64decode(data))
    return {"path": p}
print(__import__("json").dumps(__e2b_file_op(%s, %s, %s)))
del __e2b_file_op
`

type fileOpResult struct {
	Error string `json:"error"`
	Path  string `json:"path"`
	Data  []byte `json:"data"`
}

func (s *Server) fileOp(ctx context.Context, sb *emuSandbox, op, p string, data []byte) (fileOpResult, error) {
	q := func(v string) string { b, _ := json.Marshal(v); return string(b) }
	out, err := s.hiddenRun(ctx, sb, fmt.Sprintf(fileOp, q(op), q(p), q(base64.StdEncoding.EncodeToString(data))))
	if err != nil {
		return fileOpResult{}, err
	}
	var res fileOpResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil {
		return fileOpResult{}, fmt.Errorf("file operation output %q: %w", out, err)
	}
	return res, nil
}

// download serves GET /files?path=.
func (s *Server) download(w http.ResponseWriter, r *http.Request, _ []byte) {
	sb := r.Context().Value(ctxKeySandbox{}).(*emuSandbox)
	if !s.envdAuthorized(w, r, sb) {
		return
	}
	p := r.URL.Query().Get("path")
	if p == "" {
		apiError(w, http.StatusBadRequest, "path is required")
		return
	}
	res, err := s.fileOp(r.Context(), sb, "read", p, nil)
	switch {
	case err != nil:
		apiError(w, http.StatusInternalServerError, "error reading file: "+err.Error())
		return
	case res.Error == "missing":
		apiError(w, http.StatusNotFound, fmt.Sprintf("path '%s' does not exist", res.Path))
		return
	case res.Error == "dir":
		apiError(w, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", res.Path))
		return
	}
	ct := mime.TypeByExtension(path.Ext(res.Path))
	if ct == "" {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(res.Path)}))
	_, _ = w.Write(res.Data)
}

type entryInfo struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// upload serves POST /files: multipart parts named "file" (the part's filename is the destination
// when path is absent) or an application/octet-stream body with path.
func (s *Server) upload(w http.ResponseWriter, r *http.Request, body []byte) {
	sb := r.Context().Value(ctxKeySandbox{}).(*emuSandbox)
	if !s.envdAuthorized(w, r, sb) {
		return
	}
	dest := r.URL.Query().Get("path")
	type file struct {
		path string
		data []byte
	}
	var files []file
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case strings.HasPrefix(mt, "multipart/"):
		mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
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
			data, err := io.ReadAll(part)
			if err != nil {
				apiError(w, http.StatusBadRequest, "error reading file: "+err.Error())
				return
			}
			p := dest
			if p == "" {
				p = part.FileName()
			}
			if p == "" {
				apiError(w, http.StatusBadRequest, "path is required")
				return
			}
			files = append(files, file{p, data})
		}
	default:
		if dest == "" {
			apiError(w, http.StatusBadRequest, "path is required")
			return
		}
		files = append(files, file{dest, body})
	}
	out := []entryInfo{}
	for _, f := range files {
		res, err := s.fileOp(r.Context(), sb, "write", f.path, f.data)
		if err != nil {
			apiError(w, http.StatusInternalServerError, "error writing file: "+err.Error())
			return
		}
		out = append(out, entryInfo{Path: res.Path, Name: path.Base(res.Path), Type: "file"})
	}
	b, _ := json.Marshal(out)
	writeJSON(w, http.StatusOK, b)
}
