package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
)

func TestPostRewritesModelKeepingOtherBytes(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"model first", `{"model":"alias","input":"hi"}`, `{"model":"gpt-up","input":"hi"}`},
		{"spacing and key order kept", "{\n  \"input\" : [ 1,2 ,3 ],\n  \"model\"  :  \"alias\" ,\"x\":1.50e3}\n", "{\n  \"input\" : [ 1,2 ,3 ],\n  \"model\"  :  \"gpt-up\" ,\"x\":1.50e3}\n"},
		{"escapes elsewhere untouched", `{"input":"\u00e9\n\"model\":\"no\"","model":"alias","z":"\/"}`, `{"input":"\u00e9\n\"model\":\"no\"","model":"gpt-up","z":"\/"}`},
		{"nested model untouched", `{"metadata":{"model":"keep"},"model":"alias"}`, `{"metadata":{"model":"keep"},"model":"gpt-up"}`},
		{"duplicate model keys all replaced", `{"model":"alias","model":"gpt-secret"}`, `{"model":"gpt-up","model":"gpt-up"}`},
		{"non-string model replaced", `{"model":null}`, `{"model":"gpt-up"}`},
		{"already the upstream name", `{"model":"gpt-up", "a":1}`, `{"model":"gpt-up", "a":1}`},
		{"no model key", `{"input":"hi"}`, `{"input":"hi"}`},
		{"JSON array sent as is", `[{"model":"alias"}]`, `[{"model":"alias"}]`},
		{"not JSON sent as is", "model=alias&x=1", "model=alias&x=1"},
		{"empty body", "", ""},
	}
	up := newUpstream(t, status(200, `{}`))
	c := newTestClient(t, nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(tc.in)
			orig := bytes.Clone(in)
			resp, d, err := c.Target([]config.Deployment{dep("gpt-up", up.URL, "sk-up")}).Post(context.Background(), "/responses", in, nil)
			if err != nil {
				t.Fatalf("Post: %v", err)
			}
			resp.Body.Close()
			if got := up.last(t).Body; string(got) != tc.want {
				t.Errorf("upstream body = %q; want %q", got, tc.want)
			}
			if !bytes.Equal(in, orig) {
				t.Errorf("input slice modified: %q; was %q", in, orig)
			}
			if d.UpstreamModel != "gpt-up" {
				t.Errorf("deployment = %+v", d)
			}
			if p := up.last(t).Path; p != "/v1/responses" {
				t.Errorf("path = %q; want /v1/responses", p)
			}
		})
	}
}

func TestPostHeaders(t *testing.T) {
	const clientKey = "sk-client-secret"
	client := http.Header{
		"Authorization":       {"Bearer " + clientKey},
		"Api-Key":             {clientKey},
		"X-Api-Key":           {clientKey},
		"Openai-Organization": {"org-client"},
		"Proxy-Authorization": {"Basic " + clientKey},
		"Connection":          {"keep-alive, X-Hop"},
		"X-Hop":               {"1"},
		"Keep-Alive":          {"timeout=5"},
		"Te":                  {"trailers"},
		"Upgrade":             {"h2c"},
		"Accept-Encoding":     {"br"},
		"Cookie":              {"session=" + clientKey},
		"X-Forwarded-For":     {"10.0.0.1"},
		"Openai-Beta":         {"responses=v1"},
		"X-Keep":              {"yes"},
	}
	tests := []struct {
		name     string
		key      string
		wantAuth string
	}{
		{"deployment key replaces client key", "sk-up", "Bearer sk-up"},
		{"no deployment key sends none", "", ""},
	}
	up := newUpstream(t, status(200, `{}`))
	c := newTestClient(t, nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := client.Clone()
			resp, _, err := c.Target([]config.Deployment{dep("m", up.URL, tc.key)}).Post(context.Background(), "/responses", []byte(`{"model":"a"}`), h)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			got := up.last(t).Header
			if a := got.Get("Authorization"); a != tc.wantAuth {
				t.Errorf("Authorization = %q; want %q", a, tc.wantAuth)
			}
			for k, vs := range got {
				for _, v := range vs {
					if strings.Contains(v, clientKey) {
						t.Errorf("client key forwarded in %s: %q", k, v)
					}
				}
			}
			for _, k := range []string{"Api-Key", "X-Api-Key", "Openai-Organization", "X-Hop", "Keep-Alive", "Te", "Upgrade", "Cookie", "X-Forwarded-For"} {
				if v, ok := got[k]; ok {
					t.Errorf("header %s forwarded: %q", k, v)
				}
			}
			if ae := got.Get("Accept-Encoding"); ae == "br" {
				t.Errorf("client Accept-Encoding forwarded by Post: %q", ae)
			}
			for k, want := range map[string]string{"X-Keep": "yes", "Openai-Beta": "responses=v1", "Content-Type": "application/json"} {
				if v := got.Get(k); v != want {
					t.Errorf("%s = %q; want %q", k, v, want)
				}
			}
			if h.Get("Authorization") != "Bearer "+clientKey || h.Get("X-Hop") != "1" {
				t.Errorf("caller's header modified: %v", h)
			}
		})
	}
}

