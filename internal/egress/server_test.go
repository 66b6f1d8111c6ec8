package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/egress/egresstest"
)

// hello answers with the name it was asked for, which tells a test which origin it reached.
func hello(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s (Host %s)", name, r.Host)
	})
}

// TestDomains: exact names and wildcards, over http and https; everything else refused with
// the proxy's own answer, before any connection to the origin.
func TestDomains(t *testing.T) {
	roots := newPKI(t)
	names := []string{"api.example.test", "a.wild.test", "a.b.wild.test", "wild.test", "other.test", "api.example.test.evil.test"}
	cert := roots.Issue(t, names...)
	plain := newOrigin(t, "tcp4", hello("plain"), nil)
	secure := newOrigin(t, "tcp4", hello("secure"), &cert)
	res := newResolver()
	for _, n := range names {
		res.set(n, "127.0.0.1")
	}
	p := startProxy(t, Options{Resolver: res, RootCAs: roots.Pool, AllowPrivate: true,
		HTTPPorts: []int{plain.port}, TLSPorts: []int{secure.port}},
		Policy{Domains: []string{"api.example.test", "*.wild.test"}})
	c := p.client(t, roots)
	tests := []struct {
		name    string
		allowed bool
	}{
		{"api.example.test", true},
		{"API.Example.Test", true},
		{"a.wild.test", true},
		{"a.b.wild.test", true},
		{"wild.test", false},
		{"other.test", false},
		{"api.example.test.evil.test", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plainBefore, secureBefore := plain.conns.get(), secure.conns.get()
			status, body, _ := get(t, c, "http://"+hostPort(tt.name, plain.port)+"/", nil)
			resp, refusal, _ := p.connect(t, hostPort(tt.name, secure.port))
			if tt.allowed {
				if status != 200 || !strings.Contains(body, "hello from plain") {
					t.Errorf("http: %d %q, want the origin's answer", status, body)
				}
				if s, b, _ := get(t, c, "https://"+hostPort(tt.name, secure.port)+"/", nil); s != 200 || !strings.Contains(b, "hello from secure") {
					t.Errorf("https: %d %q, want the origin's answer", s, b)
				}
				if resp.StatusCode != 200 {
					t.Errorf("CONNECT: %s %q", resp.Status, refusal)
				}
				return
			}
			want := "ciproxy egress: " + tt.name + " is not in this container's allowed domains"
			if status != 403 || !strings.Contains(body, want) {
				t.Errorf("http: %d %q, want 403 %q", status, body, want)
			}
			if resp.StatusCode != 403 || !strings.Contains(refusal, want) {
				t.Errorf("CONNECT: %s %q, want 403 %q", resp.Status, refusal, want)
			}
			if plain.conns.get() != plainBefore || secure.conns.get() != secureBefore {
				t.Error("a refused request reached an origin")
			}
		})
	}
	if logs := p.logs.FilterMessage("egress refused").FilterField(stringField("host", "other.test")).Len(); logs == 0 {
		t.Error("no refusal logged for other.test")
	}
	for _, e := range p.logs.All() {
		if e.ContextMap()["container"] != "cntr_test" {
			t.Errorf("log line %q without the container id", e.Message)
		}
	}
}

