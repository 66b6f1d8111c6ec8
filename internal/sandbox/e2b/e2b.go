// Package e2b is the sandbox backend that runs code in e2b cloud sandboxes: the REST control plane
// creates, extends and kills sandboxes, and the code-interpreter server inside each sandbox runs
// code and streams NDJSON back. docs/wire-e2b.md describes the protocol as this client uses it.
package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Defaults, as the official SDKs have them (docs/wire-e2b.md), except AllowInternetAccess, which is
// off unless the operator turns it on.
const (
	DefaultDomain         = "e2b.app"
	DefaultTemplate       = "code-interpreter-v1"
	DefaultTimeout        = 300 * time.Second
	DefaultRequestTimeout = 60 * time.Second
	DefaultRunTimeout     = 300 * time.Second

	// JupyterPort is the code-interpreter server's port, EnvdPort the sandbox daemon's.
	JupyterPort = 49999
	EnvdPort    = 49983

	backendName = "e2b"
	userAgent   = "ciproxy-e2b"
	// errBodyLimit caps how much of an error body is read and quoted in an error message.
	errBodyLimit = 4 << 10
)

// Options configure a Provider. Zero values mean the defaults above (DefaultOptions).
// DecodeSettings makes them from a sandbox tool's litellm_params, environment fallbacks (E2B_API_KEY,
// ...) included; New reads no environment.
type Options struct {
	// APIKey is sent as X-API-Key to the control plane only; it never reaches a sandbox, a log line or
	// an error message.
	APIKey string
	// APIBase is the control-plane base URL; "" means https://api.<Domain>.
	APIBase string
	// Domain is the sandbox domain used when the create response names none; "" means e2b.app.
	Domain string
	// SandboxURL, when set, is the single data-plane base URL: requests then carry the
	// E2b-Sandbox-Id and E2b-Sandbox-Port headers, like the SDKs' E2B_SANDBOX_URL.
	SandboxURL string
	// Template is the sandbox template; "" means code-interpreter-v1.
	Template string
	// Timeout is the sandbox lifetime asked at create when CreateOptions.Lifetime is 0; 0 means 300 s.
	Timeout time.Duration
	// AllowInternetAccess is sent as allow_internet_access at create, for a container whose
	// request asked no network policy.
	AllowInternetAccess bool
	// Network is the bound on containers' network policies (allowed_domains; e2b takes no
	// domain secrets). A container's allowlist is sent as network.allowOut, with everything
	// else denied.
	Network egress.Bound
	// RequestTimeout bounds each control-plane request; 0 means 60 s, as the SDKs.
	RequestTimeout time.Duration
	// RunTimeout bounds an execution when RunOptions.Timeout is 0; 0 means 300 s (the Python SDK's).
	RunTimeout time.Duration
	// HTTPClient sends every request; nil means a client of its own. It must not set a Timeout that
	// is shorter than an execution, since /execute streams for the whole run.
	HTTPClient *http.Client `json:"-"`
	// Tool is the sandbox_tool_name, copied into every Handle.
	Tool string
	// Logger receives debug lines about sandbox lifecycles; nil means no logging.
	Logger *zap.Logger `json:"-"`
}

// DefaultOptions returns the options of an e2b sandbox tool that sets nothing (no API key): the one
// place the defaults are applied.
func DefaultOptions() Options {
	return Options{
		Domain:         DefaultDomain,
		Template:       DefaultTemplate,
		Timeout:        DefaultTimeout,
		RequestTimeout: DefaultRequestTimeout,
		RunTimeout:     DefaultRunTimeout,
	}
}

// Provider talks to e2b. It is safe for concurrent use.
type Provider struct {
	opts    Options
	apiBase string
	client  *http.Client
	ownHTTP bool
	log     *zap.Logger
}

var _ sandbox.Provider = (*Provider)(nil)

