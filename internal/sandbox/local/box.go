package local

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// startTimeout bounds a kernel's start, imports included.
const startTimeout = 60 * time.Second

var (
	readyLine = []byte(`{"type": "ready"}` + "\n")
	endLine   = []byte(`{"type": "end_of_execution"}` + "\n")
)

// box is one running sandbox: a bubblewrap process tree with the kernel inside.
type box struct {
	id, dir string
	memory  int64
	cmd     *exec.Cmd

	stdinMu sync.Mutex
	stdin   io.WriteCloser

	// sem serializes executions. execs hands the next execution to the reader, which takes it
	// only once the previous one has reached end_of_execution.
	sem   chan struct{}
	execs chan *execution
	seq   atomic.Int64

	ready     chan struct{}
	readyOnce sync.Once
	// done is closed when bubblewrap has exited and the kernel's output has reached EOF, that is
	// when nothing of the sandbox runs any more.
	done chan struct{}

	killOnce sync.Once
	reason   atomic.Pointer[string] // why the sandbox was killed
	fallback atomic.Pointer[time.Timer]
	stderr   headBuffer
}

// execution is one Run as the reader sees it: its lines go to pw until end_of_execution.
type execution struct {
	id    int64
	pw    *io.PipeWriter
	ended chan struct{}
}

// start launches a sandbox with the given address-space limit and waits until its kernel is ready.
func (p *Provider) start(ctx context.Context, mem int64) (*box, error) {
	id := newID()
	dir := filepath.Join(p.base, id)
	if err := makeDataDir(dir, p.cred); err != nil {
		return nil, fmt.Errorf("local sandbox: working directory: %w", err)
	}
	cfg := kernelConfig{
		Memory: mem, Processes: p.opts.MaxProcesses, FileSize: p.opts.MaxFileSize, Preload: preload,
	}
	// /tmp is a tmpfs, so its content costs memory: bounded by the same limit.
	args := bwrapArgs(p.base, dir, p.opts.Python, mem, kernelArgv(p.opts.Python, cfg))
	cmd := exec.Command(p.bwrap, args...)
	cmd.Env = []string{} // not even bubblewrap sees the proxy's environment
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: p.cred}
	cmd.WaitDelay = time.Second
	b := &box{
		id: id, dir: dir, memory: mem, cmd: cmd,
		sem: make(chan struct{}, 1), execs: make(chan *execution, 1),
		ready: make(chan struct{}), done: make(chan struct{}),
	}
	cmd.Stderr = &b.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("local sandbox: %w", err)
	}
	b.stdin = stdin
	r, w, err := os.Pipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("local sandbox: %w", err)
	}
	cmd.Stdout = w
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		r.Close()
		w.Close()
		os.RemoveAll(dir)
		return nil, errClosed
	}
	p.wg.Add(2) // under mu: see track
	p.mu.Unlock()
	if err := cmd.Start(); err != nil {
		p.wg.Add(-2)
		r.Close()
		w.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("local sandbox: starting bubblewrap: %w", err)
	}
	w.Close()
	readerDone := make(chan struct{})
	go func() {
		defer p.wg.Done()
		defer close(readerDone)
		b.read(r)
	}()
	go func() {
		defer p.wg.Done()
		b.cmd.Wait()
		<-readerDone
		close(b.done)
		if t := b.fallback.Load(); t != nil {
			t.Stop()
		}
	}()
	t := time.NewTimer(startTimeout)
	defer t.Stop()
	select {
	case <-b.ready:
		return b, nil
	case <-b.done:
		os.RemoveAll(dir)
		return nil, fmt.Errorf("local sandbox: kernel exited at start: %s", bytes.TrimSpace(b.stderr.Bytes()))
	case <-ctx.Done():
		p.destroy(b)
		return nil, ctx.Err()
	case <-t.C:
		p.destroy(b)
		return nil, fmt.Errorf("local sandbox: kernel not ready after %s", startTimeout)
	}
}

