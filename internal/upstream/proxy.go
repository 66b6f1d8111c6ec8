package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httputil"
	"strings"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
)

// StatusClientClosedRequest is the status recorded when the client went away before the upstream
// answered (nginx's 499). The client never sees it; it is for access logs.
const StatusClientClosedRequest = 499

// Proxy passes r through to the target's deployments and copies the answer to w: status, headers
// and body bytes as the upstream sent them, server-sent events flushed one by one.
//
// body is what the client sent (r.Body, already read by the caller, is not used). For each attempt
// the body is DeploymentBody's: the top-level "model" of a JSON-object body becomes the
// deployment's UpstreamModel and its default request params fill what the client did not set,
// every other byte kept; any other body is sent as it is. The URL is the deployment's api_base
// joined with r.URL.Path minus a leading "/v1" (api_base already names the version), plus r's
// query; for Azure, the path and api-version Azure expects (endpointURL).
//
// Request headers lose what httputil.ReverseProxy removes (hop-by-hop, X-Forwarded-*, Forwarded)
// and every client credential (see Post); the deployment's extra headers are added and its key
// carried as Post carries it. The client's
// Accept-Encoding is kept, so a compressed upstream body passes through byte-identical. Response
// headers lose hop-by-hop headers and those that would bind the proxy's own origin to the upstream's
// choices (Set-Cookie, Alt-Svc, Strict-Transport-Security).
//
// Failover, retries and timeouts follow Post's rules; nothing reaches the client before a
// deployment has answered. Errors before the answer are written as OpenAI-shaped errors (502; 504
// when a deadline passed; 501 when no deployment of the model can be called). The headers wait
// for the first body byte, so an upstream that stalls from the start past its
// stream_idle_timeout is a 504 upstream_timeout too; an event stream that stalls later ends with
// an error event (see awaitBody).
// When the client disconnects, the upstream request is canceled and nothing is logged as a failure;
// after the headers are sent, a broken stream aborts the handler with http.ErrAbortHandler, which
// net/http (and the router's recoverer) treat as a silent abort.
func (t *Target) Proxy(w http.ResponseWriter, r *http.Request, body []byte) {
	t.proxy(w, r, Streamed{JSON: body}, nil)
}

// ProxyStreamed is Proxy for a body whose holes are read as it is sent, for each attempt.
func (t *Target) ProxyStreamed(w http.ResponseWriter, r *http.Request, body Streamed) {
	t.proxy(w, r, body, nil)
}

// NoteID is told the id of a response an upstream created (ProxyResponses). ctx is the request's.
type NoteID func(ctx context.Context, id string) error

// ProxyResponses is ProxyStreamed for POST /v1/responses, telling note the id of the response the
// upstream created: the top-level "id" of a JSON answer, or the "response.id" of the first event
// of a stream that has one, in a 2xx answer. note runs before any byte of the answer reaches the
// client, so no client can name the id before note has returned; an error from note (the id could
// not be recorded) is written instead of the answer, as an *apierror.Error or a 502. To read the
// id the answer must be plain, so the upstream is not asked for compression (the transport
// negotiates and undoes it itself). An answer whose id is not within its first 64 KiB is passed
// on without note.
func (t *Target) ProxyResponses(w http.ResponseWriter, r *http.Request, body Streamed, note NoteID) {
	t.proxy(w, r, body, note)
}

func (t *Target) proxy(w http.ResponseWriter, r *http.Request, body Streamed, note NoteID) {
	modify := func(resp *http.Response) error {
		modifyResponse(resp)
		if err := awaitBody(resp, r.URL.Path); err != nil {
			return err
		}
		if note != nil {
			return noteResponseID(resp, note)
		}
		return nil
	}
	rp := &httputil.ReverseProxy{
		Rewrite:        rewriteOutbound,
		Transport:      &failoverTransport{t: t, path: trimVersion(r.URL.Path), body: body},
		ModifyResponse: modify,
		ErrorHandler:   t.writeError,
		ErrorLog:       t.c.errorLog,
		BufferPool:     &t.c.buffers,
	}
	if note != nil {
		rp.Rewrite = func(pr *httputil.ProxyRequest) {
			rewriteOutbound(pr)
			pr.Out.Header.Del("Accept-Encoding")
		}
	}
	rp.ServeHTTP(w, r)
}