// TestDestinations: whatever the policy allows, a name must resolve to a public address, and an
// address is never a destination; the proxy refuses before it dials.
func TestDestinations(t *testing.T) {
	addrs := map[string]string{
		"loopback.test": "127.0.0.1", "loopback6.test": "::1", "private.test": "10.1.2.3",
		"metadata.test": "169.254.169.254", "cgnat.test": "100.100.100.200", "ula.test": "fd00:ec2::254",
		"mapped.test": "::ffff:127.0.0.1", "nat64.test": "64:ff9b::a9fe:a9fe", "sixtofour.test": "2002:7f00:1::1",
		"unspecified.test": "0.0.0.0", "localhost": "127.0.0.1",
	}
	res := newResolver()
	domains := []string{"*.test"}
	for name, a := range addrs {
		res.set(name, a)
	}
	domains = append(domains, "localhost")
	var dialled []string
	var mu sync.Mutex
	dial := func(_ context.Context, _, addr string) (net.Conn, error) {
		mu.Lock()
		dialled = append(dialled, addr)
		mu.Unlock()
		return nil, fmt.Errorf("no dial expected")
	}
	p := startProxy(t, Options{Resolver: res, Dial: dial}, Policy{Domains: domains})
	c := p.client(t, nil)
	for name, a := range addrs {
		t.Run(name, func(t *testing.T) {
			resp, body, _ := p.connect(t, hostPort(name, 443))
			if resp.StatusCode != 403 || !strings.Contains(body, "a private address") {
				t.Errorf("CONNECT %s (%s): %s %q, want 403 private address", name, a, resp.Status, body)
			}
			status, body, _ := get(t, c, "http://"+name+"/", nil)
			if status != 403 || !strings.Contains(body, "a private address") {
				t.Errorf("GET %s (%s): %d %q, want 403 private address", name, a, status, body)
			}
		})
	}
	for _, target := range []string{"127.0.0.1:443", "[::1]:443", "169.254.169.254:443", "[fd00::1]:443", "93.184.215.14:443"} {
		resp, body, _ := p.connect(t, target)
		if resp.StatusCode != 403 || !strings.Contains(body, "is an IP address") {
			t.Errorf("CONNECT %s: %s %q, want 403 IP address", target, resp.Status, body)
		}
	}
	if status, body, _ := get(t, c, "http://10.0.0.1/latest/meta-data/", nil); status != 403 || !strings.Contains(body, "is an IP address") {
		t.Errorf("GET http://10.0.0.1/: %d %q", status, body)
	}
	if len(dialled) != 0 {
		t.Errorf("dialled %v", dialled)
	}
}

// TestRebinding: a name that resolves to a public address, then to loopback. The proxy resolves
// once per request and dials the address it checked, so the first request reaches the public
// address and the second is refused.
func TestRebinding(t *testing.T) {
	public, loopback := netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr("127.0.0.1")
	table := newResolver()
	table.set("rebind.test", public.String(), loopback.String())
	// The same through a DNS server, as dns_server configures it (NewResolver): answers of TTL 0,
	// A and AAAA asked each time.
	dns := egresstest.NewDNS(t)
	dns.Sequence("rebind.test", []netip.Addr{public}, []netip.Addr{loopback})
	for _, tt := range []struct {
		name    string
		r       Resolver
		queries func() int
		want    int
	}{
		{"table", table, func() int { return table.queries("rebind.test") }, 2},
		{"dns server", NewResolver(dns.Addr()), func() int { return dns.Queries("rebind.test") }, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := newOrigin(t, "tcp4", hello("public"), nil)
			var mu sync.Mutex
			var dialled []string
			dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
				mu.Lock()
				dialled = append(dialled, addr)
				mu.Unlock()
				// The public address stands for the origin: no test reaches the internet.
				var d net.Dialer
				return d.DialContext(ctx, network, o.Listener.Addr().String())
			}
			p := startProxy(t, Options{Resolver: tt.r, Dial: dial}, Policy{Domains: []string{"rebind.test"}})
			c := p.client(t, nil)
			if status, body, _ := get(t, c, "http://rebind.test/", nil); status != 200 || !strings.Contains(body, "hello from public") {
				t.Fatalf("first: %d %q", status, body)
			}
			if status, body, _ := get(t, c, "http://rebind.test/", nil); status != 403 || !strings.Contains(body, "resolves to 127.0.0.1, a private address") {
				t.Fatalf("second: %d %q, want 403", status, body)
			}
			if got := tt.queries(); got != tt.want {
				t.Errorf("%d queries for two requests, want %d: one lookup each", got, tt.want)
			}
			if len(dialled) != 1 || dialled[0] != "93.184.215.14:80" {
				t.Errorf("dialled %v, want [93.184.215.14:80]: the address checked", dialled)
			}
		})
	}
}

