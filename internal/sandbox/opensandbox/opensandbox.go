// Package opensandbox is the sandbox backend that runs code in OpenSandbox sandboxes: the lifecycle
// API creates, renews and deletes sandboxes (OPEN-SANDBOX-API-KEY), and execd inside each sandbox
// runs code in a persistent Python code context, runs shell commands and moves files, reached
// through the endpoint the lifecycle API hands out with a per-sandbox execd token. The lifecycle key
// never reaches execd. docs/sandbox-opensandbox.md describes the protocol as this client uses it.
//
// A Handle of this backend holds the sandbox id (ID), its execd token (AccessToken) and the id of
// its Python code context (TrafficToken).
package opensandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Defaults, as LiteLLM's OpenSandbox provider has them (docs/sandbox-opensandbox.md).
const (
	DefaultImage          = "opensandbox/code-interpreter:v1.1.0"
	DefaultCPU            = "1"
	DefaultMemory         = "2Gi"
	DefaultTimeout        = 300 * time.Second
	DefaultReadyTimeout   = 30 * time.Second
	DefaultRequestTimeout = 60 * time.Second
	DefaultRunTimeout     = 300 * time.Second

	// ExecdPort is execd's port inside every sandbox.
	ExecdPort = 44772
	// Backend is the backend's name, as sandbox_provider names it and Handle.Backend records it.
	Backend = "opensandbox"

	// minTimeout is the shortest sandbox timeout the lifecycle API accepts.
	minTimeout = 60 * time.Second
	// pollInterval is how often readiness is polled (the SDKs' and LiteLLM's 200 ms).
	pollInterval = 200 * time.Millisecond
	// errBodyLimit caps how much of an error body is read and quoted in an error message.
	errBodyLimit = 4 << 10
	// jsonBodyLimit caps a lifecycle or execd JSON answer.
	jsonBodyLimit = 1 << 20
	// interruptTimeout bounds the interrupt sent when a run's caller left or its deadline passed.
	interruptTimeout = 10 * time.Second
)

// DefaultEntrypoint is the code-interpreter image's entrypoint.
func DefaultEntrypoint() []string { return []string{"/opt/code-interpreter/code-interpreter.sh"} }

// Options configure a Provider. Zero values mean the defaults above. DecodeSettings makes them
// from a sandbox tool's litellm_params; New reads no environment.
type Options struct {
	// APIKey is sent as OPEN-SANDBOX-API-KEY to the lifecycle API only; it never reaches execd, a
	// sandbox, a log line or an error message. "" sends no key (a server without one).
	APIKey string
	// APIBase is the lifecycle base URL, /v1 included (http://127.0.0.1:8080/v1).
	APIBase string
	// Image is the sandbox image; Entrypoint its entrypoint.
	Image      string
	Entrypoint []string
	// CPU and Memory are the sandbox's resource limits (Kubernetes quantities). A container's
	// memory_limit replaces Memory.
	CPU    string
	Memory string
	// Timeout is the sandbox lifetime asked at create when CreateOptions.Lifetime is 0.
	Timeout time.Duration
	// ReadyTimeout bounds the wait for a new sandbox and its execd to be ready.
	ReadyTimeout time.Duration
	// RequestTimeout bounds each lifecycle request and each execd request but runs and commands.
	RequestTimeout time.Duration
	// RunTimeout bounds an execution when RunOptions.Timeout is 0.
	RunTimeout time.Duration
	// Network is the bound on containers' network policies (allowed_domains; no domain secrets),
	// sent as the sandbox's egress rules with everything else denied.
	Network egress.Bound
	// HTTPClient sends every request; nil means a client of its own. It must not set a Timeout
	// shorter than an execution.
	HTTPClient *http.Client `json:"-"`
	// Tool is the sandbox_tool_name, copied into every Handle.
	Tool string
	// Logger receives debug lines about sandbox lifecycles; nil means none.
	Logger *zap.Logger `json:"-"`
}

// DefaultOptions returns the options of a tool that sets nothing but its api_base.
func DefaultOptions() Options {
	return Options{
		Image:          DefaultImage,
		Entrypoint:     DefaultEntrypoint(),
		CPU:            DefaultCPU,
		Memory:         DefaultMemory,
		Timeout:        DefaultTimeout,
		ReadyTimeout:   DefaultReadyTimeout,
		RequestTimeout: DefaultRequestTimeout,
		RunTimeout:     DefaultRunTimeout,
	}
}

