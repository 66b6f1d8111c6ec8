package e2b

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

var _ sandbox.Shell = (*Provider)(nil)

// Connect's envelope flags (docs/wire-e2b.md): a message, or the end of the stream.
const (
	envelopeEndStream = 0x02
	// envelopeLimit bounds one envelope of a Start stream (envd's data events hold at most 32 KiB).
	envelopeLimit = 4 << 20
	// killTimeout bounds the calls that kill a command whose caller went away.
	killTimeout = 10 * time.Second
)

// startRequest is envd's StartRequest. Tag (field 3 of StartRequest, not of ProcessConfig) names
// the process for a ProcessSelector before its pid is known.
type startRequest struct {
	Process processConfig `json:"process"`
	Tag     string        `json:"tag,omitempty"`
	Stdin   bool          `json:"stdin"`
}

// processList is envd's ListResponse, as far as the client reads it.
type processList struct {
	Processes []struct {
		PID uint32  `json:"pid"`
		Tag *string `json:"tag"`
	} `json:"processes"`
}

type processConfig struct {
	Cmd  string   `json:"cmd"`
	Args []string `json:"args"`
	Cwd  string   `json:"cwd,omitempty"`
}

// processEvent is one StartResponse's event: start, data, end or keepalive.
type processEvent struct {
	Event struct {
		Start *struct {
			PID uint32 `json:"pid"`
		} `json:"start"`
		Data *struct {
			Stdout []byte `json:"stdout"`
			Stderr []byte `json:"stderr"`
		} `json:"data"`
		End *struct {
			ExitCode int    `json:"exitCode"`
			Exited   bool   `json:"exited"`
			Status   string `json:"status"`
		} `json:"end"`
	} `json:"event"`
}

// endStream is the last envelope of a stream: {} or a Connect error.
type endStream struct {
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// Exec implements sandbox.Shell with envd's process service: one Start of /bin/bash -c command
// in /mnt/data with stdin closed and no envs of ours, its deadline the command's timeout (envd
// kills the process at it and ends the stream with deadline_exceeded), and a tag of its own. envd
// does not kill a process whose client left, so when ctx ends Exec kills it: SendSignal SIGKILL,
// and the command's process group with a second Start. When ctx ends before the start event
// brought the pid, the tag finds the process (killTagged).
func (p *Provider) Exec(ctx context.Context, h sandbox.Handle, command string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.opts.RunTimeout
	}
	tag := processTag()
	var pid uint32
	var sent atomic.Bool
	res, err := p.start(ctx, h, command, tag, timeout, func(started uint32) { pid = started }, opts.OnOutput, &sent)
	if ctx.Err() != nil {
		switch {
		case pid != 0:
			p.killProcess(h, pid)
		case sent.Load():
			p.killTagged(h, tag)
		}
	}
	return res, err
}

// processTag is a Start's tag: unique, so that a selector by tag names that process alone.
func processTag() string { return "ciproxy-" + randomSuffix() + randomSuffix() }

