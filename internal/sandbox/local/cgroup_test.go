package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// hostShape is a host's cgroup filesystems, for fakeCgroupFS.
type hostShape struct {
	v2    bool
	ctrl2 []string // v2 controllers delegated to the proxy
	swap  bool     // v2 swap accounting
	v1    []string // v1 hierarchies mounted (one per controller)
	memsw bool     // v1 swap accounting
}

const (
	fakeV2Own = "/sys/fs/cgroup/unified/system.slice/ciproxy.service"
	fakeHost  = "ciproxy-p-test"
	fakeBox   = "sb"
)

// fakeV1Own is this process's cgroup in the fake v1 hierarchy of ctrl.
func fakeV1Own(ctrl string) string { return "/sys/fs/cgroup/" + ctrl + "/ciproxy.service" }

// fakeHostOf mounts the shape's hierarchies on a new fake, with this process in its own cgroup
// in each (as the proxy is), and opens the provider's cgroupHost there.
func fakeHostOf(t *testing.T, s hostShape) (*fakeCgroupFS, *cgroupHost) {
	t.Helper()
	f := newFakeCgroupFS()
	v2 := ""
	if s.v2 {
		v2 = f.mount("/sys/fs/cgroup/unified", &fakeHierarchy{v2: true, controllers: s.ctrl2, swap: s.swap}, "system.slice/ciproxy.service")
		if err := f.WriteFile(v2+"/cgroup.procs", "0"); err != nil {
			t.Fatal(err)
		}
	}
	var v1 []cgroupMount
	for _, c := range s.v1 {
		dir := f.mount("/sys/fs/cgroup/"+c, &fakeHierarchy{controllers: []string{c}, memsw: s.memsw}, "ciproxy.service")
		if err := f.WriteFile(dir+"/cgroup.procs", "0"); err != nil {
			t.Fatal(err)
		}
		v1 = append(v1, cgroupMount{dir: dir, controllers: []string{c}})
	}
	h := openCgroupHost(f, fakeHost, v2, v1)
	if h == nil {
		t.Fatalf("no cgroup host on %+v", s)
	}
	f.takeOps()
	return f, h
}

// expand writes the short names of a test's expected operations out: "v2" is the sandbox's v2
// cgroup, "memory" (pids, cpu, freezer) its cgroup in that v1 hierarchy.
func expand(ops []string) []string {
	var out []string
	for _, op := range ops {
		verb, rest, _ := strings.Cut(op, " ")
		top, below, _ := strings.Cut(rest, "/")
		dir := filepath.Join(fakeV2Own, fakeHost, fakeBox)
		if top != "v2" {
			dir = filepath.Join(fakeV1Own(top), fakeHost, fakeBox)
		}
		if below != "" {
			dir += "/" + below
		}
		out = append(out, verb+" "+dir)
	}
	return out
}

var (
	allV1  = []string{"memory", "pids", "cpu", "freezer"}
	allV2  = []string{"memory", "pids", "cpu"}
	limits = cgroupSettings{memory: 1 << 30, processes: 34, cpus: 1.5}
)

