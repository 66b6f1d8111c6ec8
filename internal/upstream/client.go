// Package upstream is the HTTP side that faces model providers: the tuned client, round-robin
// balancing and failover over a model's deployments, byte-preserving passthrough, the SSE reader,
// and the Responses seam (ResponsesAPI, responses.go) through which the intercept engine reaches
// an upstream whatever API it speaks.
package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
)

// ClientOptions configures a Client. Zero values mean defaults.
type ClientOptions struct {
	// Transport sends requests to providers. nil means NewTransport().
	Transport http.RoundTripper
	// Logger receives failover and upstream-failure lines; it never sees keys or bodies. nil means none.
	Logger *zap.Logger
	// Metrics counts upstream requests. nil means no metrics.
	Metrics *Metrics
}

// Client sends requests to the deployments of a model. It is safe for concurrent use; one Client
// serves the whole process and survives config reloads (a Target carries the deployments).
type Client struct {
	transport http.RoundTripper
	log       *zap.Logger
	metrics   *Metrics
	errorLog  *log.Logger // for httputil.ReverseProxy's own messages
	buffers   bufferPool
}

// NewClient returns a Client.
func NewClient(opts ClientOptions) *Client {
	c := &Client{transport: opts.Transport, log: opts.Logger, metrics: opts.Metrics}
	if c.transport == nil {
		c.transport = NewTransport()
	}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	c.errorLog = zap.NewStdLog(c.log.WithOptions(zap.IncreaseLevel(zapcore.WarnLevel)))
	c.buffers.p.New = func() any {
		b := make([]byte, 32<<10)
		return &b
	}
	return c
}

// NewTransport returns the transport a Client uses by default: keep-alives with enough idle
// connections per host for many concurrent streams, HTTP/2 when a TLS server offers it, a dial and a
// TLS-handshake timeout, and no response-header or overall timeout, because a reasoning model may
// think for minutes before its first byte and a stream may last longer still. Cancellation comes
// from the request's context.
func NewTransport() *http.Transport {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		ReadBufferSize:        32 << 10,
		WriteBufferSize:       32 << 10,
	}
}

