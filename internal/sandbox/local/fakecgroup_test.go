package local

import (
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// fakeCgroupFS is a cgroupFS with the rules of the kernel's cgroup filesystems that cgroup.go
// depends on, and none of a plain directory's: mkdir fills a cgroup with the control files of its
// hierarchy and controllers; a file that is not there cannot be written (ENOENT); a v2 cgroup with
// processes cannot enable controllers for its children and one that has enabled them cannot take
// processes (EBUSY); a cgroup with children or processes cannot be removed (EBUSY). Every
// operation can be made to fail (fail), and every mkdir and write is recorded (ops).
type fakeCgroupFS struct {
	mu      sync.Mutex
	cgroups map[string]*fakeCgroup // by directory
	self    int                    // the pid that "0" written to cgroup.procs moves
	fail    map[string]error       // "write <path>[=<value>]", "mkdir <dir>", ... → the error that op returns
	ops     []string               // "mkdir <dir>", "write <path>=<value>", in order
}

// fakeHierarchy is one mounted hierarchy of a fakeCgroupFS.
type fakeHierarchy struct {
	v2          bool
	controllers []string // v2: what the root offers its children; v1: what the hierarchy has
	swap        bool     // v2: swap accounting (memory.swap.max)
	memsw       bool     // v1: swap accounting (memory.memsw.limit_in_bytes)
	noKill      bool     // v2: a kernel before 5.14, without cgroup.kill
}

type fakeCgroup struct {
	h        *fakeHierarchy
	parent   *fakeCgroup
	children int
	subtree  []string          // v2 cgroup.subtree_control
	procs    []int             // cgroup.procs
	values   map[string]string // what was written, and what a test set
}

func newFakeCgroupFS() *fakeCgroupFS {
	return &fakeCgroupFS{cgroups: map[string]*fakeCgroup{}, self: 4242, fail: map[string]error{}}
}

// mount adds a hierarchy rooted at root, with the cgroups of path (relative to root) made and,
// in v2, every controller enabled down to it as systemd does for a unit with Delegate=yes.
func (f *fakeCgroupFS) mount(root string, h *fakeHierarchy, path string) string {
	f.cgroups[root] = &fakeCgroup{h: h, values: map[string]string{}}
	if h.v2 {
		f.cgroups[root].subtree = slices.Clone(h.controllers)
	}
	dir := root
	for _, name := range strings.Split(path, "/") {
		if name == "" {
			continue
		}
		parent := f.cgroups[dir]
		dir = filepath.Join(dir, name)
		f.cgroups[dir] = &fakeCgroup{h: h, parent: parent, values: map[string]string{}}
		parent.children++
		if h.v2 && dir != filepath.Join(root, path) {
			f.cgroups[dir].subtree = slices.Clone(h.controllers)
		}
	}
	return dir
}

// enabled are the controllers of cgroup c: in v2 those its parent enabled for it.
func (c *fakeCgroup) enabled() []string {
	switch {
	case !c.h.v2:
		return c.h.controllers
	case c.parent == nil:
		return c.h.controllers
	}
	return c.parent.subtree
}

// files are the control files of c.
func (c *fakeCgroup) files() []string {
	files := []string{"cgroup.procs"}
	if c.h.v2 {
		files = append(files, "cgroup.controllers", "cgroup.subtree_control", "cgroup.events", "cgroup.freeze", "cgroup.type")
		if !c.h.noKill {
			files = append(files, "cgroup.kill")
		}
	} else {
		files = append(files, "tasks", "notify_on_release")
	}
	for _, ctrl := range c.enabled() {
		switch {
		case ctrl == "memory" && c.h.v2:
			files = append(files, "memory.max", "memory.high", "memory.current", "memory.events", "memory.peak", "memory.oom.group")
			if c.h.swap {
				files = append(files, "memory.swap.max", "memory.swap.current")
			}
		case ctrl == "memory":
			files = append(files, "memory.limit_in_bytes", "memory.usage_in_bytes", "memory.max_usage_in_bytes", "memory.oom_control")
			if c.h.memsw {
				files = append(files, "memory.memsw.limit_in_bytes")
			}
		case ctrl == "pids":
			files = append(files, "pids.max", "pids.current")
		case ctrl == "cpu" && c.h.v2:
			files = append(files, "cpu.max", "cpu.weight", "cpu.stat")
		case ctrl == "cpu":
			files = append(files, "cpu.cfs_period_us", "cpu.cfs_quota_us", "cpu.shares")
		case ctrl == "freezer":
			files = append(files, "freezer.state")
		}
	}
	return files
}

// file finds the cgroup of a control file.
func (f *fakeCgroupFS) file(path string) (*fakeCgroup, string, error) {
	c := f.cgroups[filepath.Dir(path)]
	name := filepath.Base(path)
	if c == nil || !slices.Contains(c.files(), name) {
		return nil, "", &fs.PathError{Op: "open", Path: path, Err: syscall.ENOENT}
	}
	return c, name, nil
}

func (f *fakeCgroupFS) injected(op, path string) error {
	if err := f.fail[op+" "+path]; err != nil {
		return &fs.PathError{Op: op, Path: path, Err: err}
	}
	return nil
}

func (f *fakeCgroupFS) Mkdir(dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ops = append(f.ops, "mkdir "+dir)
	if err := f.injected("mkdir", dir); err != nil {
		return err
	}
	parent := f.cgroups[filepath.Dir(dir)]
	switch {
	case parent == nil:
		return &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOENT}
	case f.cgroups[dir] != nil || slices.Contains(parent.files(), filepath.Base(dir)):
		return &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.EEXIST}
	}
	f.cgroups[dir] = &fakeCgroup{h: parent.h, parent: parent, values: map[string]string{}}
	parent.children++
	return nil
}

