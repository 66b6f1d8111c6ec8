// Package daytona is the sandbox backend that runs code in Daytona sandboxes (the hosted service,
// https://app.daytona.io/api): the Daytona API creates, lists, extends and deletes sandboxes, and
// the toolbox of each sandbox (reached through Daytona's toolbox proxy) runs Python in a stateful
// interpreter context over a WebSocket, runs shell commands in sessions whose logs stream, and
// moves files. docs/sandbox-daytona.md describes the protocol as this client uses it, and what
// Daytona lacks that the proxy makes up for (rich results, figures, interrupts).
package daytona

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Backend is the sandbox_provider name of this backend.
const Backend = "daytona"

// Defaults.
const (
	DefaultAPIBase        = "https://app.daytona.io/api"
	DefaultTimeout        = 20 * time.Minute
	DefaultCreateTimeout  = 60 * time.Second
	DefaultRequestTimeout = 60 * time.Second
	DefaultRunTimeout     = 300 * time.Second

	// SDKVersion is sent as X-Daytona-SDK-Version: the toolbox chooses some output formats by it
	// (a session's logs are demultiplexed from 0.27 on).
	SDKVersion = "0.190.0"
	source     = "ciproxy"

	// errBodyLimit caps how much of an error body is read and quoted in an error message;
	// answerLimit how much of a sandbox answer, listLimit of a listing.
	errBodyLimit = 4 << 10
	answerLimit  = 1 << 20
	listLimit    = 16 << 20
	// cacheLimit bounds the sandboxes whose toolbox address and interpreter context are kept.
	cacheLimit = 4096
)

// Options configure a Provider. DecodeSettings makes them from a sandbox tool's litellm_params,
// with the environment fallbacks (DAYTONA_API_KEY, ...); New reads no environment.
type Options struct {
	// APIKey is sent as a bearer token to the Daytona API and the toolbox proxy; it never reaches
	// a sandbox, a log line or an error message.
	APIKey string `json:"-"`
	// APIBase is the Daytona API's base URL; "" means https://app.daytona.io/api.
	APIBase string
	// Target is the region sandboxes are created in ("us", "eu"); "" means the organization's
	// default.
	Target string
	// Snapshot is the snapshot sandboxes start from; "" with no Image means the organization's
	// default snapshot.
	Snapshot string
	// Image, when set, is a container image sandboxes are built from (a declarative build of
	// "FROM <image>"), which alone lets CPU, Memory and Disk be chosen.
	Image string
	// CPU (cores), Memory and Disk (GB) are asked with Image only; 0 means Daytona's default.
	// A container's memory_limit overrides Memory.
	CPU, Memory, Disk int
	// Timeout is the auto-stop interval (rounded up to minutes) when CreateOptions.Lifetime is 0.
	Timeout time.Duration
	// CreateTimeout bounds a create, from the request to the sandbox being started.
	CreateTimeout time.Duration
	// RequestTimeout bounds each API and toolbox request that is not a stream.
	RequestTimeout time.Duration
	// RunTimeout bounds an execution when RunOptions.Timeout is 0.
	RunTimeout time.Duration
	// AllowInternetAccess leaves a container whose request asked no network policy with
	// Daytona's default network rather than none.
	AllowInternetAccess bool
	// Network is the bound on containers' network policies (allowed_domains, sent as Daytona's
	// domainAllowList; Daytona takes no domain secrets).
	Network egress.Bound
	// HTTPClient sends every request; nil means a client of its own. It must set no Timeout.
	HTTPClient *http.Client `json:"-"`
	// Tool is the sandbox_tool_name, copied into every Handle.
	Tool string `json:"-"`
	// Logger receives debug lines about sandbox lifecycles; nil means none.
	Logger *zap.Logger `json:"-"`
	// PollInterval is the first interval between two looks at a starting sandbox; 0 means 100 ms.
	PollInterval time.Duration `json:"-"`
}

