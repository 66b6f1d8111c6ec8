// Package local runs code in sandboxes on the proxy's own host: a persistent Python kernel
// (internal/sandbox/kernel) that speaks the NDJSON stream of e2b's code-interpreter server, so
// sandbox.DecodeExecution reads both, forked by a fork server (zygote.go) into namespaces of its
// own.
//
// Every sandbox has its own mount, pid, network (only lo: no network), IPC, UTS, cgroup and user
// namespaces; it sees a read-only root with the parts of /usr the interpreter needs (usrPaths),
// a few files of /etc plus synthetic passwd/group/hosts, its own /proc and /dev, and size-capped
// tmpfs of its own at /mnt/data (cwd and HOME), /tmp and /dev/shm. The environment is built from
// nothing. The code runs as uid 1000 of its user namespace, which is a host uid of its own when
// the proxy runs as root (uids.go), with no capability, no further user namespace and a seccomp
// filter (seccomp.go). No host path of the proxy appears in its mountinfo.
//
// Limits (docs/sandbox-local.md says exactly what each mode guarantees):
//   - memory: with cgroups (cgroup.go), one bound for everything the sandbox holds: the memory
//     of all its processes, its tmpfs files (/mnt/data, /tmp, /dev/shm) and kernel memory such
//     as socket buffers, which forking cannot multiply. Every process also has RLIMIT_AS at what
//     the zygote mapped plus the limit, so one huge allocation is a MemoryError rather than the
//     end of the sandbox. Without cgroups (mode rlimit) RLIMIT_AS is the only memory bound, per
//     process, and Provider.Isolation and the start-up log say so.
//   - processes: pids.max where cgroups allow, and RLIMIT_NPROC (counted per user namespace and
//     uid, so per sandbox; its processes are never root, whom the kernel exempts).
//   - CPU: cpu.max (or cfs quota) per sandbox; between executions the whole sandbox is frozen
//     (cgroup freezer, or SIGSTOP to every process of it without cgroups), so nothing left behind
//     by a cell burns CPU until the next one.
//   - files: RLIMIT_FSIZE per file; /mnt/data is a tmpfs of MaxDiskSize, so the disk limit holds
//     by construction (ENOSPC), with no walk; a low RLIMIT_NOFILE.
//   - time: an execution that outlives its timeout gets a KeyboardInterrupt (the kernel and its
//     state survive); if it has not stopped within a grace period the sandbox is killed.
//
// Output is captured at the file-descriptor level: fds 1 and 2 are pipes read by kernel threads,
// so subprocesses and C code are captured too; the protocol uses descriptors user code does not
// get (closed in forked children, not inherited across exec).
package local

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/settings"
)

// Backend is the Handle.Backend of local sandboxes.
const Backend = "local"

// Defaults of a local sandbox tool; config.example.yaml documents the same values. A zero Options
// field means its default (DefaultOptions), except PoolSize, whose zero means no warm pool.
const (
	DefaultPython       = "/usr/bin/python3"
	DefaultMemoryLimit  = 1 << 30
	DefaultMaxMemory    = 4 << 30
	DefaultMaxFileSize  = 100 << 20
	DefaultMaxDiskSize  = 512 << 20
	DefaultMaxProcesses = 64
	DefaultPoolSize     = 2
	DefaultExecTimeout  = 120 * time.Second
	DefaultCPULimit     = 1.0
	DefaultMaxOpenFiles = 256

	// interruptGrace is how long an interrupted execution may take to stop before the sandbox
	// is killed.
	interruptGrace = 3 * time.Second
)

