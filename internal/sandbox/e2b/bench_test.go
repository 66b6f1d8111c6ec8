package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2b"
)

// The two benchmarks run the same cell in the same local kernel, once through the e2b client and
// the emulator (HTTP, NDJSON re-encoding and decoding) and once by calling the local provider
// directly. The difference is the e2b path's overhead per execution.

const benchCode = "1+1"

func BenchmarkRunViaEmulator(b *testing.B) {
	_, srv := newEnv(b)
	p := provider(b, srv)
	h := create(b, p)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r, err := p.Run(ctx, h, benchCode, sandbox.RunOptions{})
		if err != nil || len(r.Results) != 1 {
			b.Fatalf("Run = %+v, %v", r, err)
		}
	}
}

func BenchmarkRunDirect(b *testing.B) {
	ctx := context.Background()
	execProvider := sandboxes.Provider(b)
	h, err := execProvider.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = execProvider.Delete(context.Background(), h) })
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r, err := execProvider.Run(ctx, h, benchCode, sandbox.RunOptions{})
		if err != nil || len(r.Results) != 1 {
			b.Fatalf("Run = %+v, %v", r, err)
		}
	}
}

// A 10 MB file into an e2b container and back, through the e2b client and the emulator (multipart
// upload, Move; Stat, download), against the same bytes copied directly into and out of a file.
// The emulator moves a file through its kernel in 2 MiB base64 cells, so these figures measure the
// client plus the emulator, not e2b's service.

const benchFileSize = 10 << 20

func benchData() []byte {
	data := make([]byte, benchFileSize)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	return data
}

func BenchmarkWriteFile10MBViaEmulator(b *testing.B) {
	_, srv := newEnv(b)
	p := provider(b, srv)
	h := create(b, p)
	data := benchData()
	ctx := context.Background()
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for b.Loop() {
		if err := p.WriteFile(ctx, h, "bench.bin", bytes.NewReader(data), benchFileSize); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadFile10MBViaEmulator(b *testing.B) {
	_, srv := newEnv(b)
	p := provider(b, srv)
	h := create(b, p)
	ctx := context.Background()
	if err := p.WriteFile(ctx, h, "bench.bin", bytes.NewReader(benchData()), benchFileSize); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for b.Loop() {
		n, err := p.ReadFile(ctx, h, "bench.bin", io.Discard, benchFileSize)
		if err != nil || n != benchFileSize {
			b.Fatalf("ReadFile = %d, %v", n, err)
		}
	}
}

func BenchmarkWriteFile10MBDirect(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench.bin")
	data := benchData()
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for b.Loop() {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadFile10MBDirect(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench.bin")
	if err := os.WriteFile(path, benchData(), 0o600); err != nil {
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

// memoryEnvd serves the envd routes the client uses from memory, so that the client's own cost
// (multipart encoding, HTTP on loopback, the checks) is measured without the emulator's kernel.
func memoryEnvd(b *testing.B) *e2b.Provider {
	b.Helper()
	var mu sync.Mutex
	files := map[string][]byte{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/files":
			p := r.URL.Query().Get("path")
			if r.Method == http.MethodGet {
				mu.Lock()
				data := files[p]
				mu.Unlock()
				w.Header().Set("Content-Length", strconv.Itoa(len(data)))
				_, _ = w.Write(data)
				return
			}
			mr, _ := r.MultipartReader()
			part, _ := mr.NextPart()
			data, _ := io.ReadAll(part)
			mu.Lock()
			files[p] = data
			mu.Unlock()
			fmt.Fprintf(w, `[{"path":%q,"name":"x","type":"file"}]`, p)
		case "/filesystem.Filesystem/Move":
			var m struct{ Source, Destination string }
			_ = json.NewDecoder(r.Body).Decode(&m)
			mu.Lock()
			files[m.Destination] = files[m.Source]
			delete(files, m.Source)
			mu.Unlock()
			fmt.Fprint(w, `{"entry":{}}`)
		case "/filesystem.Filesystem/Stat":
			var m struct{ Path string }
			_ = json.NewDecoder(r.Body).Decode(&m)
			mu.Lock()
			data, ok := files[m.Path]
			mu.Unlock()
			if !ok {
				fmt.Fprintf(w, `{"entry":{"type":"FILE_TYPE_DIRECTORY","path":%q,"permissions":"drwxr-xr-x"}}`, m.Path)
				return
			}
			fmt.Fprintf(w, `{"entry":{"type":"FILE_TYPE_FILE","path":%q,"size":"%d","permissions":"-rw-r--r--"}}`, m.Path, len(data))
		}
	}))
	b.Cleanup(srv.Close)
	p, err := e2b.New(e2b.Options{APIKey: "e2b_0", APIBase: srv.URL, SandboxURL: srv.URL})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

func BenchmarkWriteFile10MBClientOnly(b *testing.B) {
	p := memoryEnvd(b)
	data := benchData()
	h := sandbox.Handle{Backend: "e2b", ID: "isbx"}
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for b.Loop() {
		if err := p.WriteFile(context.Background(), h, "bench.bin", bytes.NewReader(data), benchFileSize); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadFile10MBClientOnly(b *testing.B) {
	p := memoryEnvd(b)
	h := sandbox.Handle{Backend: "e2b", ID: "isbx"}
	if err := p.WriteFile(context.Background(), h, "bench.bin", bytes.NewReader(benchData()), benchFileSize); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for b.Loop() {
		n, err := p.ReadFile(context.Background(), h, "bench.bin", io.Discard, benchFileSize)
		if err != nil || n != benchFileSize {
			b.Fatalf("ReadFile = %d, %v", n, err)
		}
	}
}

// BenchmarkExecViaEmulator is one shell command (echo) through envd's process service as the
// emulator serves it, beside BenchmarkRunViaEmulator's 1+1, and the time to its first output.
func BenchmarkExecViaEmulator(b *testing.B) {
	_, srv := newEnv(b)
	p := provider(b, srv)
	h := create(b, p)
	ctx := context.Background()
	b.ReportAllocs()
	var first time.Duration
	for b.Loop() {
		start := time.Now()
		var got time.Duration
		res, err := p.Exec(ctx, h, "echo hi", sandbox.ExecOptions{OnOutput: func(sandbox.Stream, string) {
			if got == 0 {
				got = time.Since(start)
			}
		}})
		if err != nil || res.ExitCode != 0 || got == 0 {
			b.Fatalf("Exec = %+v, %v", res, err)
		}
		first += got
	}
	b.ReportMetric(float64(first.Microseconds())/float64(b.N), "µs-to-first-output")
}
