package daytonatest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// interp is one interpreter context: a worker with its globals, running one execution at a time.
type interp struct {
	id        string
	cwd       string
	createdAt time.Time
	lock      chan struct{}
	ctx       context.Context
	cancel    context.CancelFunc
}

func newInterp(id, cwd string) *interp {
	return &interp{id: id, cwd: cwd, createdAt: time.Now(), lock: make(chan struct{}, 1)}
}

// toolbox serves the toolbox proxy: /toolbox/{sandboxId}/...
func (s *Server) toolbox(w http.ResponseWriter, r *http.Request, rest string) {
	id, sub, _ := strings.Cut(rest, "/")
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	running := ok && sb.state == StateStarted && sb.ready
	if running {
		sb.lastActivity = s.now()
	}
	s.mu.Unlock()
	switch {
	case !ok:
		apiError(w, r, http.StatusNotFound, "Sandbox not found")
		return
	case !running:
		apiError(w, r, http.StatusBadRequest, "Sandbox is not running")
		return
	}
	sub = "/" + sub
	switch {
	case sub == "/process/interpreter/context":
		s.contextsOp(w, r, sb)
	case strings.HasPrefix(sub, "/process/interpreter/context/") && r.Method == http.MethodDelete:
		s.deleteContext(w, r, sb, strings.TrimPrefix(sub, "/process/interpreter/context/"))
	case sub == "/process/interpreter/execute":
		s.execute(w, r, sb)
	case sub == "/process/execute" && r.Method == http.MethodPost:
		s.processExecute(w, r, sb)
	case strings.HasPrefix(sub, "/process/session"):
		s.sessionOp(w, r, sb, strings.TrimPrefix(sub, "/process/session"))
	case strings.HasPrefix(sub, "/files"):
		s.files(w, r, sb, strings.TrimPrefix(sub, "/files"))
	default:
		daemonError(w, r, http.StatusNotFound, "404 page not found")
	}
}

func (s *Server) contextsOp(w http.ResponseWriter, r *http.Request, sb *dtnSandbox) {
	switch r.Method {
	case http.MethodPost:
		raw, _ := io.ReadAll(r.Body)
		if len(bytes.TrimSpace(raw)) > 0 && !gjson.ValidBytes(raw) {
			daemonError(w, r, http.StatusBadRequest, "invalid request body")
			return
		}
		body := gjson.ParseBytes(raw)
		if lang := body.Get("language").String(); lang != "" && lang != "python" {
			daemonError(w, r, http.StatusBadRequest, "unsupported language: "+lang)
			return
		}
		cwd := body.Get("cwd").String()
		s.mu.Lock()
		if cwd == "" {
			cwd = sb.home
		}
		ic := newInterp(uuid(), cwd)
		ic.ctx, ic.cancel = context.WithCancel(sb.ctx)
		sb.contexts[ic.id] = ic
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, contextView(ic))
	case http.MethodGet:
		s.mu.Lock()
		out := []map[string]any{}
		for _, ic := range sb.contexts {
			if ic.id != "default" {
				out = append(out, contextView(ic))
			}
		}
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"contexts": out})
	default:
		daemonError(w, r, http.StatusNotFound, "404 page not found")
	}
}

func contextView(ic *interp) map[string]any {
	return map[string]any{"id": ic.id, "cwd": ic.cwd, "createdAt": ic.createdAt.UTC().Format(time.RFC3339Nano), "active": true, "language": "python"}
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request, sb *dtnSandbox, id string) {
	if id == "default" {
		daemonError(w, r, http.StatusBadRequest, "cannot delete default context")
		return
	}
	s.mu.Lock()
	ic, ok := sb.contexts[id]
	delete(sb.contexts, id)
	h := sb.handle
	s.mu.Unlock()
	if !ok {
		daemonError(w, r, http.StatusNotFound, "context not found: "+id)
		return
	}
	ic.cancel() // kills the worker: its run ends, its state is gone
	idLit, _ := json.Marshal(id)
	ctx, cancel := context.WithTimeout(s.ctx, cleanupTimeout)
	defer cancel()
	_, _ = s.exec.Run(ctx, h, "__dtn_drop("+string(idLit)+")", sandbox.RunOptions{})
	writeJSON(w, http.StatusOK, map[string]string{"message": "Context deleted successfully"})
}

