package daytona

import (
	"context"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// cellPy wraps every execution (see its header).
//
//go:embed cell.py
var cellPy string

const (
	// frameLimit bounds one WebSocket message of the interpreter (the daemon sends output in
	// pieces of at most 1 KiB, JSON-escaped).
	frameLimit = 1 << 20
	// markerLimit bounds one marker line (a figure's PNG in base64); a longer one is dropped.
	markerLimit = sandbox.DefaultOutputLimit + 1<<20
	// runGrace is how much longer than the run's timeout the client waits for the daemon to end
	// it (SIGINT, SIGKILL 2 s later, close 4008).
	runGrace = 5 * time.Second
	// Close codes of the interpreter's WebSocket.
	closeTimeout = 4008
)

// lostNote is the first line of stderr of the execution that runs in a new interpreter context
// because the previous one lost its state.
const lostNote = "[the sandbox's Python interpreter was restarted: variables and imports of earlier executions are gone; files in /mnt/data are kept]\n"

// errRetry marks a run the daemon refused before it began because its context is gone.
var errRetry = errors.New("interpreter context gone")

// interpreterContext returns the sandbox's interpreter context: the one known, else one found
// in the sandbox (working in /mnt/data: made by this proxy, maybe by another replica), else a
// new one. fresh makes a new one whatever is known.
func (p *Provider) interpreterContext(ctx context.Context, h sandbox.Handle, b *box, fresh bool) (string, error) {
	select {
	case b.ctxMu <- struct{}{}:
		defer func() { <-b.ctxMu }()
	case <-ctx.Done():
		return "", fmt.Errorf("daytona run: %w", context.Cause(ctx))
	}
	p.mu.Lock()
	id := b.context
	p.mu.Unlock()
	if id != "" && !fresh {
		return id, nil
	}
	if !fresh {
		raw, err := p.toolbox(ctx, b, "list contexts", http.MethodGet, "/process/interpreter/context", nil, "")
		if err != nil {
			return "", err
		}
		for _, c := range gjson.GetBytes(raw, "contexts").Array() {
			if c.Get("cwd").String() == sandbox.DataDir && c.Get("language").String() == "python" && c.Get("active").Bool() {
				id = c.Get("id").String()
				break
			}
		}
	}
	if id == "" || fresh {
		body, _ := json.Marshal(map[string]string{"cwd": sandbox.DataDir, "language": "python"})
		raw, err := p.toolbox(ctx, b, "create context", http.MethodPost, "/process/interpreter/context", body, "")
		if err != nil {
			return "", err
		}
		if id = gjson.GetBytes(raw, "id").String(); id == "" {
			return "", fmt.Errorf("%w: daytona create context: the answer names no context", sandbox.ErrUnavailable)
		}
	}
	p.mu.Lock()
	b.context = id
	p.mu.Unlock()
	return id, nil
}

// dropContext forgets the context id (if it is still the one known) and deletes it in the
// sandbox when del: the only way Daytona has to stop what it runs. Its state is lost either way.
func (p *Provider) dropContext(ctx context.Context, b *box, id string, del bool) {
	p.mu.Lock()
	if b.context == id {
		b.context = ""
		b.lost = true
	}
	p.mu.Unlock()
	if !del {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.RequestTimeout)
	defer cancel()
	if _, err := p.toolbox(cctx, b, "delete context", http.MethodDelete, "/process/interpreter/context/"+url.PathEscape(id), nil, ""); err != nil {
		p.log.Debug("daytona: deleting an interpreter context failed")
	}
}

// Run executes code in the sandbox's interpreter context, wrapped by cell.py, over the toolbox's
// WebSocket, and decodes what it streams into the Result the other backends give. Daytona cannot
// interrupt a run: a caller that goes away has the context deleted (its state is lost, and the
// next execution says so); a run past its timeout is ended by the daemon (close 4008).
func (p *Provider) Run(ctx context.Context, h sandbox.Handle, code string, opts sandbox.RunOptions) (sandbox.Result, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.opts.RunTimeout
	}
	b, err := p.lookup(ctx, h)
	if err != nil {
		return sandbox.Result{}, err
	}
	for attempt := 0; ; attempt++ {
		id, err := p.interpreterContext(ctx, h, b, false)
		if err != nil {
			return sandbox.Result{}, p.gone(ctx, h, err)
		}
		p.mu.Lock()
		lost := b.lost
		b.lost = false
		p.mu.Unlock()
		res, err := p.run(ctx, h, b, id, code, timeout, lost, opts.OnMessage)
		if errors.Is(err, errRetry) && attempt == 0 {
			p.dropContext(ctx, b, id, false)
			continue
		}
		if lost && errors.Is(err, errRetry) {
			p.mu.Lock()
			b.lost = true
			p.mu.Unlock()
		}
		return res, err
	}
}

// executeRequest is the one message a run sends.
type executeRequest struct {
	Code      string `json:"code"`
	ContextID string `json:"contextId"`
	Timeout   int    `json:"timeout"`
}

