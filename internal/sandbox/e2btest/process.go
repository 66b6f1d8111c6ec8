package e2btest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// envd's process service on port 49983 (Start, SendSignal, List), as the SDKs' commands.run
// reaches it: Start is a server-streaming Connect call with JSON envelopes, the others unary JSON.
// A command runs for real in the exec sandbox of the default Python context (the local provider's
// Exec), so it sees the files the code and envd's file API see. Differences from envd: the
// sandbox's user and cwd are the local sandbox's (uid 1000, /mnt/data); SendSignal kills the
// command and everything it started, where envd signals the process alone; a signalled command
// ends as "exit status 128+N" unless SendSignal killed it.
//
// Tags are envd's: a Start's tag (StartRequest field 3) is kept with the process, listed by List
// and matched by a ProcessSelector's tag. envd looks a tag up by ranging over its processes and
// stops at the first tagged one whose tag differs, so a process is found by tag only when no
// other tagged process comes first; the emulator ranges in ascending pid order (one of the orders
// envd's map may take), which makes that deterministic: the oldest tagged process is found.

// emuProcess is one running command.
type emuProcess struct {
	pid    uint32
	tag    *string // nil: the Start had none
	cmd    string
	args   []string
	config json.RawMessage
	kill   context.CancelFunc
	killed bool // by SendSignal; guarded by Server.mu
}

func (s *Server) processRoutes() {
	// Their bodies are small and kept: a test reads the tag a Start carried, or whom SendSignal named.
	for pattern, fn := range map[string]http.HandlerFunc{
		"POST /process.Process/Start":      s.startProcess,
		"POST /process.Process/SendSignal": s.sendSignal,
		"POST /process.Process/List":       s.listProcesses,
	} {
		s.handle(s.envd, "49983 ", pattern, func(w http.ResponseWriter, r *http.Request, body []byte) {
			r.Body = io.NopCloser(bytes.NewReader(body))
			fn(w, r)
		})
	}
}

