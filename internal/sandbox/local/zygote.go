package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ciproxy/ciproxy/internal/sandbox/kernel"
)

// The fork server. Starting a kernel from scratch means a new interpreter importing numpy, pandas
// and matplotlib: about half a second of CPU. Instead each provider runs one zygote, a kernel.py
// that has done those imports inside a sandbox of its own and forks every new kernel into fresh
// namespaces (kernel.py says how, and what the kernels share). A new sandbox then costs a few
// forks and mounts.
//
// When the proxy runs as root, bubblewrap runs the zygote as root of the host's user namespace
// with only the capabilities that building a sandbox takes, so that each kernel can become its
// own host uid and create its user namespace as that uid (were the sandboxes' user namespaces
// nested in one of the zygote's, the kernel would charge per-user counts such as inotify
// instances to the zygote's creator, for all of them together). Without root, bubblewrap runs as root of a user namespace that this
// process creates with the proxy's uid alone mapped. Bubblewrap builds the minimal filesystem
// view, installs the zygote's seccomp filter and dies with the proxy (--die-with-parent), and with
// it the zygote's pid namespace and so every sandbox in it. The zygote also exits when the proxy closes its control
// socket, and every sandbox's init when the proxy closes its setup socket.

// zygoteCapabilities are all the zygote holds as root of the host's user namespace, each for one
// step of building a sandbox and dropped once that step is done (kernel.py): the zygote keeps
// them permitted but none effective between spawns, and its bounding set holds no other.
//   - CAP_SYS_ADMIN: C unshares the mount, UTS, IPC, network and pid namespaces, mounts the
//     tmpfs and devpts and sets the hostname; I mounts /proc and unshares the cgroup namespace.
//     I drops it before forking K.
//   - CAP_NET_ADMIN: C brings lo up in the sandbox's network namespace (which belongs to the
//     host's user namespace). C drops it before forking I.
//   - CAP_SETUID, CAP_SETGID: K becomes the sandbox's host uid and gid (setgroups, setresgid,
//     setresuid); leaving uid 0 clears K's capabilities, and I drops its own after forking K.
//   - CAP_SETPCAP: each of those drops takes it, to take a capability out of the bounding set.
var zygoteCapabilities = []string{"CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"}

// zygote is one running fork server.
type zygote struct {
	cmd    *exec.Cmd
	conn   *net.UnixConn // control socket: spawn requests
	done   chan struct{} // closed when the zygote has exited
	output headBuffer
}

// spawnRequest is what the zygote needs to fork one sandbox (see kernel.py's _spawn).
type spawnRequest struct {
	UID        uint32 `json:"uid"` // host uid to become; 0: stay the zygote's
	Memory     int64  `json:"memory"`
	Processes  int    `json:"processes"`
	FileSize   int64  `json:"file_size"`
	OpenFiles  int    `json:"open_files"`
	DataSize   int64  `json:"data_size"`
	DataInodes int64  `json:"data_inodes"`
	TmpSize    int64  `json:"tmp_size"`
	TmpInodes  int64  `json:"tmp_inodes"`
	ShmSize    int64  `json:"shm_size"`
	Seccomp    bool   `json:"seccomp"`
	// EgressPort: the init listens on 127.0.0.1:EgressPort in the sandbox's network namespace
	// and hands the proxy the listener (0: none).
	EgressPort int `json:"egress_port,omitempty"`
}

// zygoteConfig is argv[2] of kernel.py --zygote.
type zygoteConfig struct {
	Preload []string `json:"preload"`
	Seccomp string   `json:"seccomp"` // path of the kernels' filter inside the sandbox
}

// socketPair returns both ends of a SOCK_SEQPACKET socket pair (message boundaries, descriptor
// passing, EOF when the other end closes).
func socketPair() (*os.File, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), "socket"), os.NewFile(uintptr(fds[1]), "socket"), nil
}

