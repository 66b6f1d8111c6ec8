package local

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Probes from inside the sandbox, one per finding of the audit of the local backend: each must be
// refused or contained, and the figures are asserted.

// probeJSON runs code that prints one JSON object and decodes it into v.
func probeJSON(t *testing.T, p *Provider, h sandbox.Handle, code string, v any) {
	t.Helper()
	res, err := p.Run(context.Background(), h, code, sandbox.RunOptions{Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatalf("probe: %v (stdout %q, error %+v)", err, res.Stdout, res.Error)
	}
	if res.Error != nil {
		t.Fatalf("probe raised %s: %s", res.Error.Name, res.Error.Traceback)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), v); err != nil {
		t.Fatalf("probe output %q: %v", res.Stdout, err)
	}
}

// syscallProbe calls each system call from Python through ctypes, each in a child process (a call
// that unexpectedly worked must not disturb the kernel), and reports the errno or "ok".
const syscallProbe = `import ctypes, json, mmap, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return "ok" if r >= 0 else os.strerror(ctypes.get_errno())
def i386_getpid():
    # mov eax, 20 (getpid in the i386 table); int 0x80; ret
    buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3]))
    r = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))()
    return "ok" if r >= 0 else os.strerror(-r)
params = ctypes.create_string_buffer(120)
def lease(cmd):
    # A file of the sandbox's own, with no other descriptor open on it: what a write lease needs.
    fd = os.open("/mnt/data/.probe-lease", os.O_RDONLY | os.O_CREAT, 0o600)
    return call(72, fd, cmd, 1)  # fcntl(fd, cmd, F_WRLCK)
def uevents(protocol):
    r = call(41, 16, 2, protocol)  # socket(AF_NETLINK, SOCK_DGRAM, protocol)
    if r != "ok":
        return r
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 15)
    s.bind((0, 1))  # the kernel's uevent multicast group
    return "ok"
probes = {
    "io_uring_setup": lambda: call(425, 8, ctypes.addressof(params)),
    "bpf": lambda: call(321, 0, 0, 0),
    "perf_event_open": lambda: call(298, 0, 0, -1, -1, 0),
    "userfaultfd": lambda: call(323, 0),
    "keyctl": lambda: call(250, 0, -3, 0),
    "add_key": lambda: call(248, ctypes.addressof(ctypes.create_string_buffer(b"user")), ctypes.addressof(ctypes.create_string_buffer(b"k")), 0, 0, -3),
    "request_key": lambda: call(249, 0, 0, 0, 0),
    "kexec_load": lambda: call(246, 0, 0, 0, 0),
    "init_module": lambda: call(175, 0, 0, 0),
    "finit_module": lambda: call(313, -1, 0, 0),
    "mount": lambda: call(165, 0, ctypes.addressof(ctypes.create_string_buffer(b"/tmp")), ctypes.addressof(ctypes.create_string_buffer(b"tmpfs")), 0, 0),
    "umount2": lambda: call(166, ctypes.addressof(ctypes.create_string_buffer(b"/tmp")), 0),
    "fsopen": lambda: call(430, ctypes.addressof(ctypes.create_string_buffer(b"tmpfs")), 0),
    "open_tree": lambda: call(428, -100, ctypes.addressof(ctypes.create_string_buffer(b"/")), 0),
    "unshare": lambda: call(272, 0x10000000),
    "setns": lambda: call(308, 0, 0),
    "clone_newuser": lambda: call(56, 0x10000000 | 17, 0, 0, 0, 0),
    "clone3": lambda: call(435, 0, 0),
    "ptrace": lambda: call(101, 0, 1, 0, 0),
    "pivot_root": lambda: call(155, 0, 0),
    "chroot": lambda: call(161, ctypes.addressof(ctypes.create_string_buffer(b"/tmp"))),
    "x32_getpid": lambda: call(0x40000000 | 39),
    "i386_getpid": i386_getpid,
    "socket_vsock": lambda: call(41, 40, 1, 0),
    "fcntl_setlease": lambda: lease(1024),
    "fcntl_setlease_upper_half": lambda: lease(1 << 32 | 1024),
    "fcntl_notify": lambda: call(72, os.open("/mnt/data", os.O_RDONLY), 1026, 0x80000000 | 1),
    "socket_netlink_uevent": lambda: uevents(15),
    "socket_netlink_uevent_upper_half": lambda: uevents(1 << 32 | 15),
    "socket_netlink_route": lambda: call(41, 16, 3, 0),
}
out = {}
for name, fn in probes.items():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(w, fn().encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    out[name] = os.read(r, 200).decode() or "crashed"
    os.close(r)
print(json.dumps(out))`

