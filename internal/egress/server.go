package egress

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Timeouts of one connection from a sandbox.
const (
	headTimeout      = 30 * time.Second // to read a request's line and headers
	idleTimeout      = 2 * time.Minute  // between requests on a kept-alive connection
	handshakeTimeout = 10 * time.Second // a TLS handshake, on either side
	resolveTimeout   = 5 * time.Second
	dialTimeout      = 10 * time.Second
	refusalTimeout   = 5 * time.Second // to read a request that will be refused
	maxHead          = 64 << 10        // bytes of a request's line and headers
)

// Resolver looks names up; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// NewResolver returns a resolver that asks the DNS server at addr ("host:port") alone, over UDP
// and TCP, rather than the host's configuration.
func NewResolver(addr string) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
}

// Options configure a Server. The zero value is usable: the host's resolver and roots, ports 80
// and 443, no private destinations, 64 connections at once per container, no byte quotas.
type Options struct {
	Resolver Resolver
	// Dial connects to an address the server has checked ("ip:port"); nil: a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// RootCAs verify the servers of domains with secrets, the only connections the server makes
	// TLS to itself; nil: the host's roots.
	RootCAs *x509.CertPool
	// AllowPrivate lets names resolve to loopback, private, link-local and other non-public
	// addresses (an internal package mirror, or tests on one machine).
	AllowPrivate bool
	// HTTPPorts are the ports plain http:// requests may go to (default 80); TLSPorts the ports
	// CONNECT may (default 443).
	HTTPPorts, TLSPorts []int
	// MaxConnections bounds one container's connections at once (default 64).
	MaxConnections int
	// MaxBytesIn and MaxBytesOut bound the bytes one container receives from and sends to the
	// internet over its life; 0 is no bound.
	MaxBytesIn, MaxBytesOut int64
	Log                     *zap.Logger
}

// Server is the egress proxy of every sandbox of one process; Serve runs it for one container.
type Server struct {
	opts Options
	ca   *authority
}

// New returns a server with a certificate authority of its own, made now, which signs the
// certificates it shows a sandbox for the domains that have secrets.
func New(opts Options) (*Server, error) {
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if opts.Dial == nil {
		d := &net.Dialer{Timeout: dialTimeout}
		opts.Dial = d.DialContext
	}
	if len(opts.HTTPPorts) == 0 {
		opts.HTTPPorts = []int{80}
	}
	if len(opts.TLSPorts) == 0 {
		opts.TLSPorts = []int{443}
	}
	if opts.MaxConnections <= 0 {
		opts.MaxConnections = 64
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	ca, err := newAuthority()
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	return &Server{opts: opts, ca: ca}, nil
}

// CA returns the PEM certificate a sandbox must trust for the domains with secrets.
func (s *Server) CA() []byte { return s.ca.pem }

// Serve answers the connections l accepts, for container (its id, for the logs) under policy p,
// until ctx ends or l fails; then it closes l and every connection and returns once they are
// done. A zero p refuses every request with a message saying the container has no network.
func (s *Server) Serve(ctx context.Context, l net.Listener, container string, p Policy) error {
	ctx, cancel := context.WithCancel(ctx)
	c := &session{s: s, id: container, p: p, log: s.opts.Log.With(zap.String("container", container))}
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	var wg sync.WaitGroup
	// However Serve ends, the connections end with it: cancelled first, then waited for.
	defer func() {
		cancel()
		l.Close()
		wg.Wait()
	}()
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of descriptors, say: wait rather than spin, then go on.
			c.log.Warn("egress: accepting", zap.Error(err))
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.handle(ctx, conn)
		}()
	}
}

// session is one container's egress: its policy and what it has used.
type session struct {
	s     *Server
	id    string
	p     Policy
	log   *zap.Logger
	conns atomic.Int64
	// refusing counts the connections past the limit being answered 429.
	refusing atomic.Int64
	in       atomic.Int64 // bytes received from the internet
	out      atomic.Int64 // bytes sent to it
	logged   atomic.Bool  // the quota's end was logged
}

// refusal is an answer the proxy gives itself.
type refusal struct {
	status int
	msg    string
}

func refuse(status int, format string, args ...any) *refusal {
	return &refusal{status: status, msg: fmt.Sprintf(format, args...)}
}

// write sends r as a whole HTTP response, after which the connection closes.
func (r *refusal) write(w io.Writer) {
	body := "ciproxy egress: " + r.msg + "\n"
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		r.status, http.StatusText(r.status), len(body), body)
}

