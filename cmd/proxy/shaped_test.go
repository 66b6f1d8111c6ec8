package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// TestServerErrorsAreOpenAIShaped: the answers net/http writes itself, before any handler runs,
// reach a raw TCP client as OpenAI-shaped JSON with their status: headers past the limit (431),
// a request that is not HTTP, one without Host, an unsupported transfer encoding. A request that
// is fine is served as ever, on a connection that also carries such a wrapper.
func TestServerErrorsAreOpenAIShaped(t *testing.T) {
	up := newUpstreamServer(t)
	p := start(t, "--config", writeConfig(t, t.TempDir(), configYAML(up.URL, "gpt-a")))
	addr := strings.TrimPrefix(p.url, "http://")
	for _, tc := range []struct {
		name    string
		request string
		status  int
		message string
	}{
		{"headers too large", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 2<<20) + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge, "The request's headers are too large."},
		{"not HTTP", "GARBAGE\r\n\r\n", http.StatusBadRequest, "The request could not be read: it is not valid HTTP."},
		{"no Host", "GET /healthz HTTP/1.1\r\n\r\n", http.StatusBadRequest, "The request could not be read: missing required Host header."},
		{"a header name that is not a token", "GET /healthz HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n", http.StatusBadRequest, "The request could not be read: invalid header name."},
		{"an unsupported transfer encoding", "POST /v1/responses HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", http.StatusNotImplemented, "The request's Transfer-Encoding is not supported."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			// net/http answers a request too large while the client may still be writing it.
			go func() { _, _ = io.WriteString(c, tc.request) }()
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != "application/json" || !gjson.ValidBytes(body) {
				t.Fatalf("answer %d %q %s; want %d and JSON", resp.StatusCode, resp.Header.Get("Content-Type"), body, tc.status)
			}
			e := gjson.GetBytes(body, "error")
			for _, k := range []string{"message", "type", "param", "code"} {
				if !e.Get(k).Exists() {
					t.Errorf("error %s lacks %q", body, k)
				}
			}
			if e.Get("message").String() != tc.message || e.Get("type").String() != "invalid_request_error" {
				t.Errorf("error %s; want message %q, type invalid_request_error", body, tc.message)
			}
		})
	}

	// Two ordinary requests on one connection are answered as ever.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	for range 2 {
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || gjson.GetBytes(body, "status").String() != "ok" {
			t.Fatalf("GET /healthz = %d %s", resp.StatusCode, body)
		}
	}
}
