package opensandboxtest

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// kernelPy gives the exec sandbox's kernel IPython's post_execute events (see the file).
//
//go:embed kernel.py
var kernelPy string

// pingInterval is execd's keepalive period.
const pingInterval = 3 * time.Second

// commandTail is how long execd's command handler sleeps before it ends a command's response.
const commandTail = time.Second

// event is execd's ServerStreamEvent, in its Go field order, empty fields left out.
type event struct {
	Type           string         `json:"type"`
	Text           string         `json:"text,omitempty"`
	ExecutionCount int            `json:"execution_count,omitempty"`
	ExecutionTime  int64          `json:"execution_time,omitempty"`
	Timestamp      int64          `json:"timestamp,omitempty"`
	Results        map[string]any `json:"results,omitempty"`
	Error          *eventError    `json:"error,omitempty"`
}

type eventError struct {
	Ename     string   `json:"ename"`
	Evalue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

// command is one command's session, for DELETE /command.
type command struct {
	cancel  context.CancelFunc
	running bool
}

func (s *Server) execdRoutes() {
	s.execd = http.NewServeMux()
	s.execd.HandleFunc("GET /ping", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	s.execdRoute("POST /code/context", s.newContext)
	s.execdRoute("GET /code/contexts", s.listContexts)
	s.execdRoute("GET /code/contexts/{id}", s.getContext)
	s.execdRoute("DELETE /code/contexts/{id}", s.deleteContext)
	s.execdRoute("POST /code", s.runCode)
	s.execdRoute("DELETE /code", s.interrupt)
	s.execdRoute("POST /command", s.runCommand)
	s.execdRoute("DELETE /command", s.interrupt)
	s.fileRoutes()
}

// execdRoute registers an execd route whose handler gets the request's sandbox.
func (s *Server) execdRoute(pattern string, fn func(w http.ResponseWriter, r *http.Request, b *box)) {
	route := pattern
	s.execd.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		id, _ := r.Context().Value(boxKey{}).(string)
		s.mu.Lock()
		b, ok := s.sandboxes[id]
		s.headers[route] = r.Header.Clone()
		s.mu.Unlock()
		if !ok {
			http.Error(w, "OpenSandbox Ingress: sandbox not found", http.StatusNotFound)
			return
		}
		fn(w, r, b)
	})
}

// decodeBody reads a JSON body as gin's ShouldBindJSON does, answering 400 when it does not parse.
func decodeBody(w http.ResponseWriter, r *http.Request) (gjson.Result, []byte, bool) {
	body, err := readBody(r)
	if err != nil || !gjson.ValidBytes(body) {
		execdError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "error parsing request, MAYBE invalid body format. invalid character")
		return gjson.Result{}, nil, false
	}
	return gjson.ParseBytes(body), body, true
}

