package opensandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

var _ sandbox.Shell = (*Provider)(nil)

// commandRequest is the body of POST /command; timeout is in milliseconds.
type commandRequest struct {
	Command string `json:"command"`
	Cwd     string `json:"cwd"`
	Timeout int64  `json:"timeout"`
}

// Exec implements sandbox.Shell with execd's POST /command: bash -c command in /mnt/data, in a
// process group of its own that execd kills at the timeout. execd sends the output line by line
// without the line ends; each line is passed on with a "\n" (an empty line comes as "\n" alone), so
// a last line the command left unterminated gains one. The command ends at the error event (an exit
// status other than 0) or execution_complete; when ctx ends first the command is interrupted
// (DELETE /command: SIGTERM, then SIGKILL).
func (p *Provider) Exec(ctx context.Context, h sandbox.Handle, command string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.opts.RunTimeout
	}
	// execd's access token is in the sandbox's environment, which commands inherit: not theirs.
	body, err := json.Marshal(commandRequest{Command: "unset EXECD_ACCESS_TOKEN; " + command, Cwd: sandbox.DataDir, Timeout: max(timeout.Milliseconds(), 1)})
	if err != nil {
		return sandbox.ExecResult{}, fmt.Errorf("opensandbox exec: %w", err)
	}
	// A little later than execd's own deadline, so that its kill is reported before the cut.
	reqCtx, cancel := context.WithTimeout(ctx, timeout+5*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := p.execd(reqCtx, h, "exec", http.MethodPost, "/command", bytes.NewReader(body), "application/json")
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	defer resp.Body.Close()
	tr := newTranslator(resp.Body)
	id := ""
	for {
		line, tooLong, rerr := tr.line()
		if tooLong {
			return sandbox.ExecResult{}, p.execEnd(ctx, h, id, fmt.Errorf("%w: opensandbox exec: an event of more than %d bytes", sandbox.ErrIncomplete, maxEventLine))
		}
		line = bytes.TrimSpace(line)
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			line = bytes.TrimSpace(d)
		} else if sseField.Match(line) {
			line = nil
		}
		if len(line) > 0 {
			if !gjson.ValidBytes(line) || line[0] != '{' {
				return sandbox.ExecResult{}, p.execEnd(ctx, h, id, fmt.Errorf("%w: opensandbox exec: a line that is not a JSON object", sandbox.ErrIncomplete))
			}
			ev := gjson.ParseBytes(line)
			switch ev.Get("type").String() {
			case "":
				return sandbox.ExecResult{}, p.execEnd(ctx, h, id, fmt.Errorf("%w: opensandbox exec: execd ended the stream with an error: %.300s", sandbox.ErrIncomplete, ev.Get("message").String()))
			case "init":
				id = ev.Get("text").String()
			case "stdout", "stderr":
				text := ev.Get("text").String()
				if text != "\n" {
					text += "\n"
				}
				if opts.OnOutput != nil {
					s := sandbox.Stdout
					if ev.Get("type").String() == "stderr" {
						s = sandbox.Stderr
					}
					opts.OnOutput(s, text)
				}
			case "execution_complete":
				return sandbox.ExecResult{}, nil
			case "error":
				return exitStatus(ev.Get("error"), time.Since(start) >= timeout), nil
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				rerr = errors.New("the stream ended without the command's end")
			}
			return sandbox.ExecResult{}, p.execEnd(ctx, h, id, fmt.Errorf("%w: opensandbox exec: %w", sandbox.ErrIncomplete, rerr))
		}
	}
}

// execEnd interrupts the command when the caller left (execd also kills a foreground command whose
// client went away) and returns the caller's error then, else err.
func (p *Provider) execEnd(ctx context.Context, h sandbox.Handle, id string, err error) error {
	if ctx.Err() == nil {
		return err
	}
	if id != "" {
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), interruptTimeout)
		defer cancel()
		_, _ = p.execdJSON(ictx, h, "interrupt", http.MethodDelete, "/command?"+url.Values{"id": {id}}.Encode(), nil)
	}
	return fmt.Errorf("opensandbox exec: %w", context.Cause(ctx))
}

// exitStatus reads a command's error event: evalue is the exit code, -1 for a command a signal
// ended (its traceback "signal: killed"), which is 128 plus the signal as a shell reports it, or
// the timeout when it had passed.
func exitStatus(e gjson.Result, pastTimeout bool) sandbox.ExecResult {
	code, err := strconv.Atoi(strings.TrimSpace(e.Get("evalue").String()))
	if err != nil {
		code = 1
	}
	if code >= 0 {
		return sandbox.ExecResult{ExitCode: code}
	}
	if pastTimeout {
		return sandbox.ExecResult{TimedOut: true}
	}
	name, _ := strings.CutPrefix(e.Get("traceback.0").String(), "signal: ")
	for sig := syscall.Signal(1); sig < 32; sig++ {
		if sig.String() == name {
			return sandbox.ExecResult{ExitCode: 128 + int(sig)}
		}
	}
	return sandbox.ExecResult{ExitCode: 128 + int(syscall.SIGKILL)}
}
