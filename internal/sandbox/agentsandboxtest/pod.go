package agentsandboxtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox/processv1"
)

// podRoot is where a pod's data directory is mounted, and sandboxd's --root-dir in the
// repository's image.
const podRoot = "/mnt/data"

// podUID is the user a pod's processes run as (the image's and the template's user).
const podUID = 1000

// pod is one Sandbox's pod: a long-lived bwrap whose namespaces every command enters, and the
// sandboxd double serving on the pod's own loopback address.
type pod struct {
	name    string
	ip      string
	dataDir string // the host directory bound at /mnt/data
	env     []string

	bwrap   *exec.Cmd
	initPID int // the host pid of pid 1 of the pod's pid namespace
	exited  chan struct{}
	// container is the podman container of an image pod (Options.PodImage), "" for bwrap.
	container string

	grpc  *grpc.Server
	files *http.Server
	procs *processServer

	stopOnce sync.Once
}

// startPod makes the pod of sandbox name: its directories, the bwrap that holds its
// namespaces, and sandboxd's two listeners on a free 127.1.x.y address.
func (s *Server) startPod(name string, extraEnv map[string]string) (*pod, error) {
	if s.opts.PodImage != "" {
		return s.startImagePod(name, extraEnv)
	}
	base := filepath.Join(s.dir, "pods", name+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	p := &pod{name: name, dataDir: filepath.Join(base, "data"), exited: make(chan struct{})}
	for _, d := range []string{p.dataDir, filepath.Join(base, "tmp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		if err := os.Chown(d, podUID, podUID); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(filepath.Join(base, "tmp"), 0o1777); err != nil {
		return nil, err
	}
	env := map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME": podRoot, "HOSTNAME": name, "LANG": "C.UTF-8",
	}
	for k, v := range s.opts.PodEnv {
		env[k] = v
	}
	for k, v := range extraEnv {
		env[k] = v
	}
	for k, v := range env {
		p.env = append(p.env, k+"="+v)
	}
	sort.Strings(p.env)

	args := []string{
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--die-with-parent", "--new-session",
		"--hostname", name,
		"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
		"--ro-bind", "/etc", "/etc",
		"--proc", "/proc", "--dev", "/dev",
		"--bind", filepath.Join(base, "tmp"), "/tmp",
	}
	// bwrap makes missing parents 0700: make them world-readable, as in an image.
	dirs := map[string]bool{"/mnt": true}
	paths := make([]string, 0, len(s.opts.ImageFiles))
	for path := range s.opts.ImageFiles {
		paths = append(paths, path)
		for d := filepath.Dir(path); d != "/"; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	sorted := make([]string, 0, len(dirs))
	for d := range dirs {
		sorted = append(sorted, d)
	}
	sort.Strings(sorted)
	for _, d := range sorted {
		args = append(args, "--perms", "0755", "--dir", d)
	}
	args = append(args, "--bind", p.dataDir, podRoot)
	sort.Strings(paths)
	for _, path := range paths {
		args = append(args, "--ro-bind", s.imageFile(path), path)
	}
	// The pod's idle process is what the code sees in ps beside its own: not a sleep, which
	// tests count (a real pod shows sandboxd there).
	args = append(args, "--info-fd", "3", "--", "tail", "-f", "/dev/null")
	infoR, infoW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(s.bwrap, args...)
	cmd.ExtraFiles = []*os.File{infoW}
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	// bwrap's stderr goes to a file: read on failure without racing a copying goroutine.
	logFile, err := os.Create(filepath.Join(base, "bwrap.log"))
	if err != nil {
		infoR.Close()
		infoW.Close()
		return nil, err
	}
	defer logFile.Close()
	stderr := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		infoR.Close()
		infoW.Close()
		return nil, fmt.Errorf("bwrap: %w", err)
	}
	infoW.Close()
	var info struct {
		ChildPID int `json:"child-pid"`
	}
	err = json.NewDecoder(infoR).Decode(&info)
	infoR.Close()
	if err != nil || info.ChildPID == 0 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("bwrap did not start: %v: %s", err, stderr())
	}
	p.bwrap, p.initPID = cmd, info.ChildPID
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	if err := p.waitSetUp(); err != nil {
		p.kill()
		return nil, fmt.Errorf("%w: %s", err, stderr())
	}

	grpcLis, filesLis, err := s.listenPod(p)
	if err != nil {
		p.kill()
		return nil, err
	}
	p.procs = &processServer{env: p.env, dataDir: p.dataDir, root: podRoot, launch: podLauncher{pod: p, srv: s}}
	p.grpc = grpc.NewServer()
	processv1.RegisterProcessServiceServer(p.grpc, p.procs)
	go func() { _ = p.grpc.Serve(grpcLis) }()
	p.files = &http.Server{Handler: newFilesServer(p.dataDir, p.env).handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.files.Serve(filesLis) }()
	return p, nil
}