func TestProbeSyscalls(t *testing.T) {
	if !onAMD64 {
		t.Skip("the probes use x86_64 system call numbers")
	}
	want := map[string]string{
		"io_uring_setup": "Operation not permitted", "bpf": "Operation not permitted",
		"perf_event_open": "Operation not permitted", "userfaultfd": "Operation not permitted",
		"keyctl": "Operation not permitted", "add_key": "Operation not permitted",
		"request_key": "Operation not permitted", "kexec_load": "Operation not permitted",
		"init_module": "Operation not permitted", "finit_module": "Operation not permitted",
		"mount": "Operation not permitted", "umount2": "Operation not permitted",
		"fsopen": "Operation not permitted", "open_tree": "Operation not permitted",
		"unshare": "Operation not permitted", "setns": "Operation not permitted",
		"clone_newuser": "Operation not permitted", "clone3": "Function not implemented",
		"ptrace": "Operation not permitted", "pivot_root": "Operation not permitted",
		"chroot": "Operation not permitted", "x32_getpid": "Function not implemented",
		"i386_getpid": "Operation not permitted", "socket_vsock": "Address family not supported by protocol",
		"fcntl_setlease": "Operation not permitted", "fcntl_setlease_upper_half": "Operation not permitted",
		"fcntl_notify":          "Operation not permitted",
		"socket_netlink_uevent": "Protocol not supported", "socket_netlink_uevent_upper_half": "Protocol not supported",
		"socket_netlink_route": "ok",
	}
	p := sharedProvider(t)
	var got map[string]string
	probeJSON(t, p, create(t, p, sandbox.CreateOptions{}), syscallProbe, &got)
	for name, errno := range want {
		if got[name] != errno {
			t.Errorf("%s: %q; want %q", name, got[name], errno)
		}
	}
	// The same probes without the filter: what this host's kernel would otherwise allow, so that
	// the refusals above are the filter's.
	bare := newTestProviderWith(t, Options{PoolSize: -1}, knobs{noSeccomp: true})
	var open map[string]string
	probeJSON(t, bare, create(t, bare, sandbox.CreateOptions{}), syscallProbe, &open)
	t.Logf("without the filter: %v", open)
	// Leases, dnotify and the host's uevents are refused by the filter alone.
	for _, name := range []string{"fcntl_setlease", "fcntl_setlease_upper_half", "fcntl_notify", "socket_netlink_uevent"} {
		if open[name] != "ok" {
			t.Errorf("%s without the filter: %q; want ok (else the probe proves nothing)", name, open[name])
		}
	}
	for _, name := range []string{"io_uring_setup", "i386_getpid", "keyctl"} {
		if open[name] != "ok" {
			t.Logf("%s is refused by this host even without the filter (%s)", name, open[name])
		}
	}
	if open["i386_getpid"] != "ok" && open["io_uring_setup"] != "ok" {
		t.Errorf("without the filter neither io_uring nor the i386 ABI works: the probes prove nothing here")
	}
}

