package e2btest_test

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
)

// rpc calls the filesystem Connect service as the SDK does (JSON codec).
func (e *env) rpc(id, token, method, body string, hdr ...string) response {
	e.t.Helper()
	hdr = append([]string{"Content-Type", "application/json", "Connect-Protocol-Version", "1", "X-Access-Token", token}, hdr...)
	return e.data(id, e2btest.EnvdPort, "POST", "/filesystem.Filesystem/"+method, body, hdr...)
}

type entryJSON struct {
	Name          string  `json:"name"`
	Type          string  `json:"type"`
	Path          string  `json:"path"`
	Size          string  `json:"size"`
	Mode          uint32  `json:"mode"`
	Permissions   string  `json:"permissions"`
	Owner         string  `json:"owner"`
	Group         string  `json:"group"`
	ModifiedTime  string  `json:"modifiedTime"`
	SymlinkTarget *string `json:"symlinkTarget"`
}

var protoTime = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3}|\.\d{6}|\.\d{9})?Z$`)

func TestFilesystemService(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"code-interpreter-v1","timeout":300,"secure":true}`)
	id, token := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
	// What sandboxed code can make: nested files, links of every kind, a FIFO.
	setup := `import os
os.makedirs('/mnt/data/tree/sub/deeper', exist_ok=True)
open('/mnt/data/tree/a.csv', 'w').write('a,b\n')
open('/mnt/data/tree/sub/b.txt', 'w').write('bee')
open('/mnt/data/tree/sub/deeper/c.txt', 'w').write('c')
open('/mnt/data/tree/empty', 'w').close()
os.symlink('a.csv', '/mnt/data/tree/link-to-file')
os.symlink('/etc', '/mnt/data/tree/link-to-dir')
os.symlink('/nowhere', '/mnt/data/tree/dangling')
os.link('/mnt/data/tree/a.csv', '/mnt/data/tree/hard')
os.mkfifo('/mnt/data/tree/fifo')
print('ok')`
	body, _ := json.Marshal(map[string]any{"code": setup})
	if r := e.execute(id, string(body), "X-Access-Token", token); !strings.Contains(r.body, `"text": "ok\n"`) {
		t.Fatalf("setup = %s", r.body)
	}

	r := e.rpc(id, token, "ListDir", `{"path":"/mnt/data/tree","depth":1}`)
	if r.status != 200 || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("ListDir = %d %s", r.status, r.body)
	}
	var list struct{ Entries []entryJSON }
	if err := json.Unmarshal([]byte(r.body), &list); err != nil {
		t.Fatal(err)
	}
	got := map[string]entryJSON{}
	var names []string
	for _, en := range list.Entries {
		got[en.Name] = en
		names = append(names, en.Name)
		if !protoTime.MatchString(en.ModifiedTime) || en.Path != "/mnt/data/tree/"+en.Name || en.Owner == "" || en.Group == "" {
			t.Errorf("entry %s = %+v", en.Name, en)
		}
	}
	if want := "a.csv dangling empty fifo hard link-to-dir link-to-file sub"; strings.Join(names, " ") != want {
		t.Errorf("depth 1 lists %v; want %s (sorted, one level)", names, want)
	}
	str := func(p *string) string {
		if p == nil {
			return "<none>"
		}
		return *p
	}
	tests := []struct {
		name, typ, size, perm, target string
	}{
		{"a.csv", "FILE_TYPE_FILE", "4", "-rw", "<none>"},
		{"hard", "FILE_TYPE_FILE", "4", "-rw", "<none>"}, // a hard link is a file like any other
		{"empty", "FILE_TYPE_FILE", "", "-rw", "<none>"},
		{"sub", "FILE_TYPE_DIRECTORY", "*", "drwx", "<none>"},
		// Links: described by their target, their own permissions, and symlinkTarget.
		{"link-to-file", "FILE_TYPE_FILE", "5", "Lrwx", "/mnt/data/tree/a.csv"},
		{"link-to-dir", "FILE_TYPE_DIRECTORY", "4", "Lrwx", "/etc"},
		{"dangling", "", "8", "Lrwx", "/mnt/data/tree/dangling"},
		{"fifo", "", "", "prw", "<none>"},
	}
	for _, tc := range tests {
		en := got[tc.name]
		if en.Type != tc.typ || (tc.size != "*" && en.Size != tc.size) || !strings.HasPrefix(en.Permissions, tc.perm) || str(en.SymlinkTarget) != tc.target {
			t.Errorf("%s = type %q size %q permissions %q target %s; want %q %q %q... %s", tc.name, en.Type, en.Size, en.Permissions, str(en.SymlinkTarget), tc.typ, tc.size, tc.perm, tc.target)
		}
	}
	if got["a.csv"].Mode != 0o644 && got["a.csv"].Mode != 0o664 {
		t.Errorf("a.csv mode = %o", got["a.csv"].Mode)
	}

	// Depth: deeper levels, never through a link; the requested path is kept in every path.
	r = e.rpc(id, token, "ListDir", `{"path":"/mnt/data/tree/sub","depth":5}`)
	if !strings.Contains(r.body, `"path":"/mnt/data/tree/sub/deeper/c.txt"`) || strings.Contains(r.body, "passwd") {
		t.Errorf("ListDir depth 5 = %s", r.body)
	}
	r = e.rpc(id, token, "ListDir", `{"path":"/mnt/data/tree","depth":10}`)
	if strings.Contains(r.body, "/etc/") || strings.Count(r.body, `"name":`) != 11 {
		t.Errorf("ListDir depth 10 followed a link or missed entries: %s", r.body)
	}
	// A directory reached through a link is listed under the path asked for.
	r = e.rpc(id, token, "ListDir", `{"path":"/mnt/data/tree/link-to-dir","depth":1}`)
	if r.status != 200 || !strings.Contains(r.body, `"path":"/mnt/data/tree/link-to-dir/passwd"`) {
		t.Errorf("ListDir through a link = %d %.300s", r.status, r.body)
	}

	rpcErrors := []struct {
		name, method, body string
		hdr                []string
		status             int
		code               string
	}{
		{"missing dir", "ListDir", `{"path":"/mnt/data/none"}`, nil, 404, "not_found"},
		{"a file is not a dir", "ListDir", `{"path":"/mnt/data/tree/a.csv"}`, nil, 400, "invalid_argument"},
		{"stat missing", "Stat", `{"path":"/mnt/data/none"}`, nil, 404, "not_found"},
		{"existing dir", "MakeDir", `{"path":"/mnt/data/tree"}`, nil, 409, "already_exists"},
		{"move missing", "Move", `{"source":"/mnt/data/none","destination":"/mnt/data/x"}`, nil, 404, "not_found"},
		{"unknown user", "Stat", `{"path":"/"}`, []string{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte("mallory:"))}, 401, "unauthenticated"},
		{"bad JSON", "Stat", `{"path":`, nil, 400, "invalid_argument"},
	}
	for _, tc := range rpcErrors {
		t.Run(tc.name, func(t *testing.T) {
			r := e.rpc(id, token, tc.method, tc.body, tc.hdr...)
			var ce struct{ Code, Message string }
			if err := json.Unmarshal([]byte(r.body), &ce); err != nil || r.status != tc.status || ce.Code != tc.code || ce.Message == "" {
				t.Errorf("%s = %d %s; want %d %s", tc.method, r.status, r.body, tc.status, tc.code)
			}
		})
	}
	if r := e.data(id, e2btest.EnvdPort, "POST", "/filesystem.Filesystem/Stat", `{}`, "Content-Type", "text/plain", "X-Access-Token", token); r.status != 415 {
		t.Errorf("a non-JSON codec = %d; want 415", r.status)
	}
	if r := e.rpc(id, "wrong", "Stat", `{"path":"/"}`); r.status != 401 {
		t.Errorf("a wrong token = %d; want 401", r.status)
	}

	// Stat describes a link without following it; MakeDir, Move and Remove change the tree.
	r = e.rpc(id, token, "Stat", `{"path":"/mnt/data/tree/link-to-file"}`)
	var st struct{ Entry entryJSON }
	if err := json.Unmarshal([]byte(r.body), &st); err != nil || !strings.HasPrefix(st.Entry.Permissions, "L") || str(st.Entry.SymlinkTarget) != "/mnt/data/tree/a.csv" {
		t.Errorf("Stat(link) = %s", r.body)
	}
	if r := e.rpc(id, token, "MakeDir", `{"path":"/mnt/data/new/a/b"}`); r.status != 200 || !strings.Contains(r.body, `"type":"FILE_TYPE_DIRECTORY"`) {
		t.Errorf("MakeDir = %d %s", r.status, r.body)
	}
	if r := e.rpc(id, token, "Move", `{"source":"/mnt/data/tree/a.csv","destination":"/mnt/data/moved/a.csv"}`); r.status != 200 || !strings.Contains(r.body, `"path":"/mnt/data/moved/a.csv"`) {
		t.Errorf("Move = %d %s", r.status, r.body)
	}
	if r := e.rpc(id, token, "Remove", `{"path":"/mnt/data/tree"}`); r.status != 200 || r.body != "{}" {
		t.Errorf("Remove = %d %s", r.status, r.body)
	}
	if r := e.rpc(id, token, "Remove", `{"path":"/mnt/data/tree"}`); r.status != 200 {
		t.Errorf("Remove of what is gone = %d %s", r.status, r.body)
	}
	if r := e.rpc(id, token, "Stat", `{"path":"/etc/passwd"}`); r.status != 200 {
		t.Errorf("removing a tree with a link to /etc removed /etc: %d %s", r.status, r.body)
	}
	if r := e.rpc(id, token, "ListDir", `{"path":"/mnt/data/new/a/b"}`); r.status != 200 || r.body != "{}" {
		t.Errorf("an empty directory lists as %d %s; want {}", r.status, r.body)
	}
}