// read forwards the kernel's NDJSON lines to the current execution until EOF.
func (b *box) read(r *os.File) {
	defer r.Close()
	br := bufio.NewReaderSize(r, 64<<10)
	var cur *execution
	discard := false
	atStart := true
	for {
		piece, err := br.ReadSlice('\n')
		if len(piece) > 0 {
			lineStart := atStart
			whole := lineStart && err == nil
			atStart = err == nil
			switch {
			case whole && bytes.Equal(piece, readyLine):
				b.readyOnce.Do(func() { close(b.ready) })
				continue
			case lineStart && cur == nil:
				// A new line: the execution registered last gets it. Lines with none (output of a
				// background process between executions) are dropped.
				select {
				case cur = <-b.execs:
					discard = false
				default:
				}
			}
			if cur != nil && !discard {
				if _, werr := cur.pw.Write(piece); werr != nil {
					discard = true // the caller stopped reading; drain to end_of_execution
				}
			}
			if whole && cur != nil && bytes.Equal(piece, endLine) {
				cur.pw.Close()
				close(cur.ended)
				cur = nil
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			break
		}
	}
	if cur != nil {
		cur.pw.CloseWithError(errStopped)
	}
}

func (b *box) dead() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// kill stops the whole sandbox. The sandbox's init (bubblewrap's child, PID 1 of the sandbox)
// is killed first: the kernel then kills every process of the PID namespace, and the outer
// bubblewrap reaps its child and exits. Killing the outer one first would leave the init to be
// reparented to the host's PID 1, a zombie wherever that does not reap (a proxy running as PID 1
// of a container). The process group is killed anyway if the sandbox is not gone shortly after.
func (b *box) kill(reason string) {
	b.killOnce.Do(func() {
		b.reason.Store(&reason)
		if b.dead() {
			return
		}
		pid := b.cmd.Process.Pid
		children := childPIDs(pid)
		for _, c := range children {
			syscall.Kill(c, syscall.SIGKILL)
		}
		if len(children) == 0 {
			syscall.Kill(-pid, syscall.SIGKILL)
			return
		}
		t := time.AfterFunc(2*time.Second, func() {
			if !b.dead() {
				syscall.Kill(-pid, syscall.SIGKILL)
			}
		})
		b.fallback.Store(t)
	})
}

// childPIDs lists the children of pid (Linux /proc/PID/task/TID/children).
func childPIDs(pid int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func (b *box) killReason() string {
	if r := b.reason.Load(); r != nil {
		return *r
	}
	return ""
}

// sendTimeout bounds writing one request to the kernel.
const sendTimeout = 10 * time.Second

// send writes one request line to the kernel.
func (b *box) send(v any) error {
	line, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b.stdinMu.Lock()
	defer b.stdinMu.Unlock()
	// A kernel that stops reading its requests (the code replaced the reader) would block the
	// write, and with it Run and interrupt: kill the sandbox, which makes the write fail.
	t := time.AfterFunc(sendTimeout, func() { b.kill("the kernel stopped reading its requests; the sandbox was stopped") })
	defer t.Stop()
	_, err = b.stdin.Write(append(line, '\n'))
	return err
}

type runRequest struct {
	ID   int64  `json:"id"`
	Code string `json:"code"`
}

type interruptRequest struct {
	ID        int64 `json:"id"`
	Interrupt bool  `json:"interrupt"`
}

// Run executes code in the sandbox's kernel. On timeout the kernel is interrupted
// (KeyboardInterrupt; state survives) and, if the code does not stop within a grace period, the
// sandbox is killed; either way the error wraps sandbox.ErrTimeout. When ctx ends, Run returns at
// once and the execution is interrupted the same way in the background.
func (p *Provider) Run(ctx context.Context, h sandbox.Handle, code string, opts sandbox.RunOptions) (sandbox.Result, error) {
	b, err := p.lookup(h)
	if err != nil {
		return sandbox.Result{}, err
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.opts.ExecTimeout
	}
	select {
	case b.sem <- struct{}{}:
	case <-b.done:
		return sandbox.Result{}, fmt.Errorf("%w: local sandbox %s", sandbox.ErrNotFound, h.ID)
	case <-ctx.Done():
		return sandbox.Result{}, ctx.Err()
	}
	defer func() { <-b.sem }()

	pr, pw := io.Pipe()
	ex := &execution{id: b.seq.Add(1), pw: pw, ended: make(chan struct{})}
	select {
	case b.execs <- ex:
	case <-b.done:
		return sandbox.Result{}, fmt.Errorf("%w: local sandbox %s", sandbox.ErrNotFound, h.ID)
	case <-ctx.Done():
		return sandbox.Result{}, ctx.Err()
	}
	// From here the request must go out: the reader will hand the next lines to ex.
	if err := b.send(runRequest{ID: ex.id, Code: code}); err != nil {
		b.kill("request could not be sent")
		return sandbox.Result{}, fmt.Errorf("%w: local sandbox %s: %w", sandbox.ErrNotFound, h.ID, err)
	}

	var timedOut atomic.Bool
	if !p.track(func() { p.watch(ctx, b, ex, pr, timeout, &timedOut) }) {
		pr.CloseWithError(errStopped) // Close is killing the sandbox
		return sandbox.Result{}, fmt.Errorf("%w: %w", sandbox.ErrNotFound, errClosed)
	}

	res, err := sandbox.DecodeExecution(pr, 0, opts.OnMessage)
	// The decoder may stop before the kernel's real end of execution (a line the code forged on
	// the protocol channel, or one that does not parse): the reader must not block on the pipe.
	// It then drops the rest of this execution; watch still bounds it with the timeout.
	pr.CloseWithError(errStopped)
	if b.killReason() != "" {
		<-b.done // a killed sandbox is gone before Run reports it
	}
	switch {
	case timedOut.Load():
		return res, fmt.Errorf("%w after %s", sandbox.ErrTimeout, timeout)
	case ctx.Err() != nil && err != nil:
		return res, ctx.Err()
	case b.killReason() != "":
		return res, fmt.Errorf("%w: %s", sandbox.ErrIncomplete, b.killReason())
	case err != nil:
		return res, err
	}
	if over, size := p.diskOver(b); over {
		b.kill(fmt.Sprintf("the working directory grew to %d bytes, over the %d-byte limit; the sandbox was stopped", size, p.opts.MaxDiskSize))
		<-b.done
		return res, fmt.Errorf("%w: %s", sandbox.ErrIncomplete, b.killReason())
	}
	return res, nil
}

// watch bounds one execution: the timeout, ctx, the working-directory size, and the sandbox dying.
func (p *Provider) watch(ctx context.Context, b *box, ex *execution, pr *io.PipeReader, timeout time.Duration, timedOut *atomic.Bool) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	disk := time.NewTicker(p.diskEvery)
	defer disk.Stop()
	for {
		select {
		case <-ex.ended:
			return
		case <-b.done:
			pr.CloseWithError(errStopped)
			return
		case <-disk.C:
			if over, size := p.diskOver(b); over {
				b.kill(fmt.Sprintf("the working directory grew to %d bytes, over the %d-byte limit; the sandbox was stopped", size, p.opts.MaxDiskSize))
			}
		case <-timer.C:
			select {
			case <-ex.ended:
				return
			default:
			}
			timedOut.Store(true)
			p.interrupt(b, ex)
			// A kernel that never answered this execution leaves the reader no line to close
			// the pipe with: close it when the sandbox is gone.
			select {
			case <-ex.ended:
			case <-b.done:
				pr.CloseWithError(errStopped)
			}
			return
		case <-ctx.Done():
			pr.CloseWithError(ctx.Err())
			p.interrupt(b, ex)
			return
		}
	}
}

// interrupt sends KeyboardInterrupt to the execution and kills the sandbox when the execution has
// not ended within the grace period (the code ignores SIGINT or is stuck in C).
func (p *Provider) interrupt(b *box, ex *execution) {
	if err := b.send(interruptRequest{ID: ex.id, Interrupt: true}); err != nil {
		b.kill("interrupt could not be sent")
		return
	}
	t := time.NewTimer(p.grace)
	defer t.Stop()
	select {
	case <-ex.ended:
	case <-b.done:
	case <-t.C:
		b.kill(fmt.Sprintf("the execution did not stop within %s of an interrupt; the sandbox was stopped", p.grace))
	}
}

// minEntrySize is what one directory entry counts for at least in the disk limit.
const minEntrySize = 4096

// diskOver reports whether the sandbox's working directory uses more than MaxDiskSize, and the
// usage counted so far (the walk stops as soon as the limit is passed).
func (p *Provider) diskOver(b *box) (bool, int64) {
	var used int64
	over := errors.New("over")
	err := filepath.WalkDir(b.dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		// Every entry counts at least one block, so that a flood of empty files (inodes) is
		// limited too.
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			used += max(st.Blocks*512, minEntrySize)
		} else {
			used += max(info.Size(), minEntrySize)
		}
		if used > p.opts.MaxDiskSize {
			return over
		}
		return nil
	})
	return errors.Is(err, over), used
}

// headBuffer keeps the first 8 KiB written to it (bubblewrap's own errors come first).
type headBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (h *headBuffer) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if room := 8<<10 - h.buf.Len(); room > 0 {
		h.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (h *headBuffer) Bytes() []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	return bytes.Clone(h.buf.Bytes())
}
