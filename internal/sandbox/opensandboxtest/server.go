// Package opensandboxtest is a test double of an OpenSandbox deployment: an httptest server that
// speaks the lifecycle API (create, get, list, renew, delete, endpoints; its auth, validation
// errors and state transitions) and, behind an ingress gateway in header mode, execd (code
// contexts, commands, files, ping) with its SSE framing, as docs/sandbox-opensandbox.md describes
// them. Code really runs: each sandbox is one sandbox of another sandbox.Provider (normally the
// local bubblewrap backend) whose kernel plays the context's IPython kernel (kernel.py gives it
// get_ipython().events, and execd's dropping of display_data is kept), and whose shell runs the
// commands; the files API runs in that kernel as hidden cells (execd_fs.py).
//
// Differences from a deployment: one kernel per sandbox (a second context gets a sandbox of its
// own, with its own files); file operations wait for a run in progress; a kernel that dies takes
// the sandbox's files with it; network policies are recorded, not enforced.
//
// Faults can be injected (refused or slow creates, sandboxes created Pending, streams cut, a
// sandbox removed behind the client's back) and the clock moved to expire sandboxes.
package opensandboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Constants of the emulated deployment.
const (
	ExecdPort = 44772
	// IngressHeader routes a gateway request to a sandbox's port: "<id>-<port>".
	IngressHeader = "OpenSandbox-Ingress-To"
	maxBody       = 64 << 20
	cleanupTime   = 30 * time.Second
)

// Server is the double. Its methods are safe for concurrent use.
type Server struct {
	srv    *httptest.Server
	exec   Exec
	apiKey string
	mux    *http.ServeMux // lifecycle routes
	execd  *http.ServeMux

	mu          sync.Mutex
	offset      time.Duration
	sandboxes   map[string]*box
	creates     int
	deletes     int
	runs        int
	failCreates []int // statuses of the next creates to refuse
	createDelay time.Duration
	pending     time.Duration // new sandboxes stay Pending this long
	cutRuns     int           // the next runs' streams are cut ...
	cutAfter    int           // ... after this many events
	bodies      map[string][]byte
	headers     map[string]http.Header
	wg          sync.WaitGroup
}

// Exec is what runs the sandboxes' code: a sandbox.Provider whose Handles the double keeps, with
// a shell beside its kernel.
type Exec interface {
	sandbox.Provider
	sandbox.Shell
}

// box is one emulated sandbox. Its fields are guarded by Server.mu, but for the kernel's, which
// kernelMu guards (one run at a time: execd's "session is busy" otherwise).
type box struct {
	id         string
	token      string // the execd access token its env gave
	state      string
	readyAt    time.Time
	created    time.Time
	expires    time.Time // zero: no expiry
	metadata   map[string]string
	image      string
	entrypoint []string
	policy     json.RawMessage
	env        map[string]string // create's env

	exec     sandbox.Handle
	contexts map[string]*kernelCtx
	commands map[string]*command
}

// kernelCtx is one code context: a kernel of the exec provider.
type kernelCtx struct {
	id     string
	cwd    string
	h      sandbox.Handle // its exec sandbox: the box's own for the first context
	own    bool           // h is the context's own, deleted with it
	busy   bool
	count  int                // user runs that reached the kernel, execd's execution_count
	cancel context.CancelFunc // of the run in progress
}

// New returns a running double executing through exec, with a fresh API key.
func New(exec Exec) *Server {
	s := &Server{exec: exec, apiKey: randomHex(16), sandboxes: map[string]*box{},
		bodies: map[string][]byte{}, headers: map[string]http.Header{}}
	s.routes()
	s.srv = httptest.NewServer(s)
	return s
}

// URL is the lifecycle API's base, /v1 included (api_base).
func (s *Server) URL() string { return s.srv.URL + "/v1" }

// APIKey is the key the lifecycle API wants in OPEN-SANDBOX-API-KEY.
func (s *Server) APIKey() string { return s.apiKey }

