package e2b_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2b"
)

// run executes code in the sandbox and returns its stdout.
func run(t *testing.T, p *e2b.Provider, h sandbox.Handle, code string) string {
	t.Helper()
	res, err := p.Run(context.Background(), h, code, sandbox.RunOptions{})
	if err != nil || res.Error != nil {
		t.Fatalf("Run(%q) = %+v, %v", code, res, err)
	}
	return res.Stdout
}

// dataDirEntries lists every name below /mnt/data, hidden ones included, as the sandbox sees it.
func dataDirEntries(t *testing.T, p *e2b.Provider, h sandbox.Handle) []string {
	t.Helper()
	out := run(t, p, h, "import os\nfor d, ds, fs in os.walk('/mnt/data'):\n    for n in ds + fs: print(os.path.relpath(os.path.join(d, n), '/mnt/data'))")
	names := strings.Fields(out)
	slices.Sort(names)
	return names
}

func random(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func TestFileSystemRoundTrip(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	ctx := context.Background()
	csv := []byte("region,sales\nnorth,1\n")
	big := random(3<<20 + 7)
	if err := p.WriteFile(ctx, h, "sales.csv", bytes.NewReader(csv), 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteFile(ctx, h, "nested/dir/big.bin", bytes.NewReader(big), int64(len(big))); err != nil {
		t.Fatalf("WriteFile of exactly max bytes = %v", err)
	}
	// The code sees the files where OpenAI's containers have them.
	if got := run(t, p, h, "print(open('/mnt/data/sales.csv').read(), end='')"); got != string(csv) {
		t.Errorf("the sandbox reads %q", got)
	}
	var buf bytes.Buffer
	n, err := p.ReadFile(ctx, h, "nested/dir/big.bin", &buf, int64(len(big)))
	if err != nil || n != int64(len(big)) || !bytes.Equal(buf.Bytes(), big) {
		t.Fatalf("ReadFile = %d, %v (equal: %v)", n, err, bytes.Equal(buf.Bytes(), big))
	}
	if err := p.WriteFile(ctx, h, "sales.csv", strings.NewReader("replaced"), 100); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	if _, err := p.ReadFile(ctx, h, "sales.csv", &buf, 100); err != nil || buf.String() != "replaced" {
		t.Errorf("after replacing: %q, %v", buf.String(), err)
	}
	if got, want := dataDirEntries(t, p, h), []string{"nested", "nested/dir", "nested/dir/big.bin", "sales.csv"}; !slices.Equal(got, want) {
		t.Errorf("/mnt/data holds %v; want %v (no temporary file left)", got, want)
	}

	// As the SDK does: multipart to a temporary path, then Move; the e2b API key never goes there.
	up, ok := srv.LastRequest("49983 POST /files")
	if !ok || !strings.HasPrefix(up.Header.Get("Content-Type"), "multipart/form-data; boundary=") ||
		!strings.HasPrefix(up.URL.Query().Get("path"), "/mnt/data/.ciproxy-upload-") || up.Header.Get("X-Access-Token") != h.AccessToken {
		t.Errorf("upload request = %+v", up)
	}
	mv, ok := srv.LastRequest("49983 POST /filesystem.Filesystem/Move")
	if !ok || mv.Header.Get("Content-Type") != "application/json" || mv.Header.Get("Connect-Protocol-Version") != "1" {
		t.Errorf("move request = %+v", mv)
	}
	for _, route := range []string{"49983 POST /files", "49983 GET /files", "49983 POST /filesystem.Filesystem/Stat", "49983 POST /filesystem.Filesystem/Move"} {
		if r, _ := srv.LastRequest(route); r.Header.Get("X-Api-Key") != "" || strings.Contains(fmt.Sprint(r.Header), srv.APIKey()) {
			t.Errorf("%s carried the e2b API key", route)
		}
	}
	if dl, _ := srv.LastRequest("49983 GET /files"); dl.Header.Get("Accept-Encoding") != "identity" {
		t.Errorf("download Accept-Encoding = %q; want identity", dl.Header.Get("Accept-Encoding"))
	}
}

func TestWriteFileLeavesNothingPartial(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	ctx := context.Background()
	if err := p.WriteFile(ctx, h, "keep.txt", strings.NewReader("old content"), 100); err != nil {
		t.Fatal(err)
	}
	err := p.WriteFile(ctx, h, "big.bin", bytes.NewReader(random(3<<20)), 1<<20)
	if !errors.Is(err, sandbox.ErrFileTooLarge) {
		t.Errorf("WriteFile past max = %v; want ErrFileTooLarge", err)
	}
	if err := p.WriteFile(ctx, h, "keep.txt", io.MultiReader(strings.NewReader("new"), failing{}), 100); err == nil || errors.Is(err, sandbox.ErrFileTooLarge) {
		t.Errorf("WriteFile from a failing reader = %v; want its error", err)
	}
	if err := p.WriteFile(ctx, h, "keep.txt", strings.NewReader("one byte too many"), 16); !errors.Is(err, sandbox.ErrFileTooLarge) {
		t.Errorf("WriteFile of max+1 bytes = %v", err)
	}
	if got := dataDirEntries(t, p, h); !slices.Equal(got, []string{"keep.txt"}) {
		t.Errorf("/mnt/data holds %v after failed writes; want only keep.txt", got)
	}
	var buf bytes.Buffer
	if _, err := p.ReadFile(ctx, h, "keep.txt", &buf, 100); err != nil || buf.String() != "old content" {
		t.Errorf("a failed replace changed the file: %q, %v", buf.String(), err)
	}
}

type failing struct{}

func (failing) Read([]byte) (int, error) { return 0, errors.New("the source broke") }

func TestReadFileRefuses(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	ctx := context.Background()
	run(t, p, h, `import os
open('/mnt/data/ten.txt', 'w').write('0123456789')
os.symlink('/etc/passwd', '/mnt/data/passwd-link')
os.symlink('ten.txt', '/mnt/data/inner-link')
os.mkfifo('/mnt/data/fifo')
os.mkdir('/mnt/data/dir')
os.symlink('/etc', '/mnt/data/etc-link')`)
	tests := []struct {
		name string
		path string
		max  int64
		want error
	}{
		{"larger than max", "ten.txt", 9, sandbox.ErrFileTooLarge},
		{"a link out", "passwd-link", 1 << 20, sandbox.ErrNotFound},
		{"a link in", "inner-link", 1 << 20, sandbox.ErrNotFound},
		{"a FIFO", "fifo", 1 << 20, sandbox.ErrNotFound},
		{"a directory", "dir", 1 << 20, sandbox.ErrNotFound},
		{"missing", "none.txt", 1 << 20, sandbox.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			n, err := p.ReadFile(ctx, h, tc.path, &buf, tc.max)
			if !errors.Is(err, tc.want) || n != 0 || buf.Len() != 0 {
				t.Errorf("ReadFile(%s) = %d, %v, %d bytes written; want %v and nothing written", tc.path, n, err, buf.Len(), tc.want)
			}
		})
	}
	var buf bytes.Buffer
	if n, err := p.ReadFile(ctx, h, "ten.txt", &buf, 10); err != nil || n != 10 {
		t.Errorf("ReadFile of exactly max = %d, %v", n, err)
	}
	for _, bad := range []string{"", "/etc/passwd", "../etc/passwd", "a/../../x", "a//b", "./ten.txt", "a/.", "x\x00y"} {
		if _, err := p.ReadFile(ctx, h, bad, io.Discard, 100); err == nil {
			t.Errorf("ReadFile(%q) succeeded", bad)
		}
		if err := p.WriteFile(ctx, h, bad, strings.NewReader("x"), 100); err == nil {
			t.Errorf("WriteFile(%q) succeeded", bad)
		}
	}
	if _, err := p.ReadFile(ctx, h, "etc-link/passwd", io.Discard, 1<<20); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("ReadFile through a link to a directory = %v; want ErrNotFound", err)
	}
}