// run is one execution in context id.
func (p *Provider) run(ctx context.Context, h sandbox.Handle, b *box, id, code string, timeout time.Duration, lost bool, onMessage func(sandbox.Message)) (sandbox.Result, error) {
	nonce := randomHex(12)
	src, _ := json.Marshal(base64.StdEncoding.EncodeToString([]byte(code)))
	nonceLit, _ := json.Marshal(nonce)
	wrapped := cellPy + "\n__ciproxy_cell(" + string(src) + ", " + string(nonceLit) + ")\ndel __ciproxy_cell\n"
	msg, err := json.Marshal(executeRequest{Code: wrapped, ContextID: id, Timeout: seconds(timeout)})
	if err != nil {
		return sandbox.Result{}, fmt.Errorf("daytona run: %w", err)
	}

	runCtx, cancel := context.WithTimeoutCause(ctx, timeout+runGrace, sandbox.ErrTimeout)
	defer cancel()
	conn, err := p.dial(runCtx, b, "/process/interpreter/execute")
	if err != nil {
		if ctx.Err() != nil {
			return sandbox.Result{}, fmt.Errorf("daytona run: %w", context.Cause(ctx))
		}
		return sandbox.Result{}, p.gone(ctx, h, fmt.Errorf("daytona run: %w", err))
	}
	defer conn.CloseNow()
	conn.SetReadLimit(frameLimit)
	if err := conn.Write(runCtx, websocket.MessageText, msg); err != nil {
		return sandbox.Result{}, p.gone(ctx, h, fmt.Errorf("%w: daytona run: sending the code: %w", sandbox.ErrUnavailable, err))
	}

	pr, pw := io.Pipe()
	pumped := make(chan error, 1)
	go func() {
		err := pump(runCtx, conn, nonce, lost, pw)
		pw.CloseWithError(err)
		pumped <- err
	}()
	res, derr := sandbox.DecodeExecution(pr, 0, onMessage)
	pr.CloseWithError(io.ErrClosedPipe)
	perr := <-pumped
	switch {
	case ctx.Err() != nil:
		// The caller left: Daytona cannot interrupt the run, so its context goes with it.
		p.dropContext(ctx, b, id, true)
		return res, fmt.Errorf("daytona run: %w", context.Cause(ctx))
	case errors.Is(perr, sandbox.ErrTimeout):
		if runCtx.Err() != nil {
			// The daemon did not end the run at its timeout: end it by deleting its context.
			p.dropContext(ctx, b, id, true)
		}
		return res, fmt.Errorf("%w: daytona run: no end of execution within %s", sandbox.ErrTimeout, timeout)
	case errors.Is(perr, errRetry):
		return res, perr
	case perr != nil:
		return res, p.gone(ctx, h, fmt.Errorf("daytona run: %w", perr))
	case derr != nil:
		return res, fmt.Errorf("daytona run: %w", derr)
	}
	return res, nil
}

// dial opens a WebSocket to path of the sandbox's toolbox, with the API key on the upgrade.
func (p *Provider) dial(ctx context.Context, b *box, path string) (*websocket.Conn, error) {
	u := b.toolbox + path
	switch {
	case strings.HasPrefix(u, "https://"):
		u = "wss://" + strings.TrimPrefix(u, "https://")
	case strings.HasPrefix(u, "http://"):
		u = "ws://" + strings.TrimPrefix(u, "http://")
	}
	hdr := http.Header{}
	p.headers(hdr)
	dctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	conn, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{HTTPClient: p.client, HTTPHeader: hdr})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			var raw []byte
			if resp.Body != nil {
				raw, _ = io.ReadAll(io.LimitReader(resp.Body, errBodyLimit))
			}
			e := toolboxError("connect", resp.StatusCode, raw, resp.Header)
			e.Message = scrub(e.Message, p.opts.APIKey)
			return nil, e
		}
		return nil, p.transportError(ctx, "connect", err)
	}
	return conn, nil
}

// pump reads the interpreter's messages until the run ends and writes them, as e2b's NDJSON
// lines, to w (sandbox.DecodeExecution reads them): stdout without the markers of cell.py, the
// markers as results, errors and the execution count, end_of_execution at "completed". It returns
// why the run ended when that is not "completed".
func pump(ctx context.Context, conn *websocket.Conn, nonce string, lost bool, w io.Writer) error {
	write := func(m sandbox.Message) error {
		line, err := json.Marshal(m)
		if err != nil {
			return err
		}
		_, err = w.Write(append(line, '\n'))
		return err
	}
	if lost {
		if err := write(sandbox.Message{Type: sandbox.MessageStderr, Text: lostNote}); err != nil {
			return err
		}
	}
	d := demux{token: "\x1e" + nonce + ":"}
	var werr error
	text := func(s string) {
		if werr == nil && s != "" {
			werr = write(sandbox.Message{Type: sandbox.MessageStdout, Text: s})
		}
	}
	marker := func(raw string) {
		if werr == nil {
			if m, ok := markerMessage(raw); ok {
				werr = write(m)
			}
		}
	}
	received := false
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			d.flush(text)
			if werr != nil {
				return werr
			}
			return readEnd(ctx, err, received)
		}
		received = true
		if typ != websocket.MessageText || !gjson.ValidBytes(data) {
			continue
		}
		m := gjson.ParseBytes(data)
		switch m.Get("type").String() {
		case "stdout":
			d.feed(m.Get("text").String(), text, marker)
		case "stderr":
			d.flushText(text)
			if werr == nil {
				werr = write(sandbox.Message{Type: sandbox.MessageStderr, Text: m.Get("text").String()})
			}
		case "error":
			d.flushText(text)
			if werr == nil {
				werr = write(sandbox.Message{Type: sandbox.MessageError, ExecError: sandbox.ExecError{
					Name: m.Get("name").String(), Value: m.Get("value").String(), Traceback: m.Get("traceback").String()}})
			}
		case "control":
			d.flush(text)
			if werr != nil {
				return werr
			}
			if m.Get("text").String() == "completed" {
				_ = conn.Close(websocket.StatusNormalClosure, "")
				return write(sandbox.Message{Type: sandbox.MessageEndOfExecution})
			}
			// "interrupted": the close code says why.
		}
		if werr != nil {
			return werr
		}
	}
}