type startRequestJSON struct {
	Process struct {
		Cmd  string            `json:"cmd"`
		Args []string          `json:"args"`
		Envs map[string]string `json:"envs"`
		Cwd  *string           `json:"cwd"`
	} `json:"process"`
	Tag   *string `json:"tag"`
	Stdin *bool   `json:"stdin"`
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// startProcess serves Start.
func (s *Server) startProcess(w http.ResponseWriter, r *http.Request) {
	sb := r.Context().Value(ctxKeySandbox{}).(*emuSandbox)
	if !s.envdAuthorized(w, r, sb) {
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/connect+json" {
		w.Header().Set("Accept-Post", "application/connect+json, application/connect+proto")
		w.WriteHeader(http.StatusUnsupportedMediaType)
		return
	}
	var deadline time.Duration
	if v := r.Header.Get("Connect-Timeout-Ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 {
			connectError(w, http.StatusBadRequest, "invalid_argument", "protocol error: invalid connect timeout: "+v)
			return
		}
		deadline = time.Duration(ms) * time.Millisecond
	}
	st := &envelopeWriter{w: w}
	u, err := basicUser(r.Header.Get("Authorization"))
	if err != nil || !knownUser(u) {
		st.end("unauthenticated", fmt.Sprintf("invalid username: '%s'", u))
		return
	}
	var req startRequestJSON
	raw, err := readRequestEnvelope(r.Body)
	if err == nil {
		err = json.Unmarshal(raw, &req)
	}
	if err != nil {
		st.end("invalid_argument", "unmarshal into process.StartRequest: "+err.Error())
		return
	}
	var b strings.Builder
	cwd := sandbox.DataDir
	if req.Process.Cwd != nil && *req.Process.Cwd != "" {
		cwd = *req.Process.Cwd
	}
	// envd checks the cwd before it starts anything.
	fmt.Fprintf(&b, "cd -- %s 2>/dev/null || { echo %s >&2; exit 97; }; ", shellQuote(cwd), shellQuote("cwd '"+cwd+"' does not exist"))
	keys := make([]string, 0, len(sb.envVars)+len(req.Process.Envs))
	envs := map[string]string{"USER": defaultUser, "LOGNAME": defaultUser}
	s.mu.Lock()
	for k, v := range sb.envVars {
		envs[k] = v
	}
	s.mu.Unlock()
	for k, v := range req.Process.Envs {
		envs[k] = v
	}
	for k := range envs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "export %s=%s; ", k, shellQuote(envs[k]))
	}
	b.WriteString("exec")
	for _, a := range append([]string{req.Process.Cmd}, req.Process.Args...) {
		b.WriteString(" " + shellQuote(a))
	}
	kc := s.defaultContext(sb)
	if kc == nil {
		st.end("unavailable", "no python context")
		return
	}
	h, err := s.startContext(r.Context(), sb, kc)
	if err != nil {
		st.end("unavailable", err.Error())
		return
	}
	shell, ok := s.exec.(sandbox.Shell)
	if !ok {
		st.end("unimplemented", "the emulator's exec backend runs no commands")
		return
	}
	// envd does not kill a command whose client went away: its context is not the request's.
	execCtx, kill := context.WithCancel(context.Background())
	defer kill()
	p := &emuProcess{kill: kill, tag: req.Tag, cmd: req.Process.Cmd, args: req.Process.Args}
	p.config, _ = json.Marshal(req.Process)
	s.mu.Lock()
	var delay time.Duration
	if s.startFault.n > 0 {
		s.startFault.n--
		delay = s.startFault.delay
	}
	if sb.procs == nil {
		sb.procs = map[uint32]*emuProcess{}
	}
	sb.lastPID++
	// Above any pid_max: a pid of the process service names no process of the exec sandbox.
	p.pid = 1<<22 + sb.lastPID
	sb.procs[p.pid] = p
	s.mu.Unlock()
	// As envd, the process is forgotten once it has ended, whatever its stream is doing.
	forget := func() {
		s.mu.Lock()
		delete(sb.procs, p.pid)
		s.mu.Unlock()
	}
	defer forget()

	w.Header().Set("Content-Type", "application/connect+json")
	// The headers go out with the start event: envd sends nothing before it.
	w.WriteHeader(http.StatusOK)
	timeout := deadline
	if timeout == 0 {
		timeout = 24 * time.Hour // no header: no limit
	}
	// The command runs from here on, as envd's runs before its start event is sent; its output
	// waits for the start event. A delayed start event (DelayNextStarts) leaves the command running
	// and listed, its pid unknown to the client.
	started, activity := make(chan struct{}), make(chan struct{}, 1)
	type outcome struct {
		res sandbox.ExecResult
		err error
	}
	done, finished := make(chan outcome, 1), make(chan struct{})
	go func() {
		defer close(finished)
		res, err := shell.Exec(execCtx, h, b.String(), sandbox.ExecOptions{Timeout: timeout, OnOutput: func(stream sandbox.Stream, text string) {
			<-started
			select {
			case activity <- struct{}{}:
			default:
			}
			field := "stdout"
			if stream == sandbox.Stderr {
				field = "stderr"
			}
			// envd reads its pipes 32 KiB at a time: one data event per read.
			for data := []byte(text); len(data) > 0; {
				n := min(len(data), 32<<10)
				chunk, _ := json.Marshal(map[string]map[string][]byte{"data": {field: data[:n]}})
				st.event(string(chunk))
				data = data[n:]
			}
		}})
		forget()
		done <- outcome{res, err}
	}()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-r.Context().Done(): // the client left: nothing to send it, the command goes on
		case <-finished: // nothing more to hold back
		}
		t.Stop()
	}
	st.event(fmt.Sprintf(`{"start":{"pid":%d}}`, p.pid))
	close(started)
	// A keepalive event after every interval without data, as envd sends them.
	interval := 90 * time.Second
	if v, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && v > 0 {
		interval = time.Duration(v) * time.Second
	}
	stopKA := make(chan struct{})
	go func() {
		t := time.NewTimer(interval)
		defer t.Stop()
		for {
			select {
			case <-stopKA:
				return
			case <-activity:
				t.Reset(interval)
			case <-t.C:
				st.event(`{"keepalive":{}}`)
				t.Reset(interval)
			}
		}
	}()
	o := <-done
	res, err := o.res, o.err
	close(stopKA)
	s.mu.Lock()
	killed := p.killed
	s.mu.Unlock()
	switch {
	case killed:
		st.event(`{"end":{"exitCode":-1,"status":"signal: killed","error":"signal: killed"}}`)
		st.end("", "")
	case err != nil && errors.Is(err, sandbox.ErrNotFound):
		st.end("unavailable", err.Error())
	case err != nil:
		st.end("internal", err.Error())
	case res.TimedOut:
		st.end("deadline_exceeded", "context deadline exceeded")
	default:
		end := map[string]any{"exited": true, "status": fmt.Sprintf("exit status %d", res.ExitCode)}
		if res.ExitCode != 0 {
			end["exitCode"] = res.ExitCode
			end["error"] = end["status"]
		}
		ev, _ := json.Marshal(map[string]any{"end": end})
		st.event(string(ev))
		st.end("", "")
	}
}