// Options configure a Provider. DecodeSettings makes them from a sandbox tool's litellm_params.
type Options struct {
	// Python is the interpreter run inside the sandbox. Outside /usr its prefix is bound read-only
	// too, so it must be readable by an unprivileged user.
	Python string
	// HostPaths are host directories bound read-only into every sandbox at the same path, for
	// runtimes installed outside /usr (a JDK under /usr/lib/jvm, node under /opt/node); the bin
	// directory of each, when it has one, is added to the sandbox's PATH.
	HostPaths []string
	// WorkDir holds each provider's lock and private directory (default
	// os.TempDir()/ciproxy-sandboxes); a new provider sweeps what dead ones left there.
	WorkDir string
	// MemoryLimit is a sandbox's memory when a request asks for none; MaxMemory caps what a
	// request may ask for (larger asks are lowered to it).
	MemoryLimit, MaxMemory int64
	// MaxFileSize bounds any one file a sandbox writes; MaxDiskSize is the size of its /mnt/data.
	MaxFileSize, MaxDiskSize int64
	// MaxProcesses bounds the processes and threads of one sandbox.
	MaxProcesses int
	// PoolSize is how many started kernels are kept warm; 0 or less means none. (Its default,
	// DefaultPoolSize, is what a tool that does not set pool_size gets.)
	PoolSize int
	// ExecTimeout bounds an execution when RunOptions.Timeout is zero.
	ExecTimeout time.Duration
	// CPULimit is the CPU time a sandbox may use, in CPUs (cgroup cpu controller; 1 = one core).
	CPULimit float64
	// MaxOpenFiles is every sandboxed process's RLIMIT_NOFILE.
	MaxOpenFiles int
	// UIDBase and UIDCount are the range of host uids that sandboxes run as when the proxy runs as
	// root, one uid each (see uids.go); no other user or service on the host may use it.
	UIDBase, UIDCount uint32
	// Network is the operator's bound on the network policies of the tool's containers; Egress
	// configures the proxy their code goes out through.
	Network egress.Bound
	Egress  egress.Settings
	// Tool is the sandbox_tool_name put in handles.
	Tool string
	// Logger; nil means no logging.
	Logger *zap.Logger `json:"-"`
}

// DefaultOptions returns the options of a local sandbox tool that sets nothing: the one place the
// defaults are applied.
func DefaultOptions() Options {
	return Options{
		Python:       DefaultPython,
		WorkDir:      filepath.Join(os.TempDir(), "ciproxy-sandboxes"),
		MemoryLimit:  DefaultMemoryLimit,
		MaxMemory:    DefaultMaxMemory,
		MaxFileSize:  DefaultMaxFileSize,
		MaxDiskSize:  DefaultMaxDiskSize,
		MaxProcesses: DefaultMaxProcesses,
		PoolSize:     DefaultPoolSize,
		ExecTimeout:  DefaultExecTimeout,
		CPULimit:     DefaultCPULimit,
		MaxOpenFiles: DefaultMaxOpenFiles,
		UIDBase:      DefaultUIDBase,
		UIDCount:     DefaultUIDCount,
		Egress:       egress.DefaultSettings(),
	}
}

