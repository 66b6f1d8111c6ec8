// Package intercept runs OpenAI's code_interpreter tool on behalf of an upstream that only knows
// function calling: it rewrites the request (rewrite.go), runs the agentic loop against the
// upstream and a sandbox (loop.go), translates the upstream's output into code_interpreter_call
// items and native events (translate.go), and renders them as one JSON Response
// (render_json.go) or as the event stream (render_sse.go). Both renderings consume the same
// events, so a stream's response.completed carries the Response the JSON path returns.
//
// Decisions worth knowing:
//
//   - Every upstream call resends the whole conversation: the client's input (translated), then
//     each turn's items and the outputs of our calls, with store and previous_response_id as the
//     client sent them. Chaining intermediate calls by previous_response_id would be cheaper on
//     OpenAI, but servers such as vLLM do not keep responses; resending works everywhere.
//   - A client-visible response id maps (Store) to the last upstream response id, the container,
//     and the outputs of stand-in calls the client never saw as function calls, so
//     previous_response_id works across intercepted turns.
//   - With store:false, reasoning.encrypted_content is asked for when the request has a
//     "reasoning" object, or from the next call on once the model returned reasoning items
//     (non-reasoning models reject the include, so it is never added blindly). Encrypted content
//     the client did not ask for is stripped from what it sees; reasoning items that carry none
//     cannot be resent without storage and are dropped from the carried turn.
//   - A call's status is failed when the code raised or its arguments could not be read,
//     incomplete when it timed out or was not run (a limit), completed otherwise. The model is
//     always told what happened and always continues.
package intercept

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

// Options configure an Engine. Zero values mean the defaults.
type Options struct {
	// Sessions holds the containers. Required for code to run; nil makes every intercepted
	// request that needs a sandbox fail with sandbox_unavailable.
	Sessions *sandbox.Sessions
	// Logger, nil for none.
	Logger *zap.Logger
	// Metrics registers the engine's metrics; nil registers nothing.
	Metrics prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Store maps the response ids the engine mints to what continuing them needs; nil: an
	// in-memory store keeping entries for 24 hours.
	Store Store
}

// Engine serves intercepted /v1/responses requests. It is safe for concurrent use; each request
// gets its own loop and translator.
type Engine struct {
	sessions containers
	log      *zap.Logger
	m        *metrics
	now      func() time.Time
	store    Store
}

// New returns an Engine.
func New(opts Options) *Engine {
	e := &Engine{log: opts.Logger, now: opts.Now, store: opts.Store, m: newMetrics(opts.Metrics)}
	if e.log == nil {
		e.log = zap.NewNop()
	}
	if e.now == nil {
		e.now = time.Now
	}
	if e.store == nil {
		e.store = NewMemoryStore(24*time.Hour, e.now)
	}
	if opts.Sessions != nil {
		e.sessions = sessions{opts.Sessions}
	} else {
		e.sessions = noSessions{}
	}
	return e
}

// ServeResponses serves one POST /v1/responses request when it is for the engine: interception
// is active in cfg, provider is enabled for it, and the body's tools hold a code_interpreter tool.
// Otherwise it returns false having written nothing, and the caller passes the request through.
// body is the request body as read (never modified); caller is the hash of the client's key
// ("" if none) and owns the containers the request creates. target is the upstream for the
// request's model.
func (e *Engine) ServeResponses(w http.ResponseWriter, r *http.Request, cfg *config.Config, target *upstream.Target, provider string, body []byte, caller string) bool {
	if !Applies(cfg, provider, body) {
		return false
	}
	e.serve(w, r, cfg, target, body, caller)
	return true
}

// Applies reports whether the engine intercepts a request with this body for this provider.
func Applies(cfg *config.Config, provider string, body []byte) bool {
	if cfg == nil || !cfg.InterceptionActive() {
		return false
	}
	if p := cfg.Interception.EnabledProviders; p != nil && !slices.Contains(p, provider) {
		return false
	}
	return wants(body)
}