// defaultContext is the sandbox's default Python context.
func (s *Server) defaultContext(sb *emuSandbox) *kernelContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range sb.contexts {
		if c.isDflt && c.language == "python" {
			return c
		}
	}
	return nil
}

// readRequestEnvelope reads a Connect request's one envelope.
func readRequestEnvelope(r io.Reader) ([]byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, fmt.Errorf("reading the envelope: %w", err)
	}
	if head[0] != 0 {
		return nil, fmt.Errorf("envelope flags %#x", head[0])
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n > 1<<20 {
		return nil, fmt.Errorf("a message of %d bytes", n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, fmt.Errorf("reading the message: %w", err)
	}
	return msg, nil
}

// envelopeWriter writes a Start stream's envelopes, flushing each (events come from the command's
// output and from the keepalive timer).
type envelopeWriter struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	done bool
}

func (e *envelopeWriter) write(flags byte, msg []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.done {
		return
	}
	var head [5]byte
	head[0] = flags
	binary.BigEndian.PutUint32(head[1:], uint32(len(msg)))
	if _, err := e.w.Write(append(head[:], msg...)); err != nil {
		return // the client left; envd goes on with the command
	}
	http.NewResponseController(e.w).Flush()
}

// event writes one StartResponse holding the event (a JSON object).
func (e *envelopeWriter) event(ev string) { e.write(0, []byte(`{"event":`+ev+`}`)) }

// end writes the end-of-stream envelope: {} or the Connect error. A stream that has not begun
// (an error before the start event) is still a 200 with an end envelope.
func (e *envelopeWriter) end(code, msg string) {
	body := []byte(`{}`)
	if code != "" {
		body, _ = json.Marshal(map[string]any{"error": map[string]string{"code": code, "message": msg}})
	}
	e.mu.Lock()
	if h := e.w.Header(); h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/connect+json")
	}
	e.mu.Unlock()
	e.write(0x02, body)
	e.mu.Lock()
	e.done = true
	e.mu.Unlock()
}

type processSelector struct {
	Process struct {
		PID *uint32 `json:"pid"`
		Tag *string `json:"tag"`
	} `json:"process"`
	Signal string `json:"signal"`
}

