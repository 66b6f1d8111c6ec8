package router

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"

	"github.com/ciproxy/ciproxy/internal/apierror"
)

// ShapedErrors returns ln with the answers net/http writes on its own, before any handler runs,
// made OpenAI-shaped: a request whose headers pass the server's MaxHeaderBytes (431), one that
// cannot be parsed (400, and the like: a missing Host, an unsupported version or transfer
// encoding). net/http writes those straight to the connection, as plain text, in one write of a
// fixed shape; the connections ln accepts recognise that write and send the same status with an
// OpenAI error body instead. Every other byte passes unchanged.
func ShapedErrors(ln net.Listener) net.Listener { return shapedListener{ln} }

type shapedListener struct{ net.Listener }

func (l shapedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &shapedConn{Conn: c}, nil
}

// shapedConn is one accepted connection.
type shapedConn struct{ net.Conn }

// Write sends b, or the OpenAI-shaped form of b when b is one of net/http's own error answers.
// Such an answer is a whole message in one write with no Date header, which no answer a handler
// writes has (net/http dates them all), and its body repeats its status line: a response body
// could match only by holding the whole of such an answer as raw bytes, alone in one write, and
// would then be replaced by the error it spells.
func (c *shapedConn) Write(b []byte) (int, error) {
	shaped, ok := shapeServerError(b)
	if !ok {
		return c.Conn.Write(b)
	}
	if _, err := c.Conn.Write(shaped); err != nil {
		return 0, err
	}
	return len(b), nil
}

// ReadFrom keeps the kernel's copy (sendfile) for bodies net/http copies from a file.
func (c *shapedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// CloseWrite lets net/http half-close the connection after a 431, as it does on a TCP connection.
func (c *shapedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// serverErrorHeaders are the headers of every error answer net/http writes itself.
const serverErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// shapeServerError returns the OpenAI-shaped form of b when b is one of net/http's own error
// answers: "HTTP/1.1 <code> <reason>[: <text>]" serverErrorHeaders "<body>".
func shapeServerError(b []byte) ([]byte, bool) {
	status, body, ok := bytes.Cut(b, []byte(serverErrorHeaders))
	if !ok {
		return nil, false
	}
	line, ok := bytes.CutPrefix(status, []byte("HTTP/1.1 "))
	if !ok || len(line) < 5 || line[3] != ' ' {
		return nil, false
	}
	code, err := strconv.Atoi(string(line[:3]))
	if err != nil || code < 400 || code > 599 || http.StatusText(code) == "" {
		return nil, false
	}
	reason, detail, _ := bytes.Cut(line[4:], []byte(": "))
	if string(reason) != http.StatusText(code) {
		return nil, false
	}
	// The body repeats the status line (or, for an unsupported transfer encoding, says so).
	if !bytes.Equal(body, line) && string(body) != "Unsupported transfer encoding" {
		return nil, false
	}
	e := &apierror.Error{Status: code, Type: apierror.TypeInvalidRequest}
	switch {
	case code == http.StatusRequestHeaderFieldsTooLarge:
		e.Message, e.Code = "The request's headers are too large.", "request_headers_too_large"
	case string(body) == "Unsupported transfer encoding":
		e.Message = "The request's Transfer-Encoding is not supported."
	case len(detail) > 0:
		e.Message = "The request could not be read: " + string(detail) + "."
	default:
		e.Message = "The request could not be read: it is not valid HTTP."
	}
	js := e.JSON()
	out := make([]byte, 0, 160+len(js))
	out = append(out, "HTTP/1.1 "...)
	out = strconv.AppendInt(out, int64(code), 10)
	out = append(out, ' ')
	out = append(out, http.StatusText(code)...)
	out = append(out, "\r\nContent-Type: application/json\r\nContent-Length: "...)
	out = strconv.AppendInt(out, int64(len(js)), 10)
	out = append(out, "\r\nConnection: close\r\n\r\n"...)
	return append(out, js...), true
}