func (f *fakeCgroupFS) Remove(dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injected("remove", dir); err != nil {
		return err
	}
	c := f.cgroups[dir]
	switch {
	case c == nil:
		if _, _, err := f.file(dir); err == nil {
			return &fs.PathError{Op: "remove", Path: dir, Err: syscall.EPERM}
		}
		return &fs.PathError{Op: "remove", Path: dir, Err: syscall.ENOENT}
	case c.children > 0 || len(c.procs) > 0:
		return &fs.PathError{Op: "remove", Path: dir, Err: syscall.EBUSY}
	}
	delete(f.cgroups, dir)
	if c.parent != nil {
		c.parent.children--
	}
	return nil
}

func (f *fakeCgroupFS) WriteFile(path, value string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ops = append(f.ops, "write "+path+"="+value)
	if err := f.injected("write", path); err != nil {
		return err
	}
	if err := f.injected("write", path+"="+value); err != nil {
		return err
	}
	c, name, err := f.file(path)
	if err != nil {
		return err
	}
	fail := func(errno syscall.Errno) error { return &fs.PathError{Op: "write", Path: path, Err: errno} }
	switch name {
	case "cgroup.subtree_control":
		subtree := slices.Clone(c.subtree)
		for _, w := range strings.Fields(value) {
			ctrl := w[1:]
			switch {
			case !slices.Contains(c.enabled(), ctrl):
				return fail(syscall.ENOENT)
			case w[0] == '+' && !slices.Contains(subtree, ctrl):
				subtree = append(subtree, ctrl)
			case w[0] == '-':
				subtree = slices.DeleteFunc(subtree, func(s string) bool { return s == ctrl })
			}
		}
		if c.parent != nil && len(c.procs) > 0 && len(subtree) > 0 {
			return fail(syscall.EBUSY) // no internal processes
		}
		c.subtree = subtree
	case "cgroup.procs":
		pid, err := strconv.Atoi(value)
		if err != nil {
			return fail(syscall.EINVAL)
		}
		if pid == 0 {
			pid = f.self
		}
		if c.h.v2 && c.parent != nil && len(c.subtree) > 0 {
			return fail(syscall.EBUSY)
		}
		for _, o := range f.cgroups {
			if o.h == c.h {
				o.procs = slices.DeleteFunc(o.procs, func(p int) bool { return p == pid })
			}
		}
		c.procs = append(c.procs, pid)
	case "cgroup.kill":
		for dir, o := range f.cgroups {
			if o.h == c.h && (o == c || strings.HasPrefix(dir, filepath.Dir(path)+"/")) {
				o.procs = nil
			}
		}
	default:
		c.values[name] = value
	}
	return nil
}

