// Package agentsandbox is the sandbox backend that runs code in kubernetes-sigs/agent-sandbox
// sandboxes: a container is a SandboxClaim on a warm pool, made, watched, renewed and deleted with
// client-go's dynamic client; code runs in the sandbox's sandboxd, through its gRPC process service
// at the pod IP, and files move through its REST files API, at the pod IP or through the
// sandbox-router with a scoped token minted per request. docs/sandbox-agent-sandbox.md describes
// the wire as this client uses it.
//
// sandboxd kills a process when its gRPC stream ends, so the persistent kernel is kept by a daemon
// inside the sandbox (kernel.DaemonPath), and each replica reaches it through a relay process of
// its own, kept open while it uses the sandbox: any proxy replica runs the next cell of any
// container, in the same Python state, and nothing is forwarded between replicas.
//
// A Handle of this backend holds the claim's name (ID), its Sandbox's name (TrafficToken) and the
// pod IP (Domain); never a credential.
package agentsandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox/processv1"
	"github.com/ciproxy/ciproxy/internal/sandbox/kernel"
)

// Defaults.
const (
	// Backend is the backend's name, as sandbox_provider names it and Handle.Backend records it.
	Backend = "agent_sandbox"

	DefaultNamespace      = "default"
	DefaultProcessPort    = 9090
	DefaultFilesPort      = 8080
	DefaultReadyTimeout   = 180 * time.Second
	DefaultTimeout        = time.Hour
	DefaultRunTimeout     = 300 * time.Second
	DefaultRequestTimeout = 60 * time.Second

	// ConnectPodIP and ConnectRouter are the values of the connect setting.
	ConnectPodIP  = "pod_ip"
	ConnectRouter = "router"

	managedByLabel = "app.kubernetes.io/managed-by"
	managedByValue = "ciproxy"
	// memoryLimitAnnotation records a request's container memory_limit on its claim.
	memoryLimitAnnotation = "ciproxy.io/memory-limit"

	listPageSize = 500
	listMaxPages = 100
	// interruptGrace is how long an interrupted execution may take to end before its stream is
	// cut (the kernel is interrupted either way: the daemon interrupts a cell whose client died).
	interruptGrace = 5 * time.Second
	// signalTimeout bounds one SendSignal or WriteStdin call.
	signalTimeout = 10 * time.Second
	// errBodyLimit caps how much of an error body is read and quoted.
	errBodyLimit = 4 << 10
	// jsonBodyLimit caps a JSON answer of sandboxd's REST API.
	jsonBodyLimit = 8 << 20
)

var (
	claimGVR    = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}
	sandboxGVR  = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	warmPoolGVR = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxwarmpools"}
)

// Options configure a Provider. Zero values mean the defaults above. DecodeSettings makes them
// from a sandbox tool's litellm_params; New reads no environment but the in-cluster credentials
// when Kubeconfig is "".
type Options struct {
	// Kubeconfig is the path of a kubeconfig file; "" means the pod's in-cluster credentials.
	Kubeconfig string
	// Namespace holds the warm pool and every claim.
	Namespace string
	// WarmPool is the SandboxWarmPool every claim names (required).
	WarmPool string
	// ProcessPort and FilesPort are sandboxd's gRPC and REST ports.
	ProcessPort int
	FilesPort   int
	// Connect is ConnectPodIP (both services at the pod IP) or ConnectRouter (files through
	// RouterURL with a scoped token; gRPC cannot pass the router, so the process service is still
	// dialled at the pod IP).
	Connect string
	// RouterURL is the sandbox-router's base URL (connect: router).
	RouterURL string
	// RouterSecret signs the scoped tokens sent to the router; it never reaches a sandbox, a log
	// line or an error message.
	RouterSecret Secret `json:"-"`
	// RouterSecretSum identifies RouterSecret in the tool's fingerprint without holding it.
	RouterSecretSum string
	// ReadyTimeout bounds a Create: the claim bound, the Sandbox Ready, sandboxd and the kernel up.
	ReadyTimeout time.Duration
	// Timeout is the sandbox lifetime set at create when CreateOptions.Lifetime is 0.
	Timeout time.Duration
	// RunTimeout bounds an execution or a command when its options give none.
	RunTimeout time.Duration
	// RequestTimeout bounds each API and files request.
	RequestTimeout time.Duration
	// Python is the interpreter that runs the kernel daemon's client ("python3").
	Python string
	// Tool is the sandbox_tool_name, copied into every Handle.
	Tool string
	// Logger receives debug lines about sandbox lifecycles; nil means none.
	Logger *zap.Logger `json:"-"`
	// RestConfig, when non-nil, is used instead of Kubeconfig (tests).
	RestConfig *rest.Config `json:"-"`
	// HTTPClient sends the files requests; nil means a client of its own.
	HTTPClient *http.Client `json:"-"`
}