func (s *Server) newContext(w http.ResponseWriter, r *http.Request, b *box) {
	j, _, ok := decodeBody(w, r)
	if !ok {
		return
	}
	lang := j.Get("language").String()
	if lang != "python" {
		// Any kernel but Python is missing from the double; execd would retry for long.
		execdError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "error creating code context: no kernel specs found for language "+lang)
		return
	}
	kc := &kernelCtx{id: randomHex(16), cwd: j.Get("cwd").String()}
	s.mu.Lock()
	first := len(b.contexts) == 0
	if first {
		kc.h = b.exec
	}
	s.mu.Unlock()
	if !first {
		h, err := s.exec.Create(r.Context(), sandbox.CreateOptions{})
		if err == nil {
			if err = s.prepareKernel(r.Context(), h, b.env); err != nil {
				s.deleteExec([]sandbox.Handle{h})
			}
		}
		if err != nil {
			execdError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "error creating code context: "+err.Error())
			return
		}
		kc.h, kc.own = h, true
	}
	if kc.cwd != "" {
		lit, _ := json.Marshal(kc.cwd)
		code := "import builtins, os\nbuiltins._osb_hidden = True\nos.makedirs(" + string(lit) + ", exist_ok=True)\nos.chdir(" + string(lit) + ")\n"
		if res, err := s.exec.Run(r.Context(), kc.h, code, sandbox.RunOptions{}); err != nil || res.Error != nil {
			execdError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "error creating code context: cannot enter "+kc.cwd)
			return
		}
	}
	s.mu.Lock()
	b.contexts[kc.id] = kc
	s.mu.Unlock()
	out := map[string]string{"id": kc.id, "language": "python"}
	if kc.cwd != "" {
		out["cwd"] = kc.cwd
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request, b *box) {
	s.mu.Lock()
	out := []map[string]string{}
	for id := range b.contexts {
		out = append(out, map[string]string{"id": id, "language": "python"})
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getContext(w http.ResponseWriter, r *http.Request, b *box) {
	id := r.PathValue("id")
	s.mu.Lock()
	_, ok := b.contexts[id]
	s.mu.Unlock()
	if !ok {
		execdError(w, http.StatusNotFound, "CONTEXT_NOT_FOUND", "context "+id+" not found")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id, "language": "python"})
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request, b *box) {
	id := r.PathValue("id")
	s.mu.Lock()
	kc, ok := b.contexts[id]
	delete(b.contexts, id)
	s.mu.Unlock()
	if !ok {
		execdError(w, http.StatusNotFound, "CONTEXT_NOT_FOUND", "context "+id+" not found")
		return
	}
	if kc.own {
		s.deleteExec([]sandbox.Handle{kc.h})
	}
	w.WriteHeader(http.StatusOK)
}

// sse writes execd's event stream: the headers with the first event, each event a bare JSON
// object and a blank line, pings every 3 s until stop. cut, when > 0, aborts the connection once
// that many events were written.
type sse struct {
	w    http.ResponseWriter
	mu   sync.Mutex
	n    int
	cut  int
	dead bool
	stop chan struct{}
	done chan struct{}
	// onCut runs when the fault cuts the stream.
	onCut func()
}

func newSSE(w http.ResponseWriter, cut int) *sse {
	return &sse{w: w, cut: cut, stop: make(chan struct{}), done: make(chan struct{})}
}

// start sends the headers, the init event and a ping, then pings until close.
func (e *sse) start(initText string) {
	h := e.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	e.w.WriteHeader(http.StatusOK)
	e.send(event{Type: "init", Text: initText, Timestamp: time.Now().UnixMilli()})
	e.send(event{Type: "ping", Text: "pong"})
	go func() {
		defer close(e.done)
		t := time.NewTicker(pingInterval)
		defer t.Stop()
		for {
			select {
			case <-e.stop:
				return
			case <-t.C:
				e.send(event{Type: "ping", Text: "pong"})
			}
		}
	}()
}

// send writes one event; false once the stream is cut.
func (e *sse) send(ev event) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.dead {
		return false
	}
	if e.cut > 0 && e.n >= e.cut {
		// The fault: the connection breaks mid-stream.
		e.dead = true
		if conn, _, err := http.NewResponseController(e.w).Hijack(); err == nil {
			_ = conn.Close()
		}
		if e.onCut != nil {
			e.onCut()
		}
		return false
	}
	b, _ := json.Marshal(ev)
	b = append(b, '\n', '\n')
	if _, err := e.w.Write(b); err != nil {
		e.dead = true
		return false
	}
	e.n++
	if f, ok := e.w.(http.Flusher); ok {
		f.Flush()
	}
	return true
}

// raw appends a JSON error to the stream, as execd does for an error after the first event.
func (e *sse) raw(code, msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	b, _ := json.Marshal(map[string]string{"code": code, "message": msg})
	_, _ = e.w.Write(b)
}

// close stops the pings.
func (e *sse) close() {
	close(e.stop)
	<-e.done
}

