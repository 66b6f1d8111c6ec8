package backends

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/testutil/localsandbox"
)

// Container files on a real backend: Files API files placed into /mnt/data, uploads, files the code
// writes collected as assistant files, downloads, deletions, limits, and what hostile code makes.
// They run on e2b (the emulator, through envd's file API as the SDK uses it) and, where this build
// has it, on the local backend.

// filesEnv is one process's Sessions with a container of alice's on the named backend.
type filesEnv struct {
	t   *testing.T
	p   *proc
	c   *containers.Container
	ctx context.Context
}

// backendsUnderTest are the backends every container file test runs on.
var backendsUnderTest = []string{"e2b", "local"}

// toolRegistry returns a registry whose tool "cloud" runs on backend: e2b (the emulator) or local.
func toolRegistry(t testing.TB, backend string) func() *sandbox.Registry {
	t.Helper()
	needBubblewrap(t)
	if backend == "e2b" {
		return newE2BEnv(t).registry
	}
	reg := mustBuild(t, parseTools(t, "  - {sandbox_tool_name: cloud, litellm_params: {sandbox_provider: local, pool_size: 0}}\n"), nil)
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	return func() *sandbox.Registry { return reg }
}

func newFilesEnv(t *testing.T, backend string) *filesEnv {
	t.Helper()
	p := newSessions(t, t.TempDir(), toolRegistry(t, backend))
	ctx := context.Background()
	c, err := p.Create(ctx, "cloud", "alice", sandbox.CreateOptions{}, 20*time.Minute)
	if err != nil {
		t.Fatalf("Create() error = %v", err)
	}
	t.Cleanup(func() { p.Release(ctx, c) })
	return &filesEnv{t: t, p: p, c: c, ctx: ctx}
}

// upload stores a Files API file of owner's.
func (e *filesEnv) upload(owner, name, content string) store.File {
	e.t.Helper()
	f, err := store.CreateFile(e.ctx, e.p.st, store.File{Owner: owner, Filename: name, Purpose: "user_data"}, strings.NewReader(content), store.FileLimits{})
	if err != nil {
		e.t.Fatal(err)
	}
	return f
}

// run executes code, failing the test on an error or an exception, and returns what it wrote.
func (e *filesEnv) run(code string, lim containers.ContainerLimits) containers.Outputs {
	e.t.Helper()
	res, out, err := e.c.Execute(e.ctx, code, sandbox.RunOptions{}, lim)
	if err != nil || res.Error != nil {
		e.t.Fatalf("Execute(%q) = %+v, %v", code, res.Error, err)
	}
	return out
}

// read downloads a container file's bytes.
func (e *filesEnv) read(id string, max int64) (string, error) {
	var b bytes.Buffer
	_, _, err := e.p.ReadFile(e.ctx, "alice", e.c.ID(), id, &b, max)
	return b.String(), err
}

func (e *filesEnv) list() []store.ContainerFile {
	e.t.Helper()
	l, err := e.p.Files(e.ctx, "alice", e.c.ID(), store.ContainerFileQuery{Page: store.Page{Order: store.Asc}})
	if err != nil {
		e.t.Fatal(err)
	}
	return l.Items
}

func paths(fs []store.ContainerFile) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Path)
	}
	return out
}

var noLimits = containers.ContainerLimits{}

func TestContainerFilesInAndOut(t *testing.T) {
	for _, b := range backendsUnderTest {
		t.Run(b, func(t *testing.T) { testContainerFilesInAndOut(t, newFilesEnv(t, b)) })
	}
}