// TestCgroupCreate: the files a sandbox's cgroups get written, host shape by host shape; the
// cgroups a sandbox has; and that remove and close leave none of them.
func TestCgroupCreate(t *testing.T) {
	v2Leaves := []string{"write v2/cgroup.subtree_control=+memory", "mkdir v2/box", "mkdir v2/copy", "write v2/box/memory.oom.group=1"}
	for _, tc := range []struct {
		name     string
		shape    hostShape
		settings cgroupSettings
		mode     cgroupMode
		mkdirs   []string
		writes   []string // in order, the mkdirs of the v2 leaves in their place
		procs    []string // where the sandbox's processes go
	}{
		{
			name:  "v2 memory pids cpu, swap accounting",
			shape: hostShape{v2: true, ctrl2: allV2, swap: true}, settings: limits, mode: modeCgroup2,
			mkdirs: []string{"mkdir v2"},
			writes: append([]string{"write v2/memory.max=1073741824", "write v2/memory.swap.max=0", "write v2/pids.max=34", "write v2/cpu.max=150000 100000"}, v2Leaves...),
			procs:  []string{"v2/box"},
		},
		{
			name:  "v2 memory pids cpu, no swap accounting",
			shape: hostShape{v2: true, ctrl2: allV2}, settings: limits, mode: modeCgroup2,
			mkdirs: []string{"mkdir v2"},
			writes: append([]string{"write v2/memory.max=1073741824", "write v2/pids.max=34", "write v2/cpu.max=150000 100000"}, v2Leaves...),
			procs:  []string{"v2/box"},
		},
		{
			name:  "v2 memory pids, swap accounting",
			shape: hostShape{v2: true, ctrl2: []string{"memory", "pids"}, swap: true}, settings: limits, mode: modeCgroup2,
			mkdirs: []string{"mkdir v2"},
			writes: append([]string{"write v2/memory.max=1073741824", "write v2/memory.swap.max=0", "write v2/pids.max=34"}, v2Leaves...),
			procs:  []string{"v2/box"},
		},
		{
			name:  "v2 memory cpu, no swap accounting",
			shape: hostShape{v2: true, ctrl2: []string{"memory", "cpu"}}, settings: limits, mode: modeRlimit,
			mkdirs: []string{"mkdir v2"},
			writes: append([]string{"write v2/memory.max=1073741824", "write v2/cpu.max=150000 100000"}, v2Leaves...),
			procs:  []string{"v2/box"},
		},
		{
			name:  "v2 memory alone",
			shape: hostShape{v2: true, ctrl2: []string{"memory"}, swap: true}, settings: limits, mode: modeRlimit,
			mkdirs: []string{"mkdir v2"},
			writes: append([]string{"write v2/memory.max=1073741824", "write v2/memory.swap.max=0"}, v2Leaves...),
			procs:  []string{"v2/box"},
		},
		{
			name:  "v2 pids cpu: no memory controller, so no oom group",
			shape: hostShape{v2: true, ctrl2: []string{"pids", "cpu"}, swap: true}, settings: limits, mode: modeRlimit,
			mkdirs: []string{"mkdir v2"},
			writes: []string{"write v2/pids.max=34", "write v2/cpu.max=150000 100000", "mkdir v2/box", "mkdir v2/copy"},
			procs:  []string{"v2/box"},
		},
		{
			name:  "v2 without controllers: kill and freeze only",
			shape: hostShape{v2: true}, settings: limits, mode: modeRlimit,
			mkdirs: []string{"mkdir v2"},
			writes: []string{"mkdir v2/box", "mkdir v2/copy"},
			procs:  []string{"v2/box"},
		},
		{
			name:  "v2 with no limits set",
			shape: hostShape{v2: true, ctrl2: allV2, swap: true}, mode: modeCgroup2,
			mkdirs: []string{"mkdir v2"},
			writes: v2Leaves,
			procs:  []string{"v2/box"},
		},
		{
			name:  "v2 with a fraction of a CPU below the least quota",
			shape: hostShape{v2: true, ctrl2: []string{"cpu"}}, settings: cgroupSettings{cpus: 0.001}, mode: modeRlimit,
			mkdirs: []string{"mkdir v2"},
			writes: []string{"write v2/cpu.max=1000 100000", "mkdir v2/box", "mkdir v2/copy"},
			procs:  []string{"v2/box"},
		},
		{
			name:  "v1 memory with memsw, pids, cpu, freezer",
			shape: hostShape{v1: allV1, memsw: true}, settings: limits, mode: modeCgroup1,
			mkdirs: []string{"mkdir cpu", "mkdir freezer", "mkdir memory", "mkdir pids"},
			writes: []string{"write memory/memory.limit_in_bytes=1073741824", "write memory/memory.memsw.limit_in_bytes=1073741824", "write pids/pids.max=34", "write cpu/cpu.cfs_period_us=100000", "write cpu/cpu.cfs_quota_us=150000"},
			procs:  []string{"cpu", "freezer", "memory", "pids"},
		},
		{
			name:  "v1 memory without memsw, pids",
			shape: hostShape{v1: []string{"memory", "pids"}}, settings: limits, mode: modeCgroup1,
			mkdirs: []string{"mkdir memory", "mkdir pids"},
			writes: []string{"write memory/memory.limit_in_bytes=1073741824", "write pids/pids.max=34"},
			procs:  []string{"memory", "pids"},
		},
		{
			name:  "v1 pids alone",
			shape: hostShape{v1: []string{"pids"}}, settings: limits, mode: modeRlimit,
			mkdirs: []string{"mkdir pids"},
			writes: []string{"write pids/pids.max=34"},
			procs:  []string{"pids"},
		},
		{
			name:  "hybrid: v2 without controllers beside v1 (its freezer unused)",
			shape: hostShape{v2: true, v1: allV1, memsw: true}, settings: limits, mode: modeCgroup1,
			mkdirs: []string{"mkdir cpu", "mkdir memory", "mkdir pids", "mkdir v2"},
			writes: []string{"write memory/memory.limit_in_bytes=1073741824", "write memory/memory.memsw.limit_in_bytes=1073741824", "write pids/pids.max=34", "write cpu/cpu.cfs_period_us=100000", "write cpu/cpu.cfs_quota_us=150000", "mkdir v2/box", "mkdir v2/copy"},
			procs:  []string{"cpu", "memory", "pids", "v2/box"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, h := fakeHostOf(t, tc.shape)
			if got := h.mode(); got != tc.mode {
				t.Errorf("mode %s; want %s", got, tc.mode)
			}
			cg, err := h.create(fakeBox, tc.settings)
			if err != nil {
				t.Fatal(err)
			}
			var mkdirs, writes []string
			for _, op := range f.takeOps() {
				if strings.HasPrefix(op, "mkdir ") && strings.HasSuffix(op, "/"+fakeHost+"/"+fakeBox) {
					mkdirs = append(mkdirs, op)
					continue
				}
				writes = append(writes, op)
			}
			sort.Strings(mkdirs)
			if want := expand(tc.mkdirs); !slices.Equal(mkdirs, want) {
				t.Errorf("made\n\t%s\nwant\n\t%s", strings.Join(mkdirs, "\n\t"), strings.Join(want, "\n\t"))
			}
			if want := expand(tc.writes); !slices.Equal(writes, want) {
				t.Errorf("wrote\n\t%s\nwant\n\t%s", strings.Join(writes, "\n\t"), strings.Join(want, "\n\t"))
			}
			procs := cg.procsDirs()
			sort.Strings(procs)
			var want []string
			for _, op := range expand(prefixed("x ", tc.procs)) {
				want = append(want, strings.TrimPrefix(op, "x "))
			}
			if !slices.Equal(procs, want) {
				t.Errorf("processes go to %v; want %v", procs, want)
			}
			// The process of a sandbox is placed in every one of them.
			if err := cg.place(31337); err != nil {
				t.Fatal(err)
			}
			for _, d := range want {
				if got := f.value(t, d+"/cgroup.procs"); got != "31337" {
					t.Errorf("%s/cgroup.procs holds %q; want the sandbox's process", d, got)
				}
			}
			for _, d := range want { // it died

				f.cgroups[d].procs = nil
			}
			cg.remove()
			for _, parent := range h.dirs() {
				if got := f.below(parent); !slices.Equal(got, []string{parent}) {
					t.Errorf("after remove, %s holds %v", parent, got)
				}
			}
			h.close()
			for _, parent := range h.dirs() {
				if got := f.below(parent); len(got) > 0 {
					t.Errorf("after close, %v are left", got)
				}
			}
		})
	}
}

