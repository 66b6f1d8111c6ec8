package daytonatest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// DefaultSnapshot is the organization's default snapshot.
const DefaultSnapshot = "daytonaio/sandbox:0.4.3"

// api serves the Daytona API below /api.
func (s *Server) api(w http.ResponseWriter, r *http.Request, path string) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if parts[0] == "workspace" { // the older alias
		parts[0] = "sandbox"
	}
	if parts[0] != "sandbox" {
		apiError(w, r, http.StatusNotFound, "Cannot "+r.Method+" "+r.URL.Path)
		return
	}
	switch {
	case len(parts) == 1 && r.Method == http.MethodPost:
		s.create(w, r)
	case len(parts) == 1 && r.Method == http.MethodGet:
		s.list(w, r)
	case len(parts) == 2 && parts[1] == "paginated":
		apiError(w, r, http.StatusNotImplemented, "not emulated")
	case len(parts) >= 2:
		sb := s.find(parts[1])
		if sb == nil {
			apiError(w, r, http.StatusNotFound, fmt.Sprintf("Sandbox with ID or name %s not found", parts[1]))
			return
		}
		s.sandboxOp(w, r, sb, parts[2:])
	default:
		apiError(w, r, http.StatusNotFound, "Cannot "+r.Method+" "+r.URL.Path)
	}
}

// find returns a live sandbox by id or name.
func (s *Server) find(idOrName string) *dtnSandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb, ok := s.sandboxes[idOrName]; ok {
		return sb
	}
	for _, sb := range s.sandboxes {
		if sb.name == idOrName {
			return sb
		}
	}
	return nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		apiError(w, r, http.StatusRequestEntityTooLarge, "request entity too large")
		return
	}
	if !gjson.ValidBytes(raw) || !gjson.ParseBytes(raw).IsObject() {
		apiError(w, r, http.StatusBadRequest, "Unexpected token in JSON at position 0")
		return
	}
	body := gjson.ParseBytes(raw)
	var msgs []string
	str := func(k string) string {
		v := body.Get(k)
		if v.Exists() && v.Type != gjson.String && v.Type != gjson.Null {
			msgs = append(msgs, k+" must be a string")
		}
		return v.String()
	}
	num := func(k string, def, minimum int) int {
		v := body.Get(k)
		if !v.Exists() || v.Type == gjson.Null {
			return def
		}
		if v.Type != gjson.Number || v.Num != float64(int(v.Num)) {
			msgs = append(msgs, k+" must be an integer number")
			return def
		}
		if int(v.Num) < minimum {
			msgs = append(msgs, fmt.Sprintf("%s must not be less than %d", k, minimum))
		}
		return int(v.Num)
	}
	flag := func(k string) bool {
		v := body.Get(k)
		if v.Exists() && v.Type != gjson.True && v.Type != gjson.False && v.Type != gjson.Null {
			msgs = append(msgs, k+" must be a boolean value")
		}
		return v.Bool()
	}
	sb := &dtnSandbox{id: uuid(), labels: map[string]string{}, contexts: map[string]*interp{}, sessions: map[string]*session{}}
	sb.name = str("name")
	sb.snapshot = str("snapshot")
	sb.target = str("target")
	sb.domains = str("domainAllowList")
	cidrs := str("networkAllowList")
	sb.blockAll = flag("networkBlockAll")
	flag("public")
	sb.cpu, sb.memory, sb.disk = num("cpu", 0, 1), num("memory", 0, 1), num("disk", 0, 1)
	gpu := num("gpu", 0, 0)
	sb.autoStop = num("autoStopInterval", 15, 0)
	num("autoArchiveInterval", 10080, 0)
	sb.autoDelete = num("autoDeleteInterval", -1, -1)
	if l := body.Get("labels"); l.Exists() && l.Type != gjson.Null {
		if !l.IsObject() {
			msgs = append(msgs, "labels must be an object")
		}
		l.ForEach(func(k, v gjson.Result) bool {
			if v.Type != gjson.String {
				msgs = append(msgs, "labels must be a record of strings")
				return false
			}
			sb.labels[k.String()] = v.String()
			return true
		})
	}
	build := body.Get("buildInfo")
	if build.Exists() && build.Get("dockerfileContent").Type != gjson.String {
		msgs = append(msgs, "buildInfo.dockerfileContent must be a string")
	}
	for _, c := range strings.Split(cidrs, ",") {
		if c = strings.TrimSpace(c); c != "" {
			if _, _, err := net.ParseCIDR(c); err != nil {
				msgs = append(msgs, "networkAllowList must be a comma-separated list of IPv4 CIDRs")
				break
			}
		}
	}
	if len(msgs) > 0 {
		apiError(w, r, http.StatusBadRequest, strings.Join(msgs, ", "))
		return
	}
	if !build.Exists() && (sb.cpu > 0 || sb.memory > 0 || sb.disk > 0 || gpu > 0) {
		apiError(w, r, http.StatusBadRequest, "Cannot specify Sandbox resources when using a snapshot")
		return
	}
	if build.Exists() && sb.snapshot != "" {
		apiError(w, r, http.StatusBadRequest, "Cannot specify a snapshot when using a build info entry")
		return
	}
	if sb.snapshot == "" && !build.Exists() {
		sb.snapshot = DefaultSnapshot
	}
	if sb.name == "" {
		sb.name = sb.id
	}
	s.mu.Lock()
	if s.createFault.n > 0 {
		s.createFault.n--
		status := s.createFault.status
		s.mu.Unlock()
		msg := "Total CPU quota exceeded. Maximum allowed: 10"
		if status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
			msg = "ThrottlerException: Too Many Requests"
		}
		apiError(w, r, status, msg)
		return
	}
	for _, o := range s.sandboxes {
		if o.name == sb.name {
			s.mu.Unlock()
			apiError(w, r, http.StatusConflict, fmt.Sprintf("Sandbox with name %s already exists", sb.name))
			return
		}
	}
	now := s.now()
	sb.createdAt, sb.lastActivity = now, now
	sb.state = StateCreating
	sb.startAt = time.Now().Add(s.startDelay)
	fail := s.startFail > 0
	if fail {
		s.startFail--
	}
	sb.ctx, sb.cancel = context.WithCancel(s.ctx)
	s.sandboxes[sb.id] = sb
	s.creates++
	s.lastCreate = append(json.RawMessage(nil), raw...)
	view := s.view(sb)
	s.mu.Unlock()
	s.wg.Add(1)
	go s.start(sb, fail)
	writeJSON(w, http.StatusOK, view)
}