func (c *session) handle(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	defer func() {
		// Whatever a sandbox or a server sends, one connection's failure is that connection's.
		if r := recover(); r != nil {
			c.log.Error("egress: a connection's handler panicked", zap.Any("panic", r))
		}
	}()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if n := c.conns.Add(1); n > int64(c.s.opts.MaxConnections) {
		c.conns.Add(-1)
		r := refuse(http.StatusTooManyRequests, "too many connections at once (this container's limit is %d)", c.s.opts.MaxConnections)
		c.decide("", "", 0, r)
		// Read the request first, so that the client takes the refusal as its answer; as many
		// refusals at once as connections served, past that the connection is just closed, so
		// that a flood holds no more of the proxy than twice the limit.
		if n := c.refusing.Add(1); n <= int64(c.s.opts.MaxConnections) {
			conn.SetReadDeadline(time.Now().Add(refusalTimeout))
			if _, err := http.ReadRequest(bufio.NewReader(io.LimitReader(conn, maxHead))); err == nil {
				r.write(conn)
			}
		}
		c.refusing.Add(-1)
		return
	}
	defer c.conns.Add(-1)
	head := &io.LimitedReader{R: conn}
	br := bufio.NewReader(head)
	for first := true; ; first = false {
		head.N = maxHead
		if first {
			conn.SetReadDeadline(time.Now().Add(headTimeout))
		} else {
			conn.SetReadDeadline(time.Now().Add(idleTimeout))
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			if first && !errors.Is(err, io.EOF) && ctx.Err() == nil {
				refuse(http.StatusBadRequest, "not an HTTP proxy request: %v", err).write(conn)
			}
			return
		}
		conn.SetReadDeadline(time.Time{})
		head.N = 1 << 62 // the body is counted by the quotas instead
		if req.Method == http.MethodConnect {
			c.connect(ctx, conn, br, req)
			return
		}
		if !c.forward(ctx, conn, br, req) {
			return
		}
	}
}

// decide logs a decision: never a header, a body or a secret.
func (c *session) decide(method, host string, port int, r *refusal) {
	if r == nil {
		c.log.Info("egress allowed", zap.String("method", method), zap.String("host", host), zap.Int("port", port))
		return
	}
	c.log.Info("egress refused", zap.String("method", method), zap.String("host", host), zap.Int("port", port),
		zap.Int("status", r.status), zap.String("reason", r.msg))
}

// check decides whether host:port may be reached on one of ports and returns the address to dial.
// It resolves host once, here: the address it checked is the one dialled, so a name that
// resolves elsewhere the next time (DNS rebinding) changes nothing.
func (c *session) check(ctx context.Context, host string, port int, ports []int) (netip.Addr, *refusal) {
	switch {
	case !c.p.Open():
		return netip.Addr{}, refuse(http.StatusForbidden, "this container has no network access (its network_policy is disabled)")
	case c.s.opts.MaxBytesIn > 0 && c.in.Load() >= c.s.opts.MaxBytesIn:
		return netip.Addr{}, refuse(http.StatusTooManyRequests, "this container has received its %d bytes from the internet", c.s.opts.MaxBytesIn)
	case c.s.opts.MaxBytesOut > 0 && c.out.Load() >= c.s.opts.MaxBytesOut:
		return netip.Addr{}, refuse(http.StatusTooManyRequests, "this container has sent its %d bytes to the internet", c.s.opts.MaxBytesOut)
	}
	if _, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return netip.Addr{}, refuse(http.StatusForbidden, "%s is an IP address: only domain names are allowed", host)
	}
	if !c.p.Allows(host) {
		return netip.Addr{}, refuse(http.StatusForbidden, "%s is not in this container's allowed domains", host)
	}
	if !containsPort(ports, port) {
		return netip.Addr{}, refuse(http.StatusForbidden, "port %d is not open for this kind of request (allowed: %s)", port, portList(ports))
	}
	rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	addrs, err := c.s.opts.Resolver.LookupNetIP(rctx, "ip", Canonical(host))
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return netip.Addr{}, refuse(http.StatusBadGateway, "%s does not resolve", host)
		}
		return netip.Addr{}, refuse(http.StatusBadGateway, "cannot resolve %s", host)
	}
	for _, a := range addrs {
		a = a.Unmap()
		if c.s.opts.AllowPrivate || Public(a) {
			return a, nil
		}
	}
	if len(addrs) == 0 {
		return netip.Addr{}, refuse(http.StatusBadGateway, "%s has no address", host)
	}
	return netip.Addr{}, refuse(http.StatusForbidden, "%s resolves to %s, a private address, which this proxy refuses", host, addrs[0].Unmap())
}