func prefixed(p string, ss []string) []string {
	var out []string
	for _, s := range ss {
		out = append(out, p+s)
	}
	return out
}

// TestCgroupCreateFails: whichever directory or file of a sandbox's cgroups cannot be made or
// written, create fails with that error and leaves no cgroup of the sandbox behind.
func TestCgroupCreateFails(t *testing.T) {
	for name, shape := range map[string]hostShape{
		"v2":     {v2: true, ctrl2: allV2, swap: true},
		"v1":     {v1: allV1, memsw: true},
		"hybrid": {v2: true, v1: allV1, memsw: true},
	} {
		t.Run(name, func(t *testing.T) {
			f, h := fakeHostOf(t, shape)
			cg, err := h.create(fakeBox, limits)
			if err != nil {
				t.Fatal(err)
			}
			ops := f.takeOps()
			cg.remove()
			for _, op := range ops {
				t.Run(op, func(t *testing.T) {
					f, h := fakeHostOf(t, shape)
					verb, path, _ := strings.Cut(op, " ")
					path, _, _ = strings.Cut(path, "=")
					f.fail[verb+" "+path] = syscall.EIO
					if cg, err := h.create(fakeBox, limits); !errors.Is(err, syscall.EIO) {
						t.Fatalf("create: %v, %v; want EIO", cg, err)
					}
					for _, parent := range h.dirs() {
						if got := f.below(parent); !slices.Equal(got, []string{parent}) {
							t.Errorf("after the failure, %s holds %v", parent, got)
						}
					}
				})
			}
		})
	}
}

func TestCgroupFreeze(t *testing.T) {
	for _, tc := range []struct {
		name     string
		shape    hostShape
		file     string // "" when there is no freezer
		on, off  string
		canFreez bool
	}{
		{"v2", hostShape{v2: true, ctrl2: allV2}, "v2/box/cgroup.freeze", "1", "0", true},
		{"v2 without controllers", hostShape{v2: true}, "v2/box/cgroup.freeze", "1", "0", true},
		{"v1 freezer", hostShape{v1: allV1}, "freezer/freezer.state", "FROZEN", "THAWED", true},
		{"hybrid: v2 rather than the v1 freezer", hostShape{v2: true, v1: allV1}, "v2/box/cgroup.freeze", "1", "0", true},
		{"v1 without freezer", hostShape{v1: []string{"memory", "pids"}}, "", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, h := fakeHostOf(t, tc.shape)
			if h.canFreeze() != tc.canFreez {
				t.Errorf("canFreeze %v; want %v", h.canFreeze(), tc.canFreez)
			}
			cg, err := h.create(fakeBox, cgroupSettings{})
			if err != nil {
				t.Fatal(err)
			}
			defer cg.remove()
			if tc.file == "" {
				if err := cg.freeze(true); !errors.Is(err, errors.ErrUnsupported) {
					t.Errorf("freeze without a freezer: %v; want ErrUnsupported", err)
				}
				return
			}
			file := strings.TrimPrefix(expand([]string{"x " + tc.file})[0], "x ")
			for _, on := range []bool{true, false} {
				if err := cg.freeze(on); err != nil {
					t.Fatal(err)
				}
				want := map[bool]string{true: tc.on, false: tc.off}[on]
				if got := f.value(t, file); got != want {
					t.Errorf("freeze(%v): %s holds %q; want %q", on, file, got, want)
				}
			}
			f.fail["write "+file] = syscall.EIO
			if err := cg.freeze(true); !errors.Is(err, syscall.EIO) {
				t.Errorf("freeze with the write failing: %v; want EIO", err)
			}
		})
	}
}

