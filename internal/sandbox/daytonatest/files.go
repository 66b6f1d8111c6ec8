package daytonatest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// fsTimeout bounds one file operation (a download of a FIFO blocks, as on the daemon, until it).
const fsTimeout = 60 * time.Second

// fsOp runs one operation of fs.py in the sandbox and returns its answer.
func (s *Server) fsOp(ctx context.Context, sb *dtnSandbox, op string, args map[string]any) (int, gjson.Result, string, error) {
	a, _ := json.Marshal(args)
	cmd := "python3 -c " + shq(fsPy) + " " + op + " " + base64.StdEncoding.EncodeToString(a)
	ctx, cancel := context.WithTimeout(ctx, fsTimeout)
	defer cancel()
	res, out, err := s.shellRun(ctx, sb, cmd, fsTimeout)
	if err != nil {
		return 0, gjson.Result{}, "", err
	}
	if res.TimedOut {
		return http.StatusRequestTimeout, gjson.Result{}, "operation timed out", nil
	}
	line := strings.TrimSpace(out)
	if i := strings.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:]
	}
	if !gjson.Valid(line) {
		return 0, gjson.Result{}, "", fmt.Errorf("file operation %s answered %q", op, out)
	}
	v := gjson.Parse(line)
	return int(v.Get("status").Int()), v.Get("body"), v.Get("message").String(), nil
}

// files serves /files...
func (s *Server) files(w http.ResponseWriter, r *http.Request, sb *dtnSandbox, sub string) {
	q := r.URL.Query()
	p := q.Get("path")
	need := func(v string, name string) bool {
		if v == "" {
			daemonError(w, r, http.StatusBadRequest, name+" is required")
			return false
		}
		return true
	}
	answer := func(op string, args map[string]any, okStatus int) {
		status, body, msg, err := s.fsOp(r.Context(), sb, op, args)
		switch {
		case err != nil:
			daemonError(w, r, http.StatusInternalServerError, err.Error())
		case status >= 300:
			daemonError(w, r, status, msg)
		case okStatus == http.StatusNoContent || okStatus == http.StatusCreated && !body.Exists():
			w.WriteHeader(okStatus)
		case !body.Exists() || body.Type == gjson.Null:
			w.WriteHeader(okStatus)
		default:
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			w.WriteHeader(okStatus)
			_, _ = w.Write([]byte(body.Raw))
		}
	}
	switch {
	case sub == "" && r.Method == http.MethodGet:
		if p == "" {
			p = "."
		}
		answer("list", map[string]any{"path": absolute(sb, p)}, http.StatusOK)
	case sub == "" && r.Method == http.MethodDelete:
		if need(p, "path") {
			answer("delete", map[string]any{"path": absolute(sb, p), "recursive": q.Get("recursive") == "true"}, http.StatusNoContent)
		}
	case sub == "/info" && r.Method == http.MethodGet:
		if need(p, "path") {
			answer("info", map[string]any{"path": absolute(sb, p)}, http.StatusOK)
		}
	case sub == "/folder" && r.Method == http.MethodPost:
		if need(p, "path") && need(q.Get("mode"), "mode") {
			answer("mkdir", map[string]any{"path": absolute(sb, p), "mode": q.Get("mode")}, http.StatusCreated)
		}
	case sub == "/move" && r.Method == http.MethodPost:
		if need(q.Get("source"), "source") && need(q.Get("destination"), "destination") {
			answer("move", map[string]any{"source": absolute(sb, q.Get("source")), "destination": absolute(sb, q.Get("destination"))}, http.StatusOK)
		}
	case sub == "/upload" && r.Method == http.MethodPost:
		if !need(p, "path") {
			return
		}
		mr, err := r.MultipartReader()
		if err != nil {
			daemonError(w, r, http.StatusBadRequest, "request Content-Type isn't multipart/form-data")
			return
		}
		for {
			part, err := mr.NextPart()
			if err != nil {
				daemonError(w, r, http.StatusBadRequest, "http: no such file")
				return
			}
			if part.FormName() != "file" {
				continue
			}
			stage := stageName()
			if err := s.fs.WriteFile(r.Context(), sb.handle, stage, part, maxBody); err != nil {
				daemonError(w, r, http.StatusBadRequest, err.Error())
				return
			}
			answer("put", map[string]any{"path": absolute(sb, p), "stage": sandbox.DataDir + "/" + stage}, http.StatusOK)
			return
		}
	case sub == "/bulk-upload" && r.Method == http.MethodPost:
		// Fields files[i].path (text) and files[i].file (the bytes), in that order per file.
		mr, err := r.MultipartReader()
		if err != nil {
			daemonError(w, r, http.StatusBadRequest, "request Content-Type isn't multipart/form-data")
			return
		}
		paths := map[string]string{}
		for {
			part, err := mr.NextPart()
			if err != nil {
				break
			}
			name := part.FormName()
			idx, field, ok := strings.Cut(strings.TrimPrefix(name, "files["), "].")
			if !ok || !strings.HasPrefix(name, "files[") {
				continue
			}
			switch field {
			case "path":
				var b strings.Builder
				_, _ = io.Copy(&b, io.LimitReader(part, 4096))
				paths[idx] = b.String()
			case "file":
				dest, ok := paths[idx]
				if !ok {
					daemonError(w, r, http.StatusBadRequest, "file "+idx+" has no path")
					return
				}
				stage := stageName()
				if err := s.fs.WriteFile(r.Context(), sb.handle, stage, part, maxBody); err != nil {
					daemonError(w, r, http.StatusBadRequest, err.Error())
					return
				}
				status, _, msg, err := s.fsOp(r.Context(), sb, "put", map[string]any{"path": absolute(sb, dest), "stage": sandbox.DataDir + "/" + stage})
				if err != nil || status >= 300 {
					if err != nil {
						msg, status = err.Error(), http.StatusInternalServerError
					}
					daemonError(w, r, status, msg)
					return
				}
			}
		}
		w.WriteHeader(http.StatusOK)
	case sub == "/download" && r.Method == http.MethodGet:
		if !need(p, "path") {
			return
		}
		stage := stageName()
		status, _, msg, err := s.fsOp(r.Context(), sb, "get", map[string]any{"path": absolute(sb, p), "stage": sandbox.DataDir + "/" + stage})
		switch {
		case err != nil:
			daemonError(w, r, http.StatusInternalServerError, err.Error())
			return
		case status >= 300:
			daemonError(w, r, status, msg)
			return
		}
		var buf bytes.Buffer
		_, err = s.fs.ReadFile(r.Context(), sb.handle, stage, &buf, maxBody)
		if rm, ok := s.fs.(sandbox.FileRemover); ok {
			_ = rm.RemoveFile(context.WithoutCancel(r.Context()), sb.handle, stage)
		}
		if err != nil {
			daemonError(w, r, http.StatusInternalServerError, err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", "attachment; filename="+strings.ReplaceAll(lastElem(p), `"`, ""))
		w.Header().Set("Content-Length", fmt.Sprint(buf.Len()))
		_, _ = w.Write(buf.Bytes())
	default:
		daemonError(w, r, http.StatusNotFound, "404 page not found")
	}
}

// stageName is a file in the exec sandbox's /mnt/data through which bytes pass.
func stageName() string { return ".dtn-stage-" + randomHex(8) }

func lastElem(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}
