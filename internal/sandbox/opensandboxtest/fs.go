package opensandboxtest

import (
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
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// execdFS holds execd's file operations as the kernel runs them (see the file).
//
//go:embed execd_fs.py
var execdFS string

// fsChunk is how much of a file one hidden cell moves.
const fsChunk = 1 << 20

// fsAnswer is what execd_fs.py prints.
type fsAnswer struct {
	Status  int             `json:"status"`
	Body    json.RawMessage `json:"body"`
	Code    string          `json:"code"`
	Message string          `json:"message"`
}

func (s *Server) fileRoutes() {
	s.execdRoute("GET /files/info", s.fileInfo)
	s.execdRoute("GET /directories/list", s.listDir)
	s.execdRoute("GET /files/download", s.download)
	s.execdRoute("POST /files/upload", s.upload)
	s.execdRoute("DELETE /files", func(w http.ResponseWriter, r *http.Request, b *box) {
		s.simpleOp(w, r, b, "delete", map[string]any{"paths": r.URL.Query()["path"]})
	})
	s.execdRoute("DELETE /directories", func(w http.ResponseWriter, r *http.Request, b *box) {
		s.simpleOp(w, r, b, "rmdir", map[string]any{"paths": r.URL.Query()["path"]})
	})
	s.execdRoute("POST /directories", func(w http.ResponseWriter, r *http.Request, b *box) {
		j, _, ok := decodeBody(w, r)
		if !ok {
			return
		}
		dirs := map[string]int64{}
		j.ForEach(func(k, v gjson.Result) bool {
			dirs[k.String()] = v.Get("mode").Int()
			if dirs[k.String()] == 0 {
				dirs[k.String()] = 755
			}
			return true
		})
		s.simpleOp(w, r, b, "mkdir", map[string]any{"dirs": dirs})
	})
	s.execdRoute("POST /files/mv", func(w http.ResponseWriter, r *http.Request, b *box) {
		j, _, ok := decodeBody(w, r)
		if !ok {
			return
		}
		var moves []map[string]string
		for _, m := range j.Array() {
			moves = append(moves, map[string]string{"src": m.Get("src").String(), "dest": m.Get("dest").String()})
		}
		s.simpleOp(w, r, b, "mv", map[string]any{"moves": moves})
	})
}

// resolve expands a path as execd does: "~" is root's home, $VAR must be defined (the double
// defines none), relative paths are below execd's cwd.
func resolve(p string) (string, error) {
	if strings.Contains(p, "$") {
		return "", fmt.Errorf("path references undefined environment variables: %s", p)
	}
	if p == "~" || strings.HasPrefix(p, "~/") {
		p = "/root" + p[1:]
	}
	if !path.IsAbs(p) {
		p = "/workspace/" + p
	}
	return path.Clean(p), nil
}

// fsOp runs one operation of execd_fs.py in the sandbox's kernel, after any run in progress.
func (s *Server) fsOp(ctx context.Context, b *box, op string, args any) (fsAnswer, error) {
	argsJSON, err := json.Marshal(args)
	if err != nil {
		return fsAnswer{}, err
	}
	opLit, _ := json.Marshal(op)
	argsLit, _ := json.Marshal(string(argsJSON))
	code := execdFS + fmt.Sprintf("\n__osb_fs(%s, __import__('json').loads(%s))\ndel __osb_fs\n", opLit, argsLit)
	s.mu.Lock()
	h := b.exec
	s.mu.Unlock()
	res, err := s.exec.Run(ctx, h, code, sandbox.RunOptions{})
	if err != nil {
		return fsAnswer{}, err
	}
	if res.Error != nil {
		return fsAnswer{}, fmt.Errorf("%s: %s", res.Error.Name, res.Error.Value)
	}
	i := strings.LastIndexByte(res.Stdout, '\x02')
	if i < 0 {
		return fsAnswer{}, fmt.Errorf("file operation printed no answer: %.200q", res.Stdout)
	}
	var a fsAnswer
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.Stdout[i+1:])), &a); err != nil {
		return fsAnswer{}, fmt.Errorf("file operation answer: %w", err)
	}
	return a, nil
}

