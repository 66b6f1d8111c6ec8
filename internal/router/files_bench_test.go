package router

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/snapshot"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

// A 10 MB file through the Files API (multipart upload over a loopback socket, streamed into the
// embedded store: temporary file, fsync, rename, metadata; then GET .../content), against the same
// bytes copied directly to and from a file on the same disk with the same fsync.

const benchFileSize = 10 << 20

func benchFilesServer(b *testing.B) (*httptest.Server, []byte) {
	b.Helper()
	st, err := embedded.Open(embedded.Options{Dir: b.TempDir(), SweepEvery: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	cfg := testConfig("http://127.0.0.1:9/v1", func(c *config.Config) {
		c.General.MaxFileUploadSize = config.DefaultMaxFileUploadSize
	})
	srv := httptest.NewServer(New(Options{
		Store:    snapshot.Fixed(&snapshot.Snapshot{Config: cfg}),
		Client:   upstream.NewClient(upstream.ClientOptions{}),
		Balancer: upstream.NewBalancer(),
		Logger:   zap.NewNop(),
		Registry: prometheus.NewRegistry(),
		Files:    st,
	}))
	b.Cleanup(srv.Close)
	data := make([]byte, benchFileSize)
	_, _ = rand.Read(data)
	return srv, data
}

func benchUpload(b *testing.B, srv *httptest.Server, data []byte) string {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "user_data")
	fw, _ := mw.CreateFormFile("file", "bench.bin")
	_, _ = fw.Write(data)
	_ = mw.Close()
	resp, err := srv.Client().Post(srv.URL+"/v1/files", mw.FormDataContentType(), &body)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var f fileObject
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil || resp.StatusCode != http.StatusOK || f.Bytes != int64(len(data)) {
		b.Fatalf("upload = %d %+v, %v", resp.StatusCode, f, err)
	}
	return f.ID
}

func BenchmarkFilesAPIUpload10MB(b *testing.B) {
	srv, data := benchFilesServer(b)
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for b.Loop() {
		benchUpload(b, srv, data)
	}
}

func BenchmarkFilesAPIDownload10MB(b *testing.B) {
	srv, data := benchFilesServer(b)
	id := benchUpload(b, srv, data)
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for b.Loop() {
		resp, err := srv.Client().Get(srv.URL + "/v1/files/" + id + "/content")
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n != benchFileSize {
			b.Fatalf("downloaded %d bytes", n)
		}
	}
}

func BenchmarkDirectCopyWrite10MB(b *testing.B) {
	dir := b.TempDir()
	data := make([]byte, benchFileSize)
	_, _ = rand.Read(data)
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for b.Loop() {
		f, err := os.CreateTemp(dir, "copy-*")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(f, bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		_ = f.Close()
		if err := os.Rename(f.Name(), filepath.Join(dir, "copy")); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDirectCopyRead10MB(b *testing.B) {
	path := filepath.Join(b.TempDir(), "copy")
	data := make([]byte, benchFileSize)
	_, _ = rand.Read(data)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for b.Loop() {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, f)
		_ = f.Close()
		if n != benchFileSize {
			b.Fatalf("read %d bytes", n)
		}
	}
}