// start brings a new sandbox up: its exec sandbox, with the interpreter's contexts ready.
func (s *Server) start(sb *dtnSandbox, fail bool) {
	defer s.wg.Done()
	setErr := func(reason string) {
		s.mu.Lock()
		if sb.state == StateCreating {
			sb.state, sb.errorReason = StateError, reason
		}
		s.mu.Unlock()
	}
	if fail {
		setErr("Failed to pull the snapshot: manifest unknown")
		return
	}
	h, err := s.exec.Create(sb.ctx, sandbox.CreateOptions{Metadata: map[string]string{"daytona_sandbox": sb.id}})
	if err != nil {
		setErr(err.Error())
		return
	}
	res, err := s.exec.Run(sb.ctx, h, workerPy, sandbox.RunOptions{})
	if err == nil && res.Error != nil {
		err = fmt.Errorf("%s: %s", res.Error.Name, res.Error.Value)
	}
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		_ = s.exec.Delete(ctx, h)
		cancel()
		setErr("the daemon did not start: " + err.Error())
		return
	}
	if d := time.Until(sb.startAt); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-sb.ctx.Done():
			t.Stop()
		}
	}
	s.mu.Lock()
	if sb.state != StateCreating {
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		_ = s.exec.Delete(ctx, h)
		cancel()
		return
	}
	sb.handle, sb.ready, sb.home = h, true, strings.TrimSpace(res.Stdout)
	sb.contexts["default"] = newInterp("default", sb.home)
	sb.state = StateStarted
	sb.lastActivity = s.now()
	s.mu.Unlock()
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	want := map[string]string{}
	if l := r.URL.Query().Get("labels"); l != "" {
		if err := json.Unmarshal([]byte(l), &want); err != nil {
			apiError(w, r, http.StatusBadRequest, "Invalid labels JSON")
			return
		}
	}
	s.mu.Lock()
	out := []map[string]any{}
	for _, sb := range s.sandboxes {
		match := true
		for k, v := range want {
			if sb.labels[k] != v {
				match = false
			}
		}
		if match {
			out = append(out, s.view(sb))
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// sandboxOp serves /sandbox/{id}/...
func (s *Server) sandboxOp(w http.ResponseWriter, r *http.Request, sb *dtnSandbox, rest []string) {
	minutesArg := func(minimum int) (int, bool) {
		if len(rest) != 2 {
			apiError(w, r, http.StatusNotFound, "Cannot "+r.Method+" "+r.URL.Path)
			return 0, false
		}
		n, err := strconv.Atoi(rest[1])
		if err != nil || n < minimum {
			apiError(w, r, http.StatusBadRequest, "Validation failed (numeric string is expected)")
			return 0, false
		}
		return n, true
	}
	op := ""
	if len(rest) > 0 {
		op = rest[0]
	}
	switch {
	case op == "" && r.Method == http.MethodGet:
	case op == "" && r.Method == http.MethodDelete:
		s.mu.Lock()
		s.deletes++
		sb.state = "destroying"
		view := s.view(sb)
		s.mu.Unlock()
		s.destroy(sb)
		writeJSON(w, http.StatusOK, view)
		return
	case op == "autostop" && r.Method == http.MethodPost:
		n, ok := minutesArg(0)
		if !ok {
			return
		}
		s.mu.Lock()
		sb.autoStop, sb.lastActivity = n, s.now()
		s.mu.Unlock()
	case op == "autodelete" && r.Method == http.MethodPost:
		n, ok := minutesArg(-1)
		if !ok {
			return
		}
		s.mu.Lock()
		sb.autoDelete = n
		s.mu.Unlock()
	case op == "last-activity" && r.Method == http.MethodPost:
		s.mu.Lock()
		sb.lastActivity = s.now()
		s.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		return
	case op == "toolbox-proxy-url" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]string{"url": s.ToolboxURL()})
		return
	case op == "stop" && r.Method == http.MethodPost:
		s.mu.Lock()
		if sb.state == StateStarted {
			sb.state = StateStopped
		}
		s.mu.Unlock()
		s.sweep()
	default:
		apiError(w, r, http.StatusNotFound, "Cannot "+r.Method+" "+r.URL.Path)
		return
	}
	s.mu.Lock()
	view := s.view(sb)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, view)
}
