package e2btest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

type ctxKeySandbox struct{}

func (s *Server) dataRoutes() {
	j := func(pattern string, fn func(w http.ResponseWriter, r *http.Request, body []byte)) {
		s.handle(s.jupyter, "49999 ", pattern, fn)
	}
	j("GET /health", func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		writeJSON(w, http.StatusOK, []byte(`"OK"`))
	})
	j("POST /execute", s.execute)
	j("POST /contexts", s.createContext)
	j("GET /contexts", s.listContexts)
	j("POST /contexts/{cid}/restart", s.restartContext)
	j("DELETE /contexts/{cid}", s.deleteContext)
	s.jupyter.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusNotFound, []byte(`{"detail":"Not Found"}`))
	})

	s.handle(s.envd, "49983 ", "GET /health", func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.WriteHeader(http.StatusNoContent)
	})
	s.fileRoutes()
	s.processRoutes()
	s.envd.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if s.envdAuthorized(w, r, r.Context().Value(ctxKeySandbox{}).(*emuSandbox)) {
			apiError(w, http.StatusNotFound, "not implemented by the emulator: "+r.URL.Path)
		}
	})
}

// proxyError writes the edge proxy's JSON error for a sandbox request.
func proxyError(w http.ResponseWriter, status int, id, msg string, port int) {
	var b []byte
	if port != 0 {
		b, _ = json.Marshal(struct {
			SandboxID string `json:"sandboxId"`
			Message   string `json:"message"`
			Port      int    `json:"port"`
			Code      int    `json:"code"`
		}{id, msg, port, status})
	} else {
		b, _ = json.Marshal(struct {
			SandboxID string `json:"sandboxId"`
			Message   string `json:"message"`
			Code      int    `json:"code"`
		}{id, msg, status})
	}
	writeJSON(w, status, b)
}

const msgSandboxNotFound = "The sandbox was not found"

// serveDataPlane does what e2b's edge proxy does before a request reaches a port inside a sandbox.
func (s *Server) serveDataPlane(w http.ResponseWriter, r *http.Request, id string, port int) {
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	live := ok && !sb.paused
	traffic := ""
	if ok {
		traffic = sb.trafficToken
	}
	s.mu.Unlock()
	if !live {
		proxyError(w, http.StatusBadGateway, id, msgSandboxNotFound, 0)
		return
	}
	if port != JupyterPort && port != EnvdPort {
		proxyError(w, http.StatusBadGateway, id, "The sandbox is running but port is not open", port)
		return
	}
	if port != EnvdPort && traffic != "" {
		switch got := r.Header.Get("E2b-Traffic-Access-Token"); {
		case got == "":
			proxyError(w, http.StatusForbidden, id, "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing", 0)
			return
		case got != traffic:
			proxyError(w, http.StatusForbidden, id, "Sandbox is secured with traffic access token. Provided token in header 'e2b-traffic-access-token' is invalid", 0)
			return
		}
	}
	r = r.WithContext(context.WithValue(r.Context(), ctxKeySandbox{}, sb))
	if port == JupyterPort {
		s.jupyter.ServeHTTP(w, r)
		return
	}
	s.envd.ServeHTTP(w, r)
}

// contextJSON is the code-interpreter server's Context.
type contextJSON struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// normalizeLanguage does what the server does with a context's language.
func normalizeLanguage(l string) string {
	l = strings.ToLower(strings.TrimSpace(l))
	switch l {
	case "", "default":
		return "python"
	case "js", "ts", "typescript":
		return "javascript"
	}
	return l
}

