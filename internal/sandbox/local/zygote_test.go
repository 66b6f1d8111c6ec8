package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// procStatus returns the fields of /proc/pid/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields
}

// capMask reads a capability field of /proc/pid/status.
func capMask(t *testing.T, status map[string]string, field string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(status[field], 16, 64)
	if err != nil {
		t.Fatalf("%s %q: %v", field, status[field], err)
	}
	return v
}

// startTime is field 22 of /proc/pid/stat: clock ticks since boot, the same in every pid namespace.
func startTime(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
	return strings.Fields(rest)[22-3]
}

// zygoteProcesses returns the host pids of a provider's fork server and of the bubblewrap
// processes above it (the monitor, and the init of the zygote's pid namespace).
func zygoteProcesses(t *testing.T, p *Provider) (zyg int, bwraps []int) {
	t.Helper()
	p.zmu.Lock()
	z := p.zyg
	p.zmu.Unlock()
	if z == nil {
		t.Fatal("the provider has no fork server")
	}
	monitor := z.cmd.Process.Pid
	parents := map[int]int{} // pid → ppid
	entries, _ := filepath.Glob("/proc/[0-9]*")
	for _, e := range entries {
		pid, _ := strconv.Atoi(filepath.Base(e))
		if st, err := os.ReadFile(e + "/stat"); err == nil {
			rest := string(st[strings.LastIndexByte(string(st), ')')+2:])
			if ppid, err := strconv.Atoi(strings.Fields(rest)[1]); err == nil {
				parents[pid] = ppid
			}
		}
	}
	below := func(pid, ancestor int) bool {
		for ; pid > 1; pid = parents[pid] {
			if parents[pid] == ancestor {
				return true
			}
		}
		return false
	}
	bwraps = []int{monitor}
	for pid, ppid := range parents {
		if ppid == monitor {
			bwraps = append(bwraps, pid) // the init of the zygote's pid namespace
		}
	}
	for pid := range parents {
		if !below(pid, monitor) {
			continue
		}
		// The zygote is one pid namespace below the host's; its sandboxes are two.
		if nspid := strings.Fields(procStatus(t, pid)["NSpid"]); len(nspid) == 2 && nspid[1] != "1" {
			return pid, bwraps
		}
	}
	t.Fatal("no fork server process below bubblewrap")
	return 0, nil
}

// socketInodes returns the inodes of the sockets pid holds open.
func socketInodes(t *testing.T, pid int) []string {
	t.Helper()
	fds, err := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	if err != nil {
		t.Fatal(err)
	}
	var inodes []string
	for _, fd := range fds {
		if link, err := os.Readlink(fd); err == nil {
			if ino, ok := strings.CutPrefix(link, "socket:["); ok {
				inodes = append(inodes, strings.TrimSuffix(ino, "]"))
			}
		}
	}
	return inodes
}

// Capabilities, as bits of /proc/pid/status's Cap* masks.
const (
	capSetGID   = 6
	capSetUID   = 7
	capSetPCap  = 8
	capNetAdmin = 12
	capSysAdmin = 21
)

// TestZygoteCapabilities: the fork server holds only what building a sandbox takes, and none of
// it effective between spawns; a sandbox's init and kernel hold nothing.
func TestZygoteCapabilities(t *testing.T) {
	p := newTestProviderWith(t, Options{PoolSize: -1}, knobs{})
	h := create(t, p, sandbox.CreateOptions{})
	zyg, bwraps := zygoteProcesses(t, p)
	for _, pid := range bwraps {
		st := procStatus(t, pid)
		t.Logf("bubblewrap %d: CapEff %s CapPrm %s CapBnd %s", pid, st["CapEff"], st["CapPrm"], st["CapBnd"])
	}
	st := procStatus(t, zyg)
	if eff := capMask(t, st, "CapEff"); eff != 0 {
		t.Errorf("the fork server's effective capabilities between spawns: %#x; want none", eff)
	}
	if p.perSandboxUIDs() {
		want := uint64(1<<capSysAdmin | 1<<capNetAdmin | 1<<capSetUID | 1<<capSetGID | 1<<capSetPCap)
		for _, field := range []string{"CapPrm", "CapBnd"} {
			if got := capMask(t, st, field); got != want {
				t.Errorf("the fork server's %s: %#x; want %#x (SYS_ADMIN, NET_ADMIN, SETUID, SETGID, SETPCAP)", field, got, want)
			}
		}
	}
	p.mu.Lock()
	b := p.live[h.ID]
	p.mu.Unlock()
	kernel, err := pidfdPID(b.kernel)
	if err != nil {
		t.Fatal(err)
	}
	for name, pid := range map[string]int{"init": b.pid, "kernel": kernel} {
		st := procStatus(t, pid)
		for _, field := range []string{"CapEff", "CapPrm", "CapBnd", "CapAmb"} {
			if got := capMask(t, st, field); got != 0 {
				t.Errorf("the sandbox's %s (pid %d) %s: %#x; want none", name, pid, field, got)
			}
		}
	}
}

