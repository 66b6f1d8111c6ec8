// Package daytonatest is a test double of Daytona's hosted API as the daytona backend calls it
// (docs/sandbox-daytona.md): the Daytona API's sandbox lifecycle (create, get, list by labels,
// delete, auto-stop and auto-delete, with its states and its NestJS error bodies), and each
// sandbox's toolbox behind the toolbox proxy: the interpreter's contexts and its WebSocket run
// protocol (messages, control frames, close codes), process/execute, sessions whose logs stream
// with their stdout/stderr markers, and the files API. Code runs for real, through another
// sandbox.Provider (the local bubblewrap backend): one exec sandbox per Daytona sandbox, whose
// kernel holds the interpreter contexts (worker.py) and whose shell runs commands and the file
// operations (fs.py).
//
// Faults can be injected (refused or slow creates, sandboxes that fail to start, streams cut
// mid-run), the clock moved to trigger auto-stop, and live sandboxes counted.
package daytonatest

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

//go:embed worker.py
var workerPy string

//go:embed fs.py
var fsPy string

// States of a sandbox, as Daytona names them.
const (
	StateCreating  = "creating"
	StateStarted   = "started"
	StateStopped   = "stopped"
	StateError     = "error"
	StateDestroyed = "destroyed"
)

const (
	maxBody        = 64 << 20
	cleanupTimeout = 30 * time.Second
	// ToolboxPath is where the toolbox proxy is served, below the server's URL.
	ToolboxPath = "/toolbox"
	// OrganizationID is the organization every sandbox belongs to.
	OrganizationID = "0b1c5e2a-org"
)

// Server is the double. Its methods are safe for concurrent use.
type Server struct {
	srv    *httptest.Server
	exec   sandbox.Provider
	shell  sandbox.Shell
	fs     sandbox.FileSystem
	apiKey string

	ctx    context.Context // ends at Close: runs and starts that outlive their request
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu          sync.Mutex
	offset      time.Duration
	sandboxes   map[string]*dtnSandbox
	creates     int
	deletes     int
	executions  int
	createFault struct{ n, status int }
	startDelay  time.Duration
	startFail   int
	cutAfter    struct{ n, after int }
	lastCreate  json.RawMessage
}

// dtnSandbox is one sandbox. Fields are guarded by Server.mu.
type dtnSandbox struct {
	id           string
	name         string
	snapshot     string
	labels       map[string]string
	state        string
	errorReason  string
	target       string
	cpu, memory  int
	disk         int
	blockAll     bool
	domains      string
	autoStop     int
	autoDelete   int
	createdAt    time.Time
	lastActivity time.Time
	startAt      time.Time // when a creating sandbox becomes started
	handle       sandbox.Handle
	ready        bool   // the exec sandbox is up
	home         string // the daemon's working directory
	ctx          context.Context
	cancel       context.CancelFunc
	contexts     map[string]*interp
	sessions     map[string]*session
}

// New starts a double whose sandboxes run through exec, which must also be a sandbox.Shell and a
// sandbox.FileSystem (the local backend is). The caller keeps exec; Close deletes the exec
// sandboxes the double made.
func New(exec sandbox.Provider) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		exec:      exec,
		apiKey:    "dtn_" + randomHex(24),
		ctx:       ctx,
		cancel:    cancel,
		sandboxes: map[string]*dtnSandbox{},
	}
	s.shell, _ = exec.(sandbox.Shell)
	s.fs, _ = exec.(sandbox.FileSystem)
	// Assigned before the server starts, so that its handlers see it.
	s.srv = httptest.NewUnstartedServer(s)
	s.srv.Start()
	return s
}

// URL is the Daytona API's base URL (DAYTONA_API_URL, ending in /api).
func (s *Server) URL() string { return s.srv.URL + "/api" }

// ToolboxURL is the toolbox proxy's base URL, as sandboxes' toolboxProxyUrl give it.
func (s *Server) ToolboxURL() string { return s.srv.URL + ToolboxPath }

// APIKey is the only key the double accepts.
func (s *Server) APIKey() string { return s.apiKey }

// Close stops the server and deletes every exec sandbox.
func (s *Server) Close() {
	s.srv.CloseClientConnections()
	s.srv.Close()
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	var hs []sandbox.Handle
	for _, sb := range s.sandboxes {
		if sb.ready {
			hs = append(hs, sb.handle)
		}
		sb.ready = false
	}
	s.sandboxes = map[string]*dtnSandbox{}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	for _, h := range hs {
		_ = s.exec.Delete(ctx, h)
	}
}

// Now is the double's clock: the real time moved by Advance.
func (s *Server) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now()
}

func (s *Server) now() time.Time { return time.Now().Add(s.offset) }

// Advance moves the clock: sandboxes idle past their auto-stop interval stop, and those whose
// auto-delete interval is 0 are deleted.
func (s *Server) Advance(d time.Duration) {
	s.mu.Lock()
	s.offset += d
	s.mu.Unlock()
	s.sweep()
}

// Creates, Deletes and Executions count the creates accepted, the deletes of a live sandbox and
// the interpreter runs. Live counts the sandboxes that are not destroyed.
func (s *Server) Creates() int    { s.mu.Lock(); defer s.mu.Unlock(); return s.creates }
func (s *Server) Deletes() int    { s.mu.Lock(); defer s.mu.Unlock(); return s.deletes }
func (s *Server) Executions() int { s.mu.Lock(); defer s.mu.Unlock(); return s.executions }
func (s *Server) Live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sb := range s.sandboxes {
		if sb.state != StateDestroyed {
			n++
		}
	}
	return n
}