// rewriteOutbound is the ReverseProxy Rewrite hook: the outbound request keeps no client
// credential. URL, Host and body are set by failoverTransport for each deployment it tries.
func rewriteOutbound(pr *httputil.ProxyRequest) {
	dropClientHeaders(pr.Out.Header)
}

// maxIDPrefix bounds what noteResponseID reads of an answer to find its id. OpenAI's Response
// names its id first, and its stream's first event names it in its first hundred bytes.
const maxIDPrefix = 64 << 10

// noteResponseID reads resp's body until it finds the id of the response (see ProxyResponses),
// tells note, and leaves resp.Body yielding every byte as the upstream sent it.
func noteResponseID(resp *http.Response, note NoteID) error {
	if resp.StatusCode/100 != 2 {
		return nil
	}
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	var (
		buf     []byte
		id      string
		readErr error
	)
	chunk := make([]byte, 1<<10) // the id is in the first hundred bytes
	for len(buf) < maxIDPrefix {
		var n int
		n, readErr = resp.Body.Read(chunk)
		buf = append(buf, chunk[:n]...)
		var done bool
		if id, done = responseID(buf, sse, readErr != nil); done || readErr != nil {
			break
		}
	}
	rest := resp.Body
	if readErr != nil {
		rest = io.NopCloser(errReader{readErr})
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(buf), rest), resp.Body}
	if id == "" {
		return nil
	}
	if err := note(resp.Request.Context(), id); err != nil {
		_ = resp.Body.Close()
		return err
	}
	return nil
}

// errReader fails every read with err (io.EOF: it is empty).
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// responseID finds the response id in prefix, the start of an answer (all of it when ended): done
// reports that reading more would not change the answer ("" for no id). A JSON answer's id is its
// top-level "id"; a stream's, the "response.id" of the first data line that has one. gjson reads
// a prefix safely: a value the prefix cuts short is not found.
func responseID(prefix []byte, sse, ended bool) (id string, done bool) {
	if !sse {
		return prefixString(prefix, "id", ended)
	}
	for line := range bytes.Lines(prefix) {
		complete := ended || bytes.HasSuffix(line, []byte("\n"))
		data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:"))
		if !ok {
			if !complete {
				return "", false
			}
			continue
		}
		if id, done := prefixString(bytes.TrimPrefix(data, []byte(" ")), "response.id", complete); id != "" || !done {
			return id, done
		}
	}
	return "", ended
}

// prefixString is the string at path in the JSON text whose start is prefix (all of it when
// complete), and whether reading more would not change it.
func prefixString(prefix []byte, path string, complete bool) (string, bool) {
	if !jsondepth.Within(prefix, jsondepth.Max) {
		return "", true // gjson must not recurse through it; such an answer is refused anyway
	}
	if r := gjson.GetBytes(prefix, path); r.Type == gjson.String {
		return r.Str, true
	}
	return "", complete
}

// modifyResponse drops response headers that would apply to the proxy's origin, not the upstream's.
func modifyResponse(resp *http.Response) {
	resp.Header.Del("Set-Cookie")
	resp.Header.Del("Alt-Svc")
	resp.Header.Del("Strict-Transport-Security")
}

// awaitBody reads the first bytes of a pass-through answer before its headers go out, so an
// upstream that stalls from the start (stream_idle_timeout) gets the client a 504
// upstream_timeout rather than a cut answer; the bytes read go out first. An event stream that
// stalls later ends with an error event in its API's format (idleEvent), since its headers are
// gone already; any other answer is cut.
func awaitBody(resp *http.Response, path string) error {
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return nil // ReverseProxy takes the body over as the connection
	}
	b := &passBody{ReadCloser: resp.Body}
	var n int
	var err error
	for range 100 {
		if n, err = resp.Body.Read(b.buf[:]); n > 0 || err != nil {
			break
		}
	}
	var ae *apierror.Error
	if errors.As(err, &ae) {
		return ae
	}
	b.first, b.firstErr = b.buf[:n], err
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" && resp.Header.Get("Content-Encoding") == "" {
		b.path = trimVersion(path)
	}
	resp.Body = b
	return nil
}

