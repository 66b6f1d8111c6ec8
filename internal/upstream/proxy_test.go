package upstream

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sse"
)

func gzipped(t testing.TB, s string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := io.WriteString(zw, s); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestProxyPassesBytesThrough(t *testing.T) {
	jsonBody := "{\n  \"id\" : \"resp_1\",\"output\":[ ],\"x\":\"\\u00e9\"}\n"
	sseBody := ": keepalive\r\nevent: response.created\r\ndata: {\"a\":1}\r\n\r\n" +
		"event: response.output_text.delta\ndata: {\"delta\":\"h\"}\n\n" +
		"data: line1\ndata: line2\n\ndata: [DONE]\n\n"
	gz := gzipped(t, `{"compressed":true}`)
	tests := []struct {
		name        string
		acceptEnc   string
		contentType string
		encoding    string
		body        []byte
	}{
		{"JSON", "", "application/json", "", []byte(jsonBody)},
		{"server-sent events", "", "text/event-stream; charset=utf-8", "", []byte(sseBody)},
		{"gzip body stays compressed", "gzip", "application/json", "gzip", gz},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.contentType)
				if tc.encoding != "" {
					w.Header().Set("Content-Encoding", tc.encoding)
				}
				w.Header().Set("X-Request-Id", "req_123")
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write(tc.body)
			})
			c := newTestClient(t, nil)
			srv := proxyServer(t, c, []config.Deployment{dep("gpt-up", up.URL, "sk-up")})
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/responses", strings.NewReader(`{"model":"alias","stream":true}`))
			if tc.acceptEnc != "" {
				req.Header.Set("Accept-Encoding", tc.acceptEnc)
			}
			resp, err := plainClient(t).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Errorf("status = %d; want 201", resp.StatusCode)
			}
			if !bytes.Equal(got, tc.body) {
				t.Errorf("body = %q; want %q", got, tc.body)
			}
			for k, want := range map[string]string{"Content-Type": tc.contentType, "Content-Encoding": tc.encoding, "X-Request-Id": "req_123"} {
				if v := resp.Header.Get(k); v != want {
					t.Errorf("%s = %q; want %q", k, v, want)
				}
			}
			if b := up.last(t).Body; string(b) != `{"model":"gpt-up","stream":true}` {
				t.Errorf("upstream body = %q", b)
			}
		})
	}
}