// listenPod picks a free 127.1.x.y on which both of sandboxd's ports can be bound: other test
// processes on the machine may hold some addresses.
func (s *Server) listenPod(p *pod) (net.Listener, net.Listener, error) {
	var lastErr error
	for range 64 {
		ip := fmt.Sprintf("127.1.%d.%d", rand.IntN(256), 1+rand.IntN(254))
		s.mu.Lock()
		taken := s.ipTaken[ip]
		s.mu.Unlock()
		if taken {
			continue
		}
		g, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(s.processPort)))
		if err != nil {
			lastErr = err
			continue
		}
		f, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(s.filesPort)))
		if err != nil {
			g.Close()
			lastErr = err
			continue
		}
		s.mu.Lock()
		s.ipTaken[ip] = true
		s.mu.Unlock()
		p.ip = ip
		return g, f, nil
	}
	return nil, nil, fmt.Errorf("no free pod address: %w", lastErr)
}

// waitSetUp waits until the pod's command runs: bwrap reports its pid 1 before that process
// has made the pod's mounts, and a command entered earlier would find no /mnt/data.
func (p *pod) waitSetUp() error {
	children := fmt.Sprintf("/proc/%d/task/%d/children", p.initPID, p.initPID)
	deadline := time.Now().Add(podSetUpWait)
	for {
		b, _ := os.ReadFile(children)
		for _, f := range strings.Fields(string(b)) {
			if comm, _ := os.ReadFile("/proc/" + f + "/comm"); strings.TrimSpace(string(comm)) == "tail" {
				return nil
			}
		}
		select {
		case <-p.exited:
			return errors.New("bwrap exited while it set the pod up")
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the pod was not set up within %s", podSetUpWait)
		}
	}
}

// podSetUpWait bounds bwrap's setting up of a pod (a few milliseconds, unloaded).
const podSetUpWait = 30 * time.Second

// startImagePod runs the pod of sandbox name as a container of Options.PodImage on the host's
// network, its sandboxd on a free 127.1.x.y address, and waits until that answers.
func (s *Server) startImagePod(name string, extraEnv map[string]string) (*pod, error) {
	base := filepath.Join(s.dir, "pods", name+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, err
	}
	p := &pod{name: name, dataDir: filepath.Join(base, "data"), exited: make(chan struct{}),
		container: "ciproxy-asd-" + filepath.Base(base)}
	// The address is held while it is chosen, then left to the container's sandboxd.
	g, f, err := s.listenPod(p)
	if err != nil {
		return nil, err
	}
	g.Close()
	f.Close()
	var nofile syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile); err != nil {
		return nil, err
	}
	args := []string{"--runtime", "runc", "run", "-d", "--name", p.container, "--network", "host", "--no-healthcheck",
		// Within the hard limits podman itself has (runc refuses to raise them).
		"--ulimit", fmt.Sprintf("nofile=%d:%d", nofile.Max, nofile.Max), "--ulimit", "nproc=16384:16384"}
	env := map[string]string{"HOSTNAME": name}
	for k, v := range s.opts.PodEnv {
		env[k] = v
	}
	for k, v := range extraEnv {
		env[k] = v
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-e", k+"="+env[k])
		p.env = append(p.env, k+"="+env[k])
	}
	args = append(args, s.opts.PodImage, "--listen-host="+p.ip,
		"--grpc-port="+strconv.Itoa(s.processPort), "--rest-port="+strconv.Itoa(s.filesPort))
	if out, err := exec.Command("podman", args...).CombinedOutput(); err != nil {
		p.kill()
		return nil, fmt.Errorf("podman run: %w: %s", err, out)
	}
	go func() {
		_ = exec.Command("podman", "wait", p.container).Run()
		close(p.exited)
	}()
	deadline := time.Now().Add(podSetUpWait)
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(p.ip, strconv.Itoa(s.filesPort)), time.Second)
		if err == nil {
			c.Close()
			return p, nil
		}
		select {
		case <-p.exited:
			out, _ := exec.Command("podman", "logs", p.container).CombinedOutput()
			p.kill()
			return nil, fmt.Errorf("the pod's container exited: %s", out)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.kill()
			return nil, fmt.Errorf("the pod's sandboxd did not listen within %s: %w", podSetUpWait, err)
		}
	}
}