// DefaultOptions returns the options of a tool that sets nothing.
func DefaultOptions() Options {
	return Options{
		APIBase:        DefaultAPIBase,
		Timeout:        DefaultTimeout,
		CreateTimeout:  DefaultCreateTimeout,
		RequestTimeout: DefaultRequestTimeout,
		RunTimeout:     DefaultRunTimeout,
	}
}

// Provider talks to Daytona. It is safe for concurrent use.
type Provider struct {
	opts    Options
	apiBase string
	client  *http.Client
	ownHTTP bool
	log     *zap.Logger

	mu    sync.Mutex
	boxes map[string]*box // by sandbox id
}

// box is what the provider knows of one sandbox: where its toolbox is, and its interpreter
// context. Fields are guarded by Provider.mu, except ctxMu which serialises making a context.
type box struct {
	toolbox string // <toolboxProxyUrl>/<id>
	context string // interpreter context id; "" until made or found
	lost    bool   // the context's state was lost (an interrupt, a dead worker): say so once
	ctxMu   chan struct{}
}

var (
	_ sandbox.Provider  = (*Provider)(nil)
	_ sandbox.Networked = (*Provider)(nil)
)

// New returns a Provider. It does not contact Daytona.
func New(opts Options) (*Provider, error) {
	def := DefaultOptions()
	if opts.APIBase == "" {
		opts.APIBase = def.APIBase
	}
	if opts.Timeout <= 0 {
		opts.Timeout = def.Timeout
	}
	if opts.CreateTimeout <= 0 {
		opts.CreateTimeout = def.CreateTimeout
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = def.RequestTimeout
	}
	if opts.RunTimeout <= 0 {
		opts.RunTimeout = def.RunTimeout
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 100 * time.Millisecond
	}
	base := strings.TrimRight(opts.APIBase, "/")
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("daytona: api base %q is not an absolute http(s) URL", base)
	}
	if opts.Image != "" && opts.Snapshot != "" {
		return nil, errors.New("daytona: set a snapshot or an image, not both")
	}
	if opts.Image == "" && (opts.CPU > 0 || opts.Memory > 0 || opts.Disk > 0) {
		return nil, errors.New("daytona: cpu, memory and disk can be chosen only for sandboxes built from an image")
	}
	p := &Provider{opts: opts, apiBase: base, log: opts.Logger, boxes: map[string]*box{}}
	if opts.HTTPClient == nil {
		p.client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		p.ownHTTP = true
	} else {
		c := *opts.HTTPClient
		p.client = &c
	}
	// Never follow a redirect: it would carry the API key (sent to the toolbox too) wherever it
	// points.
	p.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if p.log == nil {
		p.log = zap.NewNop()
	}
	return p, nil
}

// Close releases idle connections of the provider's own HTTP client. Sandboxes are left to their
// owners and to Daytona's auto-stop and auto-delete.
func (p *Provider) Close(context.Context) error {
	if p.ownHTTP {
		p.client.CloseIdleConnections()
	}
	return nil
}

// NetworkBound implements sandbox.Networked.
func (p *Provider) NetworkBound() egress.Bound { return p.opts.Network }

// DomainSecrets implements sandbox.Networked: Daytona's sandboxes reach the internet from
// Daytona's network, never through this proxy, so no secret can be added to their requests.
func (p *Provider) DomainSecrets() bool { return false }

// createRequest is Daytona's CreateSandbox as this client sends it.
type createRequest struct {
	Snapshot           string            `json:"snapshot,omitempty"`
	Labels             map[string]string `json:"labels"`
	Public             bool              `json:"public"`
	NetworkBlockAll    bool              `json:"networkBlockAll"`
	DomainAllowList    string            `json:"domainAllowList,omitempty"`
	Target             string            `json:"target,omitempty"`
	CPU                int               `json:"cpu,omitempty"`
	Memory             int               `json:"memory,omitempty"`
	Disk               int               `json:"disk,omitempty"`
	AutoStopInterval   int               `json:"autoStopInterval"`
	AutoDeleteInterval int               `json:"autoDeleteInterval"`
	BuildInfo          *buildInfo        `json:"buildInfo,omitempty"`
}

