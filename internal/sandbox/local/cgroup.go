package local

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Cgroups of local sandboxes. Each sandbox gets a cgroup of its own under a parent that the
// provider creates below the proxy's own cgroup (so whatever bounds the proxy bounds its
// sandboxes too), in every hierarchy the host lets this process write:
//
//   - cgroup v2 with the memory and pids controllers delegated (a writable subtree: a container
//     with its own cgroup namespace, a systemd unit with Delegate=yes): memory.max (it counts
//     anonymous memory, tmpfs and kernel memory such as socket buffers), memory.swap.max=0,
//     memory.oom.group=1 on the leaf of its processes (v2Box), pids.max and cpu.max.
//   - cgroup v1 memory and pids controllers, where the process may write them (as root):
//     memory.limit_in_bytes (it counts the same: anonymous, page cache and tmpfs, kernel memory),
//     memory.memsw.limit_in_bytes equal to it (no swap), pids.max, and cpu.cfs_quota_us when the
//     cpu controller is there.
//   - for freezing and killing, the v2 core files (cgroup.freeze, cgroup.kill: no controller
//     needed, so a v2 hierarchy mounted beside v1 ones serves) or else the v1 freezer.
//
// A controller that is missing is simply not used: cgroupHost.describe says what is.

// cgroupSettings are the limits of one sandbox's cgroup.
type cgroupSettings struct {
	memory    int64   // bytes, 0 for none
	processes int     // pids.max, 0 for none
	cpus      float64 // CPUs of time per period, 0 for none
}

// cgroupFS is what this file does to cgroup filesystems. osCgroupFS does it to the kernel's; a
// test puts a fake with cgroupfs's rules in its place (a plain directory has none of them: mkdir
// does not fill it with control files, a write to a missing file creates it, nothing is ever
// EBUSY).
type cgroupFS interface {
	Mkdir(dir string) error
	Remove(dir string) error
	WriteFile(path, value string) error
	ReadFile(path string) (string, error) // the content without surrounding white space
	Exists(path string) bool
}

type osCgroupFS struct{}

func (osCgroupFS) Mkdir(dir string) error  { return os.Mkdir(dir, 0o755) }
func (osCgroupFS) Remove(dir string) error { return os.Remove(dir) }
func (osCgroupFS) WriteFile(path, value string) error {
	return os.WriteFile(path, []byte(value), 0)
}
func (osCgroupFS) ReadFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}
func (osCgroupFS) Exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// cgroupHost is where this provider's sandbox cgroups go, hierarchy by hierarchy.
type cgroupHost struct {
	fs cgroupFS
	// v2 is the provider's parent directory in the unified hierarchy, "" when there is none;
	// v2Controllers are the controllers its children get (of memory, pids, cpu).
	v2            string
	v2Controllers []string
	// v1 maps a v1 controller (memory, pids, cpu, freezer) to the provider's parent directory.
	v1 map[string]string
}

// cgroupMode names what limits memory and processes, for logs and checks.
type cgroupMode string

const (
	modeCgroup2 cgroupMode = "cgroup2"
	modeCgroup1 cgroupMode = "cgroup1"
	modeRlimit  cgroupMode = "rlimit"
)

func (h *cgroupHost) mode() cgroupMode {
	switch {
	case h == nil:
		return modeRlimit
	case slices.Contains(h.v2Controllers, "memory") && slices.Contains(h.v2Controllers, "pids"):
		return modeCgroup2
	case h.v1["memory"] != "" && h.v1["pids"] != "":
		return modeCgroup1
	}
	return modeRlimit
}

// canFreeze tells whether a sandbox's processes can be frozen through its cgroup.
func (h *cgroupHost) canFreeze() bool {
	return h != nil && (h.v2 != "" || h.v1["freezer"] != "")
}

// describe says in a sentence what the cgroups give.
func (h *cgroupHost) describe() string {
	if h == nil {
		return "no cgroup is writable"
	}
	var parts []string
	if h.v2 != "" {
		what := "cgroup v2 (kill, freeze"
		for _, c := range h.v2Controllers {
			what += ", " + c
		}
		parts = append(parts, what+")")
	}
	var v1 []string
	for _, c := range []string{"memory", "pids", "cpu", "freezer"} {
		if h.v1[c] != "" {
			v1 = append(v1, c)
		}
	}
	if len(v1) > 0 {
		parts = append(parts, "cgroup v1 ("+strings.Join(v1, ", ")+")")
	}
	return strings.Join(parts, " and ")
}

