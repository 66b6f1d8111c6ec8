package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

func TestFiles(t *testing.T) {
	p := sharedProvider(t)
	h := create(t, p, sandbox.CreateOptions{})
	ctx := context.Background()

	if err := p.WriteFile(ctx, h, "in/deep/data.csv", strings.NewReader("a,b\n1,2\n"), 1<<20); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	// The code sees it as its own and can change it.
	res := run(t, p, h, `import os
st = os.stat("/mnt/data/in/deep/data.csv")
open("/mnt/data/in/deep/data.csv", "a").write("3,4\n")
open("/mnt/data/out.txt", "w").write("result")
(st.st_uid, st.st_gid, os.stat("/mnt/data/in").st_uid, open("/mnt/data/in/deep/data.csv").read())`)
	if got, want := mainText(res), `(1000, 1000, 1000, 'a,b\n1,2\n3,4\n')`; got != want {
		t.Fatalf("inside: %s; want %s", got, want)
	}
	var buf bytes.Buffer
	n, err := p.ReadFile(ctx, h, "out.txt", &buf, 1<<20)
	if err != nil || n != 6 || buf.String() != "result" {
		t.Errorf("ReadFile = %d, %v, %q", n, err, buf.String())
	}
	if _, err := p.ReadFile(ctx, h, "out.txt", io.Discard, 5); !errors.Is(err, sandbox.ErrFileTooLarge) {
		t.Errorf("ReadFile over max: %v; want ErrFileTooLarge", err)
	}
	if _, err := p.ReadFile(ctx, h, "missing", io.Discard, 5); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("ReadFile of a missing file: %v; want ErrNotFound", err)
	}
	err = p.WriteFile(ctx, h, "big.bin", bytes.NewReader(make([]byte, 1000)), 999)
	if !errors.Is(err, sandbox.ErrFileTooLarge) {
		t.Errorf("WriteFile over max: %v; want ErrFileTooLarge", err)
	}
	ls, err := p.ListFiles(ctx, h, 100)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range ls.Files {
		paths = append(paths, fmt.Sprintf("%s:%d", f.Path, f.Size))
	}
	sort.Strings(paths)
	if got, want := strings.Join(paths, " "), "in/deep/data.csv:12 out.txt:6"; got != want || ls.Truncated {
		t.Errorf("ListFiles = %s (truncated %v); want %s and no partial upload", got, ls.Truncated, want)
	}
	if ls, _ := p.ListFiles(ctx, h, 1); len(ls.Files) != 1 || !ls.Truncated {
		t.Errorf("ListFiles(limit 1) = %+v; want one file, truncated", ls)
	}
	for _, bad := range []string{"", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a\x00b"} {
		if err := p.WriteFile(ctx, h, bad, strings.NewReader("x"), 10); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("WriteFile(%q) = %v; want it refused", bad, err)
		}
		if _, err := p.ReadFile(ctx, h, bad, io.Discard, 10); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("ReadFile(%q) = %v; want it refused", bad, err)
		}
	}
}