type buildInfo struct {
	DockerfileContent string `json:"dockerfileContent"`
}

// sandboxInfo is what this client reads of Daytona's Sandbox object.
type sandboxInfo struct {
	ID          string
	State       string
	ErrorReason string
	Toolbox     string // toolboxProxyUrl
	Labels      map[string]string
	CreatedAt   time.Time
}

func parseSandbox(raw gjson.Result) sandboxInfo {
	sb := sandboxInfo{
		ID:          raw.Get("id").String(),
		State:       raw.Get("state").String(),
		ErrorReason: raw.Get("errorReason").String(),
		Toolbox:     raw.Get("toolboxProxyUrl").String(),
		Labels:      map[string]string{},
	}
	raw.Get("labels").ForEach(func(k, v gjson.Result) bool {
		sb.Labels[k.String()] = v.String()
		return true
	})
	sb.CreatedAt, _ = time.Parse(time.RFC3339Nano, raw.Get("createdAt").String())
	return sb
}

// Labels every sandbox of ours carries (besides the container's metadata).
const (
	labelCreatedBy = "created_by"
	labelLanguage  = "code-toolbox-language"
)

// network returns the network part of a create for the container's policy: its allowlist as
// domainAllowList, no network at all for a container asked without one, and for a container whose
// request asked nothing the operator's allow_internet_access.
func (p *Provider) network(opts sandbox.CreateOptions) (blockAll bool, domains string) {
	switch {
	case len(opts.Network.Secrets) > 0:
		return true, "" // refused before Create (DomainSecrets); never sent open without them
	case opts.Network.Open():
		return false, strings.Join(opts.Network.Domains, ",")
	case opts.NetworkPolicy != nil:
		return true, ""
	}
	return !p.opts.AllowInternetAccess, ""
}