// Secret is a credential kept in Options: printed, it shows as [redacted].
type Secret string

// String implements fmt.Stringer without the secret.
func (Secret) String() string { return "[redacted]" }

// GoString implements fmt.GoStringer without the secret.
func (Secret) GoString() string { return "[redacted]" }

// DefaultOptions returns the options of a tool that sets nothing but its warm pool.
func DefaultOptions() Options {
	return Options{
		Namespace:      DefaultNamespace,
		ProcessPort:    DefaultProcessPort,
		FilesPort:      DefaultFilesPort,
		Connect:        ConnectPodIP,
		ReadyTimeout:   DefaultReadyTimeout,
		Timeout:        DefaultTimeout,
		RunTimeout:     DefaultRunTimeout,
		RequestTimeout: DefaultRequestTimeout,
		Python:         "python3",
	}
}

// Provider talks to one namespace of one cluster. It is safe for concurrent use.
type Provider struct {
	opts   Options
	dyn    dynamic.Interface
	client *http.Client
	secret []byte
	log    *zap.Logger

	mu       sync.Mutex
	conns    map[string]*grpc.ClientConn // by pod IP
	sessions map[string]*session         // by sessionKey
}

var (
	_ sandbox.Provider   = (*Provider)(nil)
	_ sandbox.FileSystem = (*Provider)(nil)
	_ sandbox.Shell      = (*Provider)(nil)
)