// cutNow reports whether the stream was cut (the handler then aborts the connection).
func (e *sse) cutNow() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.dead && e.cut > 0 && e.n >= e.cut
}

// runCode is POST /code: the code in the named context's kernel, its messages as execd's events,
// display_data dropped; execution_complete at the end, after an error too.
func (s *Server) runCode(w http.ResponseWriter, r *http.Request, b *box) {
	j, body, ok := decodeBody(w, r)
	if !ok {
		return
	}
	s.record("POST /code", r, body)
	if !j.Get("code").Exists() || j.Get("code").String() == "" {
		execdError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "invalid request, validation error Key: 'RunCodeRequest.Code' Error:Field validation for 'Code' failed on the 'required' tag")
		return
	}
	code := j.Get("code").String()
	if j.Get("context.language").String() == "" {
		// No language: a shell command, whatever the id.
		s.command(w, r, b, code, "", 0, false)
		return
	}
	id := j.Get("context.id").String()
	s.mu.Lock()
	kc, ok := b.contexts[id]
	switch {
	case !ok:
		s.mu.Unlock()
		execdError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "error running codes context not found")
		return
	case kc.busy:
		s.mu.Unlock()
		execdError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "error running codes session is busy")
		return
	}
	kc.busy = true
	runCtx, cancel := context.WithCancel(r.Context())
	kc.cancel = cancel
	s.runs++
	cut := 0
	if s.cutRuns > 0 {
		s.cutRuns--
		cut = s.cutAfter
	}
	s.mu.Unlock()
	s.wg.Add(1)
	defer s.wg.Done()
	defer cancel()

	st := newSSE(w, cut)
	st.onCut = cancel
	st.start(id)
	start := time.Now()
	sawError := false
	res, err := s.exec.Run(runCtx, kc.h, code, sandbox.RunOptions{OnMessage: func(m sandbox.Message) {
		now := time.Now().UnixMilli()
		switch m.Type {
		case sandbox.MessageStdout, sandbox.MessageStderr:
			st.send(event{Type: m.Type, Text: m.Text, Timestamp: now})
		case sandbox.MessageResult:
			if !m.IsMainResult {
				return // display_data: execd forwards no such message
			}
			s.mu.Lock()
			kc.count++
			n := kc.count
			s.mu.Unlock()
			st.send(event{Type: "execution_count", ExecutionCount: n, Timestamp: now})
			st.send(event{Type: "result", Results: bundle(m.Output), Timestamp: now})
		case sandbox.MessageError:
			sawError = true
			st.send(event{Type: "status", Text: "error", Timestamp: now})
			st.send(event{Type: "error", Error: &eventError{Ename: m.Name, Evalue: m.Value, Traceback: strings.SplitAfter(strings.TrimSuffix(m.Traceback, "\n"), "\n")}, Timestamp: now})
		}
	}})
	_ = res
	// The kernel is idle again before execd reports the end.
	s.mu.Lock()
	kc.busy, kc.cancel = false, nil
	s.mu.Unlock()
	switch {
	case r.Context().Err() != nil || st.cutNow():
		st.close()
		return // the client left (or the fault cut it off): the kernel was interrupted
	case runCtx.Err() != nil && !sawError:
		// DELETE /code: the kernel was interrupted.
		st.send(event{Type: "status", Text: "error"})
		st.send(event{Type: "error", Error: &eventError{Ename: "KeyboardInterrupt", Evalue: "", Traceback: []string{"\x1b[0;31mKeyboardInterrupt\x1b[0m: "}}})
	case err != nil && errors.Is(err, sandbox.ErrTimeout):
		st.raw("RUNTIME_ERROR", "error running codes: "+err.Error())
		st.close()
		return
	case err != nil:
		// The kernel died: Jupyter restarts it with fresh state (here: a new exec sandbox), execd
		// reports the end of the execution and then waits for a reply that never comes.
		s.restartKernel(r.Context(), b, kc)
		st.send(event{Type: "execution_complete", ExecutionTime: max(time.Since(start).Milliseconds(), 1)})
		if !st.cutNow() {
			<-r.Context().Done()
		}
		st.close()
		return
	}
	st.send(event{Type: "execution_complete", ExecutionTime: max(time.Since(start).Milliseconds(), 1)})
	st.close()
}

