package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// served returns the values of the series that reg serves under name.
func served(t *testing.T, reg *prometheus.Registry, name string) []float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				out = append(out, m.GetCounter().GetValue())
			}
		}
	}
	return out
}

func newCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "promreg_test_total", Help: "A test counter."}, []string{"kind"})
}

func TestRegister(t *testing.T) {
	t.Run("a second registration counts on the first collector", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		first := Register(reg, newCounter())
		second := Register(reg, newCounter())
		if first != second {
			t.Error("the second registration returned a new collector")
		}
		second.WithLabelValues("x").Inc()
		if got := served(t, reg, "promreg_test_total"); len(got) != 1 || got[0] != 1 {
			t.Errorf("registry serves %v; want [1]", got)
		}
	})
	t.Run("a nil registry returns the collector unregistered", func(t *testing.T) {
		c := newCounter()
		if got := Register(nil, c); got != c {
			t.Errorf("Register(nil, c) = %p; want c %p", got, c)
		}
	})
	t.Run("a name reused with other labels panics", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		Register(reg, newCounter())
		defer func() {
			if recover() == nil {
				t.Error("no panic for a clashing collector")
			}
		}()
		Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "promreg_test_total", Help: "A test counter."}, []string{"other"}))
	})
}