func (f *fakeCgroupFS) ReadFile(path string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injected("read", path); err != nil {
		return "", err
	}
	c, name, err := f.file(path)
	if err != nil {
		return "", err
	}
	switch name {
	case "cgroup.controllers":
		return strings.Join(c.enabled(), " "), nil
	case "cgroup.subtree_control":
		return strings.Join(c.subtree, " "), nil
	case "cgroup.procs":
		var out []string
		for _, p := range c.procs {
			out = append(out, strconv.Itoa(p))
		}
		return strings.Join(out, "\n"), nil
	}
	return c.values[name], nil
}

func (f *fakeCgroupFS) Exists(path string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cgroups[path] != nil {
		return true
	}
	_, _, err := f.file(path)
	return err == nil
}

// below lists the cgroups under dir (dir included if it exists), sorted.
func (f *fakeCgroupFS) below(dir string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for d := range f.cgroups {
		if d == dir || strings.HasPrefix(d, dir+"/") {
			out = append(out, d)
		}
	}
	sort.Strings(out)
	return out
}

// set stores a control file's content as the kernel would show it.
func (f *fakeCgroupFS) set(t *testing.T, path, value string) {
	t.Helper()
	c, name, err := f.file(path)
	if err != nil {
		t.Fatal(err)
	}
	c.values[name] = value
}

// value is what a control file holds.
func (f *fakeCgroupFS) value(t *testing.T, path string) string {
	t.Helper()
	v, err := f.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// takeOps returns the operations recorded so far and forgets them.
func (f *fakeCgroupFS) takeOps() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ops := f.ops
	f.ops = nil
	return ops
}

// TestFakeCgroupFS: the fake keeps the rules cgroup.go's tests rely on.
func TestFakeCgroupFS(t *testing.T) {
	f := newFakeCgroupFS()
	own := f.mount("/cg2", &fakeHierarchy{v2: true, controllers: []string{"memory", "pids"}}, "system.slice/unit")
	for _, tc := range []struct {
		name string
		err  error
		want syscall.Errno
	}{
		{"mkdir without a parent", f.Mkdir(own + "/a/b"), syscall.ENOENT},
		{"write to a file that is not there", f.WriteFile(own+"/memory.nonesuch", "1"), syscall.ENOENT},
		{"controller files below a cgroup that enabled none", func() error {
			f.Mkdir(own + "/c")
			return f.WriteFile(own+"/c/memory.max", "1")
		}(), syscall.ENOENT},
		{"subtree_control with processes", func() error {
			f.WriteFile(own+"/cgroup.procs", "0")
			return f.WriteFile(own+"/cgroup.subtree_control", "+memory")
		}(), syscall.EBUSY},
		{"a controller the parent does not give", f.WriteFile(own+"/c/cgroup.subtree_control", "+cpu"), syscall.ENOENT},
		{"rmdir with processes", f.Remove(own), syscall.EBUSY},
		{"rmdir with children", f.Remove(filepath.Dir(own)), syscall.EBUSY},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v; want %v", tc.name, tc.err, tc.want)
		}
	}
	// A sibling of the unit gets the files of the controllers its parent enabled.
	other := filepath.Dir(own) + "/other"
	if err := f.Mkdir(other); err != nil {
		t.Fatal(err)
	}
	if !f.Exists(other+"/memory.max") || f.Exists(other+"/memory.swap.max") || f.Exists(other+"/cpu.max") {
		t.Errorf("a new cgroup's files: %v", f.cgroups[other].files())
	}
}
