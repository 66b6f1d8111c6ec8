package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Paths inside the sandbox.
const (
	dataDir    = "/mnt/data"
	kernelPath = "/opt/ciproxy/kernel.py"
	// sandboxUID is the uid and gid the code runs as inside the sandbox's user namespace.
	sandboxUID = 1000
	// hostUID is the host uid bubblewrap is started as when the proxy runs as root. RLIMIT_NPROC
	// is never enforced for processes whose real uid is host root (the kernel exempts INIT_USER),
	// so a root proxy would get no process limit; as this unprivileged uid the count is kept per
	// user namespace, that is per sandbox. It also means a sandbox escape lands as nobody, not root.
	hostUID = 65534
	// shmSize bounds /dev/shm, a tmpfs that costs memory (Docker's default).
	shmSize = 64 << 20
)

// etcFiles are the host files under /etc that Python, numpy (BLAS through /etc/alternatives) and
// matplotlib (Debian keeps matplotlibrc in /etc) need; found by removing entries until imports and
// savefig broke. Missing ones are skipped.
var etcFiles = [...]string{
	"/etc/alternatives",
	"/etc/ld.so.cache",
	"/etc/matplotlibrc",
	"/etc/fonts",
	"/etc/localtime",
}

// syntheticEtc are files the launcher writes for the sandbox, so user tools that look up the
// current user (getpass, ls -l) work without the host's account databases.
var syntheticEtc = map[string]string{
	"passwd":   "root:x:0:0:root:/root:/usr/sbin/nologin\nuser:x:1000:1000:user:/mnt/data:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
	"group":    "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n",
	"hosts":    "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n",
	"hostname": "sandbox\n",
}

// kernelConfig is argv[1] of kernel.py.
type kernelConfig struct {
	Memory    int64    `json:"memory"`
	Processes int      `json:"processes"`
	FileSize  int64    `json:"file_size"`
	Preload   []string `json:"preload,omitempty"`
}

// preload is imported by every kernel before it reports ready; import errors are ignored.
var preload = []string{"numpy", "pandas", "matplotlib", "matplotlib.pyplot"}

// sandboxEnv is the whole environment of the kernel: nothing of the proxy's own is passed.
func sandboxEnv() []string {
	return []string{
		"PATH", "/usr/local/bin:/usr/bin:/bin",
		"HOME", dataDir,
		"USER", "user",
		"LANG", "C.UTF-8",
		"TMPDIR", "/tmp",
		"MPLBACKEND", "Agg",
		"MPLCONFIGDIR", "/tmp/.config/matplotlib",
		"XDG_CACHE_HOME", "/tmp/.cache",
		"PYTHONDONTWRITEBYTECODE", "1",
		"PYTHONUNBUFFERED", "1",
		// RLIMIT_AS counts every thread's arena and stack: keep BLAS and friends single-threaded.
		"OPENBLAS_NUM_THREADS", "1",
		"OMP_NUM_THREADS", "1",
		"MKL_NUM_THREADS", "1",
		"NUMEXPR_NUM_THREADS", "1",
	}
}

// bwrapArgs builds the bubblewrap command line for one sandbox whose host working directory is
// dir. base holds kernel.py and the synthetic /etc files. argv is the command run inside.
func bwrapArgs(base, dir string, python string, tmpSize int64, argv []string) []string {
	a := []string{
		"--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
		"--uid", strconv.Itoa(sandboxUID), "--gid", strconv.Itoa(sandboxUID),
		"--hostname", "sandbox",
		"--clearenv",
	}
	env := sandboxEnv()
	for i := 0; i < len(env); i += 2 {
		a = append(a, "--setenv", env[i], env[i+1])
	}
	a = append(a, "--ro-bind", "/usr", "/usr")
	// Merged-/usr systems (Debian 12) have these as symlinks; older ones as directories.
	for _, p := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(p)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(p); err == nil {
				a = append(a, "--symlink", target, p)
			}
		case fi.IsDir():
			a = append(a, "--ro-bind", p, p)
		}
	}
	for _, p := range etcFiles {
		a = append(a, "--ro-bind-try", p, p)
	}
	for name := range syntheticEtc {
		a = append(a, "--ro-bind", filepath.Join(base, "etc", name), "/etc/"+name)
	}
	if prefix := pythonPrefix(python); prefix != "" {
		a = append(a, "--ro-bind", prefix, prefix)
	}
	a = append(a,
		"--proc", "/proc",
		"--dev", "/dev",
		"--size", strconv.FormatInt(shmSize, 10), "--tmpfs", "/dev/shm",
		"--size", strconv.FormatInt(tmpSize, 10), "--tmpfs", "/tmp",
		"--bind", dir, dataDir,
		"--ro-bind", filepath.Join(base, "kernel.py"), kernelPath,
		// The root and /dev are tmpfs that bwrap builds; without this they are writable.
		"--remount-ro", "/dev",
		"--remount-ro", "/",
		"--chdir", dataDir,
		"--",
	)
	return append(a, argv...)
}