// unixConn turns one end of a socket pair into a connection (closing f).
func unixConn(f *os.File) (*net.UnixConn, error) {
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// memFile returns a sealed in-memory file holding data, for bubblewrap to read.
func memFile(name string, data []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// startZygote starts a fork server and waits until it has imported the preload.
func (p *Provider) startZygote(ctx context.Context) (*zygote, error) {
	ours, theirs, err := socketPair()
	if err != nil {
		return nil, fmt.Errorf("local sandbox: fork server: %w", err)
	}
	extra := []*os.File{theirs} // fd 3 in bubblewrap and in the zygote
	defer func() {
		for _, f := range extra {
			f.Close()
		}
	}()
	files := map[string]int{} // destination in the sandbox → fd in bubblewrap
	add := func(dest string, data []byte) error {
		f, err := memFile(dest, data)
		if err != nil {
			return err
		}
		extra = append(extra, f)
		files[dest] = 2 + len(extra)
		return nil
	}
	if err := add(kernelPath, kernel.Source()); err != nil {
		ours.Close()
		return nil, fmt.Errorf("local sandbox: fork server: %w", err)
	}
	if err := add(codeFilterPath, p.codeFilter); err != nil {
		ours.Close()
		return nil, fmt.Errorf("local sandbox: fork server: %w", err)
	}
	if err := add(caBundlePath, p.caBundle()); err != nil {
		ours.Close()
		return nil, fmt.Errorf("local sandbox: fork server: %w", err)
	}
	for name, content := range syntheticEtc {
		if err := add("/etc/"+name, []byte(content)); err != nil {
			ours.Close()
			return nil, fmt.Errorf("local sandbox: fork server: %w", err)
		}
	}
	seccompFD := -1
	if !p.knobs.noSeccomp {
		f, err := memFile("zygote.bpf", p.zygoteFilter)
		if err != nil {
			ours.Close()
			return nil, fmt.Errorf("local sandbox: fork server: %w", err)
		}
		extra = append(extra, f)
		seccompFD = 2 + len(extra)
	}
	cfg, _ := json.Marshal(zygoteConfig{Preload: preload, Seccomp: codeFilterPath})
	var caps []string
	if p.perSandboxUIDs() {
		caps = []string{"--cap-drop", "ALL"}
		for _, c := range zygoteCapabilities {
			caps = append(caps, "--cap-add", c)
		}
	}
	args := zygoteArgs(p.opts.Python, p.opts.HostPaths, files, seccompFD, caps,
		[]string{p.opts.Python, "-I", "-B", kernelPath, "--zygote", string(cfg)})
	z := &zygote{done: make(chan struct{})}
	cmd := exec.Command(p.bwrap, args...)
	cmd.Env = []string{} // not even bubblewrap sees the proxy's environment
	cmd.Dir = "/"
	cmd.ExtraFiles = extra
	cmd.Stdout = &z.output
	cmd.Stderr = &z.output
	cmd.SysProcAttr = p.zygoteAttr()
	z.cmd = cmd
	err = cmd.Start()
	// The child has its copies: without ours, its end of the socket closing means EOF here.
	for _, f := range extra {
		f.Close()
	}
	extra = nil
	if err != nil {
		ours.Close()
		return nil, fmt.Errorf("local sandbox: starting bubblewrap: %w", err)
	}
	conn, err := unixConn(ours)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("local sandbox: fork server: %w", err)
	}
	z.conn = conn
	go func() {
		cmd.Wait()
		close(z.done)
	}()
	ready := make(chan error, 1)
	go func() {
		conn.SetReadDeadline(time.Now().Add(p.startWait()))
		buf := make([]byte, 4096)
		n, _, _, _, err := conn.ReadMsgUnix(buf, nil)
		conn.SetReadDeadline(time.Time{})
		var msg struct {
			Type    string `json:"type"`
			Threads int    `json:"threads"`
		}
		switch {
		case err != nil:
		case json.Unmarshal(buf[:n], &msg) != nil || msg.Type != "ready":
			err = fmt.Errorf("unexpected message %q", buf[:n])
		case msg.Threads != 1:
			err = fmt.Errorf("the fork server runs %d threads after its imports; it must run one (OPENBLAS_NUM_THREADS?)", msg.Threads)
		}
		ready <- err
	}()
	select {
	case err = <-ready:
	case <-z.done:
		err = errors.New("it exited")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		z.stop()
		if msg := bytes.TrimSpace(z.output.Bytes()); len(msg) > 0 {
			return nil, fmt.Errorf("local sandbox: the fork server did not start: %w: %s", err, msg)
		}
		return nil, fmt.Errorf("local sandbox: the fork server did not start: %w", err)
	}
	return z, nil
}

// zygoteAttr is how the zygote's bubblewrap is started: as root with a uid block to hand out, or
// as root of a new user namespace that maps the proxy's own uid alone.
func (p *Provider) zygoteAttr() *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if p.perSandboxUIDs() {
		return attr
	}
	attr.Cloneflags = syscall.CLONE_NEWUSER
	attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
	attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
	attr.Credential = &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true}
	return attr
}

