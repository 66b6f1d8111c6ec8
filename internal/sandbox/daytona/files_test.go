package daytona_test

import (
	"bytes"
	"context"
	"errors"
	"sort"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

func TestFiles(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p)
	defer p.Delete(context.Background(), h)
	ctx := context.Background()

	if err := p.WriteFile(ctx, h, "in/a.txt", strings.NewReader("hello"), 100); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if r := run(t, p, h, "print(open('in/a.txt').read())"); r.Stdout != "hello\n" {
		t.Errorf("the code does not see the upload in its working directory: %+v", r)
	}
	if err := p.WriteFile(ctx, h, "big.bin", strings.NewReader(strings.Repeat("x", 101)), 100); !errors.Is(err, sandbox.ErrFileTooLarge) {
		t.Errorf("too large: %v", err)
	}
	// What the code makes: files, a link out, a link to a directory out, a FIFO, a hard link.
	run(t, p, h, `import os
os.makedirs('/mnt/data/out', exist_ok=True)
open('/mnt/data/out/b.txt', 'w').write('bee')
os.symlink('/etc/passwd', '/mnt/data/link')
os.symlink('/etc', '/mnt/data/etcdir')
os.mkfifo('/mnt/data/fifo')
open('/tmp/outside', 'w').write('secret')
try:
    os.link('/tmp/outside', '/mnt/data/hard')
except OSError:
    open('/mnt/data/hard', 'w').write('no hard links here')
    os.link('/mnt/data/hard', '/mnt/data/hard2')
`)
	l, err := p.ListFiles(ctx, h, 100)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range l.Files {
		paths = append(paths, f.Path)
		if f.ModTime.IsZero() {
			t.Errorf("%s: no time", f.Path)
		}
	}
	sort.Strings(paths)
	if strings.Join(paths, ",") != "in/a.txt,out/b.txt" || l.Skipped < 3 {
		t.Errorf("listing %v, skipped %d", paths, l.Skipped)
	}
	var buf bytes.Buffer
	if n, err := p.ReadFile(ctx, h, "out/b.txt", &buf, 10); err != nil || n != 3 || buf.String() != "bee" {
		t.Errorf("ReadFile: %d %q %v", n, buf.String(), err)
	}
	for _, bad := range []string{"link", "etcdir/passwd", "fifo", "hard", "missing"} {
		buf.Reset()
		if _, err := p.ReadFile(ctx, h, bad, &buf, 1<<20); !errors.Is(err, sandbox.ErrNotFound) || buf.Len() > 0 {
			t.Errorf("ReadFile(%s): %v, %d bytes", bad, err, buf.Len())
		}
	}
	if _, err := p.ReadFile(ctx, h, "out/b.txt", &buf, 2); !errors.Is(err, sandbox.ErrFileTooLarge) {
		t.Errorf("ReadFile over max: %v", err)
	}
	for _, taken := range []string{"link", "out", "etcdir/x", "fifo"} {
		if err := p.WriteFile(ctx, h, taken, strings.NewReader("x"), 10); !errors.Is(err, sandbox.ErrNameTaken) {
			t.Errorf("WriteFile(%s): %v", taken, err)
		}
	}
	if r := run(t, p, h, "print(open('/etc/passwd').read()[:4])"); r.Stdout == "x\n" {
		t.Error("a write went through a link")
	}
	if err := p.RemoveFile(ctx, h, "link"); err != nil {
		t.Fatal(err)
	}
	if err := p.RemoveFile(ctx, h, "in/a.txt"); err != nil {
		t.Fatal(err)
	}
	if err := p.RemoveFile(ctx, h, "missing"); err != nil {
		t.Errorf("removing a missing file: %v", err)
	}
	if r := run(t, p, h, "import os\nprint(os.path.lexists('/mnt/data/link'), os.path.exists('/etc/passwd'), os.path.exists('in/a.txt'))"); r.Stdout != "False True False\n" {
		t.Errorf("after removals: %+v", r)
	}
	if err := p.WriteFile(ctx, h, "c.txt", strings.NewReader("c"), 10); err != nil {
		t.Fatal(err)
	}
	if l, err := p.ListFiles(ctx, h, 1); err != nil || !l.Truncated || len(l.Files) != 1 {
		t.Errorf("limit 1: %+v %v", l, err)
	}
	for _, bad := range []string{"../etc/passwd", "/etc/passwd", "a//b", ""} {
		if err := p.WriteFile(ctx, h, bad, strings.NewReader("x"), 10); err == nil {
			t.Errorf("WriteFile(%q) accepted", bad)
		}
	}
}