// New returns a Provider. It does not contact e2b.
func New(opts Options) (*Provider, error) {
	def := DefaultOptions()
	if opts.Domain == "" {
		opts.Domain = def.Domain
	}
	if opts.Template == "" {
		opts.Template = def.Template
	}
	if opts.Timeout <= 0 {
		opts.Timeout = def.Timeout
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = def.RequestTimeout
	}
	if opts.RunTimeout <= 0 {
		opts.RunTimeout = def.RunTimeout
	}
	apiBase := opts.APIBase
	if apiBase == "" {
		apiBase = "https://api." + opts.Domain
	}
	apiBase = strings.TrimRight(apiBase, "/")
	if _, err := url.Parse(apiBase); err != nil {
		return nil, fmt.Errorf("e2b: api base: %w", err)
	}
	opts.SandboxURL = strings.TrimRight(opts.SandboxURL, "/")
	if opts.SandboxURL != "" {
		if _, err := url.Parse(opts.SandboxURL); err != nil {
			return nil, fmt.Errorf("e2b: sandbox url: %w", err)
		}
	}
	p := &Provider{opts: opts, apiBase: apiBase, log: opts.Logger}
	if opts.HTTPClient == nil {
		p.client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		p.ownHTTP = true
	} else {
		c := *opts.HTTPClient
		p.client = &c
	}
	// Never follow a redirect: the sandbox's own code can answer on the data plane, and a redirect
	// would send its code, the access token (or, on the control plane, the API key) wherever it
	// points, inside the proxy's network.
	p.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if p.log == nil {
		p.log = zap.NewNop()
	}
	return p, nil
}

// Close releases idle connections of the provider's own HTTP client. It does not delete sandboxes:
// their owners do, and e2b expires the rest.
func (p *Provider) Close(context.Context) error {
	if p.ownHTTP {
		p.client.CloseIdleConnections()
	}
	return nil
}

// newSandboxRequest is the body of POST /sandboxes.
type newSandboxRequest struct {
	TemplateID          string            `json:"templateID"`
	Timeout             int               `json:"timeout"`
	Secure              bool              `json:"secure"`
	AllowInternetAccess bool              `json:"allow_internet_access"`
	Metadata            map[string]string `json:"metadata"`
	Network             *networkConfig    `json:"network,omitempty"`
}

// networkConfig is e2b's SandboxNetworkConfig as sent: domains allowed out, everything else
// denied. e2b filters by the Host header on port 80 and the TLS server name on port 443.
type networkConfig struct {
	AllowOut []string `json:"allowOut"`
	DenyOut  []string `json:"denyOut"`
}

// allTraffic is e2b's ALL_TRAFFIC: every IPv4 destination.
const allTraffic = "0.0.0.0/0"

// NetworkBound implements sandbox.Networked.
func (p *Provider) NetworkBound() egress.Bound { return p.opts.Network }

// DomainSecrets implements sandbox.Networked: e2b's sandboxes reach the internet from e2b's own
// network, so nothing of theirs passes through a proxy that could add a secret.
func (p *Provider) DomainSecrets() bool { return false }

var _ sandbox.Networked = (*Provider)(nil)

// network returns what a create sends for the container's policy: its allowlist, or, for a
// container asked without network, no internet; a container whose request asked nothing gets
// the operator's allow_internet_access.
func (p *Provider) network(opts sandbox.CreateOptions) (bool, *networkConfig) {
	switch {
	case len(opts.Network.Secrets) > 0:
		return false, nil // refused before Create (DomainSecrets); never sent open without them
	case opts.Network.Open():
		return true, &networkConfig{AllowOut: opts.Network.Domains, DenyOut: []string{allTraffic}}
	case opts.NetworkPolicy != nil:
		return false, nil
	}
	return p.opts.AllowInternetAccess, nil
}

// sandboxResponse is e2b's Sandbox object.
type sandboxResponse struct {
	TemplateID         string `json:"templateID"`
	SandboxID          string `json:"sandboxID"`
	Alias              string `json:"alias"`
	ClientID           string `json:"clientID"`
	EnvdVersion        string `json:"envdVersion"`
	EnvdAccessToken    string `json:"envdAccessToken"`
	TrafficAccessToken string `json:"trafficAccessToken"`
	Domain             string `json:"domain"`
}

