// Package ocihooks tests the OCI hooks podman is given to run the image (docs/modes.md).
package ocihooks

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// The container's root in the faked trees: the first host uid of its user namespace.
const containerRoot = 1073741824

// hookTree is a faked /proc and /sys for the container whose pid is 42.
type hookTree struct {
	uidMap string   // /proc/42/uid_map
	cgroup []string // /proc/42/cgroup
	files  []string // under sys/fs/cgroup; a name ending in / is a directory
}

// A container of podman with runc: in machine.slice on a v2 host, below libpod_parent on v1.
var v1Lines = []string{"12:memory:/libpod_parent/libpod-c1", "11:pids:/libpod_parent/libpod-c1",
	"10:cpu,cpuacct:/libpod_parent/libpod-c1", "9:freezer:/libpod_parent/libpod-c1",
	"8:blkio:/libpod_parent/libpod-c1", "1:name=systemd:/libpod_parent/libpod-c1"}

func v1Files(dir string) []string {
	var files []string
	for _, c := range []string{"memory", "pids", "cpu", "freezer", "blkio"} {
		d := c + dir
		files = append(files, c+"/", c+"/libpod_parent/", c+"/cgroup.procs", c+"/libpod_parent/tasks",
			d+"/", d+"/cgroup.procs", d+"/tasks", d+"/notify_on_release")
	}
	return append(files, "memory"+dir+"/memory.limit_in_bytes", "pids"+dir+"/pids.max")
}

func v2Files(top, dir string) []string {
	return []string{top + "cgroup.controllers", top + "cgroup.procs", top + "cgroup.subtree_control",
		top + "machine.slice/", top + "machine.slice/cgroup.procs", top + "machine.slice/cgroup.subtree_control",
		top + dir + "/", top + dir + "/cgroup.procs", top + dir + "/cgroup.threads", top + dir + "/cgroup.subtree_control",
		top + dir + "/cgroup.controllers", top + dir + "/cgroup.type", top + dir + "/memory.max", top + dir + "/pids.max",
		top + dir + "/cgroup.freeze", top + dir + "/cgroup.kill"}
}

// TestDelegateCgroup runs deploy/oci-hooks/ciproxy-delegate-cgroup on faked trees of each kind of
// host and checks that exactly the container's own cgroups, and in each the files systemd's
// Delegate=yes hands over, become the namespace root's: nothing above the container's cgroup, no
// limit file, no other controller.
func TestDelegateCgroup(t *testing.T) {
	userns := "         0 1073741824      65536\n"
	for _, tc := range []struct {
		name string
		tree hookTree
		want []string // under sys/fs/cgroup
	}{{
		name: "cgroup v2",
		tree: hookTree{uidMap: userns, cgroup: []string{"0::/machine.slice/libpod-c1.scope"},
			files: v2Files("", "machine.slice/libpod-c1.scope")},
		want: []string{"machine.slice/libpod-c1.scope", "machine.slice/libpod-c1.scope/cgroup.procs",
			"machine.slice/libpod-c1.scope/cgroup.threads", "machine.slice/libpod-c1.scope/cgroup.subtree_control"},
	}, {
		name: "hybrid",
		tree: hookTree{uidMap: userns, cgroup: append(slices.Clone(v1Lines), "0::/libpod_parent/libpod-c1"),
			files: append(v1Files("/libpod_parent/libpod-c1"), slices.DeleteFunc(v2Files("unified/", "libpod_parent/libpod-c1"),
				func(f string) bool { return strings.Contains(f, "machine.slice") })...)},
		want: append(v1Want("/libpod_parent/libpod-c1"), "unified/libpod_parent/libpod-c1",
			"unified/libpod_parent/libpod-c1/cgroup.procs", "unified/libpod_parent/libpod-c1/cgroup.threads",
			"unified/libpod_parent/libpod-c1/cgroup.subtree_control"),
	}, {
		name: "cgroup v1",
		tree: hookTree{uidMap: userns, cgroup: v1Lines, files: v1Files("/libpod_parent/libpod-c1")},
		want: v1Want("/libpod_parent/libpod-c1"),
	}, {
		name: "no user namespace",
		tree: hookTree{uidMap: "         0          0 4294967295\n", cgroup: []string{"0::/machine.slice/libpod-c1.scope"},
			files: v2Files("", "machine.slice/libpod-c1.scope")},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			top := t.TempDir()
			tc.tree.write(t, top)
			chowned := runHook(t, top, `{"ociVersion":"1.0.2","id":"c1","status":"creating","pid": 42,"bundle":"/b"}`)
			slices.Sort(chowned)
			want := slices.Sorted(slices.Values(tc.want))
			if !slices.Equal(chowned, want) {
				t.Errorf("handed to the namespace's root:\n  %s\nwant:\n  %s", strings.Join(chowned, "\n  "), strings.Join(want, "\n  "))
			}
		})
	}
}