// execute is the interpreter's WebSocket: one request message, then the run's messages, a control
// message and a close frame. The run belongs to its context, not to the connection: closing the
// WebSocket does not stop it.
func (s *Server) execute(w http.ResponseWriter, r *http.Request, sb *dtnSandbox) {
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxBody)
	rctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	_, data, err := conn.Read(rctx)
	cancel()
	if err != nil {
		return
	}
	if !gjson.ValidBytes(data) || !gjson.ParseBytes(data).IsObject() {
		_ = conn.Close(websocket.StatusProtocolError, "invalid JSON payload")
		return
	}
	req := gjson.ParseBytes(data)
	code := req.Get("code").String()
	if code == "" {
		_ = conn.Close(websocket.StatusPolicyViolation, "code is required")
		return
	}
	cid := req.Get("contextId").String()
	if cid == "" {
		cid = "default"
	}
	timeout := 600 * time.Second
	if t := req.Get("timeout"); t.Exists() {
		timeout = time.Duration(t.Int()) * time.Second
	}
	envs := map[string]string{}
	req.Get("envs").ForEach(func(k, v gjson.Result) bool { envs[k.String()] = v.String(); return true })
	s.mu.Lock()
	ic, ok := sb.contexts[cid]
	if ok && ic.ctx == nil { // the default context lives as long as the sandbox
		ic.ctx, ic.cancel = context.WithCancel(sb.ctx)
	}
	h := sb.handle
	cut := -1
	if s.cutAfter.n > 0 {
		s.cutAfter.n--
		cut = s.cutAfter.after
	}
	s.mu.Unlock()
	if !ok {
		_ = conn.Close(websocket.StatusPolicyViolation, "context not found: "+cid)
		return
	}
	select {
	case ic.lock <- struct{}{}:
	case <-ic.ctx.Done():
		_ = conn.Close(websocket.StatusPolicyViolation, "context is not active")
		return
	}
	defer func() { <-ic.lock }()
	s.mu.Lock()
	s.executions++
	s.mu.Unlock()

	sent := 0
	dead := false
	send := func(m map[string]string) {
		if dead {
			return
		}
		if cut >= 0 && sent >= cut {
			dead = true
			conn.CloseNow() // the connection is lost mid-run
			return
		}
		for _, k := range []string{"type", "text", "name", "value", "traceback"} {
			if _, ok := m[k]; !ok {
				m[k] = ""
			}
		}
		b, _ := json.Marshal(m)
		wctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
		defer cancel()
		if conn.Write(wctx, websocket.MessageText, b) != nil {
			dead = true
		}
		sent++
	}
	runCtx, cancelRun := ic.ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		runCtx, cancelRun = context.WithTimeout(ic.ctx, timeout)
	}
	defer cancelRun()
	envsJSON, _ := json.Marshal(envs)
	args, _ := json.Marshal([]string{ic.id, ic.cwd, base64.StdEncoding.EncodeToString([]byte(code)), string(envsJSON)})
	cell := "__dtn_run(*" + string(args) + ")"
	res, err := s.exec.Run(runCtx, h, cell, sandbox.RunOptions{OnMessage: func(m sandbox.Message) {
		if m.Type == sandbox.MessageStdout || m.Type == sandbox.MessageStderr {
			for _, piece := range pieces(m.Text) {
				send(map[string]string{"type": m.Type, "text": piece})
			}
		}
	}})
	switch {
	case timeout > 0 && errors.Is(runCtx.Err(), context.DeadlineExceeded) && ic.ctx.Err() == nil:
		send(map[string]string{"type": "control", "text": "interrupted"})
		if !dead {
			_ = conn.Close(4008, "execution timeout")
		}
		return
	case ic.ctx.Err() != nil || err != nil:
		if !dead {
			_ = conn.Close(websocket.StatusInternalError, "worker exited")
		}
		return
	}
	if e := res.Error; e != nil {
		if e.Name == "DtnFailure" && gjson.Valid(e.Value) {
			v := gjson.Parse(e.Value)
			send(map[string]string{"type": "error", "name": v.Get("name").String(), "value": v.Get("value").String(), "traceback": v.Get("traceback").String()})
		} else {
			send(map[string]string{"type": "error", "name": e.Name, "value": e.Value, "traceback": e.Traceback})
		}
	}
	send(map[string]string{"type": "control", "text": "completed"})
	if !dead {
		_ = conn.Close(websocket.StatusNormalClosure, "")
	}
}