// CloseIdleConnections closes idle upstream connections, if the transport supports it.
func (c *Client) CloseIdleConnections() {
	if ci, ok := c.transport.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// Target returns the deployments of one model, to be tried in the given order (see Balancer.Order).
// The Target keeps deps as given; the caller must not modify the slice afterwards.
func (c *Client) Target(deps []config.Deployment) *Target {
	return &Target{c: c, deps: deps}
}

// Target sends one client request to a model's deployments, failing over from one to the next.
// It is safe for concurrent use.
type Target struct {
	c    *Client
	deps []config.Deployment
}

// Deployments returns the deployments in the order they are tried. The caller must not modify it.
func (t *Target) Deployments() []config.Deployment { return t.deps }

// maxBufferedErrorBody bounds how much of a 5xx body is kept while the next deployment is tried.
const maxBufferedErrorBody = 1 << 20

// Post sends body to path (e.g. "/responses", joined to each deployment's api_base, or mapped onto
// Azure's paths) and returns the first response that is not a failure, with the deployment that
// answered.
//
// For each deployment the body is DeploymentBody's: the top-level "model" of a JSON-object body
// replaced by the deployment's UpstreamModel and its default request params added where the client
// set none, every other byte kept; body itself is never modified. h is not modified either: the
// request carries a copy without hop-by-hop headers, without any client credential (Authorization,
// Api-Key, X-Api-Key, OpenAI-Organization, OpenAI-Project, Cookie) and without Accept-Encoding, so
// the transport negotiates and undoes compression itself and the caller always reads plain bytes.
// The deployment's extra headers are added where h has none of the name, and its key is sent as
// "Authorization: Bearer <key>" (Azure keys: "api-key: <key>").
//
// A connection error, a 5xx status, or no response headers within the deployment's timeout moves
// on to the next deployment; a deployment with Attempts set makes that many attempts in all, going
// round the deployments again. When all fail, the last 5xx response is returned as is; when none
// could be reached, the error is a 502 *apierror.Error (504 when the last attempt timed out).
// Deployments whose key refers to an unset environment variable, and those the proxy cannot call
// (Deployment.Unusable), are skipped; if no other deployment exists, the error is a 502
// *apierror.Error naming the variable, or a 501 naming the deployment and why (with
// "x-should-retry: false": retrying cannot help). Any other status (4xx included) is returned to the
// caller as a normal response, which must then close its body. When ctx ends, the error wraps
// ctx.Err() and nothing else is tried.
func (t *Target) Post(ctx context.Context, path string, body []byte, h http.Header) (*http.Response, config.Deployment, error) {
	hdr := cleanHeader(h)
	// The caller reads the body, so it must be plain; TE is hop-by-hop in any case.
	hdr.Del("Accept-Encoding")
	hdr.Del("Te")
	if len(body) > 0 && hdr.Get("Content-Type") == "" {
		hdr.Set("Content-Type", "application/json")
	}
	return t.send(ctx, http.MethodPost, path, "", hdr, Streamed{JSON: body})
}

// errHeaderTimeout is the cause of an attempt that got no response headers within its timeout.
var errHeaderTimeout = errors.New("no response headers within the deployment's timeout")

// send tries the deployments in order; see Post for the rules. hdr must already be clean and is
// not modified.
func (t *Target) send(ctx context.Context, method, urlPath, rawQuery string, hdr http.Header, body Streamed) (*http.Response, config.Deployment, error) {
	var usable []int // indexes of the deployments that can be called
	var skipped *config.Deployment
	for i, d := range t.deps {
		if !d.Callable() {
			if skipped == nil {
				skipped = &t.deps[i]
			}
			// Config loading already warned; this is per request, so debug only.
			t.c.log.Debug("skipping deployment that cannot be called",
				zap.String("model", d.ModelName), zap.String("provider", d.Provider),
				zap.String("env", d.MissingEnv), zap.String("unusable", d.Unusable))
			continue
		}
		usable = append(usable, i)
	}
	if len(usable) == 0 {
		return nil, config.Deployment{}, notCallable(skipped)
	}
	attempts := len(usable)
	if a := t.deps[usable[0]].Attempts; a > 0 {
		attempts = a
	}
	stream := gjson.GetBytes(body.JSON, "stream").Bool()

	var (
		last     *http.Response    // a buffered 5xx from an attempt that was not the last
		lastDep  config.Deployment // the deployment last tried
		lastErr  config.Deployment // the deployment that answered last with a 5xx
		connErrs []error
		timedOut bool // the last failed attempt got no headers in time

		sent    sendable // body as prepared for sentFor, reused while the deployment stays the same
		sentFor = -1
	)
	for n := range attempts {
		i := usable[n%len(usable)]
		d := t.deps[i]
		if n > 0 {
			t.c.metrics.failover(d.Provider)
		}
		lastDep = d
		var err error
		if sentFor != i {
			if sent, err = body.forDeployment(d, urlPath); err != nil {
				return nil, d, err
			}
			sentFor = i
		}
		timeout := d.Timeout
		if stream {
			timeout = d.StreamTimeout
		}
		resp, err := t.attempt(ctx, method, d, urlPath, rawQuery, hdr, sent, timeout)
		if err != nil {
			if ctx.Err() != nil {
				t.c.metrics.errored(d.Provider, "canceled")
				closeBody(last)
				return nil, d, fmt.Errorf("calling upstream for model %q: %w", d.ModelName, ctx.Err())
			}
			kind := "connect"
			timedOut = errors.Is(err, errHeaderTimeout)
			if timedOut {
				kind = "timeout"
			}
			t.c.metrics.errored(d.Provider, kind)
			t.c.log.Warn("upstream unreachable",
				zap.String("model", d.ModelName), zap.String("provider", d.Provider),
				zap.String("api_base", safeBase(d.APIBase)), zap.Int("attempt", n+1), zap.Error(err))
			connErrs = append(connErrs, err)
			continue
		}
		timedOut = false
		if resp.StatusCode < 500 || n == attempts-1 {
			if resp.StatusCode >= 500 {
				t.c.metrics.errored(d.Provider, "5xx")
			}
			closeBody(last)
			return resp, d, nil
		}
		t.c.metrics.errored(d.Provider, "5xx")
		t.c.log.Warn("upstream failed, trying the next deployment",
			zap.String("model", d.ModelName), zap.String("provider", d.Provider),
			zap.String("api_base", safeBase(d.APIBase)), zap.Int("attempt", n+1), zap.Int("status", resp.StatusCode))
		buffered, err := bufferBody(resp)
		if err != nil && ctx.Err() != nil {
			closeBody(last)
			return nil, d, fmt.Errorf("calling upstream for model %q: %w", d.ModelName, ctx.Err())
		}
		closeBody(last)
		last, lastErr = buffered, d
	}
	if last != nil {
		return last, lastErr, nil
	}
	model := lastDep.ModelName
	cause := fmt.Errorf("model %q: %w", model, errors.Join(connErrs...))
	if timedOut {
		return nil, lastDep, &apierror.Error{Status: http.StatusGatewayTimeout, Type: apierror.TypeServer, Code: apierror.CodeUpstreamTimeout,
			Message: fmt.Sprintf("The upstream for model %q did not answer in time.", model), Err: cause}
	}
	return nil, lastDep, apierror.BadGateway(
		fmt.Sprintf("The upstream for model %q could not be reached.", model), apierror.CodeUpstreamUnreachable, cause)
}

// attempt makes one upstream call. With a timeout, the call fails with errHeaderTimeout when no
// response headers arrived in time; once they have, the body may take as long as it takes (a
// stream, a slow model), until ctx ends.
func (t *Target) attempt(ctx context.Context, method string, d config.Deployment, urlPath, rawQuery string, hdr http.Header, body sendable, timeout time.Duration) (*http.Response, error) {
	actx, cancel := context.WithCancelCause(ctx)
	req, err := newRequest(actx, method, d, urlPath, rawQuery, hdr, body)
	if err != nil {
		cancel(nil)
		// Config validation checks api_base, so this is a bug rather than an outage; still, the
		// next deployment may work.
		t.c.log.Error("cannot build upstream request", zap.String("model", d.ModelName), zap.Error(err))
		return nil, err
	}
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(timeout, func() { cancel(errHeaderTimeout) })
	}
	start := time.Now()
	resp, err := t.c.transport.RoundTrip(req)
	if timer != nil && !timer.Stop() {
		// The timer fired: whatever came back came too late.
		closeBody(resp)
		cancel(nil)
		return nil, fmt.Errorf("after %v: %w", timeout, errHeaderTimeout)
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	t.c.metrics.answered(d.Provider, resp.StatusCode, time.Since(start))
	if d.StreamIdleTimeout > 0 {
		resp.Body = newIdleBody(actx, resp.Body, d.StreamIdleTimeout, cancel)
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: func() { cancel(nil) }}
	return resp, nil
}

// ErrUpstreamIdle is the cause of an upstream call given up because its body sent nothing for
// the deployment's stream_idle_timeout. A body's read fails with a 504 *apierror.Error
// (upstream_timeout) wrapping it.
var ErrUpstreamIdle = errors.New("the upstream sent nothing within the deployment's stream_idle_timeout")

// idleBody is an upstream body whose reads each get idle to return: a stalled upstream would
// otherwise hold the request, and what it holds (a container lease, a concurrency slot), until
// the client gives up. The clock runs only inside Read, so a client slow to take the bytes is
// not counted against the upstream.
type idleBody struct {
	io.ReadCloser
	ctx   context.Context
	idle  time.Duration
	timer *time.Timer
}

// newIdleBody wraps body, read under ctx; cancel ends ctx when a read waits longer than idle.
func newIdleBody(ctx context.Context, body io.ReadCloser, idle time.Duration, cancel context.CancelCauseFunc) *idleBody {
	b := &idleBody{ReadCloser: body, ctx: ctx, idle: idle, timer: time.AfterFunc(idle, func() { cancel(ErrUpstreamIdle) })}
	b.timer.Stop()
	return b
}

func (b *idleBody) Read(p []byte) (int, error) {
	b.timer.Reset(b.idle)
	n, err := b.ReadCloser.Read(p)
	b.timer.Stop()
	if err != nil && errors.Is(context.Cause(b.ctx), ErrUpstreamIdle) {
		err = &apierror.Error{Status: http.StatusGatewayTimeout, Type: apierror.TypeServer, Code: apierror.CodeUpstreamTimeout,
			Message: fmt.Sprintf("The upstream sent nothing for %v (stream_idle_timeout); the call was given up.", b.idle),
			Err:     ErrUpstreamIdle}
	}
	return n, err
}

func (b *idleBody) Close() error {
	b.timer.Stop()
	return b.ReadCloser.Close()
}

// cancelOnClose releases an attempt's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel func()
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// notCallable is the error for a model none of whose deployments can be called; d is the first of
// them (nil when the target has none).
func notCallable(d *config.Deployment) error {
	switch {
	case d == nil:
		return &apierror.Error{
			Status: http.StatusBadGateway, Type: apierror.TypeServer, Code: apierror.CodeUpstreamNotConfigured,
			Message: "No upstream is configured for this model.",
		}
	case d.Unusable != "":
		// The operator's configuration, not the request, is at fault, and retrying cannot help.
		return &apierror.Error{
			Status: http.StatusNotImplemented, Type: apierror.TypeServer, Code: apierror.CodeDeploymentNotSupported,
			Message: fmt.Sprintf("Model %q cannot be served by this proxy: its deployment %s (line %d of the configuration) %s.",
				d.ModelName, d.Name(), d.Line, strings.TrimSuffix(unusableReason(d.Unusable), ".")),
			Header: http.Header{"X-Should-Retry": {"false"}},
		}
	}
	return &apierror.Error{
		Status: http.StatusBadGateway,
		Type:   apierror.TypeServer,
		Code:   apierror.CodeUpstreamNotConfigured,
		Message: fmt.Sprintf("Model %q is not configured: the environment variable %s is not set. Set it and restart the proxy.",
			d.ModelName, d.MissingEnv),
	}
}

// unusableReason phrases config's reason after "its deployment X (line N)": "cannot be called: ...".
func unusableReason(reason string) string {
	if rest, ok := strings.CutPrefix(reason, "provider "); ok {
		if _, tail, found := strings.Cut(rest, " "); found {
			return "uses a provider that " + tail
		}
	}
	return "cannot be called: " + reason
}

// newRequest builds the request for one deployment. hdr is copied, never modified.
func newRequest(ctx context.Context, method string, d config.Deployment, urlPath, rawQuery string, hdr http.Header, body sendable) (*http.Request, error) {
	u, err := endpointURL(d, urlPath, rawQuery)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("building upstream request: %w", err)
	}
	body.setBody(req) // with GetBody, so the transport may retry
	req.Header = hdr.Clone()
	if req.Header == nil {
		req.Header = make(http.Header)
	}
	setDeploymentHeaders(req.Header, d)
	return req, nil
}

