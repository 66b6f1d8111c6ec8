package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/go-chi/chi/v5"
	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/inputfiles"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

// healthz reports that the process is alive; it checks nothing else. It also answers another
// replica's probe.
func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	s.answerProbe(w, r)
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Readiness is Options.Ready's answer.
type Readiness struct {
	// NotReady, when set, says why this replica must not be sent requests (503): it is shutting
	// down, say.
	NotReady string
	// Degraded, when set, names a fault this replica shares with its peers, such as the state
	// store not answering. /readyz stays 200 and says so: taking every replica out of a load
	// balancer would stop the requests that need no state too.
	Degraded string
}

// readyz reports whether the proxy can serve: a configuration is loaded and Options.Ready agrees.
// A 503 says why in "reason"; a 200 names a shared fault in "degraded".
func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	if configFrom(r.Context()) == nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": "no configuration is loaded"})
		return
	}
	var rd Readiness
	if s.ready != nil {
		rd = s.ready(r.Context())
	}
	switch {
	case rd.NotReady != "":
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": rd.NotReady})
	case rd.Degraded != "":
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready", "degraded": rd.Degraded})
	default:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	}
}

// resolved is a request whose body is read and whose model maps to deployments.
type resolved struct {
	cfg    *config.Config
	body   []byte
	model  string
	deps   []config.Deployment // in the order to try
	target *upstream.Target
}

// resolve reads the body, checks that it is a JSON object naming a configured model, and orders
// that model's deployments.
func (s *server) resolve(w http.ResponseWriter, r *http.Request) (*resolved, error) {
	cfg := configFrom(r.Context())
	if cfg == nil {
		return nil, notReady()
	}
	body, err := readBody(w, r, s.bodyTimeout)
	if err != nil {
		return nil, err
	}
	// One scan bounds the depth and finds duplicate keys at any depth (see jsondepth.Scan): the
	// upstream must never be sent a body it could read otherwise than this proxy did.
	path, dup, deep := jsondepth.Scan(body, jsondepth.Max)
	if deep {
		return nil, apierror.BadRequest(fmt.Sprintf("The JSON body of your request nests deeper than %d levels of arrays and objects.", jsondepth.Max), "", "")
	}
	// The depth is bounded now, so gjson's recursive validator is safe.
	if !gjson.ValidBytes(body) || !gjson.ParseBytes(body).IsObject() {
		return nil, apierror.BadRequest("We could not parse the JSON body of your request. The API expects a JSON object.", "", "")
	}
	if dup {
		return nil, apierror.BadRequest("The JSON body of your request names '"+path+"' more than once.", path, "")
	}
	m := gjson.GetBytes(body, "model")
	switch {
	case m.Exists() && m.Type != gjson.Null && m.Type != gjson.String:
		return nil, apierror.InvalidType("model", "a string", m)
	case m.Str == "":
		return nil, apierror.BadRequest("you must provide a model parameter", "model", "")
	}
	deps := cfg.Deployments(m.Str)
	if len(deps) == 0 {
		return nil, apierror.BadRequest("The model '"+m.Str+"' does not exist or you do not have access to it.", "model", apierror.CodeModelNotFound)
	}
	deps = s.balancer.Order(deps)
	annotate(r.Context(), m.Str, deploymentName(deps[0]))
	return &resolved{cfg: cfg, body: body, model: m.Str, deps: deps, target: s.client.Target(deps)}, nil
}

// responses serves POST /v1/responses: the interceptor when it handles the request, pass-through
// otherwise. The interceptor reaches the model's upstream through the Responses seam: the target
// itself for deployments that speak the Responses API, upstream.ChatAPI for those that speak only
// Chat Completions, which have no /v1/responses to pass through to, so the interceptor serves
// every request for them. The model's first deployment (in balancing order) decides; failover
// goes only to deployments that take the same request (upstream.SameRequest).
func (s *server) responses(w http.ResponseWriter, r *http.Request) error {
	req, err := s.resolve(w, r)
	if err != nil {
		return err
	}
	deps := upstream.SameRequest(req.deps)
	target := s.client.Target(deps)
	chat := deps[0].API == config.APIChatCompletions
	prev := gjson.GetBytes(req.body, "previous_response_id").String()
	if s.interceptor == nil {
		if prev != "" {
			if err := s.checkPrevious(r.Context(), prev); err != nil {
				return err
			}
		}
		if chat {
			return apierror.BadRequest("The model '"+req.model+"' speaks only Chat Completions, and this server does not translate /v1/responses; use /v1/chat/completions.", "model", apierror.CodeUnsupportedModel)
		}
		return s.passResponses(w, r, target, req.body)
	}
	ir := &intercept.Request{
		Config:   req.cfg,
		Body:     req.body,
		Checked:  true, // by resolve
		Upstream: target,
		Provider: deps[0].Provider,
		// The entries of one model_name agree on it (config.Parse checks).
		InterceptedTools: deps[0].InterceptedTools,
		Caller:           Caller(r.Context()),
	}
	ir.Inline = func(n int64) (func(), error) { return s.inlined.Reserve(ir.Caller, n, inlineLimits(req.cfg)) }
	if chat {
		opts := upstream.ChatOptionsFor(deps[0])
		opts.MaxCodeSize = req.cfg.Interception.MaxCodeSize // the translation keeps no more of a call than is run
		ir.Upstream, ir.Stateless = upstream.NewChatAPI(target, opts), true
	}
	plan, perr := s.interceptor.Prepare(r.Context(), ir)
	if prev != "" && !plan.Minted {
		// An upstream's own id, sent upstream as it is: only its owner may continue it. A
		// response the interceptor minted is its own to check.
		if err := s.checkPrevious(r.Context(), prev); err != nil {
			return err
		}
	}
	if !plan.Intercepted {
		return s.passResponses(w, r, target, req.body)
	}
	if perr != nil {
		return perr
	}
	if forwarded, err := s.forwardResponses(w, r, req, plan); forwarded || err != nil {
		return err // the replica that hosts the container admits and serves it
	}
	done, err := s.inflight.admit(r.Context())
	if err != nil {
		return err
	}
	defer done()
	return quotaError(s.interceptor.Serve(w, r, plan))
}

