package e2btest

import (
	"crypto/sha1"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Control-plane messages, as e2b's API sends them.
const (
	msgMissingKey   = "authorization header is missing"
	msgInvalidKey   = "Invalid API key, please visit https://e2b.dev/docs/api-key for more information."
	msgRateLimited  = "Rate limit exceeded"
	maxTimeoutHours = 24
)

// knownTemplates maps template aliases to their ids.
var knownTemplates = map[string]string{
	"code-interpreter-v1": "nlhz8vlwyupq845jsdg9",
	"base":                "rki5dems9wqfm4r03t7g",
}

func (s *Server) routes() {
	c := func(pattern string, fn func(w http.ResponseWriter, r *http.Request, body []byte)) {
		s.handle(s.control, "", pattern, fn)
	}
	c("POST /sandboxes", func(w http.ResponseWriter, r *http.Request, b []byte) { s.create(w, r, b, false) })
	c("POST /v2/sandboxes", func(w http.ResponseWriter, r *http.Request, b []byte) { s.create(w, r, b, true) })
	c("GET /sandboxes", s.listV1)
	c("GET /v2/sandboxes", s.listV2)
	c("GET /sandboxes/{id}", s.get)
	c("DELETE /sandboxes/{id}", s.kill)
	c("POST /sandboxes/{id}/timeout", s.setTimeout)
	c("POST /sandboxes/{id}/refreshes", s.refresh)
	c("POST /sandboxes/{id}/connect", func(w http.ResponseWriter, r *http.Request, b []byte) { s.connect(w, r, b, false) })
	c("POST /v2/sandboxes/{id}/connect", func(w http.ResponseWriter, r *http.Request, b []byte) { s.connect(w, r, b, true) })
	c("POST /sandboxes/{id}/pause", s.pause)
	c("POST /sandboxes/{id}/resume", s.resume)
	s.control.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		apiError(w, http.StatusNotFound, "Not Found")
	})
	s.dataRoutes()
}

// serveControl checks the API key, then serves a control-plane route.
func (s *Server) serveControl(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("X-API-Key")
	switch {
	case key == "":
		apiError(w, http.StatusUnauthorized, msgMissingKey)
	case !strings.HasPrefix(key, "e2b_") || key != s.apiKey:
		apiError(w, http.StatusUnauthorized, msgInvalidKey)
	default:
		s.control.ServeHTTP(w, r)
	}
}

// apiError writes e2b's error body {"code","message"}.
func apiError(w http.ResponseWriter, status int, msg string) {
	b, _ := json.Marshal(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
	writeJSON(w, status, b)
}

func notFound(w http.ResponseWriter, id string) {
	apiError(w, http.StatusNotFound, fmt.Sprintf("Sandbox %q doesn't exist or you don't have access to it", id))
}

// sandboxIDParam reads {id}, accepting the legacy "sandboxID-clientID" form.
func sandboxIDParam(r *http.Request) string {
	id := r.PathValue("id")
	if i := strings.IndexByte(id, '-'); i >= 0 {
		id = id[:i]
	}
	return id
}

type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int              `json:"timeout"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	AutoPause           *bool             `json:"autoPause"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Network             *networkConfig    `json:"network"`
}

// networkConfig is e2b's SandboxNetworkConfig: outbound allow and deny lists (IPs, CIDRs, and in
// allowOut domain names, "*." wildcards too), and whether the sandbox's ports are public.
type networkConfig struct {
	AllowPublicTraffic *bool    `json:"allowPublicTraffic,omitempty"`
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
}

// sandboxJSON is e2b's Sandbox object.
type sandboxJSON struct {
	TemplateID         string `json:"templateID"`
	SandboxID          string `json:"sandboxID"`
	Alias              string `json:"alias,omitempty"`
	ClientID           string `json:"clientID"`
	EnvdVersion        string `json:"envdVersion"`
	EnvdAccessToken    string `json:"envdAccessToken,omitempty"`
	TrafficAccessToken string `json:"trafficAccessToken,omitempty"`
	Domain             string `json:"domain,omitempty"`
}

