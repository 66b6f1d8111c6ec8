package router

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
)

// heldUpstream is a Responses (and Chat Completions) upstream that reads each request body to
// the end without keeping it. The first hold requests that name a file (over 200 bytes) report
// their length on arrived and are answered once gate is closed, so they are in flight at the
// proxy together; every other request is answered at once.
type heldUpstream struct {
	*httptest.Server
	arrived chan int64
	gate    chan struct{}
	mu      sync.Mutex
	hold    int
}

func newHeldUpstream(t *testing.T, hold int) *heldUpstream {
	t.Helper()
	u := &heldUpstream{arrived: make(chan int64, 16), gate: make(chan struct{}), hold: hold}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		held := n > 200 && u.hold > 0
		if held {
			u.hold--
		}
		u.mu.Unlock()
		if held {
			u.arrived <- n
			<-u.gate
		}
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/chat/completions") {
			_, _ = io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
			return
		}
		_, _ = io.WriteString(w, `{"id":"resp_up","object":"response","status":"completed","output":[]}`)
	}))
	t.Cleanup(func() {
		u.release()
		u.Close()
	})
	return u
}

// release answers every request held, and every later one at once.
func (u *heldUpstream) release() {
	select {
	case <-u.gate:
	default:
		close(u.gate)
	}
}