// Create makes a sandbox, waits until Daytona has started it, makes /mnt/data and the
// interpreter context that runs the container's code there.
func (p *Provider) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Handle, error) {
	if p.opts.APIKey == "" {
		return sandbox.Handle{}, fmt.Errorf("%w: daytona create: no API key configured", sandbox.ErrUnavailable)
	}
	lifetime := opts.Lifetime
	if lifetime <= 0 {
		lifetime = p.opts.Timeout
	}
	labels := make(map[string]string, len(opts.Metadata)+3)
	for k, v := range opts.Metadata {
		labels[k] = v
	}
	labels[labelCreatedBy] = "ciproxy"
	labels[labelLanguage] = "python"
	req := createRequest{
		Labels:           labels,
		Target:           p.opts.Target,
		AutoStopInterval: minutes(lifetime),
		// 0: a sandbox that stopped (auto-stop, idle past its lifetime) is deleted, not kept.
		AutoDeleteInterval: 0,
	}
	req.NetworkBlockAll, req.DomainAllowList = p.network(opts)
	if p.opts.Image != "" {
		req.BuildInfo = &buildInfo{DockerfileContent: "FROM " + p.opts.Image + "\n"}
		req.CPU, req.Memory, req.Disk = p.opts.CPU, p.opts.Memory, p.opts.Disk
		if gb, ok := gigabytes(opts.MemoryLimit); ok {
			req.Memory = gb
		}
	} else {
		req.Snapshot = p.opts.Snapshot
		if opts.MemoryLimit != "" {
			// A snapshot fixes its resources: the limit is recorded, not applied.
			labels["memory_limit"] = opts.MemoryLimit
		}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return sandbox.Handle{}, fmt.Errorf("daytona create: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, p.opts.CreateTimeout)
	defer cancel()
	raw, err := p.api(cctx, "create", http.MethodPost, "/sandbox", body)
	if err != nil {
		return sandbox.Handle{}, p.createError(ctx, cctx, err)
	}
	sb := parseSandbox(raw)
	if sb.ID == "" {
		return sandbox.Handle{}, fmt.Errorf("%w: daytona create: the answer names no sandbox id", sandbox.ErrUnavailable)
	}
	h := sandbox.Handle{Backend: Backend, Tool: p.opts.Tool, ID: sb.ID}
	if sb, err = p.waitStarted(cctx, sb); err != nil {
		p.discard(ctx, h, "unstarted")
		return sandbox.Handle{}, p.createError(ctx, cctx, err)
	}
	b, err := p.remember(sb)
	if err != nil {
		p.discard(ctx, h, "unreachable")
		return sandbox.Handle{}, err
	}
	if err := p.prepare(cctx, h, b); err != nil {
		p.discard(ctx, h, "unprepared")
		return sandbox.Handle{}, p.createError(ctx, cctx, fmt.Errorf("daytona create: preparing the sandbox: %w", err))
	}
	p.log.Debug("daytona: sandbox created", zap.String("sandbox", h.ID), zap.String("snapshot", p.opts.Snapshot), zap.String("image", p.opts.Image))
	return h, nil
}

// createError turns a failure of a create whose deadline passed into ErrUnavailable saying so,
// and one the caller cancelled into the caller's error.
func (p *Provider) createError(parent, cctx context.Context, err error) error {
	switch {
	case parent.Err() != nil:
		return fmt.Errorf("daytona create: %w", context.Cause(parent))
	case cctx.Err() != nil:
		return fmt.Errorf("%w: daytona create: no started sandbox within %s: %w", sandbox.ErrUnavailable, p.opts.CreateTimeout, err)
	}
	return err
}

// waitStarted looks at the sandbox, as the SDKs do, every 100 ms (growing by a tenth after 5 s,
// to at most 1 s) until it is started; a sandbox in error or whose build failed is ErrUnavailable.
func (p *Provider) waitStarted(ctx context.Context, sb sandboxInfo) (sandboxInfo, error) {
	interval := p.opts.PollInterval
	start := time.Now()
	for {
		switch sb.State {
		case "started":
			return sb, nil
		case "error", "build_failed", "destroyed", "destroying":
			msg := sb.State
			if sb.ErrorReason != "" {
				msg += ": " + scrub(sb.ErrorReason, p.opts.APIKey)
			}
			return sb, fmt.Errorf("%w: daytona create: sandbox %s is %s", sandbox.ErrUnavailable, sb.ID, msg)
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return sb, fmt.Errorf("daytona create: sandbox %s still %s: %w", sb.ID, sb.State, ctx.Err())
		case <-t.C:
		}
		if time.Since(start) > 5*time.Second {
			interval = min(time.Duration(float64(interval)*1.1), time.Second)
		}
		raw, err := p.api(ctx, "create", http.MethodGet, "/sandbox/"+url.PathEscape(sb.ID), nil)
		if err != nil {
			return sb, err
		}
		sb = parseSandbox(raw)
	}
}

// remember records where the sandbox's toolbox is, from Daytona's answer (never from a handle:
// the API key goes there).
func (p *Provider) remember(sb sandboxInfo) (*box, error) {
	tb := strings.TrimRight(sb.Toolbox, "/")
	u, err := url.Parse(tb)
	if tb == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: daytona: sandbox %s has no usable toolboxProxyUrl", sandbox.ErrUnavailable, sb.ID)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if b, ok := p.boxes[sb.ID]; ok {
		return b, nil
	}
	if len(p.boxes) >= cacheLimit {
		for id := range p.boxes { // any one: it is looked up again when used
			delete(p.boxes, id)
			break
		}
	}
	b := &box{toolbox: tb + "/" + url.PathEscape(sb.ID), ctxMu: make(chan struct{}, 1)}
	p.boxes[sb.ID] = b
	return b, nil
}

// lookup returns what is known of h's sandbox, asking Daytona when nothing is: a sandbox that is
// not started (stopped by auto-stop, which deletes it, or being deleted) is ErrNotFound.
func (p *Provider) lookup(ctx context.Context, h sandbox.Handle) (*box, error) {
	if h.ID == "" {
		return nil, fmt.Errorf("%w: no sandbox id", sandbox.ErrNotFound)
	}
	p.mu.Lock()
	b, ok := p.boxes[h.ID]
	p.mu.Unlock()
	if ok {
		return b, nil
	}
	sb, err := p.get(ctx, h.ID)
	if err != nil {
		return nil, err
	}
	if sb.State != "started" {
		return nil, fmt.Errorf("%w: daytona sandbox %s is %s", sandbox.ErrNotFound, h.ID, sb.State)
	}
	return p.remember(sb)
}

// get returns Daytona's view of a sandbox.
func (p *Provider) get(ctx context.Context, id string) (sandboxInfo, error) {
	raw, err := p.api(ctx, "get", http.MethodGet, "/sandbox/"+url.PathEscape(id), nil)
	if err != nil {
		return sandboxInfo{}, err
	}
	return parseSandbox(raw), nil
}

// gone tells why a toolbox call failed: a sandbox Daytona no longer runs is ErrNotFound, wrapping
// err; anything else is err itself.
func (p *Provider) gone(ctx context.Context, h sandbox.Handle, err error) error {
	if err == nil || ctx.Err() != nil || isDaemonError(err) || errors.Is(err, sandbox.ErrRateLimited) || errors.Is(err, sandbox.ErrTimeout) {
		return err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.RequestTimeout)
	defer cancel()
	sb, gerr := p.get(cctx, h.ID)
	switch {
	case errors.Is(gerr, sandbox.ErrNotFound):
		p.forget(h.ID)
		return fmt.Errorf("%w: daytona sandbox %s is gone: %w", sandbox.ErrNotFound, h.ID, err)
	case gerr == nil && sb.State != "started":
		p.forget(h.ID)
		return fmt.Errorf("%w: daytona sandbox %s is %s: %w", sandbox.ErrNotFound, h.ID, sb.State, err)
	}
	return err
}

func (p *Provider) forget(id string) {
	p.mu.Lock()
	delete(p.boxes, id)
	p.mu.Unlock()
}

// prepare makes /mnt/data and the interpreter context whose working directory it is.
func (p *Provider) prepare(ctx context.Context, h sandbox.Handle, b *box) error {
	if _, err := p.toolbox(ctx, b, "mkdir", http.MethodPost, "/files/folder?"+url.Values{"path": {sandbox.DataDir}, "mode": {"0755"}}.Encode(), nil, ""); err != nil {
		return err
	}
	_, err := p.interpreterContext(ctx, h, b, true) // a new sandbox has none of ours to find
	return err
}

// discard deletes a sandbox Create made but does not hand out, even once ctx has ended.
func (p *Provider) discard(ctx context.Context, h sandbox.Handle, what string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.RequestTimeout)
	defer cancel()
	if err := p.Delete(cctx, h); err != nil {
		p.log.Warn("daytona: deleting an "+what+" sandbox failed", zap.String("sandbox", h.ID), zap.Error(err))
	}
}