// v1Want is what the hook hands over on a v1 host: the container's memory, pids, cpu and freezer
// cgroups with their cgroup.procs and tasks.
func v1Want(dir string) []string {
	var want []string
	for _, c := range []string{"memory", "pids", "cpu", "freezer"} {
		want = append(want, c+dir, c+dir+"/cgroup.procs", c+dir+"/tasks")
	}
	return want
}

// TestDelegateCgroupNoPid: a state without a pid is an error (podman then fails the container).
func TestDelegateCgroupNoPid(t *testing.T) {
	cmd := exec.Command("./ciproxy-delegate-cgroup")
	cmd.Env = append(os.Environ(), "CIPROXY_HOOK_ROOT="+t.TempDir())
	cmd.Stdin = strings.NewReader(`{"ociVersion":"1.0.2","id":"c1","status":"creating"}`)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "no pid") {
		t.Errorf("the hook without a pid: %v, %q; want an error saying so", err, out)
	}
}

func (h hookTree) write(t *testing.T, top string) {
	t.Helper()
	proc := filepath.Join(top, "proc", "42")
	must(t, os.MkdirAll(proc, 0o755))
	must(t, os.WriteFile(filepath.Join(proc, "uid_map"), []byte(h.uidMap), 0o644))
	must(t, os.WriteFile(filepath.Join(proc, "cgroup"), []byte(strings.Join(h.cgroup, "\n")+"\n"), 0o644))
	cg := filepath.Join(top, "sys", "fs", "cgroup")
	must(t, os.MkdirAll(cg, 0o755))
	for _, f := range h.files {
		p := filepath.Join(cg, f)
		if strings.HasSuffix(f, "/") {
			must(t, os.MkdirAll(p, 0o755))
			continue
		}
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, nil, 0o644))
	}
}

// runHook runs the hook on the tree at top with state on its standard input and returns what it
// handed to containerRoot, relative to sys/fs/cgroup. As root the hook's chown is the real one and
// the owners are read back; otherwise a chown first on PATH records what it is asked to do.
func runHook(t *testing.T, top, state string) []string {
	t.Helper()
	cmd := exec.Command("./ciproxy-delegate-cgroup")
	cmd.Env = append(os.Environ(), "CIPROXY_HOOK_ROOT="+top)
	log := filepath.Join(t.TempDir(), "chown.log")
	if os.Geteuid() != 0 {
		bin := t.TempDir()
		must(t, os.WriteFile(filepath.Join(bin, "chown"), []byte("#!/bin/sh\necho \"$1 $2\" >>"+log+"\n"), 0o755))
		cmd.Env = append(cmd.Env, "PATH="+bin+":"+os.Getenv("PATH"))
	}
	cmd.Stdin = strings.NewReader(state)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the hook: %v\n%s", err, out)
	}
	cg := filepath.Join(top, "sys", "fs", "cgroup")
	var chowned []string
	if os.Geteuid() != 0 {
		b, err := os.ReadFile(log)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for l := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
			owner, path, ok := strings.Cut(l, " ")
			if !ok {
				continue
			}
			if owner != "1073741824:1073741824" {
				t.Errorf("chown %s %s: want the namespace's root, 1073741824:1073741824", owner, path)
			}
			rel, err := filepath.Rel(cg, path)
			if err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("chown %s: outside the cgroup tree", path)
				continue
			}
			chowned = append(chowned, rel)
		}
		return chowned
	}
	must(t, filepath.WalkDir(filepath.Join(top, "sys"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		if st.Uid == 0 && st.Gid == 0 {
			return nil
		}
		rel, _ := filepath.Rel(cg, p)
		if st.Uid != containerRoot || st.Gid != containerRoot {
			t.Errorf("%s: owned by %d:%d, want 0:0 or the namespace's root", rel, st.Uid, st.Gid)
		}
		chowned = append(chowned, rel)
		return nil
	}))
	return chowned
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
