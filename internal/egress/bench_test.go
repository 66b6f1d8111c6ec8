package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the CPU the process has used, user and system: the client, the origin and the
// proxy all run in it, so the difference between a case and the direct one is the proxy's.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchClients returns a client that goes to the origin directly, one through a tunnel and one
// through the proxy's interception with a secret, each on a new connection per request (as a
// sandbox's curl or pip makes them), trusting the test's roots and the proxy's authority.
func benchClients(b *testing.B, body string) (o *origin, direct, tunnel, secret *http.Client) {
	roots := newPKI(b)
	cert := roots.Issue(b, "plain.test", "secret.test")
	o = newOrigin(b, "tcp4", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Authorization"), "$") {
			http.Error(w, "placeholder not substituted", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, body)
	}), &cert)
	res := newResolver()
	res.set("plain.test", "127.0.0.1")
	res.set("secret.test", "127.0.0.1")
	p := startProxy(b, Options{Resolver: res, RootCAs: roots.Pool, AllowPrivate: true, TLSPorts: []int{o.port}},
		Policy{Domains: []string{"plain.test", "secret.test"}, Secrets: []Secret{{Domain: "secret.test", Name: "KEY", Value: "value"}}})
	through := p.client(b, roots)
	pool := x509.NewCertPool()
	pool.AddCert(roots.Cert)
	port := o.port
	// Directly: the names resolve as the proxy's resolver has them.
	direct = &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, hostPort("127.0.0.1", port))
		},
	}}
	return o, direct, through, through
}

func BenchmarkHTTPS(b *testing.B) {
	o, direct, tunnel, secret := benchClients(b, "ok")
	cases := []struct {
		name   string
		c      *http.Client
		host   string
		header string
	}{
		{"direct", direct, "plain.test", ""},
		{"tunnel", tunnel, "plain.test", ""},
		{"secret", secret, "secret.test", "Bearer $KEY"},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			url := "https://" + hostPort(bc.host, o.port) + "/"
			start := cpuTime()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				if bc.header != "" {
					req.Header.Set("Authorization", bc.header)
				}
				resp, err := bc.c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatal(resp.Status)
				}
			}
			b.ReportMetric(float64((cpuTime()-start).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// BenchmarkDownload is one 64 MiB download over https, directly and through a tunnel.
func BenchmarkDownload(b *testing.B) {
	const size = 64 << 20
	o, direct, tunnel, _ := benchClients(b, strings.Repeat("0123456789abcdef", size/16))
	for _, bc := range []struct {
		name string
		c    *http.Client
	}{{"direct", direct}, {"tunnel", tunnel}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(size)
			start := cpuTime()
			for b.Loop() {
				resp, err := bc.c.Get("https://" + hostPort("plain.test", o.port) + "/")
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if n != size {
					b.Fatalf("%d bytes", n)
				}
			}
			b.ReportMetric(float64((cpuTime()-start).Milliseconds())/float64(b.N), "cpu-ms/op")
		})
	}
}
