package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Mode names what this host lets the local sandbox guarantee, from the two things that decide it:
// whether the proxy can give each sandbox a host uid of its own (it runs as root) and whether it
// has cgroups with the memory and pids controllers. --check and the start log report it, with
// what it guarantees (docs/sandbox-local.md has the table).
type Mode string

const (
	// ModeRoot: root with cgroups. A host uid per sandbox, one memory and process bound for
	// everything a sandbox holds, a CPU cap where the cpu controller is there.
	ModeRoot Mode = "root"
	// ModeRootNoCgroups: root without a usable cgroup: a host uid per sandbox, per-process limits.
	ModeRootNoCgroups Mode = "root-no-cgroups"
	// ModeNonRootCgroups: not root, with a delegated cgroup v2 subtree: the bounds of ModeRoot,
	// but one host uid (the proxy's) shared by every sandbox.
	ModeNonRootCgroups Mode = "non-root-cgroups"
	// ModeNonRoot: not root and no cgroup (a container as a plain user, a Kubernetes pod):
	// per-process limits only and one shared host uid.
	ModeNonRoot Mode = "non-root"
)

// hostMode is the Mode of a provider whose sandboxes do or do not each get a uid, with limits.
func hostMode(uidPerSandbox bool, limits cgroupMode) Mode {
	cgroups := limits != modeRlimit
	switch {
	case uidPerSandbox && cgroups:
		return ModeRoot
	case uidPerSandbox:
		return ModeRootNoCgroups
	case cgroups:
		return ModeNonRootCgroups
	}
	return ModeNonRoot
}

// Isolation says what holds a provider's sandboxes on this host.
type Isolation struct {
	Mode Mode
	// Guarantees list what holds in this mode on this host, for an operator.
	Guarantees []string
	// Limits is what bounds a sandbox's memory and processes: "cgroup2" or "cgroup1" (one bound per
	// sandbox, for everything it holds) or "rlimit" (rlimits per process only).
	Limits  string
	Cgroups string // what the cgroups give
	UIDs    string // how sandboxes map to host uids
	Seccomp bool
	// Warnings name what is weaker than in the best mode; empty when nothing is.
	Warnings []string
}

func (i Isolation) String() string {
	s := fmt.Sprintf("mode %s: %s; limits: %s; cgroups: %s; uids: %s; seccomp: %v",
		i.Mode, strings.Join(i.Guarantees, ", "), i.Limits, i.Cgroups, i.UIDs, i.Seccomp)
	if len(i.Warnings) > 0 {
		s += "; WARNING: " + strings.Join(i.Warnings, "; ")
	}
	return s
}

// Isolation describes the provider's mode (docs/sandbox-local.md says what each guarantees).
func (p *Provider) Isolation() Isolation {
	limits := p.cg.mode()
	iso := Isolation{Mode: hostMode(p.perSandboxUIDs(), limits), Limits: string(limits), Cgroups: p.cg.describe(), Seccomp: !p.knobs.noSeccomp}
	iso.Guarantees = []string{"namespaces of its own and the minimal filesystem view per sandbox"}
	if p.perSandboxUIDs() {
		iso.UIDs = fmt.Sprintf("one host uid per sandbox, from %d-%d", p.uids.host(1), p.uids.host(p.uids.size-1))
		iso.Guarantees = append(iso.Guarantees, "a host uid per sandbox")
	} else {
		iso.UIDs = fmt.Sprintf("every sandbox runs as the proxy's uid %d", p.uids.base)
		iso.Warnings = append(iso.Warnings, "sandboxes share one host uid (the proxy does not run as root): the kernel's per-user limits (inotify instances, pending signals, RLIMIT_NPROC at the host level) are shared between tenants")
	}
	cpu := false
	switch limits {
	case modeRlimit:
		iso.Guarantees = append(iso.Guarantees, "per-process limits only (memory, processes, file size, open files)")
		iso.Warnings = append(iso.Warnings, "no writable cgroup with memory and pids controllers: memory is bounded per process only (RLIMIT_AS at what the fork server mapped plus memory_limit), so a sandbox's processes together may use max_processes times memory_limit, and its tmpfs files and kernel memory (socket buffers) are bounded only by their own sizes and by max_open_files; give the proxy a delegated cgroup v2 subtree, or run it as root on a cgroup v1 host")
	case modeCgroup1:
		cpu = p.cg.v1["cpu"] != ""
		if !cpu {
			iso.Warnings = append(iso.Warnings, "no cpu controller: a sandbox may use every CPU while its code runs")
		}
	case modeCgroup2:
		cpu = slices.Contains(p.cg.v2Controllers, "cpu")
		if !cpu {
			iso.Warnings = append(iso.Warnings, "no cpu controller delegated: a sandbox may use every CPU while its code runs")
		}
	}
	if limits != modeRlimit {
		iso.Guarantees = append(iso.Guarantees, "one memory and process bound per sandbox for all it holds")
	}
	if cpu {
		iso.Guarantees = append(iso.Guarantees, "a CPU cap while code runs")
	}
	if limits != modeRlimit && (!p.cg.charges() || p.copier == "") {
		iso.Warnings = append(iso.Warnings, "files the proxy places in /mnt/data are charged to the proxy's memory cgroup, not the sandbox's (a memory controller and "+copyHelper+" on the PATH let a helper write them from the sandbox's cgroup): budget max_containers × (memory_limit + max_disk_size) of host memory")
	}
	if p.cg != nil && !p.cg.canFreeze() {
		iso.Warnings = append(iso.Warnings, "no cgroup freezer: between executions sandboxes are stopped with SIGSTOP, process by process")
	}
	if iso.Seccomp {
		iso.Guarantees = append(iso.Guarantees, "the seccomp filter")
	} else {
		iso.Warnings = append(iso.Warnings, "no seccomp filter")
	}
	return iso
}

