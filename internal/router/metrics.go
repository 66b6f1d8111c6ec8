package router

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ciproxy/ciproxy/internal/promreg"
)

// Metrics are the router's Prometheus collectors. Create them once per registry with NewMetrics;
// they are safe for concurrent use.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight prometheus.Gauge
	reloads  *prometheus.CounterVec
}

// NewMetrics creates the router's collectors and registers them on reg; collectors already
// registered there are reused (promreg).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ciproxy_http_requests_total",
			Help: "HTTP requests served, by route pattern and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ciproxy_http_request_duration_seconds",
			Help:    "Time from request start to handler return (the whole stream for streaming responses), by route pattern.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"route"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ciproxy_http_requests_in_flight",
			Help: "Requests being served.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ciproxy_config_reloads_total",
			Help: "Configuration reload attempts, by result (success or failure).",
		}, []string{"result"}),
	}
	m.requests = promreg.Register(reg, m.requests)
	m.duration = promreg.Register(reg, m.duration)
	m.inFlight = promreg.Register(reg, m.inFlight)
	m.reloads = promreg.Register(reg, m.reloads)
	// Both series exist from the start, so a rate() over a failure counter works before any failure.
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	return m
}

// ConfigReload counts one configuration reload attempt.
func (m *Metrics) ConfigReload(ok bool) {
	if ok {
		m.reloads.WithLabelValues("success").Inc()
	} else {
		m.reloads.WithLabelValues("failure").Inc()
	}
}

// middleware counts requests by chi route pattern (never the raw path, whose ids would make
// unbounded label values) and status.
func (m *Metrics) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww := wrapWriter(w)
		m.inFlight.Inc()
		defer func() {
			m.inFlight.Dec()
			route := routeLabel(r)
			status := ww.outcome(r, false)
			m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
			m.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
		}()
		next.ServeHTTP(ww, r)
	})
}

// routeLabel returns the matched route pattern with the optional /v1 prefix removed, so both path
// forms count as one route; unmatched paths share one label.
func routeLabel(r *http.Request) string {
	rc := chi.RouteContext(r.Context())
	if rc == nil {
		return "unmatched"
	}
	p := rc.RoutePattern()
	if p == "" || strings.HasSuffix(p, "*") {
		return "unmatched"
	}
	if rest, ok := strings.CutPrefix(p, "/v1"); ok && strings.HasPrefix(rest, "/") {
		return rest
	}
	return p
}