// start runs one Start call to its end.
// sent becomes true once a connection to envd was had for the request, from when the process may
// exist in envd.
func (p *Provider) start(ctx context.Context, h sandbox.Handle, command, tag string, timeout time.Duration, onStart func(uint32), onOutput func(sandbox.Stream, string), sent *atomic.Bool) (sandbox.ExecResult, error) {
	msg, err := json.Marshal(startRequest{Process: processConfig{Cmd: "/bin/bash", Args: []string{"-c", command}, Cwd: sandbox.DataDir}, Tag: tag})
	if err != nil {
		return sandbox.ExecResult{}, fmt.Errorf("e2b exec: %w", err)
	}
	body := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(body[1:], uint32(len(msg)))
	body = append(body, msg...)
	// The client's deadline is a little later than envd's, so that envd's deadline_exceeded
	// arrives before the connection is cut.
	reqCtx, cancel := context.WithTimeout(ctx, timeout+5*time.Second)
	defer cancel()
	if sent != nil {
		// From the connection on, the request may reach envd (WroteRequest can come after Do
		// returned on a cancellation): the process may exist, under its tag.
		reqCtx = httptrace.WithClientTrace(reqCtx, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { sent.Store(true) }})
	}
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, p.dataURL(h, EnvdPort, "/process.Process/Start"), bytes.NewReader(body))
	if err != nil {
		return sandbox.ExecResult{}, fmt.Errorf("%w: e2b exec: %w", sandbox.ErrUnavailable, err)
	}
	p.envdHeaders(req, h)
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Connect-Timeout-Ms", strconv.FormatInt(max(timeout.Milliseconds(), 1), 10))
	req.Header.Set("Keepalive-Ping-Interval", "50")
	resp, err := p.client.Do(req)
	if err != nil {
		return sandbox.ExecResult{}, p.execError(ctx, reqCtx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return sandbox.ExecResult{}, p.envdStatusError("exec", resp)
	}
	var res sandbox.ExecResult
	var out, errs sandbox.UTF8Decoder
	ended := false
	for {
		flags, payload, err := readEnvelope(resp.Body)
		if err != nil {
			return res, p.execError(ctx, reqCtx, fmt.Errorf("%w: e2b exec: the stream ended without its end: %w", sandbox.ErrIncomplete, err))
		}
		if flags&envelopeEndStream != 0 {
			var end endStream
			if err := json.Unmarshal(payload, &end); err != nil {
				return res, fmt.Errorf("%w: e2b exec: the end of the stream: %w", sandbox.ErrUnavailable, err)
			}
			switch {
			case end.Error == nil && ended:
				return res, nil
			case end.Error == nil:
				return res, fmt.Errorf("%w: e2b exec: the stream ended without the process's end", sandbox.ErrIncomplete)
			case end.Error.Code == "deadline_exceeded":
				flushUTF8(&out, &errs, onOutput)
				return sandbox.ExecResult{TimedOut: true}, nil
			case end.Error.Code == "not_found" || end.Error.Code == "unavailable":
				return res, fmt.Errorf("%w: e2b exec: %s: %s", sandbox.ErrNotFound, end.Error.Code, end.Error.Message)
			}
			return res, fmt.Errorf("%w: e2b exec: %s: %s", sandbox.ErrUnavailable, end.Error.Code, end.Error.Message)
		}
		var ev processEvent
		if err := json.Unmarshal(payload, &ev); err != nil {
			return res, fmt.Errorf("%w: e2b exec: an event: %w", sandbox.ErrUnavailable, err)
		}
		switch e := ev.Event; {
		case e.Start != nil:
			onStart(e.Start.PID)
		case e.Data != nil:
			if len(e.Data.Stdout) > 0 {
				emit(onOutput, sandbox.Stdout, out.Decode(e.Data.Stdout))
			}
			if len(e.Data.Stderr) > 0 {
				emit(onOutput, sandbox.Stderr, errs.Decode(e.Data.Stderr))
			}
		case e.End != nil:
			flushUTF8(&out, &errs, onOutput)
			res.ExitCode, ended = exitCode(e.End.ExitCode, e.End.Exited, e.End.Status), true
		}
	}
}

// exitCode is a shell's status for envd's end event: the exit code, or 128 plus the signal for
// a process a signal ended (exitCode -1, status "signal: killed").
func exitCode(code int, exited bool, status string) int {
	if exited || code >= 0 {
		return code
	}
	name, ok := strings.CutPrefix(status, "signal: ")
	if !ok {
		return code
	}
	for n, s := range signalNames {
		if s == name {
			return 128 + n
		}
	}
	return 128 + 9
}

// signalNames are the strings Go's syscall.Signal gives on Linux, which envd's status carries.
var signalNames = map[int]string{
	1: "hangup", 2: "interrupt", 3: "quit", 4: "illegal instruction", 5: "trace/breakpoint trap",
	6: "aborted", 7: "bus error", 8: "floating point exception", 9: "killed", 10: "user defined signal 1",
	11: "segmentation fault", 12: "user defined signal 2", 13: "broken pipe", 14: "alarm clock", 15: "terminated",
}

func emit(onOutput func(sandbox.Stream, string), s sandbox.Stream, text string) {
	if onOutput != nil && text != "" {
		onOutput(s, text)
	}
}

func flushUTF8(out, errs *sandbox.UTF8Decoder, onOutput func(sandbox.Stream, string)) {
	emit(onOutput, sandbox.Stdout, out.Flush())
	emit(onOutput, sandbox.Stderr, errs.Flush())
}