// startContext gives a Python context its exec sandbox if it has none.
func (s *Server) startContext(ctx context.Context, sb *emuSandbox, kc *kernelContext) (sandbox.Handle, error) {
	s.mu.Lock()
	if kc.handle != nil {
		h := *kc.handle
		s.mu.Unlock()
		return h, nil
	}
	s.mu.Unlock()
	h, err := s.exec.Create(ctx, sandbox.CreateOptions{Metadata: map[string]string{"e2b_sandbox": sb.id, "e2b_context": kc.id}})
	if err != nil {
		return sandbox.Handle{}, err
	}
	prepared := kc.isDflt && kc.language == "python"
	if prepared {
		if err := s.prepareKernel(ctx, h); err != nil {
			s.deleteExec([]sandbox.Handle{h})
			return sandbox.Handle{}, err
		}
	}
	s.mu.Lock()
	_, alive := s.sandboxes[sb.id]
	if alive && kc.handle == nil && s.hasContextLocked(sb, kc) {
		kc.handle = &h
		if prepared {
			kc.hidden++
		}
		s.mu.Unlock()
		return h, nil
	}
	var winner *sandbox.Handle
	if alive && kc.handle != nil {
		winner = kc.handle
	}
	s.mu.Unlock()
	s.deleteExec([]sandbox.Handle{h})
	if winner != nil {
		return *winner, nil
	}
	return sandbox.Handle{}, fmt.Errorf("context %s is gone", kc.id)
}

func (s *Server) hasContextLocked(sb *emuSandbox, kc *kernelContext) bool {
	for _, c := range sb.contexts {
		if c == kc {
			return true
		}
	}
	return false
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request, body []byte) {
	sb := r.Context().Value(ctxKeySandbox{}).(*emuSandbox)
	var req struct {
		Language *string `json:"language"`
		Cwd      *string `json:"cwd"`
	}
	if len(strings.TrimSpace(string(body))) > 0 {
		if err := json.Unmarshal(body, &req); err != nil {
			validationError(w, "body", err.Error())
			return
		}
	}
	kc := &kernelContext{id: newUUID(), language: "python", cwd: "/home/user", lock: make(chan struct{}, 1)}
	if req.Language != nil {
		kc.language = normalizeLanguage(*req.Language)
	}
	if req.Cwd != nil && *req.Cwd != "" {
		kc.cwd = *req.Cwd
	}
	s.mu.Lock()
	sb.contexts = append(sb.contexts, kc)
	s.mu.Unlock()
	if kc.language == "python" {
		if _, err := s.startContext(r.Context(), sb, kc); err != nil {
			writeText(w, http.StatusInternalServerError, "Failed to create context: "+err.Error())
			return
		}
	}
	b, _ := json.Marshal(contextJSON{kc.id, kc.language, kc.cwd})
	writeJSON(w, http.StatusOK, b)
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request, _ []byte) {
	sb := r.Context().Value(ctxKeySandbox{}).(*emuSandbox)
	s.mu.Lock()
	out := make([]contextJSON, 0, len(sb.contexts))
	for _, c := range sb.contexts {
		out = append(out, contextJSON{c.id, c.language, c.cwd})
	}
	s.mu.Unlock()
	b, _ := json.Marshal(out)
	writeJSON(w, http.StatusOK, b)
}

// findContext returns a sandbox's context by id. Called with Server.mu held.
func findContextLocked(sb *emuSandbox, id string) *kernelContext {
	for _, c := range sb.contexts {
		if c.id == id {
			return c
		}
	}
	return nil
}