// restartKernel replaces a context's dead kernel by a fresh one.
func (s *Server) restartKernel(ctx context.Context, b *box, kc *kernelCtx) {
	h, err := s.exec.Create(ctx, sandbox.CreateOptions{})
	if err == nil {
		err = s.prepareKernel(ctx, h, b.env)
	}
	if err != nil {
		return
	}
	if kc.cwd != "" {
		lit, _ := json.Marshal(kc.cwd)
		_, _ = s.exec.Run(ctx, h, "import builtins, os\nbuiltins._osb_hidden = True\nos.makedirs("+string(lit)+", exist_ok=True)\nos.chdir("+string(lit)+")\n", sandbox.RunOptions{})
	}
	s.mu.Lock()
	old := kc.h
	kc.h, kc.count = h, 0
	if !kc.own {
		b.exec = h
	}
	s.mu.Unlock()
	s.deleteExec([]sandbox.Handle{old})
}

// bundle is execd's results map: the MIME bundle with text/plain as "text".
func bundle(o sandbox.Output) map[string]any {
	m := map[string]any{}
	set := func(k, v string) {
		if v != "" {
			m[k] = v
		}
	}
	set("text", o.Text)
	set("text/html", o.HTML)
	set("text/markdown", o.Markdown)
	set("image/svg+xml", o.SVG)
	set("image/png", o.PNG)
	set("image/jpeg", o.JPEG)
	set("application/pdf", o.PDF)
	set("text/latex", o.LaTeX)
	set("application/javascript", o.JavaScript)
	if len(o.JSON) > 0 {
		m["application/json"] = json.RawMessage(o.JSON)
	}
	return m
}

// interrupt is DELETE /code?id= and DELETE /command?id=.
func (s *Server) interrupt(w http.ResponseWriter, r *http.Request, b *box) {
	id := r.URL.Query().Get("id")
	if id == "" {
		execdError(w, http.StatusBadRequest, "MISSING_QUERY", "missing query parameter id")
		return
	}
	s.mu.Lock()
	var cancel context.CancelFunc
	known := false
	if kc, ok := b.contexts[id]; ok {
		known, cancel = true, kc.cancel
	} else if c, ok := b.commands[id]; ok {
		known = true
		if c.running {
			cancel = c.cancel
		}
	}
	s.mu.Unlock()
	switch {
	case !known:
		execdError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "error interruptting code context. "+id+": no such session")
	case cancel == nil && strings.HasPrefix(r.URL.Path, "/command"):
		execdError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "error interruptting code context. command session "+id+" is not running")
	default:
		if cancel != nil {
			cancel()
		}
		w.WriteHeader(http.StatusOK)
	}
}

// runCommand is POST /command.
func (s *Server) runCommand(w http.ResponseWriter, r *http.Request, b *box) {
	j, body, ok := decodeBody(w, r)
	if !ok {
		return
	}
	s.record("POST /command", r, body)
	if j.Get("command").String() == "" {
		execdError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "invalid request, validation error Key: 'RunCommandRequest.Command' Error:Field validation for 'Command' failed on the 'required' tag")
		return
	}
	if j.Get("background").Bool() {
		execdError(w, http.StatusBadRequest, "NOT_SUPPORTED", "background commands are not supported by the double")
		return
	}
	s.command(w, r, b, j.Get("command").String(), j.Get("cwd").String(), j.Get("timeout").Int(), true)
}

