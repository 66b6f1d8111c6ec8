package opensandboxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// routes mounts the lifecycle API at the root and under /v1, and execd's routes.
func (s *Server) routes() {
	s.mux = http.NewServeMux()
	for _, pre := range []string{"", "/v1"} {
		s.mux.HandleFunc("GET "+pre+"/health", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, map[string]string{"status": "healthy"})
		})
		s.lifecycle("POST "+pre+"/sandboxes", s.create)
		s.lifecycle("GET "+pre+"/sandboxes", s.list)
		s.lifecycle("GET "+pre+"/sandboxes/{id}", s.get)
		s.lifecycle("DELETE "+pre+"/sandboxes/{id}", s.delete)
		s.lifecycle("POST "+pre+"/sandboxes/{id}/renew-expiration", s.renew)
		s.lifecycle("GET "+pre+"/sandboxes/{id}/endpoints/{port}", s.endpoint)
		// The SDKs' create telemetry, posted after each create.
		s.lifecycle("POST "+pre+"/metrics/events", func(w http.ResponseWriter, r *http.Request, _ []byte) {
			w.WriteHeader(http.StatusNoContent)
		})
	}
	s.execdRoutes()
}

// lifecycle registers a route behind the API key check, recording its requests.
func (s *Server) lifecycle(pattern string, fn func(w http.ResponseWriter, r *http.Request, body []byte)) {
	route := pattern
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		body, err := readBody(r)
		if err != nil {
			serviceError(w, http.StatusBadRequest, "GENERAL::UNKNOWN_ERROR", err.Error())
			return
		}
		s.record(strings.Replace(route, " /v1/", " /", 1), r, body)
		switch key := r.Header.Get("OPEN-SANDBOX-API-KEY"); {
		case key == "":
			serviceError(w, http.StatusUnauthorized, "MISSING_API_KEY", "Authentication credentials are missing. Provide API key via OPEN-SANDBOX-API-KEY header.")
			return
		case key != s.apiKey:
			serviceError(w, http.StatusUnauthorized, "INVALID_API_KEY", "Authentication credentials are invalid. Check your API key and try again.")
			return
		}
		fn(w, r, body)
	})
}

// marshalSandbox writes b as a Sandbox (get, list) or, without image, a CreateSandboxResponse, in
// the server's key order with null fields left out.
func marshalSandbox(b *box, full bool) json.RawMessage {
	type status struct {
		State            string `json:"state"`
		Reason           string `json:"reason"`
		Message          string `json:"message"`
		LastTransitionAt string `json:"lastTransitionAt"`
	}
	type image struct {
		URI string `json:"uri"`
	}
	st := status{State: b.state, Reason: strings.ToUpper(b.state), Message: "Sandbox is " + strings.ToLower(b.state), LastTransitionAt: pyTime(b.created)}
	expires := ""
	if !b.expires.IsZero() {
		expires = pyTime(b.expires)
	}
	var out any
	if full {
		out = struct {
			ID         string            `json:"id"`
			Image      image             `json:"image"`
			Status     status            `json:"status"`
			Metadata   map[string]string `json:"metadata,omitempty"`
			ExpiresAt  string            `json:"expiresAt,omitempty"`
			CreatedAt  string            `json:"createdAt"`
			Entrypoint []string          `json:"entrypoint"`
		}{b.id, image{b.image}, st, b.metadata, expires, pyTime(b.created), b.entrypoint}
	} else {
		out = struct {
			ID         string            `json:"id"`
			Status     status            `json:"status"`
			Metadata   map[string]string `json:"metadata,omitempty"`
			ExpiresAt  string            `json:"expiresAt,omitempty"`
			CreatedAt  string            `json:"createdAt"`
			Entrypoint []string          `json:"entrypoint"`
		}{b.id, st, b.metadata, expires, pyTime(b.created), b.entrypoint}
	}
	raw, _ := json.Marshal(out)
	return raw
}