// kill ends every process of the pod: pid 1 of its pid namespace dies, and the kernel kills
// the rest of the namespace with it (detached daemons included), then bwrap itself. An image
// pod's container is removed.
func (p *pod) kill() {
	if p.container != "" {
		_ = exec.Command("podman", "--runtime", "runc", "rm", "-f", "-t", "0", p.container).Run()
		return
	}
	if p.initPID > 0 {
		_ = syscall.Kill(p.initPID, syscall.SIGKILL)
	}
	if p.bwrap != nil && p.bwrap.Process != nil {
		_ = p.bwrap.Process.Kill()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
		}
	}
}

// stop kills the pod and closes its servers; the data directory is removed.
func (p *pod) stop() {
	p.stopOnce.Do(func() {
		p.kill()
		if p.files != nil {
			_ = p.files.Close()
		}
		if p.grpc != nil {
			p.grpc.Stop()
		}
		if p.procs != nil {
			p.procs.wait()
		}
		_ = os.RemoveAll(filepath.Dir(p.dataDir))
	})
}

// alive reports whether the pod's pid 1 still runs.
func (p *pod) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// hostPath maps a path seen in the pod to the host: the data directory, an image file, or the
// host's own read-only /usr and /etc. ok is false for paths that do not exist in the pod.
func (s *Server) hostPath(p *pod, path string) (string, bool) {
	switch {
	case path == podRoot || strings.HasPrefix(path, podRoot+"/"):
		return p.dataDir + strings.TrimPrefix(path, podRoot), true
	case s.opts.ImageFiles != nil && s.opts.ImageFiles[path] != "":
		return s.imageFile(path), true
	}
	for _, prefix := range []string{"/usr/", "/etc/", "/bin/", "/sbin/", "/lib/", "/lib64/"} {
		if strings.HasPrefix(path, prefix) {
			return path, true
		}
	}
	return "", false
}

// lookPath finds argv0 in the pod as exec.LookPath would there (with the process's PATH).
func (s *Server) lookPath(p *pod, argv0 string, env []string) error {
	isExec := func(pp string) bool {
		h, ok := s.hostPath(p, pp)
		if !ok {
			return false
		}
		st, err := os.Stat(h)
		return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
	}
	if strings.Contains(argv0, "/") {
		if !filepath.IsAbs(argv0) {
			return nil // relative to the cwd: left to the exec
		}
		if isExec(argv0) {
			return nil
		}
		return fmt.Errorf("exec: %q: %w", argv0, os.ErrNotExist)
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if isExec(filepath.Join(dir, argv0)) {
			return nil
		}
	}
	return &exec.Error{Name: argv0, Err: exec.ErrNotFound}
}

// imageFile is the host copy of image file path.
func (s *Server) imageFile(path string) string {
	return filepath.Join(s.dir, "image", filepath.FromSlash(strings.TrimPrefix(path, "/")))
}

func (s *Server) writeImageFiles() error {
	for path, content := range s.opts.ImageFiles {
		if !filepath.IsAbs(path) {
			return fmt.Errorf("image file %q: not an absolute path", path)
		}
		h := s.imageFile(path)
		if err := os.MkdirAll(filepath.Dir(h), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(h, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

var errPodGone = errors.New("pod is gone")
