package local

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/ciproxy/ciproxy/internal/egress"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// startTimeout bounds a kernel's start, imports included.
const startTimeout = 60 * time.Second

// startWait is how long a kernel or the zygote may take to start: startTimeout unless a test says.
func (p *Provider) startWait() time.Duration {
	if p.knobs.startTimeout > 0 {
		return p.knobs.startTimeout
	}
	return startTimeout
}

var (
	readyLine = []byte(`{"type": "ready"}` + "\n")
	endLine   = []byte(`{"type": "end_of_execution"}` + "\n")
)

// box is one running sandbox: an init (pid 1 of the sandbox's pid namespace) and the kernel
// below it, forked by the zygote.
type box struct {
	id     string
	memory int64
	uid    uint32 // namespace uid in the zygote's user namespace (0: shared)
	pid    int    // the init's pid in the proxy's pid namespace
	pidfd  *os.File
	kernel *os.File      // pidfd of the kernel's template, which restarts the kernel (kernel.py's _template)
	setup  *net.UnixConn // lifeline: the init exits when it is closed
	cg     *sandboxCgroup
	p      *Provider

	// data is an O_PATH descriptor of the sandbox's /mnt/data (FileSystem); -1 once closed.
	dataMu sync.RWMutex
	data   int

	stdinMu sync.Mutex
	stdin   io.WriteCloser

	// sem serializes executions. execs hands the next execution to the reader, which takes it
	// only once the previous one has reached end_of_execution.
	sem   chan struct{}
	execs chan *execution
	seq   atomic.Int64

	ready     chan struct{}
	readyOnce sync.Once
	// restarted gets a value at each ready line after the first: a fresh kernel serves.
	restarted chan struct{}
	// done is closed when every process of the sandbox has exited and the kernel's output has
	// reached EOF, that is when nothing of the sandbox runs any more.
	done chan struct{}

	// egress is the listener of the sandbox's 127.0.0.1:egressPort (nil without an egress
	// server): unanswered until Create gives the box its container's policy (serveEgress).
	egressMu     sync.Mutex
	egress       net.Listener
	egressCancel context.CancelFunc
	egressDone   chan struct{}

	midLine atomic.Bool // the kernel's output ends in a partial line (for diagnostics)

	killOnce sync.Once
	reason   atomic.Pointer[string] // why the sandbox was killed
	oom      atomic.Bool            // the memory controller killed a process of it (set before done)
	copyOOM  atomic.Int64           // copy helpers (charge.go) it killed, which are not the sandbox's
	stderr   headBuffer

	// The sandbox is frozen whenever no execution is in progress (see freeze).
	freezeMu sync.Mutex
	active   int // executions sent and not yet ended
	frozen   bool
}

// execution is one Run as the reader sees it: its lines go to pw until end_of_execution.
type execution struct {
	id    int64
	pw    *io.PipeWriter
	ended chan struct{}
}