func (sb *emuSandbox) sandboxJSON() []byte {
	b, _ := json.Marshal(sandboxJSON{
		TemplateID: sb.templateID, SandboxID: sb.id, Alias: sb.alias, ClientID: ClientID,
		EnvdVersion: sb.envdVersion, EnvdAccessToken: sb.accessToken, TrafficAccessToken: sb.trafficToken,
	})
	return b
}

// create serves POST /sandboxes (v1: timeout defaults to 15 s, secure is opt-in) and
// POST /v2/sandboxes (timeout defaults to 300 s, always secured).
func (s *Server) create(w http.ResponseWriter, r *http.Request, body []byte, v2 bool) {
	var req newSandbox
	if err := json.Unmarshal(body, &req); err != nil {
		apiError(w, http.StatusBadRequest, "Error when parsing request: "+err.Error())
		return
	}
	if req.TemplateID == "" {
		apiError(w, http.StatusBadRequest, `request body has an error: doesn't match schema: Error at "/templateID": property "templateID" is missing`)
		return
	}
	timeout := 15
	if v2 {
		timeout = 300
	}
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if timeout <= 0 {
		apiError(w, http.StatusBadRequest, "Timeout must be greater than 0")
		return
	}
	if timeout > maxTimeoutHours*3600 {
		apiError(w, http.StatusBadRequest, fmt.Sprintf("Timeout cannot be greater than %d hours", maxTimeoutHours))
		return
	}

	s.mu.Lock()
	if f := &s.createFault; f.n > 0 {
		f.n--
		status, retry := f.status, f.retryAfter
		s.mu.Unlock()
		switch status {
		case http.StatusTooManyRequests:
			if retry > 0 {
				w.Header().Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
			}
			apiError(w, status, msgRateLimited)
		case http.StatusUnauthorized:
			apiError(w, status, msgInvalidKey)
		case http.StatusInternalServerError:
			apiError(w, status, "Failed to create sandbox")
		default:
			apiError(w, status, http.StatusText(status))
		}
		return
	}
	if s.maxConcurrent > 0 && s.runningLocked() >= s.maxConcurrent {
		n := s.maxConcurrent
		s.mu.Unlock()
		apiError(w, http.StatusTooManyRequests, fmt.Sprintf("you have reached the maximum number of concurrent E2B sandboxes (%d). If you need more, please visit 'https://e2b.dev/docs/billing'", n))
		return
	}
	traffic, envd, lazy := s.trafficTokens, s.envdVersion, s.lazyKernels
	s.mu.Unlock()

	name := req.TemplateID
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	name, _, _ = strings.Cut(name, ":")
	sb := &emuSandbox{id: newSandboxID(), envdVersion: envd, alias: name, allowInternet: true,
		metadata: copyMap(req.Metadata), envVars: copyMap(req.EnvVars)}
	if id, ok := knownTemplates[name]; ok {
		sb.templateID = id
	} else {
		// An unknown template still starts, under a stable made-up id.
		sum := sha1.Sum([]byte(name))
		sb.templateID = strings.ToLower(base32ish(sum[:]))
	}
	if v2 || (req.Secure != nil && *req.Secure) {
		sb.accessToken = randomHex(24)
	}
	if req.AllowInternetAccess != nil {
		sb.allowInternet = *req.AllowInternetAccess
	}
	if req.Network != nil {
		n := *req.Network
		sb.network = &n
	}
	if req.AutoPause != nil {
		sb.autoPause = *req.AutoPause
	}
	if traffic || (req.Network != nil && req.Network.AllowPublicTraffic != nil && !*req.Network.AllowPublicTraffic) {
		sb.trafficToken = randomHex(24)
	}

	var handle *sandbox.Handle
	if !lazy {
		h, err := s.exec.Create(r.Context(), sandbox.CreateOptions{Metadata: map[string]string{"e2b_sandbox": sb.id}})
		if err == nil {
			if err = s.prepareKernel(r.Context(), h); err != nil {
				s.deleteExec([]sandbox.Handle{h})
			}
		}
		if err != nil {
			b, _ := json.Marshal(struct {
				Code      int    `json:"code"`
				Message   string `json:"message"`
				ErrorCode string `json:"error_code"`
			}{500, "Failed to create sandbox: " + err.Error(), "sandbox_create_failed"})
			writeJSON(w, http.StatusInternalServerError, b)
			return
		}
		handle = &h
	}
	hidden := 0
	if handle != nil {
		hidden = 1 // prepareKernel
	}
	sb.contexts = []*kernelContext{
		{id: newUUID(), language: "python", cwd: "/home/user", isDflt: true, handle: handle, hidden: hidden, lock: make(chan struct{}, 1)},
		{id: newUUID(), language: "javascript", cwd: "/home/user", isDflt: true, lock: make(chan struct{}, 1)},
	}

	s.mu.Lock()
	now := s.nowLocked()
	sb.startedAt = now
	sb.endAt = now.Add(time.Duration(timeout) * time.Second)
	s.sandboxes[sb.id] = sb
	s.creates++
	resp := sb.sandboxJSON()
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, resp)
}

