package upstream

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ciproxy/ciproxy/internal/promreg"
)

// Metrics counts upstream traffic. A nil *Metrics is valid and records nothing. Labels are the
// deployment's provider (from the config, so the set is bounded), never a model name from a client.
type Metrics struct {
	requests  *prometheus.CounterVec
	errors    *prometheus.CounterVec
	failovers *prometheus.CounterVec
	firstByte *prometheus.HistogramVec
}

// NewMetrics creates the upstream metrics and registers them with reg (nil: not registered).
// Registering twice with the same registry reuses the collectors already there (promreg), so a
// Client may be rebuilt.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	return &Metrics{
		requests: promreg.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ciproxy_upstream_requests_total",
			Help: "Upstream requests that got a response, by provider and status class (2xx, 4xx, 5xx...).",
		}, []string{"provider", "class"})),
		errors: promreg.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ciproxy_upstream_errors_total",
			Help: "Failed upstream attempts by provider and kind: connect, timeout (no response headers within the deployment's timeout), 5xx, canceled (the caller went away).",
		}, []string{"provider", "kind"})),
		failovers: promreg.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ciproxy_upstream_failovers_total",
			Help: "Attempts made on a further deployment after an earlier one failed, by the provider tried.",
		}, []string{"provider"})),
		firstByte: promreg.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ciproxy_upstream_first_byte_seconds",
			Help:    "Time from sending an upstream request to its response headers.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"provider"})),
	}
}

func (m *Metrics) answered(provider string, status int, took time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(provider, statusClass(status)).Inc()
	m.firstByte.WithLabelValues(provider).Observe(took.Seconds())
}

func (m *Metrics) errored(provider, kind string) {
	if m == nil {
		return
	}
	m.errors.WithLabelValues(provider, kind).Inc()
}

func (m *Metrics) failover(provider string) {
	if m == nil {
		return
	}
	m.failovers.WithLabelValues(provider).Inc()
}

func statusClass(status int) string {
	if status < 100 || status > 599 {
		return "other"
	}
	return strconv.Itoa(status/100) + "xx"
}
