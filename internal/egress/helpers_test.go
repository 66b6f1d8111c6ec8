package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ciproxy/ciproxy/internal/egress/egresstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pki is the test's own authority (egresstest.PKI), which the proxy trusts as it would the public ones.
type pki = egresstest.PKI

func newPKI(t testing.TB) *pki { return egresstest.NewPKI(t) }

// origin is a server standing in for one on the internet. It counts the connections it accepts,
// so that a test can tell whether the proxy reached it at all.
type origin struct {
	*httptest.Server
	port  int
	conns *counter
}

type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) add() { c.mu.Lock(); c.n++; c.mu.Unlock() }
func (c *counter) get() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// newOrigin serves h on network's loopback ("tcp4" or "tcp6"), with TLS when cert is given.
func newOrigin(t testing.TB, network string, h http.Handler, cert *tls.Certificate) *origin {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "tcp6" {
		addr = "[::1]:0"
	}
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("no %s loopback here: %v", network, err)
	}
	o := &origin{Server: httptest.NewUnstartedServer(h), conns: &counter{}}
	o.Listener.Close()
	o.Listener = l
	o.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are what the tests make
	o.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			o.conns.add()
		}
	}
	if cert != nil {
		o.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
		o.StartTLS()
	} else {
		o.Start()
	}
	t.Cleanup(o.Close)
	o.port = l.Addr().(*net.TCPAddr).Port
	return o
}

// resolver answers from a table the test fills; a name with several answers gives them in turn
// (the last one again once they are used up), for DNS rebinding.
type resolver struct {
	mu      sync.Mutex
	answers map[string][][]netip.Addr
	asked   map[string]int
}

func newResolver() *resolver {
	return &resolver{answers: map[string][][]netip.Addr{}, asked: map[string]int{}}
}

func (r *resolver) set(name string, answers ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var seq [][]netip.Addr
	for _, a := range answers {
		seq = append(seq, []netip.Addr{netip.MustParseAddr(a)})
	}
	r.answers[name] = seq
}

func (r *resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seq, ok := r.answers[host]
	n := r.asked[host]
	r.asked[host]++
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return seq[min(n, len(seq)-1)], nil
}

func (r *resolver) queries(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.asked[name]
}

// proxy is an egress server serving one container on a loopback listener.
type proxy struct {
	srv  *Server
	addr string
	logs *observer.ObservedLogs
}

func startProxy(t testing.TB, opts Options, p Policy) *proxy {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	opts.Log = zap.New(core)
	srv, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l, "cntr_test", p) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &proxy{srv: srv, addr: l.Addr().String(), logs: logs}
}

// client is what code in a sandbox does: its HTTP proxy is the egress server, and it trusts the
// test's roots and the egress server's authority.
func (p *proxy) client(t testing.TB, roots *pki) *http.Client {
	pool := x509.NewCertPool()
	if roots != nil {
		pool.AddCert(roots.Cert)
	}
	if !pool.AppendCertsFromPEM(p.srv.CA()) {
		t.Fatal("the egress CA is not PEM")
	}
	u, _ := url.Parse("http://" + p.addr)
	tr := &http.Transport{Proxy: http.ProxyURL(u), TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// connect sends CONNECT target on a new connection and returns the proxy's answer, its body,
// and the connection (open when the answer is 200).
func (p *proxy) connect(t testing.TB, target string) (*http.Response, string, net.Conn) {
	t.Helper()
	conn, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	var body []byte
	if resp.StatusCode != http.StatusOK {
		body, _ = io.ReadAll(resp.Body)
	}
	return resp, string(body), &readerConn{Conn: conn, r: br}
}

// get sends one request through the proxy and returns its status and body.
func get(t testing.TB, c *http.Client, rawURL string, header http.Header) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, rawURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error(), nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return resp.StatusCode, "reading: " + err.Error(), resp.Header
	}
	return resp.StatusCode, string(b), resp.Header
}

func hostPort(name string, port int) string { return net.JoinHostPort(name, strconv.Itoa(port)) }

func stringField(key, value string) zap.Field  { return zap.String(key, value) }
func intField(key string, value int) zap.Field { return zap.Int(key, value) }
