package local

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/testutil"
)

const sweepHelperEnv = "CIPROXY_TEST_SWEEP_HELPER"

// helperState is what the helper process reports before it is killed.
type helperState struct {
	ID      string   `json:"id"`
	Base    string   `json:"base"`
	Lock    string   `json:"lock"`
	Init    int      `json:"init"`
	Cgroups []string `json:"cgroups"`
}

// sweepHelper runs as a separate process: a provider in dir with one sandbox holding a file,
// reported on stdout, then it waits to be killed.
func sweepHelper(dir string) {
	p, err := newProvider(Options{WorkDir: dir, PoolSize: -1}, testKnobs(knobs{}))
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	ctx := context.Background()
	h, err := p.Create(ctx, sandbox.CreateOptions{})
	if err == nil {
		_, err = p.Run(ctx, h, "open('/mnt/data/user-file', 'w').write('private')", sandbox.RunOptions{})
	}
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	b, _ := p.lookup(h)
	st := helperState{ID: p.id, Base: p.base, Lock: p.lock.Name(), Init: b.pid}
	for _, d := range p.cg.dirs() {
		st.Cgroups = append(st.Cgroups, filepath.Join(d, b.id))
	}
	out, _ := json.Marshal(st)
	fmt.Println(string(out))
	select {}
}

// TestSweepAfterKill: a proxy killed with SIGKILL leaves its directory, lock and cgroups behind;
// the next provider in the same work dir removes them, and leaves a live provider's alone.
func TestSweepAfterKill(t *testing.T) {
	dir := t.TempDir()
	live := newTestProvider(t, Options{WorkDir: dir, PoolSize: -1})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), sweepHelperEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	var st helperState
	if err != nil || json.Unmarshal([]byte(line), &st) != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper: %q %v", line, err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	// Its sandbox dies with it (the fork server's bubblewrap dies with its parent).
	testutil.Eventually(t, "the killed proxy's sandbox to exit", func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(st.Init))
		return os.IsNotExist(err)
	})
	for _, p := range append([]string{st.Base, st.Lock}, st.Cgroups...) {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s is not there before the sweep: %v", p, err)
		}
	}
	next := newTestProvider(t, Options{WorkDir: dir, PoolSize: -1})
	for _, p := range append([]string{st.Base, st.Lock}, st.Cgroups...) {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after the sweep (%v)", p, err)
		}
	}
	noCgroupsOf(t, st.ID)
	for _, p := range []*Provider{live, next} {
		if _, err := os.Stat(p.base); err != nil {
			t.Errorf("a live provider's directory was swept: %v", err)
		}
		h := create(t, p, sandbox.CreateOptions{})
		if got := mainText(run(t, p, h, "1 + 1")); got != "2" {
			t.Errorf("a live provider after the sweep: %q", got)
		}
	}
}

// noCgroupsOf fails the test if provider id's cgroup is in any hierarchy.
func noCgroupsOf(t *testing.T, id string) {
	t.Helper()
	roots := cgroupRoots()
	if len(roots) == 0 {
		t.Skip("no cgroup hierarchy on this host")
	}
	for _, root := range roots {
		if _, err := os.Stat(filepath.Join(root, cgroupName(id))); !os.IsNotExist(err) {
			t.Errorf("%s left in %s (%v)", cgroupName(id), root, err)
		}
	}
}

// TestCgroupsRemoved: a provider that closes, with sandboxes live and in its pool, leaves no
// cgroup in any hierarchy, used or not (the v1 freezer beside a v2 hierarchy was left at every
// start); a sweep removes what a dead provider left in every hierarchy.
func TestCgroupsRemoved(t *testing.T) {
	t.Run("close", func(t *testing.T) {
		p, err := newProvider(Options{WorkDir: t.TempDir(), PoolSize: 1}, testKnobs(knobs{}))
		if err != nil {
			t.Fatal(err)
		}
		requireCgroups(t, p)
		h, err := p.Create(context.Background(), sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := mainText(run(t, p, h, "1 + 1")); got != "2" {
			t.Fatalf("1 + 1 = %s", got)
		}
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		noCgroupsOf(t, p.id)
	})
	t.Run("start check", func(t *testing.T) {
		// The check's provider is known by the lock it makes in the work dir.
		dir := t.TempDir()
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE); err != nil {
			t.Fatal(err)
		}
		if _, err := checkWith(context.Background(), Options{WorkDir: dir}, testKnobs(knobs{})); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64<<10)
		n, err := unix.Read(fd, buf)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			if id, ok := strings.CutSuffix(name, ".lock"); ok {
				ids = append(ids, id)
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
		if len(ids) != 1 {
			t.Fatalf("locks made by the check: %v; want one", ids)
		}
		noCgroupsOf(t, ids[0])
	})
	t.Run("sweep", func(t *testing.T) {
		// What a crashed provider of any version leaves: its lock, free, and its cgroups,
		// one with an empty sandbox cgroup in it, in every hierarchy.
		dir := t.TempDir()
		id := "p-" + newID()[:16]
		if err := os.WriteFile(filepath.Join(dir, id+".lock"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, root := range cgroupRoots() {
			if err := os.MkdirAll(filepath.Join(root, cgroupName(id), newID()), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		newTestProvider(t, Options{WorkDir: dir, PoolSize: -1})
		noCgroupsOf(t, id)
	})
}