// TestPorts: CONNECT goes to the TLS ports alone and plain requests to the HTTP ports alone.
func TestPorts(t *testing.T) {
	res := newResolver()
	res.set("ok.test", "127.0.0.1")
	p := startProxy(t, Options{Resolver: res, AllowPrivate: true}, Policy{Domains: []string{"ok.test"}})
	c := p.client(t, nil)
	for _, target := range []string{"ok.test:22", "ok.test:80", "ok.test:8443", "ok.test:0", "ok.test:99999", "ok.test"} {
		resp, body, _ := p.connect(t, target)
		if resp.StatusCode/100 != 4 || !strings.Contains(body, "ciproxy egress:") {
			t.Errorf("CONNECT %s: %s %q, want a refusal", target, resp.Status, body)
		}
	}
	if status, body, _ := get(t, c, "http://ok.test:443/", nil); status != 403 || !strings.Contains(body, "port 443 is not open") {
		t.Errorf("GET http://ok.test:443/: %d %q", status, body)
	}
}

// TestServerName: a tunnel must start with a ClientHello naming the CONNECT host; another name
// (domain fronting) or no TLS at all closes it before a byte reaches the origin.
func TestServerName(t *testing.T) {
	roots := newPKI(t)
	cert := roots.Issue(t, "ok.test", "other.test")
	var handshakes counter
	o := newOrigin(t, "tcp4", hello("origin"), &cert)
	o.TLS.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { handshakes.add(); return nil, nil }
	res := newResolver()
	res.set("ok.test", "127.0.0.1")
	p := startProxy(t, Options{Resolver: res, AllowPrivate: true, TLSPorts: []int{o.port}}, Policy{Domains: []string{"ok.test"}})
	target := hostPort("ok.test", o.port)
	for _, tt := range []struct {
		name, sni string
		ok        bool
	}{{"same name", "ok.test", true}, {"other name", "other.test", false}, {"no name", "", false}} {
		t.Run(tt.name, func(t *testing.T) {
			resp, _, conn := p.connect(t, target)
			if resp.StatusCode != 200 {
				t.Fatalf("CONNECT: %s", resp.Status)
			}
			tc := tls.Client(conn, &tls.Config{ServerName: tt.sni, RootCAs: roots.Pool, InsecureSkipVerify: tt.sni == ""})
			err := tc.Handshake()
			if tt.ok != (err == nil) {
				t.Fatalf("handshake with server name %q: %v", tt.sni, err)
			}
		})
	}
	t.Run("not TLS", func(t *testing.T) {
		resp, _, conn := p.connect(t, target)
		if resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %s", resp.Status)
		}
		io.WriteString(conn, "GET / HTTP/1.1\r\nHost: ok.test\r\n\r\n")
		if b, _ := io.ReadAll(conn); len(b) != 0 {
			t.Errorf("plain text through a TLS tunnel got %q", b)
		}
	})
	// The origin saw the good ClientHello alone (the proxy connects before it reads the
	// client's, so that it can still answer 502; the others' connections carried nothing).
	if n := handshakes.get(); n != 1 {
		t.Errorf("the origin read %d ClientHellos, want 1", n)
	}
}

// TestRedirect: the proxy follows nothing; the client's next request is checked as any other.
func TestRedirect(t *testing.T) {
	o := newOrigin(t, "tcp4", http.RedirectHandler("http://refused.test/", http.StatusFound), nil)
	res := newResolver()
	res.set("ok.test", "127.0.0.1")
	res.set("refused.test", "127.0.0.1")
	p := startProxy(t, Options{Resolver: res, AllowPrivate: true, HTTPPorts: []int{o.port, 80}}, Policy{Domains: []string{"ok.test"}})
	status, body, _ := get(t, p.client(t, nil), "http://"+hostPort("ok.test", o.port)+"/", nil)
	if status != 403 || !strings.Contains(body, "refused.test is not in this container's allowed domains") {
		t.Errorf("after the redirect: %d %q, want 403", status, body)
	}
}