// zygoteProbe tries to reach the given host processes from inside a sandbox: a signal, ptrace,
// their /proc root, and their sockets (by inode, among what the sandbox can see).
const zygoteProbe = `import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
targets = %s
sockets = set(%s)
def err(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return os.strerror(e.errno)
def ptrace(pid):
    r = os.fork()
    if r == 0:
        ok = libc.ptrace(ctypes.c_long(16), ctypes.c_long(pid), None, None)  # PTRACE_ATTACH
        os._exit(0 if ok == 0 else ctypes.get_errno())
    code = os.waitstatus_to_exitcode(os.waitpid(r, 0)[1])
    return "ok" if code == 0 else os.strerror(code)
def vm_read(pid):
    buf = ctypes.create_string_buffer(8)
    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    local = iovec(ctypes.cast(buf, ctypes.c_void_p), 8)
    remote = iovec(0x400000, 8)
    r = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return "ok" if r >= 0 else os.strerror(ctypes.get_errno())
out = {"starts": [], "sockets": []}
for pid in targets:
    out["kill %%d" %% pid] = err(lambda: os.kill(pid, 0))
    out["sigkill %%d" %% pid] = err(lambda: os.kill(pid, 9))
    out["root %%d" %% pid] = err(lambda: os.listdir("/proc/%%d/root/" %% pid))
    out["ptrace %%d" %% pid] = ptrace(pid)
    out["vm_read %%d" %% pid] = vm_read(pid)
seen = set()
for name in os.listdir("/proc"):
    if not name.isdigit():
        continue
    try:
        stat = open("/proc/%%s/stat" %% name).read()
        out["starts"].append(stat[stat.rindex(")") + 2:].split()[19])
    except OSError:
        pass
    try:
        for fd in os.listdir("/proc/%%s/fd" %% name):
            link = os.readlink("/proc/%%s/fd/%%s" %% (name, fd))
            if link.startswith("socket:["):
                seen.add(link[8:-1])
    except OSError:
        pass
for line in open("/proc/net/unix").read().splitlines()[1:]:
    seen.add(line.split()[6])
out["sockets"] = sorted(seen & sockets)
print(json.dumps(out))`

