package router

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
	"github.com/ciproxy/ciproxy/internal/testutil"
)

// filesProxy is a router with the Files API over an embedded store in its own directory.
type filesProxy struct {
	*proxy
	dir   string
	store *embedded.Store
}

func newFilesProxy(t *testing.T, cfg *config.Config, dir string) *filesProxy {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	st, err := embedded.Open(embedded.Options{Dir: dir, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	p := newProxy(t, cfg, func(o *Options) { o.Files = st })
	return &filesProxy{proxy: p, dir: dir, store: st}
}

// filesConfig is a proxy configuration with small file limits; the model list is not used.
func filesConfig(mutate ...func(*config.Config)) *config.Config {
	return testConfig("http://127.0.0.1:9/v1", append([]func(*config.Config){func(c *config.Config) {
		c.General.MaxFileUploadSize = 4 << 20
		c.General.MaxFileStoragePerKey = 64 << 20
	}}, mutate...)...)
}

func client(p *filesProxy, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(p.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// nothingStored checks that no upload left anything: no file, no bytes counted, tmp/ empty.
func (p *filesProxy) nothingStored(t *testing.T, owner string) {
	t.Helper()
	testutil.Eventually(t, "tmp/ to be empty", func() bool {
		entries, err := os.ReadDir(filepath.Join(p.dir, "tmp"))
		return err == nil && len(entries) == 0
	})
	u, err := p.store.Usage(context.Background(), owner)
	if err != nil || u != (store.Usage{}) {
		t.Errorf("Usage(%q) = %+v, %v; want nothing stored", owner, u, err)
	}
	blobs, _ := os.ReadDir(filepath.Join(p.dir, "blobs"))
	records, _ := os.ReadDir(filepath.Join(p.dir, "files"))
	if len(blobs) != len(records) {
		t.Errorf("blobs/ holds %d files for %d records; a refused upload left bytes behind", len(blobs), len(records))
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func TestFilesWithOpenAIClient(t *testing.T) {
	p := newFilesProxy(t, filesConfig(withMasterKey), "")
	c := client(p, masterKey)
	ctx := context.Background()

	csv := []byte("region,sales\nnorth,10\nsouth,20\n")
	bin := randomBytes(3<<20 + 17) // larger than max_request_body_size (1 MiB): uploads are not bound by it
	type upload struct {
		name, purpose string
		data          []byte
	}
	uploads := []upload{
		{"sales.csv", "user_data", csv},
		{"model.bin", "assistants", bin},
		{"résumé 2026.txt", "user_data", []byte("naïve")},
		{"batch.jsonl", "batch", []byte(`{"custom_id":"1"}` + "\n")},
		{"eval.jsonl", "evals", []byte("{}\n")},
		{"img.png", "vision", []byte("\x89PNG")},
		{"train.jsonl", "fine-tune", []byte("{}\n")},
	}
	var created []*openai.FileObject
	for _, u := range uploads {
		f, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(bytes.NewReader(u.data), u.name, "application/octet-stream"), Purpose: openai.FilePurpose(u.purpose)})
		if err != nil {
			t.Fatalf("Files.New(%s) = %v", u.name, err)
		}
		if !regexp.MustCompile(`^file-[A-Za-z0-9]+$`).MatchString(f.ID) || f.Filename != u.name || string(f.Purpose) != u.purpose ||
			f.Bytes != int64(len(u.data)) || f.Status != "processed" || f.Object != "file" || time.Since(time.Unix(f.CreatedAt, 0)) > time.Minute {
			t.Errorf("Files.New(%s) = %s", u.name, f.RawJSON())
		}
		created = append(created, f)
	}
	if b := created[3]; b.ExpiresAt != b.CreatedAt+30*24*3600 {
		t.Errorf("a batch file expires at %d; want 30 days after %d", b.ExpiresAt, b.CreatedAt)
	}
	if !created[0].JSON.ExpiresAt.Valid() && created[0].JSON.ExpiresAt.Raw() != "null" {
		t.Errorf("expires_at of a file without expiry = %q; want null", created[0].JSON.ExpiresAt.Raw())
	}

	got, err := c.Files.Get(ctx, created[1].ID)
	if err != nil || got.ID != created[1].ID || got.Bytes != int64(len(bin)) || got.Filename != "model.bin" {
		t.Fatalf("Files.Get = %+v, %v", got, err)
	}
	for i, u := range uploads[:3] {
		resp, err := c.Files.Content(ctx, created[i].ID)
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(data, u.data) {
			t.Errorf("Files.Content(%s) = %d bytes, %v; want the %d bytes uploaded", u.name, len(data), err, len(u.data))
		}
	}

	// Auto-paging walks every page (two files per request) newest first.
	var listed []string
	iter := c.Files.ListAutoPaging(ctx, openai.FileListParams{Limit: openai.Int(2)})
	for iter.Next() {
		listed = append(listed, iter.Current().ID)
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := len(created) - 1; i >= 0; i-- {
		want = append(want, created[i].ID)
	}
	if !slices.Equal(listed, want) {
		t.Errorf("ListAutoPaging = %v; want %v", listed, want)
	}
	page, err := c.Files.List(ctx, openai.FileListParams{Purpose: openai.String("user_data"), Order: openai.FileListParamsOrderAsc})
	if err != nil {
		t.Fatal(err)
	}
	if ids := []string{page.Data[0].ID, page.Data[1].ID}; len(page.Data) != 2 || !slices.Equal(ids, []string{created[0].ID, created[2].ID}) || page.HasMore {
		t.Errorf("List(user_data, asc) = %s", page.RawJSON())
	}

	deleted, err := c.Files.Delete(ctx, created[0].ID)
	if err != nil || !deleted.Deleted || deleted.ID != created[0].ID || deleted.Object != "file" {
		t.Fatalf("Files.Delete = %+v, %v", deleted, err)
	}
	_, err = c.Files.Get(ctx, created[0].ID)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Param != "id" || apiErr.Message != "No such File object: "+created[0].ID {
		t.Errorf("Files.Get after delete = %v; want OpenAI's 404", err)
	}
	if _, err := c.Files.Delete(ctx, created[0].ID); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("Files.Delete twice = %v; want 404", err)
	}
}

// TestFileObjectShape checks the wire form: OpenAI's keys in OpenAI's order, on both path forms.
func TestFileObjectShape(t *testing.T) {
	p := newFilesProxy(t, filesConfig(), "")
	status, _, body := p.upload(t, "/files", "", form{{"purpose", "user_data", ""}, {"file", "a,b\n", "in.csv"}})
	if status != http.StatusOK {
		t.Fatalf("upload = %d %s", status, body)
	}
	shape := regexp.MustCompile(`^\{"object":"file","id":"(file-[A-Za-z0-9]{22})","purpose":"user_data","filename":"in.csv","bytes":4,"created_at":\d{10},"expires_at":null,"status":"processed","status_details":null\}\n$`)
	m := shape.FindStringSubmatch(string(body))
	if m == nil {
		t.Fatalf("file object = %s", body)
	}
	id := m[1]
	for _, prefix := range []string{"", "/v1"} {
		if status, _, b := p.do(t, "GET", prefix+"/files/"+id, ""); status != http.StatusOK || string(b) != string(body) {
			t.Errorf("GET %s/files/{id} = %d %s", prefix, status, b)
		}
		status, h, b := p.do(t, "GET", prefix+"/files/"+id+"/content", "")
		if status != http.StatusOK || string(b) != "a,b\n" || h.Get("Content-Type") != "application/octet-stream" ||
			h.Get("Content-Length") != "4" || h.Get("Content-Disposition") != `attachment; filename=in.csv` {
			t.Errorf("GET %s/files/{id}/content = %d %v %q", prefix, status, h, b)
		}
		status, _, b = p.do(t, "GET", prefix+"/files?limit=1", "")
		if want := `{"object":"list","data":[` + strings.TrimSuffix(string(body), "\n") + `],"first_id":"` + id + `","last_id":"` + id + `","has_more":false}` + "\n"; status != http.StatusOK || string(b) != want {
			t.Errorf("GET %s/files = %d %s; want %s", prefix, status, b, want)
		}
	}
	if status, _, b := p.do(t, "GET", "/v1/files?purpose=batch", ""); status != http.StatusOK || string(b) != `{"object":"list","data":[],"first_id":null,"last_id":null,"has_more":false}`+"\n" {
		t.Errorf("empty list = %d %s", status, b)
	}
	if status, _, b := p.do(t, "DELETE", "/files/"+id, ""); status != http.StatusOK || string(b) != `{"id":"`+id+`","object":"file","deleted":true}`+"\n" {
		t.Errorf("DELETE = %d %s", status, b)
	}
	// A name that needs RFC 2231 encoding in Content-Disposition, and an expiry asked for.
	status, _, body = p.upload(t, "/v1/files", "", form{{"file", "x", "données €.txt"}, {"purpose", "assistants", ""},
		{"expires_after[anchor]", "created_at", ""}, {"expires_after[seconds]", "3600", ""}})
	var f fileObject
	if err := json.Unmarshal(body, &f); status != http.StatusOK || err != nil || f.ExpiresAt == nil || *f.ExpiresAt != f.CreatedAt+3600 || f.Filename != "données €.txt" {
		t.Fatalf("upload with expires_after = %d %s", status, body)
	}
	if _, h, _ := p.do(t, "GET", "/v1/files/"+f.ID+"/content", ""); h.Get("Content-Disposition") != `attachment; filename*=utf-8''donn%C3%A9es%20%E2%82%AC.txt` {
		t.Errorf("Content-Disposition = %q", h.Get("Content-Disposition"))
	}
}

// TestFilesSurviveARestart: the store is reopened on the same directory behind a new router.
func TestFilesSurviveARestart(t *testing.T) {
	dir := t.TempDir()
	cfg := filesConfig(withMasterKey)
	p := newFilesProxy(t, cfg, dir)
	data := randomBytes(1 << 20)
	c := client(p, masterKey)
	f, err := c.Files.New(context.Background(), openai.FileNewParams{File: openai.File(bytes.NewReader(data), "data.bin", "application/octet-stream"), Purpose: openai.FilePurposeUserData})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if err := p.store.Close(); err != nil {
		t.Fatal(err)
	}

	p = newFilesProxy(t, cfg, dir)
	c = client(p, masterKey)
	got, err := c.Files.Get(context.Background(), f.ID)
	if err != nil || got.Filename != "data.bin" || got.Bytes != int64(len(data)) || got.CreatedAt != f.CreatedAt {
		t.Fatalf("after restart Files.Get = %+v, %v", got, err)
	}
	resp, err := c.Files.Content(context.Background(), f.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); !bytes.Equal(b, data) {
		t.Errorf("after restart the content differs (%d bytes)", len(b))
	}
}

// TestFilesBelongToTheirKey: without a master key every presented key is its own owner (with one,
// every client presents the same key and is one owner; per-client keys come with virtual keys).
func TestFilesBelongToTheirKey(t *testing.T) {
	p := newFilesProxy(t, filesConfig(), "")
	ctx := context.Background()
	alice, bob := client(p, "sk-alice"), client(p, "sk-bob")
	f, err := alice.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader("secret"), "secret.txt", "text/plain"), Purpose: openai.FilePurposeUserData})
	if err != nil {
		t.Fatal(err)
	}
	var apiErr *openai.Error
	want404 := func(what string, err error) {
		t.Helper()
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Message != "No such File object: "+f.ID || apiErr.Type != "invalid_request_error" {
			t.Errorf("%s = %v; want OpenAI's 404", what, err)
		}
	}
	_, err = bob.Files.Get(ctx, f.ID)
	want404("bob's Get", err)
	_, err = bob.Files.Content(ctx, f.ID)
	want404("bob's Content", err)
	_, err = bob.Files.Delete(ctx, f.ID)
	want404("bob's Delete", err)
	if page, err := bob.Files.List(ctx, openai.FileListParams{}); err != nil || len(page.Data) != 0 {
		t.Errorf("bob's List = %v, %v; want empty", page, err)
	}
	// No key at all is one more owner.
	if status, _, _ := p.do(t, "GET", "/v1/files/"+f.ID, ""); status != http.StatusNotFound {
		t.Errorf("GET without a key = %d; want 404", status)
	}
	if got, err := alice.Files.Get(ctx, f.ID); err != nil || got.ID != f.ID {
		t.Errorf("alice's Get after bob's attempts = %v, %v", got, err)
	}
}

// part is one form field: a file when filename is set.
type part struct{ name, value, filename string }

type form []part

// multipartBody encodes parts; a filename of "-" sends a file part without a filename.
func multipartBody(parts form) (string, string) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		switch p.filename {
		case "":
			h.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q`, p.name))
		case "-":
			h.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q`, p.name))
			h.Set("Content-Type", "application/octet-stream")
		default:
			// Written by hand: mime would escape or encode what the test means to send raw. A
			// filename starting with "*" is sent as filename*= (RFC 2231, already encoded).
			if enc, ok := strings.CutPrefix(p.filename, "*"); ok {
				h.Set("Content-Disposition", `form-data; name="`+p.name+`"; filename*=`+enc)
			} else {
				h.Set("Content-Disposition", `form-data; name="`+p.name+`"; filename="`+p.filename+`"`)
			}
			h.Set("Content-Type", "application/octet-stream")
		}
		pw, _ := w.CreatePart(h)
		_, _ = io.WriteString(pw, p.value)
	}
	_ = w.Close()
	return b.String(), w.FormDataContentType()
}