// command runs bash -c cmd in the sandbox's shell and streams its output line by line; tail is
// execd's 1 s sleep before the response ends.
func (s *Server) command(w http.ResponseWriter, r *http.Request, b *box, cmd, cwd string, timeoutMs int64, tail bool) {
	if cwd != "" {
		lit, _ := json.Marshal(cwd)
		res, err := s.exec.Exec(r.Context(), b.exec, "test -d "+string(lit), sandbox.ExecOptions{Timeout: 10 * time.Second})
		if err != nil || res.ExitCode != 0 {
			execdError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "invalid request, validation error working directory does not exist: "+cwd)
			return
		}
		cmd = "cd " + string(lit) + " && " + cmd
	}
	// The sandbox's environment, which execd's commands inherit.
	var exports strings.Builder
	for k, v := range b.env {
		if !envName.MatchString(k) {
			continue
		}
		exports.WriteString("export " + k + "=" + shellQuote(v) + "; ")
	}
	cmd = exports.String() + cmd
	id := randomHex(16)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	c := &command{cancel: cancel, running: true}
	s.mu.Lock()
	b.commands[id] = c
	s.mu.Unlock()
	s.wg.Add(1)
	defer s.wg.Done()
	st := newSSE(w, 0)
	st.start(id)
	start := time.Now()
	lines := map[sandbox.Stream]*lineSplitter{sandbox.Stdout: {typ: "stdout", st: st}, sandbox.Stderr: {typ: "stderr", st: st}}
	timeout := 24 * time.Hour
	if timeoutMs > 0 {
		timeout = time.Duration(timeoutMs) * time.Millisecond
	}
	res, err := s.exec.Exec(ctx, b.exec, cmd, sandbox.ExecOptions{Timeout: timeout, OnOutput: func(stream sandbox.Stream, text string) {
		lines[stream].write(text)
	}})
	lines[sandbox.Stdout].flush()
	lines[sandbox.Stderr].flush()
	s.mu.Lock()
	c.running = false
	s.mu.Unlock()
	switch {
	case r.Context().Err() != nil:
		st.close()
		return
	case err != nil && ctx.Err() == nil:
		st.raw("RUNTIME_ERROR", "error running command: "+err.Error())
	case err != nil || res.TimedOut || res.ExitCode > 128:
		st.send(event{Type: "error", Error: &eventError{Ename: "CommandExecError", Evalue: "-1", Traceback: []string{"signal: killed"}}})
	case res.ExitCode != 0:
		n := strconv.Itoa(res.ExitCode)
		st.send(event{Type: "error", Error: &eventError{Ename: "CommandExecError", Evalue: n, Traceback: []string{"exit status " + n}}})
	default:
		st.send(event{Type: "execution_complete", ExecutionTime: max(time.Since(start).Milliseconds(), 1)})
	}
	if tail {
		select {
		case <-time.After(commandTail):
		case <-r.Context().Done():
		}
	}
	st.close()
}

// lineSplitter turns a stream's output into execd's one event per line, the terminator (\n, \r
// or \r\n) dropped, an empty line sent as "\n", the unterminated rest at the end.
type lineSplitter struct {
	typ     string
	st      *sse
	buf     strings.Builder
	afterCR bool
}

func (l *lineSplitter) write(text string) {
	for _, c := range text {
		if l.afterCR && c == '\n' {
			l.afterCR = false
			continue
		}
		l.afterCR = false
		if c == '\n' || c == '\r' {
			l.afterCR = c == '\r'
			line := l.buf.String()
			if line == "" {
				line = "\n"
			}
			l.st.send(event{Type: l.typ, Text: line, Timestamp: time.Now().UnixMilli()})
			l.buf.Reset()
			continue
		}
		l.buf.WriteRune(c)
	}
}

func (l *lineSplitter) flush() {
	if l.buf.Len() > 0 {
		l.st.send(event{Type: l.typ, Text: l.buf.String(), Timestamp: time.Now().UnixMilli()})
		l.buf.Reset()
	}
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// shellQuote quotes s for bash.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