// TestIPv6: a name with an IPv6 address alone, over both kinds of request.
func TestIPv6(t *testing.T) {
	roots := newPKI(t)
	cert := roots.Issue(t, "v6.test")
	plain := newOrigin(t, "tcp6", hello("plain"), nil)
	secure := newOrigin(t, "tcp6", hello("secure"), &cert)
	res := newResolver()
	res.set("v6.test", "::1")
	p := startProxy(t, Options{Resolver: res, AllowPrivate: true, HTTPPorts: []int{plain.port}, TLSPorts: []int{secure.port}},
		Policy{Domains: []string{"v6.test"}})
	c := p.client(t, roots)
	if s, b, _ := get(t, c, "http://"+hostPort("v6.test", plain.port)+"/", nil); s != 200 || !strings.Contains(b, "hello from plain") {
		t.Errorf("http: %d %q", s, b)
	}
	if s, b, _ := get(t, c, "https://"+hostPort("v6.test", secure.port)+"/", nil); s != 200 || !strings.Contains(b, "hello from secure") {
		t.Errorf("https: %d %q", s, b)
	}
}

// TestDisabled: a container without network gets an answer that says so.
func TestDisabled(t *testing.T) {
	p := startProxy(t, Options{Resolver: newResolver()}, Policy{})
	status, body, _ := get(t, p.client(t, nil), "http://pypi.org/simple/", nil)
	if status != 403 || !strings.Contains(body, "this container has no network access") {
		t.Errorf("%d %q", status, body)
	}
	resp, body, _ := p.connect(t, "pypi.org:443")
	if resp.StatusCode != 403 || !strings.Contains(body, "no network access") {
		t.Errorf("CONNECT: %s %q", resp.Status, body)
	}
}

