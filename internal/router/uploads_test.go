package router

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/redis/go-redis/v9"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
	"github.com/ciproxy/ciproxy/internal/store/redisstore"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/redisserver"
)

// uploadStore is a real store for the Files API under test, with what its uploads hold now:
// the bytes of files and uploads on disk, or in Redis, and how many uploads are in flight.
type uploadStore struct {
	files    store.Files
	held     func() int64
	inFlight func() int
}

// uploadStores are the two stores uploads go to.
var uploadStores = []struct {
	name string
	open func(t *testing.T) uploadStore
}{
	{"embedded", func(t *testing.T) uploadStore {
		dir := t.TempDir()
		st, err := embedded.Open(embedded.Options{Dir: dir, SweepEvery: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return uploadStore{files: st, inFlight: func() int {
			entries, _ := os.ReadDir(filepath.Join(dir, "tmp"))
			return len(entries)
		}, held: func() int64 {
			var n int64
			for _, sub := range []string{"tmp", "blobs"} {
				_ = filepath.WalkDir(filepath.Join(dir, sub), func(_ string, d fs.DirEntry, err error) error {
					if err == nil && d.Type().IsRegular() {
						if info, err := d.Info(); err == nil {
							n += info.Size()
						}
					}
					return nil
				})
			}
			return n
		}}
	}},
	{"redis", func(t *testing.T) uploadStore {
		srv := redisserver.Start(t)
		// Small chunks: an upload reaches Redis in many steps, each one reserved.
		st, err := redisstore.Open(context.Background(), redisstore.Options{Addr: srv.Addr(), Prefix: "u:", ChunkSize: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		sum := redis.NewScript(`
local n = 0
for _, pattern in ipairs({'u:upload:*', 'u:blob:*'}) do
  for _, k in ipairs(redis.call('KEYS', pattern)) do
    for _, v in ipairs(redis.call('HVALS', k)) do n = n + #v end
  end
end
return n`)
		return uploadStore{files: st, inFlight: func() int {
			return int(rdb.ZCard(context.Background(), "u:uploads").Val())
		}, held: func() int64 {
			n, err := sum.Run(context.Background(), rdb, nil).Int64()
			if err != nil {
				t.Error(err)
			}
			return n
		}}
	}},
}

// heldUpload is an upload whose client sends the form's purpose, then n bytes of its file, and
// then nothing more until cut: an upload held open before its last boundary.
type heldUpload struct {
	pw   *io.PipeWriter
	done chan heldResult
}

type heldResult struct {
	status int
	body   []byte
	err    error
}

func holdUpload(t *testing.T, url, key string, n int) *heldUpload {
	t.Helper()
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	req, err := http.NewRequest("POST", url+"/v1/files", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Authorization", "Bearer "+key)
	h := &heldUpload{pw: pw, done: make(chan heldResult, 1)}
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			h.done <- heldResult{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		h.done <- heldResult{status: resp.StatusCode, body: b, err: err}
	}()
	go func() {
		_ = mw.WriteField("purpose", "user_data")
		fw, _ := mw.CreateFormFile("file", "held.bin")
		// No line break in the bytes: the server's multipart reader can tell that none of them
		// begins the boundary, and passes every one on at once.
		_, _ = io.Copy(fw, io.LimitReader(repeatReader('a'), int64(n)))
	}()
	t.Cleanup(h.cut)
	return h
}

// cut ends the client's body in the middle of the file: the upload can only fail.
func (h *heldUpload) cut() { _ = h.pw.CloseWithError(io.ErrUnexpectedEOF) }

// refused waits for the upload's answer and checks that it is the OpenAI-shaped error given.
func (h *heldUpload) refused(t *testing.T, status int, code, mentions string) {
	t.Helper()
	select {
	case r := <-h.done:
		if r.err != nil {
			t.Fatalf("the upload failed with %v; want a %d", r.err, status)
		}
		msg, _, _, gotCode := decodeError(t, r.body)
		if r.status != status || gotCode != code || !strings.Contains(msg, mentions) {
			t.Errorf("the upload got %d %s; want %d %s mentioning %q", r.status, r.body, status, code, mentions)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no answer to an upload that must be refused (want %d %s)", status, code)
	}
}

type repeatReader byte

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}

// peak records the most a store has held, sampled until end (or the test's end).
type peak struct {
	mu   sync.Mutex
	max  int64
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func watchPeak(t *testing.T, held func() int64) *peak {
	p := &peak{stop: make(chan struct{})}
	t.Cleanup(func() { p.end() })
	p.wg.Go(func() {
		for {
			n := held()
			p.mu.Lock()
			p.max = max(p.max, n)
			p.mu.Unlock()
			select {
			case <-p.stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	})
	return p
}

func (p *peak) end() int64 {
	p.once.Do(func() { close(p.stop) })
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.max
}

// TestUploadsInFlightHoldTheQuota: uploads held open before their last boundary count against
// the key's storage quota as their bytes arrive, on disk and in Redis: at no moment do the key's
// files and uploads hold more than max_file_storage_per_key; the upload past it gets OpenAI's
// 400 storage_limit_exceeded; and an upload cut gives its bytes back.
func TestUploadsInFlightHoldTheQuota(t *testing.T) {
	const quota, each = 4 << 20, 1536 << 10 // two uploads fit, a third does not
	for _, st := range uploadStores {
		t.Run(st.name, func(t *testing.T) {
			us := st.open(t)
			cfg := filesConfig(func(c *config.Config) { c.General.MaxFileStoragePerKey = quota })
			p := newProxy(t, cfg, func(o *Options) { o.Files = us.files })
			watch := watchPeak(t, us.held)
			var held []*heldUpload
			for i := range 2 {
				held = append(held, holdUpload(t, p.URL, "sk-one", each))
				testutil.Eventually(t, fmt.Sprintf("upload %d's bytes to be stored", i+1), func() bool { return us.held() == int64(i+1)*each })
			}
			for range 6 {
				holdUpload(t, p.URL, "sk-one", each).refused(t, http.StatusBadRequest, "storage_limit_exceeded", "limit of 4194304 bytes")
			}
			if most := watch.end(); most > quota {
				t.Errorf("the store held %d bytes at one moment; the key's quota is %d", most, quota)
			}
			for _, h := range held {
				h.cut()
				<-h.done
			}
			testutil.Eventually(t, "the cut uploads' bytes to go", func() bool { return us.held() == 0 })
			owner := callerID("sk-one")
			if u, err := us.files.Usage(context.Background(), owner); err != nil || u != (store.Usage{}) {
				t.Errorf("Usage = %+v, %v; want nothing stored", u, err)
			}
			// What the cut uploads held is free again: the whole quota in one file.
			status, _, body := (&filesProxy{proxy: p}).upload(t, "/v1/files", "sk-one", form{{"purpose", "user_data", ""}, {"file", strings.Repeat("q", quota), "whole.bin"}})
			if status != http.StatusOK {
				t.Errorf("an upload of the whole quota after the cut ones = %d %s", status, body)
			}
		})
	}
}

// TestUploadsInFlightCaps: a key has at most max_concurrent_uploads_per_key uploads in flight,
// and every key's uploads in flight hold at most max_upload_bytes_in_flight bytes; past either,
// 429 rate_limit_exceeded naming it, and nothing stored.
func TestUploadsInFlightCaps(t *testing.T) {
	type hold struct {
		key   string
		bytes int
	}
	tests := []struct {
		name     string
		cfg      func(*config.Config)
		held     []hold
		probe    hold
		mentions string
	}{
		{"uploads per key", func(c *config.Config) { c.General.MaxConcurrentUploadsPerKey = 2 },
			[]hold{{"sk-one", 1}, {"sk-one", 1}, {"sk-two", 1}}, hold{"sk-one", 1}, "max_concurrent_uploads_per_key"},
		{"bytes in flight", func(c *config.Config) { c.General.MaxUploadBytesInFlight = 2 << 20 },
			[]hold{{"sk-one", 1536 << 10}}, hold{"sk-two", 1 << 20}, "max_upload_bytes_in_flight"},
	}
	for _, st := range uploadStores {
		for _, tc := range tests {
			t.Run(st.name+"/"+tc.name, func(t *testing.T) {
				us := st.open(t)
				p := newProxy(t, filesConfig(tc.cfg), func(o *Options) { o.Files = us.files })
				var stored int64
				for i, h := range tc.held {
					holdUpload(t, p.URL, h.key, h.bytes)
					// Whole chunks reach Redis; the rest waits in the proxy's memory.
					stored += int64(h.bytes) / (64 << 10) * (64 << 10)
					testutil.Eventually(t, "the held uploads to be in flight", func() bool { return us.inFlight() == i+1 && us.held() >= stored })
				}
				probe := holdUpload(t, p.URL, tc.probe.key, tc.probe.bytes)
				probe.refused(t, http.StatusTooManyRequests, "rate_limit_exceeded", tc.mentions)
				if u, err := us.files.Usage(context.Background(), callerID(tc.probe.key)); err != nil || u != (store.Usage{}) {
					t.Errorf("Usage = %+v, %v; want nothing stored", u, err)
				}
			})
		}
	}
}

// TestUploadTimeout: a client that keeps every read far inside the per-read deadline, a few
// bytes at a time, cannot make its upload last past upload_timeout: it gets a 408 and nothing is
// stored, for a Files API upload and a container file upload alike.
func TestUploadTimeout(t *testing.T) {
	const total = 500 * time.Millisecond
	withTimeout := func(c *config.Config) { c.General.UploadTimeout = total }
	t.Run("files", func(t *testing.T) {
		p := newFilesProxy(t, filesConfig(withTimeout), "")
		checkUploadTimeout(t, trickle(t, p.Listener.Addr().String(), "/v1/files", form{{"purpose", "user_data", ""}, {"file", strings.Repeat("t", 1<<10), "slow.bin"}}), total)
		p.nothingStored(t, "")
	})
	t.Run("container files", func(t *testing.T) {
		p := newContainerBackend(t, "e2b").start(t, containersConfig(withTimeout), t.TempDir(), storetest.NewClock())
		cl := p.client("")
		made, err := cl.Containers.New(context.Background(), openai.ContainerNewParams{Name: "slow"})
		if err != nil {
			t.Fatal(err)
		}
		checkUploadTimeout(t, trickle(t, p.Listener.Addr().String(), "/v1/containers/"+made.ID+"/files", form{{"file", strings.Repeat("t", 1<<10), "slow.bin"}}), total)
		if l, err := p.sess.Files(context.Background(), "", made.ID, store.ContainerFileQuery{}); err != nil || len(l.Items) != 0 {
			t.Errorf("files after a timed-out upload = %+v, %v; want none", l.Items, err)
		}
	})
}

// trickle posts parts to path on addr 16 bytes every 100 ms (a body of about a kilobyte then
// takes 8 s), and returns the raw answer, whenever it comes.
func trickle(t *testing.T, addr, path string, parts form) []byte {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body, ct := multipartBody(parts)
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", path, ct, len(body))
	answer := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(conn)
		answer <- b
	}()
	for sent := 0; sent < len(body); {
		select {
		case b := <-answer:
			return b
		case <-time.After(100 * time.Millisecond):
		}
		n := min(16, len(body)-sent)
		if _, err := io.WriteString(conn, body[sent:sent+n]); err != nil {
			break
		}
		sent += n
	}
	return <-answer
}

// checkUploadTimeout checks that the raw HTTP answer is the 408 of upload_timeout.
func checkUploadTimeout(t *testing.T, raw []byte, total time.Duration) {
	t.Helper()
	head, body, _ := strings.Cut(string(raw), "\r\n\r\n")
	if !strings.HasPrefix(head, "HTTP/1.1 408 ") {
		t.Fatalf("a trickled upload got %q; want a 408", head)
	}
	msg, typ, _, _ := decodeError(t, []byte(body))
	if typ != "invalid_request_error" || !strings.Contains(msg, total.String()) {
		t.Errorf("408 body %s; want invalid_request_error naming the limit %s", body, total)
	}
}
