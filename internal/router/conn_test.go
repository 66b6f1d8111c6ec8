package router

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// TestShapeServerError: net/http's own error answers, as it writes them, become OpenAI-shaped;
// nothing else is touched, however close.
func TestShapeServerError(t *testing.T) {
	const h = serverErrorHeaders
	for _, tc := range []struct {
		name    string
		in      string
		status  string // "" for untouched
		message string
	}{
		{"431", "HTTP/1.1 431 Request Header Fields Too Large" + h + "431 Request Header Fields Too Large", "HTTP/1.1 431 Request Header Fields Too Large", "The request's headers are too large."},
		{"400", "HTTP/1.1 400 Bad Request" + h + "400 Bad Request", "HTTP/1.1 400 Bad Request", "The request could not be read: it is not valid HTTP."},
		{"400 with its reason", "HTTP/1.1 400 Bad Request: malformed Host header" + h + "400 Bad Request: malformed Host header", "HTTP/1.1 400 Bad Request", "The request could not be read: malformed Host header."},
		{"505", "HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version" + h + "505 HTTP Version Not Supported: unsupported protocol version", "HTTP/1.1 505 HTTP Version Not Supported", "The request could not be read: unsupported protocol version."},
		{"501", "HTTP/1.1 501 Not Implemented" + h + "Unsupported transfer encoding", "HTTP/1.1 501 Not Implemented", "The request's Transfer-Encoding is not supported."},
		{"a handler's answer (dated)", "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nConnection: close\r\n\r\n400 Bad Request", "", ""},
		{"a body that is not the status", "HTTP/1.1 400 Bad Request" + h + "something else", "", ""},
		{"a success", "HTTP/1.1 200 OK" + h + "200 OK", "", ""},
		{"a wrong reason", "HTTP/1.1 400 Nope" + h + "400 Nope", "", ""},
		{"only a part", "HTTP/1.1 400 Bad Request" + h, "", ""},
		{"a body chunk", "5\r\nhello\r\n", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, ok := shapeServerError([]byte(tc.in))
			if ok != (tc.status != "") {
				t.Fatalf("shaped = %v; want %v", ok, tc.status != "")
			}
			if !ok {
				return
			}
			head, body, _ := strings.Cut(string(out), "\r\n\r\n")
			if !strings.HasPrefix(head, tc.status+"\r\n") || !strings.Contains(head, "Content-Type: application/json") || !strings.Contains(head, "Connection: close") {
				t.Errorf("head %q; want status %q, JSON, close", head, tc.status)
			}
			if msg := gjson.Get(body, "error.message").String(); msg != tc.message || !gjson.Get(body, "error.param").Exists() {
				t.Errorf("body %s; want message %q", body, tc.message)
			}
		})
	}
}
