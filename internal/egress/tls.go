package egress

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

const (
	caLife      = 10 * 365 * 24 * time.Hour
	leafLife    = 7 * 24 * time.Hour
	leafRenewal = 24 * time.Hour // a cached certificate this close to its end is made anew
	maxLeaves   = 1024           // certificates cached; past it the cache starts again
)

// authority is a server's own certificate authority. Its key never leaves the process: a
// sandbox gets the certificate alone, so it can trust what the proxy shows it for a domain
// with secrets and forge nothing.
type authority struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	leafKey *ecdsa.PrivateKey // one key for every leaf: minting stays cheap
	pem     []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

func newAuthority() (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "ciproxy egress CA", Organization: []string{"ciproxy"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caLife),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &authority{
		cert: cert, key: key, leafKey: leafKey,
		pem:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		leaves: map[string]*tls.Certificate{},
	}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// leaf returns a certificate for host signed by the authority.
func (a *authority) leaf(host string) (*tls.Certificate, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c, ok := a.leaves[host]; ok && time.Until(c.Leaf.NotAfter) > leafRenewal {
		return c, nil
	}
	if len(a.leaves) >= maxLeaves {
		clear(a.leaves)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafLife),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &a.leafKey.PublicKey, a.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, a.cert.Raw}, PrivateKey: a.leafKey, Leaf: leaf}
	a.leaves[host] = c
	return c, nil
}

// errHelloRead stops the handshake peekHello starts once the ClientHello is read.
var errHelloRead = errors.New("client hello read")

// peekHello reads a TLS ClientHello from r and returns the bytes it read (to be sent on to the
// server unchanged) and the server name the hello asks for.
func peekHello(r io.Reader) ([]byte, string, error) {
	rec := &helloConn{r: r}
	var name string
	read := false
	err := tls.Server(rec, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		name, read = h.ServerName, true
		return nil, errHelloRead
	}}).Handshake()
	if !read {
		return nil, "", fmt.Errorf("reading a TLS ClientHello: %w", err)
	}
	return rec.buf, name, nil
}

// helloConn records what a TLS server reads and swallows what it writes (the alert it sends
// when peekHello stops it), so that the client sees nothing of the peek.
type helloConn struct {
	r   io.Reader
	buf []byte
}

func (c *helloConn) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.buf = append(c.buf, b[:n]...)
	return n, err
}
func (c *helloConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *helloConn) Close() error                     { return nil }
func (c *helloConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *helloConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *helloConn) SetDeadline(time.Time) error      { return nil }
func (c *helloConn) SetReadDeadline(time.Time) error  { return nil }
func (c *helloConn) SetWriteDeadline(time.Time) error { return nil }

// readerConn is a connection whose reads come through r (which buffered some of them).
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c *readerConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// intercept serves a CONNECT to a domain with secrets: TLS to the sandbox with a certificate of
// the proxy's authority, TLS to the server verified as any client would, and between them each
// request read, its headers' $NAME placeholders replaced by the secrets' values, and sent on.
func (c *session) intercept(ctx context.Context, conn net.Conn, br *bufio.Reader, up net.Conn, host string, secrets []Secret) {
	refused := func(reason string) {
		c.log.Info("egress refused", zap.String("method", "CONNECT"), zap.String("host", host), zap.String("reason", reason))
	}
	leaf, err := c.s.ca.leaf(host)
	if err != nil {
		refused("minting a certificate failed")
		return
	}
	client := tls.Server(&readerConn{Conn: conn, r: br}, &tls.Config{
		Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12,
	})
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	err = client.HandshakeContext(hctx)
	cancel()
	if err != nil {
		refused("the sandbox's TLS handshake failed")
		return
	}
	if sni := client.ConnectionState().ServerName; Canonical(sni) != host {
		refused(fmt.Sprintf("the TLS server name %q is not the CONNECT host", sni))
		return
	}
	server := tls.Client(up, &tls.Config{
		ServerName: host, RootCAs: c.s.opts.RootCAs, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12,
	})
	hctx, cancel = context.WithTimeout(ctx, handshakeTimeout)
	err = server.HandshakeContext(hctx)
	cancel()
	if err != nil {
		// The reason may name the certificate; it names no secret.
		r := refuse(http.StatusBadGateway, "TLS to %s failed: %v", host, err)
		refused(r.msg)
		r.write(client)
		return
	}
	head := &io.LimitedReader{R: client}
	cr := bufio.NewReader(head)
	sr := newReader(server)
	for first := true; ; first = false {
		head.N = maxHead
		if first {
			client.SetReadDeadline(time.Now().Add(headTimeout))
		} else {
			client.SetReadDeadline(time.Now().Add(idleTimeout))
		}
		req, err := http.ReadRequest(cr)
		if err != nil {
			return
		}
		client.SetReadDeadline(time.Time{})
		head.N = 1 << 62
		if h, _, ok := splitHostPort(req.Host, 443); !ok || Canonical(h) != host {
			r := refuse(http.StatusForbidden, "the Host header %q is not the CONNECT host %s", req.Host, host)
			c.decide(req.Method, host, 0, r)
			r.write(client)
			return
		}
		keep := !req.Close
		prepare(req)
		n := substitute(req.Header, secrets)
		c.log.Info("egress request", zap.String("method", req.Method), zap.String("host", host), zap.Int("secrets_substituted", n))
		if err := req.Write(&quotaWriter{w: server, n: &c.out, max: c.s.opts.MaxBytesOut}); err != nil {
			c.quotaNote(err)
			return
		}
		req.Body.Close()
		resp, err := sr.response(req)
		if err != nil {
			refuse(http.StatusBadGateway, "%s did not answer with HTTP", host).write(client)
			return
		}
		keep = c.relay(client, resp, keep && !resp.Close)
		resp.Body.Close()
		if !keep {
			return
		}
	}
}

// placeholder is how code names a secret in a header: $NAME or ${NAME}, the name as long as it
// goes (as a shell reads it), so that $API_KEY2 is not $API_KEY followed by 2.
var placeholder = regexp.MustCompile(`\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)`)

// substitute replaces the placeholders of secrets in h's values, in one pass (a value is never
// searched for names), and returns how many values changed. The first secret of a name wins.
func substitute(h http.Header, secrets []Secret) int {
	n := 0
	for k, vs := range h {
		for i, v := range vs {
			if !strings.Contains(v, "$") {
				continue
			}
			w := placeholder.ReplaceAllStringFunc(v, func(m string) string {
				name := strings.Trim(m[1:], "{}")
				for _, s := range secrets {
					if s.Name == name {
						return s.Value
					}
				}
				return m
			})
			if w != v {
				h[k][i] = w
				n++
			}
		}
	}
	return n
}