// TestCgroupKill: cgroup.kill where there is one; else SIGKILL to each process the sandbox's
// cgroups list (real processes here) and, for the v1 freezer, a thaw so that they can die.
func TestCgroupKill(t *testing.T) {
	for _, tc := range []struct {
		name      string
		shape     hostShape
		noKill    bool // cgroup.kill fails
		wantWrite []string
	}{
		{"v2 cgroup.kill", hostShape{v2: true, ctrl2: allV2}, false, []string{"write v2/cgroup.kill=1"}},
		{"v2 with cgroup.kill failing", hostShape{v2: true, ctrl2: allV2}, true, []string{"write v2/cgroup.kill=1"}},
		{"v1 with freezer", hostShape{v1: allV1}, false, []string{"write freezer/freezer.state=THAWED"}},
		{"v1 without freezer", hostShape{v1: []string{"memory", "pids"}}, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, h := fakeHostOf(t, tc.shape)
			cg, err := h.create(fakeBox, cgroupSettings{})
			if err != nil {
				t.Fatal(err)
			}
			sleep := exec.Command("sleep", "60")
			if err := sleep.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				sleep.Process.Kill()
				sleep.Wait()
			}()
			if err := cg.place(sleep.Process.Pid); err != nil {
				t.Fatal(err)
			}
			if tc.noKill {
				f.fail["write "+filepath.Join(cg.v2Dir(""), "cgroup.kill")] = syscall.EIO
			}
			f.takeOps()
			cg.kill()
			if got, want := f.takeOps(), expand(tc.wantWrite); !slices.Equal(got, want) {
				t.Errorf("wrote %v; want %v", got, want)
			}
			if tc.shape.v2 && !tc.noKill {
				if got := f.value(t, cg.v2Dir(v2Box)+"/cgroup.procs"); got != "" {
					t.Errorf("after cgroup.kill the box holds %q", got)
				}
				return
			}
			var st syscall.WaitStatus
			deadline := time.Now().Add(10 * time.Second)
			for {
				pid, err := syscall.Wait4(sleep.Process.Pid, &st, syscall.WNOHANG, nil)
				if pid == sleep.Process.Pid || err != nil || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if !st.Signaled() || st.Signal() != syscall.SIGKILL {
				t.Errorf("the sandbox's process: %v; want killed by SIGKILL", st)
			}
		})
	}
}

func TestCgroupOOMKillsAndPeak(t *testing.T) {
	for _, tc := range []struct {
		name             string
		shape            hostShape
		events, peak     string // file: content
		readFails        bool
		wantKills, wantP int64
	}{
		{"v2", hostShape{v2: true, ctrl2: allV2},
			"v2/memory.events:low 0\nhigh 0\nmax 41\noom 3\noom_kill 3\noom_group_kill 1", "v2/memory.peak:536870912", false, 3, 536870912},
		{"v1", hostShape{v1: allV1},
			"memory/memory.oom_control:oom_kill_disable 0\nunder_oom 0\noom_kill 2", "memory/memory.max_usage_in_bytes:268435456", false, 2, 268435456},
		{"hybrid reads v1", hostShape{v2: true, v1: allV1},
			"memory/memory.oom_control:oom_kill 5", "memory/memory.max_usage_in_bytes:1024", false, 5, 1024},
		{"v2 before 5.19: no memory.peak", hostShape{v2: true, ctrl2: allV2},
			"v2/memory.events:oom_kill 0", "v2/memory.peak:1", true, 0, 0},
		{"no memory controller", hostShape{v2: true, ctrl2: []string{"pids"}, v1: []string{"pids"}}, "", "", false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, h := fakeHostOf(t, tc.shape)
			cg, err := h.create(fakeBox, cgroupSettings{})
			if err != nil {
				t.Fatal(err)
			}
			defer cg.remove()
			for _, fc := range []string{tc.events, tc.peak} {
				if name, content, ok := strings.Cut(fc, ":"); ok {
					path := strings.TrimPrefix(expand([]string{"x " + name})[0], "x ")
					f.set(t, path, content)
					if tc.readFails {
						f.fail["read "+path] = syscall.ENOENT
					}
				}
			}
			if got := cg.oomKills(); got != tc.wantKills {
				t.Errorf("oomKills %d; want %d", got, tc.wantKills)
			}
			if got := cg.memoryPeak(); got != tc.wantP {
				t.Errorf("memoryPeak %d; want %d", got, tc.wantP)
			}
		})
	}
}

