package agentsandboxtest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/yaml"
)

// Options configure a Server. The zero value is a namespace "default" with no template and no
// pool; set Template and WarmPool to have them made.
type Options struct {
	// Namespace holds the template, the pool and the claims; "" is "default".
	Namespace string
	// Template is the name of a SandboxTemplate the server creates (from the repository's
	// deploy/kubernetes manifests' shape: one container, /mnt/data, uid 1000); "" creates none.
	Template string
	// WarmPool is the name of a SandboxWarmPool of Template the server creates; "" creates none.
	WarmPool string
	// WarmPoolReplicas is the pool's spec.replicas; 0 is 1 (the CRD's default).
	WarmPoolReplicas int
	// ImageFiles are files of the sandbox image: absolute path in the pod → content, read-only
	// in every pod (e.g. "/opt/ciproxy/kernel.py": kernel.Source()).
	ImageFiles map[string]string
	// PodEnv is added to the environment of every pod's processes (the container's env).
	PodEnv map[string]string
	// ReadyDelay is how long a new pod takes to become Ready.
	ReadyDelay time.Duration
	// Router serves a sandbox-router (RouterURL).
	Router bool
	// RouterAuthz is the router's --authz-mode: "" or "allow-all", or "scoped-token".
	RouterAuthz string
	// Dir holds the kubeconfig, the pods' directories and the image files; "" is a temporary
	// directory (t.TempDir()).
	Dir string
	// ProcessPort and FilesPort are sandboxd's ports on every pod IP; 0 is 9090 and 8080.
	ProcessPort, FilesPort int
	// PodImage, when set, is a sandbox image that each pod runs instead of a bwrap pod: a podman
	// container of it on the host's network, its entrypoint (sandboxd) told to listen on the
	// pod's 127.1.x.y address (--listen-host), with PodEnv and the claim's env; ImageFiles are
	// then the image's own. PodDataDir and PodInitPID have nothing to say of such a pod.
	PodImage string
}

// Server is a Kubernetes API server with agent-sandbox's CRDs and controllers, pods, sandboxd
// and optionally sandbox-router, all in this process. Its methods may be called concurrently.
type Server struct {
	opts        Options
	ns          string
	dir         string
	token       string
	processPort int
	filesPort   int
	bwrap       string
	nsenter     string

	api        *httptest.Server
	router     *httptest.Server
	kubeconfig string
	secret     string

	closing       chan struct{}
	closeOnce     sync.Once
	kickCh        chan struct{}
	loopDone      chan struct{}
	bookmarkEvery time.Duration
	now           func() time.Time

	podWG    sync.WaitGroup
	closed   bool
	mu       sync.Mutex
	st       store
	pods     map[string]*podState // sandbox name -> its pod
	ipTaken  map[string]bool
	reqMu    sync.Mutex // guards requests: logged while s.mu may be held
	requests []Request
	envs     []ProcessEnv

	passes        int // controller passes done
	failCreates   int
	failCode      int
	stallClaims   bool
	holdReadiness bool
	watchDrops    int
	refuseTokens  bool
	skew          atomic.Int64 // Advance's total, in nanoseconds
}

// ProcessEnv is the environment one Start'ed (or Execute'd) process got.
type ProcessEnv struct {
	Pod     string
	Command []string
	Env     []string
}