// upload posts a form with key as the bearer key ("" for none).
func (p *filesProxy) upload(t *testing.T, path, key string, parts form) (int, http.Header, []byte) {
	t.Helper()
	body, ct := multipartBody(parts)
	hdr := []string{"Content-Type", ct}
	if key != "" {
		hdr = append(hdr, "Authorization", "Bearer "+key)
	}
	return p.post(t, path, body, hdr...)
}

func (p *filesProxy) post(t *testing.T, path, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest("POST", p.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := p.Client().Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

func TestFileUploadRefusals(t *testing.T) {
	p := newFilesProxy(t, filesConfig(func(c *config.Config) {
		c.General.MaxFileUploadSize = 1000
		c.General.MaxFileStoragePerKey = 1500
	}), "")
	big := strings.Repeat("x", 1001)
	tests := []struct {
		name        string
		parts       form
		contentType string // overrides the multipart type
		wantStatus  int
		wantParam   string
		wantCode    string
		wantMsg     string
	}{
		{"not multipart", nil, "application/json", 400, "", "", "multipart/form-data"},
		{"multipart without boundary", nil, "multipart/form-data", 400, "", "", "multipart/form-data"},
		{"no file part", form{{"purpose", "user_data", ""}}, "", 400, "file", "", "Missing required parameter: 'file'."},
		{"a file field without a filename", form{{"file", "abc", "-"}, {"purpose", "user_data", ""}}, "", 400, "file", "invalid_filename", "the filename is empty"},
		{"no purpose", form{{"file", "abc", "a.txt"}}, "", 400, "purpose", "", "Missing required parameter: 'purpose'."},
		{"empty purpose", form{{"file", "abc", "a.txt"}, {"purpose", "", ""}}, "", 400, "purpose", "", "Missing required parameter: 'purpose'."},
		{"bad purpose after the file", form{{"file", "abc", "a.txt"}, {"purpose", "fun", ""}}, "", 400, "purpose", "invalid_value", "Invalid value for 'purpose': 'fun'. Supported values are: 'assistants', 'batch', 'fine-tune', 'vision', 'user_data' and 'evals'."},
		{"bad purpose before the file", form{{"purpose", "assistants_output", ""}, {"file", "abc", "a.txt"}}, "", 400, "purpose", "invalid_value", "'assistants_output'"},
		{"a purpose too long", form{{"purpose", strings.Repeat("p", 2000), ""}, {"file", "abc", "a.txt"}}, "", 400, "purpose", "", "too long"},
		{"two files", form{{"file", "a", "a.txt"}, {"file", "b", "b.txt"}, {"purpose", "user_data", ""}}, "", 400, "file", "", "Only one file"},
		{"filename dot dot", form{{"file", "a", ".."}, {"purpose", "user_data", ""}}, "", 400, "file", "invalid_filename", `"." or ".."`},
		{"filename of a directory", form{{"file", "a", "dir/"}, {"purpose", "user_data", ""}}, "", 400, "file", "invalid_filename", "empty"},
		{"filename with a raw control character", form{{"file", "a", "a\x01b.txt"}, {"purpose", "user_data", ""}}, "", 400, "", "", "malformed"},
		{"filename with an encoded control character", form{{"file", "a", "*utf-8''a%01b.txt"}, {"purpose", "user_data", ""}}, "", 400, "file", "invalid_filename", "control character"},
		{"filename with an encoded NUL", form{{"file", "a", "*utf-8''a%00b.txt"}, {"purpose", "user_data", ""}}, "", 400, "file", "invalid_filename", "control character"},
		{"filename with an encoded traversal", form{{"file", "a", "*utf-8''..%2F..%2F.."}, {"purpose", "user_data", ""}}, "", 400, "file", "invalid_filename", `"." or ".."`},
		{"filename with a bidi override", form{{"file", "a", "cod\u202Efdp.exe"}, {"purpose", "user_data", ""}}, "", 400, "file", "invalid_filename", "control character"},
		{"filename not UTF-8", form{{"file", "a", "a\xff.txt"}, {"purpose", "user_data", ""}}, "", 400, "file", "invalid_filename", "UTF-8"},
		{"filename too long", form{{"file", "a", strings.Repeat("n", 256)}, {"purpose", "user_data", ""}}, "", 400, "file", "invalid_filename", "255"},
		{"file too large", form{{"purpose", "user_data", ""}, {"file", big, "big.txt"}}, "", 413, "file", "file_too_large", "larger than the limit of 1000 bytes"},
		{"expiry without seconds", form{{"file", "a", "a.txt"}, {"purpose", "user_data", ""}, {"expires_after[anchor]", "created_at", ""}}, "", 400, "expires_after.seconds", "", "Missing required parameter"},
		{"expiry with another anchor", form{{"file", "a", "a.txt"}, {"purpose", "user_data", ""}, {"expires_after[anchor]", "last_active_at", ""}, {"expires_after[seconds]", "3600", ""}}, "", 400, "expires_after.anchor", "invalid_value", "created_at"},
		{"expiry too short", form{{"file", "a", "a.txt"}, {"purpose", "user_data", ""}, {"expires_after[anchor]", "created_at", ""}, {"expires_after[seconds]", "60", ""}}, "", 400, "expires_after.seconds", "invalid_value", "between 3600 and 2592000"},
		{"expiry not a number", form{{"file", "a", "a.txt"}, {"purpose", "user_data", ""}, {"expires_after[anchor]", "created_at", ""}, {"expires_after[seconds]", "soon", ""}}, "", 400, "expires_after.seconds", "invalid_value", "'soon'"},
		{"seconds without an anchor", form{{"file", "a", "a.txt"}, {"purpose", "user_data", ""}, {"expires_after[seconds]", "3600", ""}}, "", 400, "expires_after.anchor", "", "Missing required parameter"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body, ct := multipartBody(tc.parts)
			if tc.contentType != "" {
				ct = tc.contentType
			}
			status, _, b := p.post(t, "/v1/files", body, "Content-Type", ct)
			msg, typ, param, code := decodeError(t, b)
			if status != tc.wantStatus || param != tc.wantParam || code != tc.wantCode || typ != "invalid_request_error" || !strings.Contains(msg, tc.wantMsg) {
				t.Errorf("= %d %s; want %d param %q code %q message containing %q", status, b, tc.wantStatus, tc.wantParam, tc.wantCode, tc.wantMsg)
			}
			p.nothingStored(t, "")
		})
	}

	t.Run("a declared length over the limit is refused before reading", func(t *testing.T) {
		conn, err := net.Dial("tcp", p.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: %d\r\n\r\n", 10<<30)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if _, _, param, code := decodeError(t, b); resp.StatusCode != 413 || param != "file" || code != "file_too_large" {
			t.Errorf("= %d %s", resp.StatusCode, b)
		}
	})

	t.Run("over the quota", func(t *testing.T) {
		if status, _, b := p.upload(t, "/v1/files", "sk-q", form{{"purpose", "user_data", ""}, {"file", strings.Repeat("a", 900), "a.txt"}}); status != 200 {
			t.Fatalf("first upload = %d %s", status, b)
		}
		status, _, b := p.upload(t, "/v1/files", "sk-q", form{{"purpose", "user_data", ""}, {"file", strings.Repeat("b", 700), "b.txt"}})
		if _, _, param, code := decodeError(t, b); status != 400 || param != "file" || code != "storage_limit_exceeded" {
			t.Errorf("second upload = %d %s; want 400 storage_limit_exceeded", status, b)
		}
		// Another key has its own quota.
		if status, _, b := p.upload(t, "/v1/files", "sk-other", form{{"purpose", "user_data", ""}, {"file", strings.Repeat("c", 700), "c.txt"}}); status != 200 {
			t.Errorf("another key's upload = %d %s", status, b)
		}
		if u, _ := p.store.Usage(context.Background(), callerID("sk-q")); u != (store.Usage{Files: 1, Bytes: 900}) {
			t.Errorf("Usage = %+v", u)
		}
	})

	t.Run("a malformed body", func(t *testing.T) {
		body := "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\r\nabc" // no closing boundary
		status, _, b := p.post(t, "/v1/files", body, "Content-Type", "multipart/form-data; boundary=b")
		if msg, _, _, _ := decodeError(t, b); status != 400 || !strings.Contains(msg, "malformed") {
			t.Errorf("= %d %s", status, b)
		}
		p.nothingStored(t, "")
	})
}

func TestFileListRefusals(t *testing.T) {
	p := newFilesProxy(t, filesConfig(), "")
	tests := []struct {
		query, param, code string
	}{
		{"limit=0", "limit", "integer_below_min_value"},
		{"limit=-3", "limit", "integer_below_min_value"},
		{"limit=10001", "limit", "integer_above_max_value"},
		{"limit=ten", "limit", "invalid_value"},
		{"limit=", "limit", "invalid_value"},
		{"order=sideways", "order", "invalid_value"},
		{"after=nope", "after", "invalid_value"},
		{"after=" + url.QueryEscape("file-../../../etc/passwd"), "after", "invalid_value"},
		{"purpose=fun", "purpose", "invalid_value"},
	}
	for _, tc := range tests {
		t.Run(tc.query, func(t *testing.T) {
			status, _, b := p.do(t, "GET", "/v1/files?"+tc.query, "")
			if _, _, param, code := decodeError(t, b); status != 400 || param != tc.param || code != tc.code {
				t.Errorf("GET /v1/files?%s = %d %s; want 400 param %s code %s", tc.query, status, b, tc.param, tc.code)
			}
		})
	}
	for _, path := range []string{"/v1/files/nope", "/v1/files/file-0000000000000000000000", "/v1/files/%2e%2e", "/v1/files/nope/content"} {
		status, _, b := p.do(t, "GET", path, "")
		if msg, _, param, _ := decodeError(t, b); status != 404 || param != "id" || !strings.HasPrefix(msg, "No such File object: ") {
			t.Errorf("GET %s = %d %s", path, status, b)
		}
	}
	if status, _, _ := p.do(t, "PUT", "/v1/files/x", ""); status != http.StatusMethodNotAllowed {
		t.Errorf("PUT /v1/files/x = %d; want 405", status)
	}
}

// TestFileUploadCut: a client that goes away in the middle of its upload leaves nothing behind.
func TestFileUploadCut(t *testing.T) {
	p := newFilesProxy(t, filesConfig(), "")
	body, ct := multipartBody(form{{"purpose", "user_data", ""}, {"file", strings.Repeat("z", 1<<20), "cut.bin"}})
	conn, err := net.Dial("tcp", p.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", ct, len(body))
	if _, err := io.WriteString(conn, body[:len(body)/2]); err != nil {
		t.Fatal(err)
	}
	// The upload has reached the store's temporary area before the client leaves.
	testutil.Eventually(t, "the upload to be streaming into tmp/", func() bool {
		entries, _ := os.ReadDir(filepath.Join(p.dir, "tmp"))
		return len(entries) == 1
	})
	conn.Close()
	p.nothingStored(t, "")
	if l, _ := p.store.ListFiles(context.Background(), "", store.FileQuery{}); len(l.Items) != 0 {
		t.Errorf("a cut upload was listed: %+v", l.Items)
	}
}

// TestFileUploadStreams: the bytes reach the store while the client is still sending, so an upload
// is never held in memory whole.
func TestFileUploadStreams(t *testing.T) {
	p := newFilesProxy(t, filesConfig(func(c *config.Config) { c.General.MaxFileUploadSize = 64 << 20 }), "")
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	req, err := http.NewRequest("POST", p.URL+"/v1/files", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	done := make(chan *http.Response, 1)
	go func() {
		resp, err := p.Client().Do(req)
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	_ = mw.WriteField("purpose", "user_data")
	fw, _ := mw.CreateFormFile("file", "stream.bin")
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	for range 8 {
		_, _ = fw.Write(chunk)
	}
	tmpSize := func() int64 {
		entries, _ := os.ReadDir(filepath.Join(p.dir, "tmp"))
		var n int64
		for _, e := range entries {
			if info, err := e.Info(); err == nil {
				n += info.Size()
			}
		}
		return n
	}
	testutil.Eventually(t, "the first bytes to be in the store before the upload ends", func() bool { return tmpSize() >= 4<<20 })
	for range 24 {
		_, _ = fw.Write(chunk)
	}
	_ = mw.Close()
	_ = pw.Close()
	resp := <-done
	if resp == nil {
		t.FailNow()
	}
	defer resp.Body.Close()
	var f fileObject
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil || resp.StatusCode != 200 || f.Bytes != 32<<20 {
		t.Errorf("upload = %d %+v, %v", resp.StatusCode, f, err)
	}
}

// TestFileTooLargeWithOpenAIClient: the official client, still sending a file far over the limit,
// gets the 413 rather than a broken connection, and nothing is stored.
func TestFileTooLargeWithOpenAIClient(t *testing.T) {
	p := newFilesProxy(t, filesConfig(func(c *config.Config) { c.General.MaxFileUploadSize = 1 << 20 }), "")
	c := client(p, "sk-big")
	_, err := c.Files.New(context.Background(), openai.FileNewParams{File: openai.File(bytes.NewReader(make([]byte, 64<<20)), "huge.bin", "application/octet-stream"), Purpose: openai.FilePurposeUserData})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusRequestEntityTooLarge || apiErr.Code != "file_too_large" || apiErr.Param != "file" {
		t.Errorf("Files.New of 64 MiB under a 1 MiB limit = %v; want a 413 file_too_large", err)
	}
	p.nothingStored(t, callerID("sk-big"))
}
