package agentsandboxtest

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The files API of sandboxd, after upstream's packages/sandboxd/pkg/server/filesystem.go,
// metadata.go and pkg/pathutil/sandbox.go, rooted at the host directory that the pod sees as
// /mnt/data. Symlinks are evaluated on the host: a link to an absolute pod path under /mnt/data
// resolves (on the host) outside the root and is refused, where the real sandboxd would follow
// it; links to anything else behave as in the pod.

var errPathEscapes = errors.New("path escapes sandbox root")

// sanitizePath is upstream's pathutil.SanitizePath.
func sanitizePath(rootDir, userPath string) (string, error) {
	if rootDir == "" {
		return "", errors.New("sandbox rootDir is required and cannot be empty")
	}
	cleanRoot, err := filepath.Abs(filepath.Clean(rootDir))
	if err != nil {
		return "", fmt.Errorf("invalid sandbox root dir: %w", err)
	}
	if r, err := filepath.EvalSymlinks(cleanRoot); err == nil {
		cleanRoot = r
	}
	userPathClean := filepath.Clean(userPath)
	if userPathClean == cleanRoot {
		userPathClean = "."
	} else if after, found := strings.CutPrefix(userPathClean, cleanRoot+string(os.PathSeparator)); found {
		userPathClean = after
	}
	joined := filepath.Clean(filepath.Join(cleanRoot, userPathClean))
	resolved, err := filepath.EvalSymlinks(joined)
	if err != nil {
		if !os.IsNotExist(err) {
			return "", fmt.Errorf("failed to evaluate symlinks: %w", err)
		}
		ancestor := joined
		var suffix []string
		for {
			suffix = append([]string{filepath.Base(ancestor)}, suffix...)
			ancestor = filepath.Dir(ancestor)
			ra, aErr := filepath.EvalSymlinks(ancestor)
			if aErr == nil {
				resolved = filepath.Join(append([]string{ra}, suffix...)...)
				break
			}
			if !os.IsNotExist(aErr) {
				return "", fmt.Errorf("failed to evaluate symlinks: %w", aErr)
			}
			if ancestor == filepath.Dir(ancestor) {
				return "", fmt.Errorf("access denied: path %q: %w", userPath, errPathEscapes)
			}
		}
	}
	if resolved != cleanRoot && !strings.HasPrefix(resolved, cleanRoot+string(os.PathSeparator)) {
		return "", fmt.Errorf("access denied: path %q: %w", userPath, errPathEscapes)
	}
	return resolved, nil
}

// realDir is dir with symlinks evaluated (as sanitizePath returns paths).
func realDir(dir string) string {
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		return r
	}
	return dir
}

var modePattern = regexp.MustCompile(`^0[0-7]{3}$`)

type filesServer struct {
	rootDir      string
	resolvedRoot string
	// podRoot is the root as the commands see it, when that is not rootDir (a pod's
	// /mnt/data); owner the uid (and gid) that what the server creates is given, -1 to leave
	// it to the server's own, as sandboxd in its container.
	podRoot string
	owner   int
	start   time.Time
	env     map[string]string
}

type fileEntry struct {
	Name       string `json:"name"`
	Size       int64  `json:"size"`
	Type       string `json:"type"`
	ModifiedAt string `json:"modified_at"`
	Mode       string `json:"mode,omitempty"`
}

type directoryListing struct {
	Path    string      `json:"path"`
	Entries []fileEntry `json:"entries"`
}

type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

var sensitiveEnvMarkers = []string{"TOKEN", "SECRET", "PASSWORD", "PASSWD", "CRED", "KEY", "AUTH", "BEARER", "PRIVATE", "CERT"}

func newFilesServer(root string, env []string) *filesServer {
	resolved, err := sanitizePath(root, ".")
	if err != nil {
		resolved = root
	}
	meta := map[string]string{}
	for _, kv := range env {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, "SANDBOX_") {
			continue
		}
		sensitive := false
		for _, m := range sensitiveEnvMarkers {
			if strings.Contains(strings.ToUpper(name), m) {
				sensitive = true
			}
		}
		if !sensitive {
			meta[name] = value
		}
	}
	return &filesServer{rootDir: root, resolvedRoot: resolved, podRoot: podRoot, owner: podUID, start: time.Now(), env: meta}
}

