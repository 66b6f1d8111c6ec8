package upstream

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/ciproxy/ciproxy/internal/config"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// recorded is what a test upstream saw of one request.
type recorded struct {
	Method   string
	Path     string
	RawQuery string
	Header   http.Header
	Body     []byte
	Proto    int
}

// testUpstream is an httptest server that records every request, then runs its handler.
type testUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []recorded
}

func newUpstream(t testing.TB, h http.HandlerFunc) *testUpstream {
	t.Helper()
	u := &testUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.reqs = append(u.reqs, recorded{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), body, r.ProtoMajor})
		u.mu.Unlock()
		if h != nil {
			h(w, r)
		}
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *testUpstream) hits() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.reqs)
}

func (u *testUpstream) last(t testing.TB) recorded {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.reqs) == 0 {
		t.Fatal("upstream got no request")
	}
	return u.reqs[len(u.reqs)-1]
}

// status answers every request with code and body.
func status(code int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}
}

func dep(model, base, key string) config.Deployment {
	return config.Deployment{ModelName: "alias", Provider: "openai", UpstreamModel: model, APIBase: base + "/v1", APIKey: key}
}

// refusedURL returns a base URL where nothing listens.
func refusedURL(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

func newTestClient(t testing.TB, m *Metrics) *Client {
	t.Helper()
	c := NewClient(ClientOptions{Metrics: m})
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// plainClient is what a test client uses: its own transport, no transparent decompression, so
// bytes are compared as they travelled.
func plainClient(t testing.TB) *http.Client {
	t.Helper()
	tr := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// proxyServer serves Target.Proxy for deps, rotated by a Balancer like the router does.
func proxyServer(t testing.TB, c *Client, deps []config.Deployment) *httptest.Server {
	t.Helper()
	b := NewBalancer()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		c.Target(b.Order(deps)).Proxy(w, r, body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// value returns the current value of a counter (or the sample count of a histogram).
func value(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Histogram != nil:
		return float64(d.Histogram.GetSampleCount())
	}
	t.Fatalf("unexpected metric %v", &d)
	return 0
}