// Delete deletes the sandbox. One that is already gone is not an error.
func (p *Provider) Delete(ctx context.Context, h sandbox.Handle) error {
	p.forget(h.ID)
	_, err := p.api(ctx, "delete", http.MethodDelete, "/sandbox/"+url.PathEscape(h.ID), nil)
	if errors.Is(err, sandbox.ErrNotFound) {
		return nil
	}
	if err == nil {
		p.log.Debug("daytona: sandbox deleted", zap.String("sandbox", h.ID))
	}
	return err
}

// KeepAlive sets the sandbox's auto-stop interval to d, rounded up to minutes: Daytona stops it
// (and, with an auto-delete interval of 0, deletes it) once it has been idle that long. Toolbox
// use counts as activity, so a container in use stays up. d <= 0 does nothing.
func (p *Provider) KeepAlive(ctx context.Context, h sandbox.Handle, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	_, err := p.api(ctx, "keepalive", http.MethodPost, "/sandbox/"+url.PathEscape(h.ID)+"/autostop/"+strconv.Itoa(minutes(d)), nil)
	return err
}

// api sends one Daytona API request, bounded by RequestTimeout, and returns its 2xx JSON answer.
func (p *Provider) api(ctx context.Context, op, method, path string, body []byte) (gjson.Result, error) {
	limit := int64(answerLimit)
	if op == "list" {
		limit = listLimit
	}
	raw, _, err := p.do(ctx, op, method, p.apiBase+path, body, "application/json", limit, apiError)
	if err != nil {
		return gjson.Result{}, err
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return gjson.Result{}, nil
	}
	if !gjson.ValidBytes(raw) {
		return gjson.Result{}, fmt.Errorf("%w: daytona %s: the answer is not JSON", sandbox.ErrUnavailable, op)
	}
	return gjson.ParseBytes(raw), nil
}