// Create starts a sandbox from the configured template. CreateOptions.MemoryLimit cannot be applied
// (e2b templates fix their memory), so it is recorded in the sandbox metadata as memory_limit.
func (p *Provider) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Handle, error) {
	if p.opts.APIKey == "" {
		return sandbox.Handle{}, fmt.Errorf("%w: e2b create: no API key configured", sandbox.ErrUnavailable)
	}
	lifetime := opts.Lifetime
	if lifetime <= 0 {
		lifetime = p.opts.Timeout
	}
	meta := make(map[string]string, len(opts.Metadata)+2)
	for k, v := range opts.Metadata {
		meta[k] = v
	}
	meta["created_by"] = "ciproxy"
	if opts.MemoryLimit != "" {
		meta["memory_limit"] = opts.MemoryLimit
	}
	internet, network := p.network(opts)
	body, err := json.Marshal(newSandboxRequest{
		TemplateID:          p.opts.Template,
		Timeout:             seconds(lifetime),
		Secure:              true,
		AllowInternetAccess: internet,
		Metadata:            meta,
		Network:             network,
	})
	if err != nil {
		return sandbox.Handle{}, fmt.Errorf("e2b create: %w", err)
	}
	var sb sandboxResponse
	if err := p.control(ctx, "create", http.MethodPost, "/sandboxes", body, &sb); err != nil {
		return sandbox.Handle{}, err
	}
	if sb.SandboxID == "" {
		return sandbox.Handle{}, fmt.Errorf("%w: e2b create: response has no sandboxID", sandbox.ErrUnavailable)
	}
	h := sandbox.Handle{
		Backend:      backendName,
		Tool:         p.opts.Tool,
		ID:           sb.SandboxID,
		AccessToken:  sb.EnvdAccessToken,
		TrafficToken: sb.TrafficAccessToken,
		Domain:       sb.Domain,
	}
	if h.Domain == "" {
		h.Domain = p.opts.Domain
	}
	// The SDKs refuse sandboxes whose envd predates 0.1.0: their API differs.
	if versionLess(sb.EnvdVersion, "0.1.0") {
		p.discard(ctx, h, "outdated")
		return sandbox.Handle{}, fmt.Errorf("%w: e2b create: sandbox envd version %q is older than 0.1.0; rebuild the template",
			sandbox.ErrUnavailable, sb.EnvdVersion)
	}
	// Every container has /mnt/data from its first line of code, however it was made, as OpenAI's
	// do; code-interpreter-v1 has none.
	if err := p.makeDataDir(ctx, h); err != nil {
		p.discard(ctx, h, "unprepared")
		return sandbox.Handle{}, fmt.Errorf("e2b create: making %s: %w", sandbox.DataDir, err)
	}
	p.log.Debug("e2b: sandbox created", zap.String("sandbox", h.ID), zap.String("template", p.opts.Template),
		zap.String("envd", sb.EnvdVersion))
	return h, nil
}

// discard deletes a sandbox Create made but does not hand out, even once ctx has ended.
func (p *Provider) discard(ctx context.Context, h sandbox.Handle, what string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.RequestTimeout)
	defer cancel()
	if err := p.Delete(cctx, h); err != nil {
		p.log.Warn("e2b: deleting an "+what+" sandbox failed", zap.String("sandbox", h.ID), zap.Error(err))
	}
}

// Delete kills the sandbox. A sandbox that is already gone (404) is not an error.
func (p *Provider) Delete(ctx context.Context, h sandbox.Handle) error {
	err := p.control(ctx, "delete", http.MethodDelete, "/sandboxes/"+url.PathEscape(h.ID), nil, nil)
	if errors.Is(err, sandbox.ErrNotFound) {
		return nil
	}
	if err == nil {
		p.log.Debug("e2b: sandbox deleted", zap.String("sandbox", h.ID))
	}
	return err
}

// KeepAlive sets the sandbox's end time to now+d, rounded up to whole seconds. e2b's /timeout can
// also shorten a sandbox's life, so d <= 0 does nothing rather than end it.
func (p *Provider) KeepAlive(ctx context.Context, h sandbox.Handle, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	body, err := json.Marshal(struct {
		Timeout int `json:"timeout"`
	}{seconds(d)})
	if err != nil {
		return fmt.Errorf("e2b keepalive: %w", err)
	}
	return p.control(ctx, "keepalive", http.MethodPost, "/sandboxes/"+url.PathEscape(h.ID)+"/timeout", body, nil)
}