// Close stops the server and deletes every sandbox's exec sandbox.
func (s *Server) Close() {
	s.srv.CloseClientConnections()
	s.srv.Close()
	s.wg.Wait()
	s.mu.Lock()
	var hs []sandbox.Handle
	for id, b := range s.sandboxes {
		hs = append(hs, b.handles()...)
		delete(s.sandboxes, id)
	}
	s.mu.Unlock()
	s.deleteExec(hs)
}

// Advance moves the double's clock by d (sandboxes past their expiresAt are then deleted).
func (s *Server) Advance(d time.Duration) {
	s.mu.Lock()
	s.offset += d
	s.mu.Unlock()
	s.sweep()
}

func (s *Server) nowLocked() time.Time { return time.Now().Add(s.offset) }

// FailNextCreates makes the next len(statuses) creates answer those statuses.
func (s *Server) FailNextCreates(statuses ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failCreates = append(s.failCreates, statuses...)
}

// SetCreateDelay makes every create take d before it answers (0: none).
func (s *Server) SetCreateDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.createDelay = d
}

// SetPending makes new sandboxes answer Pending, and be Running only d later (0: Running at once,
// as the 2026-06 server does).
func (s *Server) SetPending(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = d
}

// CutNextRuns cuts the next n /code streams after `after` events (init and ping included).
func (s *Server) CutNextRuns(n, after int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cutRuns, s.cutAfter = n, after
}

// Remove deletes a sandbox behind its client's back, as an operator or an expiry would.
func (s *Server) Remove(id string) bool {
	s.mu.Lock()
	b, ok := s.sandboxes[id]
	if ok {
		delete(s.sandboxes, id)
	}
	s.mu.Unlock()
	if ok {
		s.deleteExec(b.handles())
	}
	return ok
}

// Live is how many sandboxes exist (not deleted, not expired).
func (s *Server) Live() int {
	s.sweep()
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sandboxes)
}

// IDs are the live sandboxes' ids.
func (s *Server) IDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for id := range s.sandboxes {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// Creates, Deletes and Runs count the successful creates, deletes and the /code runs.
func (s *Server) Creates() int { s.mu.Lock(); defer s.mu.Unlock(); return s.creates }
func (s *Server) Deletes() int { s.mu.Lock(); defer s.mu.Unlock(); return s.deletes }
func (s *Server) Runs() int    { s.mu.Lock(); defer s.mu.Unlock(); return s.runs }

// LastBody and LastHeader are the body and headers of the last request of a route ("POST
// /v1/sandboxes", "POST /code", ...).
func (s *Server) LastBody(route string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bodies[route]
}

func (s *Server) LastHeader(route string) http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.headers[route]
}

// Metadata returns a live sandbox's metadata.
func (s *Server) Metadata(id string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.sandboxes[id]; ok {
		return copyMap(b.metadata)
	}
	return nil
}

// Policy returns the networkPolicy a live sandbox was created with.
func (s *Server) Policy(id string) json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.sandboxes[id]; ok {
		return b.policy
	}
	return nil
}

// ServeHTTP routes a request: to a sandbox's execd when it carries the gateway's routing header,
// else to the lifecycle API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.sweep()
	if to := r.Header.Get(IngressHeader); to != "" {
		s.gateway(w, r, to)
		return
	}
	w.Header().Set("X-Request-ID", requestID(r))
	s.mux.ServeHTTP(w, r)
}

func requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-ID"); id != "" {
		return id
	}
	return randomHex(16)
}