// New starts a Server; t.Cleanup stops it, killing every pod. It fails t when bwrap, nsenter
// or setpriv is missing or the process is not root.
func New(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	s, err := Start(opts)
	if err != nil {
		t.Fatalf("agentsandboxtest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// Start starts a Server outside a test (the agentsandbox-double command); Close stops it.
// opts.Dir is required.
func Start(opts Options) (*Server, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("Options.Dir is required")
	}
	if _, err := resources(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the pods need root (bwrap namespaces, nsenter, setpriv)")
	}
	s := &Server{opts: opts, ns: opts.Namespace, dir: opts.Dir, processPort: opts.ProcessPort, filesPort: opts.FilesPort,
		closing: make(chan struct{}), kickCh: make(chan struct{}, 1), loopDone: make(chan struct{}),
		bookmarkEvery: time.Second, pods: map[string]*podState{}, ipTaken: map[string]bool{}}
	s.now = func() time.Time { return time.Now().Add(time.Duration(s.skew.Load())) }
	if s.ns == "" {
		s.ns = "default"
	}
	if s.processPort == 0 {
		s.processPort = 9090
	}
	if s.filesPort == 0 {
		s.filesPort = 8080
	}
	var err error
	for _, b := range []struct {
		name string
		p    *string
	}{{"bwrap", &s.bwrap}, {"nsenter", &s.nsenter}, {"setpriv", new(string)}} {
		if *b.p, err = exec.LookPath(b.name); err != nil {
			return nil, fmt.Errorf("%s is needed for the pods: %w", b.name, err)
		}
	}
	s.st.objects = map[string]map[string]*unstructured.Unstructured{}
	s.st.watchers = map[*watcher]bool{}
	rs, _ := resources()
	for _, r := range rs {
		s.st.objects[r.gvr.Resource] = map[string]*unstructured.Unstructured{}
	}
	s.token = randHex(16)
	s.secret = randHex(32)
	if err := s.writeImageFiles(); err != nil {
		return nil, err
	}
	s.api = httptest.NewUnstartedServer(http.HandlerFunc(s.apiHandler))
	s.api.EnableHTTP2 = true
	s.api.StartTLS()
	if err := s.writeKubeconfig(); err != nil {
		s.api.Close()
		return nil, err
	}
	if opts.Router {
		if opts.RouterAuthz != "" && opts.RouterAuthz != "allow-all" && opts.RouterAuthz != "scoped-token" {
			s.api.Close()
			return nil, fmt.Errorf("RouterAuthz %q: want allow-all or scoped-token", opts.RouterAuthz)
		}
		s.router = httptest.NewServer(s.routerHandler())
	}
	go s.loop()
	if opts.Template != "" {
		if _, err := s.createObject(mustResource("SandboxTemplate"), s.defaultTemplate()); err != nil {
			s.Close()
			return nil, fmt.Errorf("template: %w", err)
		}
	}
	if opts.WarmPool != "" {
		if _, err := s.createObject(mustResource("SandboxWarmPool"), s.defaultPool()); err != nil {
			s.Close()
			return nil, fmt.Errorf("warm pool: %w", err)
		}
	}
	return s, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func mustResource(kind string) *resource {
	rs, _ := resources()
	for _, r := range rs {
		if r.kind == kind {
			return r
		}
	}
	panic("agentsandboxtest: no resource " + kind)
}

func (s *Server) writeKubeconfig() error {
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.api.Certificate().Raw})
	cfg := map[string]any{
		"apiVersion": "v1", "kind": "Config", "current-context": "agentsandboxtest",
		"clusters": []any{map[string]any{"name": "agentsandboxtest", "cluster": map[string]any{
			"server": s.api.URL, "certificate-authority-data": ca}}},
		"users":    []any{map[string]any{"name": "agentsandboxtest", "user": map[string]any{"token": s.token}}},
		"contexts": []any{map[string]any{"name": "agentsandboxtest", "context": map[string]any{"cluster": "agentsandboxtest", "user": "agentsandboxtest", "namespace": s.ns}}},
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	s.kubeconfig = filepath.Join(s.dir, "kubeconfig")
	return os.WriteFile(s.kubeconfig, b, 0o600)
}

// Close stops everything: the watches, the servers, and every pod's processes.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		<-s.loopDone
		s.mu.Lock()
		s.closed = true
		for w := range s.st.watchers {
			w.close()
		}
		pods := make([]*podState, 0, len(s.pods))
		for _, p := range s.pods {
			pods = append(pods, p)
		}
		s.pods = map[string]*podState{}
		s.mu.Unlock()
		for _, p := range pods {
			p.stop()
		}
		s.podWG.Wait()
		if s.router != nil {
			s.router.Close()
		}
		s.api.CloseClientConnections()
		s.api.Close()
	})
}

// Kubeconfig is the path of a kubeconfig for the API server (its CA, a bearer token, the
// namespace as the context's).
func (s *Server) Kubeconfig() string { return s.kubeconfig }

// Namespace is the namespace of the template, pool and claims.
func (s *Server) Namespace() string { return s.ns }

// WarmPool is the pool's name (Options.WarmPool).
func (s *Server) WarmPool() string { return s.opts.WarmPool }

// ProcessPort is sandboxd's gRPC port on every pod IP.
func (s *Server) ProcessPort() int { return s.processPort }

// FilesPort is sandboxd's REST port on every pod IP.
func (s *Server) FilesPort() int { return s.filesPort }

// RouterURL is the router's base URL, "" without Options.Router.
func (s *Server) RouterURL() string {
	if s.router == nil {
		return ""
	}
	return s.router.URL
}

// Token is the kubeconfig's bearer token, the API server's one credential.
func (s *Server) Token() string { return s.token }

// APIURL is the API server's address.
func (s *Server) APIURL() string { return s.api.URL }

// Advance moves the controllers' clock forward by d, as if that much time had passed: shutdown
// times that fall within it are reached at once.
func (s *Server) Advance(d time.Duration) {
	s.skew.Add(int64(d))
	s.kick()
}

// ScopedTokenSecret is the router's scoped-token secret (64 hex characters).
func (s *Server) ScopedTokenSecret() string { return s.secret }

