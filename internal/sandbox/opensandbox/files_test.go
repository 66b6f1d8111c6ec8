package opensandbox_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

func TestFiles(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p, sandbox.CreateOptions{})
	t.Cleanup(func() { _ = p.Delete(context.Background(), h) })
	ctx := t.Context()

	if err := p.WriteFile(ctx, h, "in/data.csv", strings.NewReader("a,b\n1,2\n"), 100); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if err := p.WriteFile(ctx, h, "in/data.csv", strings.NewReader("a,b\n3,4\n"), 100); err != nil {
		t.Fatalf("WriteFile over a file: %v", err)
	}
	res, err := p.Run(ctx, h, "print(open('/mnt/data/in/data.csv').read(), end='')", sandbox.RunOptions{})
	if err != nil || res.Stdout != "a,b\n3,4\n" {
		t.Fatalf("the code reads %q %v", res.Stdout, err)
	}
	// What the code makes: a file, a link to a file outside, a link to a directory, a FIFO.
	code := `import os
open('/mnt/data/out.txt', 'w').write('written by code')
open('/tmp/secret', 'w').write('secret')
os.symlink('/tmp/secret', '/mnt/data/link')
os.makedirs('/tmp/d', exist_ok=True)
os.symlink('/tmp/d', '/mnt/data/dirlink')
os.mkfifo('/mnt/data/fifo')
`
	if res, err := p.Run(ctx, h, code, sandbox.RunOptions{}); err != nil || res.Error != nil {
		t.Fatalf("setup code: %v %+v", err, res.Error)
	}
	list, err := p.ListFiles(ctx, h, 100)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, f := range list.Files {
		got[f.Path] = f.Size
	}
	if len(got) != 2 || got["out.txt"] != 15 || got["in/data.csv"] != 8 || list.Skipped != 3 {
		t.Errorf("listing %+v", list)
	}
	if l, _ := p.ListFiles(ctx, h, 1); len(l.Files) != 1 || !l.Truncated {
		t.Errorf("listing with limit 1: %+v", l)
	}

	for _, c := range []struct {
		name, path string
		max        int64
		want       string
		err        error
	}{
		{"file", "out.txt", 100, "written by code", nil},
		{"too large", "out.txt", 5, "", sandbox.ErrFileTooLarge},
		{"link", "link", 100, "", sandbox.ErrNotFound},
		{"through a linked directory", "dirlink/x", 100, "", sandbox.ErrNotFound},
		{"fifo", "fifo", 100, "", sandbox.ErrNotFound},
		{"missing", "nope", 100, "", sandbox.ErrNotFound},
	} {
		t.Run("read "+c.name, func(t *testing.T) {
			var b bytes.Buffer
			rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			_, err := p.ReadFile(rctx, h, c.path, &b, c.max)
			if c.err == nil && (err != nil || b.String() != c.want) {
				t.Errorf("%q %v", b.String(), err)
			}
			if c.err != nil && !errors.Is(err, c.err) {
				t.Errorf("%v, want %v", err, c.err)
			}
		})
	}
	for _, c := range []struct {
		name, path string
		body       io.Reader
		max        int64
		err        error
	}{
		{"over a link", "link", strings.NewReader("x"), 10, sandbox.ErrNameTaken},
		{"through a linked directory", "dirlink/x", strings.NewReader("x"), 10, sandbox.ErrNameTaken},
		{"too large", "big.bin", strings.NewReader(strings.Repeat("x", 11)), 10, sandbox.ErrFileTooLarge},
		{"not clean", "../etc/passwd", strings.NewReader("x"), 10, nil},
	} {
		t.Run("write "+c.name, func(t *testing.T) {
			err := p.WriteFile(ctx, h, c.path, c.body, c.max)
			if err == nil || (c.err != nil && !errors.Is(err, c.err)) {
				t.Errorf("%v, want %v", err, c.err)
			}
		})
	}
	res, err = p.Run(ctx, h, "import os\nprint(open('/tmp/secret').read(), os.path.exists('/tmp/d/x'), sorted(n for n in os.listdir('/mnt/data') if n.startswith('.') or n == 'big.bin'))", sandbox.RunOptions{})
	if err != nil || res.Stdout != "secret False []\n" {
		t.Errorf("after the refused writes: %q %v", res.Stdout, err)
	}
	if err := p.RemoveFile(ctx, h, "link"); err != nil {
		t.Fatal(err)
	}
	if err := p.RemoveFile(ctx, h, "link"); err != nil {
		t.Errorf("removing a missing file: %v", err)
	}
	res, _ = p.Run(ctx, h, "import os\nprint(os.path.lexists('/mnt/data/link'), open('/tmp/secret').read())", sandbox.RunOptions{})
	if res.Stdout != "False secret\n" {
		t.Errorf("after removing the link: %q", res.Stdout)
	}
}

func TestExec(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p, sandbox.CreateOptions{})
	t.Cleanup(func() { _ = p.Delete(context.Background(), h) })
	for _, c := range []struct {
		name, cmd   string
		timeout     time.Duration
		stdout, err string
		code        int
		timedOut    bool
	}{
		{"ok", "pwd; echo two", 0, "/mnt/data\ntwo\n", "", 0, false},
		{"stderr and status", "echo oops >&2; exit 3", 0, "", "oops\n", 3, false},
		{"empty line", "printf 'a\\n\\nb\\n'", 0, "a\n\nb\n", "", 0, false},
		{"timeout", "sleep 30", time.Second, "", "", 0, true},
		{"no execd token in the environment", "env | grep -c EXECD_ACCESS_TOKEN", 0, "0\n", "", 1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut strings.Builder
			res, err := p.Exec(t.Context(), h, c.cmd, sandbox.ExecOptions{Timeout: c.timeout, OnOutput: func(s sandbox.Stream, text string) {
				if s == sandbox.Stdout {
					out.WriteString(text)
				} else {
					errOut.WriteString(text)
				}
			}})
			if err != nil {
				t.Fatal(err)
			}
			if out.String() != c.stdout || errOut.String() != c.err || res.ExitCode != c.code || res.TimedOut != c.timedOut {
				t.Errorf("stdout %q stderr %q result %+v", out.String(), errOut.String(), res)
			}
		})
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if _, err := p.Exec(ctx, h, "sleep 30", sandbox.ExecOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled: %v", err)
	}
}
