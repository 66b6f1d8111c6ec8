package peer

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// ErrGone: nothing listens at the replica's address any more (the connection was refused before
// anything was sent). Forward ends its lease when it finds this, and the caller serves the request
// itself: the container it was for is gone with that replica.
var ErrGone = errors.New("peer: the replica is gone")

// UnreachableError: the replica could not be reached, or broke off before answering. Nothing was
// written to the client; the request may succeed if retried.
type UnreachableError struct {
	Host string
	Err  error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("peer: replica %s is unreachable: %v", e.Host, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// dialTimeout bounds connecting to a peer: within one cluster a connection is made in
// milliseconds or not at all.
const dialTimeout = 3 * time.Second

// forwarder sends requests to peers. It holds the connections to them.
type forwarder struct {
	transport *http.Transport
	log       *zap.Logger
}

func newForwarder(log *zap.Logger) *forwarder {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	t.MaxIdleConnsPerHost = 64
	// The peer's answer is the client's answer as it comes: no compression negotiated on the way.
	t.DisableCompression = true
	return &forwarder{transport: t, log: log}
}

// Forward sends r to the replica at host and streams its answer to w as it comes (each write
// flushed, so server-sent events stay live): the client sees what that replica sent. body is the
// request body when the caller has read it already; nil streams r.Body. requestID goes along, so
// that both replicas log the request under one id. secret signs the request (HeaderForwarded).
//
// Errors mean nothing was written: ErrGone (the caller serves the request itself), or an
// *UnreachableError. A failure after the answer started ends the answer where it broke.
func (p *Peers) Forward(w http.ResponseWriter, r *http.Request, host, secret, requestID string, body []byte) error {
	if secret == "" {
		return &UnreachableError{Host: host, Err: errNoSecret}
	}
	target, err := url.Parse(host)
	if err != nil {
		return &UnreachableError{Host: host, Err: err}
	}
	var proxyErr error
	rw := &trackingWriter{ResponseWriter: w}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
			if body != nil {
				pr.Out.Body = io.NopCloser(bytes.NewReader(body))
				pr.Out.ContentLength = int64(len(body))
				pr.Out.Header.Set("Content-Length", strconv.Itoa(len(body)))
			} else if pr.In.Body != nil && pr.In.Body != http.NoBody {
				// The transport closes the body it was given on every path; the caller may still
				// need the client's (to serve the request itself when the peer is gone).
				pr.Out.Body = io.NopCloser(pr.In.Body)
			}
			pr.Out.Header.Set(HeaderForwarded, Sign(secret, pr.In.Method, pr.In.URL.RequestURI(), time.Now()))
			if requestID != "" {
				pr.Out.Header.Set("X-Request-Id", requestID)
			}
		},
		Transport:     p.fwd.transport,
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			// The client already has this replica's X-Request-Id (the same id).
			resp.Header.Del("X-Request-Id")
			return nil
		},
		ErrorHandler: func(_ http.ResponseWriter, _ *http.Request, err error) { proxyErr = err },
		ErrorLog:     zap.NewStdLog(p.log.Named("forward")),
	}
	rp.ServeHTTP(rw, r)
	switch {
	case proxyErr == nil:
		return nil
	case rw.wrote:
		p.log.Warn("a forwarded answer broke off", zap.String("replica", host), zap.Error(proxyErr))
		return nil
	case errors.Is(proxyErr, context.Canceled) && r.Context().Err() != nil:
		return r.Context().Err()
	case errors.Is(proxyErr, syscall.ECONNREFUSED), refuses(r.Context(), target):
		// A replica killed while a kept-alive connection to it sat idle resets that connection
		// when the request is written on it: only a fresh dial tells that nothing listens.
		p.gone(context.WithoutCancel(r.Context()), host)
		return ErrGone
	}
	return &UnreachableError{Host: host, Err: proxyErr}
}

// refuses reports whether a new connection to the replica at u is refused: nothing listens there.
func refuses(ctx context.Context, u *url.URL) bool {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	c, err := (&net.Dialer{Timeout: dialTimeout}).DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return errors.Is(err, syscall.ECONNREFUSED)
	}
	_ = c.Close()
	return false
}

// trackingWriter records whether anything reached the client.
type trackingWriter struct {
	http.ResponseWriter
	wrote bool
}

func (t *trackingWriter) WriteHeader(code int) {
	if code >= 200 {
		t.wrote = true
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *trackingWriter) Write(b []byte) (int, error) {
	t.wrote = true
	return t.ResponseWriter.Write(b)
}

// Flush and Unwrap let the reverse proxy flush every event through to the client.
func (t *trackingWriter) Flush() {
	if f, ok := t.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// probeTimeout bounds a probe: a replica answers /healthz at once.
const probeTimeout = 2 * time.Second

// probe asks the replica at host to prove that it is one of this deployment's (HeaderProbe).
func (p *Peers) probe(ctx context.Context, host string) bool {
	secret := ""
	if p.secret != nil {
		secret = p.secret()
	}
	if secret == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, host+"/healthz", nil)
	if err != nil {
		return false
	}
	nonce := randomNonce()
	req.Header.Set(HeaderProbe, nonce)
	resp, err := p.fwd.transport.RoundTrip(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	_ = resp.Body.Close()
	return hmac.Equal([]byte(resp.Header.Get(HeaderPeer)), []byte(ProbeAnswer(secret, host, nonce)))
}

func randomNonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