func TestProxyFlushesEachEvent(t *testing.T) {
	events := []string{
		"event: response.created\ndata: {\"n\":0}\n\n",
		"event: response.output_text.delta\ndata: {\"n\":1}\n\n",
		": comment\nevent: response.output_text.delta\ndata: {\"n\":2}\n\n",
		"event: response.completed\ndata: {\"n\":3}\n\n",
	}
	acks := make(chan struct{})
	upDone := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		defer close(upDone)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for i, ev := range events {
			_, _ = io.WriteString(w, ev)
			if err := rc.Flush(); err != nil {
				t.Errorf("upstream flush: %v", err)
				return
			}
			if i == len(events)-1 {
				return
			}
			// The next event is written only once the client has the previous one; a proxy that
			// buffers deadlocks here and fails by the timer.
			select {
			case <-acks:
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Second):
				t.Errorf("client never received event %d", i)
				return
			}
		}
	})
	c := newTestClient(t, nil)
	srv := proxyServer(t, c, []config.Deployment{dep("m", up.URL, "")})
	resp, err := plainClient(t).Post(srv.URL+"/v1/responses", "application/json", strings.NewReader(`{"model":"alias","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := sse.NewReader(resp.Body)
	for i := range events {
		ev, err := r.Next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if want := fmt.Sprintf(`{"n":%d}`, i); string(ev.Data) != want {
			t.Fatalf("event %d data = %q; want %q", i, ev.Data, want)
		}
		if i < len(events)-1 {
			select {
			case acks <- struct{}{}:
			case <-upDone:
				t.Fatalf("upstream gave up before event %d reached the client", i+1)
			}
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Errorf("after the last event: %v; want io.EOF", err)
	}
}

func TestProxyHeadersAndURL(t *testing.T) {
	const clientKey = "sk-client-secret"
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Set-Cookie", "__cf_bm=x")
		w.Header().Set("Alt-Svc", `h3=":443"`)
		w.Header().Set("Openai-Processing-Ms", "12")
		w.Header().Set("Connection", "X-Resp-Hop")
		w.Header().Set("X-Resp-Hop", "1")
		_, _ = io.WriteString(w, "{}")
	})
	c := newTestClient(t, nil)
	d := dep("m", up.URL, "sk-up")
	d.APIBase = up.URL + "/v1?api-version=7"
	srv := proxyServer(t, c, []config.Deployment{d})
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions?limit=3", strings.NewReader(`{"model":"alias"}`))
	req.Header = http.Header{
		"Authorization":       {"Bearer " + clientKey},
		"X-Api-Key":           {clientKey},
		"Api-Key":             {clientKey},
		"Openai-Organization": {"org-client"},
		"Openai-Project":      {"proj-client"},
		"Connection":          {"X-Hop"},
		"X-Hop":               {"1"},
		"X-Forwarded-For":     {"10.1.1.1"},
		"Te":                  {"trailers"},
		"Openai-Beta":         {"x"},
		"Content-Type":        {"application/json"},
	}
	resp, err := plainClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got := up.last(t)
	if got.Path != "/v1/chat/completions" || got.RawQuery != "api-version=7&limit=3" {
		t.Errorf("upstream URL = %s?%s; want /v1/chat/completions?api-version=7&limit=3", got.Path, got.RawQuery)
	}
	if a := got.Header.Get("Authorization"); a != "Bearer sk-up" {
		t.Errorf("Authorization = %q; want the deployment key", a)
	}
	for k, vs := range got.Header {
		for _, v := range vs {
			if strings.Contains(v, clientKey) {
				t.Errorf("client key forwarded in %s", k)
			}
		}
	}
	for _, k := range []string{"X-Api-Key", "Api-Key", "Openai-Organization", "Openai-Project", "X-Hop", "X-Forwarded-For"} {
		if _, ok := got.Header[k]; ok {
			t.Errorf("%s forwarded", k)
		}
	}
	for k, want := range map[string]string{"Te": "trailers", "Openai-Beta": "x", "Content-Type": "application/json"} {
		if v := got.Header.Get(k); v != want {
			t.Errorf("upstream %s = %q; want %q", k, v, want)
		}
	}
	for _, k := range []string{"Set-Cookie", "Alt-Svc", "X-Resp-Hop"} {
		if v := resp.Header.Get(k); v != "" {
			t.Errorf("response header %s passed to the client: %q", k, v)
		}
	}
	if v := resp.Header.Get("Openai-Processing-Ms"); v != "12" {
		t.Errorf("Openai-Processing-Ms = %q; want 12", v)
	}
}

func TestProxyGETWithoutBody(t *testing.T) {
	up := newUpstream(t, status(200, `{"data":[]}`))
	c := newTestClient(t, nil)
	srv := proxyServer(t, c, []config.Deployment{dep("m", up.URL, "k")})
	resp, err := plainClient(t).Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	got := up.last(t)
	if got.Method != http.MethodGet || got.Path != "/v1/models" || len(got.Body) != 0 || string(b) != `{"data":[]}` {
		t.Errorf("upstream saw %s %s body %q; client got %q", got.Method, got.Path, got.Body, b)
	}
}

func TestProxyErrors(t *testing.T) {
	tests := []struct {
		name       string
		deps       func(t *testing.T, ok string) []config.Deployment
		wantStatus int
		wantBody   string // exact body, or a substring of the error message when wantCode is set
		wantCode   string
	}{
		{"refused then ok", func(t *testing.T, ok string) []config.Deployment {
			return []config.Deployment{dep("m", refusedURL(t), ""), dep("m", ok, "")}
		}, 200, `{"ok":true}`, ""},
		{"all refused is an OpenAI-shaped 502", func(t *testing.T, ok string) []config.Deployment {
			return []config.Deployment{dep("m", refusedURL(t), "sk-a"), dep("m", refusedURL(t), "sk-b")}
		}, 502, `could not be reached`, "upstream_unreachable"},
		{"missing environment variable is named", func(t *testing.T, ok string) []config.Deployment {
			d := dep("m", ok, "")
			d.MissingEnv = "MY_PROVIDER_KEY"
			return []config.Deployment{d}
		}, 502, "MY_PROVIDER_KEY", "upstream_not_configured"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ok := newUpstream(t, status(200, `{"ok":true}`))
			c := newTestClient(t, nil)
			srv := proxyServer(t, c, tc.deps(t, ok.URL))
			resp, err := plainClient(t).Post(srv.URL+"/v1/responses", "application/json", strings.NewReader(`{"model":"alias"}`))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.wantStatus {
				t.Errorf("status = %d; want %d", resp.StatusCode, tc.wantStatus)
			}
			if tc.wantCode == "" {
				if string(b) != tc.wantBody {
					t.Errorf("body = %q; want %q", b, tc.wantBody)
				}
				return
			}
			var e struct {
				Error struct{ Message, Type, Code string }
			}
			if err := json.Unmarshal(b, &e); err != nil || e.Error.Code != tc.wantCode || !strings.Contains(e.Error.Message, tc.wantBody) || e.Error.Type != "server_error" {
				t.Errorf("body = %s; want an error with code %s mentioning %q", b, tc.wantCode, tc.wantBody)
			}
			if strings.Contains(string(b), "sk-") || strings.Contains(string(b), "127.0.0.1") {
				t.Errorf("error body leaks details: %s", b)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
		})
	}
}

func TestProxyClientDisconnectCancelsUpstream(t *testing.T) {
	arrived := make(chan struct{})
	gone := make(chan struct{})
	blocking := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done()
		close(gone)
	})
	second := newUpstream(t, status(200, `{}`))
	m := NewMetrics(nil)
	c := newTestClient(t, m)
	deps := []config.Deployment{dep("m", blocking.URL, ""), dep("m", second.URL, "")}
	statusc := make(chan int, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec := &statusRecorder{ResponseWriter: w}
		c.Target(deps).Proxy(rec, r, body)
		statusc <- rec.status
	}))
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/responses", strings.NewReader(`{"model":"alias"}`))
	errc := make(chan error, 1)
	go func() {
		resp, err := plainClient(t).Do(req)
		if resp != nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-arrived
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("client error = %v; want context.Canceled", err)
	}
	<-gone // the upstream request was canceled (the test times out otherwise)
	if s := <-statusc; s != StatusClientClosedRequest {
		t.Errorf("recorded status = %d; want %d", s, StatusClientClosedRequest)
	}
	if second.hits() != 0 {
		t.Errorf("a disconnected client was failed over: second upstream hits = %d", second.hits())
	}
	if got := value(t, m.errors.WithLabelValues("openai", "canceled")); got != 1 {
		t.Errorf("canceled errors = %v; want 1", got)
	}
	if got := value(t, m.errors.WithLabelValues("openai", "connect")); got != 0 {
		t.Errorf("connect errors = %v; want 0", got)
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func TestTransportSpeaksHTTP2WhenOffered(t *testing.T) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "%d", r.ProtoMajor)
	}))
	up.EnableHTTP2 = true
	up.StartTLS()
	defer up.Close()
	pool := x509.NewCertPool()
	pool.AddCert(up.Certificate())
	tr := NewTransport()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	c := NewClient(ClientOptions{Transport: tr})
	defer c.CloseIdleConnections()
	resp, _, err := c.Target([]config.Deployment{{ModelName: "m", APIBase: up.URL + "/v1"}}).Post(context.Background(), "/responses", []byte(`{}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "2" {
		t.Errorf("upstream saw HTTP/%s; want HTTP/2", b)
	}
}

// TestResponseID: the id of a created response is found in the start of its answer, JSON or a
// stream, once the bytes that hold it are in, and never from a value cut short.
func TestResponseID(t *testing.T) {
	created := `data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_s","object":"response"}}`
	tests := []struct {
		name     string
		prefix   string
		sse      bool
		ended    bool
		wantID   string
		wantDone bool
	}{
		{"a JSON Response", `{"id":"resp_1","object":"response","output":[]}`, false, true, "resp_1", true},
		{"its id first, the rest still to come", `{"id":"resp_1","object":"resp`, false, false, "resp_1", true},
		{"an id cut short", `{"id":"resp_1`, false, false, "", false},
		{"an id after other fields", `{"object":"response","created_at":1,"id":"resp_2"`, false, false, "resp_2", true},
		{"an escaped id decodes", `{"id":"resp_\u0041"}`, false, true, "resp_A", true},
		{"a nested id is not the response's", `{"object":"response","output":[{"id":"msg_1"}]}`, false, true, "", true},
		{"a nested id, the rest still to come", `{"output":[{"id":"msg_1"}`, false, false, "", false},
		{"an id that is no string", `{"id":7}`, false, true, "", true},
		{"a stream's first event", "event: response.created\n" + created + "\n\n", true, false, "resp_s", true},
		{"a stream's first event with CRLF", "event: response.created\r\n" + created + "\r\n\r\n", true, false, "resp_s", true},
		{"a stream's first event cut after the id", "event: response.created\n" + created[:strings.Index(created, `,"object"`)], true, false, "resp_s", true},
		{"a stream's first event cut in the id", "event: response.created\n" + created[:strings.Index(created, `_s"`)], true, false, "", false},
		{"a comment and an event line, more to come", ": keepalive\nevent: response.cre", true, false, "", false},
		{"an event without the id, then one with", "data: {\"type\":\"x\"}\n\n" + created + "\n\n", true, false, "resp_s", true},
		{"a stream that ended without an id", "data: {\"type\":\"error\"}\n\n", true, true, "", true},
		{"data without a space", `data:{"response":{"id":"resp_t"}}` + "\n", true, false, "resp_t", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, done := responseID([]byte(tc.prefix), tc.sse, tc.ended)
			if id != tc.wantID || done != tc.wantDone {
				t.Errorf("responseID(%q) = %q, %v; want %q, %v", tc.prefix, id, done, tc.wantID, tc.wantDone)
			}
		})
	}
}