func testContainerFilesInAndOut(t *testing.T, e *filesEnv) {
	csv := e.upload("alice", "sales.csv", "region,sales\nnorth,10\nsouth,20\n")
	again := e.upload("alice", "sales.csv", "other,1\n")
	placed, err := e.c.PlaceFiles(e.ctx, []string{csv.ID, again.ID}, noLimits)
	if err != nil {
		t.Fatalf("PlaceFiles() error = %v", err)
	}
	if got := paths(placed); !slices.Equal(got, []string{"/mnt/data/sales.csv", "/mnt/data/sales-1.csv"}) {
		t.Errorf("placed at %v; want their own name, and a suffix on the clash", got)
	}
	for _, f := range placed {
		if !store.ContainerFileKind.Valid(f.ID) || f.Source != containers.SourceUser || f.ContainerID != e.c.ID() {
			t.Errorf("placed record %+v; want a cfile_ id, source user, this container", f)
		}
	}
	// The code sees them where the records say, and what it writes comes back.
	out := e.run(`import os
total = sum(int(l.split(",")[1]) for l in open("/mnt/data/sales.csv").read().splitlines()[1:])
open("/mnt/data/total.txt", "w").write(str(total))
os.makedirs("/mnt/data/charts", exist_ok=True)
open("/mnt/data/charts/plot.png", "wb").write(bytes(range(256)) * 4)
open("/mnt/data/.hidden", "w").write("not a result")
os.makedirs("/mnt/data/.cache", exist_ok=True)
open("/mnt/data/.cache/x", "w").write("nor this")
print(sorted(os.listdir("/mnt/data")))`, noLimits)
	if got := paths(out.Files); !slices.Equal(got, []string{"/mnt/data/charts/plot.png", "/mnt/data/total.txt"}) {
		t.Fatalf("Execute() collected %v; want the two files the code wrote (hidden ones left out, placed ones not again)", got)
	}
	for _, f := range out.Files {
		if f.Source != containers.SourceAssistant {
			t.Errorf("collected %s with source %q; want assistant", f.Path, f.Source)
		}
	}
	if got, err := e.read(out.Files[1].ID, 1<<20); err != nil || got != "30" {
		t.Errorf("ReadFile(total.txt) = %q, %v; want 30", got, err)
	}
	png, err := e.read(out.Files[0].ID, 1<<20)
	if err != nil || png != string(bytes.Repeat(func() []byte {
		b := make([]byte, 256)
		for i := range b {
			b[i] = byte(i)
		}
		return b
	}(), 4)) || out.Files[0].Bytes != 1024 {
		t.Errorf("ReadFile(plot.png) = %d bytes, %v; want the 1024 bytes the code wrote", len(png), err)
	}
	if _, err := e.read(out.Files[0].ID, 100); !errors.Is(err, sandbox.ErrFileTooLarge) {
		t.Errorf("ReadFile(max 100) error = %v; want ErrFileTooLarge", err)
	}

	// An execution that writes nothing records nothing.
	if out := e.run("x = 1", noLimits); len(out.Files) != 0 {
		t.Errorf("Execute(no writes) collected %v; want nothing", paths(out.Files))
	}
	// A changed file keeps its id; a file the code removes loses its record.
	out = e.run(`open("/mnt/data/total.txt", "w").write("30 (checked)")
import os; os.remove("/mnt/data/sales-1.csv")`, noLimits)
	if len(out.Files) != 1 || out.Files[0].ID != placedOrCollected(t, e, "/mnt/data/total.txt").ID || out.Files[0].Bytes != 12 {
		t.Errorf("Execute(change) collected %+v; want total.txt again, same id, 12 bytes", out.Files)
	}
	if got := paths(e.list()); !slices.Equal(got, []string{"/mnt/data/sales.csv", "/mnt/data/charts/plot.png", "/mnt/data/total.txt"}) {
		t.Errorf("files after the change = %v; want sales-1.csv gone", got)
	}

	// An upload lands beside the others, under a free name.
	up, err := e.c.AddFile(e.ctx, "total.txt", "", strings.NewReader("uploaded"), noLimits)
	if err != nil || up.Path != "/mnt/data/total-1.txt" || up.Bytes != 8 || up.Source != containers.SourceUser {
		t.Fatalf("AddFile(total.txt) = %+v, %v; want /mnt/data/total-1.txt, 8 bytes, user", up, err)
	}
	if out := e.run(`print(open("/mnt/data/total-1.txt").read())`, noLimits); len(out.Files) != 0 {
		t.Errorf("Execute after an upload collected %v; want the upload not taken for the code's", paths(out.Files))
	}
	for _, bad := range []string{"", "..", "a\x00b", "a\u202Eb"} {
		if _, err := e.c.AddFile(e.ctx, bad, "", strings.NewReader("x"), noLimits); !errors.Is(err, containers.ErrInvalidFilename) {
			t.Errorf("AddFile(%q) error = %v; want ErrInvalidFilename", bad, err)
		}
	}
	if f, err := e.c.AddFile(e.ctx, "../../etc/passwd", "", strings.NewReader("x"), noLimits); err != nil || f.Path != "/mnt/data/passwd" {
		t.Errorf("AddFile(../../etc/passwd) = %+v, %v; want it kept as passwd inside /mnt/data", f, err)
	}

	// Deleting a container file removes it from the sandbox.
	if err := e.p.DeleteFile(e.ctx, "alice", e.c.ID(), up.ID); err != nil {
		t.Fatal(err)
	}
	if out := e.run(`import os; print(os.path.exists("/mnt/data/total-1.txt"))`, noLimits); len(out.Files) != 0 {
		t.Errorf("Execute collected %v", paths(out.Files))
	}
	res, err := e.c.Run(e.ctx, `import os; os.path.exists("/mnt/data/total-1.txt")`, sandbox.RunOptions{})
	if err != nil || len(res.Results) != 1 || res.Results[0].Text != "False" {
		t.Errorf("the deleted file is still in the sandbox: %+v, %v", res.Results, err)
	}
	if _, err := e.read(up.ID, 1<<20); !errors.Is(err, containers.ErrNoSuchFile) {
		t.Errorf("ReadFile(deleted) error = %v; want ErrNoSuchFile", err)
	}
	if err := e.p.DeleteFile(e.ctx, "alice", e.c.ID(), up.ID); !errors.Is(err, containers.ErrNoSuchFile) {
		t.Errorf("DeleteFile twice error = %v; want ErrNoSuchFile", err)
	}

	// Scoped to the owner.
	if _, err := e.p.Files(e.ctx, "bob", e.c.ID(), store.ContainerFileQuery{}); !errors.Is(err, sandbox.ErrNotFound) || errors.Is(err, containers.ErrNoSuchFile) {
		t.Errorf("Files(bob) error = %v; want ErrNotFound for the container", err)
	}
	var b bytes.Buffer
	if _, _, err := e.p.ReadFile(e.ctx, "bob", e.c.ID(), out.Files[0].ID, &b, 1<<20); !errors.Is(err, sandbox.ErrNotFound) || b.Len() != 0 {
		t.Errorf("ReadFile(bob) error = %v, %d bytes; want ErrNotFound and nothing", err, b.Len())
	}
	bobs := e.upload("bob", "secret.txt", "bob's")
	if _, err := e.c.PlaceFiles(e.ctx, []string{bobs.ID}, noLimits); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("PlaceFiles(bob's file) error = %v; want ErrNotFound", err)
	}
}

