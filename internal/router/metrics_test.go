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

// TestMetricsNeedTheMasterKey: /metrics is the operator's (every tenant's counters), so it takes
// the master key only: a client key (a tenant) is refused, with or without a master key set, and
// without any key so is everyone. Only an open proxy, where any key is anyone's, serves it freely.
func TestMetricsNeedTheMasterKey(t *testing.T) {
	withMaster := quotaYAML("http://127.0.0.1:1/v1", "")
	noMaster := strings.Replace(withMaster, "  master_key: "+quotaMK+"\n", "", 1)
	open := "model_list:\n  - model_name: gpt-test\n    litellm_params: {model: openai/gpt-up, api_base: http://127.0.0.1:1/v1, api_key: sk-up}\n"
	for _, tc := range []struct {
		name   string
		yaml   string
		header []string
		want   int
	}{
		{"the master key", withMaster, []string{"Authorization", "Bearer " + quotaMK}, http.StatusOK},
		{"a client key", withMaster, []string{"Authorization", "Bearer " + aliceKey}, http.StatusUnauthorized},
		{"no key", withMaster, nil, http.StatusUnauthorized},
		{"a client key, no master key set", noMaster, []string{"Authorization", "Bearer " + aliceKey}, http.StatusUnauthorized},
		{"another client key, no master key set", noMaster, []string{"x-api-key", carolKey}, http.StatusUnauthorized},
		{"no key, no master key set", noMaster, nil, http.StatusUnauthorized},
		{"an open proxy, any key", open, []string{"Authorization", "Bearer anything"}, http.StatusOK},
		{"an open proxy, no key", open, nil, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.ParseWith([]byte(tc.yaml), "t.yaml", config.ParseOptions{
				LookupEnv: func(string) (string, bool) { return "", false },
			})
			if err != nil {
				t.Fatal(err)
			}
			p := newProxy(t, cfg)
			status, _, body := p.do(t, http.MethodGet, "/metrics", "", tc.header...)
			if status != tc.want {
				t.Fatalf("GET /metrics = %d %s; want %d", status, body, tc.want)
			}
			if status == http.StatusOK {
				if !strings.Contains(string(body), "ciproxy_http_requests_in_flight") {
					t.Errorf("GET /metrics = %.200s; want the metrics", body)
				}
			} else if gjson.GetBytes(body, "error.code").String() != "invalid_api_key" {
				t.Errorf("refusal %s; want an OpenAI-shaped invalid_api_key error", body)
			}
		})
	}
}