func newTestProviderWith(t testing.TB, opts Options, k knobs) *Provider {
	t.Helper()
	p, err := newProvider(testOptions(opts), testKnobs(k))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

func requireCgroups(t *testing.T, p *Provider) {
	t.Helper()
	if m := p.Isolation().Limits; m == string(modeRlimit) {
		t.Skipf("no writable cgroup on this host (mode %s): the rlimit fallback is tested by the Fallback tests", m)
	}
}

// TestProbeMemoryAggregate: four children that each touch 400 MiB stay, together, under the
// sandbox's 512 MiB.
func TestProbeMemoryAggregate(t *testing.T) {
	p := newTestProvider(t, Options{PoolSize: -1, MemoryLimit: 512 << 20})
	requireCgroups(t, p)
	h := create(t, p, sandbox.CreateOptions{})
	var got struct{ Alive, RSS int64 }
	probeJSON(t, p, h, `import json, os, time
pipes = []
for i in range(4):
    r, w = os.pipe()
    if os.fork() == 0:
        try:
            data = b"x" * (400 << 20)
            os.write(w, b"1")
        except MemoryError:
            os.write(w, b"0")
        time.sleep(60)
        os._exit(0)
    os.close(w)
    pipes.append(r)
for r in pipes:
    os.read(r, 1)
time.sleep(0.5)
alive = rss = 0
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) not in (1, os.getpid()):
        try:
            rss += [int(l.split()[1]) * 1024 for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS:")][0]
            alive += 1
        except (OSError, IndexError):
            pass
print(json.dumps({"alive": alive, "rss": rss}))`, &got)
	t.Logf("%d children alive, %d MiB resident together", got.Alive, got.RSS>>20)
	if got.RSS >= 512<<20 {
		t.Errorf("children hold %d MiB together; want under the 512 MiB limit", got.RSS>>20)
	}
	b, _ := p.lookup(h)
	if b != nil && b.cg != nil {
		if peak := b.cg.memoryPeak(); peak > 512<<20 {
			t.Errorf("the cgroup peaked at %d MiB; want at most 512", peak>>20)
		}
	}
}

// TestProbeSocketFlood: filled unix socket pairs (3600, over 30 processes) queue kernel memory
// that the sandbox's memory limit bounds: the flooders are stopped, or the whole sandbox is.
func TestProbeSocketFlood(t *testing.T) {
	p := newTestProvider(t, Options{PoolSize: -1, MemoryLimit: 512 << 20})
	requireCgroups(t, p)
	h := create(t, p, sandbox.CreateOptions{})
	var got struct{ Pairs, Queued int64 }
	res, err := p.Run(context.Background(), h, `import json, os, socket, time
pipes = {}
for i in range(30):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        # Socket memory is not in anyone's RSS: make the flooders, not the kernel, the first victims
        # of a per-process OOM killer (cgroup v1). With memory.oom.group (v2) the sandbox goes.
        open("/proc/self/oom_score_adj", "w").write("1000")
        queued = pairs = 0
        keep = []
        try:
            for j in range(120):
                a, b = socket.socketpair()
                a.setblocking(False)
                keep.append((a, b))
                pairs += 1
                try:
                    while True:
                        queued += a.send(b"x" * 65536)
                except OSError:
                    pass
        except OSError:
            pass
        os.write(w, json.dumps([pairs, queued]).encode())
        time.sleep(60)
        os._exit(0)
    os.close(w)
    pipes[pid] = r
reports = {}
for pid, r in pipes.items():
    data = os.read(r, 100)
    if data:
        reports[pid] = json.loads(data)
time.sleep(0.5)
# What is held now: the reports of the flooders still alive (a killed one freed its buffers).
pairs = queued = 0
for pid, (p, q) in reports.items():
    if os.waitpid(pid, os.WNOHANG) == (0, 0):
        pairs += p
        queued += q
print(json.dumps({"pairs": pairs, "queued": queued}))`, sandbox.RunOptions{Timeout: 2 * time.Minute})
	if err != nil {
		if !strings.Contains(err.Error(), "ran out of memory") {
			t.Fatalf("probe: %v", err)
		}
		t.Logf("contained by stopping the sandbox: %v", err)
		return
	}
	if res.Error != nil || json.Unmarshal([]byte(strings.TrimSpace(res.Stdout)), &got) != nil {
		t.Fatalf("probe: %q %+v", res.Stdout, res.Error)
	}
	t.Logf("%d socket pairs held by the surviving processes, %d MiB queued in them", got.Pairs, got.Queued>>20)
	if got.Queued >= 512<<20 {
		t.Errorf("%d MiB queued in socket buffers; want under the 512 MiB limit", got.Queued>>20)
	}
}

// sandboxTicks is the CPU time (clock ticks, all threads) used so far by every process of h's
// sandbox.
func sandboxTicks(t *testing.T, p *Provider, h sandbox.Handle) int64 {
	t.Helper()
	var ticks int64
	for _, pid := range descendants(sandboxPID(t, p, h)) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		if len(f) > 12 {
			u, _ := strconv.ParseInt(f[11], 10, 64)
			s, _ := strconv.ParseInt(f[12], 10, 64)
			ticks += u + s
		}
	}
	return ticks
}

