package opensandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// execdBase returns where h's execd answers: the lifecycle API's endpoint for port 44772, asked
// once per sandbox and kept. An endpoint without a scheme gets the lifecycle URL's.
func (p *Provider) execdBase(ctx context.Context, h sandbox.Handle) (endpoint, error) {
	p.mu.Lock()
	ep, ok := p.endpoints[h.ID]
	p.mu.Unlock()
	if ok {
		return ep, nil
	}
	raw, err := p.lifecycle(ctx, "endpoint", http.MethodGet, "/sandboxes/"+url.PathEscape(h.ID)+"/endpoints/"+strconv.Itoa(ExecdPort), nil)
	if err != nil {
		return endpoint{}, err
	}
	j := gjson.ParseBytes(raw)
	addr := strings.TrimRight(j.Get("endpoint").String(), "/")
	if addr == "" {
		return endpoint{}, fmt.Errorf("%w: opensandbox endpoint: the answer names no endpoint", sandbox.ErrUnavailable)
	}
	if !strings.HasPrefix(addr, "http://") && !strings.HasPrefix(addr, "https://") {
		addr = p.apiBase.Scheme + "://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return endpoint{}, fmt.Errorf("%w: opensandbox endpoint: %q is not a usable endpoint", sandbox.ErrUnavailable, addr)
	}
	ep = endpoint{base: addr, headers: map[string]string{}}
	j.Get("headers").ForEach(func(k, v gjson.Result) bool {
		name := http.CanonicalHeaderKey(k.String())
		// The endpoint's headers route the request (and, with secure access, are its credential);
		// none may replace what the client sets itself.
		switch name {
		case "Host", "Content-Type", "Content-Length", "Transfer-Encoding", "Connection", "Open-Sandbox-Api-Key", "X-Execd-Access-Token":
		default:
			if v.Type == gjson.String && !strings.ContainsAny(v.String(), "\r\n") {
				ep.headers[name] = v.String()
			}
		}
		return true
	})
	p.mu.Lock()
	p.endpoints[h.ID] = ep
	p.mu.Unlock()
	return ep, nil
}

// forget drops h's endpoint, so that the next request asks the lifecycle API again.
func (p *Provider) forget(h sandbox.Handle) {
	p.mu.Lock()
	delete(p.endpoints, h.ID)
	p.mu.Unlock()
}

// execd sends one request to h's execd, with the endpoint's headers and the sandbox's execd token
// (never the lifecycle key), and returns a 2xx answer for the caller to read and close. path may
// hold a query.
func (p *Provider) execd(ctx context.Context, h sandbox.Handle, op, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	ep, err := p.execdBase(ctx, h)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, ep.base+path, body)
	if err != nil {
		return nil, fmt.Errorf("%w: opensandbox %s: %w", sandbox.ErrUnavailable, op, err)
	}
	for k, v := range ep.headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("User-Agent", "ciproxy-opensandbox")
	if h.AccessToken != "" {
		req.Header.Set("X-EXECD-ACCESS-TOKEN", h.AccessToken)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, p.transportError(ctx, op, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, p.execdStatusError(h, op, resp)
	}
	return resp, nil
}

// execdJSON sends in as JSON (nil: no body) bounded by RequestTimeout and returns the answer's
// body, at most jsonBodyLimit bytes.
func (p *Provider) execdJSON(ctx context.Context, h sandbox.Handle, op, method, path string, in any) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("opensandbox %s: %w", op, err)
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := p.execd(ctx, h, op, method, path, body, ct)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, jsonBodyLimit+1))
	if err != nil {
		return nil, p.transportError(ctx, op, err)
	}
	if len(raw) > jsonBodyLimit {
		return nil, fmt.Errorf("%w: opensandbox %s: the answer is larger than %d bytes", sandbox.ErrUnavailable, op, jsonBodyLimit)
	}
	return raw, nil
}

// execdStatusError maps an execd (or gateway) answer that is not 2xx. The gateway's and the
// server proxy's 404 mean the sandbox is gone; execd's own 404s are about a path or a context,
// ErrNotFound too. A 502 or 503 is a sandbox that cannot be reached now.
func (p *Provider) execdStatusError(h sandbox.Handle, op string, resp *http.Response) error {
	e := &APIError{Op: op, StatusCode: resp.StatusCode, Message: p.errorMessage(resp)}
	switch resp.StatusCode {
	case http.StatusNotFound:
		e.kind = sandbox.ErrNotFound
		if !strings.Contains(e.Message, "FILE_NOT_FOUND") && !strings.Contains(e.Message, "CONTEXT_NOT_FOUND") {
			p.forget(h) // the route may have moved
		}
	case http.StatusTooManyRequests:
		e.kind = sandbox.ErrRateLimited
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusUnauthorized:
		p.forget(h)
		e.kind = sandbox.ErrUnavailable
	default:
		e.kind = sandbox.ErrUnavailable
	}
	return e
}

// gone reports whether err is a gateway's or the server's word that the sandbox no longer exists,
// as opposed to execd's that a path or context does not.
func gone(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.StatusCode == http.StatusNotFound && !strings.Contains(e.Message, "FILE_NOT_FOUND") &&
		!strings.Contains(e.Message, "CONTEXT_NOT_FOUND")
}