// New returns a Provider. It reads the kubeconfig (or the in-cluster credentials) but does not
// contact the cluster.
func New(opts Options) (*Provider, error) {
	def := DefaultOptions()
	if opts.Namespace == "" {
		opts.Namespace = def.Namespace
	}
	if opts.ProcessPort <= 0 {
		opts.ProcessPort = def.ProcessPort
	}
	if opts.FilesPort <= 0 {
		opts.FilesPort = def.FilesPort
	}
	if opts.Connect == "" {
		opts.Connect = def.Connect
	}
	for _, d := range []struct {
		dst *time.Duration
		def time.Duration
	}{{&opts.ReadyTimeout, def.ReadyTimeout}, {&opts.Timeout, def.Timeout}, {&opts.RunTimeout, def.RunTimeout}, {&opts.RequestTimeout, def.RequestTimeout}} {
		if *d.dst <= 0 {
			*d.dst = d.def
		}
	}
	if opts.Python == "" {
		opts.Python = def.Python
	}
	if opts.WarmPool == "" {
		return nil, errors.New("agent_sandbox: no warm_pool")
	}
	p := &Provider{opts: opts, log: opts.Logger, conns: map[string]*grpc.ClientConn{}, sessions: map[string]*session{}}
	if p.log == nil {
		p.log = zap.NewNop()
	}
	switch opts.Connect {
	case ConnectPodIP:
	case ConnectRouter:
		if opts.RouterURL == "" {
			return nil, errors.New("agent_sandbox: connect: router needs router_url")
		}
		p.secret = normalizeSecret(string(opts.RouterSecret))
		if len(p.secret) < MinSecretLen {
			return nil, errors.New("agent_sandbox: connect: router needs scoped_token_secret of at least 32 bytes")
		}
	default:
		return nil, fmt.Errorf("agent_sandbox: connect %q is neither pod_ip nor router", opts.Connect)
	}
	cfg := opts.RestConfig
	if cfg == nil {
		var err error
		if opts.Kubeconfig == "" {
			cfg, err = rest.InClusterConfig()
		} else {
			cfg, err = clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
		}
		if err != nil {
			// client-go's messages name the file or the variables, never a token.
			return nil, fmt.Errorf("agent_sandbox: Kubernetes credentials: %w", err)
		}
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "ciproxy-agent-sandbox"
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("agent_sandbox: Kubernetes client: %w", err)
	}
	p.dyn = dyn
	if opts.HTTPClient != nil {
		c := *opts.HTTPClient
		p.client = &c
	} else {
		p.client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	// Never follow a redirect: it would carry a scoped token wherever it points.
	p.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return p, nil
}

// Close ends the provider's sessions and closes its gRPC connections and idle HTTP connections.
// It deletes no sandbox.
func (p *Provider) Close(context.Context) error {
	p.endSessions("")
	p.mu.Lock()
	conns := p.conns
	p.conns = map[string]*grpc.ClientConn{}
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	p.client.CloseIdleConnections()
	return nil
}

func (p *Provider) claims() dynamic.ResourceInterface {
	return p.dyn.Resource(claimGVR).Namespace(p.opts.Namespace)
}

func (p *Provider) sandboxes() dynamic.ResourceInterface {
	return p.dyn.Resource(sandboxGVR).Namespace(p.opts.Namespace)
}

// labelName is what a label's name and value may be.
var labelName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// labelSafe reports whether k=v can be a claim's label (outside the controller's prefixes).
func labelSafe(k, v string) bool {
	return len(k) <= 63 && len(v) <= 63 && labelName.MatchString(k) && (v == "" || labelName.MatchString(v)) &&
		!strings.HasPrefix(k, "agents.x-k8s.io") && k != managedByLabel
}

// Create claims a sandbox from the warm pool and waits, within ReadyTimeout, until the claim is
// bound, its Sandbox Ready, sandboxd healthy and the kernel daemon up with the kernel of this
// proxy. A claim made but not handed out is deleted.
func (p *Provider) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Handle, error) {
	lifetime := opts.Lifetime
	if lifetime <= 0 {
		lifetime = p.opts.Timeout
	}
	lbls := map[string]any{managedByLabel: managedByValue}
	for k, v := range opts.Metadata {
		if !labelSafe(k, v) {
			p.log.Warn("agent_sandbox: metadata left out: not a Kubernetes label", zap.String("key", k))
			continue
		}
		lbls[k] = v
	}
	claim := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": claimGVR.GroupVersion().String(),
		"kind":       "SandboxClaim",
		"metadata": map[string]any{
			"generateName": "ciproxy-",
			"namespace":    p.opts.Namespace,
			"labels":       lbls,
		},
	}}
	if opts.MemoryLimit != "" {
		// The template fixes a pod's resources and a claim cannot change them, so the request's
		// memory_limit is recorded on the claim, for the operator, as e2b records it.
		claim.SetAnnotations(map[string]string{memoryLimitAnnotation: opts.MemoryLimit})
	}
	claim.Object["spec"] = map[string]any{
		"warmPoolRef": map[string]any{"name": p.opts.WarmPool},
		"lifecycle": map[string]any{
			"shutdownTime":   shutdownTime(lifetime),
			"shutdownPolicy": "Delete",
		},
	}
	readyCtx, cancel := context.WithTimeout(ctx, p.opts.ReadyTimeout)
	defer cancel()
	cctx, ccancel := context.WithTimeout(readyCtx, p.opts.RequestTimeout)
	made, err := p.claims().Create(cctx, claim, metav1.CreateOptions{})
	ccancel()
	if err != nil {
		return sandbox.Handle{}, p.apiError(readyCtx, "create claim", err)
	}
	h := sandbox.Handle{Backend: Backend, Tool: p.opts.Tool, ID: made.GetName()}
	h, err = p.ready(readyCtx, h, made)
	if err != nil {
		p.discard(ctx, h)
		if ctx.Err() == nil && readyCtx.Err() != nil {
			return sandbox.Handle{}, fmt.Errorf("%w: agent_sandbox create: claim %s not ready within %s: %w", sandbox.ErrUnavailable, h.ID, p.opts.ReadyTimeout, err)
		}
		if ctx.Err() != nil {
			return sandbox.Handle{}, fmt.Errorf("agent_sandbox create: %w", context.Cause(ctx))
		}
		if !errors.Is(err, sandbox.ErrUnavailable) && !errors.Is(err, sandbox.ErrRateLimited) {
			err = fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
		}
		return sandbox.Handle{}, err
	}
	p.log.Debug("agent_sandbox: sandbox claimed", zap.String("claim", h.ID), zap.String("sandbox", h.TrafficToken))
	return h, nil
}

// shutdownTime is now+d as the claim's lifecycle takes it (RFC 3339, whole seconds rounded up).
func shutdownTime(d time.Duration) string {
	return time.Now().Add(d + time.Second - 1).UTC().Truncate(time.Second).Format(time.RFC3339)
}