func placedOrCollected(t *testing.T, e *filesEnv, p string) store.ContainerFile {
	t.Helper()
	for _, f := range e.list() {
		if f.Path == p {
			return f
		}
	}
	t.Fatalf("no record of %s", p)
	return store.ContainerFile{}
}

// Limits: refused before anything is written, and nothing half-stored.
func TestContainerFileLimits(t *testing.T) {
	for _, b := range backendsUnderTest {
		t.Run(b, func(t *testing.T) { testContainerFileLimits(t, newFilesEnv(t, b)) })
	}
}

func testContainerFileLimits(t *testing.T, e *filesEnv) {
	small := e.upload("alice", "small.txt", "12345")
	big := e.upload("alice", "big.txt", strings.Repeat("x", 100))
	var fe *containers.FileError

	_, err := e.c.PlaceFiles(e.ctx, []string{small.ID, "file-nope", big.ID}, noLimits)
	if !errors.As(err, &fe) || fe.Index != 1 || !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("PlaceFiles(unknown id) error = %v; want a FileError at index 1, ErrNotFound", err)
	}
	_, err = e.c.PlaceFiles(e.ctx, []string{small.ID, big.ID}, containers.ContainerLimits{FileBytes: 50})
	if !errors.As(err, &fe) || fe.Index != 1 || !errors.Is(err, sandbox.ErrFileTooLarge) {
		t.Errorf("PlaceFiles(over the file limit) error = %v; want index 1, ErrFileTooLarge", err)
	}
	_, err = e.c.PlaceFiles(e.ctx, []string{small.ID, big.ID}, containers.ContainerLimits{TotalBytes: 104})
	if !errors.As(err, &fe) || fe.Index != 1 || !errors.Is(err, sandbox.ErrContainerFull) {
		t.Errorf("PlaceFiles(over the container total) error = %v; want index 1, ErrContainerFull", err)
	}
	_, err = e.c.PlaceFiles(e.ctx, []string{small.ID, big.ID}, containers.ContainerLimits{Files: 1})
	if !errors.As(err, &fe) || fe.Index != 1 || !errors.Is(err, containers.ErrTooManyFiles) {
		t.Errorf("PlaceFiles(over the file count) error = %v; want index 1, ErrTooManyFiles", err)
	}
	if got := e.list(); len(got) != 0 {
		t.Fatalf("refused placements recorded %v; want nothing", paths(got))
	}
	res, err := e.c.Run(e.ctx, `import os; sorted(os.listdir("/mnt/data")) if os.path.isdir("/mnt/data") else []`, sandbox.RunOptions{})
	if err != nil || len(res.Results) != 1 || res.Results[0].Text != "[]" {
		t.Errorf("/mnt/data after refused placements = %+v, %v; want empty", res.Results, err)
	}

	lim := containers.ContainerLimits{FileBytes: 64, TotalBytes: 80, Files: 3}
	if _, err := e.c.AddFile(e.ctx, "a.txt", "", strings.NewReader(strings.Repeat("a", 65)), lim); !errors.Is(err, sandbox.ErrFileTooLarge) {
		t.Errorf("AddFile(65 bytes, file limit 64) error = %v; want ErrFileTooLarge", err)
	}
	if _, err := e.c.AddFile(e.ctx, "a.txt", "", strings.NewReader(strings.Repeat("a", 60)), lim); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.AddFile(e.ctx, "b.txt", "", strings.NewReader(strings.Repeat("b", 30)), lim); !errors.Is(err, sandbox.ErrContainerFull) {
		t.Errorf("AddFile(past the container total) error = %v; want ErrContainerFull", err)
	}
	if got := paths(e.list()); !slices.Equal(got, []string{"/mnt/data/a.txt"}) {
		t.Errorf("files after refused uploads = %v; want a.txt only", got)
	}

	// What the code writes past the limits is not recorded, and says so.
	out := e.run(`open("/mnt/data/huge.bin", "wb").write(b"h" * 100)
open("/mnt/data/ok.txt", "w").write("ok")
open("/mnt/data/more.txt", "w").write("more")
open("/mnt/data/third.txt", "w").write("3")`, lim)
	if got := paths(out.Files); !slices.Equal(got, []string{"/mnt/data/more.txt", "/mnt/data/ok.txt"}) ||
		!slices.Equal(out.Skipped, []string{"huge.bin", "third.txt"}) {
		t.Errorf("Execute() over limits: files %v, skipped %v; want more.txt and ok.txt, huge.bin and third.txt skipped", got, out.Skipped)
	}

	// A recorded file the code grows past the limits loses its record: it is not available, and no
	// record may keep announcing its old size.
	out = e.run(`open("/mnt/data/ok.txt", "w").write("k" * 70)`, lim)
	if len(out.Files) != 0 || !slices.Equal(out.Skipped, []string{"ok.txt"}) {
		t.Errorf("Execute(grow ok.txt past the file limit): files %v, skipped %v; want ok.txt skipped", paths(out.Files), out.Skipped)
	}
	if got := paths(e.list()); !slices.Equal(got, []string{"/mnt/data/a.txt", "/mnt/data/more.txt"}) {
		t.Errorf("files after ok.txt grew past the limit = %v; want a.txt and more.txt", got)
	}
}