// TestProbeLeftoverCPU: a busy daemon thread and a double-forked busy process left behind by a
// cell burn no CPU between cells, and carry on in the next one.
func TestProbeLeftoverCPU(t *testing.T) {
	for _, tc := range []struct {
		name string
		k    knobs
	}{{"cgroup freezer", knobs{}}, {"SIGSTOP fallback", knobs{noCgroups: true}}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestProviderWith(t, Options{PoolSize: -1}, tc.k)
			if tc.k == (knobs{}) && !p.cg.canFreeze() {
				t.Skip("no cgroup freezer on this host: the SIGSTOP fallback is tested beside")
			}
			h := create(t, p, sandbox.CreateOptions{})
			run(t, p, h, `import os, threading
count = [0]
def spin():
    while True:
        count[0] += 1
threading.Thread(target=spin, daemon=True).start()
if os.fork() == 0:
    if os.fork() == 0:
        while True:
            pass
    os._exit(0)
os.wait()`)
			before := sandboxTicks(t, p, h)
			// A second, unrelated sandbox keeps the clock: one second passes while h is idle.
			clock := sharedProvider(t)
			run(t, clock, create(t, clock, sandbox.CreateOptions{}), "import time\ntime.sleep(1)")
			burnt := sandboxTicks(t, p, h) - before
			t.Logf("between cells the sandbox used %d ms of CPU in one second", burnt*10)
			if burnt > 10 {
				t.Errorf("%d ms of CPU between cells; want none (at most 100 ms)", burnt*10)
			}
			res := run(t, p, h, "import time\na = count[0]\ntime.sleep(0.3)\ncount[0] > a")
			if mainText(res) != "True" {
				t.Errorf("the thread does not run again during the next cell: %q", mainText(res))
			}
		})
	}
}

// TestProbeDeepDirectory: data written below a directory deeper than PATH_MAX counts against the
// disk limit like any other (it is a tmpfs of that size: nothing to walk).
func TestProbeDeepDirectory(t *testing.T) {
	p := newTestProvider(t, Options{PoolSize: -1, MaxDiskSize: 32 << 20})
	h := create(t, p, sandbox.CreateOptions{})
	var got struct {
		Depth int
		Error int
		Used  int64
	}
	probeJSON(t, p, h, `import json, os
os.chdir("/mnt/data")
name = "d" * 250
depth = 0
while depth < 100:
    os.mkdir(name)
    os.chdir(name)
    depth += 1
err = 0
try:
    with open("blob", "wb") as f:
        for _ in range(64):
            f.write(b"x" * (1 << 20))
            f.flush()
except OSError as e:
    err = e.errno
st = os.statvfs("/mnt/data")
print(json.dumps({"depth": len(os.getcwd()), "error": err, "used": (st.f_blocks - st.f_bfree) * st.f_frsize}))`, &got)
	if got.Depth <= 4096 {
		t.Fatalf("path length %d; want deeper than PATH_MAX", got.Depth)
	}
	if got.Error != 28 || got.Used > 32<<20 {
		t.Errorf("errno %d, %d MiB used at a path of %d bytes; want ENOSPC (28) within 32 MiB", got.Error, got.Used>>20, got.Depth)
	}
}

// TestProbeInotifyPerTenant: one tenant taking every inotify instance its uid may have leaves
// another tenant's untouched (each sandbox is a host uid of its own).
func TestProbeInotifyPerTenant(t *testing.T) {
	p := sharedProvider(t)
	if p.uids.size == 1 {
		t.Skip("sandboxes share the proxy's uid (not root): per-tenant kernel quotas need root")
	}
	a := create(t, p, sandbox.CreateOptions{})
	b := create(t, p, sandbox.CreateOptions{})
	const initInotify = `import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
fds = []
err = 0
for i in range(%d):
    fd = libc.inotify_init1(0)
    if fd < 0:
        err = ctypes.get_errno()
        break
    fds.append(fd)
print(json.dumps({"n": len(fds), "errno": err}))`
	var hog, other struct {
		N     int
		Errno int
	}
	probeJSON(t, p, a, fmt.Sprintf(initInotify, 10000), &hog)
	if hog.Errno != 24 || hog.N == 0 || hog.N >= DefaultMaxOpenFiles {
		t.Fatalf("tenant a opened %d inotify instances, then errno %d; want the per-user limit (EMFILE) before its open-file limit", hog.N, hog.Errno)
	}
	probeJSON(t, p, b, fmt.Sprintf(initInotify, 16), &other)
	if other.N != 16 {
		t.Errorf("with tenant a holding %d instances, tenant b got %d of 16 (errno %d)", hog.N, other.N, other.Errno)
	}
}