// ready waits for a new claim's sandbox and prepares it; the handle it returns is complete.
func (p *Provider) ready(ctx context.Context, h sandbox.Handle, claim *unstructured.Unstructured) (sandbox.Handle, error) {
	var claimIPs []string
	err := p.watchUntil(ctx, p.claims(), h.ID, claim, func(obj *unstructured.Unstructured, deleted bool) (bool, error) {
		if deleted || obj == nil {
			return false, fmt.Errorf("%w: agent_sandbox create: claim %s was deleted before it was bound", sandbox.ErrUnavailable, h.ID)
		}
		name, _, _ := unstructured.NestedString(obj.Object, "status", "sandbox", "name")
		if name == "" {
			return false, nil
		}
		h.TrafficToken = name
		claimIPs, _, _ = unstructured.NestedStringSlice(obj.Object, "status", "sandbox", "podIPs")
		return true, nil
	}, true)
	if err != nil {
		return h, err
	}
	err = p.watchUntil(ctx, p.sandboxes(), h.TrafficToken, nil, func(obj *unstructured.Unstructured, deleted bool) (bool, error) {
		if deleted {
			return false, fmt.Errorf("%w: agent_sandbox create: sandbox %s was deleted before it was ready", sandbox.ErrUnavailable, h.TrafficToken)
		}
		if obj == nil {
			return false, nil // not made yet
		}
		status, reason, msg := readyCondition(obj)
		switch {
		case status == "True":
			ips, _, _ := unstructured.NestedStringSlice(obj.Object, "status", "podIPs")
			if len(ips) == 0 {
				ips = claimIPs
			}
			if len(ips) == 0 || net.ParseIP(ips[0]) == nil {
				return false, nil
			}
			h.Domain = ips[0]
			return true, nil
		case status == "False" && (reason == "PodFailed" || reason == "SandboxExpired" || reason == "PodSucceeded"):
			return false, fmt.Errorf("%w: agent_sandbox create: sandbox %s is not ready: %s: %.300s", sandbox.ErrUnavailable, h.TrafficToken, reason, msg)
		}
		return false, nil
	}, false)
	if err != nil {
		return h, err
	}
	if err := p.waitHealthy(ctx, h); err != nil {
		return h, err
	}
	return h, p.startKernel(ctx, h)
}

// readyCondition returns the status, reason and message of obj's Ready condition.
func readyCondition(obj *unstructured.Unstructured) (status, reason, msg string) {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok || m["type"] != "Ready" {
			continue
		}
		status, _ = m["status"].(string)
		reason, _ = m["reason"].(string)
		msg, _ = m["message"].(string)
	}
	return status, reason, msg
}

// watchUntil calls check with the object named name (nil while there is none) until it reports
// done or an error: first with initial when given, else from a list, then on every change a
// watch on that name reports. A watch that drops is resumed from the last resourceVersion seen;
// one that answers 410 Gone starts again from a fresh list. mustExist makes a missing object a
// deletion.
func (p *Provider) watchUntil(ctx context.Context, res dynamic.ResourceInterface, name string, initial *unstructured.Unstructured,
	check func(obj *unstructured.Unstructured, deleted bool) (bool, error), mustExist bool) error {
	sel := "metadata.name=" + name
	rv := ""
	if initial != nil {
		if done, err := check(initial, false); done || err != nil {
			return err
		}
		rv = initial.GetResourceVersion()
	}
	for failures := 0; ; {
		if rv == "" {
			lctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
			list, err := res.List(lctx, metav1.ListOptions{FieldSelector: sel})
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				return p.apiError(ctx, "list "+name, err)
			}
			var obj *unstructured.Unstructured
			if len(list.Items) > 0 {
				obj = &list.Items[0]
			}
			if done, err := check(obj, obj == nil && mustExist); done || err != nil {
				return err
			}
			rv = list.GetResourceVersion()
		}
		w, err := res.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if apierrors.IsGone(err) || apierrors.IsResourceExpired(err) {
				rv = ""
				continue
			}
			if failures++; failures > 5 {
				return p.apiError(ctx, "watch "+name, err)
			}
			if err := sleep(ctx, time.Duration(failures)*200*time.Millisecond); err != nil {
				return err
			}
			continue
		}
		done, gone, err := p.drain(ctx, w, &rv, check)
		w.Stop()
		if done || err != nil {
			return err
		}
		if gone {
			rv = ""
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
	}
}