// passResponses passes a POST /v1/responses through to target, a Responses upstream, streamed or
// not as the client asked, and records who owns the response it creates (owners.go). The
// upstream has never heard of the proxy's file ids, so the input parts that name the caller's
// Files API files carry those files instead (inputfiles.Inline), streamed from the store as the
// body is sent; every other id, and every other byte, goes as sent. A request that inlines counts
// in the in-flight quotas, as an intercepted one does, and its files' bytes in the inline budget
// (max_inline_bytes_in_flight, _per_key): 1 KB in may be 50 MB out.
func (s *server) passResponses(w http.ResponseWriter, r *http.Request, target *upstream.Target, body []byte) error {
	stored := gjson.GetBytes(body, "store").Type != gjson.False
	in, err := inputfiles.Inline(r.Context(), s.files, Caller(r.Context()), body)
	if err != nil {
		return err
	}
	if len(in.Streams) == 0 {
		s.passResponsesTo(w, r, target, upstream.Streamed{JSON: in.Body}, stored)
		return nil
	}
	done, err := s.inflight.admit(r.Context())
	if err != nil {
		return err
	}
	defer done()
	release, err := s.inlined.Reserve(Caller(r.Context()), in.Bytes, inlineLimits(configFrom(r.Context())))
	if err != nil {
		return err
	}
	defer release()
	sb := upstream.Streamed{JSON: in.Body, Holes: make([]upstream.Hole, len(in.Streams))}
	for i, st := range in.Streams {
		sb.Holes[i] = upstream.Hole(st)
	}
	s.passResponsesTo(w, r, target, sb, stored)
	return nil
}

// inlineLimits are cfg's bounds on the bytes of stored files inlined at once.
func inlineLimits(cfg *config.Config) inputfiles.Limits {
	return inputfiles.Limits{InFlight: cfg.General.MaxInlineBytesInFlight, PerOwner: cfg.General.MaxInlineBytesInFlightPerKey}
}

// modelPassthrough serves the endpoints that name a model in their body (chat completions,
// completions, embeddings): the body goes to the model's deployments unchanged but for "model".
func (s *server) modelPassthrough(w http.ResponseWriter, r *http.Request) error {
	req, err := s.resolve(w, r)
	if err != nil {
		return err
	}
	req.target.Proxy(w, r, req.body)
	return nil
}

// storedResponse serves GET and DELETE /v1/responses/{id}, inputItems GET
// /v1/responses/{id}/input_items, and cancelResponse POST /v1/responses/{id}/cancel: the
// interceptor answers for the ids it minted; every other id goes to byID.
func (s *server) storedResponse(w http.ResponseWriter, r *http.Request) error {
	return s.mintedOr(w, r, Interceptor.ServeStored)
}

func (s *server) inputItems(w http.ResponseWriter, r *http.Request) error {
	return s.mintedOr(w, r, Interceptor.ServeInputItems)
}

func (s *server) cancelResponse(w http.ResponseWriter, r *http.Request) error {
	return s.mintedOr(w, r, Interceptor.ServeCancel)
}

// mintedOr serves the request with the interceptor's method serve when the id in the path is one
// the interceptor minted, and passes it to byID otherwise.
func (s *server) mintedOr(w http.ResponseWriter, r *http.Request, serve func(Interceptor, http.ResponseWriter, *http.Request, string, string) error) error {
	if s.interceptor != nil {
		id := chi.URLParam(r, "id")
		minted, err := s.interceptor.Minted(r.Context(), id)
		if err != nil {
			return err
		}
		if minted {
			return serve(s.interceptor, w, r, id, Caller(r.Context()))
		}
	}
	return s.byID(w, r)
}

