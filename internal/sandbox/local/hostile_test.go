package local

import (
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
	p := newProvider(t, Options{PoolSize: -1})
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

// TestDiskLimitBetweenRuns: a background process that keeps writing after its cell ended is
// stopped by the disk limit too, and empty files count against it.
func TestDiskLimitBetweenRuns(t *testing.T) {
	p := newProvider(t, Options{PoolSize: -1, MaxDiskSize: 8 << 20})
	p.diskEvery = 100 * time.Millisecond
	for _, tc := range []struct{ name, code string }{
		{"background writer", "import subprocess\nsubprocess.Popen(['python3', '-c', 'import time\\nf = open(\"/mnt/data/big\", \"wb\")\\nwhile True:\\n    f.write(b\"x\" * 65536); f.flush(); time.sleep(0.01)'])"},
		{"empty files", "import subprocess\nsubprocess.Popen(['python3', '-c', 'import time\\nfor i in range(100000):\\n    open(\"/mnt/data/e%d\" % i, \"w\").close()\\ntime.sleep(60)'])"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := p.Create(context.Background(), sandbox.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Delete(context.Background(), h)
			if _, err := p.Run(context.Background(), h, tc.code, sandbox.RunOptions{Timeout: 10 * time.Second}); err != nil {
				t.Fatalf("Run: %v", err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				_, err := p.Run(context.Background(), h, "1", sandbox.RunOptions{Timeout: 5 * time.Second})
				if errors.Is(err, sandbox.ErrNotFound) {
					return // stopped by the limit
				}
				if time.Now().After(deadline) {
					t.Fatal("the sandbox kept running over its disk limit")
				}
				time.Sleep(200 * time.Millisecond)
			}
		})
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
