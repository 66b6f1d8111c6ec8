package upstream

import (
	"context"
	"errors"
	"net/http"
	"net/http/httputil"
	"strings"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/apierror"
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
// when a deadline passed; 501 when no deployment of the model can be called).
// When the client disconnects, the upstream request is canceled and nothing is logged as a failure;
// after the headers are sent, a broken stream aborts the handler with http.ErrAbortHandler, which
// net/http (and the router's recoverer) treat as a silent abort.
func (t *Target) Proxy(w http.ResponseWriter, r *http.Request, body []byte) {
	t.ProxyStreamed(w, r, Streamed{JSON: body})
}

// ProxyStreamed is Proxy for a body whose holes are read as it is sent, for each attempt.
func (t *Target) ProxyStreamed(w http.ResponseWriter, r *http.Request, body Streamed) {
	rp := &httputil.ReverseProxy{
		Rewrite:        rewriteOutbound,
		Transport:      &failoverTransport{t: t, path: trimVersion(r.URL.Path), body: body},
		ModifyResponse: modifyResponse,
		ErrorHandler:   t.writeError,
		ErrorLog:       t.c.errorLog,
		BufferPool:     &t.c.buffers,
	}
	rp.ServeHTTP(w, r)
}

// rewriteOutbound is the ReverseProxy Rewrite hook: the outbound request keeps no client
// credential. URL, Host and body are set by failoverTransport for each deployment it tries.
func rewriteOutbound(pr *httputil.ProxyRequest) {
	dropClientHeaders(pr.Out.Header)
}

// modifyResponse drops response headers that would apply to the proxy's origin, not the upstream's.
func modifyResponse(resp *http.Response) error {
	resp.Header.Del("Set-Cookie")
	resp.Header.Del("Alt-Svc")
	resp.Header.Del("Strict-Transport-Security")
	return nil
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
		ae = &apierror.Error{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "upstream_timeout",
			Message: "The upstream did not answer in time.", Err: err}
	default:
		ae = apierror.BadGateway("The upstream request failed.", "upstream_error", err)
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
