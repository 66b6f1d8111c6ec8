package agentsandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox/processv1"
)

// started is a process Start began: its stream, its id, and the way to end it.
type started struct {
	c      processv1.ProcessServiceClient
	stream processv1.ProcessService_StartClient
	pid    int32
	cancel context.CancelFunc
}

// start runs cfg with sandboxd's Start and reads its init event. The stream is not bound to ctx
// (the caller interrupts before it cuts); s.cancel ends it.
func (p *Provider) start(ctx context.Context, h sandbox.Handle, op string, cfg *processv1.ProcessConfig) (*started, error) {
	c, err := p.process(h)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel) // until init: the caller's end is the stream's
	stream, err := c.Start(sctx, &processv1.StartRequest{Config: cfg})
	var first *processv1.StartResponse
	if err == nil {
		first, err = stream.Recv()
	}
	stop()
	if err == nil && first.GetInit() == nil {
		err = fmt.Errorf("the stream began without an init event")
	}
	if err != nil {
		cancel()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("agent_sandbox %s: %w", op, context.Cause(ctx))
		}
		return nil, p.grpcError(ctx, h, op, err)
	}
	return &started{c: c, stream: stream, pid: first.GetInit().GetProcessId(), cancel: cancel}, nil
}

// stdin writes b, then the end of stdin, to the process.
func (s *started) stdin(ctx context.Context, b []byte) error {
	ctx, cancel := context.WithTimeout(ctx, signalTimeout)
	defer cancel()
	if len(b) > 0 {
		if _, err := s.c.WriteStdin(ctx, &processv1.WriteStdinRequest{ProcessId: s.pid, Payload: &processv1.WriteStdinRequest_Input{Input: b}}); err != nil {
			return err
		}
	}
	_, err := s.c.WriteStdin(ctx, &processv1.WriteStdinRequest{ProcessId: s.pid, Payload: &processv1.WriteStdinRequest_Eof{Eof: &emptypb.Empty{}}})
	if len(b) == 0 && status.Code(err) == codes.NotFound {
		// A command that reads no stdin may have exited, and sandboxd forgotten it (it does once
		// Start has sent the exit), before the end of its stdin arrives: there was nothing left
		// to close, and its output and exit are on the stream.
		return nil
	}
	return err
}

// signal sends sig to the process's group, even once the caller's ctx has ended.
func (s *started) signal(ctx context.Context, sig processv1.Signal) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), signalTimeout)
	defer cancel()
	_, _ = s.c.SendSignal(ctx, &processv1.SendSignalRequest{ProcessId: s.pid, Signal: sig})
}

// grpcError maps a failed call to sandboxd: the sandbox found gone is ErrNotFound, throttling
// ErrRateLimited, anything else ErrUnavailable.
func (p *Provider) grpcError(ctx context.Context, h sandbox.Handle, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("agent_sandbox %s: %w", op, context.Cause(ctx))
	}
	if p.gone(ctx, h) {
		return fmt.Errorf("%w: agent_sandbox %s: the sandbox is gone (claim %s): %w", sandbox.ErrNotFound, op, h.ID, err)
	}
	if status.Code(err) == codes.ResourceExhausted {
		return fmt.Errorf("%w: agent_sandbox %s: %w", sandbox.ErrRateLimited, op, err)
	}
	return fmt.Errorf("%w: agent_sandbox %s: %w", sandbox.ErrUnavailable, op, err)
}

// Run implements [sandbox.Provider.Run] through the session to h's kernel daemon: the request as
// one line on the relay's stdin, its stdout the kernel's NDJSON, decoded as it arrives. When ctx
// ends or the timeout passes, the relay gets SIGINT (it asks the daemon to interrupt the kernel);
// if the execution has not ended interruptGrace later, the session is cut (the daemon then
// interrupts it too) and the next execution starts a new one.
func (p *Provider) Run(ctx context.Context, h sandbox.Handle, code string, opts sandbox.RunOptions) (sandbox.Result, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.opts.RunTimeout
	}
	req, err := json.Marshal(map[string]string{"code": code})
	if err != nil {
		return sandbox.Result{}, err
	}
	req = append(req, '\n')
	var sess *session
	for attempt := 0; sess == nil; attempt++ {
		s, err := p.session(ctx, h)
		if err != nil {
			return sandbox.Result{}, err
		}
		select {
		case s.turn <- struct{}{}:
		case <-ctx.Done():
			return sandbox.Result{}, fmt.Errorf("agent_sandbox run: %w", context.Cause(ctx))
		}
		if err = s.err(); err == nil {
			wctx, cancel := context.WithTimeout(ctx, signalTimeout)
			_, err = s.s.c.WriteStdin(wctx, &processv1.WriteStdinRequest{ProcessId: s.s.pid, Payload: &processv1.WriteStdinRequest_Input{Input: req}})
			cancel()
		}
		if err != nil {
			<-s.turn
			p.endSession(h, s)
			if attempt == 0 && ctx.Err() == nil {
				continue // the request never reached that relay (an idle stream cut): a new one takes it
			}
			return sandbox.Result{}, p.grpcError(ctx, h, "run", err)
		}
		sess = s
	}
	defer func() { <-sess.turn }()
	done := make(chan struct{})
	timedOut := make(chan struct{})
	var watcher sync.WaitGroup
	watcher.Add(1)
	go func() {
		defer watcher.Done()
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		select {
		case <-done:
			return
		case <-ctx.Done():
		case <-timer.C:
			close(timedOut)
		}
		sess.s.signal(ctx, processv1.Signal_SIGNAL_SIGINT)
		grace := time.NewTimer(interruptGrace)
		defer grace.Stop()
		select {
		case <-done:
		case <-grace.C:
			p.endSession(h, sess)
		}
	}()
	res, derr := sandbox.DecodeExecution(sess.out, 0, opts.OnMessage)
	close(done)
	// A SIGINT sent as the execution ended reaches the relay before the next request does, and
	// interrupts nothing: the next execution waits for it.
	watcher.Wait()
	if derr != nil {
		p.endSession(h, sess)
	}
	select {
	case <-timedOut:
		return res, fmt.Errorf("%w: agent_sandbox run: no end within %s (the kernel was interrupted)", sandbox.ErrTimeout, timeout)
	default:
	}
	if ctx.Err() != nil {
		return res, fmt.Errorf("agent_sandbox run: %w", context.Cause(ctx))
	}
	if derr == nil {
		return res, nil
	}
	if p.gone(ctx, h) {
		return res, fmt.Errorf("%w: agent_sandbox run: the sandbox is gone (claim %s)", sandbox.ErrNotFound, h.ID)
	}
	if !errors.Is(derr, sandbox.ErrIncomplete) {
		derr = fmt.Errorf("%w: %w", sandbox.ErrIncomplete, derr)
	}
	return res, fmt.Errorf("agent_sandbox run: %w: %.300s", derr, sess.why())
}