// cgroupMount is one mounted cgroup hierarchy of this process.
type cgroupMount struct {
	dir         string   // where this process's own cgroup is, in the mounted filesystem
	controllers []string // v1: the controllers the hierarchy has; v2: nil
}

// ownCgroups finds this process's own cgroup in every mounted hierarchy, from /proc/self/cgroup
// and /proc/self/mountinfo. v2 is the unified hierarchy ("" if none).
func ownCgroups() (v2 string, v1 []cgroupMount, err error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", nil, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	return parseOwnCgroups(string(data), f)
}

// parseOwnCgroups is ownCgroups on the contents of /proc/self/cgroup and /proc/self/mountinfo.
func parseOwnCgroups(cgroups string, mountinfo io.Reader) (v2 string, v1 []cgroupMount, err error) {
	paths := map[string]string{} // controllers field of /proc/self/cgroup → path
	for _, line := range strings.Split(strings.TrimSpace(cgroups), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 {
			paths[parts[1]] = parts[2]
		}
	}
	sc := bufio.NewScanner(mountinfo)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || sep+3 >= len(fields) {
			continue
		}
		root, mountpoint, fstype, super := unescapeMount(fields[3]), unescapeMount(fields[4]), fields[sep+1], fields[sep+3]
		switch fstype {
		case "cgroup2":
			if p, ok := paths[""]; ok && v2 == "" {
				// A provider may have moved the proxy into its leaf (delegatedV2): the proxy's
				// cgroup is still the one above it, where every provider's parent goes.
				p = strings.TrimSuffix(p, "/"+proxyLeaf)
				if dir, ok := below(mountpoint, root, p); ok {
					v2 = dir
				}
			}
		case "cgroup":
			var ctrls []string
			for _, o := range strings.Split(super, ",") {
				if slices.Contains([]string{"memory", "pids", "cpu", "freezer"}, o) {
					ctrls = append(ctrls, o)
				}
			}
			if len(ctrls) == 0 {
				continue
			}
			for key, p := range paths {
				if slices.Contains(strings.Split(key, ","), ctrls[0]) {
					if dir, ok := below(mountpoint, root, p); ok {
						v1 = append(v1, cgroupMount{dir: dir, controllers: ctrls})
					}
				}
			}
		}
	}
	return v2, v1, sc.Err()
}

