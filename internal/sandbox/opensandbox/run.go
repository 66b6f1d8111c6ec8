package opensandbox

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// preparePy registers the figure hook in a new code context (see the file).
//
//go:embed prepare.py
var preparePy string

// The markers prepare.py's hook prints on stdout.
const (
	figureBegin = "\x1e\x1fciproxy-figure "
	figureEnd   = "\x1e\n"
	doneMarker  = "\x1e\x1fciproxy-done\x1e\n"
	markerStart = "\x1e\x1f"
)

// maxEventLine bounds one SSE line: an event holding a result as large as the output cap, and
// room for its JSON. A longer line is skipped unread.
const maxEventLine = sandbox.DefaultOutputLimit + 1<<20

// busyRetry is how long a run waits before it asks again a context still busy with an earlier run.
const busyRetry = 100 * time.Millisecond

// busy reports whether err is execd's "session is busy".
func busy(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.StatusCode == http.StatusInternalServerError && strings.Contains(e.Message, "session is busy")
}

// kernelLost is the note a run whose kernel died gets on stderr.
const kernelLost = "[the Python kernel died and was restarted: the state of earlier executions is lost]\n"

// runRequest is the body of POST /code. context.language is always sent: without it execd runs the
// code as a shell command, whatever the id.
type runRequest struct {
	Code    string     `json:"code"`
	Context runContext `json:"context"`
}

type runContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
}

// lock returns the mutex that serialises runs in h's context.
func (p *Provider) lock(h sandbox.Handle) *sync.Mutex {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, ok := p.runLocks[h.ID]
	if !ok {
		m = &sync.Mutex{}
		p.runLocks[h.ID] = m
	}
	return m
}

// Run executes code in the sandbox's Python context and assembles its Result from execd's event
// stream, message by message as the events arrive. The run ends at execution_complete (execd may
// keep the stream open after it); at the timeout or when ctx ends, the kernel is interrupted.
func (p *Provider) Run(ctx context.Context, h sandbox.Handle, code string, opts sandbox.RunOptions) (sandbox.Result, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.opts.RunTimeout
	}
	m := p.lock(h)
	m.Lock()
	defer m.Unlock()
	res, lost, err := p.run(ctx, h, code, timeout, opts.OnMessage)
	if err == nil && lost {
		// The kernel restarted without the hook: register it again.
		if perr := p.prepareContext(ctx, h); perr != nil {
			p.log.Warn("opensandbox: preparing a restarted kernel failed")
		}
	}
	return res, err
}

// prepareContext runs prepare.py in h's context, which must report its end marker.
func (p *Provider) prepareContext(ctx context.Context, h sandbox.Handle) error {
	res, lost, err := p.run(ctx, h, preparePy, p.opts.RequestTimeout, nil)
	switch {
	case err != nil:
		return fmt.Errorf("opensandbox: preparing the Python context: %w", err)
	case res.Error != nil:
		return fmt.Errorf("%w: opensandbox: preparing the Python context: %s: %s", sandbox.ErrUnavailable, res.Error.Name, res.Error.Value)
	case lost:
		return fmt.Errorf("%w: opensandbox: preparing the Python context: the post_execute hook did not run (not an IPython kernel?)", sandbox.ErrUnavailable)
	}
	return nil
}

// run is one POST /code to its end; lost reports a run that completed without the hook's marker.
func (p *Provider) run(ctx context.Context, h sandbox.Handle, code string, timeout time.Duration, onMessage func(sandbox.Message)) (sandbox.Result, bool, error) {
	runCtx, cancel := context.WithTimeoutCause(ctx, timeout, sandbox.ErrTimeout)
	defer cancel()
	body, err := json.Marshal(runRequest{Code: code, Context: runContext{ID: h.TrafficToken, Language: "python"}})
	if err != nil {
		return sandbox.Result{}, false, fmt.Errorf("opensandbox run: %w", err)
	}
	resp, err := p.execd(runCtx, h, "run", http.MethodPost, "/code", bytes.NewReader(body), "application/json")
	for busy(err) && runCtx.Err() == nil {
		// Runs are serialised here, so a busy context is one still stopping an interrupted run.
		if sleep(runCtx, busyRetry) != nil {
			break
		}
		resp, err = p.execd(runCtx, h, "run", http.MethodPost, "/code", bytes.NewReader(body), "application/json")
	}
	if err != nil {
		var apiErr *APIError
		if errors.As(err, &apiErr) && strings.Contains(apiErr.Message, "context not found") {
			// The sandbox answers but its context is gone: nothing of it can be run again.
			apiErr.kind = sandbox.ErrNotFound
		}
		return sandbox.Result{}, false, p.runError(ctx, runCtx, h, timeout, err)
	}
	defer resp.Body.Close()
	tr := newTranslator(resp.Body)
	res, err := sandbox.DecodeExecution(tr, 0, onMessage)
	if err != nil {
		if tr.err != nil && !errors.Is(err, tr.err) {
			err = fmt.Errorf("%w (%w)", err, tr.err)
		}
		return res, false, p.runError(ctx, runCtx, h, timeout, fmt.Errorf("opensandbox run: %w", err))
	}
	return res, !tr.done, nil
}