// execError is a failed Start exchange: the caller's cancellation stays itself.
func (p *Provider) execError(ctx, reqCtx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("e2b exec: %w", ctx.Err())
	}
	if reqCtx.Err() != nil {
		return fmt.Errorf("%w: e2b exec: no end of the command from envd: %w", sandbox.ErrIncomplete, err)
	}
	if errors.Is(err, sandbox.ErrIncomplete) {
		return err
	}
	return fmt.Errorf("%w: e2b exec: %w", sandbox.ErrUnavailable, err)
}

// killProcess kills a command whose caller went away, with a context of its own. envd's
// SendSignal reaches the process alone, and the command's process is not a group leader, so a
// second Start first stops the whole tree below it (breadth first, through /proc's children
// lists, each process stopped before its children are read, so none forks away meanwhile) and
// kills it; SendSignal SIGKILL then ends the command's own process, as envd knows it. A sandbox
// that runs one command at a time (the emulator) starts the second one only once the first has
// ended: SendSignal goes out after killTreeWait regardless.
func (p *Provider) killProcess(h sandbox.Handle, pid uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	treeDone := make(chan struct{})
	go func() {
		defer close(treeDone)
		_, _ = p.start(ctx, h, fmt.Sprintf(killTree, pid), processTag(), killTimeout, func(uint32) {}, nil, nil)
	}()
	t := time.NewTimer(killTreeWait)
	select {
	case <-treeDone:
	case <-t.C:
	}
	t.Stop()
	sig := map[string]any{"process": map[string]uint32{"pid": pid}, "signal": "SIGNAL_SIGKILL"}
	_ = p.rpc(ctx, h, "exec kill", "process.Process/SendSignal", sig, nil)
	<-treeDone
}

// killTagged kills a command whose caller went away before its start event: its pid is not
// known, its tag is. envd's List gives the pid of the process with that tag, which killProcess
// then kills with its tree. envd registers a process before it sends the start event, but the
// Start may still be on its way: List is asked again until tagWait passes. SendSignal by tag
// is the last resort only (List failed, or never showed the tag): envd's selection by tag stops
// at the first tagged process whose tag differs (docs/wire-e2b.md), so with other tagged processes
// running it may answer not_found for a process that exists.
func (p *Provider) killTagged(h sandbox.Handle, tag string) {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	deadline := time.Now().Add(tagWait)
	for {
		var list processList
		if err := p.rpc(ctx, h, "exec list", "process.Process/List", struct{}{}, &list); err != nil {
			break
		}
		for _, proc := range list.Processes {
			if proc.Tag != nil && *proc.Tag == tag {
				p.killProcess(h, proc.PID)
				return
			}
		}
		if time.Now().After(deadline) {
			break
		}
		t := time.NewTimer(tagPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	sig := map[string]any{"process": map[string]string{"tag": tag}, "signal": "SIGNAL_SIGKILL"}
	_ = p.rpc(ctx, h, "exec kill", "process.Process/SendSignal", sig, nil)
}

// tagWait is how long killTagged looks for a process that envd may not have started yet, tagPoll
// how often.
const (
	tagWait = 2 * time.Second
	tagPoll = 100 * time.Millisecond
)

// killTreeWait is how long killProcess waits for the tree to be killed before it kills the
// command's process.
const killTreeWait = time.Second

// killTree is the script that kills every process below pid %[1]d, and its group if it leads one.
const killTree = `all=; q=%[1]d
while [ -n "$q" ]; do
  n=
  for x in $q; do
    kill -STOP $x 2>/dev/null && all="$all $x" && n="$n $(cat /proc/$x/task/*/children 2>/dev/null)"
  done
  q=$n
done
kill -KILL -- -%[1]d 2>/dev/null
[ -n "$all" ] && kill -KILL $all 2>/dev/null
true`

// readEnvelope reads one Connect envelope: a flags byte, a big-endian length, the message.
func readEnvelope(r io.Reader) (byte, []byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n > envelopeLimit {
		return 0, nil, fmt.Errorf("an envelope of %d bytes", n)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, err
	}
	return head[0], payload, nil
}