// gateway is the ingress in header mode: text errors, the routing header removed.
func (s *Server) gateway(w http.ResponseWriter, r *http.Request, to string) {
	w.Header().Set("Reverse-Proxy-Server-PowerBy", "OpenSandbox-ingress")
	i := strings.LastIndexByte(to, '-')
	if i <= 0 {
		http.Error(w, "OpenSandbox Ingress: invalid ingress route: "+to, http.StatusBadRequest)
		return
	}
	id, port := to[:i], to[i+1:]
	s.mu.Lock()
	b, ok := s.sandboxes[id]
	ready := ok && b.state == "Running"
	token := ""
	if ok {
		token = b.token
	}
	s.mu.Unlock()
	switch {
	case !ok:
		http.Error(w, "OpenSandbox Ingress: sandbox not found", http.StatusNotFound)
		return
	case !ready:
		http.Error(w, "OpenSandbox Ingress: sandbox not ready", http.StatusServiceUnavailable)
		return
	case port != strconv.Itoa(ExecdPort):
		http.Error(w, "OpenSandbox Ingress: dial tcp: connection refused", http.StatusBadGateway)
		return
	}
	r.Header.Del(IngressHeader)
	if token != "" && r.Header.Get("X-EXECD-ACCESS-TOKEN") != token {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"})
		return
	}
	ctx := context.WithValue(r.Context(), boxKey{}, id)
	s.execd.ServeHTTP(w, r.WithContext(ctx))
}

type boxKey struct{}

// sweep deletes the sandboxes past their expiry and moves Pending ones whose time came to Running.
func (s *Server) sweep() {
	s.mu.Lock()
	now := s.nowLocked()
	var hs []sandbox.Handle
	for id, b := range s.sandboxes {
		if !b.expires.IsZero() && !now.Before(b.expires) {
			hs = append(hs, b.handles()...)
			delete(s.sandboxes, id)
			continue
		}
		if b.state == "Pending" && !now.Before(b.readyAt) {
			b.state = "Running"
		}
	}
	s.mu.Unlock()
	s.deleteExec(hs)
}

func (b *box) handles() []sandbox.Handle {
	var hs []sandbox.Handle
	if b.exec.ID != "" {
		hs = append(hs, b.exec)
	}
	for _, c := range b.contexts {
		if c.own {
			hs = append(hs, c.h)
		}
		if c.cancel != nil {
			c.cancel()
		}
	}
	return hs
}

func (s *Server) deleteExec(hs []sandbox.Handle) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTime)
	defer cancel()
	for _, h := range hs {
		_ = s.exec.Delete(ctx, h)
	}
}

// record keeps a request's body and headers for LastBody and LastHeader.
func (s *Server) record(route string, r *http.Request, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bodies[route] = body
	s.headers[route] = r.Header.Clone()
}

func readBody(r *http.Request) ([]byte, error) {
	return io.ReadAll(io.LimitReader(r.Body, maxBody))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// serviceError is the lifecycle's {"code","message"}.
func serviceError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{code, msg})
}

// execdError is execd's {"code","message"}, with gin's content type.
func execdError(w http.ResponseWriter, status int, code, msg string) {
	b, _ := json.Marshal(struct {
		Code    string `json:"code,omitempty"`
		Message string `json:"message,omitempty"`
	}{code, msg})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// validationError is FastAPI's 422 for one rule.
func validationError(w http.ResponseWriter, typ string, loc []any, msg string, input any) {
	writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": []any{
		map[string]any{"type": typ, "loc": loc, "msg": msg, "input": input},
	}})
}

var labelRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	x := hex.EncodeToString(b)
	return x[:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:]
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// pydantic writes times as RFC 3339 with microseconds when not zero, and Z.
func pyTime(t time.Time) string {
	t = t.UTC()
	if t.Nanosecond()/1000 == 0 {
		return t.Format("2006-01-02T15:04:05Z")
	}
	return t.Format("2006-01-02T15:04:05.000000Z")
}

// unescapeMetadata decodes a list's metadata query value ("k=v&k2=v2", itself URL-encoded).
func unescapeMetadata(v string) (map[string]string, bool) {
	out := map[string]string{}
	if v == "" {
		return out, true
	}
	for _, seg := range strings.Split(v, "&") {
		k, val, ok := strings.Cut(seg, "=")
		if !ok {
			return nil, false
		}
		k, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(val)
		if err1 != nil || err2 != nil {
			return nil, false
		}
		out[k] = val
	}
	return out, true
}