// Exec implements [sandbox.Shell]: bash -c command in /mnt/data with stdin closed, its output
// streamed as it comes. sandboxd reports a process a signal ended as -1, so the command runs
// under a bash of its own that exits with the shell's status (shellWrapper). At the timeout
// the process group is killed (SIGKILL) and the result says TimedOut; when ctx ends it is killed
// too.
func (p *Provider) Exec(ctx context.Context, h sandbox.Handle, command string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.opts.RunTimeout
	}
	cwd := sandbox.DataDir
	s, err := p.start(ctx, h, "exec", &processv1.ProcessConfig{
		Command: []string{"/bin/bash", "-c", shellWrapper, "bash", command},
		Cwd:     &cwd,
	})
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	defer s.cancel()
	if err := s.stdin(ctx, nil); err != nil {
		return sandbox.ExecResult{}, p.grpcError(ctx, h, "exec", err)
	}
	type event struct {
		ev  *processv1.StartResponse
		err error
	}
	events := make(chan event)
	go func() {
		for {
			ev, err := s.stream.Recv()
			select {
			case events <- event{ev, err}:
			case <-s.stream.Context().Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var out, errOut sandbox.UTF8Decoder
	emit := func(st sandbox.Stream, u *sandbox.UTF8Decoder, b []byte) {
		if t := u.Decode(b); t != "" && opts.OnOutput != nil {
			opts.OnOutput(st, t)
		}
	}
	flush := func() {
		if t := out.Flush(); t != "" && opts.OnOutput != nil {
			opts.OnOutput(sandbox.Stdout, t)
		}
		if t := errOut.Flush(); t != "" && opts.OnOutput != nil {
			opts.OnOutput(sandbox.Stderr, t)
		}
	}
	timedOut, cancelled := false, false
	var cut <-chan time.Time
	for {
		select {
		case <-timer.C:
			timedOut = true
			s.signal(ctx, processv1.Signal_SIGNAL_SIGKILL)
			cut = time.After(interruptGrace)
			continue
		case <-ctx.Done():
			if !cancelled {
				cancelled = true
				s.signal(ctx, processv1.Signal_SIGNAL_SIGKILL)
				s.cancel()
			}
			return sandbox.ExecResult{}, fmt.Errorf("agent_sandbox exec: %w", context.Cause(ctx))
		case <-cut:
			flush()
			return sandbox.ExecResult{TimedOut: true}, nil
		case e := <-events:
			if e.err != nil {
				flush()
				if timedOut {
					return sandbox.ExecResult{TimedOut: true}, nil
				}
				return sandbox.ExecResult{}, p.grpcError(ctx, h, "exec", fmt.Errorf("the stream ended without the command's exit: %w", e.err))
			}
			switch ev := e.ev.GetEvent().(type) {
			case *processv1.StartResponse_Stdout:
				emit(sandbox.Stdout, &out, ev.Stdout)
			case *processv1.StartResponse_Stderr:
				emit(sandbox.Stderr, &errOut, ev.Stderr)
			case *processv1.StartResponse_Exit:
				flush()
				if timedOut {
					return sandbox.ExecResult{TimedOut: true}, nil
				}
				code := int(ev.Exit.GetExitCode())
				if code < 0 {
					code = 128 + int(syscall.SIGKILL) // the wrapper itself was killed
				}
				return sandbox.ExecResult{ExitCode: code}, nil
			}
		}
	}
}

// shellWrapper runs the command ($1) under a bash that reports a signal's death as 128 plus the
// signal, with its own stderr (where it would say "Terminated") on /dev/null, and that then ends
// what the command left running in its process group (sandboxd starts each process in a group of
// its own): SIGTERM to the group, which the wrapper alone ignores. A process that left the group
// (setsid) is not reached.
const shellWrapper = "exec 3>&2 2>/dev/null\n/bin/bash -c \"$1\" 2>&3 3>&-\ns=$?\ntrap '' TERM\nkill -TERM 0\nexit $s"