// withDefaults fills the zero fields from DefaultOptions (PoolSize aside: zero is no pool).
func (o Options) withDefaults() Options {
	def := DefaultOptions()
	if o.Python == "" {
		o.Python = def.Python
	}
	if o.WorkDir == "" {
		o.WorkDir = def.WorkDir
	}
	if o.MemoryLimit <= 0 {
		o.MemoryLimit = def.MemoryLimit
	}
	if o.MaxMemory <= 0 {
		o.MaxMemory = def.MaxMemory
	}
	if o.MemoryLimit > o.MaxMemory {
		o.MaxMemory = o.MemoryLimit
	}
	if o.MaxFileSize <= 0 {
		o.MaxFileSize = def.MaxFileSize
	}
	if o.MaxDiskSize <= 0 {
		o.MaxDiskSize = def.MaxDiskSize
	}
	if o.MaxProcesses <= 0 {
		o.MaxProcesses = def.MaxProcesses
	}
	o.PoolSize = max(o.PoolSize, 0)
	if o.ExecTimeout <= 0 {
		o.ExecTimeout = def.ExecTimeout
	}
	if o.CPULimit <= 0 {
		o.CPULimit = DefaultCPULimit
	}
	if o.MaxOpenFiles <= 0 {
		o.MaxOpenFiles = DefaultMaxOpenFiles
	}
	if o.UIDBase == 0 {
		o.UIDBase = DefaultUIDBase
	}
	if o.UIDCount < uidBlock {
		o.UIDCount = DefaultUIDCount
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// Provider starts and runs local sandboxes. It is safe for concurrent use.
type Provider struct {
	opts  Options
	knobs knobs
	bwrap string
	id    string   // p-...: names the private directory, the lock and the cgroups
	base  string   // private directory
	lock  *os.File // flock held for the provider's life (see sweep.go)
	log   *zap.Logger

	uids         *uidLease
	cg           *cgroupHost // nil: no cgroup
	egress       *egress.Server
	copier       string // the copy helper's path (charge.go), "" when the host has none
	codeFilter   []byte // installed by every kernel on itself
	zygoteFilter []byte // installed by bubblewrap on the fork server

	// grace is how long an interrupted execution may take to stop before the sandbox is killed.
	grace time.Duration

	ctx    context.Context // ends at Close; bounds pool starts
	cancel context.CancelFunc
	wg     sync.WaitGroup
	refill chan struct{}

	zmu sync.Mutex
	zyg *zygote

	mu     sync.Mutex
	closed bool
	live   map[string]*box // handed out by Create, not yet deleted or dead
	pool   []*box          // started, waiting for Create
}

// knobs are switches for tests and benchmarks only.
type knobs struct {
	noSeccomp    bool           // kernels and the zygote run without their filters
	noCgroups    bool           // as on a host without writable cgroups
	startTimeout time.Duration  // instead of startTimeout (an emulated machine starts slowly)
	egressRoots  *x509.CertPool // the roots the egress proxy verifies servers with (a test's own)
}

var _ sandbox.Provider = (*Provider)(nil)

// New prepares a Provider and starts filling its warm pool in the background. It fails when
// bubblewrap is not installed; Check tells whether it can actually start a sandbox.
func New(opts Options) (*Provider, error) { return newProvider(opts, knobs{}) }

func newProvider(opts Options, k knobs) (*Provider, error) {
	opts = opts.withDefaults()
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		return nil, errBwrapMissing
	}
	if err := privateDir(opts.WorkDir); err != nil {
		return nil, fmt.Errorf("local sandbox: work dir: %w", err)
	}
	codeFilter, err := buildFilter(seccompRules(false))
	if err != nil {
		return nil, fmt.Errorf("local sandbox: %w", err)
	}
	zygoteFilter, err := buildFilter(seccompRules(true))
	if err != nil {
		return nil, fmt.Errorf("local sandbox: %w", err)
	}
	id := "p-" + newID()[:16]
	lock, err := ownerLock(opts.WorkDir, id)
	if err != nil {
		return nil, fmt.Errorf("local sandbox: work dir: %w", err)
	}
	base := filepath.Join(opts.WorkDir, id)
	if err := os.Mkdir(base, 0o700); err != nil {
		lock.Close()
		return nil, fmt.Errorf("local sandbox: work dir: %w", err)
	}
	var cg *cgroupHost
	var roots []string
	if !k.noCgroups {
		cg = newCgroupHost(cgroupName(id))
		roots = cgroupRoots()
	}
	swept := sweep(opts.WorkDir, roots, time.Now())
	uids := sharedUID()
	if os.Geteuid() == 0 {
		if uids, err = leaseUIDs(uidLockDir, opts.UIDBase, opts.UIDCount); err != nil {
			cg.close()
			os.RemoveAll(base)
			lock.Close()
			return nil, fmt.Errorf("local sandbox: %w", err)
		}
	}
	eo := opts.Egress.Options(opts.Logger)
	eo.RootCAs = k.egressRoots
	srv, err := egress.New(eo)
	if err != nil {
		cg.close()
		os.RemoveAll(base)
		lock.Close()
		return nil, fmt.Errorf("local sandbox: %w", err)
	}
	copier, _ := exec.LookPath(copyHelper)
	ctx, cancel := context.WithCancel(context.Background())
	p := &Provider{
		copier: copier,
		opts:   opts, knobs: k, bwrap: bwrap, id: id, base: base, lock: lock, log: opts.Logger,
		uids: uids, cg: cg, egress: srv, codeFilter: codeFilter, zygoteFilter: zygoteFilter,
		grace: interruptGrace,
		ctx:   ctx, cancel: cancel, refill: make(chan struct{}, 1),
		live: map[string]*box{},
	}
	if swept.dirs+swept.cgroups > 0 {
		p.log.Info("local sandbox: swept what earlier processes left in the work dir",
			zap.Int("directories", swept.dirs), zap.Int("cgroups", swept.cgroups))
	}
	iso := p.Isolation()
	fields := []zap.Field{zap.String("mode", string(iso.Mode)), zap.Strings("guarantees", iso.Guarantees),
		zap.String("limits", iso.Limits), zap.String("cgroups", iso.Cgroups), zap.String("uids", iso.UIDs)}
	if len(iso.Warnings) > 0 {
		p.log.Warn("local sandbox: WEAKER ISOLATION ON THIS HOST: "+strings.Join(iso.Warnings, "; "), fields...)
	} else {
		p.log.Info("local sandbox isolation", fields...)
	}
	if opts.PoolSize > 0 {
		p.wg.Add(1)
		go p.fillPool()
	}
	return p, nil
}

// Create returns a started sandbox: a warm one from the pool when the request asks for the
// default memory limit, otherwise a new one.
func (p *Provider) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Handle, error) {
	mem, err := p.memoryFor(opts.MemoryLimit)
	if err != nil {
		return sandbox.Handle{}, fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
	}
	var b *box
	if mem == p.opts.MemoryLimit {
		b = p.takeWarm()
	}
	if b == nil {
		if b, err = p.start(ctx, mem); err != nil {
			return sandbox.Handle{}, fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
		}
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.destroy(b)
		return sandbox.Handle{}, fmt.Errorf("%w: %w", sandbox.ErrUnavailable, errClosed)
	}
	p.live[b.id] = b
	p.mu.Unlock()
	container := opts.Metadata[sandbox.MetadataContainerID]
	if container == "" {
		container = b.id
	}
	b.serveEgress(p.egress, container, opts.Network)
	return sandbox.Handle{Backend: Backend, Tool: p.opts.Tool, ID: b.id}, nil
}

