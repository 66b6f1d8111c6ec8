// Package intercept runs OpenAI's code_interpreter tool on behalf of an upstream that only knows
// function calling. A request travels one pipeline, each stage in its own file:
//
//	request.go     the client's body, parsed once into a value (tools, tool_choice, include,
//	               input, container, files) without I/O, then resolved against the store (what a
//	               previous_response_id or a replayed call stands for); rewrite.go builds each
//	               upstream body from it; files.go checks the files it names and places them
//	               in the container before the first upstream call
//	loop.go        the agentic loop, which with resolve is the only I/O: the upstream, through
//	               the Responses seam (upstream.ResponsesAPI); the container (containers.go,
//	               execution.go); the response store (store.go)
//	translate.go   the pure translator: upstream events in, client events out, each call
//	               ending with a typed outcome; response.go assembles the client's Response,
//	               errors.go the error details, usage.go the summed usage, wire.go the
//	               objects the proxy mints, citations.go the container_file_citation
//	               annotations of the assistant's text
//	render_*.go    one event stream, rendered as server-sent events or as one JSON Response
//
// Both renderings consume the same events, so a stream's response.completed carries the Response
// the JSON path returns. The wire shapes and event order the package relies on are described in
// docs/wire-openai.md.
//
// The router hands each request over as a Request (Handles, ServeResponses) and writes any error
// returned before the first byte; after it, failures end the stream with the error event and
// response.failed.
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
//   - An upstream that keeps nothing (Request.Stateless: Chat Completions behind upstream.ChatAPI)
//     has no /v1/responses of its own, so the engine serves all its requests, code_interpreter or
//     not. A stored response then keeps the whole conversation instead of an upstream id, and
//     previous_response_id is resolved into input items before the loop; without storage,
//     reasoning items are carried by their text, which such upstreams return.
//   - A call's status is failed when the code raised or its arguments could not be read,
//     incomplete when it timed out or was not run (a limit), completed otherwise. The model is
//     always told what happened and always continues.
package intercept