// unary checks a unary process call and decodes its body.
func (s *Server) unary(w http.ResponseWriter, r *http.Request, method string, into any) (*emuSandbox, bool) {
	sb := r.Context().Value(ctxKeySandbox{}).(*emuSandbox)
	if !s.envdAuthorized(w, r, sb) {
		return nil, false
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		w.Header().Set("Accept-Post", "application/json, application/proto")
		w.WriteHeader(http.StatusUnsupportedMediaType)
		return nil, false
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(into); err != nil {
		connectError(w, http.StatusBadRequest, "invalid_argument", "unmarshal into process."+method+"Request: "+err.Error())
		return nil, false
	}
	return sb, true
}

// sendSignal serves SendSignal: SIGKILL and SIGTERM, to a process selected by pid or tag. As
// envd, the process is looked up first (not_found before a bad signal's unimplemented).
func (s *Server) sendSignal(w http.ResponseWriter, r *http.Request) {
	var req processSelector
	sb, ok := s.unary(w, r, "SendSignal", &req)
	if !ok {
		return
	}
	sel := req.Process
	if sel.PID != nil && sel.Tag != nil {
		// protojson refuses a second member of a oneof.
		connectError(w, http.StatusBadRequest, "invalid_argument", "unmarshal into process.SendSignalRequest: proto: (line 1:1): error parsing \"tag\", oneof process.ProcessSelector.selector is already set")
		return
	}
	if sel.PID == nil && sel.Tag == nil {
		connectError(w, http.StatusNotImplemented, "unimplemented", "invalid input type *process.ProcessSelector")
		return
	}
	s.mu.Lock()
	p := selectProcess(sb, sel.PID, sel.Tag)
	if p != nil && (req.Signal == "SIGNAL_SIGKILL" || req.Signal == "SIGNAL_SIGTERM") {
		p.killed = true
	}
	s.mu.Unlock()
	if p == nil {
		what := "pid " + fmt.Sprint(derefPID(sel.PID))
		if sel.Tag != nil {
			what = "tag " + *sel.Tag
		}
		connectError(w, http.StatusNotFound, "not_found", "process with "+what+" not found")
		return
	}
	if req.Signal != "SIGNAL_SIGKILL" && req.Signal != "SIGNAL_SIGTERM" {
		connectError(w, http.StatusNotImplemented, "unimplemented", "invalid signal: "+req.Signal)
		return
	}
	p.kill()
	writeJSON(w, http.StatusOK, []byte(`{}`))
}

// selectProcess is envd's getProcess: the process with the pid, or the process with the tag as
// envd's range finds it (it stops at the first tagged process whose tag differs), ranging in
// ascending pid order. Called with s.mu held.
func selectProcess(sb *emuSandbox, pid *uint32, tag *string) *emuProcess {
	if pid != nil {
		return sb.procs[*pid]
	}
	pids := make([]uint32, 0, len(sb.procs))
	for n := range sb.procs {
		pids = append(pids, n)
	}
	sort.Slice(pids, func(i, j int) bool { return pids[i] < pids[j] })
	var found *emuProcess
	for _, n := range pids {
		p := sb.procs[n]
		if p.tag == nil {
			continue
		}
		if *p.tag != *tag {
			break
		}
		found = p
	}
	return found
}

func derefPID(p *uint32) uint32 {
	if p == nil {
		return 0
	}
	return *p
}

// listProcesses serves List: the commands still running.
func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) {
	var req struct{}
	sb, ok := s.unary(w, r, "List", &req)
	if !ok {
		return
	}
	type info struct {
		Config json.RawMessage `json:"config"`
		PID    uint32          `json:"pid"`
		Tag    *string         `json:"tag,omitempty"`
	}
	s.mu.Lock()
	list := []info{}
	for _, p := range sb.procs {
		list = append(list, info{Config: p.config, PID: p.pid, Tag: p.tag})
	}
	s.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].PID < list[j].PID })
	body, _ := json.Marshal(map[string]any{"processes": list})
	writeJSON(w, http.StatusOK, body)
}

// Process is a command the emulated process service runs.
type Process struct {
	PID  uint32
	Tag  string // "" when its Start had none
	Cmd  string
	Args []string
}

// Processes lists the commands still running in a sandbox (those List would show), by pid; a
// command's process is listed from before its start event is sent until it has ended.
func (s *Server) Processes(sandboxID string) []Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[sandboxID]
	if !ok {
		return nil
	}
	list := []Process{}
	for _, p := range sb.procs {
		q := Process{PID: p.pid, Cmd: p.cmd, Args: append([]string(nil), p.args...)}
		if p.tag != nil {
			q.Tag = *p.tag
		}
		list = append(list, q)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].PID < list[j].PID })
	return list
}