func TestListFiles(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	ctx := context.Background()
	if l, err := p.ListFiles(ctx, h, 10); err != nil || len(l.Files) != 0 || l.Skipped != 0 || l.Truncated {
		t.Fatalf("ListFiles of an empty /mnt/data = %+v, %v", l, err)
	}
	run(t, p, h, `import os
os.makedirs('/mnt/data/out/plots', exist_ok=True)
open('/mnt/data/out/result.csv', 'w').write('x\n1\n')
open('/mnt/data/out/plots/fig.png', 'wb').write(b'\x89PNG' + b'0' * 96)
open('/mnt/data/empty', 'w').close()
open('/mnt/data/.hidden', 'w').write('h')
os.symlink('/etc/passwd', '/mnt/data/passwd')
os.symlink('/etc', '/mnt/data/etc')
os.symlink('/nowhere', '/mnt/data/dangling')
os.mkfifo('/mnt/data/fifo')
os.chmod('/mnt/data/empty', 0o4755)`)
	l, err := p.ListFiles(ctx, h, 100)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, f := range l.Files {
		got[f.Path] = f.Size
		if f.ModTime.IsZero() {
			t.Errorf("%s has no modification time", f.Path)
		}
	}
	want := map[string]int64{"out/result.csv": 4, "out/plots/fig.png": 100, "empty": 0, ".hidden": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) || l.Skipped != 4 || l.Truncated {
		t.Errorf("ListFiles = %v skipped %d truncated %v; want %v, the 3 links and the FIFO skipped", got, l.Skipped, l.Truncated, want)
	}
	l, err = p.ListFiles(ctx, h, 2)
	if err != nil || len(l.Files) != 2 || !l.Truncated {
		t.Errorf("ListFiles(limit 2) = %+v, %v; want 2 files and truncated", l, err)
	}
}