// TestDelegatedV2: the provider's parent in a delegated v2 subtree, with what controllers it can
// hand its sandboxes, as systemd's Delegate=yes leaves the subtree (the proxy's process in the
// unit's cgroup) and when it cannot.
func TestDelegatedV2(t *testing.T) {
	const (
		own    = "/sys/fs/cgroup/system.slice/ciproxy.service"
		parent = own + "/" + fakeHost
		leaf   = own + "/" + proxyLeaf
	)
	enable := "write " + own + "/cgroup.subtree_control=+memory +pids +cpu "
	for _, tc := range []struct {
		name    string
		h       fakeHierarchy
		inLeaf  bool             // the proxy is already in its leaf (an earlier provider moved it)
		beside  []string         // other processes in the unit's cgroup
		fail    map[string]error // op → error
		dir     string           // what delegatedV2 returns
		ctrls   []string         // and with which controllers
		ops     []string         // the mkdirs and writes, in order
		removed bool             // the provider's directory is gone
	}{
		{
			name: "the proxy in the unit's cgroup: it moves to a leaf",
			h:    fakeHierarchy{v2: true, controllers: allV2},
			dir:  parent, ctrls: allV2,
			ops: []string{"mkdir " + parent, enable, "mkdir " + leaf, "write " + leaf + "/cgroup.procs=0", enable,
				"write " + parent + "/cgroup.subtree_control=+memory +pids +cpu "},
		},
		{
			name:   "a shell that started the proxy and a health check beside it: they move too",
			h:      fakeHierarchy{v2: true, controllers: allV2},
			beside: []string{"1", "77"},
			dir:    parent, ctrls: allV2,
			ops: []string{"mkdir " + parent, enable, "mkdir " + leaf, "write " + leaf + "/cgroup.procs=0",
				"write " + leaf + "/cgroup.procs=1", "write " + leaf + "/cgroup.procs=77", enable,
				"write " + parent + "/cgroup.subtree_control=+memory +pids +cpu "},
		},
		{
			name:   "a process beside the proxy that cannot be moved",
			h:      fakeHierarchy{v2: true, controllers: allV2},
			beside: []string{"1"},
			fail:   map[string]error{"write " + leaf + "/cgroup.procs=1": syscall.EACCES},
			dir:    parent,
			ops: []string{"mkdir " + parent, enable, "mkdir " + leaf, "write " + leaf + "/cgroup.procs=0",
				"write " + leaf + "/cgroup.procs=1", enable, "write " + leaf + "/cgroup.procs=1", enable,
				"write " + leaf + "/cgroup.procs=1", enable},
		},
		{
			name:   "the proxy already in its leaf",
			h:      fakeHierarchy{v2: true, controllers: allV2},
			inLeaf: true,
			dir:    parent, ctrls: allV2,
			ops: []string{"mkdir " + parent, enable, "write " + parent + "/cgroup.subtree_control=+memory +pids +cpu "},
		},
		{
			name: "only memory and pids delegated",
			h:    fakeHierarchy{v2: true, controllers: []string{"pids", "memory", "io"}},
			dir:  parent, ctrls: []string{"pids", "memory"},
			ops: []string{"mkdir " + parent, "write " + own + "/cgroup.subtree_control=+pids +memory ", "mkdir " + leaf,
				"write " + leaf + "/cgroup.procs=0", "write " + own + "/cgroup.subtree_control=+pids +memory ",
				"write " + parent + "/cgroup.subtree_control=+pids +memory "},
		},
		{
			name: "no controller wanted is delegated",
			h:    fakeHierarchy{v2: true, controllers: []string{"io", "cpuset"}},
			dir:  parent,
			ops:  []string{"mkdir " + parent},
		},
		{
			name:    "before Linux 5.14: no cgroup.kill, no v2",
			h:       fakeHierarchy{v2: true, controllers: allV2, noKill: true},
			ops:     []string{"mkdir " + parent},
			removed: true,
		},
		{
			name:    "not delegated: the unit's cgroup is not writable",
			h:       fakeHierarchy{v2: true, controllers: allV2},
			fail:    map[string]error{"mkdir " + parent: syscall.EACCES},
			ops:     []string{"mkdir " + parent},
			removed: true,
		},
		{
			name: "the proxy cannot leave its cgroup",
			h:    fakeHierarchy{v2: true, controllers: allV2},
			fail: map[string]error{"write " + leaf + "/cgroup.procs": syscall.EACCES},
			dir:  parent,
			ops:  []string{"mkdir " + parent, enable, "mkdir " + leaf, "write " + leaf + "/cgroup.procs=0"},
		},
		{
			name: "the leaf cannot be made",
			h:    fakeHierarchy{v2: true, controllers: allV2},
			fail: map[string]error{"mkdir " + leaf: syscall.EACCES},
			dir:  parent,
			ops:  []string{"mkdir " + parent, enable, "mkdir " + leaf},
		},
		{
			name: "the parent cannot enable controllers for the sandboxes",
			h:    fakeHierarchy{v2: true, controllers: allV2},
			fail: map[string]error{"write " + parent + "/cgroup.subtree_control": syscall.EACCES},
			dir:  parent,
			ops: []string{"mkdir " + parent, enable, "mkdir " + leaf, "write " + leaf + "/cgroup.procs=0", enable,
				"write " + parent + "/cgroup.subtree_control=+memory +pids +cpu "},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCgroupFS()
			f.mount("/sys/fs/cgroup", &tc.h, "system.slice/ciproxy.service")
			into := own
			if tc.inLeaf {
				if err := f.Mkdir(leaf); err != nil {
					t.Fatal(err)
				}
				into = leaf
			}
			for _, pid := range append([]string{"0"}, tc.beside...) {
				if err := f.WriteFile(into+"/cgroup.procs", pid); err != nil {
					t.Fatal(err)
				}
			}
			f.takeOps()
			for op, err := range tc.fail {
				f.fail[op] = err
			}
			dir, ctrls := delegatedV2(f, own, fakeHost)
			if dir != tc.dir || !slices.Equal(ctrls, tc.ctrls) {
				t.Errorf("delegatedV2 = %q, %v; want %q, %v", dir, ctrls, tc.dir, tc.ctrls)
			}
			if got := f.takeOps(); !slices.Equal(got, tc.ops) {
				t.Errorf("did\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(tc.ops, "\n\t"))
			}
			if got := f.Exists(parent); got == tc.removed {
				t.Errorf("the provider's directory exists: %v; want %v", got, !tc.removed)
			}
			if len(tc.ctrls) > 0 {
				want := strings.Join(append([]string{"4242"}, tc.beside...), "\n")
				if got := f.value(t, leaf+"/cgroup.procs"); got != want {
					t.Errorf("the proxy's leaf holds %q; want %q", got, want)
				}
			}
		})
	}
}