// reply writes an fsAnswer as execd would: the body, or its error.
func reply(w http.ResponseWriter, a fsAnswer, err error) bool {
	if err != nil {
		execdError(w, http.StatusInternalServerError, "RUNTIME_ERROR", err.Error())
		return false
	}
	if a.Code != "" {
		execdError(w, a.Status, a.Code, a.Message)
		return false
	}
	return true
}

func (s *Server) simpleOp(w http.ResponseWriter, r *http.Request, b *box, op string, args map[string]any) {
	if paths, ok := args["paths"].([]string); ok {
		if len(paths) == 0 {
			execdError(w, http.StatusBadRequest, "MISSING_QUERY", "missing query parameter path")
			return
		}
		for i, p := range paths {
			rp, err := resolve(p)
			if err != nil {
				execdError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", err.Error())
				return
			}
			paths[i] = rp
		}
	}
	a, err := s.fsOp(r.Context(), b, op, args)
	if reply(w, a, err) {
		w.WriteHeader(http.StatusOK)
	}
}

// fileInfo is GET /files/info?path=...: lstat of each, keyed by the path as asked.
func (s *Server) fileInfo(w http.ResponseWriter, r *http.Request, b *box) {
	asked := r.URL.Query()["path"]
	if len(asked) == 0 {
		execdError(w, http.StatusBadRequest, "MISSING_QUERY", "missing query parameter path")
		return
	}
	var resolved []string
	for _, p := range asked {
		rp, err := resolve(p)
		if err != nil {
			execdError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", err.Error())
			return
		}
		resolved = append(resolved, rp)
	}
	a, err := s.fsOp(r.Context(), b, "info", map[string]any{"paths": resolved})
	if !reply(w, a, err) {
		return
	}
	infos := map[string]json.RawMessage{}
	_ = json.Unmarshal(a.Body, &infos)
	out := map[string]json.RawMessage{}
	for i, p := range asked {
		info := infos[resolved[i]]
		// "path" is the path as asked.
		var m map[string]any
		_ = json.Unmarshal(info, &m)
		m["path"] = p
		out[p] = fileInfoJSON(m)
	}
	writeJSON(w, http.StatusOK, out)
}

// fileInfoJSON writes a FileInfo in execd's Go field order.
func fileInfoJSON(m map[string]any) json.RawMessage {
	b, _ := json.Marshal(struct {
		Path       any `json:"path"`
		Type       any `json:"type"`
		Size       any `json:"size"`
		ModifiedAt any `json:"modified_at"`
		CreatedAt  any `json:"created_at"`
		Owner      any `json:"owner"`
		Group      any `json:"group"`
		Mode       any `json:"mode"`
	}{m["path"], m["type"], m["size"], m["modified_at"], m["created_at"], m["owner"], m["group"], m["mode"]})
	return b
}

// listDir is GET /directories/list?path=&depth=.
func (s *Server) listDir(w http.ResponseWriter, r *http.Request, b *box) {
	q := r.URL.Query()
	p, err := resolve(q.Get("path"))
	if q.Get("path") == "" || err != nil {
		execdError(w, http.StatusBadRequest, "MISSING_QUERY", "missing query parameter path")
		return
	}
	depth := 1
	if v := q.Get("depth"); v != "" {
		if depth, err = strconv.Atoi(v); err != nil || depth < 0 {
			execdError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "invalid depth: "+v)
			return
		}
	}
	a, err := s.fsOp(r.Context(), b, "list", map[string]any{"path": p, "depth": depth})
	if !reply(w, a, err) {
		return
	}
	var items []map[string]any
	_ = json.Unmarshal(a.Body, &items)
	out := []json.RawMessage{}
	for _, m := range items {
		out = append(out, fileInfoJSON(m))
	}
	writeJSON(w, http.StatusOK, out)
}