func TestFilesOfAGoneSandbox(t *testing.T) {
	_, srv := newEnv(t)
	p := provider(t, srv)
	h := create(t, p)
	ctx := context.Background()
	if err := p.Delete(ctx, h); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteFile(ctx, h, "a.txt", strings.NewReader("a"), 10); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("WriteFile = %v; want ErrNotFound", err)
	}
	if _, err := p.ReadFile(ctx, h, "a.txt", io.Discard, 10); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("ReadFile = %v; want ErrNotFound", err)
	}
	if _, err := p.ListFiles(ctx, h, 10); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("ListFiles = %v; want ErrNotFound (not an empty listing)", err)
	}
}

// hostileEnvd answers envd's routes with what a sandbox's own code could make envd say, or with
// what a broken envd would send. stat answers Stat for the file; /mnt/data and the directories
// on the way are plain directories unless root says otherwise.
func hostileEnvd(t *testing.T, stat, listing string, download func(w http.ResponseWriter), root ...string) *e2b.Provider {
	t.Helper()
	dir := `{"entry":{"name":"d","type":"FILE_TYPE_DIRECTORY","path":"/mnt/data","permissions":"drwxr-xr-x"}}`
	if len(root) > 0 {
		dir = root[0]
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/filesystem.Filesystem/Stat":
			var req struct{ Path string }
			_ = json.NewDecoder(r.Body).Decode(&req)
			if req.Path == "/mnt/data" || !strings.HasPrefix(req.Path, "/mnt/data/f") {
				io.WriteString(w, dir)
				return
			}
			io.WriteString(w, stat)
		case "/filesystem.Filesystem/ListDir":
			io.WriteString(w, listing)
		case "/files":
			w.Header().Del("Content-Type")
			download(w)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	p, err := e2b.New(e2b.Options{APIKey: "e2b_0", APIBase: srv.URL, SandboxURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const fileEntry = `{"entry":{"name":"f","type":"FILE_TYPE_FILE","path":"/mnt/data/f","size":"5","permissions":"-rw-r--r--"}}`

func TestHostileEnvd(t *testing.T) {
	ctx := context.Background()
	h := sandbox.Handle{Backend: "e2b", ID: "isbx"}
	t.Run("a file larger than its Stat said is cut at max", func(t *testing.T) {
		p := hostileEnvd(t, fileEntry, "", func(w http.ResponseWriter) { io.WriteString(w, strings.Repeat("x", 1<<20)) })
		var buf bytes.Buffer
		n, err := p.ReadFile(ctx, h, "f", &buf, 10)
		if !errors.Is(err, sandbox.ErrFileTooLarge) || n != 10 || buf.Len() != 10 {
			t.Errorf("ReadFile = %d, %v, %d written; want ErrFileTooLarge after 10 bytes", n, err, buf.Len())
		}
	})
	t.Run("a declared length over max is refused before writing", func(t *testing.T) {
		p := hostileEnvd(t, fileEntry, "", func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", "1000000")
			io.WriteString(w, strings.Repeat("x", 1000000))
		})
		var buf bytes.Buffer
		if _, err := p.ReadFile(ctx, h, "f", &buf, 10); !errors.Is(err, sandbox.ErrFileTooLarge) || buf.Len() != 0 {
			t.Errorf("ReadFile = %v, %d written", err, buf.Len())
		}
	})
	t.Run("a compressed body is refused", func(t *testing.T) {
		p := hostileEnvd(t, fileEntry, "", func(w http.ResponseWriter) {
			w.Header().Set("Content-Encoding", "gzip")
			io.WriteString(w, "\x1f\x8b")
		})
		if _, err := p.ReadFile(ctx, h, "f", io.Discard, 10); err == nil {
			t.Error("ReadFile accepted a gzip body")
		}
	})
	t.Run("links in disguise are not files", func(t *testing.T) {
		for _, stat := range []string{
			`{"entry":{"name":"f","type":"FILE_TYPE_FILE","path":"/mnt/data/f","size":"5","permissions":"Lrwxrwxrwx"}}`,
			`{"entry":{"name":"f","type":"FILE_TYPE_FILE","path":"/mnt/data/f","size":"5","permissions":"-rw-r--r--","symlinkTarget":"/etc/passwd"}}`,
			`{"entry":{"name":"f","type":"FILE_TYPE_FILE","path":"/mnt/data/f","size":"-5","permissions":"-rw-r--r--"}}`,
			`{"entry":{"name":"f","path":"/mnt/data/f","permissions":"prw-r--r--"}}`,
		} {
			p := hostileEnvd(t, stat, "", func(w http.ResponseWriter) { t.Error("downloaded a refused entry") })
			if _, err := p.ReadFile(ctx, h, "f", io.Discard, 10); err == nil {
				t.Errorf("ReadFile accepted %s", stat)
			}
		}
	})
	t.Run("listing entries that make no sense are skipped", func(t *testing.T) {
		listing := `{"entries":[
			{"name":"ok","type":"FILE_TYPE_FILE","path":"/mnt/data/ok","size":"3","permissions":"-rw-r--r--","modifiedTime":"2026-08-21T18:00:00.5Z"},
			{"name":"neg","type":"FILE_TYPE_FILE","path":"/mnt/data/neg","size":"-1","permissions":"-rw-r--r--"},
			{"name":"nan","type":"FILE_TYPE_FILE","path":"/mnt/data/nan","size":"lots","permissions":"-rw-r--r--"},
			{"name":"out","type":"FILE_TYPE_FILE","path":"/etc/shadow","size":"3","permissions":"-rw-r--r--"},
			{"name":"up","type":"FILE_TYPE_FILE","path":"/mnt/data/../etc/shadow","size":"3","permissions":"-rw-r--r--"},
			{"name":"l","type":"FILE_TYPE_FILE","path":"/mnt/data/l","size":"3","permissions":"Lrwxrwxrwx","symlinkTarget":"/etc/shadow"},
			{"name":"dev","path":"/mnt/data/dev","permissions":"Dcrw-rw-rw-"},
			{"name":"d","type":"FILE_TYPE_DIRECTORY","path":"/mnt/data/d","size":"4096","permissions":"drwxr-xr-x"}
		],"unknown":{"a":[1,2]}}`
		p := hostileEnvd(t, "", listing, nil)
		l, err := p.ListFiles(ctx, h, 10)
		if err != nil || len(l.Files) != 1 || l.Files[0].Path != "ok" || l.Files[0].Size != 3 || l.Skipped != 6 || l.Truncated {
			t.Errorf("ListFiles = %+v, %v; want ok alone and 6 skipped", l, err)
		}
	})
	t.Run("a listing of a million entries is read only as far as limit needs", func(t *testing.T) {
		var b strings.Builder
		b.WriteString(`{"entries":[`)
		for i := range 1_000_000 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"name":"l%d","type":"FILE_TYPE_FILE","path":"/mnt/data/l%d","permissions":"Lrwxrwxrwx","symlinkTarget":"/x"}`, i, i)
		}
		b.WriteString(`]}`)
		p := hostileEnvd(t, "", b.String(), nil)
		l, err := p.ListFiles(ctx, h, 10)
		if err != nil || !l.Truncated || len(l.Files) != 0 || l.Skipped > 10*4+1024 {
			t.Errorf("ListFiles = %d files, %d skipped, truncated %v, %v", len(l.Files), l.Skipped, l.Truncated, err)
		}
	})
	t.Run("a /mnt/data that is a link lists nothing and reads nothing", func(t *testing.T) {
		link := `{"entry":{"name":"data","type":"FILE_TYPE_DIRECTORY","path":"/mnt/data","permissions":"Lrwxrwxrwx","symlinkTarget":"/etc"}}`
		p := hostileEnvd(t, fileEntry, `{"entries":[{"name":"passwd","type":"FILE_TYPE_FILE","path":"/mnt/data/passwd","size":"3","permissions":"-rw-r--r--"}]}`,
			func(w http.ResponseWriter) { t.Error("downloaded through a linked /mnt/data") }, link)
		if l, err := p.ListFiles(ctx, h, 10); err != nil || len(l.Files) != 0 || l.Skipped != 1 {
			t.Errorf("ListFiles = %+v, %v", l, err)
		}
		if _, err := p.ReadFile(ctx, h, "f", io.Discard, 10); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("ReadFile = %v", err)
		}
	})
	t.Run("a listing that is not JSON is an error", func(t *testing.T) {
		p := hostileEnvd(t, "", `{"entries":[{"name":`, nil)
		if _, err := p.ListFiles(ctx, h, 10); !errors.Is(err, sandbox.ErrUnavailable) {
			t.Errorf("ListFiles = %v; want ErrUnavailable", err)
		}
	})
}