// TestOpenCgroupHost: which hierarchies a provider uses, and what it says of them.
func TestOpenCgroupHost(t *testing.T) {
	for _, tc := range []struct {
		name     string
		shape    hostShape
		failV1   string // a v1 hierarchy whose directory cannot be made
		nilHost  bool
		describe string
		charges  string // the sandbox's cgroup that is charged with placed files ("" none)
	}{
		{"v2", hostShape{v2: true, ctrl2: allV2}, "", false, "cgroup v2 (kill, freeze, memory, pids, cpu)", "v2/copy"},
		{"v1", hostShape{v1: allV1}, "", false, "cgroup v1 (memory, pids, cpu, freezer)", "memory"},
		{"v1 with memory not writable", hostShape{v1: allV1}, "memory", false, "cgroup v1 (pids, cpu, freezer)", ""},
		{"hybrid", hostShape{v2: true, v1: allV1}, "", false, "cgroup v2 (kill, freeze) and cgroup v1 (memory, pids, cpu)", "memory"},
		{"nothing writable", hostShape{v1: []string{"pids"}}, "pids", true, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCgroupFS()
			v2 := ""
			if tc.shape.v2 {
				v2 = f.mount("/sys/fs/cgroup/unified", &fakeHierarchy{v2: true, controllers: tc.shape.ctrl2}, "system.slice/ciproxy.service")
			}
			var v1 []cgroupMount
			for _, c := range tc.shape.v1 {
				dir := f.mount("/sys/fs/cgroup/"+c, &fakeHierarchy{controllers: []string{c}}, "ciproxy.service")
				v1 = append(v1, cgroupMount{dir: dir, controllers: []string{c}})
				if c == tc.failV1 {
					f.fail["mkdir "+dir+"/"+fakeHost] = syscall.EACCES
				}
			}
			h := openCgroupHost(f, fakeHost, v2, v1)
			if (h == nil) != tc.nilHost {
				t.Fatalf("host %+v; want nil: %v", h, tc.nilHost)
			}
			if h == nil {
				return
			}
			if got := h.describe(); got != tc.describe {
				t.Errorf("describe: %q; want %q", got, tc.describe)
			}
			if f.Exists(filepath.Join(fakeV1Own("freezer"), fakeHost)) && tc.shape.v2 {
				t.Error("a v1 freezer directory was made beside v2, which freezes")
			}
			cg, err := h.create(fakeBox, cgroupSettings{})
			if err != nil {
				t.Fatal(err)
			}
			defer cg.remove()
			want := ""
			if tc.charges != "" {
				want = strings.TrimPrefix(expand([]string{"x " + tc.charges})[0], "x ")
			}
			if got := cg.chargeDir(); got != want || h.charges() != (want != "") {
				t.Errorf("chargeDir %q, charges %v; want %q", got, h.charges(), want)
			}
		})
	}
}

// cgroup2Env, set to 1, says the host is meant to give the v2 mode (the guest of make
// test-cgroup2): a provider that falls back to another mode there is a failure, not a skip.
const cgroup2Env = "CIPROXY_TEST_CGROUP2"

