package redisstore

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
	"github.com/ciproxy/ciproxy/internal/testutil/redisserver"
)

// BenchmarkHotCalls measures the store calls an intercepted request makes, on the embedded store
// and on Redis over loopback in the same run: reading the previous response, reading and
// touching its container, storing the new response; "request" is the four in a row. Besides
// ns/op (the mean) it reports the median and the 99th percentile of single calls.
func BenchmarkHotCalls(b *testing.B) {
	ctx := context.Background()
	srv := redisserver.Start(b)
	emb, err := embedded.Open(embedded.Options{Dir: b.TempDir(), SweepEvery: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = emb.Close() })
	impls := []struct {
		name string
		s    store.Store
	}{{"embedded", emb}, {"redis", open(b, srv, Options{})}}

	// A response of the size a short code-interpreter turn has.
	body, _ := json.Marshal(map[string]any{"id": "resp_prev", "object": "response", "status": "completed",
		"output": []map[string]any{{"type": "message", "content": []map[string]any{{"type": "output_text", "text": strings.Repeat("lorem ipsum ", 150)}}}}})
	input := json.RawMessage(`[{"type":"message","role":"user","content":"` + strings.Repeat("x", 800) + `"}]`)
	pending := []json.RawMessage{json.RawMessage(`{"type":"function_call_output","call_id":"call_1","output":"42\n"}`)}

	for _, impl := range impls {
		s := impl.s
		now := time.Now()
		c, err := s.CreateContainer(ctx, store.Container{Owner: "bench", Backend: "local", Tool: "local", Handle: []byte(`{"id":"sbx_1"}`),
			Status: "running", IdleTimeout: 20 * time.Minute, LastActiveAt: now, ExpiresAt: now.Add(20 * time.Minute), ForgetAt: now.Add(24 * time.Hour)})
		if err != nil {
			b.Fatal(err)
		}
		prev := store.Response{ID: "resp_prev", Owner: "bench", UpstreamID: "resp_up", ContainerID: c.ID, Pending: pending, Body: body, Input: input,
			ExpiresAt: now.Add(30 * 24 * time.Hour)}
		calls := []store.Call{{ID: "ci_prev", Owner: "bench", CallID: "call_1", Code: "print(6*7)", Output: "42\n", ExpiresAt: prev.ExpiresAt}}
		if err := s.PutResponse(ctx, prev, calls); err != nil {
			b.Fatal(err)
		}
		cur := c
		put := func(i int) error {
			r := prev
			r.ID = fmt.Sprintf("resp_bench%d", i%1000)
			cs := slices.Clone(calls)
			cs[0].ID = fmt.Sprintf("ci_bench%d", i%1000)
			return s.PutResponse(ctx, r, cs)
		}
		get := func(int) error { _, err := s.Response(ctx, prev.ID); return err }
		read := func(int) error { _, err := s.Container(ctx, "bench", c.ID); return err }
		touch := func(int) error {
			t := time.Now()
			cur.LastActiveAt, cur.ExpiresAt = t, t.Add(20*time.Minute)
			var err error
			cur, err = s.UpdateContainer(ctx, cur)
			return err
		}
		ops := []struct {
			name string
			call func(i int) error
		}{
			{"Response", get},
			{"Container", read},
			{"UpdateContainer", touch},
			{"PutResponse", put},
			{"request", func(i int) error {
				for _, f := range []func(int) error{get, read, touch, put} {
					if err := f(i); err != nil {
						return err
					}
				}
				return nil
			}},
		}
		for _, op := range ops {
			b.Run(impl.name+"/"+op.name, func(b *testing.B) {
				lat := make([]time.Duration, 0, b.N)
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					start := time.Now()
					if err := op.call(i); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(start))
				}
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
			})
		}
	}
}

// BenchmarkFileStream stores a 64 MiB file and reads it back, on the embedded store and on Redis
// (1 MiB chunks) in the same run; MB/s counts the bytes each way once.
func BenchmarkFileStream(b *testing.B) {
	ctx := context.Background()
	srv := redisserver.Start(b)
	emb, err := embedded.Open(embedded.Options{Dir: b.TempDir(), SweepEvery: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = emb.Close() })
	const size = 64 << 20
	for _, impl := range []struct {
		name string
		s    store.Store
	}{{"embedded", emb}, {"redis", open(b, srv, Options{})}} {
		for _, way := range []string{"upload", "download"} {
			b.Run(impl.name+"/"+way, func(b *testing.B) {
				b.SetBytes(size)
				var f store.File
				if way == "download" {
					if f, err = store.CreateFile(ctx, impl.s, store.File{Owner: "bench", Filename: "f", Purpose: "user_data"}, &patternReader{left: size}, store.FileLimits{}); err != nil {
						b.Fatal(err)
					}
				}
				for b.Loop() {
					if way == "upload" {
						f, err := store.CreateFile(ctx, impl.s, store.File{Owner: "bench", Filename: "f", Purpose: "user_data"}, &patternReader{left: size}, store.FileLimits{})
						if err != nil {
							b.Fatal(err)
						}
						b.StopTimer()
						if _, err := impl.s.DeleteFile(ctx, "bench", f.ID); err != nil {
							b.Fatal(err)
						}
						b.StartTimer()
						continue
					}
					_, rc, err := impl.s.OpenFile(ctx, "bench", f.ID)
					if err != nil {
						b.Fatal(err)
					}
					if n, err := io.Copy(io.Discard, rc); err != nil || n != size {
						b.Fatalf("read %d bytes, %v", n, err)
					}
					_ = rc.Close()
				}
			})
		}
	}
}