// TestFilesHostile: what sandboxed code puts in /mnt/data is never followed or read as a file
// unless it is a regular file of its own.
func TestFilesHostile(t *testing.T) {
	p := sharedProvider(t)
	h := create(t, p, sandbox.CreateOptions{})
	ctx := context.Background()
	res := run(t, p, h, `import os, socket, errno
os.chdir("/mnt/data")
open("/tmp/target", "w").write("outside")
open("plain", "w").write("ok")
os.symlink("/etc/passwd", "passwd-link")
os.symlink("/tmp", "tmp-link")
os.symlink("/proc/1/root/etc", "magic-link")
open("a", "w").write("linked")
os.link("a", "b")
os.mkfifo("fifo")
s = socket.socket(socket.AF_UNIX); s.bind("/mnt/data/sock")
os.symlink("/tmp/target", "over-link")
try:
    os.link("/tmp/target", "cross")
    print("hard link across filesystems")
except OSError as e:
    assert e.errno == errno.EXDEV, e
try:
    os.mknod("dev", 0o600 | 0o020000, os.makedev(1, 3))
    print("made a device")
except OSError:
    pass
`)
	if res.Error != nil || res.Stdout != "" {
		t.Fatalf("setup: %q %+v", res.Stdout, res.Error)
	}
	refused := []string{"passwd-link", "tmp-link/target", "magic-link/passwd", "a", "b", "fifo", "sock"}
	for _, path := range refused {
		done := make(chan error, 1)
		go func() {
			_, err := p.ReadFile(ctx, h, path, io.Discard, 1<<20)
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("ReadFile(%s) = %v; want ErrNotFound", path, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("ReadFile(%s) hangs", path)
		}
	}
	if err := p.WriteFile(ctx, h, "tmp-link/planted", strings.NewReader("x"), 10); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("WriteFile through a symlinked directory: %v; want ErrNotFound", err)
	}
	// A link as the last element is the code's: neither written through nor replaced.
	if err := p.WriteFile(ctx, h, "over-link", strings.NewReader("new"), 10); !errors.Is(err, sandbox.ErrNameTaken) {
		t.Errorf("WriteFile over a link: %v; want ErrNameTaken", err)
	}
	res = run(t, p, h, `import os
(os.path.exists("/tmp/planted"), open("/tmp/target").read(), os.path.islink("/mnt/data/over-link"))`)
	if got := mainText(res); got != "(False, 'outside', True)" {
		t.Errorf("after the writes: %s; want nothing planted, the target untouched, the link kept", got)
	}
	ls, err := p.ListFiles(ctx, h, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range ls.Files {
		got = append(got, f.Path)
	}
	sort.Strings(got)
	// a and b are one file with two links; the links, FIFO and socket are skipped.
	if strings.Join(got, " ") != "plain" || ls.Skipped < 8 {
		t.Errorf("ListFiles = %v, skipped %d; want [plain] and the rest skipped", got, ls.Skipped)
	}
}

// TestFilesSymlinkSwap: while the code swaps a directory for a symlink to /tmp as fast as it can,
// every write lands in the real directory or is refused; none reaches /tmp.
func TestFilesSymlinkSwap(t *testing.T) {
	p := sharedProvider(t)
	h := create(t, p, sandbox.CreateOptions{})
	ctx := context.Background()
	run(t, p, h, "import os\nos.mkdir('/mnt/data/d')")
	// d and x trade places, atomically, as fast as the code can make them: one is a directory,
	// the other a symbolic link to /tmp.
	swapping := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		var once bool
		_, err := p.Run(ctx, h, `import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
os.symlink("/tmp", "/mnt/data/x")
print("go", flush=True)
end = time.time() + 2
while time.time() < end:
    # renameat2(AT_FDCWD, d, AT_FDCWD, x, RENAME_EXCHANGE): d is the directory or the link, never missing
    if libc.syscall(316, -100, b"/mnt/data/d", -100, b"/mnt/data/x", 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")`, sandbox.RunOptions{Timeout: time.Minute, OnMessage: func(m sandbox.Message) {
			if m.Type == "stdout" && !once {
				once = true
				close(started)
			}
		}})
		swapping <- err
	}()
	<-started
	var wrote, refused int
	swapDone := false
	for i := 0; i < 5000 && !swapDone; i++ {
		select {
		case err := <-swapping:
			if err != nil {
				t.Fatal(err)
			}
			swapDone = true
		default:
		}
		err := p.WriteFile(ctx, h, fmt.Sprintf("d/f%d", i), strings.NewReader("x"), 10)
		switch {
		case err == nil:
			wrote++
		case errors.Is(err, sandbox.ErrNotFound):
			refused++
		default:
			t.Fatalf("WriteFile: %v", err)
		}
	}
	if !swapDone {
		if err := <-swapping; err != nil {
			t.Fatal(err)
		}
	}
	if refused == 0 {
		t.Errorf("no write met a swapped-in link (%d landed): the swaps did not overlap the writes", wrote)
	}
	res := run(t, p, h, `import os, glob
(len(glob.glob("/tmp/f*")), len(glob.glob("/mnt/data/d/f*")) + len(glob.glob("/mnt/data/x/f*")))`)
	if got, want := mainText(res), fmt.Sprintf("(0, %d)", wrote); got != want {
		t.Errorf("files in /tmp and in the directory: %s; want %s (%d written, %d refused)", got, want, wrote, refused)
	}
	t.Logf("%d writes landed, %d refused during the swaps", wrote, refused)
}