// TestCgroupFilesWritten: on this host's own cgroups, the limits a sandbox's cgroups hold, read
// back from the kernel, its processes in them, and cgroup.kill (or SIGKILL to each) ending them.
func TestCgroupFilesWritten(t *testing.T) {
	p := newTestProvider(t, Options{PoolSize: -1, MemoryLimit: 300 << 20, MaxProcesses: 20, CPULimit: 0.5})
	if os.Getenv(cgroup2Env) == "1" && p.Isolation().Limits != string(modeCgroup2) {
		t.Fatalf("%s=1 but the provider is in mode %s (%s)", cgroup2Env, p.Isolation().Limits, p.Isolation().Cgroups)
	}
	requireCgroups(t, p)
	t.Logf("this host: %s", p.Isolation())
	h := create(t, p, sandbox.CreateOptions{})
	b, err := p.lookup(h)
	if err != nil {
		t.Fatal(err)
	}
	cg, kernel := b.cg, osCgroupFS{}
	want := map[string]string{}
	if dir := cg.v2Dir(""); dir != "" {
		for _, c := range p.cg.v2Controllers {
			switch c {
			case "memory":
				want[dir+"/memory.max"] = strconv.Itoa(300 << 20)
				if kernel.Exists(dir + "/memory.swap.max") {
					want[dir+"/memory.swap.max"] = "0"
				} else {
					t.Logf("no memory.swap.max: this kernel has no swap accounting")
				}
				want[cg.v2Dir(v2Box)+"/memory.oom.group"] = "1"
				want[cg.v2Dir(v2Copy)+"/memory.oom.group"] = "0"
				want[dir+"/cgroup.subtree_control"] = "memory"
			case "pids":
				want[dir+"/pids.max"] = "23" // MaxProcesses + the init, the template and the shell server
			case "cpu":
				want[dir+"/cpu.max"] = "50000 100000"
			}
		}
	}
	if d := p.cg.v1["memory"]; d != "" {
		want[filepath.Join(d, cg.name, "memory.limit_in_bytes")] = strconv.Itoa(300 << 20)
		if file := filepath.Join(d, cg.name, "memory.memsw.limit_in_bytes"); kernel.Exists(file) {
			want[file] = strconv.Itoa(300 << 20)
		}
	}
	if d := p.cg.v1["pids"]; d != "" {
		want[filepath.Join(d, cg.name, "pids.max")] = "23"
	}
	if d := p.cg.v1["cpu"]; d != "" {
		want[filepath.Join(d, cg.name, "cpu.cfs_period_us")] = "100000"
		want[filepath.Join(d, cg.name, "cpu.cfs_quota_us")] = "50000"
	}
	// Run once: between cells the box is frozen (once the execution is over, a moment after Run
	// returned).
	run(t, p, h, "1")
	if box := cg.v2Dir(v2Box); box != "" {
		want[box+"/cgroup.freeze"] = "1"
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if s, _ := kernel.ReadFile(box + "/cgroup.events"); strings.Contains(s, "frozen 1") {
				break
			}
		}
	}
	for file, v := range want {
		got, err := kernel.ReadFile(file)
		if err != nil || got != v {
			t.Errorf("%s holds %q (%v); want %q", file, got, err, v)
		}
	}
	if len(want) == 0 {
		t.Error("no limit file to read back")
	}
	// The sandbox's processes, a double-forked one included, are in its cgroups.
	run(t, p, h, "import os\nif os.fork() == 0:\n    if os.fork() == 0:\n        import time\n        time.sleep(600)\n    os._exit(0)\nos.wait()")
	procs := func() []string {
		var out []string
		for _, d := range cg.procsDirs() {
			s, _ := kernel.ReadFile(d + "/cgroup.procs")
			out = append(out, strings.Fields(s)...)
		}
		return out
	}
	if n := len(procs()); n < 2*len(cg.procsDirs()) {
		t.Errorf("the sandbox's cgroups list %d processes; want its init, kernel and sleeper in each", n)
	}
	cg.kill()
	deadline := time.Now().Add(10 * time.Second)
	for len(procs()) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if left := procs(); len(left) > 0 {
		t.Errorf("after kill the sandbox's cgroups still hold %v", left)
	}
	if _, err := p.Run(context.Background(), h, "1", sandbox.RunOptions{Timeout: 10 * time.Second}); err == nil {
		t.Error("the killed sandbox still runs code")
	}
}

// TestCPULimit: with cpu_limit 0.25 two busy processes get a quarter of a CPU between them.
func TestCPULimit(t *testing.T) {
	p := newTestProvider(t, Options{PoolSize: -1, CPULimit: 0.25})
	requireCgroups(t, p)
	if !slices.Contains(p.cg.v2Controllers, "cpu") && p.cg.v1["cpu"] == "" {
		t.Skip("no cpu controller on this host")
	}
	h := create(t, p, sandbox.CreateOptions{})
	var got struct{ Wall, CPU float64 }
	probeJSON(t, p, h, `import json, os, time
start = time.monotonic()
pids = []
for i in range(2):
    pid = os.fork()
    if pid == 0:
        while time.monotonic() - start < 3:
            pass
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
t = os.times()
print(json.dumps({"wall": time.monotonic() - start, "cpu": t.children_user + t.children_system}))`, &got)
	t.Logf("two busy processes used %.2f s of CPU in %.2f s", got.CPU, got.Wall)
	if limit := 0.25*got.Wall + 0.3; got.CPU > limit {
		t.Errorf("%.2f s of CPU in %.2f s; want at most %.2f (a quarter of a CPU)", got.CPU, got.Wall, limit)
	}
}