// Sandboxes returns the ids of the live sandboxes, sorted.
func (s *Server) Sandboxes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id, sb := range s.sandboxes {
		if sb.state != StateDestroyed {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// LastCreate is the body of the last create accepted.
func (s *Server) LastCreate() json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastCreate
}

// State returns a sandbox's state ("" when unknown).
func (s *Server) State(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb, ok := s.sandboxes[id]; ok {
		return sb.state
	}
	return ""
}

// FailCreates makes the next n creates answer status (429, 500, 403 ...).
func (s *Server) FailCreates(n, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.createFault.n, s.createFault.status = n, status
}

// SlowStarts keeps every sandbox created from now on in state creating for d.
func (s *Server) SlowStarts(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.startDelay = d
}

// FailStarts makes the next n sandboxes end in state error instead of started.
func (s *Server) FailStarts(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.startFail = n
}

// CutStreams makes the next n interpreter runs lose their connection (no close frame) after
// after messages.
func (s *Server) CutStreams(n, after int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cutAfter.n, s.cutAfter.after = n, after
}

// Destroy deletes a sandbox behind its owner's back, as Daytona's auto-delete or another client
// would.
func (s *Server) Destroy(id string) bool {
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	s.mu.Unlock()
	if !ok {
		return false
	}
	s.destroy(sb)
	return true
}

// ServeHTTP routes the API and the toolbox proxy.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	s.sweep()
	switch {
	case strings.HasPrefix(r.URL.Path, "/api/"):
		if !s.authorized(r) {
			apiError(w, r, http.StatusUnauthorized, "Unauthorized")
			return
		}
		s.api(w, r, strings.TrimPrefix(r.URL.Path, "/api"))
	case strings.HasPrefix(r.URL.Path, ToolboxPath+"/"):
		if !s.authorized(r) {
			apiError(w, r, http.StatusUnauthorized, "Unauthorized")
			return
		}
		s.toolbox(w, r, strings.TrimPrefix(r.URL.Path, ToolboxPath+"/"))
	default:
		apiError(w, r, http.StatusNotFound, "Cannot "+r.Method+" "+r.URL.Path)
	}
}

func (s *Server) authorized(r *http.Request) bool {
	return r.Header.Get("Authorization") == "Bearer "+s.apiKey
}

// apiError writes the API's NestJS error body.
func apiError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	writeJSON(w, status, map[string]any{
		"path": r.URL.Path, "timestamp": time.Now().UTC().Format("2006-01-02T15:04:05.000Z"),
		"statusCode": status, "error": http.StatusText(status), "message": msg,
	})
}

// daemonError writes the toolbox daemon's error body.
func daemonError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	code := map[int]string{400: "BAD_REQUEST", 403: "FORBIDDEN", 404: "NOT_FOUND", 408: "REQUEST_TIMEOUT",
		409: "CONFLICT", 410: "GONE", 422: "UNPROCESSABLE_ENTITY"}[status]
	if code == "" {
		code = "INTERNAL_SERVER_ERROR"
	}
	writeJSON(w, status, map[string]any{"statusCode": status, "message": msg, "code": code,
		"timestamp": time.Now().UTC().Format(time.RFC3339), "path": r.URL.Path, "method": r.Method})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	if v != nil {
		_ = json.NewEncoder(w).Encode(v)
	}
}

// sweep stops the sandboxes idle past their auto-stop interval, and deletes those stopped whose
// auto-delete interval is 0.
func (s *Server) sweep() {
	s.mu.Lock()
	now := s.now()
	var gone []*dtnSandbox
	for _, sb := range s.sandboxes {
		if sb.state == StateStarted && sb.autoStop > 0 && now.Sub(sb.lastActivity) >= time.Duration(sb.autoStop)*time.Minute {
			sb.state = StateStopped
		}
		if sb.state == StateStopped && sb.autoDelete == 0 {
			gone = append(gone, sb)
		}
	}
	s.mu.Unlock()
	for _, sb := range gone {
		s.destroy(sb)
	}
}

// destroy ends a sandbox: its runs, sessions and exec sandbox.
func (s *Server) destroy(sb *dtnSandbox) {
	s.mu.Lock()
	if sb.state == StateDestroyed {
		s.mu.Unlock()
		return
	}
	sb.state = StateDestroyed
	ready := sb.ready
	sb.ready = false
	delete(s.sandboxes, sb.id)
	s.mu.Unlock()
	sb.cancel()
	if ready {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_ = s.exec.Delete(ctx, sb.handle)
	}
}

// view is the Sandbox object of the API.
func (s *Server) view(sb *dtnSandbox) map[string]any {
	return map[string]any{
		"id": sb.id, "organizationId": OrganizationID, "name": sb.name, "snapshot": sb.snapshot,
		"user": "daytona", "env": map[string]string{}, "labels": sb.labels, "public": false,
		"networkBlockAll": sb.blockAll, "networkAllowList": nil, "domainAllowList": sb.domains,
		"target": sb.target, "cpu": sb.cpu, "gpu": 0, "memory": sb.memory, "disk": sb.disk,
		"state": sb.state, "desiredState": StateStarted, "errorReason": sb.errorReason, "recoverable": false,
		"autoStopInterval": sb.autoStop, "autoArchiveInterval": 10080, "autoDeleteInterval": sb.autoDelete,
		"volumes": []any{}, "createdAt": sb.createdAt.UTC().Format(time.RFC3339Nano),
		"updatedAt": s.now().UTC().Format(time.RFC3339Nano), "lastActivityAt": sb.lastActivity.UTC().Format(time.RFC3339Nano),
		"daemonVersion": "0.190.0", "runnerId": "runner-1", "toolboxProxyUrl": s.ToolboxURL(),
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func uuid() string {
	h := randomHex(16)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