// Provider talks to one OpenSandbox server. It is safe for concurrent use.
type Provider struct {
	opts    Options
	apiBase *url.URL
	client  *http.Client
	ownHTTP bool
	log     *zap.Logger

	mu        sync.Mutex
	endpoints map[string]endpoint    // execd endpoint per sandbox id, as the lifecycle API gave it
	runLocks  map[string]*sync.Mutex // one run at a time per sandbox (execd refuses a busy context)
}

// endpoint is where a sandbox's execd answers, and the headers every request there carries.
type endpoint struct {
	base    string
	headers map[string]string
}

var (
	_ sandbox.Provider   = (*Provider)(nil)
	_ sandbox.Networked  = (*Provider)(nil)
	_ sandbox.FileSystem = (*Provider)(nil)
)

// New returns a Provider. It does not contact the server.
func New(opts Options) (*Provider, error) {
	def := DefaultOptions()
	if opts.Image == "" {
		opts.Image = def.Image
	}
	if len(opts.Entrypoint) == 0 {
		opts.Entrypoint = def.Entrypoint
	}
	if opts.CPU == "" {
		opts.CPU = def.CPU
	}
	if opts.Memory == "" {
		opts.Memory = def.Memory
	}
	if opts.Timeout <= 0 {
		opts.Timeout = def.Timeout
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = def.ReadyTimeout
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = def.RequestTimeout
	}
	if opts.RunTimeout <= 0 {
		opts.RunTimeout = def.RunTimeout
	}
	base, err := url.Parse(strings.TrimRight(opts.APIBase, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("opensandbox: api_base %q is not an http(s) URL", opts.APIBase)
	}
	p := &Provider{opts: opts, apiBase: base, log: opts.Logger,
		endpoints: map[string]endpoint{}, runLocks: map[string]*sync.Mutex{}}
	if opts.HTTPClient == nil {
		p.client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		p.ownHTTP = true
	} else {
		c := *opts.HTTPClient
		p.client = &c
	}
	// Never follow a redirect: execd's answers can come from the sandbox's code (its /proxy), and a
	// redirect would carry the code, the execd token or the lifecycle key wherever it points.
	p.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if p.log == nil {
		p.log = zap.NewNop()
	}
	return p, nil
}

// Close releases idle connections of the provider's own HTTP client. It does not delete sandboxes:
// their owners do, and the server expires the rest.
func (p *Provider) Close(context.Context) error {
	if p.ownHTTP {
		p.client.CloseIdleConnections()
	}
	return nil
}

// NetworkBound implements sandbox.Networked.
func (p *Provider) NetworkBound() egress.Bound { return p.opts.Network }

// DomainSecrets implements sandbox.Networked: OpenSandbox's egress sidecar filters by name and has
// no vault that could add a secret to a sandbox's requests.
func (p *Provider) DomainSecrets() bool { return false }

// createRequest is the body of POST /sandboxes.
type createRequest struct {
	Image          imageSpec         `json:"image"`
	Entrypoint     []string          `json:"entrypoint"`
	ResourceLimits map[string]string `json:"resourceLimits"`
	Timeout        int               `json:"timeout"`
	Env            map[string]string `json:"env"`
	Metadata       map[string]string `json:"metadata"`
	NetworkPolicy  networkPolicy     `json:"networkPolicy"`
}

type imageSpec struct {
	URI string `json:"uri"`
}

// networkPolicy is the sandbox's egress rules. An absent or empty policy allows everything, so a
// policy is always sent, denying by default.
type networkPolicy struct {
	DefaultAction string       `json:"defaultAction"`
	Egress        []egressRule `json:"egress"`
}

type egressRule struct {
	Action string `json:"action"`
	Target string `json:"target"`
}

// policy returns the egress rules of a container's network policy: its allowlist, nothing else.
func policy(n egress.Policy) networkPolicy {
	np := networkPolicy{DefaultAction: "deny", Egress: []egressRule{}}
	if len(n.Secrets) > 0 {
		return np // refused before Create (DomainSecrets); never opened without them
	}
	for _, d := range n.Domains {
		np.Egress = append(np.Egress, egressRule{Action: "allow", Target: d})
	}
	return np
}

// labelValue is what a metadata key's name and a value may be: a Kubernetes label's.
var labelValue = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// labelSafe reports whether k=v can be sent as metadata (a label, outside the reserved prefix).
func labelSafe(k, v string) bool {
	return len(k) <= 63 && len(v) <= 63 && labelValue.MatchString(k) && (v == "" || labelValue.MatchString(v)) &&
		!strings.HasPrefix(k, "opensandbox.io/")
}

// memoryQuantity turns a container memory_limit ("1g", "4g", "512m") into a Kubernetes quantity
// ("1Gi", "4Gi", "512Mi"); "" or anything else keeps def.
func memoryQuantity(limit, def string) string {
	l := strings.ToLower(strings.TrimSpace(limit))
	if len(l) < 2 {
		return def
	}
	num, unit := l[:len(l)-1], l[len(l)-1]
	for _, c := range num {
		if c < '0' || c > '9' {
			return def
		}
	}
	switch unit {
	case 'g':
		return num + "Gi"
	case 'm':
		return num + "Mi"
	}
	return def
}

// Create starts a sandbox from the configured image, waits until it and its execd are ready,
// makes /mnt/data and the Python code context, and prepares that context (prepare.py). A sandbox
// that was created but cannot be made ready is deleted.
func (p *Provider) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Handle, error) {
	lifetime := opts.Lifetime
	if lifetime <= 0 {
		lifetime = p.opts.Timeout
	}
	meta := map[string]string{"created_by": "ciproxy"}
	for k, v := range opts.Metadata {
		if !labelSafe(k, v) {
			p.log.Warn("opensandbox: metadata left out: not a Kubernetes label", zap.String("key", k))
			continue
		}
		meta[k] = v
	}
	token := randomHex(16)
	body, err := json.Marshal(createRequest{
		Image:          imageSpec{URI: p.opts.Image},
		Entrypoint:     p.opts.Entrypoint,
		ResourceLimits: map[string]string{"cpu": p.opts.CPU, "memory": memoryQuantity(opts.MemoryLimit, p.opts.Memory)},
		Timeout:        max(seconds(lifetime), int(minTimeout/time.Second)),
		Env:            map[string]string{"EXECD_ACCESS_TOKEN": token},
		Metadata:       meta,
		NetworkPolicy:  policy(opts.Network),
	})
	if err != nil {
		return sandbox.Handle{}, fmt.Errorf("opensandbox create: %w", err)
	}
	raw, err := p.lifecycle(ctx, "create", http.MethodPost, "/sandboxes", body)
	if err != nil {
		return sandbox.Handle{}, err
	}
	id := gjson.GetBytes(raw, "id").String()
	if id == "" || strings.ContainsAny(id, "/?#%") {
		return sandbox.Handle{}, fmt.Errorf("%w: opensandbox create: the answer has no usable sandbox id", sandbox.ErrUnavailable)
	}
	h := sandbox.Handle{Backend: Backend, Tool: p.opts.Tool, ID: id, AccessToken: token}
	readyCtx, cancel := context.WithTimeout(ctx, p.opts.ReadyTimeout)
	defer cancel()
	ctxID, err := p.prepare(readyCtx, h, gjson.GetBytes(raw, "status.state").String())
	if err != nil {
		p.discard(ctx, h)
		if ctx.Err() == nil && readyCtx.Err() != nil {
			return sandbox.Handle{}, fmt.Errorf("%w: opensandbox create: sandbox %s not ready within %s: %w", sandbox.ErrUnavailable, id, p.opts.ReadyTimeout, err)
		}
		return sandbox.Handle{}, err
	}
	h.TrafficToken = ctxID
	p.log.Debug("opensandbox: sandbox created", zap.String("sandbox", id), zap.String("image", p.opts.Image))
	return h, nil
}