func (s *Server) runningLocked() int {
	n := 0
	for _, sb := range s.sandboxes {
		if !sb.paused {
			n++
		}
	}
	return n
}

// base32ish renders b in [a-z0-9], 20 characters, like e2b's template ids.
func base32ish(b []byte) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	out := make([]byte, 20)
	for i := range out {
		out[i] = alphabet[int(b[i%len(b)])%len(alphabet)]
	}
	return string(out)
}

// kill serves DELETE /sandboxes/{id}.
func (s *Server) kill(w http.ResponseWriter, r *http.Request, _ []byte) {
	id := sandboxIDParam(r)
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	if !ok {
		s.mu.Unlock()
		notFound(w, id)
		return
	}
	handles := sb.handles()
	delete(s.sandboxes, id)
	s.deletes++
	s.mu.Unlock()
	s.deleteExec(handles)
	w.WriteHeader(http.StatusNoContent)
}

// listedSandbox is e2b's ListedSandbox; sandboxDetail adds the fields of SandboxDetail.
type listedSandbox struct {
	TemplateID          string            `json:"templateID"`
	Alias               string            `json:"alias,omitempty"`
	SandboxID           string            `json:"sandboxID"`
	ClientID            string            `json:"clientID"`
	StartedAt           string            `json:"startedAt"`
	EndAt               string            `json:"endAt"`
	CPUCount            int               `json:"cpuCount"`
	MemoryMB            int               `json:"memoryMB"`
	DiskSizeMB          int               `json:"diskSizeMB"`
	Metadata            map[string]string `json:"metadata,omitempty"`
	State               string            `json:"state"`
	EnvdVersion         string            `json:"envdVersion"`
	AllowInternetAccess *bool             `json:"allowInternetAccess,omitempty"`
}

type sandboxDetail struct {
	listedSandbox
	EnvdAccessToken string         `json:"envdAccessToken,omitempty"`
	Network         *networkConfig `json:"network,omitempty"`
}

func (sb *emuSandbox) listed() listedSandbox {
	state := "running"
	if sb.paused {
		state = "paused"
	}
	allow := sb.allowInternet
	return listedSandbox{
		TemplateID: sb.templateID, Alias: sb.alias, SandboxID: sb.id, ClientID: ClientID,
		StartedAt: sb.startedAt.UTC().Format(time.RFC3339Nano), EndAt: sb.endAt.UTC().Format(time.RFC3339Nano),
		CPUCount: 2, MemoryMB: 2048, DiskSizeMB: 10240, Metadata: copyMap(sb.metadata), State: state,
		EnvdVersion: sb.envdVersion, AllowInternetAccess: &allow,
	}
}

// get serves GET /sandboxes/{id} (SandboxDetail; older SDKs read envdAccessToken from it).
func (s *Server) get(w http.ResponseWriter, r *http.Request, _ []byte) {
	id := sandboxIDParam(r)
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	var b []byte
	if ok {
		b, _ = json.Marshal(sandboxDetail{listedSandbox: sb.listed(), EnvdAccessToken: sb.accessToken, Network: sb.network})
	}
	s.mu.Unlock()
	if !ok {
		notFound(w, id)
		return
	}
	writeJSON(w, http.StatusOK, b)
}

// readSeconds reads an integer field of a JSON body; present reports whether it was there.
func readSeconds(body []byte, field string) (n int, present bool, err error) {
	var m map[string]json.RawMessage
	if len(strings.TrimSpace(string(body))) == 0 {
		return 0, false, nil
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return 0, false, err
	}
	raw, ok := m[field]
	if !ok || string(raw) == "null" {
		return 0, false, nil
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, true, fmt.Errorf("field %q: %w", field, err)
	}
	return n, true, nil
}