// restartContext replaces the context's kernel by a fresh one (state lost, count reset).
func (s *Server) restartContext(w http.ResponseWriter, r *http.Request, _ []byte) {
	sb := r.Context().Value(ctxKeySandbox{}).(*emuSandbox)
	cid := r.PathValue("cid")
	s.mu.Lock()
	kc := findContextLocked(sb, cid)
	var old []sandbox.Handle
	if kc != nil && kc.handle != nil {
		old = append(old, *kc.handle)
		kc.handle = nil
		kc.envDone = false
		kc.hidden = 0
	}
	s.mu.Unlock()
	if kc == nil {
		writeText(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", cid))
		return
	}
	s.deleteExec(old)
	if kc.language == "python" {
		if _, err := s.startContext(r.Context(), sb, kc); err != nil {
			writeText(w, http.StatusInternalServerError, "Failed to restart context: "+err.Error())
			return
		}
	}
	writeJSON(w, http.StatusOK, []byte("null"))
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request, _ []byte) {
	sb := r.Context().Value(ctxKeySandbox{}).(*emuSandbox)
	cid := r.PathValue("cid")
	s.mu.Lock()
	var old []sandbox.Handle
	found := false
	for i, c := range sb.contexts {
		if c.id == cid {
			found = true
			if c.handle != nil {
				old = append(old, *c.handle)
				c.handle = nil
			}
			sb.contexts = append(sb.contexts[:i:i], sb.contexts[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	if !found {
		writeText(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", cid))
		return
	}
	s.deleteExec(old)
	writeJSON(w, http.StatusOK, []byte("null"))
}

// validationError writes FastAPI's 422 body.
func validationError(w http.ResponseWriter, field, msg string) {
	b, _ := json.Marshal(map[string]any{"detail": []map[string]any{{
		"type": "missing", "loc": []string{"body", field}, "msg": msg,
	}}})
	writeJSON(w, http.StatusUnprocessableEntity, b)
}

// envSnippet is Python that sets environment variables, prepended to a cell.
func envSnippet(vars map[string]string) string {
	if len(vars) == 0 {
		return ""
	}
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("import os as __e2b_os\n")
	for _, k := range keys {
		kj, _ := json.Marshal(k)
		vj, _ := json.Marshal(vars[k])
		fmt.Fprintf(&b, "__e2b_os.environ[%s] = %s\n", kj, vj)
	}
	b.WriteString("del __e2b_os\n")
	return b.String()
}

// execute serves POST /execute: the NDJSON stream of one execution.
func (s *Server) execute(w http.ResponseWriter, r *http.Request, body []byte) {
	sb := r.Context().Value(ctxKeySandbox{}).(*emuSandbox)
	var req struct {
		Code      *string           `json:"code"`
		ContextID *string           `json:"context_id"`
		Language  *string           `json:"language"`
		EnvVars   map[string]string `json:"env_vars"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		validationError(w, "body", "JSON decode error: "+err.Error())
		return
	}
	if req.Code == nil {
		validationError(w, "code", "Field required")
		return
	}
	if req.ContextID != nil && req.Language != nil {
		writeText(w, http.StatusBadRequest, "Only one of context_id or language can be provided")
		return
	}

	s.mu.Lock()
	var kc *kernelContext
	switch {
	case req.ContextID != nil:
		kc = findContextLocked(sb, *req.ContextID)
	default:
		lang := "python"
		if req.Language != nil {
			lang = normalizeLanguage(*req.Language)
		}
		for _, c := range sb.contexts {
			if c.isDflt && c.language == lang {
				kc = c
				break
			}
		}
		if kc == nil {
			kc = &kernelContext{id: newUUID(), language: lang, cwd: "/home/user", isDflt: true, lock: make(chan struct{}, 1)}
			sb.contexts = append(sb.contexts, kc)
		}
	}
	if kc == nil {
		s.mu.Unlock()
		writeText(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", *req.ContextID))
		return
	}
	if f := &s.execFail; f.n > 0 {
		f.n--
		status := f.status
		s.mu.Unlock()
		if status == http.StatusBadGateway {
			proxyError(w, status, sb.id, msgSandboxNotFound, 0)
		} else {
			writeText(w, status, http.StatusText(status))
		}
		return
	}
	var fault streamFault
	if s.streamFault.n > 0 {
		s.streamFault.n--
		fault = s.streamFault
	} else {
		fault.disabled = true
	}
	delay, interval := s.execDelay, s.keepalive
	s.executions++
	s.mu.Unlock()

	if kc.language != "python" {
		writeText(w, http.StatusInternalServerError, fmt.Sprintf("the e2b emulator executes python only, not %s", kc.language))
		return
	}
	h, err := s.startContext(r.Context(), sb, kc)
	if err != nil {
		writeText(w, http.StatusInternalServerError, "Failed to start the context: "+err.Error())
		return
	}

	// Starlette sends the headers before the generator runs; no Content-Type (media_type None).
	w.Header()["Content-Type"] = nil
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()

	st := &execStream{w: w, rc: rc, fault: fault}
	// Executions in one context wait for each other, as the server's per-context lock makes them.
	select {
	case kc.lock <- struct{}{}:
		defer func() { <-kc.lock }()
	case <-r.Context().Done():
		return
	}

	code := *req.Code
	s.mu.Lock()
	if !kc.envDone {
		kc.envDone = true
		code = envSnippet(sb.envVars) + envSnippet(req.EnvVars) + code
	} else {
		code = envSnippet(req.EnvVars) + code
	}
	s.mu.Unlock()
	s.stream(r.Context(), st, sb.id, kc, h, code, delay, interval)
}

// execStream writes the lines of one /execute response and applies a stream fault.
type execStream struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	fault streamFault
	n     int
}

// write sends one line; false means the stream must stop (client gone or cut by a fault).
func (st *execStream) write(line []byte) bool {
	if !st.fault.disabled && st.n == st.fault.after {
		if st.fault.midLine {
			_, _ = st.w.Write(line[:len(line)/2])
			_ = st.rc.Flush()
			// Drop the connection without ending the chunked body: the client sees a broken line.
			panic(http.ErrAbortHandler)
		}
		return false
	}
	if _, err := st.w.Write(line); err != nil {
		return false
	}
	st.n++
	return st.rc.Flush() == nil
}

// stream runs code through the exec sandbox and writes its messages in e2b's format, with a
// keepalive after every interval of silence, ending with end_of_execution. A client that goes away
// cancels the execution (the server interrupts the kernel).
func (s *Server) stream(ctx context.Context, st *execStream, sandboxID string, kc *kernelContext, h sandbox.Handle, code string, delay, interval time.Duration) {
	runCtx, cancel := context.WithCancel(ctx)
	lines := make(chan []byte)
	done := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-runCtx.Done():
				t.Stop()
				done <- runCtx.Err()
				return
			}
		}
		_, err := s.exec.Run(runCtx, h, code, sandbox.RunOptions{OnMessage: func(m sandbox.Message) {
			if m.Type == sandbox.MessageNumberOfExecutions {
				s.mu.Lock()
				m.ExecutionCount -= kc.hidden
				s.mu.Unlock()
			}
			line, ok, err := pyLine(m, s.Now())
			if !ok || err != nil {
				return
			}
			select {
			case lines <- line:
			case <-runCtx.Done():
			}
		}})
		done <- err
	}()
	defer func() {
		cancel()
		wg.Wait()
	}()

	if interval <= 0 {
		interval = defaultKeepalive
	}
	ka := time.NewTimer(interval)
	defer ka.Stop()
	reset := func() {
		ka.Stop()
		ka.Reset(interval)
	}
	for {
		select {
		case line := <-lines:
			if !st.write(line) {
				return
			}
			reset()
		case <-ka.C:
			if !st.write(keepaliveLine) {
				return
			}
			reset()
		case err := <-done:
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.mu.Lock()
				_, alive := s.sandboxes[sandboxID]
				s.mu.Unlock()
				if !alive {
					// The sandbox was killed under the execution: its connection dies with it.
					panic(http.ErrAbortHandler)
				}
				// The server reports a broken execution as an error, then ends normally.
				if !st.write(errorLine("UnexpectedEndOfExecution", "Connection to the execution was closed before the execution was finished")) {
					return
				}
			}
			st.write(endOfExecutionLine)
			return
		case <-ctx.Done():
			return
		}
	}
}
