// Package intercept runs OpenAI's code_interpreter tool on behalf of an upstream that only knows
// function calling. A request travels one pipeline, each stage in its own file:
//
//	plan.go        Prepare and Serve: the request read once into a Plan, then served
//	request.go     the client's body, parsed once into a value (tools, tool_choice, include,
//	               input, container, files) without I/O, then resolved against the store (what a
//	               previous_response_id or a replayed call stands for); rewrite.go builds each
//	               upstream body from it; files.go checks the files it names and places them
//	               in the container before the first upstream call
//	loop.go        the agentic loop, which with resolve is the only I/O: the upstream, through
//	               the Responses seam (upstream.ResponsesAPI); the container (containers.go,
//	               execution.go); the state store's Responses (stored.go, which also
//	               answers GET and DELETE for the responses kept)
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
// The router hands each request over as a Request to Prepare (plan.go), which reads it once into
// a Plan: whether the engine serves it, and which container it uses (Plan.Container, the one rule
// every replica follows); Serve runs the plan. The router writes any error returned before the
// first byte; after it, failures end the stream with the error event and response.failed.
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
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/store"
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
	// Store keeps what continuing the responses the engine mints needs, each for a day, and what
	// their clients received (the state store: on local disk, or shared by the replicas).
	// Required.
	Store store.Responses
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
	store    store.Responses
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
	if opts.Containers != nil {
		e.sessions = manager{opts.Containers}
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
	// Checked says that Body is known to be a JSON object nested no deeper than jsondepth.Max
	// (the router checks every body it routes), so Prepare does not scan it again.
	Checked bool
	// Upstream answers the loop's Responses requests for the request's model: *upstream.Target
	// for an upstream that speaks the Responses API, or another implementation of the seam.
	Upstream upstream.ResponsesAPI
	// Provider is the provider of the model's first deployment, for enabled_providers.
	Provider string
	// InterceptedTools are the model's first deployment's model_info.intercepted_tools
	// (config.Deployment.InterceptedTools): nil for Config's Interception.Tools, empty for none.
	InterceptedTools []string
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
	// The client's credentials and framing are dropped by the upstream client itself
	// (upstream.Target.Post). Accept-Encoding goes here: the engine reads what the upstream
	// answers, which Go's transport decompresses only when it asked for the compression itself.
	h.Del("Accept-Encoding")
	h.Set("Content-Type", "application/json")
	if stream {
		h.Set("Accept", "text/event-stream")
	} else {
		h.Set("Accept", "application/json")
	}
	return h
}
