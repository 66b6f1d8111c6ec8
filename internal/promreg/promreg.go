// Package promreg registers Prometheus collectors the one way this repository does it: a
// collector already registered under the same description is reused, never dropped, so a
// component built twice on one registry (a rebuilt client, a second engine in a test) keeps
// counting on the collector that /metrics serves.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c on reg and returns the collector to count on: c itself, or the
// equivalent collector registered there before. With a nil reg, c is returned unregistered (it
// still counts; nothing serves it). Any other registration failure, such as a metric name reused
// with other labels or another type, is a programming error and panics, as MustRegister does.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	panic(err)
}