// create is POST /sandboxes: FastAPI's 422 for the body's shape, the service's 400 for labels,
// then a sandbox (its exec sandbox started) answered 202.
func (s *Server) create(w http.ResponseWriter, r *http.Request, body []byte) {
	if !gjson.ValidBytes(body) || !gjson.ParseBytes(body).IsObject() {
		validationError(w, "json_invalid", []any{"body", 0}, "JSON decode error", string(body))
		return
	}
	j := gjson.ParseBytes(body)
	hasImage, hasSnapshot := j.Get("image").Exists() && j.Get("image").Type != gjson.Null, j.Get("snapshotId").Exists()
	switch {
	case hasImage == hasSnapshot:
		validationError(w, "value_error", []any{"body"}, "Value error, Exactly one of image or snapshotId must be provided.", json.RawMessage(body))
		return
	case hasSnapshot:
		serviceError(w, http.StatusNotImplemented, "SANDBOX::API_NOT_SUPPORTED", "Snapshots are not supported by this server.")
		return
	case j.Get("image.uri").String() == "":
		validationError(w, "missing", []any{"body", "image", "uri"}, "Field required", json.RawMessage(j.Get("image").Raw))
		return
	case !j.Get("entrypoint").IsArray() || len(j.Get("entrypoint").Array()) == 0:
		validationError(w, "value_error", []any{"body"}, "Value error, Entrypoint is required when image is provided.", json.RawMessage(body))
		return
	case !j.Get("resourceLimits").IsObject() && !j.Get("extensions.poolRef").Exists():
		validationError(w, "value_error", []any{"body"}, "Value error, resourceLimits is required when poolRef is not provided.", json.RawMessage(body))
		return
	}
	timeout := j.Get("timeout")
	if timeout.Exists() && timeout.Type != gjson.Null {
		if timeout.Type != gjson.Number || timeout.Num != float64(int64(timeout.Num)) {
			validationError(w, "int_type", []any{"body", "timeout"}, "Input should be a valid integer", json.RawMessage(timeout.Raw))
			return
		}
		if timeout.Int() < 60 {
			writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": []any{map[string]any{
				"type": "greater_than_equal", "loc": []any{"body", "timeout"}, "msg": "Input should be greater than or equal to 60",
				"input": timeout.Int(), "ctx": map[string]any{"ge": 60}}}})
			return
		}
	}
	meta := map[string]string{}
	bad := ""
	j.Get("metadata").ForEach(func(k, v gjson.Result) bool {
		key, val := k.String(), v.String()
		name := key
		if i := strings.LastIndexByte(key, '/'); i >= 0 {
			name = key[i+1:]
		}
		if v.Type != gjson.String || len(name) > 63 || !labelRE.MatchString(name) || len(val) > 63 ||
			(val != "" && !labelRE.MatchString(val)) || strings.HasPrefix(key, "opensandbox.io/") {
			bad = key
			return false
		}
		meta[key] = val
		return true
	})
	if bad != "" {
		serviceError(w, http.StatusBadRequest, "SANDBOX::INVALID_METADATA_LABEL", fmt.Sprintf("Invalid metadata label %q: keys and values must be valid Kubernetes labels.", bad))
		return
	}
	s.mu.Lock()
	var fail int
	if len(s.failCreates) > 0 {
		fail, s.failCreates = s.failCreates[0], s.failCreates[1:]
	}
	delay, pending := s.createDelay, s.pending
	s.mu.Unlock()
	if fail != 0 {
		serviceError(w, fail, "KUBERNETES::API_ERROR", "Failed to create sandbox: the cluster refused the workload.")
		return
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	h, err := s.exec.Create(r.Context(), sandbox.CreateOptions{})
	if err != nil {
		serviceError(w, http.StatusInternalServerError, "KUBERNETES::API_ERROR", "Failed to create sandbox: "+err.Error())
		return
	}
	env := map[string]string{}
	j.Get("env").ForEach(func(k, v gjson.Result) bool {
		if v.Type == gjson.String {
			env[k.String()] = v.String()
		}
		return true
	})
	if err := s.prepareKernel(r.Context(), h, env); err != nil {
		s.deleteExec([]sandbox.Handle{h})
		serviceError(w, http.StatusInternalServerError, "KUBERNETES::POD_READY_TIMEOUT", "Sandbox did not become ready: "+err.Error())
		return
	}
	var ep []string
	for _, e := range j.Get("entrypoint").Array() {
		ep = append(ep, e.String())
	}
	s.mu.Lock()
	now := s.nowLocked()
	b := &box{id: newUUID(), token: j.Get("env.EXECD_ACCESS_TOKEN").String(), state: "Running", created: now,
		metadata: meta, image: j.Get("image.uri").String(), entrypoint: ep, exec: h, env: env,
		contexts: map[string]*kernelCtx{}, commands: map[string]*command{}}
	if p := j.Get("networkPolicy"); p.Exists() {
		b.policy = json.RawMessage(p.Raw)
	}
	if timeout.Exists() && timeout.Type != gjson.Null {
		b.expires = now.Add(time.Duration(timeout.Int()) * time.Second)
	}
	if pending > 0 {
		b.state, b.readyAt = "Pending", now.Add(pending)
	}
	s.sandboxes[b.id] = b
	s.creates++
	raw := marshalSandbox(b, false)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write(raw)
}

