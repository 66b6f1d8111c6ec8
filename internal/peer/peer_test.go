package peer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
)

func TestSignVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	good := Sign("s3cret", "POST", "/v1/responses?x=1", now)
	cases := []struct {
		name, secret, value, method, uri string
		at                               time.Time
		want                             error
	}{
		{"valid", "s3cret", good, "POST", "/v1/responses?x=1", now, nil},
		{"valid within the window", "s3cret", good, "POST", "/v1/responses?x=1", now.Add(SignatureWindow), nil},
		{"stale", "s3cret", good, "POST", "/v1/responses?x=1", now.Add(SignatureWindow + time.Second), errStale},
		{"from the future", "s3cret", good, "POST", "/v1/responses?x=1", now.Add(-SignatureWindow - time.Second), errStale},
		{"another secret", "other", good, "POST", "/v1/responses?x=1", now, errBadMAC},
		{"another method", "s3cret", good, "GET", "/v1/responses?x=1", now, errBadMAC},
		{"another path", "s3cret", good, "POST", "/v1/containers", now, errBadMAC},
		{"another query", "s3cret", good, "POST", "/v1/responses?x=2", now, errBadMAC},
		{"no secret here", "", good, "POST", "/v1/responses?x=1", now, errNoSecret},
		{"garbage", "s3cret", "hello", "POST", "/v1/responses?x=1", now, errMalformed},
		{"bad hex", "s3cret", "t=1800000000,v1=zz", "POST", "/v1/responses?x=1", now, errMalformed},
		{"moved time", "s3cret", strings.Replace(good, "t=1800000000", "t=1800000001", 1), "POST", "/v1/responses?x=1", now, errBadMAC},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := Verify(tc.secret, tc.value, tc.method, tc.uri, tc.at); !errors.Is(err, tc.want) {
				t.Errorf("Verify = %v; want %v", err, tc.want)
			}
		})
	}
}

// clock is a settable clock for the store.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newStore(t *testing.T, c *clock) store.Store {
	t.Helper()
	now := time.Now
	if c != nil {
		now = c.Now
	}
	st, err := embedded.Open(embedded.Options{Dir: t.TempDir(), Now: now, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// expirer records the containers Expire is asked to expire, and expires them in the store.
type expirer struct {
	st  store.Store
	mu  sync.Mutex
	ids []string
}

func (e *expirer) expire(ctx context.Context, rec store.Container) error {
	e.mu.Lock()
	e.ids = append(e.ids, rec.ID)
	e.mu.Unlock()
	rec.Status, rec.ExpiresAt, rec.ForgetAt = statusExpired, time.Time{}, time.Now().Add(time.Hour)
	_, err := e.st.UpdateContainer(ctx, rec)
	return err
}

func (e *expirer) expired() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.ids...)
}

