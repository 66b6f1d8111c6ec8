package upstreamtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Azure stands in front of a scripted Server the way Azure OpenAI stands in front of OpenAI's
// models: it speaks Azure's URLs and credentials and passes what it accepts to the Server at the
// OpenAI path, where the scripted model answers.
//
// Routes, as an Azure OpenAI resource serves them:
//
//	POST /openai/deployments/{deployment}/chat/completions?api-version=V   (also /completions, /embeddings)
//	POST /openai/responses?api-version=V                                    (GET/DELETE /openai/responses/{id}[...])
//	POST /openai/v1/responses, /openai/v1/chat/completions[?api-version=preview|latest]   (the v1 API)
//
// Like Azure it answers 401 when neither the api-key header holds the resource key nor an
// Authorization bearer token is the accepted Entra ID token; 404 DeploymentNotFound for a
// deployment it does not have (in the path, or as the v1 body's model); 404 "Resource not found"
// when a dated route lacks api-version; and 400 for an api-version it does not know. The v1 API
// takes no dated version.
type Azure struct {
	tb      testing.TB
	srv     *httptest.Server
	backend *Server
	key     string
	token   string
	deps    []string
	version func(string) bool

	mu   sync.Mutex
	seen []AzureRequest
}

// AzureRequest is what the Azure front saw of one request, before it passed it on.
type AzureRequest struct {
	Method, Path string
	APIVersion   string // the api-version query value
	APIKey       string // the api-key header
	Bearer       string // the Authorization bearer token
	Deployment   string // from the path, or the v1 body's model
	Status       int    // what the front answered itself; 0 when it passed the request on
}

// AzureOption configures NewAzure.
type AzureOption func(*Azure)

// WithAzureKey sets the resource key accepted in the api-key header.
func WithAzureKey(key string) AzureOption { return func(a *Azure) { a.key = key } }

// WithEntraToken sets the Entra ID token accepted as "Authorization: Bearer <token>".
func WithEntraToken(token string) AzureOption { return func(a *Azure) { a.token = token } }

// WithDeployments sets the deployment names the resource has.
func WithDeployments(names ...string) AzureOption { return func(a *Azure) { a.deps = names } }

// NewAzure starts an Azure front for backend; it is closed by tb.Cleanup when tb is not nil.
// Dated api-versions (YYYY-MM-DD, optionally -preview) are accepted, as Azure accepts its
// published ones.
func NewAzure(tb testing.TB, backend *Server, opts ...AzureOption) *Azure {
	a := &Azure{tb: tb, backend: backend, version: datedVersion}
	for _, o := range opts {
		o(a)
	}
	target, err := url.Parse(backend.URL())
	if err != nil {
		panic(err)
	}
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.Out.URL.Scheme, pr.Out.URL.Host = target.Scheme, target.Host
		pr.Out.Host = target.Host
		pr.Out.Header.Del("Api-Key")
		pr.Out.Header.Del("Authorization")
	}}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, status, body := a.check(r)
		a.mu.Lock()
		req.Status = status
		a.seen = append(a.seen, req)
		a.mu.Unlock()
		if status != 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write(body)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	if tb != nil {
		tb.Cleanup(a.Close)
	}
	return a
}

// URL is the resource's endpoint, as api_base names it: "http://127.0.0.1:port" (no path).
func (a *Azure) URL() string { return a.srv.URL }

// Close shuts the front down (not the backend).
func (a *Azure) Close() {
	a.srv.CloseClientConnections()
	a.srv.Close()
}

// Requests returns every request the front received, in order.
func (a *Azure) Requests() []AzureRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.seen)
}