// toolbox sends one request to a sandbox's toolbox and returns its 2xx answer. contentType ""
// means a JSON body (when there is one).
func (p *Provider) toolbox(ctx context.Context, b *box, op, method, path string, body []byte, contentType string) ([]byte, error) {
	if contentType == "" {
		contentType = "application/json"
	}
	raw, _, err := p.do(ctx, op, method, b.toolbox+path, body, contentType, answerLimit, toolboxError)
	return raw, err
}

// do sends one request bounded by RequestTimeout and reads at most limit bytes of a 2xx answer;
// mapErr turns any other status into an error.
func (p *Provider) do(ctx context.Context, op, method, u string, body []byte, contentType string, limit int64,
	mapErr func(op string, status int, raw []byte, h http.Header) *APIError) ([]byte, http.Header, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: daytona %s: %w", sandbox.ErrUnavailable, op, err)
	}
	p.headers(req.Header)
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, nil, p.transportError(ctx, op, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, errBodyLimit))
		e := mapErr(op, resp.StatusCode, raw, resp.Header)
		e.Message = scrub(e.Message, p.opts.APIKey)
		return nil, nil, e
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, nil, p.transportError(ctx, op, err)
	}
	if int64(len(raw)) > limit {
		return nil, nil, fmt.Errorf("%w: daytona %s: the answer is larger than %d bytes", sandbox.ErrUnavailable, op, limit)
	}
	return raw, resp.Header, nil
}

// headers are what every request carries: the key and the SDK headers.
func (p *Provider) headers(h http.Header) {
	h.Set("Authorization", "Bearer "+p.opts.APIKey)
	h.Set("X-Daytona-Source", source)
	h.Set("X-Daytona-SDK-Version", SDKVersion)
	h.Set("User-Agent", "ciproxy-daytona")
}

// transportError maps a failed exchange: the caller's own cancellation stays itself, anything
// else means Daytona could not be reached. (Transport errors name the URL, never headers.)
func (p *Provider) transportError(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil && context.Cause(ctx) != context.DeadlineExceeded {
		return fmt.Errorf("daytona %s: %w", op, context.Cause(ctx))
	}
	return fmt.Errorf("%w: daytona %s: %w", sandbox.ErrUnavailable, op, err)
}

// apiError maps an error status of the Daytona API, whose body is NestJS's
// {"statusCode","error","message"} (message a string or a list of them).
func apiError(op string, status int, raw []byte, h http.Header) *APIError {
	e := &APIError{Op: op, StatusCode: status, Message: errorMessage(raw)}
	switch {
	case status == http.StatusUnauthorized:
		e.Message = "Daytona rejected the API key"
		e.kind = sandbox.ErrUnavailable
	case status == http.StatusForbidden:
		e.Message = "the API key lacks a permission this needs: " + e.Message
		e.kind = sandbox.ErrUnavailable
	case status == http.StatusTooManyRequests:
		e.RetryAfter = retryAfter(h)
		e.kind = sandbox.ErrRateLimited
	case status == http.StatusNotFound && op != "create" && op != "list":
		e.kind = sandbox.ErrNotFound
	default:
		e.kind = sandbox.ErrUnavailable
	}
	return e
}

