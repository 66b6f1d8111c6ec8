package router

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/config"
)

// chunkedReader hides its length, so the client sends the body chunked, without Content-Length.
type chunkedReader struct{ io.Reader }

func TestBodyLimit(t *testing.T) {
	up := newUpstream(t, nil)
	p := newProxy(t, testConfig(up.URL+"/v1", func(c *config.Config) { c.General.MaxRequestBodySize = 200 }))
	small := `{"model":"gpt-test","input":"hi"}`
	big := `{"model":"gpt-test","input":"` + strings.Repeat("x", 300) + `"}`

	cases := []struct {
		name    string
		path    string
		body    string
		chunked bool
		want    int
	}{
		{"under the limit passes", "/v1/responses", small, false, http.StatusOK},
		{"declared length over the limit is refused", "/v1/responses", big, false, http.StatusRequestEntityTooLarge},
		{"chunked body over the limit is refused", "/v1/chat/completions", big, true, http.StatusRequestEntityTooLarge},
		{"chunked body under the limit passes", "/v1/chat/completions", small, true, http.StatusOK},
		{"limit applies without the v1 prefix", "/embeddings", big, true, http.StatusRequestEntityTooLarge},
		{"limit applies to id routes", "/v1/responses/resp_1/cancel", big, true, http.StatusRequestEntityTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader = strings.NewReader(tc.body)
			if tc.chunked {
				body = chunkedReader{body}
			}
			req, _ := http.NewRequest(http.MethodPost, p.URL+tc.path, body)
			resp, err := p.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.want {
				t.Fatalf("POST %s (%d bytes) = %d %s; want %d", tc.path, len(tc.body), resp.StatusCode, b, tc.want)
			}
			if tc.want == http.StatusRequestEntityTooLarge {
				_, typ, _, code := decodeError(t, b)
				if typ != "invalid_request_error" || code != "request_too_large" {
					t.Errorf("413 body = %s; want invalid_request_error/request_too_large", b)
				}
			}
		})
	}
	for _, r := range up.requests() {
		if len(r.Body) > 200 {
			t.Errorf("upstream received a %d-byte body over the limit at %s", len(r.Body), r.Path)
		}
	}
}

// TestBodyReadDeadline checks that a client that sends its headers and then stalls in the body is
// answered 408 once the body read timeout passes, instead of holding the connection.
func TestBodyReadDeadline(t *testing.T) {
	up := newUpstream(t, nil)
	p := newProxy(t, testConfig(up.URL+"/v1"), func(o *Options) { o.BodyReadTimeout = 200 * time.Millisecond })
	conn, err := net.Dial("tcp", p.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // the test's own guard
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer to a stalled body: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("stalled body = %d %s; want 408", resp.StatusCode, body)
	}
	decodeError(t, body)
	if n := len(up.requests()); n != 0 {
		t.Errorf("upstream got %d requests for an unfinished body", n)
	}
}

// TestUnreadBodyDeadline: a request answered without its body being read (no key, an unknown
// route, a refused method) must not let the client hold the connection by trickling that body:
// net/http reads up to 256 KiB of it before sending the answer, so without a deadline the 401
// waits on the client forever. The answer comes once the body read timeout passes.
func TestUnreadBodyDeadline(t *testing.T) {
	up := newUpstream(t, nil)
	cfg := testConfig(up.URL+"/v1", func(c *config.Config) { c.General.MasterKey = "sk-master" })
	p := newProxy(t, cfg, func(o *Options) { o.BodyReadTimeout = 200 * time.Millisecond })
	for _, tc := range []struct {
		name, head string
		want       int
	}{
		{"no key, chunked", "POST /v1/responses HTTP/1.1\r\nHost: proxy\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n", http.StatusUnauthorized},
		{"no key, declared length", "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Length: 100000\r\n\r\n{", http.StatusUnauthorized},
		{"unknown route", "POST /v1/nowhere HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer sk-master\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n", http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", p.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, tc.head); err != nil {
				t.Fatal(err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // the test's own guard
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer while the body trickles: %v", err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d %s; want %d", resp.StatusCode, body, tc.want)
			}
			decodeError(t, body)
		})
	}
	if n := len(up.requests()); n != 0 {
		t.Errorf("upstream got %d requests", n)
	}
}
