// Package e2btest is an e2b emulator for tests: an httptest server that speaks e2b's control-plane
// REST API, its edge proxy's routing and errors, the code-interpreter server (port 49999) and envd's
// health check (port 49983), closely enough that e2b's own SDKs cannot tell it from the service
// (docs/wire-e2b.md). Code runs through another sandbox.Provider, normally the local bubblewrap
// backend, one exec sandbox per emulated kernel. As e2b's code-interpreter-v1 template, a new
// sandbox has no /mnt/data until envd or the code makes it (template.py), although the exec
// sandbox has one.
//
// Faults can be injected (failing creates, slow, failing, cut or broken executions), the clock can be
// moved to expire sandboxes, and the last request of every route is kept for assertions.
package e2btest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
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

// Constants of the emulated service, as e2b sends them.
const (
	ClientID        = "6532622b"
	EnvdVersion     = "0.6.13"
	JupyterPort     = 49999
	EnvdPort        = 49983
	DefaultTemplate = "code-interpreter-v1"
	// Domain is the sandbox domain Host-based tests use ({port}-{id}.e2b.test); any domain is accepted.
	Domain = "e2b.test"

	defaultKeepalive = 5 * time.Second
	cleanupTimeout   = 30 * time.Second
	maxBody          = 64 << 20
)

// Request is one request as the emulator received it.
type Request struct {
	Method string
	URL    *url.URL
	Host   string
	Header http.Header
	Body   []byte
}

// Server is the emulator. Its methods are safe for concurrent use.
type Server struct {
	srv    *httptest.Server
	exec   sandbox.Provider
	apiKey string

	control *http.ServeMux
	jupyter *http.ServeMux
	envd    *http.ServeMux

	mu            sync.Mutex
	clock         func() time.Time
	offset        time.Duration
	keepalive     time.Duration
	sandboxes     map[string]*emuSandbox
	creates       int
	deletes       int
	executions    int
	createFault   createFault
	execDelay     time.Duration
	execFail      statusFault
	streamFault   streamFault
	startFault    startFault
	trafficTokens bool
	maxConcurrent int
	envdVersion   string
	lazyKernels   bool
	requests      map[string]Request
	transports    []*http.Transport
}

type createFault struct {
	n          int
	status     int
	retryAfter time.Duration
}

type statusFault struct {
	n      int
	status int
}

type startFault struct {
	n     int
	delay time.Duration
}

type streamFault struct {
	n        int
	after    int
	midLine  bool
	disabled bool
}

// emuSandbox is one emulated sandbox. Its fields are guarded by Server.mu.
type emuSandbox struct {
	id            string
	envdVersion   string
	templateID    string
	alias         string
	accessToken   string
	trafficToken  string
	startedAt     time.Time
	endAt         time.Time
	paused        bool
	autoPause     bool
	allowInternet bool
	network       *networkConfig // as sent at create; nil: none
	metadata      map[string]string
	envVars       map[string]string
	contexts      []*kernelContext
	procs         map[uint32]*emuProcess // commands started through the process service, running
	lastPID       uint32
}

// kernelContext is one code-interpreter context: a kernel with its own state. Python contexts run
// in an exec sandbox of their own.
type kernelContext struct {
	id       string
	language string
	cwd      string
	isDflt   bool
	handle   *sandbox.Handle // nil until started; guarded by Server.mu
	lock     chan struct{}   // serializes executions, as the server's per-context lock does
	envDone  bool            // the sandbox's envVars were injected (first execution)
	hidden   int             // helper runs (file operations) not shown in execution_count
}

// New starts an emulator whose sandboxes execute code through exec. The caller keeps ownership of
// exec; Close deletes the exec sandboxes the emulator created but does not close exec.
func New(exec sandbox.Provider) *Server {
	s := &Server{
		exec:        exec,
		apiKey:      "e2b_" + randomHex(20),
		clock:       time.Now,
		keepalive:   defaultKeepalive,
		envdVersion: EnvdVersion,
		sandboxes:   map[string]*emuSandbox{},
		requests:    map[string]Request{},
		control:     http.NewServeMux(),
		jupyter:     http.NewServeMux(),
		envd:        http.NewServeMux(),
	}
	s.routes()
	s.srv = httptest.NewServer(s)
	return s
}

// URL is the control-plane base URL (the SDKs' E2B_API_URL).
func (s *Server) URL() string { return s.srv.URL }

// SandboxURL is the single data-plane base URL (the SDKs' E2B_SANDBOX_URL); requests to it are
// routed by their E2b-Sandbox-Id and E2b-Sandbox-Port headers. It is the same listener as URL.
func (s *Server) SandboxURL() string { return s.srv.URL }

// APIKey is the only key the control plane accepts.
func (s *Server) APIKey() string { return s.apiKey }