func TestPostDecompressesForTheCaller(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			_, _ = io.WriteString(w, "plain")
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write(gzipped(t, `{"ok":true}`))
	})
	c := newTestClient(t, nil)
	resp, _, err := c.Target([]config.Deployment{dep("m", up.URL, "")}).Post(context.Background(), "/responses", []byte(`{}`), http.Header{"Accept-Encoding": {"br"}})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if string(b) != `{"ok":true}` {
		t.Errorf("body = %q; want the decompressed JSON", b)
	}
}

func TestBalancerRoundRobin(t *testing.T) {
	ups := []*testUpstream{newUpstream(t, status(200, `{}`)), newUpstream(t, status(200, `{}`)), newUpstream(t, status(200, `{}`))}
	var deps []config.Deployment
	for _, u := range ups {
		deps = append(deps, dep("m", u.URL, ""))
	}
	c := newTestClient(t, nil)
	b := NewBalancer()
	var order []int
	for range 6 {
		resp, d, err := c.Target(b.Order(deps)).Post(context.Background(), "/responses", []byte(`{}`), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		for i, u := range ups {
			if d.APIBase == u.URL+"/v1" {
				order = append(order, i)
			}
		}
	}
	if want := []int{0, 1, 2, 0, 1, 2}; !equalInts(order, want) {
		t.Errorf("deployments used = %v; want %v", order, want)
	}
	for i, u := range ups {
		if u.hits() != 2 {
			t.Errorf("upstream %d hits = %d; want 2", i, u.hits())
		}
	}
}

func TestBalancerOrder(t *testing.T) {
	a := config.Deployment{ModelName: "m", APIBase: "a"}
	bb := config.Deployment{ModelName: "m", APIBase: "b"}
	cc := config.Deployment{ModelName: "m", APIBase: "c"}
	other := config.Deployment{ModelName: "other", APIBase: "x"}
	deps := []config.Deployment{a, bb, cc}
	b := NewBalancer()
	tests := []struct {
		name string
		in   []config.Deployment
		want string
	}{
		{"first call starts at the first", deps, "abc"},
		{"second call rotates by one", deps, "bca"},
		{"another model has its own rotation", []config.Deployment{other}, "x"},
		{"third call rotates by two", deps, "cab"},
		{"fourth call wraps around", deps, "abc"},
		{"empty gives nil", nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := b.Order(tc.in)
			var s string
			for _, d := range got {
				s += d.APIBase
			}
			if s != tc.want {
				t.Errorf("Order = %q; want %q", s, tc.want)
			}
		})
	}
	if deps[0].APIBase != "a" || deps[1].APIBase != "b" {
		t.Errorf("Order modified its input: %v", deps)
	}
	var nilB *Balancer
	if got := nilB.Order(deps); len(got) != 3 || got[0].APIBase != "a" {
		t.Errorf("nil Balancer Order = %v", got)
	}
}

func TestBalancerConcurrent(t *testing.T) {
	deps := []config.Deployment{{ModelName: "m", APIBase: "a"}, {ModelName: "m", APIBase: "b"}}
	b := NewBalancer()
	counts := make(chan string, 200)
	done := make(chan struct{})
	for range 4 {
		go func() {
			for range 50 {
				counts <- b.Order(deps)[0].APIBase
			}
			done <- struct{}{}
		}()
	}
	for range 4 {
		<-done
	}
	close(counts)
	n := map[string]int{}
	for s := range counts {
		n[s]++
	}
	if n["a"] != 100 || n["b"] != 100 {
		t.Errorf("first choices = %v; want 100 each", n)
	}
}