// below maps a cgroup path to its directory under a mount of the hierarchy whose root is root.
// Both are relative to this process's cgroup namespace, so a mount whose root lies above that
// namespace's root has a root of "/.." (one level up) or deeper: the kernel does not say which
// cgroups lie between, so no path can be mapped into it. That is the host's tree bind-mounted into
// a container with a cgroup namespace of its own (podman's default on a cgroup v2 host, where
// /proc/self/cgroup says "0::/"): cleaned, "/.." would be "/" and the proxy would take the host's
// root cgroup for its own, and make its sandboxes' cgroups there, outside the container's limits.
func below(mountpoint, root, path string) (string, bool) {
	if root == "/.." || strings.HasPrefix(root, "/../") {
		return "", false
	}
	rel, err := filepath.Rel(root, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return filepath.Join(mountpoint, rel), true
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// newCgroupHost creates the provider's parent cgroup, named name, in every hierarchy it can
// write, and returns nil when there is none. Failures are not errors: a hierarchy that cannot be
// written is left out.
func newCgroupHost(name string) *cgroupHost {
	v2, v1, err := ownCgroups()
	if err != nil {
		return nil
	}
	return openCgroupHost(osCgroupFS{}, name, v2, v1)
}

// openCgroupHost is newCgroupHost on fsys, given this process's own cgroups.
func openCgroupHost(fsys cgroupFS, name, v2 string, v1 []cgroupMount) *cgroupHost {
	h := &cgroupHost{fs: fsys, v1: map[string]string{}}
	if v2 != "" {
		h.v2, h.v2Controllers = delegatedV2(fsys, v2, name)
	}
	for _, m := range v1 {
		// Only a hierarchy that serves a controller gets a directory: one made and never
		// recorded would outlive the provider (the v1 freezer beside a v2 hierarchy did).
		var serves []string
		for _, c := range m.controllers {
			if h.v1[c] == "" && !(c == "freezer" && h.v2 != "") {
				serves = append(serves, c)
			}
		}
		if len(serves) == 0 {
			continue
		}
		dir := filepath.Join(m.dir, name)
		if err := fsys.Mkdir(dir); err != nil && !errors.Is(err, fs.ErrExist) {
			continue
		}
		for _, c := range serves {
			h.v1[c] = dir
		}
	}
	if h.v2 == "" && len(h.v1) == 0 {
		return nil
	}
	return h
}

// proxyLeaf is the v2 cgroup, below its own, into which the proxy moves itself to hand
// controllers to its providers' parents.
const proxyLeaf = "ciproxy-proxy"

// delegatedV2 creates the provider's parent in the unified hierarchy below own and enables for its
// children what controllers it can. The v2 rule that a cgroup with processes cannot hand
// controllers to children means the processes in own, the proxy and whatever runs beside it,
// must first leave it for a leaf beside the sandboxes' parents (what a service with
// Delegate=yes is expected to do).
func delegatedV2(fsys cgroupFS, own, name string) (string, []string) {
	dir := filepath.Join(own, name)
	if err := fsys.Mkdir(dir); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", nil
	}
	if !fsys.Exists(filepath.Join(dir, "cgroup.kill")) {
		// Before Linux 5.14 there is no cgroup.kill: not worth a hierarchy of its own.
		fsys.Remove(dir)
		return "", nil
	}
	controllers, _ := fsys.ReadFile(filepath.Join(own, "cgroup.controllers"))
	var want []string
	for _, c := range strings.Fields(controllers) {
		if c == "memory" || c == "pids" || c == "cpu" {
			want = append(want, c)
		}
	}
	if len(want) == 0 {
		return dir, nil
	}
	enable := func(d string) error {
		var b strings.Builder
		for _, c := range want {
			b.WriteString("+" + c + " ")
		}
		return fsys.WriteFile(filepath.Join(d, "cgroup.subtree_control"), b.String())
	}
	if err := enable(own); err != nil {
		// EBUSY: own has processes: this one, and any the unit or container started beside it
		// (a shell or an init that runs the proxy, a health check). Move them all into a leaf and
		// try again; one forked meanwhile makes it EBUSY again, so a few times.
		leaf := filepath.Join(own, proxyLeaf)
		if err := fsys.Mkdir(leaf); err != nil && !errors.Is(err, fs.ErrExist) {
			return dir, nil
		}
		if err := fsys.WriteFile(filepath.Join(leaf, "cgroup.procs"), "0"); err != nil {
			return dir, nil
		}
		for try := 0; ; try++ {
			procs, _ := fsys.ReadFile(filepath.Join(own, "cgroup.procs"))
			for _, pid := range strings.Fields(procs) {
				// A process that exited meanwhile is ESRCH; one that cannot move shows below.
				fsys.WriteFile(filepath.Join(leaf, "cgroup.procs"), pid)
			}
			err := enable(own)
			if err == nil {
				break
			}
			if try == 2 {
				return dir, nil
			}
		}
	}
	if err := enable(dir); err != nil {
		return dir, nil
	}
	enabled, _ := fsys.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	return dir, strings.Fields(enabled)
}

// cgroupRoots are this process's own cgroups in every hierarchy a provider may use, whether or
// not this one uses it: where the sweep looks for what dead providers left.
func cgroupRoots() []string {
	v2, v1, err := ownCgroups()
	if err != nil {
		return nil
	}
	var out []string
	if v2 != "" {
		out = append(out, v2)
	}
	for _, m := range v1 {
		if !slices.Contains(out, m.dir) {
			out = append(out, m.dir)
		}
	}
	return out
}

// close removes the provider's parent cgroups (they must be empty by then).
func (h *cgroupHost) close() {
	if h == nil {
		return
	}
	for _, d := range h.dirs() {
		removeCgroup(h.fs, d)
	}
}

func (h *cgroupHost) dirs() []string {
	if h == nil {
		return nil
	}
	var out []string
	if h.v2 != "" {
		out = append(out, h.v2)
	}
	for _, d := range h.v1 {
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// sandboxCgroup is one sandbox's cgroup in every hierarchy of its host.
type sandboxCgroup struct {
	host *cgroupHost
	name string
	// mu guards made: a kill can come from the request side while the sandbox's own reaper
	// goroutine removes the cgroups.
	mu   sync.Mutex
	made []string // directories created, to remove
}

// dirs returns the cgroup directories that still exist, parents before their children.
func (cg *sandboxCgroup) dirs() []string {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	return cg.made
}

// In the unified hierarchy a sandbox's cgroup holds its limits and two leaves: v2Box, where its
// processes live and which alone is frozen between executions, and v2Copy, where the helper that
// writes placed files runs (charge.go), unfrozen, while both count against the limits above them.
// The memory controller is enabled for the leaves so that memory.oom.group can be set on the box
// only: a helper the controller kills takes no process of the sandbox with it.
const (
	v2Box  = "box"
	v2Copy = "copy"
)

// v2Dir is the sandbox's cgroup in the unified hierarchy, or its leaf below it; "" without one.
func (cg *sandboxCgroup) v2Dir(leaf string) string {
	if cg == nil || cg.host.v2 == "" {
		return ""
	}
	return filepath.Join(cg.host.v2, cg.name, leaf)
}

// procsDirs are the directories whose cgroup.procs hold the sandbox's processes.
func (cg *sandboxCgroup) procsDirs() []string {
	var out []string
	for _, d := range cg.dirs() {
		switch d {
		case cg.v2Dir(""), cg.v2Dir(v2Copy):
			continue
		}
		out = append(out, d)
	}
	return out
}

// create makes the sandbox's cgroups and writes its limits.
func (h *cgroupHost) create(name string, s cgroupSettings) (*sandboxCgroup, error) {
	cg := &sandboxCgroup{host: h, name: name}
	for _, parent := range h.dirs() {
		dir := filepath.Join(parent, name)
		if err := h.fs.Mkdir(dir); err != nil {
			cg.remove()
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		cg.mu.Lock()
		cg.made = append(cg.made, dir)
		cg.mu.Unlock()
	}
	var writes [][2]string
	if h.v2 != "" {
		dir := filepath.Join(h.v2, name)
		for _, c := range h.v2Controllers {
			switch c {
			case "memory":
				if s.memory > 0 {
					writes = append(writes, [2]string{filepath.Join(dir, "memory.max"), strconv.FormatInt(s.memory, 10)})
					// A kernel without swap accounting (built or booted so) has no
					// memory.swap.max, as v1 then has no memsw file.
					if swap := filepath.Join(dir, "memory.swap.max"); h.fs.Exists(swap) {
						writes = append(writes, [2]string{swap, "0"})
					}
				}
			case "pids":
				if s.processes > 0 {
					writes = append(writes, [2]string{filepath.Join(dir, "pids.max"), strconv.Itoa(s.processes)})
				}
			case "cpu":
				if s.cpus > 0 {
					writes = append(writes, [2]string{filepath.Join(dir, "cpu.max"), fmt.Sprintf("%d %d", cpuQuota(s.cpus), cpuPeriod)})
				}
			}
		}
	}
	if d := h.v1["memory"]; d != "" && s.memory > 0 {
		dir := filepath.Join(d, name)
		writes = append(writes, [2]string{filepath.Join(dir, "memory.limit_in_bytes"), strconv.FormatInt(s.memory, 10)})
		if h.fs.Exists(filepath.Join(dir, "memory.memsw.limit_in_bytes")) {
			writes = append(writes, [2]string{filepath.Join(dir, "memory.memsw.limit_in_bytes"), strconv.FormatInt(s.memory, 10)})
		}
	}
	if d := h.v1["pids"]; d != "" && s.processes > 0 {
		writes = append(writes, [2]string{filepath.Join(d, name, "pids.max"), strconv.Itoa(s.processes)})
	}
	if d := h.v1["cpu"]; d != "" && s.cpus > 0 {
		writes = append(writes,
			[2]string{filepath.Join(d, name, "cpu.cfs_period_us"), strconv.Itoa(cpuPeriod)},
			[2]string{filepath.Join(d, name, "cpu.cfs_quota_us"), strconv.Itoa(cpuQuota(s.cpus))})
	}
	for _, w := range writes {
		if err := h.fs.WriteFile(w[0], w[1]); err != nil {
			cg.remove()
			return nil, fmt.Errorf("cgroup: %w", err)
		}
	}
	if err := cg.makeLeaves(); err != nil {
		cg.remove()
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	return cg, nil
}

// makeLeaves creates the v2 leaves of the sandbox's cgroup (v2Box).
func (cg *sandboxCgroup) makeLeaves() error {
	dir := cg.v2Dir("")
	if dir == "" {
		return nil
	}
	fsys := cg.host.fs
	memory := slices.Contains(cg.host.v2Controllers, "memory")
	if memory {
		if err := fsys.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), "+memory"); err != nil {
			return err
		}
	}
	for _, leaf := range []string{v2Box, v2Copy} {
		if err := fsys.Mkdir(filepath.Join(dir, leaf)); err != nil {
			return err
		}
		cg.mu.Lock()
		cg.made = append(cg.made, filepath.Join(dir, leaf))
		cg.mu.Unlock()
	}
	if memory {
		return fsys.WriteFile(filepath.Join(cg.v2Dir(v2Box), "memory.oom.group"), "1")
	}
	return nil
}

const cpuPeriod = 100000 // µs

func cpuQuota(cpus float64) int { return max(1000, int(cpus*cpuPeriod)) }

// place moves process pid (in this process's pid namespace) into the sandbox's cgroups; its
// children are born there.
func (cg *sandboxCgroup) place(pid int) error {
	for _, dir := range cg.procsDirs() {
		if err := cg.host.fs.WriteFile(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("cgroup: placing the sandbox: %w", err)
		}
	}
	return nil
}

// freeze stops (true) or resumes (false) every process of the sandbox. It does not wait for the
// freezing to complete.
func (cg *sandboxCgroup) freeze(on bool) error {
	if cg.host.v2 != "" {
		v := "0"
		if on {
			v = "1"
		}
		return cg.host.fs.WriteFile(filepath.Join(cg.v2Dir(v2Box), "cgroup.freeze"), v)
	}
	if d := cg.host.v1["freezer"]; d != "" {
		v := "THAWED"
		if on {
			v = "FROZEN"
		}
		return cg.host.fs.WriteFile(filepath.Join(d, cg.name, "freezer.state"), v)
	}
	return errors.ErrUnsupported
}

// freezerState is the freezer's state as the kernel reports it (v1: THAWED, FREEZING, FROZEN;
// v2: cgroup.freeze and the frozen flag of cgroup.events), for diagnostics.
func (cg *sandboxCgroup) freezerState() string {
	fsys := cg.host.fs
	if cg.host.v2 != "" {
		want, _ := fsys.ReadFile(filepath.Join(cg.v2Dir(v2Box), "cgroup.freeze"))
		events, _ := fsys.ReadFile(filepath.Join(cg.v2Dir(v2Box), "cgroup.events"))
		return "cgroup.freeze " + want + ", " + strings.Join(strings.Fields(events), " ")
	}
	if d := cg.host.v1["freezer"]; d != "" {
		st, err := fsys.ReadFile(filepath.Join(d, cg.name, "freezer.state"))
		if err != nil {
			return "freezer.state unreadable"
		}
		return "freezer.state " + st
	}
	return "no freezer"
}

// kill sends SIGKILL to every process in the sandbox's cgroup.
func (cg *sandboxCgroup) kill() {
	fsys := cg.host.fs
	if cg.host.v2 != "" {
		if fsys.WriteFile(filepath.Join(cg.host.v2, cg.name, "cgroup.kill"), "1") == nil {
			return
		}
	}
	for _, dir := range cg.procsDirs() {
		procs, _ := fsys.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, f := range strings.Fields(procs) {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	// A v1-frozen process handles its SIGKILL only once thawed.
	if d := cg.host.v1["freezer"]; d != "" && cg.host.v2 == "" {
		fsys.WriteFile(filepath.Join(d, cg.name, "freezer.state"), "THAWED")
	}
}

// oomKills counts the processes of the sandbox the memory controller killed.
func (cg *sandboxCgroup) oomKills() int64 {
	var file string
	switch {
	case slices.Contains(cg.host.v2Controllers, "memory"):
		file = filepath.Join(cg.host.v2, cg.name, "memory.events")
	case cg.host.v1["memory"] != "":
		file = filepath.Join(cg.host.v1["memory"], cg.name, "memory.oom_control")
	default:
		return 0
	}
	events, _ := cg.host.fs.ReadFile(file)
	for _, line := range strings.Split(events, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "oom_kill" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// memoryPeak is the most memory the sandbox's cgroup used, or 0 when not known.
func (cg *sandboxCgroup) memoryPeak() int64 {
	var file string
	switch {
	case slices.Contains(cg.host.v2Controllers, "memory"):
		file = filepath.Join(cg.host.v2, cg.name, "memory.peak")
	case cg.host.v1["memory"] != "":
		file = filepath.Join(cg.host.v1["memory"], cg.name, "memory.max_usage_in_bytes")
	default:
		return 0
	}
	peak, _ := cg.host.fs.ReadFile(file)
	n, _ := strconv.ParseInt(peak, 10, 64)
	return n
}

// remove deletes the sandbox's cgroups. They must hold no process: the caller waits until the
// sandbox is gone; a cgroup whose last process is still exiting is retried for a moment.
func (cg *sandboxCgroup) remove() {
	cg.mu.Lock()
	made := cg.made
	cg.made = nil
	cg.mu.Unlock()
	for _, dir := range slices.Backward(made) {
		removeCgroup(cg.host.fs, dir)
	}
}

func removeCgroup(fsys cgroupFS, dir string) {
	delay := time.Millisecond
	for range 10 {
		err := fsys.Remove(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) || !errors.Is(err, syscall.EBUSY) {
			return
		}
		time.Sleep(delay)
		delay *= 2
	}
}