// datedVersion reports whether v looks like one of Azure's dated api-versions.
func datedVersion(v string) bool {
	date, _ := strings.CutSuffix(v, "-preview")
	if len(date) != 10 || date[4] != '-' || date[7] != '-' {
		return false
	}
	for i, c := range date {
		if i != 4 && i != 7 && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// check decides what Azure would do with r: pass it on (status 0, r's path rewritten to the
// backend's OpenAI path) or answer with status and body.
func (a *Azure) check(r *http.Request) (AzureRequest, int, []byte) {
	req := AzureRequest{Method: r.Method, Path: r.URL.Path, APIVersion: r.URL.Query().Get("api-version"), APIKey: r.Header.Get("Api-Key")}
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		req.Bearer = tok
	}
	if !(a.key != "" && req.APIKey == a.key) && !(a.token != "" && req.Bearer == a.token) {
		return req, http.StatusUnauthorized, azureError("401", "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.")
	}
	var openaiPath string
	switch p := r.URL.Path; {
	case strings.HasPrefix(p, "/openai/v1/"):
		if v := req.APIVersion; v != "" && v != "preview" && v != "latest" {
			return req, http.StatusBadRequest, azureError("BadRequest", "API version not supported")
		}
		openaiPath = "/v1/" + strings.TrimPrefix(p, "/openai/v1/")
		if r.Method == http.MethodPost {
			req.Deployment = bodyModel(r)
			if !slices.Contains(a.deps, req.Deployment) {
				return req, http.StatusNotFound, deploymentNotFound()
			}
		}
	case strings.HasPrefix(p, "/openai/deployments/"):
		rest := strings.TrimPrefix(p, "/openai/deployments/")
		dep, route, _ := strings.Cut(rest, "/")
		req.Deployment, _ = url.PathUnescape(dep)
		if req.APIVersion == "" {
			return req, http.StatusNotFound, azureError("404", "Resource not found")
		}
		if !a.version(req.APIVersion) {
			return req, http.StatusBadRequest, azureError("BadRequest", "API version not supported")
		}
		if !slices.Contains(a.deps, req.Deployment) {
			return req, http.StatusNotFound, deploymentNotFound()
		}
		openaiPath = "/v1/" + route
	case p == "/openai/responses" || strings.HasPrefix(p, "/openai/responses/"):
		if req.APIVersion == "" {
			return req, http.StatusNotFound, azureError("404", "Resource not found")
		}
		if !a.version(req.APIVersion) && req.APIVersion != "preview" {
			return req, http.StatusBadRequest, azureError("BadRequest", "API version not supported")
		}
		openaiPath = "/v1/" + strings.TrimPrefix(p, "/openai/")
		if r.Method == http.MethodPost && p == "/openai/responses" {
			req.Deployment = bodyModel(r)
			if !slices.Contains(a.deps, req.Deployment) {
				return req, http.StatusNotFound, deploymentNotFound()
			}
		}
	default:
		return req, http.StatusNotFound, azureError("404", "Resource not found")
	}
	r.URL.Path, r.URL.RawPath = openaiPath, ""
	q := r.URL.Query()
	q.Del("api-version")
	r.URL.RawQuery = q.Encode()
	return req, 0, nil
}

// bodyModel reads the model of r's JSON body and puts the body back.
func bodyModel(r *http.Request) string {
	b, err := readAll(r)
	r.Body = io.NopCloser(bytes.NewReader(b))
	if err != nil {
		return ""
	}
	var v struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(b, &v)
	return v.Model
}

func deploymentNotFound() []byte {
	return azureError("DeploymentNotFound", "The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again.")
}

// azureError is Azure's error body: {"error":{"code","message"}}.
func azureError(code, msg string) []byte {
	b, _ := json.Marshal(map[string]map[string]string{"error": {"code": code, "message": msg}})
	return b
}

// String describes a request for test failures.
func (r AzureRequest) String() string {
	return fmt.Sprintf("%s %s api-version=%q api-key=%t bearer=%t deployment=%q status=%d",
		r.Method, r.Path, r.APIVersion, r.APIKey != "", r.Bearer != "", r.Deployment, r.Status)
}
