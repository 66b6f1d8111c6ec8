package backends

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
)

// placeSize is the file of the placement benchmarks.
const placeSize = 10 << 20

// BenchmarkPlaceFile10MB measures what the code_interpreter tool's container.file_ids costs per
// file: a 10 MB Files API file placed into a new container (Container.PlaceFiles: the store's
// bytes into the sandbox's /mnt/data, and the record), per backend; the container's creation is
// not timed. "download" is reading it back as the Containers API does (Sessions.ReadFile).
func BenchmarkPlaceFile10MB(b *testing.B) {
	for _, backend := range backendsUnderTest {
		b.Run(backend+"/place", func(b *testing.B) { benchPlace(b, backend, false) })
		b.Run(backend+"/download", func(b *testing.B) { benchPlace(b, backend, true) })
	}
}

func benchPlace(b *testing.B, backend string, download bool) {
	p := newSessions(b, b.TempDir(), toolRegistry(b, backend))
	ctx := context.Background()
	data := make([]byte, placeSize)
	_, _ = rand.Read(data)
	f, err := store.CreateFile(ctx, p.st, store.File{Owner: "alice", Filename: "big.bin", Purpose: "user_data"}, bytes.NewReader(data), store.FileLimits{})
	if err != nil {
		b.Fatal(err)
	}
	lim := containers.ContainerLimits{FileBytes: 2 * placeSize}
	b.SetBytes(placeSize)
	b.ResetTimer() // the setup above is not the placement
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		c, err := p.Create(ctx, "cloud", "alice", sandbox.CreateOptions{}, 20*time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if download {
			recs, err := c.PlaceFiles(ctx, []string{f.ID}, lim)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			_, n, err := p.ReadFile(ctx, "alice", c.ID(), recs[0].ID, io.Discard, 2*placeSize)
			b.StopTimer()
			if err != nil || n != placeSize {
				b.Fatalf("ReadFile = %d, %v", n, err)
			}
		} else {
			b.StartTimer()
			recs, err := c.PlaceFiles(ctx, []string{f.ID}, lim)
			b.StopTimer()
			if err != nil || len(recs) != 1 || recs[0].Bytes != placeSize {
				b.Fatalf("PlaceFiles = %v, %v", recs, err)
			}
		}
		p.Discard(ctx, c)
	}
}

// BenchmarkPlaceFile10MBDirect is the floor to compare with: the same 10 MB copied from the
// store's bytes into a file in a fresh directory, and read back, on the same host.
func BenchmarkPlaceFile10MBDirect(b *testing.B) {
	data := make([]byte, placeSize)
	_, _ = rand.Read(data)
	st, err := embedded.Open(embedded.Options{Dir: b.TempDir(), SweepEvery: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	f, err := store.CreateFile(ctx, st, store.File{Owner: "alice", Filename: "big.bin", Purpose: "user_data"}, bytes.NewReader(data), store.FileLimits{})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(placeSize)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			dst := filepath.Join(b.TempDir(), "big.bin")
			_, rc, err := st.OpenFile(ctx, "alice", f.ID)
			if err != nil {
				b.Fatal(err)
			}
			w, err := os.Create(dst)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(w, rc); err != nil {
				b.Fatal(err)
			}
			_ = rc.Close()
			if err := w.Close(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read", func(b *testing.B) {
		dst := filepath.Join(b.TempDir(), "big.bin")
		if err := os.WriteFile(dst, data, 0o600); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(placeSize)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			r, err := os.Open(dst)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, r); err != nil {
				b.Fatal(err)
			}
			_ = r.Close()
		}
	})
}