// prepare waits for a new sandbox to run and its execd to answer, then makes /mnt/data and the
// prepared Python context, whose id it returns.
func (p *Provider) prepare(ctx context.Context, h sandbox.Handle, state string) (string, error) {
	for state != "Running" {
		switch state {
		case "Failed", "Terminated", "Stopping":
			return "", fmt.Errorf("%w: opensandbox create: sandbox %s is %s", sandbox.ErrUnavailable, h.ID, state)
		}
		if err := sleep(ctx, pollInterval); err != nil {
			return "", err
		}
		raw, err := p.lifecycle(ctx, "get", http.MethodGet, "/sandboxes/"+url.PathEscape(h.ID), nil)
		if err != nil {
			return "", err
		}
		state = gjson.GetBytes(raw, "status.state").String()
	}
	for {
		status, err := p.ping(ctx, h)
		if err == nil && status == http.StatusOK {
			break
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("%w: opensandbox create: execd never answered its ping (last: %d %v): %w", sandbox.ErrUnavailable, status, err, ctx.Err())
		}
		if err := sleep(ctx, pollInterval); err != nil {
			return "", err
		}
	}
	if _, err := p.execdJSON(ctx, h, "mkdir", http.MethodPost, "/directories", map[string]any{sandbox.DataDir: map[string]int{"mode": 755}}); err != nil {
		return "", err
	}
	ctxID, err := p.newContext(ctx, h)
	if err != nil {
		return "", err
	}
	h.TrafficToken = ctxID
	if err := p.prepareContext(ctx, h); err != nil {
		return "", err
	}
	return ctxID, nil
}