// runError turns a failure once the execution's deadline passed into ErrTimeout and one caused by
// the caller's cancellation into the caller's error, interrupting the kernel in both cases (execd
// has no timeout of its own); other errors pass unchanged.
func (p *Provider) runError(parent, runCtx context.Context, h sandbox.Handle, timeout time.Duration, err error) error {
	if parent.Err() == nil && !errors.Is(context.Cause(runCtx), sandbox.ErrTimeout) {
		return err
	}
	ictx, cancel := context.WithTimeout(context.WithoutCancel(parent), interruptTimeout)
	defer cancel()
	if _, ierr := p.execdJSON(ictx, h, "interrupt", http.MethodDelete, "/code?"+url.Values{"id": {h.TrafficToken}}.Encode(), nil); ierr != nil {
		p.log.Debug("opensandbox: interrupting a run failed")
	}
	if parent.Err() != nil {
		return fmt.Errorf("opensandbox run: %w", context.Cause(parent))
	}
	return fmt.Errorf("%w: opensandbox run: no execution_complete within %s", sandbox.ErrTimeout, timeout)
}

// translator reads execd's event stream and yields the NDJSON stream sandbox.DecodeExecution
// reads: stdout, stderr, result, error, number_of_executions and, for execution_complete,
// end_of_execution, after which it ends. Figures the hook printed on stdout become results.
type translator struct {
	br    *bufio.Reader
	out   bytes.Buffer
	ended bool
	// err is what ended the stream when it is not the events' doing: a read error, an error
	// object execd appended, an event that does not parse.
	err error
	// done: the hook's end marker was seen.
	done bool
	// held is stdout text that may be the start of a marker, kept until the marker ends or turns
	// out not to be one.
	held strings.Builder
	over bool // held grew past the output cap: the figure is dropped
}

func newTranslator(r io.Reader) *translator {
	return &translator{br: bufio.NewReaderSize(r, 16<<10)}
}

func (t *translator) Read(b []byte) (int, error) {
	for t.out.Len() == 0 {
		if t.ended {
			return 0, io.EOF
		}
		if err := t.next(); err != nil {
			t.ended = true
			t.err = err
			if t.out.Len() == 0 {
				return 0, err
			}
		}
	}
	return t.out.Read(b)
}