// TestFileTransfersStream: files larger than one hidden cell's chunk go up and come back intact, in
// every encoding envd offers.
func TestFileTransfersStream(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"code-interpreter-v1","timeout":300,"secure":true}`)
	id, token := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
	data := make([]byte, 5<<20+123)
	_, _ = rand.Read(data)

	if r := e.data(id, e2btest.EnvdPort, "POST", "/files?path=/mnt/data/big.bin", string(data), "Content-Type", "application/octet-stream", "X-Access-Token", token); r.status != 200 {
		t.Fatalf("upload = %d %s", r.status, r.body)
	}
	r := e.data(id, e2btest.EnvdPort, "GET", "/files?path=/mnt/data/big.bin", "", "X-Access-Token", token, "Accept-Encoding", "identity")
	if r.status != 200 || r.body != string(data) || r.header.Get("Content-Length") != strconv.Itoa(len(data)) || r.header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("download = %d, %d bytes, %v", r.status, len(r.body), r.header)
	}
	req, _ := http.NewRequest("GET", e.srv.SandboxURL()+"/files?path=/mnt/data/big.bin", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(e2btest.EnvdPort))
	req.Header.Set("X-Access-Token", token)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	zr, err := gzip.NewReader(resp.Body)
	if err != nil || resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip download: %v %v", err, resp.Header)
	}
	if b, err := io.ReadAll(zr); err != nil || !bytes.Equal(b, data) {
		t.Errorf("gzip download = %d bytes, %v", len(b), err)
	}
	if r := e.data(id, e2btest.EnvdPort, "GET", "/files?path=/mnt/data/big.bin", "", "X-Access-Token", token, "Accept-Encoding", "identity;q=0"); r.status != 406 {
		t.Errorf("no acceptable encoding = %d; want 406", r.status)
	}

	// A gzip-encoded octet-stream upload, and a multipart one whose filename is the path.
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	_, _ = zw.Write(data[:3<<20])
	_ = zw.Close()
	if r := e.data(id, e2btest.EnvdPort, "POST", "/files?path=gz.bin", z.String(), "Content-Type", "application/octet-stream", "Content-Encoding", "gzip", "X-Access-Token", token); r.status != 200 || !strings.Contains(r.body, `"name":"gz.bin"`) {
		t.Fatalf("gzip upload = %d %s", r.status, r.body)
	}
	if r := e.data(id, e2btest.EnvdPort, "GET", "/files?path=gz.bin", "", "X-Access-Token", token); r.body != string(data[:3<<20]) {
		t.Errorf("gzip upload stored %d bytes", len(r.body))
	}
	if r := e.data(id, e2btest.EnvdPort, "GET", "/files?path=/mnt/data/big.bin&username=nobody", "", "X-Access-Token", token); r.status != 401 {
		t.Errorf("an unknown user = %d; want 401", r.status)
	}
}

// TestTemplateHasNoMntData: as e2b's code-interpreter-v1, a new sandbox has no /mnt/data: the
// kernel cannot write there and envd finds nothing, until envd makes it (MakeDir, an upload below
// it) or the code does.
func TestTemplateHasNoMntData(t *testing.T) {
	e := newEnv(t)
	write := `{"code":"open('/mnt/data/state.txt', 'w').write('kept'); print(open('/mnt/data/state.txt').read())"}`
	cases := []struct {
		name string
		make func(id, token string) response // nil: nothing makes it
	}{
		{"nothing makes it", nil},
		{"MakeDir", func(id, token string) response {
			return e.rpc(id, token, "MakeDir", `{"path":"/mnt/data"}`)
		}},
		{"an upload below it", func(id, token string) response {
			return e.data(id, e2btest.EnvdPort, "POST", "/files?path=/mnt/data/in/a.csv", "a,b\n", "Content-Type", "application/octet-stream", "X-Access-Token", token)
		}},
		{"the code", func(id, token string) response {
			return e.execute(id, `{"code":"import os; os.makedirs('/mnt/data', exist_ok=True)"}`, "X-Access-Token", token)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sb := e.create(`{"templateID":"code-interpreter-v1","timeout":300,"secure":true}`)
			id, token := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
			if r := e.rpc(id, token, "Stat", `{"path":"/mnt/data"}`); r.status != http.StatusNotFound || !strings.Contains(r.body, `"not_found"`) {
				t.Errorf("Stat of /mnt/data in a new sandbox = %d %s; want 404 not_found", r.status, r.body)
			}
			if r := e.rpc(id, token, "ListDir", `{"path":"/mnt/data"}`); r.status != http.StatusNotFound {
				t.Errorf("ListDir of /mnt/data in a new sandbox = %d %s; want 404", r.status, r.body)
			}
			if tc.make == nil {
				if r := e.execute(id, write, "X-Access-Token", token); !strings.Contains(r.body, `"name": "FileNotFoundError"`) || strings.Contains(r.body, `"text": "kept`) {
					t.Errorf("writing /mnt/data in a new sandbox = %s; want FileNotFoundError", r.body)
				}
				return
			}
			if r := tc.make(id, token); r.status != http.StatusOK || strings.Contains(r.body, `"error"`) {
				t.Fatalf("making it = %d %s", r.status, r.body)
			}
			if r := e.execute(id, write, "X-Access-Token", token); !strings.Contains(r.body, `"text": "kept\n"`) {
				t.Errorf("writing /mnt/data once made = %s", r.body)
			}
			if r := e.rpc(id, token, "MakeDir", `{"path":"/mnt/data"}`); r.status != http.StatusConflict || !strings.Contains(r.body, `"already_exists"`) {
				t.Errorf("MakeDir of the made /mnt/data = %d %s; want 409 already_exists", r.status, r.body)
			}
		})
	}
}