func (c *session) dial(ctx context.Context, a netip.Addr, port int) (net.Conn, *refusal) {
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	conn, err := c.s.opts.Dial(dctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
	if err != nil {
		return nil, refuse(http.StatusBadGateway, "cannot connect to %s", netip.AddrPortFrom(a, uint16(port)))
	}
	return conn, nil
}

// forward relays one plain-HTTP request (absolute URL) and reports whether the client's
// connection may carry another.
func (c *session) forward(ctx context.Context, conn net.Conn, br *bufio.Reader, req *http.Request) bool {
	defer req.Body.Close()
	if req.URL.Scheme != "http" || req.URL.Host == "" {
		r := refuse(http.StatusBadRequest, "send an absolute http:// URL, or CONNECT for https")
		c.decide(req.Method, req.URL.Host, 0, r)
		r.write(conn)
		return false
	}
	host, port, ok := splitHostPort(req.URL.Host, 80)
	if !ok {
		r := refuse(http.StatusBadRequest, "%q is not a host and port", req.URL.Host)
		c.decide(req.Method, req.URL.Host, 0, r)
		r.write(conn)
		return false
	}
	addr, r := c.check(ctx, host, port, c.s.opts.HTTPPorts)
	var up net.Conn
	if r == nil {
		up, r = c.dial(ctx, addr, port)
	}
	c.decide(req.Method, host, port, r)
	if r != nil {
		r.write(conn)
		return false
	}
	defer up.Close()
	stop := context.AfterFunc(ctx, func() { up.Close() })
	defer stop()
	keep := !req.Close && req.ProtoAtLeast(1, 1)
	// The Host the server sees is the one that was checked, whatever the header said.
	req.Host = req.URL.Host
	prepare(req)
	req.Close = true // one upstream connection per request: each is checked anew
	if err := req.Write(&quotaWriter{w: up, n: &c.out, max: c.s.opts.MaxBytesOut}); err != nil {
		c.quotaNote(err)
		refuse(http.StatusBadGateway, "sending the request to %s failed", host).write(conn)
		return false
	}
	resp, err := newReader(up).response(req)
	if err != nil {
		refuse(http.StatusBadGateway, "%s did not answer with HTTP", host).write(conn)
		return false
	}
	defer resp.Body.Close()
	return c.relay(conn, resp, keep)
}

// reader reads what a server sends: heads bounded as a request's are, bodies unbounded (the
// quotas count them).
type reader struct {
	head *io.LimitedReader
	br   *bufio.Reader
}

func newReader(r io.Reader) *reader {
	head := &io.LimitedReader{R: r, N: 1 << 62}
	return &reader{head: head, br: bufio.NewReader(head)}
}

// response reads the server's response to req.
func (r *reader) response(req *http.Request) (*http.Response, error) {
	r.head.N = maxHead
	resp, err := http.ReadResponse(r.br, req)
	r.head.N = 1 << 62
	return resp, err
}

// relay writes resp to the client and reports whether the connection may carry another request.
func (c *session) relay(w io.Writer, resp *http.Response, keep bool) bool {
	keep = keep && (resp.ContentLength >= 0 || isChunked(resp.TransferEncoding))
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	resp.Close = !keep
	removeHopHeaders(resp.Header)
	if err := resp.Write(&quotaWriter{w: w, n: &c.in, max: c.s.opts.MaxBytesIn}); err != nil {
		c.quotaNote(err)
		return false
	}
	return keep
}

// connect answers a CONNECT: after the checks, a tunnel to the checked address, or, for a domain
// with secrets, the proxy's own TLS on both sides (intercept).
func (c *session) connect(ctx context.Context, conn net.Conn, br *bufio.Reader, req *http.Request) {
	host, port, ok := splitHostPort(req.RequestURI, -1)
	if !ok {
		r := refuse(http.StatusBadRequest, "CONNECT needs host:port, not %q", req.RequestURI)
		c.decide(req.Method, req.RequestURI, 0, r)
		r.write(conn)
		return
	}
	addr, r := c.check(ctx, host, port, c.s.opts.TLSPorts)
	var up net.Conn
	if r == nil {
		up, r = c.dial(ctx, addr, port)
	}
	c.decide(req.Method, host, port, r)
	if r != nil {
		r.write(conn)
		return
	}
	defer up.Close()
	stop := context.AfterFunc(ctx, func() { up.Close() })
	defer stop()
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	if secrets := c.p.SecretsFor(host); len(secrets) > 0 {
		c.intercept(ctx, conn, br, up, Canonical(host), secrets)
		return
	}
	conn.SetReadDeadline(time.Now().Add(handshakeTimeout))
	hello, sni, err := peekHello(br)
	conn.SetReadDeadline(time.Time{})
	if err != nil || Canonical(sni) != Canonical(host) {
		reason := fmt.Sprintf("the TLS server name %q is not the CONNECT host", sni)
		if err != nil {
			reason = "the tunnel did not start with a TLS ClientHello naming the CONNECT host"
		}
		c.log.Info("egress refused", zap.String("method", "CONNECT"), zap.String("host", host), zap.Int("port", port), zap.String("reason", reason))
		return
	}
	if _, err := up.Write(hello); err != nil {
		return
	}
	c.out.Add(int64(len(hello)))
	c.pipe(conn, br, up)
}

// pipe copies both ways until both sides are done, counting against the quotas.
func (c *session) pipe(client net.Conn, clientR io.Reader, up net.Conn) {
	done := make(chan struct{}, 2)
	go func() {
		_, err := io.Copy(&quotaWriter{w: up, n: &c.out, max: c.s.opts.MaxBytesOut}, clientR)
		c.quotaNote(err)
		closeWrite(up, err)
		done <- struct{}{}
	}()
	_, err := io.Copy(&quotaWriter{w: client, n: &c.in, max: c.s.opts.MaxBytesIn}, up)
	c.quotaNote(err)
	closeWrite(client, err)
	<-done
}

// closeWrite ends one direction: a half-close after a clean end, the whole connection otherwise.
func closeWrite(conn net.Conn, err error) {
	if cw, ok := conn.(interface{ CloseWrite() error }); ok && err == nil {
		cw.CloseWrite()
		return
	}
	conn.Close()
}

// errQuota ends a transfer past a container's byte quota.
var errQuota = errors.New("egress byte quota spent")

func (c *session) quotaNote(err error) {
	if errors.Is(err, errQuota) && c.logged.CompareAndSwap(false, true) {
		c.log.Warn("egress quota spent", zap.Int64("bytes_in", c.in.Load()), zap.Int64("bytes_out", c.out.Load()))
	}
}

// quotaWriter counts what it writes into n and fails once n would pass max (0: no bound).
type quotaWriter struct {
	w   io.Writer
	n   *atomic.Int64
	max int64
}

func (q *quotaWriter) Write(b []byte) (int, error) {
	if n := q.n.Add(int64(len(b))); q.max > 0 && n > q.max {
		return 0, errQuota
	}
	return q.w.Write(b)
}

// prepare readies a request read from a sandbox for its server: no proxy or hop-by-hop headers,
// and no Expect (the proxy relays one response per request).
func prepare(req *http.Request) {
	req.RequestURI = ""
	req.Header.Del("Proxy-Authorization")
	req.Header.Del("Expect")
	removeHopHeaders(req.Header)
}

// removeHopHeaders drops the headers that describe one connection, not the message (RFC 9110 §7.6.1).
func removeHopHeaders(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range []string{"Connection", "Proxy-Connection", "Keep-Alive", "Te", "Trailer", "Upgrade"} {
		h.Del(name)
	}
}

func isChunked(te []string) bool { return len(te) > 0 && te[0] == "chunked" }

// splitHostPort splits "host:port" ("[v6]:port" too); without a port, def is used unless it is
// negative.
func splitHostPort(hostport string, def int) (string, int, bool) {
	host, portStr, err := net.SplitHostPort(hostport)
	if err != nil {
		if def < 0 || strings.Contains(strings.Trim(hostport, "[]"), ":") && !strings.HasPrefix(hostport, "[") {
			return "", 0, false
		}
		return strings.Trim(hostport, "[]"), def, hostport != ""
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 || host == "" {
		return "", 0, false
	}
	return host, port, true
}

func containsPort(ports []int, p int) bool {
	for _, x := range ports {
		if x == p {
			return true
		}
	}
	return false
}

func portList(ports []int) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ", ")
}

// nonPublic are the ranges, beyond what netip's predicates name, that no name on the internet
// should resolve to: "this network", carrier-grade NAT (where some clouds keep their metadata
// service), IETF protocol assignments, benchmarking, reserved and broadcast, and the
// documentation ranges.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("100::/64"),
	netip.MustParsePrefix("2001:db8::/32"),
}

// Public reports whether a is an address on the public internet: not loopback, private,
// link-local (cloud metadata at 169.254.169.254), multicast, unspecified or reserved, and, for
// the IPv6 forms that carry an IPv4 address (NAT64 64:ff9b::/96, 6to4 2002::/16), not carrying a
// non-public one.
func Public(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	if a.Is6() {
		b := a.As16()
		switch {
		case netip.MustParsePrefix("64:ff9b::/96").Contains(a):
			return Public(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
		case netip.MustParsePrefix("2002::/16").Contains(a):
			return Public(netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}))
		}
	}
	return true
}