// setTimeout serves POST /sandboxes/{id}/timeout: the end time becomes now+timeout, shorter or
// longer; a negative timeout counts as 0.
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, body []byte) {
	id := sandboxIDParam(r)
	t, present, err := readSeconds(body, "timeout")
	if err != nil || !present {
		apiError(w, http.StatusBadRequest, `request body has an error: doesn't match schema: Error at "/timeout": property "timeout" is missing`)
		return
	}
	if t > maxTimeoutHours*3600 {
		apiError(w, http.StatusBadRequest, fmt.Sprintf("Timeout cannot be greater than %d hours", maxTimeoutHours))
		return
	}
	t = max(t, 0)
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	if ok {
		sb.endAt = s.nowLocked().Add(time.Duration(t) * time.Second)
	}
	s.mu.Unlock()
	if !ok {
		notFound(w, id)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refresh serves POST /sandboxes/{id}/refreshes: extends (never shortens) by duration (0..3600,
// default 15 s).
func (s *Server) refresh(w http.ResponseWriter, r *http.Request, body []byte) {
	id := sandboxIDParam(r)
	d, present, err := readSeconds(body, "duration")
	if err != nil {
		apiError(w, http.StatusBadRequest, "Error when parsing request: "+err.Error())
		return
	}
	if !present {
		d = 15
	}
	if d < 0 || d > 3600 {
		apiError(w, http.StatusBadRequest, "Duration must be between 0 and 3600 seconds")
		return
	}
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	if ok {
		if end := s.nowLocked().Add(time.Duration(d) * time.Second); end.After(sb.endAt) {
			sb.endAt = end
		}
	}
	s.mu.Unlock()
	if !ok {
		notFound(w, id)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connect serves POST /sandboxes/{id}/connect and its v2 twin: 200 with the Sandbox when running
// (the end time only grows), 201 when a paused sandbox was resumed. v1 requires timeout; v2 makes
// it optional (300 s, the v2 default).
func (s *Server) connect(w http.ResponseWriter, r *http.Request, body []byte, v2 bool) {
	id := sandboxIDParam(r)
	t, present, err := readSeconds(body, "timeout")
	if v2 && err == nil && !present {
		t, present = 300, true
	}
	if err != nil || !present {
		apiError(w, http.StatusBadRequest, `request body has an error: doesn't match schema: Error at "/timeout": property "timeout" is missing`)
		return
	}
	if t < 0 {
		apiError(w, http.StatusBadRequest, "Timeout must be greater than or equal to 0")
		return
	}
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	status := http.StatusOK
	var resp []byte
	if ok {
		end := s.nowLocked().Add(time.Duration(t) * time.Second)
		if sb.paused {
			sb.paused = false
			sb.endAt = end
			status = http.StatusCreated
		} else if end.After(sb.endAt) {
			sb.endAt = end
		}
		resp = sb.sandboxJSON()
	}
	s.mu.Unlock()
	if !ok {
		notFound(w, id)
		return
	}
	writeJSON(w, status, resp)
}

// pause serves POST /sandboxes/{id}/pause. The exec sandbox stays up, which keeps the kernel's
// state as e2b's memory snapshot does.
func (s *Server) pause(w http.ResponseWriter, r *http.Request, _ []byte) {
	id := sandboxIDParam(r)
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	already := ok && sb.paused
	if ok {
		sb.paused = true
	}
	s.mu.Unlock()
	switch {
	case !ok:
		notFound(w, id)
	case already:
		apiError(w, http.StatusConflict, fmt.Sprintf("Sandbox %q is already paused", id))
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// resume serves the deprecated POST /sandboxes/{id}/resume.
func (s *Server) resume(w http.ResponseWriter, r *http.Request, body []byte) {
	id := sandboxIDParam(r)
	t, present, err := readSeconds(body, "timeout")
	if err != nil {
		apiError(w, http.StatusBadRequest, "Error when parsing request: "+err.Error())
		return
	}
	if !present {
		t = 15
	}
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	wasPaused := ok && sb.paused
	var resp []byte
	if wasPaused {
		sb.paused = false
		sb.endAt = s.nowLocked().Add(time.Duration(t) * time.Second)
		resp = sb.sandboxJSON()
	}
	s.mu.Unlock()
	switch {
	case !ok:
		notFound(w, id)
	case !wasPaused:
		apiError(w, http.StatusConflict, fmt.Sprintf("Sandbox %q is already running", id))
	default:
		writeJSON(w, http.StatusCreated, resp)
	}
}

// matchMetadata reports whether every k=v of filter is in meta.
func matchMetadata(meta map[string]string, filter url.Values) bool {
	for k, vs := range filter {
		for _, v := range vs {
			if meta[k] != v {
				return false
			}
		}
	}
	return true
}

// parseMetadataFilter reads the metadata query parameter: a URL-encoded "k=v&k2=v2".
func parseMetadataFilter(q url.Values) (url.Values, error) {
	raw := q.Get("metadata")
	if raw == "" {
		return nil, nil
	}
	return url.ParseQuery(raw)
}

// listV1 serves the deprecated GET /sandboxes: running sandboxes only.
func (s *Server) listV1(w http.ResponseWriter, r *http.Request, _ []byte) {
	filter, err := parseMetadataFilter(r.URL.Query())
	if err != nil {
		apiError(w, http.StatusBadRequest, "Error when parsing metadata: "+err.Error())
		return
	}
	s.mu.Lock()
	out := []listedSandbox{}
	for _, sb := range s.sortedLocked(false) {
		if !sb.paused && matchMetadata(sb.metadata, filter) {
			out = append(out, sb.listed())
		}
	}
	s.mu.Unlock()
	b, _ := json.Marshal(out)
	writeJSON(w, http.StatusOK, b)
}

// listV2 serves GET /v2/sandboxes with state, metadata, order, limit and nextToken, paging with
// the X-Next-Token header.
func (s *Server) listV2(w http.ResponseWriter, r *http.Request, _ []byte) {
	q := r.URL.Query()
	filter, err := parseMetadataFilter(q)
	if err != nil {
		apiError(w, http.StatusBadRequest, "Error when parsing metadata: "+err.Error())
		return
	}
	states := map[string]bool{"running": true, "paused": true}
	if st := q.Get("state"); st != "" {
		states = map[string]bool{}
		for _, v := range strings.Split(st, ",") {
			v = strings.TrimSpace(v)
			if v != "running" && v != "paused" {
				apiError(w, http.StatusBadRequest, fmt.Sprintf("invalid state %q", v))
				return
			}
			states[v] = true
		}
	}
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 100 {
			apiError(w, http.StatusBadRequest, "limit must be between 1 and 100")
			return
		}
		limit = n
	}
	offset := 0
	if tok := q.Get("nextToken"); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		n, err2 := strconv.Atoi(string(b))
		if err != nil || err2 != nil || n < 0 {
			apiError(w, http.StatusBadRequest, "Invalid next token")
			return
		}
		offset = n
	}
	asc := q.Get("order") == "asc"

	s.mu.Lock()
	var all []listedSandbox
	running := 0
	for _, sb := range s.sortedLocked(asc) {
		if !sb.paused {
			running++
		}
		l := sb.listed()
		if states[l.State] && matchMetadata(sb.metadata, filter) {
			all = append(all, l)
		}
	}
	s.mu.Unlock()

	page := []listedSandbox{}
	if offset < len(all) {
		page = all[offset:min(len(all), offset+limit)]
	}
	if offset+limit < len(all) {
		w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(strconv.Itoa(offset+limit))))
	}
	w.Header().Set("X-Total-Running", strconv.Itoa(running))
	b, _ := json.Marshal(page)
	writeJSON(w, http.StatusOK, b)
}

// sortedLocked lists sandboxes by start time (newest first unless asc), then id.
func (s *Server) sortedLocked(asc bool) []*emuSandbox {
	out := make([]*emuSandbox, 0, len(s.sandboxes))
	for _, sb := range s.sandboxes {
		out = append(out, sb)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if !a.startedAt.Equal(b.startedAt) {
			if asc {
				return a.startedAt.Before(b.startedAt)
			}
			return a.startedAt.After(b.startedAt)
		}
		return a.id < b.id
	})
	return out
}