// NetworkBound implements sandbox.Networked.
func (p *Provider) NetworkBound() egress.Bound { return p.opts.Network }

// DomainSecrets implements sandbox.Networked: the egress proxy substitutes them.
func (p *Provider) DomainSecrets() bool { return true }

var _ sandbox.Networked = (*Provider)(nil)

// systemRoots is the host's bundle of trusted certificates (Debian's path), which the sandbox
// trusts as its programs would outside.
const systemRoots = "/etc/ssl/certs/ca-certificates.crt"

// caBundle is what a sandbox trusts: the host's roots, then the egress proxy's authority.
func (p *Provider) caBundle() []byte {
	roots, _ := os.ReadFile(systemRoots)
	if len(roots) > 0 && roots[len(roots)-1] != '\n' {
		roots = append(roots, '\n')
	}
	return append(roots, p.egress.CA()...)
}

// takeWarm takes a live kernel from the pool, or returns nil, and asks for a refill.
func (p *Provider) takeWarm() *box {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.askRefill()
	for len(p.pool) > 0 {
		b := p.pool[0]
		p.pool = p.pool[1:]
		if !b.dead() {
			return b
		}
		go p.destroy(b)
	}
	return nil
}

func (p *Provider) askRefill() {
	select {
	case p.refill <- struct{}{}:
	default:
	}
}

// fillPool keeps PoolSize kernels started until Close.
func (p *Provider) fillPool() {
	defer p.wg.Done()
	backoff := time.Duration(0)
	for {
		p.mu.Lock()
		need := !p.closed && len(p.pool) < p.opts.PoolSize
		p.mu.Unlock()
		if !need {
			select {
			case <-p.ctx.Done():
				return
			case <-p.refill:
				continue
			}
		}
		b, err := p.start(p.ctx, p.opts.MemoryLimit)
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			backoff = min(max(2*backoff, time.Second), 30*time.Second)
			p.log.Warn("local sandbox: starting a warm kernel failed", zap.Error(err), zap.Duration("retry_in", backoff))
			t := time.NewTimer(backoff)
			select {
			case <-p.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		backoff = 0
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			p.destroy(b)
			return
		}
		p.pool = append(p.pool, b)
		p.mu.Unlock()
	}
}

// memoryFor turns a request's memory_limit ("1g", "4g", "512m", bytes; settings.ParseSize) into
// bytes, capped at MaxMemory; "" is the default.
func (p *Provider) memoryFor(s string) (int64, error) {
	if s == "" {
		return p.opts.MemoryLimit, nil
	}
	n, err := settings.ParseSize(s)
	if err != nil {
		return 0, fmt.Errorf("memory limit: %w", err)
	}
	if n <= 0 {
		return 0, fmt.Errorf("memory limit %q is not more than 0", s)
	}
	return min(n, p.opts.MaxMemory), nil
}