// What hostile code makes in /mnt/data is never followed: a link to a host file, a FIFO and a
// link swapped in for a recorded file are not collected, and the record of a file replaced by a
// link does not read through it.
func TestContainerFilesHostile(t *testing.T) {
	for _, b := range backendsUnderTest {
		t.Run(b, func(t *testing.T) { testContainerFilesHostile(t, newFilesEnv(t, b)) })
	}
}

func testContainerFilesHostile(t *testing.T, e *filesEnv) {
	out := e.run(`open("/mnt/data/report.txt", "w").write("mine")`, noLimits)
	if len(out.Files) != 1 {
		t.Fatalf("collected %v", paths(out.Files))
	}
	report := out.Files[0]
	out = e.run(`import os
os.symlink("/etc/passwd", "/mnt/data/passwd")
os.mkfifo("/mnt/data/pipe")
os.link("/mnt/data/report.txt", "/mnt/data/hard.txt")
os.remove("/mnt/data/report.txt")
os.symlink("/etc/hostname", "/mnt/data/report.txt")`, noLimits)
	for _, f := range out.Files {
		if base := path.Base(f.Path); base == "passwd" || base == "pipe" || base == "report.txt" {
			t.Errorf("collected %s, which the code made a link or a FIFO", f.Path)
		}
	}
	if got, err := e.read(report.ID, 1<<20); !errors.Is(err, containers.ErrNoSuchFile) || got != "" {
		t.Errorf("ReadFile(a record whose file became a link) = %q, %v; want ErrNoSuchFile, nothing read", got, err)
	}
	if got := paths(e.list()); slices.Contains(got, "/mnt/data/report.txt") {
		t.Errorf("the record of report.txt stayed after it became a link: %v", got)
	}
}