// Client returns an HTTP client that sends every request, whatever its host or scheme, to the
// emulator over plain HTTP, so that https://49999-{id}.{domain}/execute reaches it by Host. Its idle
// connections are closed by Close.
func (s *Server) Client() *http.Client { return &http.Client{Transport: s.Transport()} }

// Transport is the RoundTripper behind Client.
func (s *Server) Transport() *http.Transport {
	addr := s.srv.Listener.Addr().String()
	var d net.Dialer
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	// DialTLSContext returning a plain connection makes the transport speak HTTP/1.1 in clear to the
	// emulator for https URLs: the connection counts as already past its TLS handshake.
	tr := &http.Transport{DialContext: dial, DialTLSContext: dial, MaxIdleConnsPerHost: 16}
	s.mu.Lock()
	s.transports = append(s.transports, tr)
	s.mu.Unlock()
	return tr
}

// Close deletes every sandbox (and its exec sandboxes) and stops the server.
func (s *Server) Close() {
	s.srv.CloseClientConnections()
	s.srv.Close()
	s.mu.Lock()
	var handles []sandbox.Handle
	for id, sb := range s.sandboxes {
		handles = append(handles, sb.handles()...)
		delete(s.sandboxes, id)
	}
	trs := s.transports
	s.transports = nil
	s.mu.Unlock()
	s.deleteExec(handles)
	for _, tr := range trs {
		tr.CloseIdleConnections()
	}
}

// SetClock replaces the clock that decides sandbox expiry and stamps times (default time.Now).
func (s *Server) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clock = now
}

// Advance moves the emulator's clock forward by d; sandboxes whose end time passes expire on the
// next request (or Live/SandboxIDs call): they are killed, or paused when created with autoPause.
func (s *Server) Advance(d time.Duration) {
	s.mu.Lock()
	s.offset += d
	s.mu.Unlock()
	s.sweep()
}

// Now is the emulator's current time.
func (s *Server) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nowLocked()
}

func (s *Server) nowLocked() time.Time { return s.clock().Add(s.offset) }

// SetKeepaliveInterval sets how long /execute may stay silent before a keepalive line is sent
// (default 5 s, as the server's KEEPALIVE_INTERVAL).
func (s *Server) SetKeepaliveInterval(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keepalive = d
}

// FailNextCreates makes the next n creates answer status. A 429 carries Retry-After (in whole
// seconds) when retryAfter > 0; a 401 carries e2b's invalid-key message.
func (s *Server) FailNextCreates(n, status int, retryAfter time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.createFault = createFault{n: n, status: status, retryAfter: retryAfter}
}

// SetExecDelay delays every execution by d after the response headers are sent (keepalives flow
// meanwhile; the client's disconnect ends the wait).
func (s *Server) SetExecDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.execDelay = d
}

// FailNextExecutions makes the next n /execute requests answer status. A 502 has the edge proxy's
// "sandbox not found" body, as e2b sends for an expired sandbox.
func (s *Server) FailNextExecutions(n, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.execFail = statusFault{n: n, status: status}
}

// CutNextStreams makes the next n /execute streams stop after `after` lines (keepalives count). With
// midLine the connection is then dropped halfway through the next line; otherwise the response ends
// cleanly there, without end_of_execution.
func (s *Server) CutNextStreams(n, after int, midLine bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streamFault = streamFault{n: n, after: after, midLine: midLine}
}

// DelayNextStarts makes the next n process Starts hold their start event (and the response's
// headers) back for d after the command has started, as a slow link would: meanwhile the command
// runs and is listed, and the client does not know its pid. A client that leaves ends the wait
// (the command goes on, as under envd), and so does the command's end.
func (s *Server) DelayNextStarts(n int, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.startFault = startFault{n: n, delay: d}
}

// RequireTrafficToken makes sandboxes created from now on carry a trafficAccessToken, which the
// data plane then requires on port 49999 (as e2b does for sandboxes without public traffic).
func (s *Server) RequireTrafficToken(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trafficTokens = on
}

// SetMaxConcurrent caps running sandboxes; creates beyond it get e2b's concurrency 429. 0: no cap.
func (s *Server) SetMaxConcurrent(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxConcurrent = n
}

// SetEnvdVersion sets the envdVersion reported for sandboxes created from now on (default 0.6.13).
func (s *Server) SetEnvdVersion(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.envdVersion = v
}

// SetLazyKernels makes sandboxes created from now on start their exec sandbox on first use
// instead of during create. Tests that only drive the control plane then start no kernels; e2b
// itself boots the sandbox during create, which is the default.
func (s *Server) SetLazyKernels(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lazyKernels = on
}

// Live is the number of sandboxes that exist (running or paused).
func (s *Server) Live() int {
	s.sweep()
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sandboxes)
}

