package local

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

var _ sandbox.Shell = (*Provider)(nil)

// shellRequest asks the kernel to run a command beside it (kernel.py's _run_shell).
type shellRequest struct {
	ID      int64    `json:"id"`
	Shell   string   `json:"shell"`
	Env     []string `json:"env"`     // name, value, name, value...
	Timeout float64  `json:"timeout"` // seconds; the kernel's keeper kills the command then
}

// shellLine is one message of a shell execution: shell_stdout / shell_stderr (Text), shell_exit
// (ExitCode, TimedOut) and end_of_execution. Anything else on the channel (output of a
// background thread of the kernel's code) is not the command's and is dropped.
type shellLine struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	ExitCode int    `json:"exit_code"`
	TimedOut bool   `json:"timed_out"`
}

// shellBackstop is how long after its timeout a command may take to be reported ended by the
// kernel before the proxy interrupts it itself (a kernel that does not answer).
const shellBackstop = 5 * time.Second

// Exec implements sandbox.Shell. The command runs as a request to the sandbox's kernel, which
// forks it off (so the command has the kernel's namespaces, uid, cgroup, limits and seccomp
// filter, and none of its Python state), so it is serialized with the sandbox's code executions
// and thaws the sandbox like one. The kernel enforces the timeout; ctx ending interrupts the
// request the way Run's does, which kills the command and everything it started, and Exec
// returns once that is done.
func (p *Provider) Exec(ctx context.Context, h sandbox.Handle, command string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	b, err := p.lookup(h)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.opts.ExecTimeout
	}
	ex, pr, err := b.admit(ctx, h)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	defer func() { <-b.sem }()
	req := shellRequest{ID: ex.id, Shell: command, Env: sandboxEnv(b.p.opts.HostPaths), Timeout: math.Max(timeout.Seconds(), 0.001)}
	if err := b.send(req); err != nil {
		b.kill("request could not be sent")
		return sandbox.ExecResult{}, fmt.Errorf("%w: local sandbox %s: %w", sandbox.ErrNotFound, h.ID, err)
	}
	watched := make(chan struct{})
	var backstop bool
	if !p.track(func() {
		defer close(watched)
		backstop = p.watchShell(ctx, b, ex, pr, timeout+shellBackstop)
	}) {
		pr.CloseWithError(errStopped)
		return sandbox.ExecResult{}, fmt.Errorf("%w: %w", sandbox.ErrNotFound, errClosed)
	}

	res, ended, err := decodeShell(pr, opts.OnOutput)
	pr.CloseWithError(errStopped) // the reader drops whatever follows
	<-watched                     // the command is over, or the sandbox is being killed
	if b.killReason() != "" {
		<-b.done
	}
	switch {
	case ctx.Err() != nil && !ended:
		return res, ctx.Err()
	case ended:
		return res, nil
	case backstop:
		res.TimedOut = true
		return res, fmt.Errorf("%w: the kernel did not end the command %s after its timeout: %s", sandbox.ErrIncomplete, shellBackstop, b.killReason())
	case b.dead() || b.killReason() != "":
		return res, fmt.Errorf("%w: local sandbox %s stopped during the command: %s", sandbox.ErrNotFound, h.ID, b.killReason())
	}
	return res, fmt.Errorf("%w: %w", sandbox.ErrIncomplete, err)
}

// watchShell bounds one command as watch bounds a code execution, except that the timeout is
// the kernel's to enforce: after is only a backstop. When ctx ends the command is interrupted
// and watchShell returns once it has ended (or the sandbox was killed for not ending it). It
// reports whether the backstop fired.
func (p *Provider) watchShell(ctx context.Context, b *box, ex *execution, pr *io.PipeReader, after time.Duration) bool {
	timer := time.NewTimer(after)
	defer timer.Stop()
	select {
	case <-ex.ended:
		return false
	case <-b.done:
		pr.CloseWithError(errStopped)
		return false
	case <-timer.C:
		p.interrupt(b, ex)
		pr.CloseWithError(errStopped)
		return true
	case <-ctx.Done():
		pr.CloseWithError(ctx.Err())
		p.interrupt(b, ex)
		return false
	}
}

// decodeShell reads a shell execution's lines up to end_of_execution, handing output to onOutput
// as it comes. ended reports that shell_exit and end_of_execution both arrived.
func decodeShell(r io.Reader, onOutput func(sandbox.Stream, string)) (res sandbox.ExecResult, ended bool, err error) {
	br := bufio.NewReaderSize(r, 64<<10)
	exited := false
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 && err == nil {
			var m shellLine
			if jerr := json.Unmarshal(line, &m); jerr != nil {
				return res, false, fmt.Errorf("local sandbox: shell stream: %w", jerr)
			}
			switch m.Type {
			case "shell_stdout", "shell_stderr":
				if onOutput != nil && m.Text != "" {
					s := sandbox.Stdout
					if m.Type == "shell_stderr" {
						s = sandbox.Stderr
					}
					onOutput(s, m.Text)
				}
			case "shell_exit":
				res.ExitCode, res.TimedOut, exited = m.ExitCode, m.TimedOut, true
			case "end_of_execution":
				if !exited {
					return res, false, errors.New("local sandbox: the command's end was not reported")
				}
				return res, true, nil
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return res, false, err
		}
	}
}
