package local

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/ciproxy/ciproxy/internal/sandbox/kernel"
)

// Paths inside the sandbox.
const (
	dataDir        = "/mnt/data"
	kernelPath     = kernel.Path
	codeFilterPath = "/opt/ciproxy/kernel.bpf"
	caBundlePath   = "/opt/ciproxy/ca-certificates.crt"
	userBase       = "/tmp/.local"
	// egressPort is where a sandbox's code reaches the egress proxy, on its own loopback.
	egressPort = 3128
	egressURL  = "http://127.0.0.1:3128"
	noProxy    = "localhost,127.0.0.1,::1"
	// shmSize bounds /dev/shm, a tmpfs that costs memory (Docker's default).
	shmSize = 64 << 20
	// zygoteTmpSize bounds the fork server's own /tmp (matplotlib's and fontconfig's caches).
	zygoteTmpSize = 32 << 20
)

// usrPaths are the parts of /usr a sandbox sees, read-only (globs; missing ones are skipped): the
// programs, the shared libraries, the interpreter's standard library and packages, and the data
// they read (time zones, fonts, matplotlib's). Not /usr/local, /usr/include, /usr/src, /usr/sbin
// or the rest of /usr/lib and /usr/share.
var usrPaths = []string{
	"/usr/bin",
	"/usr/lib/*-linux-gnu",
	"/usr/lib64",
	"/usr/lib/python3*",
	"/usr/lib/locale",
	"/usr/lib/ssl",
	"/usr/share/zoneinfo",
	"/usr/share/fonts",
	"/usr/share/fontconfig",
	"/usr/share/matplotlib",
}

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

// preload is imported by the fork server, before it forks any kernel; import errors are ignored.
var preload = []string{"numpy", "pandas", "matplotlib", "matplotlib.pyplot"}

// sandboxEnv is the whole environment of the kernel and of shell commands: nothing of the
// proxy's own is passed. PATH has the bin directories of hostPaths after the system's.
func sandboxEnv(hostPaths []string) []string {
	path := "/usr/bin:/bin"
	for _, hp := range hostPaths {
		if fi, err := os.Stat(filepath.Join(hp, "bin")); err == nil && fi.IsDir() {
			path += ":" + filepath.Join(hp, "bin")
		}
	}
	path += ":" + userBase + "/bin" // what pip installs, last: it cannot shadow a system program
	return []string{
		"PATH", path,
		"HOME", dataDir,
		"USER", "user",
		"LANG", "C.UTF-8",
		"TMPDIR", "/tmp",
		"MPLBACKEND", "Agg",
		"MPLCONFIGDIR", "/tmp/.config/matplotlib",
		"XDG_CACHE_HOME", "/tmp/.cache",
		"PYTHONDONTWRITEBYTECODE", "1",
		// The way out is the proxy's egress listener; tools read one spelling or the other.
		"HTTP_PROXY", egressURL, "HTTPS_PROXY", egressURL, "http_proxy", egressURL, "https_proxy", egressURL,
		"NO_PROXY", noProxy, "no_proxy", noProxy,
		"npm_config_proxy", egressURL, "npm_config_https_proxy", egressURL, "npm_config_cache", "/tmp/.npm",
		"npm_config_update_notifier", "false", "npm_config_audit", "false", "npm_config_fund", "false",
		// The host's roots and the egress proxy's own authority (for the domains with secrets).
		"SSL_CERT_FILE", caBundlePath, "REQUESTS_CA_BUNDLE", caBundlePath, "CURL_CA_BUNDLE", caBundlePath,
		"PIP_CERT", caBundlePath, "NODE_EXTRA_CA_CERTS", caBundlePath, "GIT_SSL_CAINFO", caBundlePath,
		// pip installs into /tmp (the sandbox's own, counted in its memory), on the kernels' path.
		"PYTHONUSERBASE", userBase, "PIP_USER", "1", "PIP_BREAK_SYSTEM_PACKAGES", "1",
		"PIP_DISABLE_PIP_VERSION_CHECK", "1", "PIP_NO_INPUT", "1",
		"PYTHONUNBUFFERED", "1",
		// RLIMIT_AS counts every thread's arena and stack: keep BLAS and friends single-threaded.
		"OPENBLAS_NUM_THREADS", "1",
		"OMP_NUM_THREADS", "1",
		"MKL_NUM_THREADS", "1",
		"NUMEXPR_NUM_THREADS", "1",
	}
}

// zygoteArgs builds the bubblewrap command line of the fork server: the filesystem view every
// sandbox gets (its kernels' mount namespaces are copies of it, with their own tmpfs on top), its
// own pid, network, IPC, UTS and cgroup namespaces (the user namespace is made by the caller),
// files copied in from descriptors (dest → fd; -1 skips), the seccomp filter on seccompFD (-1:
// none), bubblewrap's capability options, and argv run inside.
func zygoteArgs(python string, hostPaths []string, files map[string]int, seccompFD int, caps, argv []string) []string {
	a := append([]string(nil), caps...)
	a = append(a, []string{
		"--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		"--die-with-parent", "--new-session",
		"--hostname", "sandbox",
		"--clearenv",
	}...)
	env := sandboxEnv(hostPaths)
	for i := 0; i < len(env); i += 2 {
		a = append(a, "--setenv", env[i], env[i+1])
	}
	var binds []string
	for _, pattern := range usrPaths {
		matches, _ := filepath.Glob(pattern)
		for _, m := range matches {
			if fi, err := os.Lstat(m); err == nil && fi.IsDir() {
				binds = append(binds, m)
			}
		}
	}
	binds = append(binds, hostPaths...) // checked when decoded (checkHostPath)
	// Parents that bubblewrap would otherwise create 0700, out of the sandbox user's reach.
	parents := map[string]bool{}
	for _, d := range append(binds, etcFiles[:]...) {
		for p := filepath.Dir(d); p != "/"; p = filepath.Dir(p) {
			parents[p] = true
		}
	}
	sortedParents := make([]string, 0, len(parents))
	for p := range parents {
		sortedParents = append(sortedParents, p)
	}
	sort.Strings(sortedParents)
	for _, p := range sortedParents {
		a = append(a, "--perms", "0755", "--dir", p)
	}
	for _, m := range binds {
		a = append(a, "--ro-bind", m, m)
	}
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
	if prefix := pythonPrefix(python); prefix != "" {
		a = append(a, "--ro-bind", prefix, prefix)
	}

	a = append(a, "--dir", "/opt/ciproxy")
	dests := make([]string, 0, len(files))
	for dest := range files {
		dests = append(dests, dest)
	}
	sort.Strings(dests)
	for _, dest := range dests {
		if fd := files[dest]; fd >= 0 {
			// Copied into the sandbox's root (no bind mount, so no host path in mountinfo).
			a = append(a, "--perms", "0444", "--file", strconv.Itoa(fd), dest)
		}
	}
	a = append(a,
		"--proc", "/proc",
		"--dev", "/dev",
		"--size", strconv.Itoa(zygoteTmpSize), "--tmpfs", "/tmp",
		// Mount points of every sandbox's own tmpfs.
		"--dir", dataDir,
	)
	if seccompFD >= 0 {
		a = append(a, "--seccomp", strconv.Itoa(seccompFD))
	}
	a = append(a,
		// The root and /dev are tmpfs that bwrap builds; without this they are writable.
		"--remount-ro", "/dev",
		"--remount-ro", "/",
		"--chdir", "/",
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
