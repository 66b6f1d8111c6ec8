package containers

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ciproxy/ciproxy/internal/promreg"
)

// Operation names used as the "op" label.
const (
	opCreate    = "create"
	opRun       = "run"
	opShell     = "shell"
	opDelete    = "delete"
	opKeepAlive = "keepalive"
	opRestart   = "restart"
)

// metrics are the Manager' instruments. The zero-registerer case still records into unregistered
// collectors, so the code never checks for nil.
type metrics struct {
	live     prometheus.Gauge
	duration *prometheus.HistogramVec
	failures *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		live: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ciproxy_sandbox_containers",
			Help: "Containers (live sandboxes) held by this process.",
		}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ciproxy_sandbox_operation_duration_seconds",
			Help:    "Duration of sandbox operations by op (create, run, shell, delete, keepalive, restart) and tool.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"op", "tool"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ciproxy_sandbox_operation_failures_total",
			Help: "Sandbox operations that returned an error, by op and tool.",
		}, []string{"op", "tool"}),
	}
	m.live = promreg.Register(reg, m.live)
	m.duration = promreg.Register(reg, m.duration)
	m.failures = promreg.Register(reg, m.failures)
	return m
}

// observe records one operation that started at start (wall clock: latency is measured for real
// even when expiry runs on an injected clock).
func (m *metrics) observe(op, tool string, start time.Time, err error) {
	m.duration.WithLabelValues(op, tool).Observe(time.Since(start).Seconds())
	if err != nil {
		m.failures.WithLabelValues(op, tool).Inc()
	}
}