// TestSecrets: $NAME in a header becomes the value on requests to the secret's domain alone,
// the code sees only the placeholder, and neither the value nor the server's echo of it is logged.
func TestSecrets(t *testing.T) {
	const value = "sk-live-0123456789abcdef"
	roots := newPKI(t)
	cert := roots.Issue(t, "api.secret.test", "plain.test", "wrong.test")
	var mu sync.Mutex
	seen := map[string]string{}
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Host] = r.Header.Get("Authorization") + " | " + r.Header.Get("X-Other")
		mu.Unlock()
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		io.WriteString(w, "ok")
	})
	o := newOrigin(t, "tcp4", echo, &cert)
	res := newResolver()
	for _, n := range []string{"api.secret.test", "plain.test", "wrong.test"} {
		res.set(n, "127.0.0.1")
	}
	p := startProxy(t, Options{Resolver: res, RootCAs: roots.Pool, AllowPrivate: true, TLSPorts: []int{o.port}},
		Policy{Domains: []string{"*.secret.test", "plain.test", "wrong.test"}, Secrets: []Secret{
			{Domain: "*.secret.test", Name: "API_KEY", Value: value},
			{Domain: "*.secret.test", Name: "API", Value: "short"},
		}})
	c := p.client(t, roots)
	h := http.Header{"Authorization": {"Bearer ${API_KEY}"}, "X-Other": {"$API-$API_KEY2"}}
	status, body, hdr := get(t, c, "https://"+hostPort("api.secret.test", o.port)+"/v1", h)
	if status != 200 || body != "ok" {
		t.Fatalf("secret domain: %d %q", status, body)
	}
	if got := seen[hostPort("api.secret.test", o.port)]; got != "Bearer "+value+" | short-$API_KEY2" {
		t.Errorf("the server saw %q", got)
	}
	if hdr.Get("X-Echo") != "Bearer "+value {
		t.Errorf("the echo is %q: a server that echoes the secret is passed on, as documented", hdr.Get("X-Echo"))
	}
	status, _, _ = get(t, c, "https://"+hostPort("plain.test", o.port)+"/", h)
	if got := seen[hostPort("plain.test", o.port)]; status != 200 || got != "Bearer ${API_KEY} | $API-$API_KEY2" {
		t.Errorf("a domain without secrets: %d, the server saw %q", status, got)
	}
	// The certificate the code saw for the secret domain is the proxy's; for the other, the origin's.
	for name, issuer := range map[string]string{"api.secret.test": "ciproxy egress CA", "plain.test": "test root"} {
		resp, err := c.Get("https://" + hostPort(name, o.port) + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.TLS.PeerCertificates[0].Issuer.CommonName; got != issuer {
			t.Errorf("%s: certificate issued by %q, want %q", name, got, issuer)
		}
	}
	for _, e := range p.logs.All() {
		line := fmt.Sprint(e.Message, e.ContextMap())
		if strings.Contains(line, value) || strings.Contains(line, "short") {
			t.Errorf("a log line holds a secret: %s", line)
		}
	}
	if p.logs.FilterMessage("egress request").FilterField(intField("secrets_substituted", 2)).Len() == 0 {
		t.Error("no log line counts the substitution")
	}

	t.Run("Host header of another name", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, "https://"+hostPort("api.secret.test", o.port)+"/", nil)
		req.Host = "wrong.test"
		req.Header.Set("Authorization", "Bearer $API_KEY")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || !strings.Contains(string(b), "is not the CONNECT host") {
			t.Errorf("%s %q", resp.Status, b)
		}
		if _, ok := seen["wrong.test"]; ok {
			t.Error("the request reached the server")
		}
	})
	t.Run("server certificate not trusted", func(t *testing.T) {
		q := startProxy(t, Options{Resolver: res, AllowPrivate: true, TLSPorts: []int{o.port}},
			Policy{Domains: []string{"api.secret.test"}, Secrets: []Secret{{Domain: "api.secret.test", Name: "API_KEY", Value: value}}})
		mu.Lock()
		clear(seen)
		mu.Unlock()
		status, body, _ := get(t, q.client(t, roots), "https://"+hostPort("api.secret.test", o.port)+"/", h)
		if status != 502 || !strings.Contains(body, "TLS to api.secret.test failed") || strings.Contains(body, value) {
			t.Errorf("%d %q", status, body)
		}
		if len(seen) != 0 {
			t.Error("the secret went to a server the proxy could not verify")
		}
	})
}

// TestQuotas: connections at once and bytes each way, per container.
func TestQuotas(t *testing.T) {
	big := strings.Repeat("x", 64<<10)
	o := newOrigin(t, "tcp4", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, big)
	}), nil)
	res := newResolver()
	res.set("ok.test", "127.0.0.1")
	pol := Policy{Domains: []string{"ok.test"}}
	url := "http://" + hostPort("ok.test", o.port) + "/"

	t.Run("connections", func(t *testing.T) {
		p := startProxy(t, Options{Resolver: res, AllowPrivate: true, HTTPPorts: []int{o.port}, MaxConnections: 1}, pol)
		first, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer first.Close()
		// The first connection is counted once the proxy has read from it: wait for its answer.
		fmt.Fprintf(first, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", url, hostPort("ok.test", o.port))
		first.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := first.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		status, body, _ := get(t, p.client(t, nil), url, nil)
		if status != 429 || !strings.Contains(body, "too many connections at once (this container's limit is 1)") {
			t.Errorf("%d %q", status, body)
		}
	})
	t.Run("bytes in", func(t *testing.T) {
		p := startProxy(t, Options{Resolver: res, AllowPrivate: true, HTTPPorts: []int{o.port}, MaxBytesIn: 100 << 10}, pol)
		c := p.client(t, nil)
		if status, body, _ := get(t, c, url, nil); status != 200 || len(body) != len(big) {
			t.Fatalf("first: %d, %d bytes", status, len(body))
		}
		if _, body, _ := get(t, c, url, nil); len(body) == len(big) {
			t.Error("the second download passed the quota whole")
		}
		if status, body, _ := get(t, c, url, nil); status != 429 || !strings.Contains(body, "has received its 102400 bytes") {
			t.Errorf("after the quota: %d %q", status, body)
		}
	})
	t.Run("bytes out", func(t *testing.T) {
		p := startProxy(t, Options{Resolver: res, AllowPrivate: true, HTTPPorts: []int{o.port}, MaxBytesOut: 10 << 10}, pol)
		resp, err := p.client(t, nil).Post(url, "text/plain", strings.NewReader(big))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				t.Error("an upload past the quota succeeded")
			}
		}
		if status, body, _ := get(t, p.client(t, nil), url, nil); status != 429 || !strings.Contains(body, "has sent its 10240 bytes") {
			t.Errorf("after the quota: %d %q", status, body)
		}
	})
}