// lookup returns the live sandbox of h, or an error wrapping sandbox.ErrNotFound.
func (p *Provider) lookup(h sandbox.Handle) (*box, error) {
	if h.Backend != Backend {
		return nil, fmt.Errorf("%w: handle of backend %q", sandbox.ErrNotFound, h.Backend)
	}
	p.mu.Lock()
	b := p.live[h.ID]
	p.mu.Unlock()
	if b == nil || b.dead() {
		return nil, fmt.Errorf("%w: local sandbox %s", sandbox.ErrNotFound, h.ID)
	}
	return b, nil
}

// forget drops a sandbox that has stopped from the live set.
func (p *Provider) forget(b *box) {
	p.mu.Lock()
	if p.live[b.id] == b {
		delete(p.live, b.id)
	}
	p.mu.Unlock()
}

// Delete kills the sandbox's processes, which frees its files (tmpfs), uid and cgroup. Deleting a
// sandbox that is already gone returns nil.
func (p *Provider) Delete(ctx context.Context, h sandbox.Handle) error {
	if h.Backend != Backend || !validID(h.ID) {
		return nil
	}
	p.mu.Lock()
	b := p.live[h.ID]
	delete(p.live, h.ID)
	p.mu.Unlock()
	if b != nil {
		b.kill("deleted")
		select {
		case <-b.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// KeepAlive is a no-op: local sandboxes live until deleted; expiry is the sessions' business.
func (p *Provider) KeepAlive(ctx context.Context, h sandbox.Handle, d time.Duration) error {
	_, err := p.lookup(h)
	return err
}

// Live reports how many sandboxes handed out by Create are running (the warm pool is not counted).
func (p *Provider) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, b := range p.live {
		if !b.dead() && b.killReason() == "" {
			n++
		}
	}
	return n
}

// Close kills every sandbox, the warm pool included, and the fork server, and removes the
// provider's directory, cgroups and lock. Later calls to Create fail with sandbox.ErrUnavailable.
func (p *Provider) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	boxes := append([]*box(nil), p.pool...)
	for _, b := range p.live {
		boxes = append(boxes, b)
	}
	p.pool = nil
	p.live = map[string]*box{}
	p.mu.Unlock()
	p.cancel()
	for _, b := range boxes {
		b.kill("provider closed")
	}
	for _, b := range boxes {
		select {
		case <-b.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.zmu.Lock()
	if p.zyg != nil {
		p.zyg.stop()
	}
	p.zmu.Unlock()
	p.cg.close()
	p.uids.release()
	err := os.RemoveAll(p.base)
	os.Remove(p.lock.Name())
	p.lock.Close()
	if err != nil {
		return fmt.Errorf("local sandbox: removing work dir: %w", err)
	}
	return nil
}

// track runs f in a goroutine that Close waits for, or reports false when the provider is closed.
// (Adding to the WaitGroup under mu, after the closed check, keeps Add from racing with Close's Wait.)
func (p *Provider) track(f func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f()
	}()
	return true
}

// errClosed is returned by operations on a closed provider.
var errClosed = errors.New("local sandbox provider is closed")

// destroy kills a sandbox and waits for it to be gone.
func (p *Provider) destroy(b *box) {
	b.kill("discarded")
	<-b.done
}

func newID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b[:])
}

// validID reports whether id has the shape newID makes, so it is safe as a path element.
func validID(id string) bool {
	if len(id) != 32 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

// errStopped is the cause given when a sandbox dies during an execution.
var errStopped = errors.New("the sandbox stopped during the execution")

// privateDir makes sure dir exists, is a real directory (not a symlink), is owned by this process's
// user and is writable by nobody else: in a shared /tmp, another user could otherwise create it
// first and swap the sandboxes' kernel and files under the proxy.
func privateDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o711); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	info, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	switch {
	case !info.IsDir():
		return fmt.Errorf("%s is not a directory (a symlink?); remove it or choose another work_dir", dir)
	case ok && int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s belongs to another user (uid %d); remove it or choose another work_dir", dir, st.Uid)
	case info.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s is writable by other users (mode %v); remove it or choose another work_dir", dir, info.Mode().Perm())
	}
	return nil
}