// After a restart: on e2b the files are still there (the records are in the store, the bytes in
// the sandbox, which outlives the proxy); on local the container is expired with its sandbox.
func TestContainerFilesAfterRestart(t *testing.T) {
	for _, backend := range backendsUnderTest {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			reg := toolRegistry(t, backend)
			dir := t.TempDir()
			p := newSessions(t, dir, reg)
			c, err := p.Create(ctx, "cloud", "alice", sandbox.CreateOptions{}, 20*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			_, out, err := c.Execute(ctx, `open("/mnt/data/out.txt", "w").write("from before")`, sandbox.RunOptions{}, noLimits)
			if err != nil || len(out.Files) != 1 {
				t.Fatalf("Execute() = %+v, %v", out, err)
			}
			p.Release(ctx, c)
			p2 := restart(t, p, dir, reg)
			var b bytes.Buffer
			_, _, err = p2.ReadFile(ctx, "alice", c.ID(), out.Files[0].ID, &b, 1<<20)
			if backend == "local" {
				if !errors.Is(err, containers.ErrExpired) || b.Len() != 0 {
					t.Errorf("ReadFile() after a restart = %q, %v; want ErrExpired: the sandbox died with the process", b.String(), err)
				}
				if f, err := p2.File(ctx, "alice", c.ID(), out.Files[0].ID); err != nil || f.Path != "/mnt/data/out.txt" {
					t.Errorf("File() of an expired container = %+v, %v; want its record still listed", f, err)
				}
				return
			}
			if err != nil || b.String() != "from before" {
				t.Errorf("ReadFile() after a restart = %q, %v; want the bytes written before", b.String(), err)
			}
			c2, err := p2.Open(ctx, c.ID(), "alice")
			if err != nil {
				t.Fatal(err)
			}
			defer p2.Release(ctx, c2)
			// The new process knows nothing of the files: it lists them before the next execution.
			_, out, err = c2.Execute(ctx, `open("/mnt/data/new.txt", "w").write("after")`, sandbox.RunOptions{}, noLimits)
			if got := paths(out.Files); err != nil || !slices.Equal(got, []string{"/mnt/data/new.txt"}) {
				t.Errorf("Execute() after a restart collected %v, %v; want only the new file", got, err)
			}
		})
	}
}