func TestFilesGoneSandbox(t *testing.T) {
	p := sharedProvider(t)
	h, err := p.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ListFiles(context.Background(), h, 10); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("ListFiles after Delete: %v; want ErrNotFound", err)
	}
	if err := p.WriteFile(context.Background(), h, "x", strings.NewReader("x"), 10); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("WriteFile after Delete: %v; want ErrNotFound", err)
	}
}

// BenchmarkListFiles lists /mnt/data holding n files.
func BenchmarkListFiles(b *testing.B) {
	p := newTestProvider(b, Options{PoolSize: -1})
	for _, n := range []int{0, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			h := create(b, p, sandbox.CreateOptions{})
			run(b, p, h, fmt.Sprintf("import os\nfor i in range(%d):\n    open(f'/mnt/data/f{i}.txt', 'w').write('x' * 100)", n))
			for b.Loop() {
				ls, err := p.ListFiles(context.Background(), h, 10000)
				if err != nil || len(ls.Files) != n {
					b.Fatalf("ListFiles = %d files, %v", len(ls.Files), err)
				}
			}
		})
	}
}

// BenchmarkFileTransfer places and reads back a 10 MB file, against a plain copy into a file of
// the same kind of filesystem (tmpfs) on the host.
func BenchmarkFileTransfer(b *testing.B) {
	data := bytes.Repeat([]byte("0123456789"), 1<<20)
	b.Run("WriteFile", func(b *testing.B) {
		p := sharedProvider(b)
		h := create(b, p, sandbox.CreateOptions{})
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if err := p.WriteFile(context.Background(), h, "big.bin", bytes.NewReader(data), 20<<20); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ReadFile", func(b *testing.B) {
		p := sharedProvider(b)
		h := create(b, p, sandbox.CreateOptions{})
		if err := p.WriteFile(context.Background(), h, "big.bin", bytes.NewReader(data), 20<<20); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(data)))
		var buf bytes.Buffer
		for b.Loop() {
			buf.Reset()
			if _, err := p.ReadFile(context.Background(), h, "big.bin", &buf, 20<<20); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("plain copy", func(b *testing.B) {
		dir, err := os.MkdirTemp("/dev/shm", "bench-")
		if err != nil {
			b.Skip("no /dev/shm")
		}
		defer os.RemoveAll(dir)
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			f, err := os.Create(filepath.Join(dir, "big.bin"))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(f, bytes.NewReader(data)); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
}

// TestFilesLeased: a file the sandbox holds a write lease on (the filter refuses F_SETLEASE, so
// the sandbox here runs without it) is busy for every read, each one answered after a bounded
// number of tries rather than after the lease's break time, and at once when the context ends.
func TestFilesLeased(t *testing.T) {
	p := newTestProviderWith(t, Options{PoolSize: -1}, knobs{noSeccomp: true})
	h := create(t, p, sandbox.CreateOptions{})
	ctx := context.Background()
	res := run(t, p, h, `import fcntl, os, signal
signal.signal(signal.SIGIO, signal.SIG_IGN)  # the break notice each open sends
open("/mnt/data/leased.txt", "w").write("held")
open("/mnt/data/free.txt", "w").write("free")
lease_fd = os.open("/mnt/data/leased.txt", os.O_RDONLY)
fcntl.fcntl(lease_fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
fcntl.fcntl(lease_fd, fcntl.F_GETLEASE) == fcntl.F_WRLCK`)
	if got := mainText(res); got != "True" {
		t.Fatalf("taking the lease: %s (%+v)", got, res.Error)
	}
	const readers = 8
	errs := make(chan error, readers)
	for range readers {
		go func() {
			_, err := p.ReadFile(ctx, h, "leased.txt", io.Discard, 1<<20)
			errs <- err
		}()
	}
	for range readers {
		if err := <-errs; !errors.Is(err, sandbox.ErrFileBusy) {
			t.Errorf("ReadFile of the leased file: %v; want ErrFileBusy", err)
		}
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := p.ReadFile(ended, h, "leased.txt", io.Discard, 1<<20); !errors.Is(err, context.Canceled) {
		t.Errorf("ReadFile of the leased file with an ended context: %v; want context.Canceled", err)
	}
	var buf bytes.Buffer
	if _, err := p.ReadFile(ctx, h, "free.txt", &buf, 1<<20); err != nil || buf.String() != "free" {
		t.Errorf("ReadFile of another file: %q, %v", buf.String(), err)
	}
	// Replacing or removing the leased file does not open it: no lease stands in the way.
	if err := p.WriteFile(ctx, h, "leased-copy.txt", strings.NewReader("copy"), 10); err != nil {
		t.Errorf("WriteFile beside the leased file: %v", err)
	}
	if ls, err := p.ListFiles(ctx, h, 10); err != nil || len(ls.Files) != 3 {
		t.Errorf("ListFiles with a leased file = %+v, %v; want 3 files", ls, err)
	}
	run(t, p, h, `fcntl.fcntl(lease_fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)`)
	buf.Reset()
	if _, err := p.ReadFile(ctx, h, "leased.txt", &buf, 1<<20); err != nil || buf.String() != "held" {
		t.Errorf("ReadFile once the lease is gone: %q, %v", buf.String(), err)
	}
}

// TestFilesCharged: what WriteFile places in /mnt/data counts against the sandbox's memory
// cgroup as the code's own files do, and a file the sandbox's memory cannot take is refused with
// ErrContainerFull while the kernel lives on.
func TestFilesCharged(t *testing.T) {
	p := newTestProvider(t, Options{PoolSize: -1, MemoryLimit: 256 << 20, MaxDiskSize: 512 << 20})
	requireCgroups(t, p)
	h := create(t, p, sandbox.CreateOptions{})
	b, err := p.lookup(h)
	if err != nil {
		t.Fatal(err)
	}
	if b.cg.chargeDir() == "" {
		t.Skip("no memory controller: placed files are charged to the proxy (Isolation says so)")
	}
	// What the sandbox's memory limit bounds: in v2 its cgroup above both leaves (v2Copy, where
	// the helper writes, and v2Box).
	file := filepath.Join(b.cg.chargeDir(), "memory.usage_in_bytes")
	if slices.Contains(b.cg.host.v2Controllers, "memory") {
		file = filepath.Join(b.cg.v2Dir(""), "memory.current")
	}
	usage := func() int64 {
		s, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(s)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	ctx := context.Background()
	const size = 32 << 20
	before := usage()
	if err := p.WriteFile(ctx, h, "placed.bin", bytes.NewReader(make([]byte, size)), size); err != nil {
		t.Fatal(err)
	}
	// The kernel charges a cgroup in batches: each CPU keeps a stock of up to 64 pages already
	// counted in usage_in_bytes and spends it before charging again, so a write may be paid partly
	// out of pages charged before it began. Uncharged, the file would grow usage by nothing.
	stock := int64(runtime.NumCPU() * 64 * os.Getpagesize())
	if grew := usage() - before; grew < size-stock {
		t.Errorf("the sandbox's memory grew by %d bytes for a %d-byte file; want all of it charged", grew, size)
	}
	// More than what is left of its memory: refused, and nothing is left of it.
	over := 256<<20 - usage() + 16<<20
	err = p.WriteFile(ctx, h, "too-big.bin", bytes.NewReader(make([]byte, over)), over)
	if !errors.Is(err, sandbox.ErrContainerFull) {
		t.Errorf("WriteFile of %d bytes past the sandbox's memory: %v; want ErrContainerFull", over, err)
	}
	if got := mainText(run(t, p, h, `import os
(sorted(os.listdir("/mnt/data")), 1 + 1)`)); got != "(['placed.bin'], 2)" {
		t.Errorf("after the refused write: %s; want the kernel alive and only placed.bin", got)
	}
	// The helper's death is not the sandbox's: it did not run out of memory.
	if err := p.Delete(ctx, h); err != nil {
		t.Fatal(err)
	}
	if b.oom.Load() {
		t.Error("the sandbox is said to have run out of memory for the helper the controller killed")
	}
}