// drain reads one watch until check is done or fails, the watch ends (dropped: resume from rv) or
// reports 410 (gone).
func (p *Provider) drain(ctx context.Context, w watch.Interface, rv *string,
	check func(obj *unstructured.Unstructured, deleted bool) (bool, error)) (done, gone bool, err error) {
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			return false, false, context.Cause(ctx)
		case ev, ok = <-w.ResultChan():
		}
		if !ok {
			return false, false, nil
		}
		switch ev.Type {
		case watch.Added, watch.Modified, watch.Deleted:
			obj, isObj := ev.Object.(*unstructured.Unstructured)
			if !isObj {
				continue
			}
			*rv = obj.GetResourceVersion()
			if done, err := check(obj, ev.Type == watch.Deleted); done || err != nil {
				return done, false, err
			}
		case watch.Bookmark:
			if obj, isObj := ev.Object.(*unstructured.Unstructured); isObj {
				*rv = obj.GetResourceVersion()
			}
		case watch.Error:
			status := apierrors.FromObject(ev.Object)
			if apierrors.IsGone(status) || apierrors.IsResourceExpired(status) {
				return false, true, nil
			}
			return false, true, nil // any other watch error: list again
		}
	}
}

// waitHealthy asks sandboxd's GET /v1/health until it answers 200.
func (p *Provider) waitHealthy(ctx context.Context, h sandbox.Handle) error {
	var last error
	for {
		hctx, cancel := context.WithTimeout(ctx, min(p.opts.RequestTimeout, 5*time.Second))
		resp, err := p.files(hctx, h, "health", http.MethodGet, "/v1/health", nil, "")
		if err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, errBodyLimit))
			resp.Body.Close()
			cancel()
			return nil
		}
		cancel()
		last = err
		var ae *APIError
		if errors.As(err, &ae) && ae.router && (ae.StatusCode == http.StatusUnauthorized || ae.StatusCode == http.StatusForbidden) {
			return err // a refused token does not heal
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("sandboxd's health never answered 200 (last: %w): %w", last, err)
		}
	}
}

// startKernel starts the kernel daemon (kerneld.py start) and checks that the image's kernel is
// this proxy's: results, images and tracebacks must not depend on which image a pool runs.
func (p *Provider) startKernel(ctx context.Context, h sandbox.Handle) error {
	c, err := p.process(h)
	if err != nil {
		return err
	}
	resp, err := c.Execute(ctx, &processv1.ExecuteRequest{Config: p.kernelConfig(h, "start")})
	if err != nil {
		return p.grpcError(ctx, h, "start kernel", err)
	}
	if resp.GetExitCode() != 0 {
		return fmt.Errorf("%w: agent_sandbox create: the kernel daemon did not start (exit %d): %.300s", sandbox.ErrUnavailable, resp.GetExitCode(), strings.TrimSpace(string(resp.GetStderr())))
	}
	var sums struct{ Kernel, Daemon string }
	if err := json.Unmarshal(resp.GetStdout(), &sums); err != nil {
		return fmt.Errorf("%w: agent_sandbox create: kerneld.py start answered no checksums: %.300s", sandbox.ErrUnavailable, resp.GetStdout())
	}
	if sums.Kernel != sha(kernel.Source()) || sums.Daemon != sha(kernel.DaemonSource()) {
		return fmt.Errorf("%w: agent_sandbox create: the sandbox image's %s or %s is not this proxy's: rebuild the image from this release (deploy/kubernetes/agent-sandbox/Dockerfile)", sandbox.ErrUnavailable, kernel.Path, kernel.DaemonPath)
	}
	return nil
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// kernelConfig is the process that runs kerneld.py in mode, in /mnt/data, with the daemon's
// socket named after the sandbox (unique even where sandboxes share a /tmp).
func (p *Provider) kernelConfig(h sandbox.Handle, mode string) *processv1.ProcessConfig {
	cwd := sandbox.DataDir
	return &processv1.ProcessConfig{
		Command: []string{p.opts.Python, "-S", kernel.DaemonPath, mode},
		EnvVars: map[string]string{"CIPROXY_KERNELD_SOCKET": "/tmp/ciproxy-kerneld-" + h.TrafficToken + ".sock"},
		Cwd:     &cwd,
	}
}

// process returns the process service client of h's pod, dialling it once per pod IP.
func (p *Provider) process(h sandbox.Handle) (processv1.ProcessServiceClient, error) {
	if net.ParseIP(h.Domain) == nil {
		return nil, fmt.Errorf("%w: agent_sandbox: the handle has no pod IP", sandbox.ErrNotFound)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.conns[h.Domain]; ok {
		return processv1.NewProcessServiceClient(c), nil
	}
	// Keepalive pings find a connection that died silently under an idle relay; 5 minutes is the
	// least a gRPC server takes by default without answering "too many pings".
	c, err := grpc.NewClient(net.JoinHostPort(h.Domain, fmt.Sprint(p.opts.ProcessPort)),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Minute, Timeout: 20 * time.Second}))
	if err != nil {
		return nil, fmt.Errorf("%w: agent_sandbox: dialling sandboxd: %w", sandbox.ErrUnavailable, err)
	}
	p.conns[h.Domain] = c
	return processv1.NewProcessServiceClient(c), nil
}