func (s *filesServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/files/{path...}", s.handleGet)
	mux.HandleFunc("PUT /v1/files/{path...}", s.handlePut)
	mux.HandleFunc("DELETE /v1/files/{path...}", s.handleDelete)
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "uptime_seconds": int64(time.Since(s.start).Seconds())})
	})
	mux.HandleFunc("GET /v1/metadata", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"env": s.env})
	})
	return mux
}

func writeFileError(w http.ResponseWriter, code int, c, msg string) {
	writeJSON(w, code, apiError{Code: c, Message: msg})
}

// podRelative turns a path the pod names absolutely under /mnt/data into one relative to the
// root, as sandboxd (rooted at /mnt/data) would accept it.
func (s *filesServer) podRelative(p string) string {
	if s.podRoot != "" && (p == s.podRoot || strings.HasPrefix(p, s.podRoot+"/")) {
		return strings.TrimPrefix(strings.TrimPrefix(p, s.podRoot), "/")
	}
	return p
}

func (s *filesServer) resolve(w http.ResponseWriter, r *http.Request) (string, bool) {
	target, err := sanitizePath(s.rootDir, s.podRelative(r.PathValue("path")))
	if err != nil {
		if errors.Is(err, errPathEscapes) {
			writeFileError(w, http.StatusForbidden, "PERMISSION_DENIED", "path traversal outside sandbox root is forbidden")
		} else {
			writeFileError(w, http.StatusInternalServerError, "INTERNAL", err.Error())
		}
		return "", false
	}
	return target, true
}

func (s *filesServer) handleGet(w http.ResponseWriter, r *http.Request) {
	target, ok := s.resolve(w, r)
	if !ok {
		return
	}
	info, err := os.Stat(target)
	if err != nil {
		switch {
		case os.IsNotExist(err):
			writeFileError(w, http.StatusNotFound, "NOT_FOUND", "path does not exist within the sandbox")
		case os.IsPermission(err):
			writeFileError(w, http.StatusForbidden, "PERMISSION_DENIED", "permission denied")
		default:
			writeFileError(w, http.StatusInternalServerError, "INTERNAL", err.Error())
		}
		return
	}
	if info.IsDir() {
		s.list(w, r, target)
		return
	}
	f, err := os.Open(target)
	if err != nil {
		writeFileError(w, http.StatusInternalServerError, "INTERNAL", err.Error())
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", info.ModTime(), f)
}

func (s *filesServer) list(w http.ResponseWriter, r *http.Request, target string) {
	des, err := os.ReadDir(target)
	if err != nil {
		writeFileError(w, http.StatusInternalServerError, "INTERNAL", err.Error())
		return
	}
	entries := make([]fileEntry, 0, len(des))
	for _, e := range des {
		info, err := e.Info()
		if err != nil {
			continue
		}
		if e.Type()&os.ModeSymlink != 0 {
			resolved, err := sanitizePath(s.rootDir, filepath.Join(s.podRelative(r.PathValue("path")), e.Name()))
			if err != nil {
				continue
			}
			if info, err = os.Stat(resolved); err != nil {
				continue
			}
		}
		typ := "file"
		if info.IsDir() {
			typ = "directory"
		}
		entries = append(entries, fileEntry{Name: e.Name(), Size: info.Size(), Type: typ,
			ModifiedAt: info.ModTime().UTC().Format(time.RFC3339), Mode: fmt.Sprintf("%04o", info.Mode().Perm())})
	}
	rel := r.PathValue("path")
	if !strings.HasPrefix(rel, "/") {
		rel = "/" + rel
	}
	writeJSON(w, http.StatusOK, directoryListing{Path: rel, Entries: entries})
}

func (s *filesServer) handlePut(w http.ResponseWriter, r *http.Request) {
	mode := os.FileMode(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		if !modePattern.MatchString(m) {
			writeFileError(w, http.StatusBadRequest, "INVALID_ARGUMENT", fmt.Sprintf("mode %q must match ^0[0-7]{3}$", m))
			return
		}
		v, _ := strconv.ParseUint(m, 8, 32)
		mode = os.FileMode(v)
	}
	target, ok := s.resolve(w, r)
	if !ok {
		return
	}
	if info, err := os.Stat(target); err == nil && info.IsDir() {
		writeFileError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "target path is a directory")
		return
	}
	body, cleanup, err := requestFileBody(r)
	if err != nil {
		writeFileError(w, http.StatusBadRequest, "INVALID_ARGUMENT", err.Error())
		return
	}
	defer cleanup()
	if err := s.atomicWrite(target, body, mode); err != nil {
		if os.IsPermission(err) {
			writeFileError(w, http.StatusForbidden, "PERMISSION_DENIED", "permission denied")
		} else {
			writeFileError(w, http.StatusInternalServerError, "INTERNAL", err.Error())
		}
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func requestFileBody(r *http.Request) (io.Reader, func(), error) {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if ct != "" && err == nil && mt == "multipart/form-data" {
		mr, err := r.MultipartReader()
		if err != nil {
			return nil, nil, fmt.Errorf("invalid multipart body: %w", err)
		}
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				return nil, nil, fmt.Errorf("multipart body is missing the required %q part", "file")
			}
			if err != nil {
				return nil, nil, fmt.Errorf("invalid multipart body: %w", err)
			}
			if part.FormName() == "file" {
				return part, func() { _ = part.Close() }, nil
			}
			_ = part.Close()
		}
	}
	return r.Body, func() {}, nil
}