// TestProxyResponsesNotesTheID: ProxyResponses tells its note the id of the response before the
// client has any byte of it, passes every byte on, asks for no compression whatever the client
// accepts, and answers with note's error instead when the id cannot be recorded. Error answers
// and answers without an id are passed on untouched.
func TestProxyResponsesNotesTheID(t *testing.T) {
	const jsonAnswer = `{"id":"resp_j","object":"response","output":[]}`
	const sseAnswer = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_e\"}}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_e\"}}\n\n"
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Answer") {
		case "error":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"no","type":"invalid_request_error","param":null,"code":null}}`)
		case "stream":
			w.Header().Set("Content-Type", "text/event-stream")
			first, rest, _ := strings.Cut(sseAnswer, "\n\n")
			_, _ = io.WriteString(w, first+"\n\n")
			w.(http.Flusher).Flush()
			select { // the rest only once the note has been told the id
			case <-release:
			case <-time.After(30 * time.Second):
				t.Error("the note was not told the id while the stream was open")
			}
			_, _ = io.WriteString(w, rest)
		default:
			if r.Header.Get("Accept-Encoding") == "" {
				t.Errorf("the transport asked for no compression (it undoes it itself)")
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "gzip")
			_, _ = w.Write(gzipped(t, jsonAnswer))
		}
	})
	c := newTestClient(t, nil)
	deps := []config.Deployment{dep("m", up.URL, "sk")}
	var noted []string
	var noteErr error
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c.Target(deps).ProxyResponses(w, r, Streamed{JSON: body}, func(ctx context.Context, id string) error {
			noted = append(noted, id)
			if strings.Contains(string(body), `"stream":true`) {
				close(release)
			}
			return noteErr
		})
	}))
	t.Cleanup(srv.Close)
	post := func(body, answer string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/responses", strings.NewReader(body))
		req.Header.Set("Accept-Encoding", "gzip, br")
		req.Header.Set("X-Answer", answer)
		resp, err := plainClient(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if enc := resp.Header.Get("Content-Encoding"); enc != "" {
			t.Errorf("answer encoded %q; want plain", enc)
		}
		return resp.StatusCode, string(b)
	}

	if status, body := post(`{"model":"alias"}`, "json"); status != http.StatusOK || body != jsonAnswer {
		t.Errorf("JSON = %d %q; want 200 and the answer as sent", status, body)
	}
	if status, body := post(`{"model":"alias","stream":true}`, "stream"); status != http.StatusOK || body != sseAnswer {
		t.Errorf("stream = %d %q; want 200 and every event as sent", status, body)
	}
	if status, _ := post(`{"model":"alias"}`, "error"); status != http.StatusBadRequest {
		t.Errorf("error answer = %d; want the upstream's 400", status)
	}
	if want := []string{"resp_j", "resp_e"}; fmt.Sprint(noted) != fmt.Sprint(want) {
		t.Errorf("noted %q; want %q", noted, want)
	}
	noteErr = &apierror.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "store_unavailable", Message: "down"}
	status, body := post(`{"model":"alias"}`, "json")
	if status != http.StatusServiceUnavailable || strings.Contains(body, "resp_j") || !strings.Contains(body, "store_unavailable") {
		t.Errorf("with the note failing = %d %s; want the note's 503 and no id", status, body)
	}
}