// byID serves the stored-response endpoints (GET and DELETE /v1/responses/{id}, its input_items
// and cancel) for an id the interceptor did not mint, to its owner only (owners.go). The request
// names no model, so it goes to the first deployment in model_list that can be called (see
// config.Deployment.Unusable): with several upstreams, stored responses are only reachable on
// that one.
func (s *server) byID(w http.ResponseWriter, r *http.Request) error {
	cfg := configFrom(r.Context())
	if cfg == nil {
		return notReady()
	}
	if id, ok := pathSegment(chi.URLParam(r, "id")); !ok {
		// The upstream path is built from the decoded, cleaned URL path: such an id would reach
		// another upstream endpoint (/v1/responses/%2e%2e%2ffiles is GET /v1/files) with the
		// deployment's key.
		return apierror.BadRequest(fmt.Sprintf("Invalid 'response_id': %q is not a response id.", id), "response_id", "")
	} else if owns, err := s.ownsUpstream(r.Context(), id); err != nil {
		return err
	} else if !owns {
		return responseNotFound(id)
	}
	if len(cfg.Models) == 0 {
		return apierror.NotFound("No response found with id '"+chi.URLParam(r, "id")+"': no upstream is configured in model_list.", "")
	}
	body, err := readBody(w, r, s.bodyTimeout)
	if err != nil {
		return err
	}
	dep := cfg.Models[0]
	for _, d := range cfg.Models {
		if d.Callable() {
			dep = d
			break
		}
	}
	annotate(r.Context(), "", deploymentName(dep))
	if dep.API == config.APIChatCompletions {
		// A Chat Completions upstream keeps no responses: only the ones this proxy minted exist.
		return apierror.NotFound("Response with id '"+chi.URLParam(r, "id")+"' not found.", "")
	}
	s.client.Target([]config.Deployment{dep}).Proxy(w, r, body)
	return nil
}

// modelObject is one entry of GET /v1/models.
type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// models serves GET /v1/models: one entry per distinct model_name that has a deployment the proxy
// can call, in file order. A model none of whose deployments can be called is not offered (a
// request naming it still gets the error that says why).
func (s *server) models(w http.ResponseWriter, r *http.Request) error {
	cfg := configFrom(r.Context())
	if cfg == nil {
		return notReady()
	}
	seen := make(map[string]bool, len(cfg.Models))
	data := make([]modelObject, 0, len(cfg.Models))
	for _, d := range cfg.Models {
		if seen[d.ModelName] || !d.Callable() {
			continue
		}
		seen[d.ModelName] = true
		data = append(data, s.modelObject(d))
	}
	writeJSON(w, http.StatusOK, struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{"list", data})
	return nil
}

// model serves GET /v1/models/{model}, where the model name may contain slashes.
func (s *server) model(w http.ResponseWriter, r *http.Request) error {
	cfg := configFrom(r.Context())
	if cfg == nil {
		return notReady()
	}
	name := chi.URLParam(r, "*")
	if u, err := url.PathUnescape(name); err == nil {
		name = u
	}
	for _, d := range cfg.Deployments(name) {
		if d.Callable() {
			writeJSON(w, http.StatusOK, s.modelObject(d))
			return nil
		}
	}
	return &apierror.Error{Status: http.StatusNotFound, Message: "The model '" + name + "' does not exist or you do not have access to it.", Type: apierror.TypeInvalidRequest, Param: "model", Code: apierror.CodeModelNotFound}
}

func (s *server) modelObject(d config.Deployment) modelObject {
	owner := d.Provider
	if owner == "" {
		owner = "openai"
	}
	// The file has no creation time; the router's start time is stable for the process.
	return modelObject{ID: d.ModelName, Object: "model", Created: s.started.Unix(), OwnedBy: owner}
}

// deploymentName identifies a deployment in logs without its key: provider/model and line.
func deploymentName(d config.Deployment) string {
	name := d.Provider + "/" + d.UpstreamModel
	if d.Line > 0 {
		name += "@line" + strconv.Itoa(d.Line)
	}
	return name
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only the router's own types are marshalled here; failing is a programming error.
		panic(err)
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// pathSegment decodes a path parameter as chi gives it (escaped when the URL held escapes) and
// reports whether it is one plain path segment: not empty, not a dot segment, no slash or
// backslash, no control character.
func pathSegment(param string) (string, bool) {
	id, err := url.PathUnescape(param)
	if err != nil || id == "" || id == "." || id == ".." {
		return id, false
	}
	for _, c := range id {
		if c == '/' || c == '\\' || c < 0x20 || c == 0x7f {
			return id, false
		}
	}
	return id, true
}