// serve runs the loop for one request and renders it.
func (e *Engine) serve(w http.ResponseWriter, hr *http.Request, cfg *config.Config, target poster, body []byte, caller string) {
	ctx := hr.Context()
	ic := cfg.Interception
	req, aerr := parseRequest(body, ic, lookup{ctx: ctx, store: e.store, caller: caller})
	if aerr != nil {
		e.m.requests.WithLabelValues("client_error").Inc()
		apierror.Write(w, aerr)
		return
	}
	tool := ic.SandboxToolName
	if tool == "" && len(cfg.SandboxTools) > 0 {
		tool = cfg.SandboxTools[0].Name
	}
	var rend renderer
	if req.stream {
		rend = newSSERenderer(w, e.log)
	} else {
		rend = &jsonRenderer{w: w}
	}
	r := &run{
		e: e, ic: ic, tool: tool, target: target, caller: caller, req: req,
		hdr: upstreamHeader(hr.Header, req.stream), emit: rend.emit, stored: map[string]StoredCall{},
	}
	r.tr = newTranslator(req, newID("resp_"), 0, func() (string, error) { return r.containerID(ctx) })

	outcome := "completed"
	defer func() {
		e.m.requests.WithLabelValues(outcome).Inc()
		if r.iterations > 0 {
			e.m.iterations.Observe(float64(r.iterations))
		}
	}()
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		if p == http.ErrAbortHandler {
			panic(p)
		}
		outcome = "panic"
		e.log.Error("intercept: panic", zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
		r.fail(rend, fmt.Errorf("panic: %v", p))
	}()
	// Deferred after the recover above, so it runs first: the container is released on every
	// path, panics included.
	defer r.releaseContainer(ctx)

	if aerr := r.startContainer(ctx); aerr != nil {
		outcome = "client_error"
		if aerr.Code == "sandbox_unavailable" {
			outcome = "sandbox_unavailable"
		}
		apierror.Write(w, aerr)
		return
	}
	err := r.loop(ctx)
	switch {
	case err == nil:
		outcome = r.tr.outcome()
		rend.done()
	case ctx.Err() != nil:
		outcome = "canceled"
	default:
		outcome = classify(err)
		e.log.Warn("intercepted request failed", zap.String("outcome", outcome), zap.Error(err))
		r.fail(rend, err)
	}
}

// fail ends the response with err: an HTTP error when nothing was written yet, otherwise the
// error event and response.failed.
func (r *run) fail(rend renderer, err error) {
	if !rend.started() {
		rend.writeError(err)
		return
	}
	detail := clientDetail(err)
	_ = r.emit(errorEvent(detail))
	_ = r.emit(r.tr.failed(detail))
}

// outcome names how the loop ended, for metrics.
func (t *translator) outcome() string {
	switch {
	case t.finalType == "response.failed":
		return "upstream_failed"
	case t.finalType == "response.incomplete":
		return "incomplete"
	}
	return "completed"
}

// noSessions is the containers of an Engine without Sessions: nothing can be created.
type noSessions struct{}

func (noSessions) Create(context.Context, string, string, sandbox.CreateOptions, time.Duration) (runner, error) {
	return nil, fmt.Errorf("%w: no sandbox sessions configured", sandbox.ErrUnavailable)
}

func (noSessions) Open(context.Context, string, string) (runner, error) {
	return nil, sandbox.ErrNotFound
}

func (noSessions) Release(context.Context, runner, time.Duration) {}

// upstreamHeader returns the headers sent upstream: the client's, minus those that describe the
// client's own body or connection. Target.Post replaces the credentials.
func upstreamHeader(in http.Header, stream bool) http.Header {
	h := in.Clone()
	for _, k := range []string{"Content-Length", "Accept-Encoding", "Authorization", "Cookie", "Api-Key", "X-Api-Key"} {
		h.Del(k)
	}
	h.Set("Content-Type", "application/json")
	if stream {
		h.Set("Accept", "text/event-stream")
	} else {
		h.Set("Accept", "application/json")
	}
	return h
}
