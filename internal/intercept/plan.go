package intercept

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
)

// Plan is one POST /v1/responses as Prepare understood it: whether the engine serves it, and
// for one it serves, the request parsed and resolved against the store, ready for Serve. The
// router asks it which container the request uses (Container) to forward the request to the
// replica that holds it, or to serve it here.
type Plan struct {
	// Request is the request as handed to Prepare.
	Request *Request
	// Intercepted: the engine serves the request (Serve); otherwise it passes through.
	Intercepted bool
	// Minted: previous_response_id names a response this engine minted, which the upstream
	// never heard of (the engine then serves the request, code_interpreter or not).
	Minted bool

	req *parsedRequest // nil for a request the engine does not serve
}

// Prepare reads in once: it validates the body, decides whether the engine serves it (every
// request for a stateless upstream; a request whose config has interception active for its
// provider and whose tools hold a code_interpreter tool; one continuing a response the engine
// minted), and for one it serves parses it and resolves it against the store, reading the
// previous response once. The Plan is returned even with an error, for what it says of
// previous_response_id; the error is that of a request the engine serves and cannot (an invalid
// body, an unknown previous_response_id, a store that cannot answer), and nothing is written.
func (e *Engine) Prepare(ctx context.Context, in *Request) (*Plan, error) {
	return e.prepare(ctx, in, false)
}

// prepare is Prepare; routed makes the engine serve the request whatever it holds (tests serve
// requests a router would pass through).
func (e *Engine) prepare(ctx context.Context, in *Request, routed bool) (*Plan, error) {
	p := &Plan{Request: in}
	root := gjson.ParseBytes(in.Body)
	if !(in.Checked || jsondepth.Valid(in.Body)) || !root.IsObject() {
		if (!in.Stateless && !routed) || in.Config == nil {
			return p, nil // the upstream answers what it makes of it
		}
		p.Intercepted = true
		return p, e.refused(apierror.BadRequest("The request body must be a JSON object.", "", ""))
	}
	code := applies(in.Config, in.Provider, in.InterceptedTools, root)
	var prev *prevRecord
	prevErr := error(nil)
	if id := root.Get("previous_response_id").String(); id != "" {
		sr, known, err := readResponse(ctx, e.store, id)
		prev, prevErr = &prevRecord{sr: sr, known: known}, err
		p.Minted = err == nil && known
	}
	p.Intercepted = in.Config != nil && (routed || in.Stateless || code || p.Minted)
	if !p.Intercepted {
		return p, nil
	}
	ic := in.interception()
	// Code runs only where interception applies; a stateless upstream's other requests keep
	// their tools as sent (its translation refuses a code_interpreter tool left in).
	req, aerr := parseRoot(root, in.Body, ic, code)
	if aerr == nil && prevErr != nil {
		aerr = storeUnavailable(prevErr)
	}
	if aerr == nil {
		aerr = req.resolve(lookup{ctx: ctx, store: e.store, caller: in.Caller, stateless: in.Stateless, prev: prev})
	}
	if aerr == nil && req.sandboxed() {
		// Refused now rather than when the container is made, after the response has begun.
		policy, err := e.sessions.CheckNetwork(ctx, ic.SandboxToolName, req.container.network)
		if aerr = NetworkRefusal(err, req.container.networkParam); aerr == nil {
			req.setNetwork(policy)
		}
	}
	if aerr != nil {
		return p, e.refused(aerr)
	}
	p.req = req
	return p, nil
}

// refused counts a request the engine serves that Prepare refused, and returns its error.
func (e *Engine) refused(aerr *apierror.Error) *apierror.Error {
	result := "client_error"
	if aerr.Status >= 500 {
		result = "error" // the store could not answer
	}
	e.m.requests.WithLabelValues(result).Inc()
	return aerr
}

// applies reports whether the engine intercepts a request with this body for this provider and
// a model whose entry says tools (its model_info.intercepted_tools; nil: the config's tools).
func applies(cfg *config.Config, provider string, tools []string, root gjson.Result) bool {
	if cfg == nil || !cfg.InterceptionActive() {
		return false
	}
	if !cfg.Interception.ProviderEnabled(provider) {
		return false
	}
	return wants(root, cfg.Interception.ForModel(tools))
}

// interception is the config's interception settings for in's model: the hosted tools it runs
// are the model's own when its entry lists them.
func (in *Request) interception() config.Interception {
	return in.Config.Interception.ForModel(in.InterceptedTools)
}

// Container returns the container the request uses, the one rule for it on every replica:
// the code_interpreter tool's explicit id, live or not (a dead one is the 404 of the replica
// that serves the request); else the latest container of the conversation (previous_response_id's,
// then those of the input's code_interpreter_call items, a container named again counting where
// it is named last) that live reports live, asking at most maxReuseTries of them from the latest
// on; "" for a new container, or for a request that runs no code. An error from live ends the
// search with it.
func (p *Plan) Container(ctx context.Context, live func(ctx context.Context, id string) (bool, error)) (string, error) {
	if p.req == nil {
		return "", nil
	}
	return p.req.containerFor(ctx, live)
}

// containerFor is Plan.Container.
func (r *parsedRequest) containerFor(ctx context.Context, live func(ctx context.Context, id string) (bool, error)) (string, error) {
	if !r.sandboxed() {
		return "", nil
	}
	if id := r.container.id; id != "" {
		return id, nil
	}
	ctxs := r.contextContainers
	for i := len(ctxs) - 1; i >= 0 && i >= len(ctxs)-maxReuseTries; i-- {
		ok, err := live(ctx, ctxs[i])
		if err != nil {
			return "", err
		}
		if ok {
			return ctxs[i], nil
		}
	}
	return "", nil
}

// maxReuseTries bounds how many of the context's containers an auto container tries to reopen
// (each try may ask the backend) before it creates one.
const maxReuseTries = 4

// Serve serves a request that Prepare planned as intercepted; hr is the client's HTTP request
// (its context bounds the whole loop; its headers go upstream, credentials removed). An error
// means nothing was written: the request failed before its first byte (an unknown container, an
// upstream's error answer, ...), and the caller writes the error (an *upstream.StatusError as the
// upstream sent it, anything else as apierror.From makes it). Failures after the first byte end
// the stream with the error event and response.failed, and the result is nil. A panic before the
// first byte is re-raised for the caller's recoverer. It is safe for concurrent use; each call
// has its own loop and translator.
func (e *Engine) Serve(w http.ResponseWriter, hr *http.Request, p *Plan) (err error) {
	req := p.req
	if req == nil {
		return fmt.Errorf("intercept: Serve of a request Prepare did not plan to serve")
	}
	ctx := hr.Context()
	in := p.Request
	caller := in.Caller
	ic := in.interception()
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
		if aerr.Code == apierror.CodeSandboxUnavailable {
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