// TestServeEnds: cancelling Serve closes the listener and every open tunnel.
func TestServeEnds(t *testing.T) {
	o := newOrigin(t, "tcp4", hello("origin"), nil)
	res := newResolver()
	res.set("ok.test", "127.0.0.1")
	srv, err := New(Options{Resolver: res, AllowPrivate: true, TLSPorts: []int{o.port}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l, "cntr_x", Policy{Domains: []string{"ok.test"}}) }()
	p := &proxy{srv: srv, addr: l.Addr().String()}
	resp, _, conn := p.connect(t, hostPort("ok.test", o.port))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("the tunnel is still open after Serve returned: %v", err)
	}
	// (Not a dial to its address: with the port free, a dial may connect to itself.)
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the listener is not closed: %v", err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestPublic(t *testing.T) {
	for a, want := range map[string]bool{
		"93.184.215.14": true, "2606:2800:21f:cb07:6820:80da:af6b:8b2c": true, "8.8.8.8": true,
		"127.0.0.1": false, "10.0.0.1": false, "172.16.0.1": false, "192.168.1.1": false, "169.254.169.254": false,
		"100.64.0.1": false, "0.0.0.0": false, "255.255.255.255": false, "224.0.0.1": false, "198.18.0.1": false,
		"::1": false, "::": false, "fe80::1": false, "fc00::1": false, "ff02::1": false,
		"::ffff:10.0.0.1": false, "::ffff:8.8.8.8": true, "64:ff9b::808:808": true, "64:ff9b::a00:1": false,
		"2002:0a00:0001::1": false, "2002:0808:0808::1": true, "2001:db8::1": false,
	} {
		if got := Public(netip.MustParseAddr(a)); got != want {
			t.Errorf("Public(%s) = %v, want %v", a, got, want)
		}
	}
}

// TestHostileServer: a server's endless head or garbage is a 502 to the code, the proxy bounded.
func TestHostileServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	answers := []string{"HTTP/1.1 200 OK\r\nX-Long: " + strings.Repeat("a", 1<<20), "garbage\r\n\r\n"}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, a := range answers {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			c.Read(make([]byte, 4096))
			io.WriteString(c, a)
			c.Close()
		}
	}()
	res := newResolver()
	res.set("bad.test", "127.0.0.1")
	port := l.Addr().(*net.TCPAddr).Port
	p := startProxy(t, Options{Resolver: res, AllowPrivate: true, HTTPPorts: []int{port}}, Policy{Domains: []string{"bad.test"}})
	c := p.client(t, nil)
	for range answers {
		if status, body, _ := get(t, c, "http://"+hostPort("bad.test", port)+"/", nil); status != 502 || !strings.Contains(body, "did not answer with HTTP") {
			t.Errorf("%d %q", status, body)
		}
	}
}