// readEnd says why the interpreter's stream ended before "completed".
func readEnd(ctx context.Context, err error, received bool) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", context.Cause(ctx), err)
	}
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		switch {
		case ce.Code == closeTimeout:
			return fmt.Errorf("%w: the daemon ended the run at its timeout", sandbox.ErrTimeout)
		case ce.Code == websocket.StatusPolicyViolation && !received &&
			(strings.Contains(ce.Reason, "context not found") || strings.Contains(ce.Reason, "not active")):
			return fmt.Errorf("%w: %s", errRetry, ce.Reason)
		case ce.Code == websocket.StatusNormalClosure:
			return fmt.Errorf("%w: the interpreter closed the stream before the run completed", sandbox.ErrIncomplete)
		}
		return fmt.Errorf("%w: the interpreter closed the stream (%d %s)", sandbox.ErrUnavailable, ce.Code, ce.Reason)
	}
	return fmt.Errorf("%w: %w", sandbox.ErrIncomplete, err)
}

// markerMessage decodes one marker of cell.py.
func markerMessage(raw string) (sandbox.Message, bool) {
	if !gjson.Valid(raw) {
		return sandbox.Message{}, false
	}
	m := gjson.Parse(raw)
	switch {
	case m.Get("n").Exists():
		return sandbox.Message{Type: sandbox.MessageNumberOfExecutions, ExecutionCount: int(m.Get("n").Int())}, true
	case m.Get("text").Exists():
		return sandbox.Message{Type: sandbox.MessageResult, Output: sandbox.Output{Text: m.Get("text").String(), IsMainResult: true}}, true
	case m.Get("png").Exists():
		return sandbox.Message{Type: sandbox.MessageResult, Output: sandbox.Output{PNG: m.Get("png").String()}}, true
	case m.Get("error").Exists():
		e := m.Get("error")
		return sandbox.Message{Type: sandbox.MessageError, ExecError: sandbox.ExecError{
			Name: e.Get("name").String(), Value: e.Get("value").String(), Traceback: e.Get("traceback").String()}}, true
	}
	return sandbox.Message{}, false
}

// demux takes the marker lines of cell.py out of stdout, which arrives in pieces cut anywhere:
// text goes on at once, except a tail that may begin a marker; a marker goes on once its line has
// ended. A marker longer than markerLimit is dropped.
type demux struct {
	token   string
	pend    strings.Builder
	inMark  bool
	dropped bool
}

func (d *demux) feed(s string, text, marker func(string)) {
	for s != "" {
		if d.inMark {
			i := strings.IndexByte(s, '\n')
			if i < 0 {
				if !d.dropped && d.pend.Len()+len(s) <= markerLimit {
					d.pend.WriteString(s)
				} else {
					d.dropped = true
					d.pend.Reset()
				}
				return
			}
			if !d.dropped {
				d.pend.WriteString(s[:i])
				marker(d.pend.String())
			}
			d.pend.Reset()
			d.inMark, d.dropped = false, false
			s = s[i+1:]
			continue
		}
		buf := d.pend.String() + s
		d.pend.Reset()
		if i := strings.Index(buf, d.token); i >= 0 {
			text(buf[:i])
			d.inMark = true
			s = buf[i+len(d.token):]
			continue
		}
		// Hold back the longest tail that could begin the token.
		keep := 0
		for k := min(len(d.token)-1, len(buf)); k > 0; k-- {
			if strings.HasPrefix(d.token, buf[len(buf)-k:]) {
				keep = k
				break
			}
		}
		text(buf[:len(buf)-keep])
		d.pend.WriteString(buf[len(buf)-keep:])
		return
	}
}

// flushText hands on the text held back, unless a marker is under way.
func (d *demux) flushText(text func(string)) {
	if !d.inMark {
		text(d.pend.String())
		d.pend.Reset()
	}
}

// flush hands on what is held back as text (a marker cut off is dropped).
func (d *demux) flush(text func(string)) {
	if !d.inMark {
		text(d.pend.String())
	}
	d.pend.Reset()
	d.inMark, d.dropped = false, false
}