// newContext creates the sandbox's Python code context, in /mnt/data.
func (p *Provider) newContext(ctx context.Context, h sandbox.Handle) (string, error) {
	raw, err := p.execdJSON(ctx, h, "new context", http.MethodPost, "/code/context", map[string]string{"language": "python", "cwd": sandbox.DataDir})
	if err != nil {
		return "", err
	}
	id := gjson.GetBytes(raw, "id").String()
	if id == "" {
		return "", fmt.Errorf("%w: opensandbox new context: the answer has no id", sandbox.ErrUnavailable)
	}
	return id, nil
}

// ping asks execd's /ping once.
func (p *Provider) ping(ctx context.Context, h sandbox.Handle) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, min(p.opts.RequestTimeout, 5*time.Second))
	defer cancel()
	resp, err := p.execd(ctx, h, "ping", http.MethodGet, "/ping", nil, "")
	if err != nil {
		var apiErr *APIError
		if errors.As(err, &apiErr) {
			return apiErr.StatusCode, nil
		}
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, errBodyLimit))
	return resp.StatusCode, nil
}

// discard deletes a sandbox Create made but does not hand out, even once ctx has ended.
func (p *Provider) discard(ctx context.Context, h sandbox.Handle) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.RequestTimeout)
	defer cancel()
	if err := p.Delete(cctx, h); err != nil {
		p.log.Warn("opensandbox: deleting a sandbox that did not become ready failed", zap.String("sandbox", h.ID), zap.Error(err))
	}
}

// Delete deletes the sandbox. A sandbox that is already gone (404) is not an error.
func (p *Provider) Delete(ctx context.Context, h sandbox.Handle) error {
	_, err := p.lifecycle(ctx, "delete", http.MethodDelete, "/sandboxes/"+url.PathEscape(h.ID), nil)
	p.mu.Lock()
	delete(p.endpoints, h.ID)
	delete(p.runLocks, h.ID)
	p.mu.Unlock()
	if errors.Is(err, sandbox.ErrNotFound) {
		return nil
	}
	if err == nil {
		p.log.Debug("opensandbox: sandbox deleted", zap.String("sandbox", h.ID))
	}
	return err
}

// KeepAlive renews the sandbox to expire at now+d (whole seconds, rounded up). A renew can also
// shorten a sandbox's life, so d <= 0 does nothing.
func (p *Provider) KeepAlive(ctx context.Context, h sandbox.Handle, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	at := time.Now().Add(time.Duration(seconds(d)) * time.Second).UTC()
	body, err := json.Marshal(map[string]string{"expiresAt": at.Format(time.RFC3339Nano)})
	if err != nil {
		return fmt.Errorf("opensandbox keepalive: %w", err)
	}
	_, err = p.lifecycle(ctx, "keepalive", http.MethodPost, "/sandboxes/"+url.PathEscape(h.ID)+"/renew-expiration", body)
	return err
}