// pythonPrefix returns the installation prefix to bind when the interpreter lives outside /usr
// (which is always bound), or "".
func pythonPrefix(python string) string {
	real, err := filepath.EvalSymlinks(python)
	if err != nil {
		real = python
	}
	if strings.HasPrefix(real, "/usr/") {
		return ""
	}
	return filepath.Dir(filepath.Dir(real))
}

// kernelArgv is the command that starts the kernel.
func kernelArgv(python string, cfg kernelConfig) []string {
	b, _ := json.Marshal(cfg)
	// -I: no user site, no PYTHON* variables, no script directory on sys.path.
	return []string{python, "-I", "-B", kernelPath, string(b)}
}

// credential returns the host identity to start bubblewrap as: nil (our own) unless we are root,
// then hostUID (see there).
func credential() *syscall.Credential {
	if os.Geteuid() != 0 {
		return nil
	}
	return &syscall.Credential{Uid: hostUID, Gid: hostUID, Groups: []uint32{}}
}

// prepareBase writes kernel.py and the synthetic /etc files into base.
func prepareBase(base string) error {
	if err := os.MkdirAll(filepath.Join(base, "etc"), 0o755); err != nil {
		return err
	}
	// When bubblewrap runs as hostUID it must be able to reach base to bind from it.
	if err := os.Chmod(base, 0o711); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(base, "kernel.py"), kernelSource, 0o644); err != nil {
		return err
	}
	for name, content := range syntheticEtc {
		if err := os.WriteFile(filepath.Join(base, "etc", name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// makeDataDir creates a sandbox's working directory, owned by the uid the sandbox maps to.
func makeDataDir(dir string, cred *syscall.Credential) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.Remove(dir)
			return err
		}
	}
	return nil
}

// errBwrapMissing is Check's answer when bubblewrap is not installed.
var errBwrapMissing = errors.New("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")

// Check reports whether bubblewrap can start a sandbox on this host with these options: it runs
// the interpreter once in a sandbox built exactly like the real ones. The error says what to
// install or which sysctl to enable.
func Check(ctx context.Context, opts Options) error {
	opts = opts.withDefaults()
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		return errBwrapMissing
	}
	if _, err := os.Stat(opts.Python); err != nil {
		return fmt.Errorf("local sandbox: python interpreter %s: %w", opts.Python, err)
	}
	if err := os.MkdirAll(opts.WorkDir, 0o711); err != nil {
		return fmt.Errorf("local sandbox: work dir: %w", err)
	}
	base, err := os.MkdirTemp(opts.WorkDir, "check-")
	if err != nil {
		return fmt.Errorf("local sandbox: work dir: %w", err)
	}
	defer os.RemoveAll(base)
	if err := prepareBase(base); err != nil {
		return fmt.Errorf("local sandbox: %w", err)
	}
	cred := credential()
	dir := filepath.Join(base, "data")
	if err := makeDataDir(dir, cred); err != nil {
		return fmt.Errorf("local sandbox: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	args := bwrapArgs(base, dir, opts.Python, 16<<20, []string{opts.Python, "-I", "-c", "print('ok')"})
	cmd := exec.CommandContext(ctx, bwrap, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err == nil && strings.TrimSpace(string(out)) == "ok" {
		return nil
	}
	msg := strings.TrimSpace(stderr.String())
	if hint := userNamespaceHint(); hint != "" {
		return fmt.Errorf("local sandbox: bubblewrap cannot start a sandbox (%s): %s", msg, hint)
	}
	return fmt.Errorf("local sandbox: bubblewrap cannot start a sandbox: %v: %s", err, msg)
}

// userNamespaceHint names the sysctl that keeps unprivileged user namespaces off, if any.
func userNamespaceHint() string {
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	if read("/proc/sys/user/max_user_namespaces") == "0" {
		return "user namespaces are disabled: enable them with sysctl -w user.max_user_namespaces=15000"
	}
	if read("/proc/sys/kernel/unprivileged_userns_clone") == "0" {
		return "unprivileged user namespaces are disabled: enable them with sysctl -w kernel.unprivileged_userns_clone=1"
	}
	if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1" {
		return "AppArmor restricts unprivileged user namespaces: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or give bwrap an AppArmor profile that allows userns"
	}
	return ""
}
