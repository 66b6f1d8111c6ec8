package daytona

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/coder/websocket"
	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

var _ sandbox.Shell = (*Provider)(nil)

// The markers of a session command's log stream: each chunk of stdout follows 01 01 01, each
// chunk of stderr 02 02 02.
var (
	stdoutMark = []byte{1, 1, 1}
	stderrMark = []byte{2, 2, 2}
)

// Exec implements sandbox.Shell with a toolbox session of its own: the command runs there as
// "timeout bash -c command" in /mnt/data with stdin from /dev/null, started asynchronously; its
// log streams over a WebSocket (stdout and stderr told apart by markers), and its exit code is
// read once the stream has ended. Daytona has no call to kill a command, so the session is
// deleted afterwards, which kills its shell; timeout(1) kills the command's process group at
// opts.Timeout (exit 124), and a caller that goes away has the session deleted at once.
func (p *Provider) Exec(ctx context.Context, h sandbox.Handle, command string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.opts.RunTimeout
	}
	b, err := p.lookup(ctx, h)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	sid := "ciproxy-" + randomHex(12)
	body, _ := json.Marshal(map[string]string{"sessionId": sid})
	if _, err := p.toolbox(ctx, b, "create session", http.MethodPost, "/process/session", body, ""); err != nil {
		return sandbox.ExecResult{}, p.gone(ctx, h, err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.RequestTimeout)
		defer cancel()
		_, _ = p.toolbox(cctx, b, "delete session", http.MethodDelete, "/process/session/"+url.PathEscape(sid), nil, "")
	}()
	line := "cd " + quote(sandbox.DataDir) + " && timeout -k 2 " + strconv.Itoa(seconds(timeout)) + " bash -c " + quote(command) + " </dev/null"
	body, _ = json.Marshal(map[string]any{"command": line, "runAsync": true})
	started := time.Now()
	raw, err := p.toolbox(ctx, b, "exec", http.MethodPost, "/process/session/"+url.PathEscape(sid)+"/exec", body, "")
	if err != nil {
		return sandbox.ExecResult{}, p.gone(ctx, h, err)
	}
	cmdID := gjson.GetBytes(raw, "cmdId").String()
	if cmdID == "" {
		return sandbox.ExecResult{}, fmt.Errorf("%w: daytona exec: the answer names no command", sandbox.ErrUnavailable)
	}
	cmdPath := "/process/session/" + url.PathEscape(sid) + "/command/" + url.PathEscape(cmdID)

	execCtx, cancel := context.WithTimeoutCause(ctx, timeout+runGrace, sandbox.ErrTimeout)
	defer cancel()
	if err := p.followLogs(execCtx, b, cmdPath+"/logs?follow=true", opts.OnOutput); err != nil {
		switch {
		case ctx.Err() != nil:
			return sandbox.ExecResult{}, fmt.Errorf("daytona exec: %w", context.Cause(ctx))
		case execCtx.Err() != nil:
			return sandbox.ExecResult{TimedOut: true}, nil
		}
		return sandbox.ExecResult{}, p.gone(ctx, h, fmt.Errorf("daytona exec: %w", err))
	}
	// The stream ends when the command has exited; its exit code may take a moment to be recorded.
	for wait := 20 * time.Millisecond; ; wait = min(wait*2, time.Second) {
		raw, err := p.toolbox(execCtx, b, "exec status", http.MethodGet, cmdPath, nil, "")
		if err != nil {
			if ctx.Err() != nil {
				return sandbox.ExecResult{}, fmt.Errorf("daytona exec: %w", context.Cause(ctx))
			}
			if execCtx.Err() != nil {
				return sandbox.ExecResult{TimedOut: true}, nil
			}
			return sandbox.ExecResult{}, p.gone(ctx, h, err)
		}
		if code := gjson.GetBytes(raw, "exitCode"); code.Exists() && code.Type == gjson.Number {
			res := sandbox.ExecResult{ExitCode: int(code.Int())}
			if res.ExitCode == 124 && time.Since(started) >= timeout {
				res.TimedOut = true
			}
			return res, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-execCtx.Done():
			t.Stop()
			if ctx.Err() != nil {
				return sandbox.ExecResult{}, fmt.Errorf("daytona exec: %w", context.Cause(ctx))
			}
			return sandbox.ExecResult{TimedOut: true}, nil
		case <-t.C:
		}
	}
}

// followLogs reads a command's log stream to its end, handing each stream's text to onOutput.
func (p *Provider) followLogs(ctx context.Context, b *box, path string, onOutput func(sandbox.Stream, string)) error {
	conn, err := p.dial(ctx, b, path)
	if err != nil {
		return err
	}
	defer conn.CloseNow()
	conn.SetReadLimit(frameLimit)
	var lg logDemux
	var streams [2]sandbox.UTF8Decoder
	emit := func(s sandbox.Stream, data []byte) {
		if text := streams[s].Decode(data); text != "" && onOutput != nil {
			onOutput(s, text)
		}
	}
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			lg.flush(emit)
			for s := range streams {
				if text := streams[s].Flush(); text != "" && onOutput != nil {
					onOutput(sandbox.Stream(s), text)
				}
			}
			var ce websocket.CloseError
			if errors.As(err, &ce) && ce.Code == websocket.StatusNormalClosure {
				return nil
			}
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return fmt.Errorf("%w: the log stream broke: %w", sandbox.ErrIncomplete, err)
		}
		lg.feed(data, emit)
	}
}

// logDemux splits a session's log into its streams; a marker may be cut between frames.
type logDemux struct {
	cur  sandbox.Stream
	pend []byte
}

func (d *logDemux) feed(data []byte, emit func(sandbox.Stream, []byte)) {
	buf := append(d.pend, data...)
	d.pend = nil
	for len(buf) > 0 {
		i, j := bytes.Index(buf, stdoutMark), bytes.Index(buf, stderrMark)
		next, mark := -1, sandbox.Stdout
		switch {
		case i >= 0 && (j < 0 || i < j):
			next = i
		case j >= 0:
			next, mark = j, sandbox.Stderr
		}
		if next < 0 {
			// Hold back a tail that may begin a marker.
			keep := 0
			for k := min(2, len(buf)); k > 0; k-- {
				tail := buf[len(buf)-k:]
				if bytes.HasPrefix(stdoutMark, tail) || bytes.HasPrefix(stderrMark, tail) {
					keep = k
					break
				}
			}
			if len(buf) > keep {
				emit(d.cur, buf[:len(buf)-keep])
			}
			d.pend = append([]byte(nil), buf[len(buf)-keep:]...)
			return
		}
		if next > 0 {
			emit(d.cur, buf[:next])
		}
		d.cur = mark
		buf = buf[next+3:]
	}
}

func (d *logDemux) flush(emit func(sandbox.Stream, []byte)) {
	if len(d.pend) > 0 {
		emit(d.cur, d.pend)
		d.pend = nil
	}
}