// notFound is the Kubernetes provider's 404 for an unknown sandbox.
func notFound(w http.ResponseWriter, id string) {
	serviceError(w, http.StatusNotFound, "KUBERNETES::SANDBOX_NOT_FOUND", fmt.Sprintf("Sandbox '%s' not found", id))
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, _ []byte) {
	id := r.PathValue("id")
	s.mu.Lock()
	b, ok := s.sandboxes[id]
	var raw json.RawMessage
	if ok {
		raw = marshalSandbox(b, true)
	}
	s.mu.Unlock()
	if !ok {
		notFound(w, id)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(raw)
}

// list is GET /sandboxes: state (repeated, OR), metadata (one "k=v&k2=v2" value, all must match),
// page and pageSize; newest first.
func (s *Server) list(w http.ResponseWriter, r *http.Request, _ []byte) {
	q := r.URL.Query()
	page, pageSize := 1, 20
	if v := q.Get("page"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			validationError(w, "greater_than_equal", []any{"query", "page"}, "Input should be greater than or equal to 1", v)
			return
		}
		page = n
	}
	if v := q.Get("pageSize"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 200 {
			validationError(w, "less_than_equal", []any{"query", "pageSize"}, "Input should be less than or equal to 200", v)
			return
		}
		pageSize = n
	}
	filter, ok := unescapeMetadata(q.Get("metadata"))
	if !ok {
		serviceError(w, http.StatusBadRequest, "SANDBOX::INVALID_METADATA_FORMAT", "Invalid metadata filter format: expected k=v pairs.")
		return
	}
	states := map[string]bool{}
	for _, st := range q["state"] {
		states[st] = true
	}
	s.mu.Lock()
	var match []*box
	for _, b := range s.sandboxes {
		if len(states) > 0 && !states[b.state] {
			continue
		}
		all := true
		for k, v := range filter {
			if b.metadata[k] != v {
				all = false
			}
		}
		if all {
			match = append(match, b)
		}
	}
	sort.Slice(match, func(i, j int) bool { return match[i].created.After(match[j].created) })
	total := len(match)
	from, to := min((page-1)*pageSize, total), min(page*pageSize, total)
	items := []json.RawMessage{}
	for _, b := range match[from:to] {
		items = append(items, marshalSandbox(b, true))
	}
	s.mu.Unlock()
	pages := (total + pageSize - 1) / pageSize
	writeJSON(w, http.StatusOK, map[string]any{"items": items, "pagination": map[string]any{
		"page": page, "pageSize": pageSize, "totalItems": total, "totalPages": pages, "hasNextPage": page < pages}})
}

// delete is DELETE /sandboxes/{id}: 204; the sandbox is gone for every later call.
func (s *Server) delete(w http.ResponseWriter, r *http.Request, _ []byte) {
	id := r.PathValue("id")
	s.mu.Lock()
	b, ok := s.sandboxes[id]
	if ok {
		delete(s.sandboxes, id)
		s.deletes++
	}
	s.mu.Unlock()
	if !ok {
		notFound(w, id)
		return
	}
	s.deleteExec(b.handles())
	w.WriteHeader(http.StatusNoContent)
}

// renew is POST /sandboxes/{id}/renew-expiration {"expiresAt"}: a time in the future (not checked
// against the current expiry, as the servers do not).
func (s *Server) renew(w http.ResponseWriter, r *http.Request, body []byte) {
	id := r.PathValue("id")
	at := gjson.GetBytes(body, "expiresAt")
	t, err := time.Parse(time.RFC3339Nano, at.String())
	if !at.Exists() || err != nil {
		validationError(w, "datetime_from_date_parsing", []any{"body", "expiresAt"}, "Input should be a valid datetime", at.String())
		return
	}
	s.mu.Lock()
	b, ok := s.sandboxes[id]
	now := s.nowLocked()
	switch {
	case !ok:
		s.mu.Unlock()
		notFound(w, id)
		return
	case b.expires.IsZero():
		s.mu.Unlock()
		serviceError(w, http.StatusConflict, "DOCKER::INVALID_EXPIRATION", fmt.Sprintf("Sandbox %s does not have automatic expiration enabled.", id))
		return
	case !t.After(now):
		s.mu.Unlock()
		serviceError(w, http.StatusBadRequest, "DOCKER::INVALID_EXPIRATION", "New expiration time must be in the future.")
		return
	}
	b.expires = t
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]string{"expiresAt": pyTime(t)})
}

// endpoint is GET /sandboxes/{id}/endpoints/{port}: the gateway's address (no scheme) and its
// routing header.
func (s *Server) endpoint(w http.ResponseWriter, r *http.Request, _ []byte) {
	id := r.PathValue("id")
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		serviceError(w, http.StatusBadRequest, "SANDBOX::INVALID_PARAMETER", "Invalid port.")
		return
	}
	s.mu.Lock()
	_, ok := s.sandboxes[id]
	s.mu.Unlock()
	if !ok {
		notFound(w, id)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"endpoint": strings.TrimPrefix(s.srv.URL, "http://"),
		"headers": map[string]string{IngressHeader: fmt.Sprintf("%s-%d", id, port)}})
}

// prepareKernel runs kernel.py in a new exec sandbox's kernel, as a hidden cell.
// env is the sandbox's environment (create's env), which execd and its kernels inherit.
func (s *Server) prepareKernel(ctx context.Context, h sandbox.Handle, env map[string]string) error {
	envJSON, _ := json.Marshal(env)
	lit, _ := json.Marshal(string(envJSON))
	code := "import builtins, json, os\nbuiltins._osb_hidden = True\nos.environ.update(json.loads(" + string(lit) + "))\n" + kernelPy
	res, err := s.exec.Run(ctx, h, code, sandbox.RunOptions{})
	if err == nil && res.Error != nil {
		err = fmt.Errorf("%s: %s", res.Error.Name, res.Error.Value)
	}
	if err != nil {
		return fmt.Errorf("preparing the kernel: %w", err)
	}
	return nil
}