// passBody is a pass-through answer whose first bytes were read already.
type passBody struct {
	io.ReadCloser
	first    []byte
	firstErr error
	path     string // the API path of an event stream; "" for any other answer
	tail     []byte // the error event still to send, after the upstream stalled
	ended    bool
	buf      [256]byte
}

func (b *passBody) Read(p []byte) (int, error) {
	switch {
	case len(b.first) > 0:
		n := copy(p, b.first)
		b.first = b.first[n:]
		return n, nil
	case b.firstErr != nil:
		return 0, b.firstErr
	case len(b.tail) > 0:
		n := copy(p, b.tail)
		b.tail = b.tail[n:]
		return n, nil
	case b.ended:
		return 0, io.EOF
	}
	n, err := b.ReadCloser.Read(p)
	var ae *apierror.Error
	if err != nil && b.path != "" && errors.As(err, &ae) && errors.Is(err, ErrUpstreamIdle) {
		b.tail, b.ended = idleEvent(b.path, ae), true
		return n, nil
	}
	return n, err
}

// idleEvent is the event that ends a stream whose upstream stalled: Responses' error event, or
// the error chunk of Chat Completions (and of any other API). It starts with a blank line, which
// ends an event the upstream left open.
func idleEvent(path string, ae *apierror.Error) []byte {
	msg, _ := json.Marshal(ae.Message)
	if path == "/responses" {
		return fmt.Appendf(nil, "\n\nevent: error\ndata: {\"type\":\"error\",\"code\":\"%s\",\"message\":%s,\"param\":null}\n\n", ae.Code, msg)
	}
	return fmt.Appendf(nil, "\n\ndata: {\"error\":{\"message\":%s,\"type\":\"%s\",\"param\":null,\"code\":\"%s\"}}\n\n", msg, ae.Type, ae.Code)
}

// writeError is the ReverseProxy ErrorHandler. It runs only before anything was written to w.
func (t *Target) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		if ae := apierror.Ended(r.Context()); ae != nil {
			apierror.Write(w, ae) // the server ended the request (shutting down): say so
			return
		}
		// The client left; there is nobody to answer and nothing failed upstream.
		w.WriteHeader(StatusClientClosedRequest)
		return
	}
	var ae *apierror.Error
	switch {
	case errors.As(err, &ae):
	case errors.Is(err, context.DeadlineExceeded):
		ae = &apierror.Error{Status: http.StatusGatewayTimeout, Type: apierror.TypeServer, Code: apierror.CodeUpstreamTimeout,
			Message: "The upstream did not answer in time.", Err: err}
	default:
		ae = apierror.BadGateway("The upstream request failed.", apierror.CodeUpstreamError, err)
	}
	t.c.log.Warn("passthrough failed", zap.String("path", r.URL.Path), zap.Int("status", ae.Status), zap.Error(err))
	apierror.Write(w, ae)
}

// failoverTransport is the ReverseProxy transport: it runs Target.send over the deployments.
type failoverTransport struct {
	t    *Target
	path string
	body Streamed
}

// RoundTrip implements http.RoundTripper. out comes from ReverseProxy, already rewritten; its Body
// is ignored in favour of the body given to Proxy, which can be re-sent on failover.
func (f *failoverTransport) RoundTrip(out *http.Request) (*http.Response, error) {
	resp, _, err := f.t.send(out.Context(), out.Method, f.path, out.URL.RawQuery, out.Header, f.body)
	return resp, err
}

// trimVersion removes a leading "/v1" segment: api_base ends with the version already
// ("https://api.openai.com/v1"), so "/v1/chat/completions" becomes "/chat/completions".
func trimVersion(p string) string {
	if p == "/v1" {
		return "/"
	}
	if strings.HasPrefix(p, "/v1/") {
		return p[len("/v1"):]
	}
	return p
}