// pieces cuts output as the worker flushes it: at each newline, and every 1 KiB.
func pieces(s string) []string {
	var out []string
	for s != "" {
		n := strings.IndexByte(s, '\n') + 1
		if n == 0 || n > 1024 {
			n = min(len(s), 1024)
		}
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}

// shellRun runs command in the sandbox's shell and returns its exit code and merged output.
func (s *Server) shellRun(ctx context.Context, sb *dtnSandbox, command string, timeout time.Duration) (sandbox.ExecResult, string, error) {
	if s.shell == nil {
		return sandbox.ExecResult{}, "", errors.New("the exec provider has no shell")
	}
	var out strings.Builder
	res, err := s.shell.Exec(ctx, sb.handle, command, sandbox.ExecOptions{Timeout: timeout, OnOutput: func(_ sandbox.Stream, t string) { out.WriteString(t) }})
	return res, out.String(), err
}

func (s *Server) processExecute(w http.ResponseWriter, r *http.Request, sb *dtnSandbox) {
	raw, _ := io.ReadAll(r.Body)
	if !gjson.ValidBytes(raw) {
		daemonError(w, r, http.StatusBadRequest, "invalid request body")
		return
	}
	body := gjson.ParseBytes(raw)
	command := body.Get("command").String()
	if command == "" {
		daemonError(w, r, http.StatusBadRequest, "command is required")
		return
	}
	if cwd := body.Get("cwd").String(); cwd != "" {
		command = "cd " + shq(cwd) + " && " + command
	}
	timeout := time.Duration(body.Get("timeout").Int()) * time.Second
	if timeout <= 0 {
		timeout = time.Hour
	}
	res, out, err := s.shellRun(r.Context(), sb, command, timeout)
	switch {
	case err != nil:
		daemonError(w, r, http.StatusInternalServerError, err.Error())
	case res.TimedOut:
		daemonError(w, r, http.StatusRequestTimeout, "command execution timeout")
	default:
		writeJSON(w, http.StatusOK, map[string]any{"exitCode": res.ExitCode, "result": out})
	}
}

// session is a toolbox session: a shell whose commands' logs are kept.
type session struct {
	id     string
	ctx    context.Context
	cancel context.CancelFunc
	cmds   map[string]*command
}

type command struct {
	id      string
	command string
	mu      sync.Mutex
	log     []byte
	exit    *int
	changed chan struct{}
}

func (c *command) append(mark byte, text string) {
	c.mu.Lock()
	c.log = append(c.log, mark, mark, mark)
	c.log = append(c.log, text...)
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

func (s *Server) sessionOp(w http.ResponseWriter, r *http.Request, sb *dtnSandbox, rest string) {
	parts := strings.Split(strings.Trim(rest, "/"), "/")
	if rest == "" || rest == "/" {
		if r.Method != http.MethodPost {
			daemonError(w, r, http.StatusNotFound, "404 page not found")
			return
		}
		raw, _ := io.ReadAll(r.Body)
		sid := gjson.GetBytes(raw, "sessionId").String()
		if sid == "" {
			daemonError(w, r, http.StatusBadRequest, "sessionId is required")
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := sb.sessions[sid]; ok {
			daemonError(w, r, http.StatusConflict, "session already exists")
			return
		}
		ss := &session{id: sid, cmds: map[string]*command{}}
		ss.ctx, ss.cancel = context.WithCancel(sb.ctx)
		sb.sessions[sid] = ss
		w.WriteHeader(http.StatusCreated)
		return
	}
	s.mu.Lock()
	ss, ok := sb.sessions[parts[0]]
	s.mu.Unlock()
	if !ok {
		daemonError(w, r, http.StatusNotFound, "session not found")
		return
	}
	switch {
	case len(parts) == 1 && r.Method == http.MethodDelete:
		ss.cancel()
		s.mu.Lock()
		delete(sb.sessions, ss.id)
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	case len(parts) == 2 && parts[1] == "exec" && r.Method == http.MethodPost:
		raw, _ := io.ReadAll(r.Body)
		body := gjson.ParseBytes(raw)
		c := &command{id: uuid(), command: body.Get("command").String(), changed: make(chan struct{})}
		if c.command == "" {
			daemonError(w, r, http.StatusBadRequest, "command is required")
			return
		}
		s.mu.Lock()
		ss.cmds[c.id] = c
		s.mu.Unlock()
		done := make(chan struct{})
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer close(done)
			res, err := s.shell.Exec(ss.ctx, sb.handle, c.command, sandbox.ExecOptions{Timeout: 24 * time.Hour, OnOutput: func(st sandbox.Stream, t string) {
				c.append(byte(st)+1, t)
			}})
			code := res.ExitCode
			if err != nil {
				code = 137
			}
			c.mu.Lock()
			c.exit = &code
			close(c.changed)
			c.changed = make(chan struct{})
			c.mu.Unlock()
		}()
		if body.Get("runAsync").Bool() {
			writeJSON(w, http.StatusAccepted, map[string]string{"cmdId": c.id})
			return
		}
		<-done
		c.mu.Lock()
		defer c.mu.Unlock()
		stdout, stderr := split(c.log)
		writeJSON(w, http.StatusOK, map[string]any{"cmdId": c.id, "output": stdout + stderr, "stdout": stdout, "stderr": stderr, "exitCode": *c.exit})
	case len(parts) >= 3 && parts[1] == "command":
		s.mu.Lock()
		c, ok := ss.cmds[parts[2]]
		s.mu.Unlock()
		if !ok {
			daemonError(w, r, http.StatusNotFound, "command not found")
			return
		}
		switch {
		case len(parts) == 3 && r.Method == http.MethodGet:
			c.mu.Lock()
			v := map[string]any{"id": c.id, "command": c.command}
			if c.exit != nil {
				v["exitCode"] = *c.exit
			}
			c.mu.Unlock()
			writeJSON(w, http.StatusOK, v)
		case len(parts) == 4 && parts[3] == "logs" && r.URL.Query().Get("follow") == "true":
			s.followLogs(w, r, ss, c)
		case len(parts) == 4 && parts[3] == "logs":
			c.mu.Lock()
			stdout, stderr := split(c.log)
			c.mu.Unlock()
			writeJSON(w, http.StatusOK, map[string]string{"output": stdout + stderr, "stdout": stdout, "stderr": stderr})
		default:
			daemonError(w, r, http.StatusNotFound, "404 page not found")
		}
	default:
		daemonError(w, r, http.StatusNotFound, "404 page not found")
	}
}

// followLogs streams a command's log as binary frames, as written (markers included), and closes
// once the command has exited.
func (s *Server) followLogs(w http.ResponseWriter, r *http.Request, ss *session, c *command) {
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer conn.CloseNow()
	off := 0
	for {
		c.mu.Lock()
		chunk := append([]byte(nil), c.log[off:]...)
		off = len(c.log)
		exited := c.exit != nil
		changed := c.changed
		c.mu.Unlock()
		if len(chunk) > 0 {
			// Frames are cut anywhere, markers included, as the daemon's reads cut them.
			for len(chunk) > 0 {
				n := min(len(chunk), 700)
				if conn.Write(r.Context(), websocket.MessageBinary, chunk[:n]) != nil {
					return
				}
				chunk = chunk[n:]
			}
			continue
		}
		if exited {
			_ = conn.Close(websocket.StatusNormalClosure, "")
			return
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		case <-s.ctx.Done():
			return
		}
	}
}

// split separates a marked log into its streams.
func split(log []byte) (string, string) {
	var out, errs strings.Builder
	cur := &out
	for len(log) > 0 {
		if len(log) >= 3 && (bytes.HasPrefix(log, []byte{1, 1, 1}) || bytes.HasPrefix(log, []byte{2, 2, 2})) {
			if log[0] == 1 {
				cur = &out
			} else {
				cur = &errs
			}
			log = log[3:]
			continue
		}
		cur.WriteByte(log[0])
		log = log[1:]
	}
	return out.String(), errs.String()
}

// shq quotes s for a POSIX shell.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// absolute resolves a daemon path: relative ones against the daemon's working directory.
func absolute(sb *dtnSandbox, p string) string {
	if strings.HasPrefix(p, "/") {
		return path.Clean(p)
	}
	return path.Join(sb.home, p)
}