// FailCreates makes the next n claim creates fail with code: 500 (an internal error) or 403
// (a quota refusal, Forbidden); other codes are 500.
func (s *Server) FailCreates(n int, code ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failCreates = n
	s.failCode = http.StatusInternalServerError
	if len(code) > 0 && code[0] == http.StatusForbidden {
		s.failCode = http.StatusForbidden
	}
}

func (s *Server) takeCreateFault() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failCreates <= 0 {
		return nil
	}
	s.failCreates--
	gr := schema.GroupResource{Group: "extensions.agents.x-k8s.io", Resource: "sandboxclaims"}
	if s.failCode == http.StatusForbidden {
		return apierrors.NewForbidden(gr, "", fmt.Errorf("exceeded quota: sandbox-quota, requested: count/sandboxclaims.extensions.agents.x-k8s.io=1"))
	}
	return apierrors.NewInternalError(fmt.Errorf("etcdserver: request timed out"))
}

// StallClaims(true) makes the controller leave new claims without a sandbox until
// StallClaims(false).
func (s *Server) StallClaims(stall bool) {
	s.mu.Lock()
	s.stallClaims = stall
	s.mu.Unlock()
	s.kick()
}

// HoldReadiness(true) keeps new pods from becoming Ready until HoldReadiness(false).
func (s *Server) HoldReadiness(hold bool) {
	s.mu.Lock()
	s.holdReadiness = hold
	s.mu.Unlock()
	s.kick()
}

// DropWatches closes every open watch, as an API server restart or a load balancer does.
func (s *Server) DropWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for w := range s.st.watchers {
		w.close()
		delete(s.st.watchers, w)
		s.watchDrops++
	}
}

// WatchDrops is how many watches DropWatches closed.
func (s *Server) WatchDrops() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.watchDrops
}

// RefuseRouterTokens(true) makes the router answer 401 to every token, as after the secret
// was rotated.
func (s *Server) RefuseRouterTokens(refuse bool) {
	s.mu.Lock()
	s.refuseTokens = refuse
	s.mu.Unlock()
}

// KillPod kills every process of the Sandbox's pod; the Sandbox becomes Ready=False, PodFailed,
// and gets no new pod.
func (s *Server) KillPod(sandbox string) error {
	s.mu.Lock()
	var p *pod
	if ps := s.pods[sandbox]; ps != nil {
		p = ps.pod
	}
	s.mu.Unlock()
	if p == nil {
		return fmt.Errorf("sandbox %s has no running pod", sandbox)
	}
	p.kill()
	s.mu.Lock()
	if ps := s.pods[sandbox]; ps != nil {
		ps.failed = true
	}
	s.mu.Unlock()
	s.kick()
	return nil
}

// LivePods are the names of the Sandboxes whose pods' processes run, sorted.
func (s *Server) LivePods() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name, p := range s.pods {
		if p.pod != nil && p.pod.alive() {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// LiveClaims are the names of the SandboxClaims that exist, sorted.
func (s *Server) LiveClaims() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, o := range s.st.objects["sandboxclaims"] {
		out = append(out, o.GetName())
	}
	sort.Strings(out)
	return out
}

// Requests is a copy of the log of API requests.
func (s *Server) Requests() []Request {
	s.reqMu.Lock()
	defer s.reqMu.Unlock()
	return append([]Request(nil), s.requests...)
}

// ProcessEnvs is the environment of every process started in any pod, in order.
func (s *Server) ProcessEnvs() []ProcessEnv {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ProcessEnv(nil), s.envs...)
}

func (s *Server) recordEnv(pod string, cmd, env []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.envs = append(s.envs, ProcessEnv{Pod: pod, Command: append([]string(nil), cmd...), Env: append([]string(nil), env...)})
}

// PodIP is the IP of the Sandbox's pod, "" when it has none.
func (s *Server) PodIP(sandbox string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.pods[sandbox]; p != nil && p.pod != nil {
		return p.pod.ip
	}
	return ""
}

// PodDataDir is the host directory bound at /mnt/data in the Sandbox's pod.
func (s *Server) PodDataDir(sandbox string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.pods[sandbox]; p != nil && p.pod != nil {
		return p.pod.dataDir
	}
	return ""
}

// PodInitPID is the host pid of pid 1 of the Sandbox's pod (0 without a pod).
func (s *Server) PodInitPID(sandbox string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.pods[sandbox]; p != nil && p.pod != nil {
		return p.pod.initPID
	}
	return 0
}

// kick asks the controller loop for a pass.
func (s *Server) kick() {
	select {
	case s.kickCh <- struct{}{}:
	default:
	}
}

var _ = watch.Added