// joinURL appends p (cleaned, so it cannot climb above the base path) to base and merges queries.
func joinURL(base, p, rawQuery string) (*url.URL, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("parsing api_base: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("api_base: unsupported scheme %q", u.Scheme)
	}
	if p != "" && p != "/" {
		clean := path.Clean("/" + p)
		if strings.HasSuffix(p, "/") {
			clean += "/"
		}
		u.Path = strings.TrimSuffix(u.Path, "/") + clean
		u.RawPath = ""
	}
	switch {
	case rawQuery == "":
	case u.RawQuery == "":
		u.RawQuery = rawQuery
	default:
		u.RawQuery += "&" + rawQuery
	}
	return u, nil
}

// safeBase returns api_base for a log line: no user info, no query (either may hold a key).
func safeBase(base string) string {
	u, err := url.Parse(base)
	if err != nil {
		return "(invalid)"
	}
	u.User = nil
	u.RawQuery = ""
	u.Fragment = ""
	return u.String()
}

// bufferBody reads up to maxBufferedErrorBody of resp's body into memory and closes the
// connection's body, so the response can be kept while other deployments are tried.
func bufferBody(resp *http.Response) (*http.Response, error) {
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBufferedErrorBody))
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Del("Content-Length")
	resp.TransferEncoding = nil
	return resp, err
}

func closeBody(resp *http.Response) {
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
}

// bufferPool lends copy buffers to httputil.ReverseProxy.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufferPool) Put(s []byte) { b.p.Put(&s) }