import (
	"fmt"
	"net/http"
	"runtime/debug"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

// Options configure an Engine. Zero values mean the defaults.
type Options struct {
	// Containers holds the containers. Required for code to run; nil makes every intercepted
	// request that needs a sandbox fail with sandbox_unavailable.
	Containers *containers.Manager
	// Logger, nil for none.
	Logger *zap.Logger
	// Metrics registers the engine's metrics; nil registers nothing.
	Metrics prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Store maps the response ids the engine mints to what continuing them needs; nil: a
	// MemoryStore with its default TTL.
	Store Store
	// Files are the Files API's files, which container.file_ids and input_file parts name;
	// nil: none exist.
	Files FileStore
}

// Engine serves intercepted /v1/responses requests. It is safe for concurrent use; each request
// gets its own loop and translator.
type Engine struct {
	sessions containerManager
	log      *zap.Logger
	m        *metrics
	now      func() time.Time
	store    Store
	files    FileStore
}

// New returns an Engine.
func New(opts Options) *Engine {
	e := &Engine{log: opts.Logger, now: opts.Now, store: opts.Store, files: opts.Files, m: newMetrics(opts.Metrics)}
	if e.log == nil {
		e.log = zap.NewNop()
	}
	if e.now == nil {
		e.now = time.Now
	}
	if e.store == nil {
		e.store = NewMemoryStore(0, e.now)
	}
	if opts.Containers != nil {
		e.sessions = adaptSessions(opts.Containers)
	} else {
		e.sessions = noSessions{}
	}
	return e
}

// Request is one POST /v1/responses as the router hands it over, after authentication, the body
// read and the model resolved. The engine never modifies it.
type Request struct {
	// Config is the configuration snapshot the request was started with.
	Config *config.Config
	// Body is the request body as read; never modified.
	Body []byte
	// Upstream answers the loop's Responses requests for the request's model: *upstream.Target
	// for an upstream that speaks the Responses API, or another implementation of the seam.
	Upstream upstream.ResponsesAPI
	// Provider is the provider of the model's first deployment, for enabled_providers.
	Provider string
	// Caller is the owner the router named (router.Caller: a client key's name, or a hash of the
	// key; "" without one). It owns the containers and the responses the request creates.
	Caller string
	// Stateless says that Upstream keeps no responses and has no /v1/responses to pass through
	// to: it translates for an upstream that speaks only Chat Completions (upstream.ChatAPI). The
	// engine then serves every request for it, with or without code_interpreter, and keeps each
	// response's conversation itself, so previous_response_id, GET, DELETE and input_items work.
	Stateless bool
	// Inline admits the bytes of the stored files the request inlines by file_id, which it holds
	// as data URLs until it ends, and returns the func that releases them; its error is the answer
	// (a 429, a 503). Nil: no bound.
	Inline func(bytes int64) (release func(), err error)
}

// Handles reports whether the engine serves req: every request for a stateless upstream, and for
// any other one a request whose config has interception active for its provider and whose tools
// hold a code_interpreter tool. When it does not, the router passes the request through.
func (e *Engine) Handles(req *Request) bool {
	if req.Stateless {
		return req.Config != nil
	}
	return applies(req.Config, req.Provider, req.Body)
}

// ServeResponses serves in, a request that Handles accepted; hr is the client's HTTP request
// (its context bounds the whole loop; its headers go upstream, credentials removed). An error
// means nothing was written: the request failed before its first byte (an invalid body, an
// unknown container, an upstream's error answer, ...), and the caller writes the error (an
// *upstream.StatusError as the upstream sent it, anything else as apierror.From makes it).
// Failures after the first byte end the stream with the error event and response.failed, and the
// result is nil. A panic before the first byte is re-raised for the caller's recoverer. It is
// safe for concurrent use; each call has its own loop and translator.
func (e *Engine) ServeResponses(w http.ResponseWriter, hr *http.Request, in *Request) (err error) {
	ctx := hr.Context()
	caller := in.Caller
	ic := in.Config.Interception
	// Code runs only where interception applies; a stateless upstream's other requests keep
	// their tools as sent (its translation refuses a code_interpreter tool left in).
	req, aerr := parseRequest(in.Body, ic, applies(in.Config, in.Provider, in.Body))
	if aerr == nil {
		aerr = req.resolve(lookup{ctx: ctx, store: e.store, caller: caller, stateless: in.Stateless})
	}
	if aerr != nil {
		result := "client_error"
		if aerr.Status >= 500 {
			result = "error" // the store could not answer
		}
		e.m.requests.WithLabelValues(result).Inc()
		return aerr
	}
	release, err := req.findFiles(ctx, e.files, caller, in.Inline)
	if err != nil {
		e.m.requests.WithLabelValues("client_error").Inc()
		return err
	}
	defer release()
	var rend renderer
	if req.stream {
		rend = newSSERenderer(w, e.log)
	} else {
		rend = &jsonRenderer{w: w}
	}
	r := e.newRun(ic, ic.SandboxToolName, in.Upstream, caller, upstreamHeader(hr.Header, req.stream), req, rend.emit, nil)
	r.stateless = in.Stateless
	r.lim = containerLimits(in.Config)

	result := "completed"
	defer func() {
		e.m.requests.WithLabelValues(result).Inc()
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
		result = "panic"
		if !rend.started() {
			panic(p) // nothing written: the router's recoverer answers 500 and logs it
		}
		e.log.Error("intercept: panic", zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
		r.failStream(fmt.Errorf("panic: %v", p))
		err = nil
	}()
	// Deferred after the recover above, so it runs first: the container is released on every
	// path, panics included.
	defer r.releaseContainer(ctx)

	if aerr := r.startContainer(ctx); aerr != nil {
		result = "client_error"
		if aerr.Code == "sandbox_unavailable" {
			result = "sandbox_unavailable"
		}
		return aerr
	}
	err = r.loop(ctx)
	switch {
	case err == nil:
		result = r.tr.outcome().metric()
		rend.done()
		return nil
	case apierror.Ended(ctx) != nil:
		// The server ended the request (shutting down): the client is still there to be told.
		result = "error"
		if !rend.started() {
			return apierror.Ended(ctx)
		}
		r.failStream(apierror.Ended(ctx))
		return nil
	case ctx.Err() != nil:
		result = "canceled"
		return ctx.Err()
	case !rend.started():
		result = classify(err)
		return err
	default:
		result = classify(err)
		e.log.Warn("intercepted request failed mid-stream", zap.String("outcome", result), zap.Error(err))
		r.failStream(err)
		return nil
	}
}

// applies reports whether the engine intercepts a request with this body for this provider.
func applies(cfg *config.Config, provider string, body []byte) bool {
	if cfg == nil || !cfg.InterceptionActive() {
		return false
	}
	if p := cfg.Interception.EnabledProviders; p != nil && !slices.Contains(p, provider) {
		return false
	}
	return wants(body)
}

// failStream ends a stream that has started with err: the error event and response.failed.
func (r *run) failStream(err error) {
	detail := clientDetail(err)
	_ = r.emit(newErrorEvent(detail))
	_ = r.emit(r.tr.failed(detail))
}

// metric names how a loop that ended normally ended, for metrics.
func (o outcome) metric() string {
	switch o {
	case outcomeFailed:
		return "upstream_failed"
	case outcomeIncomplete:
		return "incomplete"
	}
	return "completed"
}

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