// executeRequest is the code-interpreter server's ExecutionRequest. The null keys are sent
// explicitly, as the Python SDK does.
type executeRequest struct {
	Code      string            `json:"code"`
	ContextID *string           `json:"context_id"`
	Language  *string           `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// Run executes code in the sandbox's default Python context and decodes the NDJSON stream.
func (p *Provider) Run(ctx context.Context, h sandbox.Handle, code string, opts sandbox.RunOptions) (sandbox.Result, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.opts.RunTimeout
	}
	runCtx, cancel := context.WithTimeoutCause(ctx, timeout, sandbox.ErrTimeout)
	defer cancel()

	body, err := json.Marshal(executeRequest{Code: code, EnvVars: map[string]string{}})
	if err != nil {
		return sandbox.Result{}, fmt.Errorf("e2b run: %w", err)
	}
	req, err := http.NewRequestWithContext(runCtx, http.MethodPost, p.dataURL(h, JupyterPort, "/execute"), bytes.NewReader(body))
	if err != nil {
		return sandbox.Result{}, fmt.Errorf("%w: e2b run: %w", sandbox.ErrUnavailable, err)
	}
	p.dataHeaders(req, h, JupyterPort)
	req.Header.Set("Content-Type", "application/json")
	if h.AccessToken != "" {
		req.Header.Set("X-Access-Token", h.AccessToken)
	}
	if h.TrafficToken != "" {
		req.Header.Set("E2B-Traffic-Access-Token", h.TrafficToken)
	}

	resp, err := p.client.Do(req)
	if err != nil {
		return sandbox.Result{}, runError(ctx, runCtx, timeout, fmt.Errorf("%w: e2b run: %w", sandbox.ErrUnavailable, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return sandbox.Result{}, p.executeStatusError(resp)
	}
	stream := &errReader{r: resp.Body}
	res, err := sandbox.DecodeExecution(stream, 0, opts.OnMessage)
	if err != nil {
		if !errors.Is(err, sandbox.ErrIncomplete) && stream.err != nil && !errors.Is(stream.err, io.EOF) {
			// The connection broke inside a line: the half line does not parse, but what happened
			// is a stream cut short.
			err = fmt.Errorf("%w: %w (%w)", sandbox.ErrIncomplete, stream.err, err)
		}
		return res, runError(ctx, runCtx, timeout, fmt.Errorf("e2b run: %w", err))
	}
	return res, nil
}

// errReader remembers the error that ended a read stream.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil {
		e.err = err
	}
	return n, err
}

// runError turns a failure while the execution's context ran out into ErrTimeout, and one caused by
// the caller's own cancellation into the caller's context error; other errors pass unchanged.
func runError(parent, runCtx context.Context, timeout time.Duration, err error) error {
	if parent.Err() != nil {
		return fmt.Errorf("e2b run: %w", context.Cause(parent))
	}
	if errors.Is(context.Cause(runCtx), sandbox.ErrTimeout) {
		return fmt.Errorf("%w: e2b run: no end of execution within %s", sandbox.ErrTimeout, timeout)
	}
	return err
}

// executeStatusError maps a non-200 /execute answer. A 502 comes from e2b's edge proxy when the
// sandbox no longer exists (its lifetime ran out or it was killed).
func (p *Provider) executeStatusError(resp *http.Response) error {
	msg := p.readErrorBody(resp)
	switch resp.StatusCode {
	case http.StatusBadGateway:
		return &APIError{Op: "run", StatusCode: resp.StatusCode, Message: "container expired: " + msg, kind: sandbox.ErrNotFound}
	case http.StatusNotFound:
		return &APIError{Op: "run", StatusCode: resp.StatusCode, Message: msg, kind: sandbox.ErrNotFound}
	case http.StatusTooManyRequests:
		return &APIError{Op: "run", StatusCode: resp.StatusCode, Message: msg, RetryAfter: retryAfter(resp.Header), kind: sandbox.ErrRateLimited}
	default:
		return &APIError{Op: "run", StatusCode: resp.StatusCode, Message: msg, kind: sandbox.ErrUnavailable}
	}
}

// dataURL is the URL of path on port inside the sandbox: SandboxURL + path when one base serves all
// sandboxes, else https://{port}-{id}.{domain}{path}.
func (p *Provider) dataURL(h sandbox.Handle, port int, path string) string {
	if p.opts.SandboxURL != "" {
		return p.opts.SandboxURL + path
	}
	domain := h.Domain
	if domain == "" {
		domain = p.opts.Domain
	}
	return "https://" + strconv.Itoa(port) + "-" + h.ID + "." + domain + path
}

// dataHeaders adds the routing headers every in-sandbox request carries, as the SDKs send them.
func (p *Provider) dataHeaders(req *http.Request, h sandbox.Handle, port int) {
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set("E2b-Sandbox-Id", h.ID)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
}

// control sends one control-plane request, bounded by RequestTimeout, and decodes a 2xx JSON body
// into out (when out is non-nil).
func (p *Provider) control(ctx context.Context, op, method, path string, body []byte, out any) error {
	_, err := p.controlHeader(ctx, op, method, path, body, out)
	return err
}

// controlHeader is control, returning the answer's headers too.
func (p *Provider) controlHeader(ctx context.Context, op, method, path string, body []byte, out any) (http.Header, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.apiBase+path, rd)
	if err != nil {
		return nil, fmt.Errorf("%w: e2b %s: %w", sandbox.ErrUnavailable, op, err)
	}
	req.Header.Set("X-API-Key", p.opts.APIKey)
	req.Header.Set("User-Agent", userAgent)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		// The transport's error names the URL, never headers, so the key cannot leak through it.
		return nil, fmt.Errorf("%w: e2b %s: %w", sandbox.ErrUnavailable, op, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, p.controlStatusError(op, resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, errBodyLimit))
		return resp.Header, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return nil, fmt.Errorf("%w: e2b %s: decoding the response: %w", sandbox.ErrUnavailable, op, err)
	}
	return resp.Header, nil
}

// controlStatusError maps a control-plane error status to the sandbox sentinels.
func (p *Provider) controlStatusError(op string, resp *http.Response) error {
	msg := p.readErrorBody(resp)
	e := &APIError{Op: op, StatusCode: resp.StatusCode, Message: msg}
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		// e2b's message says nothing the operator needs; ours says what to fix.
		e.Message = "e2b rejected the API key"
		e.kind = sandbox.ErrUnavailable
	case resp.StatusCode == http.StatusTooManyRequests:
		e.RetryAfter = retryAfter(resp.Header)
		e.kind = sandbox.ErrRateLimited
	case resp.StatusCode == http.StatusNotFound && op != "create":
		e.kind = sandbox.ErrNotFound
	default:
		e.kind = sandbox.ErrUnavailable
	}
	return e
}

// readErrorBody returns e2b's error message: the "message" of a {"code","message"} body, or the
// start of a body of another shape. The API key is scrubbed in case a server echoes it.
func (p *Provider) readErrorBody(resp *http.Response) string {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, errBodyLimit))
	var e struct {
		Message string `json:"message"`
	}
	msg := strings.TrimSpace(string(raw))
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		msg = e.Message
	}
	if len(msg) > 300 {
		msg = msg[:300] + "..."
	}
	if p.opts.APIKey != "" {
		msg = strings.ReplaceAll(msg, p.opts.APIKey, "[redacted]")
	}
	return msg
}

// APIError is an error status from e2b. It wraps one of the sandbox sentinels (errors.Is works).
type APIError struct {
	Op         string // create, delete, keepalive, run
	StatusCode int
	// Message is e2b's message (never containing the API key).
	Message string
	// RetryAfter is the Retry-After of a 429; 0 when absent.
	RetryAfter time.Duration
	kind       error
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v: e2b %s: HTTP %d", e.kind, e.Op, e.StatusCode)
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (retry after %ds)", int(e.RetryAfter/time.Second))
	}
	return b.String()
}

// Unwrap returns the sandbox sentinel the status maps to.
func (e *APIError) Unwrap() error { return e.kind }

// retryAfter reads a Retry-After header given in seconds (the form e2b sends) or as an HTTP date.
func retryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d.Round(time.Second)
		}
	}
	return 0
}

// seconds rounds d up to whole seconds, as the SDKs do (ceil(ms/1000)).
func seconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int(math.Ceil(d.Seconds()))
}

// versionLess reports whether dotted version a is older than b. Missing or non-numeric parts count as
// 0, and anything after a '-' or '+' is ignored.
func versionLess(a, b string) bool {
	pa, pb := versionParts(a), versionParts(b)
	for i := range 3 {
		if pa[i] != pb[i] {
			return pa[i] < pb[i]
		}
	}
	return false
}

func versionParts(v string) [3]int {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if i := strings.IndexAny(v, "-+"); i >= 0 {
		v = v[:i]
	}
	var out [3]int
	for i, s := range strings.SplitN(v, ".", 3) {
		n, _ := strconv.Atoi(s)
		out[i] = n
	}
	return out
}