func newPeers(t *testing.T, st store.Store, self string, exp *expirer) *Peers {
	t.Helper()
	opts := Options{Store: st, Self: self}
	if exp != nil {
		opts.Expire = exp.expire
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func record(t *testing.T, st store.Store, owner, host string) store.Container {
	t.Helper()
	c, err := st.CreateContainer(context.Background(), store.Container{Owner: owner, Backend: "local", Tool: "local",
		Host: host, Status: "running", ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLeases: a replica is alive while its lease is held, gone once it runs out or is ended, and
// takes it over at once when restarted at the same address.
func TestLeases(t *testing.T) {
	c := &clock{now: time.Unix(1_800_000_000, 0)}
	st := newStore(t, c)
	ctx := context.Background()
	a := newPeers(t, st, "http://10.0.0.1:4000", nil)
	b := newPeers(t, st, "http://10.0.0.2:4000", nil)
	alive := func(host string) bool {
		t.Helper()
		ok, err := b.Alive(ctx, host)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if alive(a.Self()) {
		t.Error("a replica that never registered is alive")
	}
	if err := a.Register(ctx); err != nil {
		t.Fatal(err)
	}
	if !alive(a.Self()) {
		t.Error("a registered replica is not alive")
	}
	c.Advance(DefaultLease)
	if alive(a.Self()) {
		t.Error("a replica whose lease ran out is alive")
	}
	restarted := newPeers(t, st, "http://10.0.0.1:4000", nil)
	if err := a.Register(ctx); err != nil {
		t.Fatal(err)
	}
	if err := restarted.Register(ctx); err != nil {
		t.Errorf("a replica restarted at the same address cannot take its lease: %v", err)
	}

	// Run renews, and ends the lease when it stops.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { restarted.Run(runCtx); close(done) }()
	stop()
	<-done
	if alive(a.Self()) {
		t.Error("a replica that stopped is still alive")
	}
}

// TestHost: a container hosted by a live replica is served there; one reachable from anywhere or
// hosted here is served here; one unknown, another owner's, expired, or not a container id is live
// nowhere; one whose host is gone is live nowhere, and is expired first.
func TestHost(t *testing.T) {
	st := newStore(t, nil)
	ctx := context.Background()
	exp := &expirer{st: st}
	here := newPeers(t, st, "http://10.0.0.1:4000", exp)
	there := newPeers(t, st, "http://10.0.0.2:4000", nil)
	if err := there.Register(ctx); err != nil {
		t.Fatal(err)
	}
	onThere := record(t, st, "alice", there.Self())
	onHere := record(t, st, "alice", here.Self())
	anywhere := record(t, st, "alice", "")
	onGone := record(t, st, "alice", "http://10.0.0.3:4000")
	expired := record(t, st, "alice", there.Self())
	expired.Status = statusExpired
	if _, err := st.UpdateContainer(ctx, expired); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name     string
		owner    string
		id       string
		wantHost string
		wantLive bool
	}{
		{"on a live peer", "alice", onThere.ID, there.Self(), true},
		{"hosted here", "alice", onHere.ID, "", true},
		{"reachable from anywhere", "alice", anywhere.ID, "", true},
		{"another owner's", "bob", onThere.ID, "", false},
		{"expired", "alice", expired.ID, "", false},
		{"unknown", "alice", "cntr_" + strings.Repeat("0", 48), "", false},
		{"not a container id", "alice", "../x", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			host, live, err := here.Host(ctx, tc.owner, tc.id)
			if err != nil || host != tc.wantHost || live != tc.wantLive {
				t.Errorf("Host = %q, %v, %v; want %q, %v", host, live, err, tc.wantHost, tc.wantLive)
			}
			if got, err := here.ContainerHost(ctx, tc.owner, tc.id); err != nil || got != tc.wantHost {
				t.Errorf("ContainerHost = %q, %v; want %q", got, err, tc.wantHost)
			}
		})
	}
	if len(exp.expired()) != 0 {
		t.Fatalf("expired %v before any host was gone", exp.expired())
	}
	if host, live, err := here.Host(ctx, "alice", onGone.ID); err != nil || host != "" || live {
		t.Errorf("Host of a gone host's container = %q, %v, %v; want here, not live", host, live, err)
	}
	if ids := exp.expired(); len(ids) != 1 || ids[0] != onGone.ID {
		t.Errorf("expired %v; want the gone host's container", ids)
	}
}

// TestSweepGone: the containers of gone replicas are expired by one replica at a time.
func TestSweepGone(t *testing.T) {
	st := newStore(t, nil)
	ctx := context.Background()
	exp := &expirer{st: st}
	here := newPeers(t, st, "http://10.0.0.1:4000", exp)
	there := newPeers(t, st, "http://10.0.0.2:4000", exp)
	if err := there.Register(ctx); err != nil {
		t.Fatal(err)
	}
	record(t, st, "alice", there.Self())
	record(t, st, "alice", here.Self())
	record(t, st, "alice", "")
	g1 := record(t, st, "alice", "http://10.0.0.3:4000")
	g2 := record(t, st, "bob", "http://10.0.0.3:4000")
	n, won, err := here.SweepGone(ctx, time.Minute)
	if err != nil || !won || n != 2 {
		t.Fatalf("SweepGone = %d, %v, %v; want 2", n, won, err)
	}
	if ids := exp.expired(); len(ids) != 2 || !(ids[0] == g1.ID || ids[0] == g2.ID) {
		t.Errorf("expired %v", ids)
	}
	if n, won, _ := there.SweepGone(ctx, time.Minute); won || n != 0 {
		t.Errorf("a second replica swept while the first held the claim: %d, %v", n, won)
	}
	if n, _, _ := here.SweepGone(ctx, time.Minute); n != 0 {
		t.Errorf("a second sweep expired %d more", n)
	}
}

// peerServer is a replica's end of forwarding: it checks the signature as the router does and
// streams three server-sent events, the second only once the test has received the first.
func peerServer(t *testing.T, secret string, next chan struct{}) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := Verify(secret, r.Header.Get(HeaderForwarded), r.Method, r.URL.RequestURI(), time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Request-Id", r.Header.Get("X-Request-Id"))
		w.Header().Set("X-Seen", fmt.Sprintf("%s %s auth=%s body=%s", r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), body))
		for i := range 3 {
			fmt.Fprintf(w, "event: e\ndata: %d\n\n", i)
			w.(http.Flusher).Flush()
			if i == 0 {
				select {
				case <-next:
				case <-r.Context().Done():
					return
				}
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestForward: the request reaches the peer signed, with its credentials, path, query and body;
// the answer streams back event by event; headers come through without a second request id.
func TestForward(t *testing.T) {
	st := newStore(t, nil)
	next := make(chan struct{})
	peerSrv := peerServer(t, "s3cret", next)
	p := newPeers(t, st, "http://10.0.0.1:4000", nil)

	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "req_1")
		if err := p.Forward(w, r, peerSrv.URL, "s3cret", "req_1", []byte(`{"read":"already"}`)); err != nil {
			t.Errorf("Forward = %v", err)
		}
	}))
	t.Cleanup(front.Close)
	req, _ := http.NewRequest(http.MethodPost, front.URL+"/v1/responses?x=1", strings.NewReader(`{"ignored":true}`))
	req.Header.Set("Authorization", "Bearer sk-client")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	first, _ := rd.ReadString('\n')
	if first != "event: e\n" {
		t.Fatalf("first line = %q", first)
	}
	close(next) // the peer sends the rest only now: the first event came through on its own
	rest, _ := io.ReadAll(rd)
	if !strings.HasSuffix(string(rest), "data: 2\n\n") {
		t.Errorf("stream = %q", rest)
	}
	if got := resp.Header.Values("X-Request-Id"); len(got) != 1 || got[0] != "req_1" {
		t.Errorf("X-Request-Id = %q; want one req_1", got)
	}
	if seen := resp.Header.Get("X-Seen"); seen != `POST /v1/responses?x=1 auth=Bearer sk-client body={"read":"already"}` {
		t.Errorf("the peer saw %q", seen)
	}
}

// TestForwardFailures: a refused connection is ErrGone and ends the host's lease; a peer that
// breaks off before answering is an *UnreachableError; without a secret nothing is sent.
func TestForwardFailures(t *testing.T) {
	st := newStore(t, nil)
	ctx := context.Background()
	p := newPeers(t, st, "http://10.0.0.1:4000", nil)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedHost := "http://" + ln.Addr().String()
	_ = ln.Close()
	gone := newPeers(t, st, closedHost, nil)
	if err := gone.Register(ctx); err != nil {
		t.Fatal(err)
	}
	forward := func(host, secret string) error {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/v1/containers/cntr_x", nil)
		err := p.Forward(rec, r, host, secret, "", nil)
		if rec.Body.Len() != 0 || rec.Code != http.StatusOK {
			t.Errorf("a failed forward wrote %d %q", rec.Code, rec.Body.String())
		}
		return err
	}
	if err := forward(closedHost, "s"); !errors.Is(err, ErrGone) {
		t.Errorf("Forward to a closed port = %v; want ErrGone", err)
	}
	if ok, _ := p.Alive(ctx, closedHost); ok {
		t.Error("the lease of a replica found gone was not ended")
	}

	hangup, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hangup.Close() })
	go func() {
		for {
			c, err := hangup.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	var ue *UnreachableError
	if err := forward("http://"+hangup.Addr().String(), "s"); !errors.As(err, &ue) {
		t.Errorf("Forward to a peer that hangs up = %v; want *UnreachableError", err)
	}
	if err := forward("http://"+hangup.Addr().String(), ""); !errors.As(err, &ue) {
		t.Errorf("Forward without a secret = %v; want *UnreachableError", err)
	}
}

// TestForwardPeerKilled: a replica killed while this one holds a kept-alive connection to it
// resets that connection when the next forward is written on it; nothing listens at its address
// any more, so that is ErrGone (the request is served here), as a refused connection is, not a
// 503 the client would have to retry.
func TestForwardPeerKilled(t *testing.T) {
	st := newStore(t, nil)
	ctx := context.Background()
	p := newPeers(t, st, "http://10.0.0.1:4000", nil)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := "http://" + ln.Addr().String()
	killed := newPeers(t, st, host, nil)
	if err := killed.Register(ctx); err != nil {
		t.Fatal(err)
	}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		rd := bufio.NewReader(c)
		// The first request is answered on a connection kept alive.
		if req, err := http.ReadRequest(rd); err == nil {
			_, _ = io.Copy(io.Discard, req.Body)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
		// The process dies while the second is on its way: its listener is gone, and the
		// kernel resets the connection.
		_, _ = http.ReadRequest(rd)
		_ = ln.Close()
		_ = c.(*net.TCPConn).SetLinger(0)
		_ = c.Close()
	}()
	t.Cleanup(func() { _ = ln.Close() })
	forward := func() (*httptest.ResponseRecorder, error) {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/responses", nil)
		return rec, p.Forward(rec, r, host, "s", "", []byte(`{}`))
	}
	if rec, err := forward(); err != nil || rec.Body.String() != "ok" {
		t.Fatalf("first Forward = %v, %q", err, rec.Body.String())
	}
	rec, err := forward()
	if !errors.Is(err, ErrGone) {
		t.Errorf("Forward to a replica killed under a kept-alive connection = %v; want ErrGone", err)
	}
	if rec.Body.Len() != 0 {
		t.Errorf("the failed forward wrote %q", rec.Body.String())
	}
	if ok, _ := p.Alive(ctx, host); ok {
		t.Error("the lease of the killed replica was not ended")
	}
}

// TestProbe: without a lease, a replica is alive only if the service at its address proves it
// knows the shared secret; a probe sends no credential.
func TestProbe(t *testing.T) {
	st := newStore(t, nil)
	ctx := context.Background()
	p, err := New(Options{Store: st, Self: "http://10.0.0.1:4000", Secret: func() string { return "s3cret" }})
	if err != nil {
		t.Fatal(err)
	}
	answering := func(secret string) string {
		var self string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "" || r.URL.Path != "/healthz" {
				t.Errorf("a probe sent %s with Authorization %q", r.URL.Path, r.Header.Get("Authorization"))
			}
			if n := r.Header.Get(HeaderProbe); n != "" && secret != "" {
				w.Header().Set(HeaderPeer, ProbeAnswer(secret, self, n))
			}
			_, _ = io.WriteString(w, `{"status":"ok"}`)
		}))
		t.Cleanup(srv.Close)
		self = srv.URL
		return srv.URL
	}
	for _, tc := range []struct {
		name string
		host string
		want bool
	}{
		{"a replica of this deployment", answering("s3cret"), true},
		{"another deployment's", answering("other"), false},
		{"some other service", answering(""), false},
		{"nothing there", "http://127.0.0.1:1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := p.Alive(ctx, tc.host); err != nil || got != tc.want {
				t.Errorf("Alive = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