// SandboxIDs lists the existing sandboxes' ids, sorted.
func (s *Server) SandboxIDs() []string {
	s.sweep()
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.sandboxes))
	for id := range s.sandboxes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Creates counts successful creates; Deletes counts sandboxes killed through the API (expiry and
// Close are not counted); Executions counts /execute requests that started streaming.
func (s *Server) Creates() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.creates
}

// Deletes: see Creates.
func (s *Server) Deletes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deletes
}

// Executions: see Creates.
func (s *Server) Executions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.executions
}

// LastRequest returns the last request seen on a route. Control-plane routes are named by their
// pattern ("POST /sandboxes", "DELETE /sandboxes/{id}", "GET /v2/sandboxes", ...); data-plane
// routes by port and pattern ("49999 POST /execute", "49999 GET /health", "49983 GET /health").
func (s *Server) LastRequest(route string) (Request, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.requests[route]
	return r, ok
}

// AccessToken returns a sandbox's envdAccessToken and trafficAccessToken.
func (s *Server) AccessToken(id string) (envd, traffic string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return "", "", false
	}
	return sb.accessToken, sb.trafficToken, true
}

// ServeHTTP routes a request to the data plane (by Host {port}-{id}.{domain}, or by the
// E2b-Sandbox-Id/-Port headers when the Host is localhost, an IP or sandbox.{domain}) or else to the
// control plane, like e2b's edge proxy.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.sweep()
	if id, port, ok := dataPlaneTarget(r); ok {
		s.serveDataPlane(w, r, id, port)
		return
	}
	s.serveControl(w, r)
}

var hostLabel = regexp.MustCompile(`^(\d+)-([a-z0-9]+)(?:-[a-z0-9]+)?$`)

// dataPlaneTarget finds the sandbox and port a request is for, as e2b's proxy does
// (infra shared/pkg/proxy/host.go).
func dataPlaneTarget(r *http.Request) (id string, port int, ok bool) {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" || net.ParseIP(host) != nil || strings.HasPrefix(host, "sandbox.") {
		id = r.Header.Get("E2b-Sandbox-Id")
		p := r.Header.Get("E2b-Sandbox-Port")
		if id == "" || p == "" {
			return "", 0, false
		}
		port, err := strconv.Atoi(p)
		if err != nil {
			return "", 0, false
		}
		return id, port, true
	}
	label, _, _ := strings.Cut(host, ".")
	m := hostLabel.FindStringSubmatch(label)
	if m == nil {
		return "", 0, false
	}
	port, err := strconv.Atoi(m[1])
	if err != nil {
		return "", 0, false
	}
	return m[2], port, true
}

// sweep expires sandboxes whose end time has passed: killed, or paused with autoPause.
func (s *Server) sweep() {
	s.mu.Lock()
	now := s.nowLocked()
	var handles []sandbox.Handle
	for id, sb := range s.sandboxes {
		if sb.paused || now.Before(sb.endAt) {
			continue
		}
		if sb.autoPause {
			sb.paused = true
			continue
		}
		handles = append(handles, sb.handles()...)
		delete(s.sandboxes, id)
	}
	s.mu.Unlock()
	s.deleteExec(handles)
}

// handles lists the exec sandboxes behind a sandbox's contexts. Called with Server.mu held.
func (sb *emuSandbox) handles() []sandbox.Handle {
	var hs []sandbox.Handle
	for _, c := range sb.contexts {
		if c.handle != nil {
			hs = append(hs, *c.handle)
			c.handle = nil
		}
	}
	return hs
}

// deleteExec deletes exec sandboxes; their kernels die with them (and so do running executions).
func (s *Server) deleteExec(handles []sandbox.Handle) {
	if len(handles) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	for _, h := range handles {
		_ = s.exec.Delete(ctx, h)
	}
}

// handle registers a route whose requests are recorded (body included) before fn runs.
func (s *Server) handle(mux *http.ServeMux, prefix, pattern string, fn func(w http.ResponseWriter, r *http.Request, body []byte)) {
	mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
		if err != nil {
			return
		}
		s.mu.Lock()
		s.requests[prefix+pattern] = Request{Method: r.Method, URL: r.URL, Host: r.Host, Header: r.Header.Clone(), Body: body}
		s.mu.Unlock()
		fn(w, r, body)
	})
}

// randomHex returns n random bytes, hex-encoded.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newSandboxID returns "i" and 20 characters of [a-z0-9], as e2b's ids.
func newSandboxID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "i" + string(b)
}

// newUUID returns a random RFC 4122 version 4 UUID, as Jupyter kernel ids are.
func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// writeJSON writes body with status, as e2b's Go services do (compact JSON).
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeText writes a plain-text body, as FastAPI's PlainTextResponse does.
func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg))
}

// copyMap returns a copy of m (nil stays nil).
func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