// TestProbeZygoteUnreachable: from inside a sandbox the fork server (and the bubblewrap above it)
// cannot be signalled, traced, read, entered through /proc/<pid>/root, or talked to over its
// sockets: it is not even in the sandbox's pid namespace. Run with the filter and without it, so
// that the refusals are the namespaces' and not the filter's alone.
func TestProbeZygoteUnreachable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		knobs knobs
	}{
		{"with seccomp", knobs{}},
		{"without seccomp", knobs{noSeccomp: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestProviderWith(t, Options{PoolSize: -1}, tc.knobs)
			h := create(t, p, sandbox.CreateOptions{})
			zyg, bwraps := zygoteProcesses(t, p)
			targets := append([]int{zyg}, bwraps...)
			starts := map[string]int{}
			var inodes []string
			for _, pid := range targets {
				starts[startTime(t, pid)] = pid
				inodes = append(inodes, socketInodes(t, pid)...)
			}
			if len(socketInodes(t, zyg)) == 0 {
				t.Fatal("the fork server holds no socket: the probe would prove nothing")
			}
			pids, quoted := make([]string, len(targets)), make([]string, len(inodes))
			for i, pid := range targets {
				pids[i] = strconv.Itoa(pid)
			}
			for i, ino := range inodes {
				quoted[i] = strconv.Quote(ino)
			}
			code := fmt.Sprintf(zygoteProbe, "["+strings.Join(pids, ", ")+"]", "["+strings.Join(quoted, ", ")+"]")
			var got map[string]any
			probeJSON(t, p, h, code, &got)
			for _, pid := range targets {
				for _, what := range []string{"kill", "sigkill", "root", "ptrace", "vm_read"} {
					key := fmt.Sprintf("%s %d", what, pid)
					r, _ := got[key].(string)
					// Not in the sandbox's pid namespace: no such process, no such /proc entry. With
					// the filter, ptrace and process_vm_readv are refused before that.
					want := map[string]string{"root": "No such file or directory"}[what]
					if want == "" {
						want = "No such process"
					}
					if !tc.knobs.noSeccomp && (what == "ptrace" || what == "vm_read") {
						want = "Operation not permitted"
					}
					if r != want {
						t.Errorf("%s: %q; want %q", key, r, want)
					}
				}
			}
			seen, _ := got["starts"].([]any)
			if len(seen) == 0 {
				t.Error("the probe saw no process in its own /proc")
			}
			for _, s := range seen {
				if pid, ok := starts[s.(string)]; ok {
					t.Errorf("the sandbox's /proc shows a process started when %d was", pid)
				}
			}
			if socks, _ := got["sockets"].([]any); len(socks) > 0 {
				t.Errorf("the sandbox sees the fork server's sockets %v", socks)
			}
		})
	}
}

// TestProbeInitUnreachable: the sandbox's own init (pid 1, which holds the setup socket to the
// proxy and ran as root of the zygote's user namespace) is as far out of the kernel's reach:
// its descriptors, memory and root cannot be opened, and signals do not end it.
func TestProbeInitUnreachable(t *testing.T) {
	p := newTestProviderWith(t, Options{PoolSize: -1}, knobs{})
	h := create(t, p, sandbox.CreateOptions{})
	var got map[string]string
	probeJSON(t, p, h, `import json, os, signal
def err(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return os.strerror(e.errno)
def fd_links():
    # Listing /proc/1/fd may be allowed (its owner is the user namespace's root); what a
    # descriptor is, and so reaching it, is not.
    try:
        fds = os.listdir("/proc/1/fd")
    except OSError as e:
        return os.strerror(e.errno)
    got = set(err(lambda: os.readlink("/proc/1/fd/" + fd)) for fd in fds)
    return got.pop() if len(got) == 1 else repr(sorted(got))
def getfd():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(434, 1, 0)  # pidfd_open(1, 0)
    if pidfd < 0:
        return os.strerror(ctypes.get_errno())
    for fd in range(64):
        if libc.syscall(438, pidfd, fd, 0) >= 0:  # pidfd_getfd
            return "ok"
        if ctypes.get_errno() != 9:  # EBADF: no such descriptor in I
            return os.strerror(ctypes.get_errno())
    return "no descriptor"
out = {
    "fd": fd_links(),
    "pidfd_getfd": getfd(),
    "mem": err(lambda: open("/proc/1/mem", "rb").close()),
    "root": err(lambda: os.listdir("/proc/1/root/")),
    "environ": err(lambda: open("/proc/1/environ", "rb").read()),
    "sigterm": err(lambda: os.kill(1, signal.SIGTERM)),
    "sigkill": err(lambda: os.kill(1, signal.SIGKILL)),
}
print(json.dumps(out))`, &got)
	for _, what := range []string{"fd", "mem", "root", "environ"} {
		if got[what] != "Permission denied" {
			t.Errorf("/proc/1/%s from the kernel: %q; want Permission denied", what, got[what])
		}
	}
	if got["pidfd_getfd"] != "Operation not permitted" {
		t.Errorf("pidfd_getfd of the init's descriptors: %q; want Operation not permitted", got["pidfd_getfd"])
	}
	t.Logf("signals to the sandbox's init: SIGTERM %s, SIGKILL %s", got["sigterm"], got["sigkill"])
	res, err := p.Run(context.Background(), h, "print(6*7)", sandbox.RunOptions{Timeout: time.Minute})
	if err != nil || strings.TrimSpace(res.Stdout) != "42" {
		t.Errorf("after signalling its init the sandbox answers %q, %v; want 42", res.Stdout, err)
	}
}