// start forks a sandbox with the given memory limit and waits until its kernel is ready. The
// new sandbox is frozen.
func (p *Provider) start(ctx context.Context, mem int64) (_ *box, err error) {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, errClosed
	}
	z, err := p.zygoteFor(ctx)
	if err != nil {
		return nil, err
	}
	uid, err := p.uids.take()
	if err != nil {
		return nil, fmt.Errorf("local sandbox: %w", err)
	}
	b := &box{
		id: newID(), memory: mem, uid: uid, data: -1, p: p,
		sem: make(chan struct{}, 1), execs: make(chan *execution, 1),
		ready: make(chan struct{}), restarted: make(chan struct{}, 1), done: make(chan struct{}),
	}
	var cleanup []func()
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()
	cleanup = append(cleanup, func() { p.uids.put(uid) })
	if p.cg != nil {
		// The init, the kernel's template and its shell server are processes of the sandbox too.
		cg, err := p.cg.create(b.id, cgroupSettings{memory: mem, processes: p.opts.MaxProcesses + 3, cpus: p.opts.CPULimit})
		if err != nil {
			return nil, fmt.Errorf("local sandbox: %w", err)
		}
		b.cg = cg
		cleanup = append(cleanup, cg.remove)
	}
	var pipes [6]*os.File // stdin r/w, stdout r/w, stderr r/w
	for i := 0; i < 6; i += 2 {
		if pipes[i], pipes[i+1], err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("local sandbox: %w", err)
		}
	}
	cleanup = append(cleanup, func() {
		for _, f := range pipes {
			f.Close()
		}
	})
	ours, theirs, err := socketPair()
	if err != nil {
		return nil, fmt.Errorf("local sandbox: %w", err)
	}
	req := spawnRequest{
		Memory: mem, Processes: p.opts.MaxProcesses, FileSize: p.opts.MaxFileSize,
		OpenFiles:  p.opts.MaxOpenFiles,
		DataSize:   p.opts.MaxDiskSize,
		DataInodes: inodesFor(p.opts.MaxDiskSize),
		// /tmp and /dev/shm are tmpfs, so their content costs memory (the cgroup counts it): half
		// the limit at most, so that a full /tmp is ENOSPC with memory left for the kernel.
		TmpSize: mem / 2, TmpInodes: inodesFor(mem / 2), ShmSize: min(shmSize, mem/4),
		Seccomp: !p.knobs.noSeccomp,
	}
	if p.egress != nil {
		req.EgressPort = egressPort
	}
	if p.perSandboxUIDs() {
		req.UID = p.uids.host(uid)
	}
	err = z.spawn(req, pipes[0], pipes[3], pipes[5], theirs)
	theirs.Close()
	pipes[0].Close()
	pipes[3].Close()
	pipes[5].Close()
	if err != nil {
		ours.Close()
		return nil, fmt.Errorf("local sandbox: asking the fork server: %w", err)
	}
	if b.setup, err = unixConn(ours); err != nil {
		return nil, fmt.Errorf("local sandbox: %w", err)
	}
	cleanup = append(cleanup, func() { b.setup.Close() })
	deadline := time.Now().Add(p.startWait())
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var extra []*os.File
	if b.pidfd, extra, err = readStarted(b.setup, deadline, "started", 1); err != nil {
		return nil, fmt.Errorf("local sandbox: starting a sandbox: %w", err)
	}
	if len(extra) > 0 {
		b.egress, err = net.FileListener(extra[0])
		extra[0].Close()
		if err != nil {
			b.pidfd.Close()
			return nil, fmt.Errorf("local sandbox: the egress listener: %w", err)
		}
		cleanup = append(cleanup, func() { b.egress.Close() })
	}
	cleanup = append(cleanup, func() {
		signalPidfd(b.pidfd, unix.SIGKILL)
		waitPidfd(b.pidfd)
		b.pidfd.Close()
	})
	if b.pid, err = pidfdPID(b.pidfd); err != nil {
		return nil, fmt.Errorf("local sandbox: %w", err)
	}
	if b.data, err = openDataDir(b.pid, b.pidfd); err != nil {
		return nil, fmt.Errorf("local sandbox: %w", err)
	}
	cleanup = append(cleanup, func() { unix.Close(b.data) })
	if b.cg != nil {
		if err := b.cg.place(b.pid); err != nil {
			return nil, fmt.Errorf("local sandbox: %w", err)
		}
	}
	if _, err := b.setup.Write([]byte("go")); err != nil {
		return nil, fmt.Errorf("local sandbox: %w", err)
	}
	if b.kernel, _, err = readStarted(b.setup, deadline, "kernel", 0); err != nil {
		return nil, fmt.Errorf("local sandbox: starting a sandbox: %w", err)
	}
	cleanup = append(cleanup, func() { b.kernel.Close() })
	b.stdin = pipes[1]
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errClosed
	}
	p.wg.Add(3) // under mu: see track
	p.mu.Unlock()
	cleanup = nil // from here the goroutines below own everything
	readerDone := make(chan struct{})
	go func() {
		defer p.wg.Done()
		defer close(readerDone)
		b.read(pipes[2])
	}()
	go func() {
		defer p.wg.Done()
		io.Copy(&b.stderr, pipes[4])
		pipes[4].Close()
	}()
	go func() {
		defer p.wg.Done()
		<-readerDone
		// The kernel's output ended: it exited, or closed its protocol. Either way the sandbox
		// is over; the init's exit takes every process of its pid namespace with it.
		signalPidfd(b.pidfd, unix.SIGKILL)
		if b.cg != nil {
			b.cg.kill()
		}
		waitPidfd(b.pidfd)
		b.dataMu.Lock()
		unix.Close(b.data)
		b.data = -1
		b.dataMu.Unlock()
		b.stdin.Close()
		b.setup.Close()
		b.pidfd.Close()
		b.kernel.Close()
		b.stopEgress()
		if b.cg != nil {
			b.oom.Store(b.cg.oomKills() > b.copyOOM.Load())
			b.cg.remove()
		}
		p.uids.put(b.uid)
		close(b.done)
		p.forget(b)
	}()
	t := time.NewTimer(p.startWait())
	defer t.Stop()
	select {
	case <-b.ready:
		b.finish() // frozen until its first execution
		return b, nil
	case <-b.done:
		return nil, fmt.Errorf("local sandbox: kernel exited at start: %s", b.startFailure())
	case <-ctx.Done():
		p.destroy(b)
		return nil, ctx.Err()
	case <-t.C:
		p.destroy(b)
		return nil, fmt.Errorf("local sandbox: kernel not ready after %s", p.startWait())
	}
}