func TestPostFailover(t *testing.T) {
	type step struct {
		refused bool
		code    int
		body    string
	}
	tests := []struct {
		name       string
		steps      []step
		wantStatus int    // 0: an error
		wantBody   string // response body, or the error code
		wantHits   []int
	}{
		{"connection refused moves on", []step{{refused: true}, {code: 200, body: `{"b":2}`}}, 200, `{"b":2}`, []int{0, 1}},
		{"5xx moves on", []step{{code: 503, body: `{"a":1}`}, {code: 200, body: `{"b":2}`}}, 200, `{"b":2}`, []int{1, 1}},
		{"last 5xx is returned as is", []step{{code: 500, body: `first`}, {code: 502, body: `{"error":{"message":"second"}}`}}, 502, `{"error":{"message":"second"}}`, []int{1, 1}},
		{"4xx is not failed over", []step{{code: 429, body: `{"error":{"message":"slow down"}}`}, {code: 200, body: `ok`}}, 429, `{"error":{"message":"slow down"}}`, []int{1, 0}},
		{"5xx then refused returns the 5xx", []step{{code: 500, body: `kept body`}, {refused: true}}, 500, `kept body`, []int{1, 0}},
		{"all refused is a 502", []step{{refused: true}, {refused: true}}, 0, "upstream_unreachable", []int{0, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			c := newTestClient(t, NewMetrics(reg))
			var deps []config.Deployment
			var ups []*testUpstream
			for _, s := range tc.steps {
				u := newUpstream(t, status(s.code, s.body))
				base := u.URL
				if s.refused {
					base = refusedURL(t)
				}
				ups = append(ups, u)
				deps = append(deps, dep("m", base, "sk"))
			}
			resp, _, err := c.Target(deps).Post(context.Background(), "/responses", []byte(`{"model":"alias"}`), nil)
			if tc.wantStatus == 0 {
				var ae *apierror.Error
				if !errors.As(err, &ae) || ae.Status != http.StatusBadGateway || ae.Code != tc.wantBody {
					t.Fatalf("Post error = %v; want a 502 %s", err, tc.wantBody)
				}
				if strings.Contains(ae.Message, "sk") || strings.Contains(ae.Message, "127.0.0.1") {
					t.Errorf("client message leaks details: %q", ae.Message)
				}
			} else {
				if err != nil {
					t.Fatalf("Post: %v", err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tc.wantStatus || string(b) != tc.wantBody {
					t.Errorf("Post = %d %q; want %d %q", resp.StatusCode, b, tc.wantStatus, tc.wantBody)
				}
			}
			for i, u := range ups {
				if u.hits() != tc.wantHits[i] {
					t.Errorf("upstream %d hits = %d; want %d", i, u.hits(), tc.wantHits[i])
				}
			}
			wantFailovers := 1.0
			if tc.wantStatus > 0 && tc.wantStatus < 500 && tc.wantHits[1] == 0 {
				wantFailovers = 0
			}
			if got := value(t, c.metrics.failovers.WithLabelValues("openai")); got != wantFailovers {
				t.Errorf("failovers = %v; want %v", got, wantFailovers)
			}
		})
	}
}

func TestPostFailoverMetricsAndNoFailoverCount(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	if again := NewMetrics(reg); again.requests != m.requests {
		t.Error("NewMetrics on the same registry did not reuse the collectors")
	}
	c := newTestClient(t, m)
	ok := newUpstream(t, status(200, `{}`))
	deps := []config.Deployment{dep("m", refusedURL(t), ""), dep("m", ok.URL, "")}
	resp, _, err := c.Target(deps).Post(context.Background(), "/responses", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for name, tc := range map[string]struct {
		c    prometheus.Metric
		want float64
	}{
		"2xx requests":    {m.requests.WithLabelValues("openai", "2xx"), 1},
		"connect errors":  {m.errors.WithLabelValues("openai", "connect"), 1},
		"failovers":       {m.failovers.WithLabelValues("openai"), 1},
		"canceled errors": {m.errors.WithLabelValues("openai", "canceled"), 0},
	} {
		if got := value(t, tc.c); got != tc.want {
			t.Errorf("%s = %v; want %v", name, got, tc.want)
		}
	}
	if n := value(t, m.firstByte.WithLabelValues("openai").(prometheus.Metric)); n != 1 {
		t.Errorf("first-byte observations = %v; want 1", n)
	}
	var nilM *Metrics // a nil *Metrics must be usable
	nilM.answered("x", 200, time.Second)
	nilM.errored("x", "connect")
	nilM.failover("x")
}

func TestPostMissingEnv(t *testing.T) {
	up := newUpstream(t, status(200, `{"ok":1}`))
	missing := dep("m", up.URL, "")
	missing.MissingEnv = "OPENAI_API_KEY"
	c := newTestClient(t, nil)

	t.Run("only deployment answers with an error naming the variable", func(t *testing.T) {
		_, _, err := c.Target([]config.Deployment{missing}).Post(context.Background(), "/responses", []byte(`{}`), nil)
		var ae *apierror.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadGateway || ae.Code != "upstream_not_configured" {
			t.Fatalf("Post error = %v; want a 502 upstream_not_configured", err)
		}
		if !strings.Contains(ae.Message, "OPENAI_API_KEY") || !strings.Contains(ae.Message, `"alias"`) {
			t.Errorf("message = %q; want the variable and the model named", ae.Message)
		}
		if up.hits() != 0 {
			t.Errorf("upstream called %d times", up.hits())
		}
	})
	t.Run("a configured deployment beside it serves", func(t *testing.T) {
		resp, d, err := c.Target([]config.Deployment{missing, dep("m", up.URL, "")}).Post(context.Background(), "/responses", []byte(`{}`), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || d.MissingEnv != "" {
			t.Errorf("Post = %d from %+v", resp.StatusCode, d)
		}
	})
}

func TestPostCanceledIsNotFailedOver(t *testing.T) {
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
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		resp, _, err := c.Target([]config.Deployment{dep("m", blocking.URL, ""), dep("m", second.URL, "")}).Post(ctx, "/responses", []byte(`{}`), nil)
		if resp != nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-arrived
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("Post error = %v; want context.Canceled", err)
	}
	<-gone // the upstream saw the cancellation (the test times out otherwise)
	if second.hits() != 0 {
		t.Errorf("canceled request failed over: second upstream hits = %d", second.hits())
	}
	if got := value(t, m.errors.WithLabelValues("openai", "canceled")); got != 1 {
		t.Errorf("canceled errors = %v; want 1", got)
	}
	if got := value(t, m.errors.WithLabelValues("openai", "connect")); got != 0 {
		t.Errorf("connect errors = %v; want 0", got)
	}
}

func TestJoinURL(t *testing.T) {
	tests := []struct{ base, path, query, want string }{
		{"https://api.openai.com/v1", "/responses", "", "https://api.openai.com/v1/responses"},
		{"https://api.openai.com/v1/", "/responses", "", "https://api.openai.com/v1/responses"},
		{"http://h:8000/v1", "/files/file-1/content", "a=1", "http://h:8000/v1/files/file-1/content?a=1"},
		{"https://x.azure.com/openai?api-version=2", "/responses", "a=1", "https://x.azure.com/openai/responses?api-version=2&a=1"},
		{"https://h/v1", "/../../admin", "", "https://h/v1/admin"},
		{"https://h/v1", "/models/", "", "https://h/v1/models/"},
	}
	for _, tc := range tests {
		u, err := joinURL(tc.base, tc.path, tc.query)
		if err != nil {
			t.Errorf("joinURL(%q, %q) error %v", tc.base, tc.path, err)
			continue
		}
		if u.String() != tc.want {
			t.Errorf("joinURL(%q, %q, %q) = %q; want %q", tc.base, tc.path, tc.query, u, tc.want)
		}
	}
	if _, err := joinURL("ftp://h", "/x", ""); err == nil {
		t.Error("joinURL accepted an ftp base")
	}
	if got := safeBase("https://user:pw@h/v1?key=secret"); strings.Contains(got, "pw") || strings.Contains(got, "secret") {
		t.Errorf("safeBase leaks: %q", got)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestLogsHoldNoSecrets(t *testing.T) {
	const upKey, clientKey = "sk-upstream-secret", "sk-client-secret"
	core, logs := observer.New(zapcore.DebugLevel)
	c := NewClient(ClientOptions{Logger: zap.New(core)})
	defer c.CloseIdleConnections()
	failing := newUpstream(t, status(500, `{"error":"`+upKey+`"}`))
	missing := dep("m", failing.URL, "")
	missing.MissingEnv = "SOME_KEY"
	deps := []config.Deployment{
		missing,
		dep("m", "http://user:"+upKey+"@"+strings.TrimPrefix(refusedURL(t), "http://"), upKey),
		dep("m", failing.URL, upKey),
		dep("m", refusedURL(t)+"?key="+upKey, upKey),
	}
	body := []byte(`{"model":"alias","input":"` + clientKey + `"}`)
	resp, _, err := c.Target(deps).Post(context.Background(), "/responses", body, http.Header{"Authorization": {"Bearer " + clientKey}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	srv := proxyServer(t, c, []config.Deployment{dep("m", refusedURL(t), upKey)})
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/responses", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+clientKey)
	if resp, err := plainClient(t).Do(req); err == nil {
		resp.Body.Close()
	}
	if logs.Len() < 3 {
		t.Fatalf("only %d log lines; the test exercises nothing", logs.Len())
	}
	for _, e := range logs.All() {
		line := e.Message + fmt.Sprint(e.ContextMap())
		if strings.Contains(line, upKey) || strings.Contains(line, clientKey) {
			t.Errorf("log line holds a secret: %s", line)
		}
	}
}
