package local

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// TestHostileKernel: code that tampers with its own kernel's protocol cannot hang the proxy:
// every Run still returns within its timeout, and Delete and Close work.
func TestHostileKernel(t *testing.T) {
	p := newTestProvider(t, Options{PoolSize: -1})
	p.grace = 500 * time.Millisecond
	tests := []struct {
		name string
		code string // run first, then a second Run must return in time
	}{
		{"forged end of execution", "import os, sys, time\nos.write(sys.modules['__main__'].PROTO_OUT, b'{\"type\":\"end_of_execution\"}\\n')\ntime.sleep(30)"},
		{"garbage on the protocol channel", "import os, sys, time\nos.write(sys.modules['__main__'].PROTO_OUT, b'not json\\n')\ntime.sleep(30)"},
		{"kernel stops reading requests", "import threading, time\nfor th in threading.enumerate():\n    pass\nimport sys\nm = sys.modules['__main__']\nm.json.loads = lambda s: time.sleep(10**6)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := p.Create(context.Background(), sandbox.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Delete(context.Background(), h)
			_, _ = p.Run(context.Background(), h, tc.code, sandbox.RunOptions{Timeout: 2 * time.Second})
			done := make(chan error, 1)
			go func() {
				// Over a pipe buffer's worth of code, so a kernel that stopped reading blocks the write.
				_, err := p.Run(context.Background(), h, "x = 1\n#"+strings.Repeat("x", 200<<10), sandbox.RunOptions{Timeout: 2 * time.Second})
				done <- err
			}()
			select {
			case <-done:
			case <-time.After(sendTimeout + 20*time.Second):
				t.Fatal("the second Run did not return")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := p.Delete(ctx, h); err != nil {
				t.Errorf("Delete: %v", err)
			}
		})
	}
}

// TestDiskLimit: /mnt/data is a tmpfs of MaxDiskSize, so writers meet the limit as a full disk
// (ENOSPC), background ones too, and a flood of empty files meets it as well (inodes); the
// sandbox lives on.
func TestDiskLimit(t *testing.T) {
	p := newTestProvider(t, Options{PoolSize: -1, MaxDiskSize: 8 << 20})
	for _, tc := range []struct{ name, start string }{
		{"background writer", "import subprocess\nsubprocess.Popen(['python3', '-c', 'import time\\ntry:\\n    f = open(\"/mnt/data/big\", \"wb\")\\n    while True:\\n        f.write(b\"x\" * 65536); f.flush()\\nexcept OSError as e:\\n    open(\"/tmp/err\", \"w\").write(str(e.errno))'])"},
		{"empty files", "import subprocess\nsubprocess.Popen(['python3', '-c', 'try:\\n    for i in range(10**6):\\n        open(\"/mnt/data/e%d\" % i, \"w\").close()\\nexcept OSError as e:\\n    open(\"/tmp/err\", \"w\").write(str(e.errno))'])"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := create(t, p, sandbox.CreateOptions{})
			run(t, p, h, tc.start)
			// The writer runs while a cell runs (the sandbox is frozen between cells).
			res := run(t, p, h, `import os, time
for _ in range(200):
    if os.path.exists("/tmp/err"):
        break
    time.sleep(0.05)
st = os.statvfs("/mnt/data")
print(open("/tmp/err").read(), (st.f_blocks - st.f_bfree) * st.f_frsize <= 8 << 20)`)
			if res.Stdout != "28 True\n" {
				t.Errorf("stdout %q, error %+v; want ENOSPC (28) and at most 8 MiB used", res.Stdout, res.Error)
			}
			if got := mainText(run(t, p, h, "1 + 1")); got != "2" {
				t.Errorf("after the full disk: %q", got)
			}
			// The proxy's own writes meet the full disk as an answer, and Fit saw it coming.
			if n, err := p.Fit(context.Background(), h, []int64{1 << 20}); n != 0 || err != nil {
				t.Errorf("Fit(1 MiB) on the full disk = %d, %v; want 0", n, err)
			}
			err := p.WriteFile(context.Background(), h, "more", bytes.NewReader(make([]byte, 1<<20)), 2<<20)
			if !errors.Is(err, sandbox.ErrContainerFull) {
				t.Errorf("WriteFile on the full disk: %v; want ErrContainerFull", err)
			}
		})
	}
	h := create(t, p, sandbox.CreateOptions{})
	if n, err := p.Fit(context.Background(), h, []int64{3 << 20, 3 << 20, 3 << 20}); n != 2 || err != nil {
		t.Errorf("Fit(3 × 3 MiB) in 8 MiB = %d, %v; want 2", n, err)
	}
}

// TestWorkDirMustBePrivate: a work directory another user could control is refused.
func TestWorkDirMustBePrivate(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(open, link); err != nil {
		t.Fatal(err)
	}
	for _, wd := range []string{open, link} {
		if err := privateDir(wd); err == nil {
			t.Errorf("privateDir(%s) = nil; want it refused", wd)
		}
	}
	if err := privateDir(filepath.Join(dir, "fresh")); err != nil {
		t.Errorf("privateDir(fresh) = %v", err)
	}
}