// line reads one line of at most maxEventLine bytes; a longer one is skipped (tooLong).
func (t *translator) line() (line []byte, tooLong bool, err error) {
	var buf []byte
	for {
		frag, err := t.br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(frag) > maxEventLine {
				tooLong, buf = true, nil
			} else {
				buf = append(buf, frag...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(buf, "\r\n"), tooLong, err
	}
}

// sseField matches the SSE lines that carry no event: event:, id:, retry:, comments.
var sseField = regexp.MustCompile(`^(event|id|retry)(:|$)|^:`)

// next reads lines until one event was translated or the stream ended.
func (t *translator) next() error {
	for {
		line, tooLong, err := t.line()
		if tooLong {
			return fmt.Errorf("%w: an event of more than %d bytes", sandbox.ErrIncomplete, maxEventLine)
		}
		line = bytes.TrimSpace(line)
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			line = bytes.TrimSpace(d)
		} else if sseField.Match(line) {
			line = nil
		}
		if len(line) > 0 {
			if perr := t.event(line); perr != nil {
				if err != nil && !errors.Is(err, io.EOF) {
					return fmt.Errorf("%w: %w", sandbox.ErrIncomplete, err)
				}
				return perr
			}
			if t.out.Len() > 0 || t.ended {
				return nil
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return io.EOF
			}
			return fmt.Errorf("%w: %w", sandbox.ErrIncomplete, err)
		}
	}
}

// event translates one event object.
func (t *translator) event(raw []byte) error {
	if !gjson.ValidBytes(raw) || raw[0] != '{' {
		return fmt.Errorf("%w: the stream holds a line that is not a JSON object: %.80q", sandbox.ErrIncomplete, raw)
	}
	ev := gjson.ParseBytes(raw)
	typ := ev.Get("type").String()
	switch typ {
	case "":
		// An error after the first event is appended to the stream as a bare {"code","message"}.
		return fmt.Errorf("%w: execd ended the stream with an error: %s: %.300s", sandbox.ErrIncomplete,
			ev.Get("code").String(), ev.Get("message").String())
	case "stdout":
		t.stdout(ev.Get("text").String())
	case "stderr":
		t.emit(sandbox.Message{Type: sandbox.MessageStderr, Text: ev.Get("text").String()})
	case "execution_count":
		t.emit(sandbox.Message{Type: sandbox.MessageNumberOfExecutions, ExecutionCount: int(ev.Get("execution_count").Int())})
	case "result":
		t.emit(sandbox.Message{Type: sandbox.MessageResult, Output: output(ev.Get("results"))})
	case "error":
		e := ev.Get("error")
		var tb []string
		for _, l := range e.Get("traceback").Array() {
			tb = append(tb, stripANSI(l.String()))
		}
		t.emit(sandbox.Message{Type: sandbox.MessageError, ExecError: sandbox.ExecError{
			Name: e.Get("ename").String(), Value: e.Get("evalue").String(), Traceback: strings.Join(tb, "\n")}})
	case "execution_complete":
		t.flushHeld()
		if !t.done {
			t.emit(sandbox.Message{Type: sandbox.MessageStderr, Text: kernelLost})
		}
		t.emit(sandbox.Message{Type: sandbox.MessageEndOfExecution})
		t.ended = true
	}
	return nil
}

// stdout passes text on, holding what may be a marker and turning figures into results.
func (t *translator) stdout(text string) {
	for text != "" {
		if t.held.Len() == 0 {
			i := strings.Index(text, markerStart[:1])
			if i < 0 {
				t.emit(sandbox.Message{Type: sandbox.MessageStdout, Text: text})
				return
			}
			if i > 0 {
				t.emit(sandbox.Message{Type: sandbox.MessageStdout, Text: text[:i]})
			}
			text = text[i:]
		}
		// Held: the text is at a possible marker.
		need := 0
		t.held.WriteString(text)
		text = ""
		h := t.held.String()
		switch {
		case strings.HasPrefix(h, doneMarker):
			t.done = true
			need = len(doneMarker)
		case len(h) < len(doneMarker) && strings.HasPrefix(doneMarker, h):
			return // more may come
		case strings.HasPrefix(h, figureBegin):
			j := strings.Index(h[len(figureBegin):], figureEnd)
			if j < 0 {
				if t.held.Len() > sandbox.DefaultOutputLimit {
					t.over = true
				}
				return
			}
			if !t.over {
				t.emit(sandbox.Message{Type: sandbox.MessageResult, Output: sandbox.Output{PNG: h[len(figureBegin) : len(figureBegin)+j]}})
			}
			need = len(figureBegin) + j + len(figureEnd)
		case len(h) < len(figureBegin) && strings.HasPrefix(figureBegin, h):
			return
		default:
			// Not a marker: its first byte is plain output.
			t.held.Reset()
			t.emit(sandbox.Message{Type: sandbox.MessageStdout, Text: h[:1]})
			text = h[1:]
			continue
		}
		t.held.Reset()
		t.over = false
		text = h[need:]
	}
}

// flushHeld passes on held text that never became a marker.
func (t *translator) flushHeld() {
	if t.held.Len() > 0 && !t.over {
		t.emit(sandbox.Message{Type: sandbox.MessageStdout, Text: t.held.String()})
	}
	t.held.Reset()
}

func (t *translator) emit(m sandbox.Message) {
	b, err := m.MarshalJSON()
	if err != nil {
		return
	}
	t.out.Write(b)
	t.out.WriteByte('\n')
}

// output turns execd's results bundle ("text" for text/plain, other MIME types as Jupyter's) into
// an Output.
func output(r gjson.Result) sandbox.Output {
	o := sandbox.Output{IsMainResult: true}
	r.ForEach(func(k, v gjson.Result) bool {
		switch k.String() {
		case "text", "text/plain":
			o.Text = v.String()
		case "text/html":
			o.HTML = v.String()
		case "text/markdown":
			o.Markdown = v.String()
		case "image/svg+xml":
			o.SVG = v.String()
		case "image/png":
			o.PNG = v.String()
		case "image/jpeg":
			o.JPEG = v.String()
		case "application/pdf":
			o.PDF = v.String()
		case "text/latex":
			o.LaTeX = v.String()
		case "application/json":
			o.JSON = json.RawMessage(v.Raw)
		case "application/javascript":
			o.JavaScript = v.String()
		}
		return true
	})
	return o
}

// ansi matches the escape sequences of IPython's coloured tracebacks.
var ansi = regexp.MustCompile("\x1b\\[[0-9;]*[A-Za-z]")

func stripANSI(s string) string { return ansi.ReplaceAllString(s, "") }
