package agentsandboxtest

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestFiles(t *testing.T) {
	s := New(t, Options{Template: "tmpl", WarmPool: "pool", PodEnv: map[string]string{"SANDBOX_A": "a", "SANDBOX_API_KEY": "k", "OTHER": "o"}})
	_, sb, ip := readyClaim(t, s, client(t, s), newClaim("pool"))
	base := "http://" + net.JoinHostPort(ip, strconv.Itoa(s.FilesPort()))
	data := s.PodDataDir(sb)
	if err := os.Symlink("/etc/passwd", filepath.Join(data, "passwd")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../..", filepath.Join(data, "up")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("dir", filepath.Join(data, "dirlink")); err != nil {
		t.Fatal(err)
	}
	multi := func() (string, []byte) {
		var b bytes.Buffer
		mw := multipart.NewWriter(&b)
		fw, _ := mw.CreateFormFile("file", "x.bin")
		fw.Write([]byte("multi"))
		mw.Close()
		return mw.FormDataContentType(), b.Bytes()
	}
	ct, body := multi()
	const escape = `{"code":"PERMISSION_DENIED","message":"path traversal outside sandbox root is forbidden"}` + "\n"
	const notFound = `{"code":"NOT_FOUND","message":"path does not exist within the sandbox"}` + "\n"
	tests := []struct {
		name, method, path, ctype string
		body                      []byte
		code                      int
		want                      string // "" = not checked
	}{
		{"put raw", "PUT", "/v1/files/dir/a.txt?mode=0600", "", []byte("hello"), 204, ""},
		{"get", "GET", "/v1/files/dir/a.txt", "", nil, 200, "hello"},
		{"get absolute", "GET", "/v1/files/%2Fmnt%2Fdata%2Fdir%2Fa.txt", "", nil, 200, "hello"},
		{"head", "HEAD", "/v1/files/dir/a.txt", "", nil, 200, ""},
		{"head missing", "HEAD", "/v1/files/nope", "", nil, 404, ""},
		{"get missing", "GET", "/v1/files/nope", "", nil, 404, notFound},
		{"put multipart", "PUT", "/v1/files/m.bin", ct, body, 204, ""},
		{"get multipart", "GET", "/v1/files/m.bin", "", nil, 200, "multi"},
		{"put bad mode", "PUT", "/v1/files/x?mode=777", "", []byte("x"), 400, `{"code":"INVALID_ARGUMENT","message":"mode \"777\" must match ^0[0-7]{3}$"}` + "\n"},
		{"put onto directory", "PUT", "/v1/files/dir", "", []byte("x"), 400, `{"code":"INVALID_ARGUMENT","message":"target path is a directory"}` + "\n"},
		{"symlink escape", "GET", "/v1/files/passwd", "", nil, 403, escape},
		{"symlink dir escape", "GET", "/v1/files/up/etc/passwd", "", nil, 403, escape},
		{"dotdot", "GET", "/v1/files/..%2F..%2Fetc%2Fpasswd", "", nil, 403, escape},
		{"put through escaping link", "PUT", "/v1/files/up/x", "", []byte("x"), 403, escape},
		{"listing", "GET", "/v1/files/dir", "", nil, 200, ""},
		{"delete non-empty", "DELETE", "/v1/files/dir", "", nil, 409, `{"code":"CONFLICT","message":"directory is not empty; pass recursive=true to remove it"}` + "\n"},
		{"delete root", "DELETE", "/v1/files/", "", nil, 409, ""},
		{"health", "GET", "/v1/health", "", nil, 200, ""},
		{"metadata", "GET", "/v1/metadata", "", nil, 200, `{"env":{"SANDBOX_A":"a"}}` + "\n"},
		{"delete recursive", "DELETE", "/v1/files/dir?recursive=true", "", nil, 204, ""},
		{"deleted", "GET", "/v1/files/dir/a.txt", "", nil, 404, notFound},
		{"delete missing", "DELETE", "/v1/files/dir", "", nil, 404, notFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, base+tc.path, bytes.NewReader(tc.body))
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code || (tc.want != "" && string(b) != tc.want) {
				t.Errorf("%s %s = %d %q; want %d %q", tc.method, tc.path, resp.StatusCode, b, tc.code, tc.want)
			}
			switch tc.name {
			case "put raw":
				st, err := os.Stat(filepath.Join(data, "dir", "a.txt"))
				if err != nil || st.Mode().Perm() != 0o600 {
					t.Errorf("written file: %v %v", st, err)
				}
			case "listing":
				var l directoryListing
				if err := json.Unmarshal(b, &l); err != nil || l.Path != "/dir" || len(l.Entries) != 1 || l.Entries[0].Name != "a.txt" ||
					l.Entries[0].Type != "file" || l.Entries[0].Mode != "0600" || l.Entries[0].Size != 5 {
					t.Errorf("listing %s: %+v %v", b, l, err)
				}
			}
		})
	}
	t.Run("root listing omits escaping links", func(t *testing.T) {
		resp, err := http.Get(base + "/v1/files/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l directoryListing
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
			t.Fatal(err)
		}
		names := map[string]string{}
		for _, e := range l.Entries {
			names[e.Name] = e.Type
		}
		if _, ok := names["passwd"]; ok || names["m.bin"] != "file" || l.Path != "/" {
			t.Errorf("root listing %+v", l)
		}
		if _, ok := names["up"]; ok {
			t.Errorf("root listing shows the escaping link up: %+v", l)
		}
	})
}