// TestProbeFilesystemView: only what the interpreter needs of /usr, no host path of the proxy in
// mountinfo, a cgroup namespace of its own, the low open-file limit.
func TestProbeFilesystemView(t *testing.T) {
	p := sharedProvider(t)
	var got struct {
		Present   []string
		MountInfo string
		Cgroup    string
		NoFile    int
	}
	probeJSON(t, p, create(t, p, sandbox.CreateOptions{}), `import json, os, resource
present = [d for d in ["/usr/local", "/usr/local/etc", "/usr/include", "/usr/src", "/usr/sbin", "/usr/share/doc", "/usr/lib/jvm", "/usr/lib/gcc", "/home", "/root", "/var", "/run"] if os.path.exists(d)]
print(json.dumps({"present": present, "mountinfo": open("/proc/self/mountinfo").read(),
                  "cgroup": open("/proc/self/cgroup").read(), "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))`, &got)
	if len(got.Present) > 0 {
		t.Errorf("visible in the sandbox: %v", got.Present)
	}
	for _, host := range []string{p.opts.WorkDir, p.base, "/usr/local", os.TempDir() + "/", "/work"} {
		if strings.Contains(got.MountInfo, " "+host) {
			t.Errorf("mountinfo shows host path %s:\n%s", host, got.MountInfo)
		}
	}
	if p.cg != nil && strings.Contains(got.Cgroup, "ciproxy") {
		t.Errorf("/proc/self/cgroup shows the host's cgroup path: %q", got.Cgroup)
	}
	if got.NoFile != DefaultMaxOpenFiles {
		t.Errorf("RLIMIT_NOFILE %d; want %d", got.NoFile, DefaultMaxOpenFiles)
	}
}

// TestIsolationMode: the provider says which mode it is in, and loudly so when it is the weaker.
func TestIsolationMode(t *testing.T) {
	iso := sharedProvider(t).Isolation()
	t.Logf("this host: %s", iso)
	if iso.Limits != string(modeCgroup2) {
		t.Logf("cgroup v2 tests skip: the host delegates no cgroup v2 memory and pids controllers (limits %s)", iso.Limits)
	}
	weak := newTestProviderWith(t, Options{PoolSize: -1}, knobs{noCgroups: true}).Isolation()
	if weak.Limits != string(modeRlimit) || len(weak.Warnings) == 0 || !strings.Contains(strings.Join(weak.Warnings, " "), "per process") {
		t.Errorf("without cgroups: %s; want limits rlimit with a warning about per-process memory", weak)
	}
}

// TestFallbackLimits: without cgroups each process is still bound (RLIMIT_AS, RLIMIT_NPROC), and
// /tmp is a full disk before memory runs out.
func TestFallbackLimits(t *testing.T) {
	p := newTestProviderWith(t, Options{PoolSize: -1, MemoryLimit: 512 << 20, MaxProcesses: 16}, knobs{noCgroups: true})
	h := create(t, p, sandbox.CreateOptions{})
	var got struct {
		Child    string
		Forked   int
		TmpError int
	}
	probeJSON(t, p, h, `import json, os, time
r, w = os.pipe()
if os.fork() == 0:
    try:
        data = b"x" * (600 << 20)
        os.write(w, b"allocated")
    except MemoryError:
        os.write(w, b"MemoryError")
    os._exit(0)
os.close(w)
child = os.read(r, 100).decode()
os.wait()
forked = 0
pids = []
try:
    for i in range(64):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        pids.append(pid)
        forked += 1
except OSError:
    pass
for pid in pids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
err = 0
try:
    for i in range(40):
        with open(f"/tmp/fill{i}", "wb") as f:
            for _ in range(10):
                f.write(b"x" * (1 << 20))
except OSError as e:
    err = e.errno
for name in os.listdir("/tmp"):
    if name.startswith("fill"):
        os.remove("/tmp/" + name)
print(json.dumps({"child": child, "forked": forked, "tmperror": err}))`, &got)
	if got.Child != "MemoryError" {
		t.Errorf("a child allocating 600 MiB under a 512 MiB limit: %q; want MemoryError", got.Child)
	}
	if got.Forked >= 16 {
		t.Errorf("forked %d processes under max_processes 16", got.Forked)
	}
	if got.TmpError != 28 {
		t.Errorf("filling /tmp: errno %d; want ENOSPC (28) at half the memory limit", got.TmpError)
	}
}