// forget closes the connection to a deleted sandbox's pod.
func (p *Provider) forget(h sandbox.Handle) {
	p.mu.Lock()
	c, ok := p.conns[h.Domain]
	delete(p.conns, h.Domain)
	p.mu.Unlock()
	if ok {
		_ = c.Close()
	}
}

// discard deletes a claim Create made but does not hand out, even once ctx has ended.
func (p *Provider) discard(ctx context.Context, h sandbox.Handle) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.RequestTimeout)
	defer cancel()
	if err := p.Delete(cctx, h); err != nil {
		p.log.Warn("agent_sandbox: deleting a claim that did not become ready failed", zap.String("claim", h.ID), zap.Error(err))
	}
}

// Delete deletes the claim, which deletes its Sandbox and pod. A claim already gone is not an
// error.
func (p *Provider) Delete(ctx context.Context, h sandbox.Handle) error {
	p.endSessions(h.ID)
	if h.Domain != "" {
		p.forget(h)
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	err := p.claims().Delete(ctx, h.ID, metav1.DeleteOptions{})
	if err == nil || apierrors.IsNotFound(err) {
		return nil
	}
	return p.apiError(ctx, "delete claim", err)
}

// KeepAlive moves the claim's shutdownTime to now+d (a JSON merge patch). d <= 0 does nothing.
func (p *Provider) KeepAlive(ctx context.Context, h sandbox.Handle, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"lifecycle": map[string]any{"shutdownTime": shutdownTime(d)}}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	if _, err := p.claims().Patch(ctx, h.ID, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return p.apiError(ctx, "keepalive", err)
	}
	return nil
}

// apiError maps an error of the Kubernetes API: the caller's own end stays itself, a missing
// object is ErrNotFound, throttling ErrRateLimited, anything else ErrUnavailable. client-go's
// errors carry the server's message, never the credentials.
func (p *Provider) apiError(ctx context.Context, op string, err error) error {
	switch {
	case ctx.Err() != nil && !apierrors.IsTimeout(err):
		return fmt.Errorf("agent_sandbox %s: %w", op, context.Cause(ctx))
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: agent_sandbox %s: %w", sandbox.ErrNotFound, op, err)
	case apierrors.IsTooManyRequests(err):
		return fmt.Errorf("%w: agent_sandbox %s: %w", sandbox.ErrRateLimited, op, err)
	case apierrors.IsUnauthorized(err), apierrors.IsForbidden(err):
		return fmt.Errorf("%w: agent_sandbox %s: the Kubernetes API refused the proxy's credentials (check rbac.yaml): %w", sandbox.ErrUnavailable, op, err)
	}
	return fmt.Errorf("%w: agent_sandbox %s: %w", sandbox.ErrUnavailable, op, err)
}

// gone reports whether h's sandbox no longer exists as the handle knows it: its claim or
// Sandbox deleted, or its pod replaced (a new IP: the kernel and files of the old one are lost).
func (p *Provider) gone(ctx context.Context, h sandbox.Handle) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(p.opts.RequestTimeout, 10*time.Second))
	defer cancel()
	if _, err := p.claims().Get(ctx, h.ID, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return true
	}
	sb, err := p.sandboxes().Get(ctx, h.TrafficToken, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true
	}
	if err != nil {
		return false
	}
	if status, reason, _ := readyCondition(sb); status == "False" && (reason == "PodFailed" || reason == "SandboxExpired" || reason == "PodSucceeded") {
		return true
	}
	ips, _, _ := unstructured.NestedStringSlice(sb.Object, "status", "podIPs")
	for _, ip := range ips {
		if ip == h.Domain {
			return false
		}
	}
	return true
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