// BenchmarkCollectFiles is the cost of finding new files after an execution that wrote nothing,
// with n files in /mnt/data: one listing compared with the last one, no store access.
func BenchmarkCollectFiles(b *testing.B) {
	for _, backend := range backendsUnderTest {
		for _, n := range []int{0, 100, 1000} {
			b.Run(fmt.Sprintf("%s/files=%d", backend, n), func(b *testing.B) { benchCollectFiles(b, backend, n) })
		}
	}
}

func benchCollectFiles(b *testing.B, backend string, n int) {
	p := newSessions(b, b.TempDir(), toolRegistry(b, backend))
	ctx := context.Background()
	c, err := p.Create(ctx, "cloud", "alice", sandbox.CreateOptions{}, 20*time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Release(ctx, c)
	code := fmt.Sprintf(`import os
os.makedirs("/mnt/data", exist_ok=True)
for i in range(%d):
    open("/mnt/data/f%%04d.csv" %% i, "w").write("x" * i)`, n)
	lim := containers.ContainerLimits{Files: 2000}
	_, out, err := c.Execute(ctx, code, sandbox.RunOptions{}, lim)
	if err != nil || len(out.Files) != n {
		b.Fatalf("setup collected %d files, %v; want %d", len(out.Files), err, n)
	}
	b.ResetTimer()
	for b.Loop() {
		out, err := c.CollectFiles(ctx, lim)
		if err != nil || len(out.Files) != 0 {
			b.Fatalf("CollectFiles() = %d files, %v; want none", len(out.Files), err)
		}
	}
}

// TestFiguresBecomeContainerFiles: a figure the code displays is saved into /mnt/data under its
// container file id, as OpenAI's containers do (the "cfile_….png" an unlinked image is cited by),
// with the bytes of the image output; a file code names that way itself gets an id of its own.
func TestFiguresBecomeContainerFiles(t *testing.T) {
	localsandbox.PythonModules(t, "/usr/bin/python3", "matplotlib")
	for _, b := range backendsUnderTest {
		t.Run(b, func(t *testing.T) {
			e := newFilesEnv(t, b)
			forged := "cfile_" + strings.Repeat("ab", 16) + ".png"
			code := `import matplotlib.pyplot as plt
open("/mnt/data/` + forged + `", "wb").write(b"not a figure")
plt.plot([1, 2, 3]); plt.show()`
			res, out, err := e.c.Execute(e.ctx, code, sandbox.RunOptions{}, noLimits)
			if err != nil || res.Error != nil {
				t.Fatalf("Execute() = %+v, %v", res.Error, err)
			}
			var png string
			for _, r := range res.Results {
				if r.PNG != "" {
					png = r.PNG
				}
			}
			if png == "" {
				t.Fatalf("the execution returned no image: %+v", res.Results)
			}
			want, _ := base64.StdEncoding.DecodeString(png)
			var figure, other *store.ContainerFile
			for i, f := range out.Files {
				switch {
				case f.Path == sandbox.DataDir+"/"+f.ID+".png":
					figure = &out.Files[i]
				case f.Path == sandbox.DataDir+"/"+forged:
					other = &out.Files[i]
				}
			}
			if figure == nil || figure.Source != containers.SourceAssistant {
				t.Fatalf("no figure recorded under its own id among %v", paths(out.Files))
			}
			if got, err := e.read(figure.ID, 1<<20); err != nil || got != string(want) {
				t.Errorf("the figure's bytes: %d bytes, %v; want the image output's %d", len(got), err, len(want))
			}
			if other == nil || other.ID+".png" == forged {
				t.Errorf("a file the code named like a container file id: %+v; want it recorded under an id of its own", other)
			}
		})
	}
}
