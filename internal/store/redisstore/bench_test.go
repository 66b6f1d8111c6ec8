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

// benchStore is one side of a comparison: the embedded store or Redis over loopback.
type benchStore struct {
	name string
	s    store.Store
}

// benchStores opens the two stores every benchmark here compares in the same run.
func benchStores(b *testing.B) []benchStore {
	srv := redisserver.Start(b)
	emb, err := embedded.Open(embedded.Options{Dir: b.TempDir(), SweepEvery: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = emb.Close() })
	return []benchStore{{"embedded", emb}, {"redis", open(b, srv, Options{})}}
}

// BenchmarkHotCalls measures the store calls an intercepted request makes, on the embedded store
// and on Redis over loopback in the same run: reading the previous response, reading and
// touching its container, storing the new response; "request" is the four in a row. Besides
// ns/op (the mean) it reports the median and the 99th percentile of single calls.
func BenchmarkHotCalls(b *testing.B) {
	ctx := context.Background()
	impls := benchStores(b)

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
				reportPercentiles(b, lat)
			})
		}
	}
}

// BenchmarkFileStream stores a 64 MiB file and reads it back, on the embedded store and on Redis
// (1 MiB chunks) in the same run; MB/s counts the bytes each way once.
func BenchmarkFileStream(b *testing.B) {
	ctx := context.Background()
	const size = 64 << 20
	for _, impl := range benchStores(b) {
		for _, way := range []string{"upload", "download"} {
			b.Run(impl.name+"/"+way, func(b *testing.B) {
				b.SetBytes(size)
				var f store.File
				if way == "download" {
					var err error
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

// BenchmarkQuotaCalls measures what the container quotas add to a container create, on the
// embedded store and on Redis over loopback in the same run: reserving the owner's place (and a
// shared one), taking a token of the owner's creation bucket, and "admit", the two in a row as
// Sessions.Create makes them when both quotas are set. Eight owners hold 16 places each, 128
// shared (the default max_containers): every reservation is followed by a CancelPlace of the one
// made 128 reservations before, which ns/op includes and the percentiles (of the reservation and
// the take only) do not.
func BenchmarkQuotaCalls(b *testing.B) {
	ctx := context.Background()
	ids := store.NewIDGenerator(time.Now)
	const owners, held = 8, 128
	for _, impl := range benchStores(b) {
		s := impl.s
		owner := func(i int) string { return fmt.Sprintf("bench-%d", i%owners) }
		var ring [held]string
		reserve := func(i int) error {
			id := ids.New(store.ContainerKind)
			p, err := s.ReservePlace(ctx, store.PlaceRequest{Owner: owner(i), ID: id, Shared: true,
				MaxPerOwner: 32, MaxShared: 2 * held, TTL: 3 * time.Minute})
			if err == nil && p.Refused != "" {
				err = fmt.Errorf("refused: %+v", p)
			}
			ring[i%held] = id
			return err
		}
		cancel := func(i int) error {
			if old := ring[(i+1)%held]; old != "" {
				return s.CancelPlace(ctx, owner(i+1), old)
			}
			return nil
		}
		take := func(i int) error {
			ok, _, err := s.TakeToken(ctx, "container_creates:"+owner(i), store.Bucket{PerMinute: 1 << 30, Burst: 1 << 20})
			if err == nil && !ok {
				err = fmt.Errorf("no token")
			}
			return err
		}
		for _, op := range []struct {
			name   string
			call   func(i int) error
			places bool
		}{
			{"ReservePlace", reserve, true},
			{"TakeToken", take, false},
			{"admit", func(i int) error {
				if err := reserve(i); err != nil {
					return err
				}
				return take(i)
			}, true},
		} {
			b.Run(impl.name+"/"+op.name, func(b *testing.B) {
				lat := make([]time.Duration, 0, b.N)
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					if op.places {
						if err := cancel(i); err != nil {
							b.Fatal(err)
						}
					}
					start := time.Now()
					if err := op.call(i); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(start))
				}
				reportPercentiles(b, lat)
			})
		}
		for i := range held { // leave the store as it was for the next run
			_ = s.CancelPlace(ctx, owner(i), ring[i])
		}
	}
}

// reportPercentiles reports the median and the 99th percentile of lat, in µs.
func reportPercentiles(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}