// atomicWrite is upstream's temp-file-then-rename; what it creates belongs to the pod's user,
// as when sandboxd (uid 1000) writes it.
func (s *filesServer) atomicWrite(target string, src io.Reader, mode os.FileMode) (err error) {
	dir := filepath.Dir(target)
	if err := s.mkdirAll(dir); err != nil {
		return fmt.Errorf("failed to create parent directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".sandboxd-tmp-*")
	if err != nil {
		return fmt.Errorf("failed to create temp file: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if err = tmp.Chmod(mode); err != nil {
		return err
	}
	if s.owner >= 0 {
		if err = tmp.Chown(s.owner, s.owner); err != nil {
			return err
		}
	}
	if _, err = io.Copy(tmp, src); err != nil {
		return fmt.Errorf("failed to write file contents: %w", err)
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), target)
}

func (s *filesServer) mkdirAll(dir string) error {
	if st, err := os.Stat(dir); err == nil && st.IsDir() {
		return nil
	}
	if err := s.mkdirAll(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return err
	}
	if s.owner < 0 {
		return nil
	}
	return os.Chown(dir, s.owner, s.owner)
}

func (s *filesServer) handleDelete(w http.ResponseWriter, r *http.Request) {
	target, ok := s.resolve(w, r)
	if !ok {
		return
	}
	if _, err := os.Lstat(target); err != nil {
		if os.IsNotExist(err) {
			writeFileError(w, http.StatusNotFound, "NOT_FOUND", "path does not exist within the sandbox")
		} else {
			writeFileError(w, http.StatusInternalServerError, "INTERNAL", err.Error())
		}
		return
	}
	recursive := false
	if rp := r.URL.Query().Get("recursive"); rp != "" {
		v, err := strconv.ParseBool(rp)
		if err != nil {
			writeFileError(w, http.StatusBadRequest, "INVALID_ARGUMENT", fmt.Sprintf("recursive %q must be a boolean", rp))
			return
		}
		recursive = v
	}
	if target == s.resolvedRoot {
		if !recursive {
			writeFileError(w, http.StatusConflict, "CONFLICT", "cannot delete the sandbox root; pass recursive=true to clear its contents")
			return
		}
		des, err := os.ReadDir(target)
		if err != nil {
			writeFileError(w, http.StatusInternalServerError, "INTERNAL", err.Error())
			return
		}
		for _, e := range des {
			if err := os.RemoveAll(filepath.Join(target, e.Name())); err != nil {
				writeFileError(w, http.StatusInternalServerError, "INTERNAL", err.Error())
				return
			}
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	var err error
	if recursive {
		err = os.RemoveAll(target)
	} else {
		err = os.Remove(target)
	}
	if err != nil {
		switch {
		case errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST):
			writeFileError(w, http.StatusConflict, "CONFLICT", "directory is not empty; pass recursive=true to remove it")
		case os.IsPermission(err):
			writeFileError(w, http.StatusForbidden, "PERMISSION_DENIED", "permission denied")
		default:
			writeFileError(w, http.StatusInternalServerError, "INTERNAL", err.Error())
		}
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
