package intercept

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ciproxy/ciproxy/internal/promreg"
)

// metrics are the engine's Prometheus collectors.
type metrics struct {
	requests   *prometheus.CounterVec   // by outcome
	iterations prometheus.Histogram     // upstream calls per request
	executions *prometheus.CounterVec   // by status
	execTime   *prometheus.HistogramVec // by status
	sandboxErr *prometheus.CounterVec   // by stage
}

// newMetrics creates the collectors and registers them on reg (nil: unregistered). An engine
// built on a registry that already holds them counts on those (promreg), so none goes unserved.
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ciproxy_intercept_requests_total",
			Help: "Intercepted /v1/responses requests by outcome.",
		}, []string{"outcome"}),
		iterations: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ciproxy_intercept_iterations",
			Help:    "Upstream calls made per intercepted request.",
			Buckets: []float64{1, 2, 3, 4, 6, 8, 12, 16, 24, 32},
		}),
		executions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ciproxy_intercept_code_executions_total",
			Help: "Code executions by status (completed, failed, incomplete).",
		}, []string{"status"}),
		execTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ciproxy_intercept_code_execution_seconds",
			Help:    "Latency of code executions by status.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 12),
		}, []string{"status"}),
		sandboxErr: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ciproxy_intercept_sandbox_failures_total",
			Help: "Sandbox failures by stage (create, open, run).",
		}, []string{"stage"}),
	}
	m.requests = promreg.Register(reg, m.requests)
	m.iterations = promreg.Register(reg, m.iterations)
	m.executions = promreg.Register(reg, m.executions)
	m.execTime = promreg.Register(reg, m.execTime)
	m.sandboxErr = promreg.Register(reg, m.sandboxErr)
	return m
}