// errBwrapMissing is Check's answer when bubblewrap is not installed.
var errBwrapMissing = errors.New("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")

// checkCode is the first use of the preloaded libraries, as a model's first cell would make it.
const checkCode = `import json, resource, io
import numpy as np, pandas as pd, matplotlib.pyplot as plt
df = pd.DataFrame({"x": np.arange(2000), "y": np.random.rand(2000)})
df.describe()._repr_html_()
plt.plot(df.x, df.y)
plt.gcf().savefig(io.BytesIO(), format="png")
plt.close("all")
peak = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmPeak:")][0]
print(json.dumps({"ok": True, "vm_peak": peak, "as_limit": resource.getrlimit(resource.RLIMIT_AS)[0]}))`

// Check reports whether this host can run sandboxes with these options: it starts the fork server
// and one sandbox under the real limits (the default memory limit) and runs a first use of numpy,
// pandas and matplotlib in it. The error says what to install, which sysctl to enable, or the
// least memory_limit that works.
func Check(ctx context.Context, opts Options) error {
	_, err := CheckIsolation(ctx, opts)
	return err
}

// CheckIsolation is Check, and on success tells what isolation the host gives (say it at start).
func CheckIsolation(ctx context.Context, opts Options) (Isolation, error) {
	return checkWith(ctx, opts, knobs{})
}

func checkWith(ctx context.Context, opts Options, k knobs) (Isolation, error) {
	opts = opts.withDefaults()
	if _, err := exec.LookPath("bwrap"); err != nil {
		return Isolation{}, errBwrapMissing
	}
	if _, err := os.Stat(opts.Python); err != nil {
		return Isolation{}, fmt.Errorf("local sandbox: python interpreter %s: %w", opts.Python, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	opts.PoolSize = -1
	opts.Logger = zap.NewNop()
	p, err := newProvider(opts, k)
	if err != nil {
		return Isolation{}, err
	}
	defer p.Close(context.WithoutCancel(ctx))
	iso := p.Isolation()
	mem := opts.MemoryLimit
	res, err := p.probe(ctx, mem)
	if err == nil {
		return iso, nil
	}
	if !errors.Is(err, errTooLittleMemory) {
		if hint := userNamespaceHint(); hint != "" {
			return iso, fmt.Errorf("local sandbox: cannot start a sandbox (%v): %s", err, hint)
		}
		return iso, fmt.Errorf("local sandbox: cannot start a sandbox: %w", err)
	}
	// Too little: measure what the same cell takes with room to spare.
	room := max(opts.MaxMemory, 4*mem, 2<<30)
	res, perr := p.probe(ctx, room)
	if perr != nil || res.need <= 0 {
		return iso, fmt.Errorf("local sandbox: memory_limit %d MiB is too low for the kernel's first use of numpy, pandas and matplotlib (%v)", mem>>20, err)
	}
	least := (res.need*5/4 + 1<<20 - 1) >> 20
	return iso, fmt.Errorf("local sandbox: memory_limit %d MiB is too low: the kernel's first use of numpy, pandas and matplotlib needed %d MiB; set memory_limit to at least %dm", mem>>20, res.need>>20, least)
}

var errTooLittleMemory = errors.New("out of memory")

type probeResult struct {
	need int64 // memory the cell took, as the mode counts it
}

// probe runs checkCode in a new sandbox with memory mem.
func (p *Provider) probe(ctx context.Context, mem int64) (probeResult, error) {
	b, err := p.start(ctx, mem)
	if err != nil {
		if strings.Contains(err.Error(), "out of memory") || strings.Contains(err.Error(), "MemoryError") {
			return probeResult{}, fmt.Errorf("%w: %v", errTooLittleMemory, err)
		}
		return probeResult{}, err
	}
	p.mu.Lock()
	p.live[b.id] = b
	p.mu.Unlock()
	h := sandbox.Handle{Backend: Backend, ID: b.id}
	defer p.Delete(context.WithoutCancel(ctx), h)
	out, err := p.Run(ctx, h, checkCode, sandbox.RunOptions{Timeout: time.Minute})
	if b.cg != nil && b.cg.oomKills() > 0 || b.oom.Load() || out.Error != nil && out.Error.Name == "MemoryError" {
		return probeResult{}, errTooLittleMemory
	}
	if err != nil {
		return probeResult{}, err
	}
	if out.Error != nil {
		return probeResult{}, fmt.Errorf("%s: %s", out.Error.Name, out.Error.Value)
	}
	var got struct {
		OK      bool  `json:"ok"`
		VMPeak  int64 `json:"vm_peak"`
		ASLimit int64 `json:"as_limit"`
	}
	if json.Unmarshal([]byte(strings.TrimSpace(out.Stdout)), &got) != nil || !got.OK {
		return probeResult{}, fmt.Errorf("unexpected output %q", out.Stdout)
	}
	var res probeResult
	if b.cg != nil && b.cg.memoryPeak() > 0 {
		res.need = b.cg.memoryPeak()
	}
	// The address space limit is what the zygote mapped plus mem: what the cell added is the peak
	// minus the mapping.
	if got.ASLimit > 0 {
		res.need = max(res.need, got.VMPeak-(got.ASLimit-mem))
	}
	return res, nil
}
