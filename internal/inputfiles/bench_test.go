package inputfiles

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/store/storetest"
)

// ordinaryBody is a 4 KiB /v1/responses body of a few messages and a tool, none naming a file.
func ordinaryBody() []byte {
	var b strings.Builder
	b.WriteString(`{"model":"gpt-4.1","stream":true,"tools":[{"type":"function","name":"lookup","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}],"input":[`)
	for i := 0; b.Len() < 4000; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":[{"type":"input_text","text":"` + strings.Repeat("Tell me about the weather in Paris. ", 6) + `"}]}`)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// BenchmarkInline measures what the pass-through path adds to a request: an ordinary 4 KiB body
// (no file_id: one scan), the same body with one part naming an id the proxy does not hold (the
// walk and one lookup), and one naming a 100 KB image of the caller's (read and spliced in).
func BenchmarkInline(b *testing.B) {
	ctx := context.Background()
	ff := storetest.NewMemFiles()
	var files Store = ff // as the router holds it
	img := pngData + strings.Repeat("x", 100_000)
	ff.Add("k", "file-png", "photo.png", img, int64(len(img)))
	plain := ordinaryBody()
	withID := func(id string) []byte {
		s := string(plain)
		return []byte(s[:len(s)-2] + `,{"role":"user","content":[{"type":"input_image","file_id":"` + id + `"}]}]}`)
	}
	for _, bc := range []struct {
		name string
		body []byte
	}{
		{"4KiB_no_file_id", plain},
		{"4KiB_unknown_file_id", withID("file-nope")},
		{"4KiB_image_100KB", withID("file-png")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Inline(ctx, files, "k", bc.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkInlineLargeFile measures the upstream body of a request naming one 32 MiB file by
// file_id, produced to the end as the upstream reads it: the body with the file's data URL
// streamed from the store, a chunk at a time.
func BenchmarkInlineLargeFile(b *testing.B) {
	ctx := context.Background()
	ff := storetest.NewMemFiles()
	data := "%PDF-1.4\n" + strings.Repeat("x", 32<<20-9)
	ff.Add("k", "file-big", "big.pdf", data, int64(len(data)))
	body := []byte(`{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"file-big"}]}]}`)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		in, err := Inline(ctx, ff, "k", body)
		if err != nil || len(in.Streams) != 1 {
			b.Fatal(err)
		}
		rc, err := in.Streams[0].Open(ctx)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil || n != in.Streams[0].Size {
			b.Fatal(n, err)
		}
	}
}