// inodesFor is the inode count of a tmpfs of size bytes: one per 16 KiB, so that a flood of
// empty files meets the limit too.
func inodesFor(size int64) int64 { return max(1024, size/(16<<10)) }

// startFailure says why a kernel died before it was ready.
func (b *box) startFailure() string {
	msg := string(bytes.TrimSpace(b.stderr.Bytes()))
	if b.oom.Load() {
		return fmt.Sprintf("out of memory at %d bytes (%s)", b.memory, msg)
	}
	return msg
}

// openDataDir opens the sandbox's /mnt/data through its init's root, checking that the init is
// still the process the pidfd refers to (so that the pid was not reused in between).
func openDataDir(pid int, pidfd *os.File) (int, error) {
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("the sandbox's root: %w", err)
	}
	defer unix.Close(root)
	if err := signalPidfd(pidfd, 0); err != nil {
		return -1, fmt.Errorf("the sandbox's init: %w", err)
	}
	if _, err := pidfdPID(pidfd); err != nil {
		return -1, err
	}
	fd, err := unix.Openat2(root, "mnt/data", &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, fmt.Errorf("the sandbox's %s: %w", dataDir, err)
	}
	return fd, nil
}

// read forwards the kernel's NDJSON lines to the current execution until EOF.
func (b *box) read(r *os.File) {
	defer r.Close()
	br := bufio.NewReaderSize(r, 64<<10)
	var cur *execution
	discard := false
	atStart := true
	readied := false
	for {
		piece, err := br.ReadSlice('\n')
		if len(piece) > 0 {
			lineStart := atStart
			whole := lineStart && err == nil
			atStart = err == nil
			b.midLine.Store(!atStart)
			switch {
			case whole && bytes.Equal(piece, readyLine) && !readied:
				readied = true
				b.readyOnce.Do(func() { close(b.ready) })
				continue
			case whole && bytes.Equal(piece, readyLine):
				// A fresh kernel (RestartKernel, or the code signalled the template): an execution
				// that was running is over, with the kernel that ran it.
				if cur != nil {
					cur.pw.CloseWithError(errRestarted)
					close(cur.ended)
					cur = nil
					b.finish()
				}
				select {
				case b.restarted <- struct{}{}:
				default:
				}
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
				b.finish()
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

// kill stops the whole sandbox: the init is pid 1 of the sandbox's pid namespace, so its death
// takes every process of the sandbox with it, however it was forked.
func (b *box) kill(reason string) {
	b.killOnce.Do(func() {
		b.reason.Store(&reason)
		if b.dead() {
			return
		}
		signalPidfd(b.pidfd, unix.SIGKILL)
		if b.cg != nil {
			b.cg.kill() // thaws a v1-frozen cgroup; v2-frozen and stopped processes die as they are
		}
	})
}

// begin marks an execution as in progress, resuming the sandbox; finish marks its end, and the
// sandbox is frozen again once none is in progress. Between executions nothing of a sandbox may
// run, so that threads or processes a cell left behind burn no CPU until the next one.
func (b *box) begin() {
	b.freezeMu.Lock()
	b.active++
	b.setFrozen(false)
	b.freezeMu.Unlock()
}

func (b *box) finish() {
	b.freezeMu.Lock()
	if b.active > 0 {
		b.active--
	}
	if b.active == 0 {
		b.setFrozen(true)
	}
	b.freezeMu.Unlock()
}

// setFrozen freezes or thaws the sandbox: through its cgroup's freezer, or else by stopping and
// continuing each of its processes. b.freezeMu is held.
func (b *box) setFrozen(on bool) {
	if b.frozen == on || b.dead() {
		return
	}
	b.frozen = on
	if b.cg != nil && b.p.cg.canFreeze() && b.cg.freeze(on) == nil {
		return
	}
	sig := syscall.SIGCONT
	if on {
		sig = syscall.SIGSTOP
	}
	signalTree(b.pid, sig)
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

// admit takes the sandbox's one execution slot and hands the kernel's reader a new execution, whose
// lines come out of the returned pipe; the caller frees the slot (<-b.sem) once it is done. A
// sandbox found gone is ErrNotFound; ctx ending first is its error, and nothing is left taken.
func (b *box) admit(ctx context.Context, h sandbox.Handle) (ex *execution, pr *io.PipeReader, err error) {
	select {
	case b.sem <- struct{}{}:
	case <-b.done:
		return nil, nil, fmt.Errorf("%w: local sandbox %s", sandbox.ErrNotFound, h.ID)
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	pr, pw := io.Pipe()
	ex = &execution{id: b.seq.Add(1), pw: pw, ended: make(chan struct{})}
	b.begin()
	select {
	case b.execs <- ex:
		return ex, pr, nil
	case <-b.done:
		err = fmt.Errorf("%w: local sandbox %s", sandbox.ErrNotFound, h.ID)
	case <-ctx.Done():
		b.finish()
		err = ctx.Err()
	}
	<-b.sem
	return nil, nil, err
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
	ex, pr, err := b.admit(ctx, h)
	if err != nil {
		return sandbox.Result{}, err
	}
	defer func() { <-b.sem }()
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
	} else if err != nil && ctx.Err() == nil {
		// The stream broke: if the sandbox is dying, let it finish so that Run can say why.
		t := time.NewTimer(2 * time.Second)
		select {
		case <-b.done:
		case <-t.C:
		}
		t.Stop()
	}
	switch {
	case timedOut.Load():
		return res, fmt.Errorf("%w after %s", sandbox.ErrTimeout, timeout)
	case ctx.Err() != nil && err != nil:
		return res, ctx.Err()
	case b.killReason() != "":
		return res, fmt.Errorf("%w: %s", sandbox.ErrIncomplete, b.killReason())
	case b.oom.Load():
		return res, fmt.Errorf("%w: the sandbox ran out of memory (its limit is %d MiB) and was stopped", sandbox.ErrIncomplete, b.memory>>20)
	case err != nil:
		return res, err
	}
	return res, nil
}

// watch bounds one execution: the timeout, ctx, and the sandbox dying.
func (p *Provider) watch(ctx context.Context, b *box, ex *execution, pr *io.PipeReader, timeout time.Duration, timedOut *atomic.Bool) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case <-ex.ended:
			return
		case <-b.done:
			pr.CloseWithError(errStopped)
			return
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

// errRestarted is the cause given when the kernel restarts during an execution.
var errRestarted = errors.New("the kernel restarted during the execution")

// RestartKernel implements sandbox.KernelRestarter: it replaces the sandbox's kernel by a fresh
// one, which releases the memory of its Python state and of every process the code left, and
// keeps the sandbox: its files (/mnt/data, /tmp, /dev/shm), uid and cgroup. It waits for a
// running execution to end first. A kernel that does not come back kills the sandbox.
func (p *Provider) RestartKernel(ctx context.Context, h sandbox.Handle) error {
	b, err := p.lookup(h)
	if err != nil {
		return err
	}
	select {
	case b.sem <- struct{}{}:
	case <-b.done:
		return fmt.Errorf("%w: local sandbox %s", sandbox.ErrNotFound, h.ID)
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-b.sem }()
	select {
	case <-b.restarted: // a restart nobody waited for (the code's own)
	default:
	}
	b.begin() // a frozen template would not take the signal
	defer b.finish()
	if err := signalPidfd(b.kernel, unix.SIGUSR1); err != nil {
		b.kill("the kernel could not be restarted")
		return fmt.Errorf("%w: local sandbox %s: restarting the kernel: %w", sandbox.ErrNotFound, h.ID, err)
	}
	t := time.NewTimer(p.startWait())
	defer t.Stop()
	select {
	case <-b.restarted:
		return nil
	case <-b.done:
		return fmt.Errorf("%w: local sandbox %s: it stopped while its kernel restarted", sandbox.ErrNotFound, h.ID)
	case <-ctx.Done():
		b.kill("the kernel did not restart")
		return ctx.Err()
	case <-t.C:
		// What the sandbox was doing, for the operator's log: this should not happen.
		state := b.processState()
		b.kill("the kernel did not restart")
		return fmt.Errorf("%w: local sandbox %s: the kernel was not ready %s after its restart (%s; output mid-line: %v; stderr: %q)",
			sandbox.ErrNotFound, h.ID, p.startWait(), state, b.midLine.Load(), b.stderr.Bytes())
	}
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

// serveEgress starts answering the sandbox's egress listener for container under policy p (the
// zero policy answers every request with its refusal). Once only; nothing after the box ended.
func (b *box) serveEgress(srv *egress.Server, container string, p egress.Policy) {
	b.egressMu.Lock()
	defer b.egressMu.Unlock()
	if b.egress == nil || b.egressDone != nil || srv == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	l := b.egress
	go func() {
		defer close(done)
		if err := srv.Serve(ctx, l, container, p); err != nil {
			b.p.log.Warn("local sandbox: egress stopped", zap.String("sandbox", b.id), zap.Error(err))
		}
	}()
	b.egressCancel, b.egressDone = cancel, done
}

// stopEgress closes the egress listener and every connection through it, and waits for them.
func (b *box) stopEgress() {
	b.egressMu.Lock()
	defer b.egressMu.Unlock()
	switch {
	case b.egressDone != nil:
		b.egressCancel()
		<-b.egressDone
	case b.egress != nil:
		b.egress.Close()
	}
	b.egress = nil
}

// descendants returns pid and every process below it, through /proc's children lists.
func descendants(pid int) []int {
	out := []int{pid}
	tasks, _ := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", task.Name(), "children"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if child, err := strconv.Atoi(f); err == nil {
				out = append(out, descendants(child)...)
			}
		}
	}
	return out
}

// processState describes the sandbox's processes: for each, its pid, name, state and the kernel
// function it waits in.
func (b *box) processState() string {
	var parts []string
	for _, pid := range descendants(b.pid) {
		dir := filepath.Join("/proc", strconv.Itoa(pid))
		stat, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ...: comm may hold spaces and parentheses, so cut at the last ')'.
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+3 > len(s) {
			continue
		}
		wchan, _ := os.ReadFile(filepath.Join(dir, "wchan"))
		parts = append(parts, fmt.Sprintf("%d %s %c %s%s", pid, s[strings.IndexByte(s, '(')+1:i], s[i+2], wchan, signalMasks(dir)))
	}
	out := "processes: " + strings.Join(parts, ", ")
	if b.cg != nil {
		out += "; " + b.cg.freezerState()
	}
	return out
}

// signalMasks is a process's pending (its own and its group's), blocked and caught signals, as
// /proc/PID/status shows them: whether a signal sent to it is waiting, and why.
func signalMasks(dir string) string {
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return ""
	}
	var out []string
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "SigPnd" || k == "ShdPnd" || k == "SigBlk" || k == "SigCgt") {
			out = append(out, k+" "+strings.TrimSpace(v))
		}
	}
	return " (" + strings.Join(out, " ") + ")"
}