// perSandboxUIDs tells whether every sandbox runs as a host uid of its own.
func (p *Provider) perSandboxUIDs() bool { return p.uids.size > 1 }

// spawn asks the zygote for a sandbox; files are the kernel's stdin, stdout and stderr and the
// sandbox's setup socket.
func (z *zygote) spawn(req spawnRequest, files ...*os.File) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	_, _, err = z.conn.WriteMsgUnix(b, unix.UnixRights(fds...), nil)
	return err
}

func (z *zygote) dead() bool {
	select {
	case <-z.done:
		return true
	default:
		return false
	}
}

// stop kills the zygote (and so every sandbox it forked) and waits for it.
func (z *zygote) stop() {
	z.conn.Close()
	syscall.Kill(-z.cmd.Process.Pid, syscall.SIGKILL)
	<-z.done
}

// zygoteFor returns the live fork server, starting one when there is none (the first, or after
// the last one died).
func (p *Provider) zygoteFor(ctx context.Context) (*zygote, error) {
	p.zmu.Lock()
	defer p.zmu.Unlock()
	if p.zyg != nil && !p.zyg.dead() {
		return p.zyg, nil
	}
	if p.zyg != nil {
		p.log.Warn("local sandbox: the fork server died; starting another (its sandboxes are gone)")
	}
	z, err := p.startZygote(ctx)
	if err != nil {
		return nil, err
	}
	p.zyg = z
	return z, nil
}

// started is what a sandbox's init sends over its setup socket.
type started struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// readStarted waits for the sandbox's init to report a message of type typ with a pidfd ("started":
// of itself; "kernel": of the kernel it forked), or an error. The init may send more descriptors
// after the pidfd (the egress listener with "started"): up to extra of them are returned.
func readStarted(conn *net.UnixConn, deadline time.Time, typ string, extra int) (*os.File, []*os.File, error) {
	conn.SetReadDeadline(deadline)
	defer conn.SetReadDeadline(time.Time{})
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, err
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	var msg started
	jerr := json.Unmarshal(buf[:n], &msg)
	if jerr != nil || msg.Type != typ || len(fds) < 1 || len(fds) > 1+extra {
		for _, fd := range fds {
			unix.Close(fd)
		}
		if n == 0 {
			return nil, nil, errors.New("the sandbox's init exited before reporting")
		}
		if msg.Message != "" {
			return nil, nil, errors.New(msg.Message)
		}
		return nil, nil, fmt.Errorf("unexpected setup message %q", buf[:n])
	}
	// Non-blocking, so that the runtime's poller can wait for the process's exit.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, nil, err
	}
	var rest []*os.File
	for _, fd := range fds[1:] {
		rest = append(rest, os.NewFile(uintptr(fd), "sandbox descriptor"))
	}
	return os.NewFile(uintptr(fds[0]), "pidfd"), rest, nil
}

// pidfdPID returns the pid, in this process's pid namespace, of the process a pidfd refers to.
func pidfdPID(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var pid int
	var perr error
	err = rc.Control(func(fd uintptr) {
		data, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(int(fd)))
		if err != nil {
			perr = err
			return
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "Pid:"); ok {
				pid, perr = strconv.Atoi(strings.TrimSpace(v))
				return
			}
		}
		perr = errors.New("no Pid in the pidfd's fdinfo")
	})
	if err != nil {
		return 0, err
	}
	if perr == nil && pid <= 0 {
		perr = errors.New("the sandbox's init has exited")
	}
	return pid, perr
}

// signalPidfd sends sig to the process of a pidfd; ESRCH (gone) is not an error.
func signalPidfd(f *os.File, sig unix.Signal) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.PidfdSendSignal(int(fd), sig, nil, 0) }); err != nil {
		return err
	}
	if errors.Is(serr, unix.ESRCH) {
		return nil
	}
	return serr
}

// waitPidfd blocks until the process of a pidfd has exited.
func waitPidfd(f *os.File) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	rc.Read(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 0)
		return n > 0 || (err != nil && !errors.Is(err, unix.EINTR))
	})
}