// toolboxError maps an error status of a toolbox: the daemon's {"statusCode","message","code",
// "path","method"}, or the toolbox proxy's own answer for a sandbox it cannot reach.
func toolboxError(op string, status int, raw []byte, h http.Header) *APIError {
	e := &APIError{Op: op, StatusCode: status, Message: errorMessage(raw), Code: gjson.GetBytes(raw, "code").String(), toolbox: true}
	e.daemon = e.Code != "" && gjson.GetBytes(raw, "method").Exists()
	switch {
	case status == http.StatusUnauthorized:
		e.Message = "Daytona's toolbox proxy rejected the API key"
		e.kind = sandbox.ErrUnavailable
	case status == http.StatusTooManyRequests:
		e.RetryAfter = retryAfter(h)
		e.kind = sandbox.ErrRateLimited
	case status == http.StatusNotFound || status == http.StatusGone:
		e.kind = sandbox.ErrNotFound
	default:
		e.kind = sandbox.ErrUnavailable
	}
	return e
}

// isDaemonError reports whether err is an answer of the sandbox's daemon itself (a missing path),
// as opposed to the toolbox proxy's (a sandbox it cannot reach).
func isDaemonError(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.daemon
}

func errorMessage(raw []byte) string {
	msg := strings.TrimSpace(string(raw))
	if m := gjson.GetBytes(raw, "message"); m.Exists() {
		if m.IsArray() {
			var parts []string
			for _, s := range m.Array() {
				parts = append(parts, s.String())
			}
			msg = strings.Join(parts, ", ")
		} else {
			msg = m.String()
		}
	}
	if len(msg) > 300 {
		msg = msg[:300] + "..."
	}
	return msg
}

// scrub removes the API key from a message, in case a server echoes it.
func scrub(msg, key string) string {
	if key != "" {
		msg = strings.ReplaceAll(msg, key, "[redacted]")
	}
	return msg
}

// APIError is an error status from Daytona. It wraps one of the sandbox sentinels.
type APIError struct {
	Op         string
	StatusCode int
	// Message is Daytona's message (never containing the API key); Code the toolbox's code.
	Message    string
	Code       string
	RetryAfter time.Duration
	kind       error
	toolbox    bool
	daemon     bool
}

func (e *APIError) Error() string {
	var b strings.Builder
	where := "daytona"
	if e.toolbox {
		where = "daytona toolbox"
	}
	fmt.Fprintf(&b, "%v: %s %s: HTTP %d", e.kind, where, e.Op, e.StatusCode)
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

func retryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
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

// minutes rounds d up to whole minutes, at least 1 (0 would turn auto-stop off).
func minutes(d time.Duration) int {
	return max(1, int(math.Ceil(d.Minutes())))
}

// seconds rounds d up to whole seconds, at least 1 (0 would mean no timeout).
func seconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

// gigabytes reads a memory_limit ("1g", "4g", "512m") as whole GB, rounded up.
func gigabytes(limit string) (int, bool) {
	s := strings.ToLower(strings.TrimSpace(limit))
	if s == "" {
		return 0, false
	}
	mult := 1.0
	switch {
	case strings.HasSuffix(s, "g"):
		s = s[:len(s)-1]
	case strings.HasSuffix(s, "m"):
		s, mult = s[:len(s)-1], 1.0/1024
	default:
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 {
		return 0, false
	}
	return max(1, int(math.Ceil(f*mult))), true
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// keyHash identifies an API key without holding it (settings fingerprints).
func keyHash(key string) string {
	sum := sha256.Sum256([]byte("ciproxy-daytona:" + key))
	return hex.EncodeToString(sum[:8])
}