// lifecycle sends one lifecycle request, bounded by RequestTimeout (a create, which the servers
// answer once the sandbox runs, by RequestTimeout plus ReadyTimeout), and returns a 2xx answer's
// body (at most jsonBodyLimit bytes).
func (p *Provider) lifecycle(ctx context.Context, op, method, path string, body []byte) ([]byte, error) {
	timeout := p.opts.RequestTimeout
	if op == "create" {
		timeout += p.opts.ReadyTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	u := *p.apiBase
	u.Path += path
	if i := strings.IndexByte(path, '?'); i >= 0 {
		u.Path, u.RawQuery = p.apiBase.Path+path[:i], path[i+1:]
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, fmt.Errorf("%w: opensandbox %s: %w", sandbox.ErrUnavailable, op, err)
	}
	if p.opts.APIKey != "" {
		req.Header.Set("OPEN-SANDBOX-API-KEY", p.opts.APIKey)
	}
	req.Header.Set("User-Agent", "ciproxy-opensandbox")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		// The transport's error names the URL, never headers: the key cannot leak through it.
		return nil, p.transportError(ctx, op, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, p.lifecycleStatusError(op, resp)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, jsonBodyLimit+1))
	if err != nil {
		return nil, p.transportError(ctx, op, err)
	}
	if len(raw) > jsonBodyLimit {
		return nil, fmt.Errorf("%w: opensandbox %s: the answer is larger than %d bytes", sandbox.ErrUnavailable, op, jsonBodyLimit)
	}
	if len(raw) > 0 && !gjson.ValidBytes(raw) {
		return nil, fmt.Errorf("%w: opensandbox %s: the answer is not JSON", sandbox.ErrUnavailable, op)
	}
	return raw, nil
}

// lifecycleStatusError maps a lifecycle error status. A 4xx on create is the tool's configuration
// (image, resources, timeout the server refuses); like a 5xx it makes the sandbox unavailable.
func (p *Provider) lifecycleStatusError(op string, resp *http.Response) error {
	e := &APIError{Op: op, StatusCode: resp.StatusCode, Message: p.errorMessage(resp)}
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		e.Message = "the OpenSandbox server rejected the API key (" + e.Message + ")"
		e.kind = sandbox.ErrUnavailable
	case resp.StatusCode == http.StatusTooManyRequests:
		e.kind = sandbox.ErrRateLimited
	case resp.StatusCode == http.StatusNotFound && op != "create" && op != "list" && op != "check":
		e.kind = sandbox.ErrNotFound
	default:
		e.kind = sandbox.ErrUnavailable
	}
	return e
}

// errorMessage returns the message of an error answer: "code: message" of the lifecycle's and
// execd's {"code","message"}, the first msg of a validation error's {"detail":[...]}, execd's
// {"error"}, or the start of a body of another shape; the API key scrubbed in case it is echoed.
func (p *Provider) errorMessage(resp *http.Response) string {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, errBodyLimit))
	msg := strings.TrimSpace(string(raw))
	if gjson.ValidBytes(raw) {
		j := gjson.ParseBytes(raw)
		switch {
		case j.Get("message").String() != "":
			msg = j.Get("message").String()
			if c := j.Get("code").String(); c != "" {
				msg = c + ": " + msg
			}
		case j.Get("detail.0.msg").Exists():
			msg = j.Get("detail.0.msg").String()
			if loc := j.Get("detail.0.loc"); loc.IsArray() {
				var parts []string
				for _, l := range loc.Array() {
					parts = append(parts, l.String())
				}
				msg = strings.Join(parts, ".") + ": " + msg
			}
		case j.Get("error").String() != "":
			msg = j.Get("error").String()
		}
	}
	if len(msg) > 300 {
		msg = msg[:300] + "..."
	}
	if p.opts.APIKey != "" {
		msg = strings.ReplaceAll(msg, p.opts.APIKey, "[redacted]")
	}
	return msg
}

// transportError maps a failed exchange: the caller's own cancellation stays itself, anything
// else means the server or sandbox could not be reached.
func (p *Provider) transportError(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("opensandbox %s: %w", op, context.Cause(ctx))
	}
	return fmt.Errorf("%w: opensandbox %s: %w", sandbox.ErrUnavailable, op, err)
}

// APIError is an error status from the lifecycle API or execd. It wraps one of the sandbox
// sentinels (errors.Is works).
type APIError struct {
	Op         string
	StatusCode int
	// Message is the server's message (never containing the API key).
	Message string
	kind    error
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v: opensandbox %s: HTTP %d", e.kind, e.Op, e.StatusCode)
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	return b.String()
}

// Unwrap returns the sandbox sentinel the status maps to.
func (e *APIError) Unwrap() error { return e.kind }

// seconds rounds d up to whole seconds.
func seconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int(math.Ceil(d.Seconds()))
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

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