// download is GET /files/download?path=: the bytes as Go's ServeContent sends them. A special
// file blocks, as its open does in execd, until the client leaves.
func (s *Server) download(w http.ResponseWriter, r *http.Request, b *box) {
	asked := r.URL.Query().Get("path")
	p, err := resolve(asked)
	if asked == "" || err != nil {
		execdError(w, http.StatusBadRequest, "MISSING_QUERY", "missing query parameter path")
		return
	}
	a, err := s.fsOp(r.Context(), b, "stat", map[string]any{"path": p})
	if a.Code == "FILE_NOT_FOUND" {
		execdError(w, http.StatusNotFound, "FILE_NOT_FOUND", "file not found. open "+p+": no such file or directory")
		return
	}
	if !reply(w, a, err) {
		return
	}
	var st struct {
		Type string `json:"type"`
		Size int64  `json:"size"`
	}
	_ = json.Unmarshal(a.Body, &st)
	switch st.Type {
	case "other":
		<-r.Context().Done()
		return
	case "directory":
		execdError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "read "+p+": is a directory")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	w.Header().Set("Accept-Ranges", "bytes")
	w.Header().Set("Content-Length", strconv.FormatInt(st.Size, 10))
	w.WriteHeader(http.StatusOK)
	for off := int64(0); off < st.Size; {
		a, err := s.fsOp(r.Context(), b, "read", map[string]any{"path": p, "offset": off, "n": min(int64(fsChunk), st.Size-off)})
		if err != nil || a.Code != "" {
			panic(http.ErrAbortHandler)
		}
		var b64 string
		_ = json.Unmarshal(a.Body, &b64)
		chunk, _ := base64.StdEncoding.DecodeString(b64)
		if len(chunk) == 0 {
			panic(http.ErrAbortHandler) // the file shrank: the body is short
		}
		if _, err := w.Write(chunk); err != nil {
			return
		}
		off += int64(len(chunk))
	}
}

// upload is POST /files/upload: pairs of a metadata part (a file part, as gin needs it) and a
// file part, written in order.
func (s *Server) upload(w http.ResponseWriter, r *http.Request, b *box) {
	_, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || params["boundary"] == "" {
		execdError(w, http.StatusBadRequest, "INVALID_FILE", "multipart form is empty")
		return
	}
	mr := multipart.NewReader(io.LimitReader(r.Body, maxBody), params["boundary"])
	var meta []gjson.Result
	files := 0
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			execdError(w, http.StatusBadRequest, "INVALID_FILE", "multipart form is empty")
			return
		}
		switch part.FormName() {
		case "metadata":
			if part.FileName() == "" {
				execdError(w, http.StatusBadRequest, "INVALID_FILE_METADATA", "metadata file is missing")
				return
			}
			raw, _ := io.ReadAll(io.LimitReader(part, 64<<10))
			if !gjson.ValidBytes(raw) {
				execdError(w, http.StatusBadRequest, "INVALID_FILE_METADATA", "invalid metadata json")
				return
			}
			meta = append(meta, gjson.ParseBytes(raw))
		case "file":
			if part.FileName() == "" {
				execdError(w, http.StatusBadRequest, "INVALID_FILE_CONTENT", "file is missing")
				return
			}
			if files >= len(meta) {
				execdError(w, http.StatusBadRequest, "INVALID_FILE", fmt.Sprintf("metadata and file count mismatch: %d metadata, %d files", len(meta), files+1))
				return
			}
			m := meta[files]
			files++
			p := m.Get("path").String()
			if p == "" {
				execdError(w, http.StatusBadRequest, "INVALID_FILE_METADATA", "metadata path is empty")
				return
			}
			if p, err = resolve(p); err != nil {
				execdError(w, http.StatusBadRequest, "INVALID_FILE_METADATA", err.Error())
				return
			}
			mode := m.Get("mode").Int()
			if mode == 0 {
				mode = 755
			}
			buf := make([]byte, fsChunk)
			for first := true; ; first = false {
				n, rerr := io.ReadFull(part, buf)
				if n > 0 || first {
					a, err := s.fsOp(r.Context(), b, "write", map[string]any{"path": p, "append": !first, "mode": mode,
						"data": base64.StdEncoding.EncodeToString(buf[:n])})
					if !reply(w, a, err) {
						return
					}
				}
				if rerr != nil {
					if !errors.Is(rerr, io.EOF) && !errors.Is(rerr, io.ErrUnexpectedEOF) {
						execdError(w, http.StatusBadRequest, "INVALID_FILE_CONTENT", rerr.Error())
						return
					}
					break
				}
			}
		}
	}
	if len(meta) == 0 && files == 0 {
		execdError(w, http.StatusBadRequest, "INVALID_FILE", "multipart form is empty")
		return
	}
	if len(meta) != files {
		execdError(w, http.StatusBadRequest, "INVALID_FILE", fmt.Sprintf("metadata and file count mismatch: %d metadata, %d files", len(meta), files))
		return
	}
	w.WriteHeader(http.StatusOK)
}
