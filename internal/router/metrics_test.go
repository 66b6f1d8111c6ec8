package router

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
)

func TestMetrics(t *testing.T) {
	up := newUpstream(t, nil)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	p := newProxy(t, testConfig(up.URL+"/v1"), func(o *Options) { o.Registry, o.Metrics = reg, m })

	p.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"gpt-test"}`)
	p.do(t, http.MethodPost, "/chat/completions", `{"model":"gpt-test"}`)
	p.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"nope"}`)
	p.do(t, http.MethodGet, "/v1/responses/resp_1", "")
	p.do(t, http.MethodGet, "/v1/no/such/path", "")
	m.ConfigReload(true)
	m.ConfigReload(false)
	m.ConfigReload(false)

	_, _, body := p.do(t, http.MethodGet, "/metrics", "")
	text := string(body)
	for _, want := range []string{
		`ciproxy_http_requests_total{code="200",route="/chat/completions"} 2`,
		`ciproxy_http_requests_total{code="400",route="/chat/completions"} 1`,
		`ciproxy_http_requests_total{code="200",route="/responses/{id}"} 1`,
		`ciproxy_http_requests_total{code="404",route="unmatched"} 1`,
		`ciproxy_http_request_duration_seconds_count{route="/chat/completions"} 3`,
		`ciproxy_http_requests_in_flight 1`, // the /metrics request itself
		`ciproxy_config_reloads_total{result="success"} 1`,
		`ciproxy_config_reloads_total{result="failure"} 2`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(text, "resp_1") {
		t.Errorf("/metrics has a raw path as a label value")
	}
}

// TestMetricsNeedTheMasterKey: /metrics is the operator's, so with a master key set it takes that
// key only; a client key (a tenant) is refused, and without any key so is everyone.
func TestMetricsNeedTheMasterKey(t *testing.T) {
	cfg, err := config.ParseWith([]byte(quotaYAML("http://127.0.0.1:1/v1", "")), "t.yaml", config.ParseOptions{
		LookupEnv: func(string) (string, bool) { return "", false },
	})
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, cfg)
	for _, tc := range []struct {
		name   string
		header []string
		want   int
	}{
		{"the master key", []string{"Authorization", "Bearer " + quotaMK}, http.StatusOK},
		{"a client key", []string{"Authorization", "Bearer " + aliceKey}, http.StatusUnauthorized},
		{"no key", nil, http.StatusUnauthorized},
	} {
		status, _, body := p.do(t, http.MethodGet, "/metrics", "", tc.header...)
		if status != tc.want {
			t.Errorf("%s: GET /metrics = %d %s; want %d", tc.name, status, body, tc.want)
		}
		if status != http.StatusOK && gjson.GetBytes(body, "error.code").String() != "invalid_api_key" {
			t.Errorf("%s: refusal %s; want an OpenAI-shaped invalid_api_key error", tc.name, body)
		}
	}
}
