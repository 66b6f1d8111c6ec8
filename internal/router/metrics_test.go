package router

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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