// inlineProxy is the router, with the embedded Files store, in front of up; with engine, the
// interception engine too, which serves every /v1/responses request for a Chat Completions
// upstream.
func inlineProxy(t *testing.T, up *heldUpstream, engine bool, mutate ...func(*config.Config)) *filesProxy {
	t.Helper()
	st, err := embedded.Open(embedded.Options{Dir: t.TempDir(), SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	cfg := testConfig(up.URL+"/v1", append([]func(*config.Config){func(c *config.Config) {
		c.General.MaxFileUploadSize = 64 << 20
		c.General.MaxFileStoragePerKey = 256 << 20
	}}, mutate...)...)
	p := newProxy(t, cfg, func(o *Options) {
		o.Files = st
		if engine {
			o.Interceptor = intercept.New(intercept.Options{Files: st, Store: st})
		}
	})
	t.Cleanup(up.release) // before the proxy closes, which waits for the requests held
	return &filesProxy{proxy: p, store: st}
}

// uploadPDF uploads size bytes of a PDF as key's and returns its id.
func (p *filesProxy) uploadPDF(t *testing.T, key string, size int) string {
	t.Helper()
	data := "%PDF-1.4\n" + strings.Repeat("x", size-9)
	c := client(p, key)
	f, err := c.Files.New(context.Background(), openai.FileNewParams{
		File: openai.File(strings.NewReader(data), "doc.pdf", "application/pdf"), Purpose: openai.FilePurposeUserData})
	if err != nil {
		t.Fatal(err)
	}
	return f.ID
}

// inlineBody is a small pass-through request naming the file id n times.
func inlineBody(id string, n int) string {
	parts := strings.TrimSuffix(strings.Repeat(`{"type":"input_file","file_id":"`+id+`"},`, n), ",")
	return `{"model":"gpt-test","input":[{"role":"user","content":[{"type":"input_text","text":"read it"},` + parts + `]}]}`
}

// holdAliceAndBob stores a PDF of size bytes for each of sk-alice, sk-bob and sk-carol, then
// holds one inlining request of alice's and one of bob's at up, so that a quota sized for two is
// full. It returns the files by key, post (a /v1/responses request as key), and release, which
// answers the held requests and waits until they have ended with a 200.
func (p *filesProxy) holdAliceAndBob(t *testing.T, up *heldUpstream, size int) (ids map[string]string, post func(key, body string) (int, []byte), release func()) {
	t.Helper()
	ids = map[string]string{}
	for _, key := range []string{"sk-alice", "sk-bob", "sk-carol"} {
		ids[key] = p.uploadPDF(t, key, size)
	}
	post = func(key, body string) (int, []byte) {
		status, _, b := p.do(t, "POST", "/v1/responses", body, "Authorization", "Bearer "+key)
		return status, b
	}
	var wg sync.WaitGroup
	for _, key := range []string{"sk-alice", "sk-bob"} {
		wg.Go(func() {
			if status, b := post(key, inlineBody(ids[key], 1)); status != http.StatusOK {
				t.Errorf("%s's held request: %d %s", key, status, b)
			}
		})
		<-up.arrived
	}
	return ids, post, func() {
		up.release()
		wg.Wait()
	}
}

// Concurrent requests of a few hundred bytes, each naming one large stored file, must not make
// the proxy hold the file's bytes, let alone several copies of them per request: the upstream
// body is streamed from the store. Measured as the heap in use while every request is held at
// the upstream after it read its whole body.
func TestPassThroughInlineHoldsNoFileBytes(t *testing.T) {
	const size, n = 16 << 20, 4
	up := newHeldUpstream(t, n)
	p := inlineProxy(t, up, false)
	id := p.uploadPDF(t, "sk-alice", size)
	body := inlineBody(id, 1)
	wantLen := int64(base64.StdEncoding.EncodedLen(size))

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	statuses := make([]int, n)
	for i := range n {
		wg.Go(func() { statuses[i], _, _ = p.do(t, "POST", "/v1/responses", body, "Authorization", "Bearer sk-alice") })
	}
	for range n {
		if got := <-up.arrived; got < wantLen {
			t.Errorf("the upstream got %d bytes; want the file inline (over %d)", got, wantLen)
		}
	}
	var during runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&during)
	up.release()
	wg.Wait()
	for i, s := range statuses {
		if s != http.StatusOK {
			t.Errorf("request %d: status %d", i, s)
		}
	}
	// One copy of the encoded file per request would be 4 × 21 MiB; allow a quarter of one.
	if grown := int64(during.HeapAlloc) - int64(before.HeapAlloc); grown > wantLen/4 {
		t.Errorf("%d requests in flight hold %d MiB of heap; want under %d MiB (the file is %d MiB)", n, grown>>20, wantLen>>22, size>>20)
	}
}

// A pass-through request that inlines a file counts in max_concurrent_requests(_per_key) like an
// intercepted one; a pass-through request that names no file of the proxy's is not counted.
func TestPassThroughInlineCountsInFlight(t *testing.T) {
	up := newHeldUpstream(t, 2)
	p := inlineProxy(t, up, false, func(c *config.Config) {
		c.General.Quotas.MaxConcurrentRequests = 2
		c.General.Quotas.MaxConcurrentRequestsPerKey = 1
	})
	ids, post, release := p.holdAliceAndBob(t, up, 4<<10)
	status, b := post("sk-alice", inlineBody(ids["sk-alice"], 1))
	want429(t, "alice's second inlining request", status, b, "max_concurrent_requests_per_key")
	status, b = post("sk-carol", inlineBody(ids["sk-carol"], 1))
	want429(t, "a third caller past the total", status, b, "max_concurrent_requests")
	if status, b := post("sk-alice", `{"model":"gpt-test","input":[{"role":"user","content":[{"type":"input_file","file_id":"file-upstreams"}]}]}`); status != http.StatusOK {
		t.Errorf("a pass-through request inlining nothing while the quota is full: %d %s", status, b)
	}
	release()
	if status, b := post("sk-carol", inlineBody(ids["sk-carol"], 1)); status != http.StatusOK {
		t.Errorf("carol once the others ended: %d %s", status, b)
	}
}

// The bytes of stored files inlined by requests in flight are bounded per key (429: the caller's
// own load) and in all (503: the server's), on the pass-through path, which streams them, and on
// the Chat Completions translation, which holds them for the request; a request that needs more
// than a bound on its own is a 400. Each caller inlines its own 2 MiB file.
func TestInlineBytesInFlightBounded(t *testing.T) {
	for _, api := range []config.API{config.APIResponses, config.APIChatCompletions} {
		t.Run(string(api), func(t *testing.T) {
			up := newHeldUpstream(t, 2)
			p := inlineProxy(t, up, api == config.APIChatCompletions, func(c *config.Config) {
				c.Models[0].API = api
				c.General.MaxInlineBytesInFlightPerKey = 3 << 20
				c.General.MaxInlineBytesInFlight = 5 << 20
			})
			ids, post, release := p.holdAliceAndBob(t, up, 2<<20)
			status, b := post("sk-alice", inlineBody(ids["sk-alice"], 1))
			want429(t, "alice past her share", status, b, "max_inline_bytes_in_flight_per_key")
			status, b = post("sk-carol", inlineBody(ids["sk-carol"], 1))
			if msg, typ, _, code := decodeError(t, b); status != http.StatusServiceUnavailable || typ != "server_error" || code != "server_overloaded" || !strings.Contains(msg, "max_inline_bytes_in_flight)") {
				t.Errorf("carol past the total: %d %s; want a 503 server_overloaded naming max_inline_bytes_in_flight", status, b)
			}
			status, b = post("sk-carol", inlineBody(ids["sk-carol"], 2))
			if _, _, param, code := decodeError(t, b); status != http.StatusBadRequest || param != "input" || code != "file_too_large" {
				t.Errorf("carol naming more than her share at once: %d %s; want a 400 file_too_large", status, b)
			}
			release()
			if status, b := post("sk-carol", inlineBody(ids["sk-carol"], 1)); status != http.StatusOK {
				t.Errorf("carol once the others ended: %d %s", status, b)
			}
		})
	}
}
