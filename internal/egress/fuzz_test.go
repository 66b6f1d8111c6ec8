package egress

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// FuzzConnection sends arbitrary bytes from a sandbox to the egress proxy, with an allowed
// domain, one with a secret, and an origin that answers anything: whatever arrives, the proxy
// answers or closes, and returns once the sandbox's side is done; it never panics and never hangs.
func FuzzConnection(f *testing.F) {
	for _, seed := range []string{
		"GET http://ok.test/ HTTP/1.1\r\nHost: ok.test\r\n\r\n",
		"GET http://ok.test/ HTTP/1.1\r\nHost: ok.test\r\n\r\nGET http://ok.test/x HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n",
		"POST http://ok.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"CONNECT ok.test:443 HTTP/1.1\r\n\r\n\x16\x03\x01\x00\x05hello",
		"CONNECT secret.test:443 HTTP/1.1\r\n\r\n\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
		"CONNECT [::1]:443 HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\n\r\n",
		"\x00\xff\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	res := newResolver()
	res.set("ok.test", "127.0.0.1")
	res.set("secret.test", "127.0.0.1")
	core, logs := observer.New(zap.ErrorLevel)
	origin := func(context.Context, string, string) (net.Conn, error) {
		a, b := net.Pipe()
		go func() {
			defer b.Close()
			b.SetDeadline(time.Now().Add(time.Second))
			if _, err := http.ReadRequest(bufio.NewReader(b)); err == nil {
				io.WriteString(b, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
		}()
		return a, nil
	}
	srv, err := New(Options{Resolver: res, Dial: origin, AllowPrivate: true, Log: zap.New(core)})
	if err != nil {
		f.Fatal(err)
	}
	c := &session{s: srv, id: "cntr_fuzz", log: srv.opts.Log, p: Policy{Domains: []string{"ok.test", "secret.test"},
		Secrets: []Secret{{Domain: "secret.test", Name: "KEY", Value: "value"}}}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer l.Close()
	f.Fuzz(func(t *testing.T, in []byte) {
		client, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		conn, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.handle(context.Background(), conn)
		}()
		client.Write(in)
		client.(*net.TCPConn).CloseWrite()
		client.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.Copy(io.Discard, client); err != nil {
			t.Fatalf("the proxy did not close after the input ended: %v", err)
		}
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("the handler did not return")
		}
		if e := logs.TakeAll(); len(e) > 0 {
			t.Fatalf("%s: %v", e[0].Message, e[0].ContextMap())
		}
	})
}