// TestIsolationCPUWarning: a mode with cgroups but no cpu controller says that CPU is unbounded.
func TestIsolationCPUWarning(t *testing.T) {
	for _, tc := range []struct {
		name  string
		shape hostShape
		warns bool
	}{
		{"v2 with cpu", hostShape{v2: true, ctrl2: allV2}, false},
		{"v2 without cpu", hostShape{v2: true, ctrl2: []string{"memory", "pids"}}, true},
		{"v1 with cpu", hostShape{v1: allV1}, false},
		{"v1 without cpu", hostShape{v1: []string{"memory", "pids", "freezer"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, h := fakeHostOf(t, tc.shape)
			iso := (&Provider{cg: h, uids: sharedUID()}).Isolation()
			if got := strings.Contains(strings.Join(iso.Warnings, " "), "no cpu controller"); got != tc.warns {
				t.Errorf("%s: warns of no cpu controller: %v; want %v", iso, got, tc.warns)
			}
		})
	}
}

// TestParseOwnCgroups: where this process's cgroups are found from /proc/self/cgroup and
// /proc/self/mountinfo, on hosts and in containers with and without a cgroup namespace of their
// own. The mountinfo lines are the kernel's as read in each place.
func TestParseOwnCgroups(t *testing.T) {
	const (
		v2Mount  = "30 25 0:26 %s /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
		memMount = "31 25 0:27 %s /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory\n"
		unified  = "32 25 0:28 %s /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
		other    = "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
	)
	for _, tc := range []struct {
		name      string
		cgroup    string
		mountinfo string
		v2        string
		v1        []cgroupMount
	}{
		{
			name: "a v2 host, a unit with Delegate=yes", cgroup: "0::/system.slice/ciproxy.service\n",
			mountinfo: other + fmt.Sprintf(v2Mount, "/"),
			v2:        "/sys/fs/cgroup/system.slice/ciproxy.service",
		},
		{
			name: "the proxy already moved into its leaf", cgroup: "0::/system.slice/ciproxy.service/" + proxyLeaf + "\n",
			mountinfo: fmt.Sprintf(v2Mount, "/"),
			v2:        "/sys/fs/cgroup/system.slice/ciproxy.service",
		},
		{
			name: "a container in the host's cgroup namespace with the host's tree mounted", cgroup: "0::/libpod_parent/libpod-1234\n",
			mountinfo: fmt.Sprintf(v2Mount, "/"),
			v2:        "/sys/fs/cgroup/libpod_parent/libpod-1234",
		},
		{
			name: "a cgroup namespace of its own and its own cgroup2 mount", cgroup: "0::/\n",
			mountinfo: fmt.Sprintf(v2Mount, "/"),
			v2:        "/sys/fs/cgroup",
		},
		{
			// The host's root is two levels above the namespace's: "/" would name the host's root.
			name: "a cgroup namespace of its own with the host's tree bind-mounted", cgroup: "0::/\n",
			mountinfo: fmt.Sprintf(v2Mount, "/../.."),
		},
		{
			name: "one level above the namespace", cgroup: "0::/ciproxy-proxy\n",
			mountinfo: fmt.Sprintf(v2Mount, "/.."),
		},
		{
			name: "a mount of a cgroup outside the namespace beside it", cgroup: "0::/\n",
			mountinfo: fmt.Sprintf(v2Mount, "/../other"),
		},
		{
			name:      "a mount of a cgroup below the process's: not its own",
			cgroup:    "0::/system.slice/ciproxy.service\n",
			mountinfo: fmt.Sprintf(v2Mount, "/system.slice/ciproxy.service/child"),
		},
		{
			name: "a hybrid host", cgroup: "4:memory:/ciproxy.service\n0::/ciproxy.service\n",
			mountinfo: fmt.Sprintf(memMount, "/") + fmt.Sprintf(unified, "/"),
			v2:        "/sys/fs/cgroup/unified/ciproxy.service",
			v1:        []cgroupMount{{dir: "/sys/fs/cgroup/memory/ciproxy.service", controllers: []string{"memory"}}},
		},
		{
			name: "a hybrid host's trees bind-mounted into a cgroup namespace", cgroup: "4:memory:/\n0::/\n",
			mountinfo: fmt.Sprintf(memMount, "/..") + fmt.Sprintf(unified, "/.."),
		},
		{
			name: "v1 mounted at the container's own cgroup", cgroup: "4:memory:/docker/abc\n",
			mountinfo: fmt.Sprintf(memMount, "/docker/abc"),
			v1:        []cgroupMount{{dir: "/sys/fs/cgroup/memory", controllers: []string{"memory"}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v2, v1, err := parseOwnCgroups(tc.cgroup, strings.NewReader(tc.mountinfo))
			if err != nil {
				t.Fatal(err)
			}
			if v2 != tc.v2 {
				t.Errorf("v2 = %q; want %q", v2, tc.v2)
			}
			if !slices.EqualFunc(v1, tc.v1, func(a, b cgroupMount) bool { return a.dir == b.dir && slices.Equal(a.controllers, b.controllers) }) {
				t.Errorf("v1 = %+v; want %+v", v1, tc.v1)
			}
		})
	}
}
