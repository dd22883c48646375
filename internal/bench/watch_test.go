package bench

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

func familyNames(t *testing.T, g prometheus.Gatherer) []string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	return names
}

// TestWatchedRegistryGathersWatchedAlone: the watch holds the watched
// metrics alone, registered directly, through promauto and through a
// registerer that adds labels; the registry holds every metric; a
// collector unregistered leaves both.
func TestWatchedRegistryGathersWatchedAlone(t *testing.T) {
	w := newWatchedRegistry("a_total", "b_total")
	a := prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "a"})
	w.MustRegister(a)
	b := promauto.With(prometheus.WrapRegistererWith(prometheus.Labels{"stage": "x"}, w)).NewCounterVec(
		prometheus.CounterOpts{Name: "b_total", Help: "b"}, []string{"topic"})
	promauto.With(w).NewHistogram(prometheus.HistogramOpts{Name: "c_seconds", Help: "c"}).Observe(1)
	a.Add(2)
	b.WithLabelValues("t").Add(3)
	if err := w.check(); err != nil {
		t.Fatal(err)
	}
	if got := familyNames(t, w.watched()); !slices.Equal(got, []string{"a_total", "b_total"}) {
		t.Errorf("watched: %v, want a_total and b_total alone", got)
	}
	if got := familyNames(t, w); !slices.Equal(got, []string{"a_total", "b_total", "c_seconds"}) {
		t.Errorf("registry: %v, want every metric", got)
	}
	if got := sumMetrics(w.watched(), "a_total", "b_total"); got != 5 {
		t.Errorf("watched sum %v, want 5", got)
	}
	if !w.Unregister(a) {
		t.Fatal("a not unregistered")
	}
	if got := familyNames(t, w.watched()); !slices.Equal(got, []string{"b_total"}) {
		t.Errorf("watched after unregister: %v", got)
	}
	if got := familyNames(t, w); slices.Contains(got, "a_total") {
		t.Errorf("registry after unregister: %v", got)
	}
}

// TestWatchedRegistryCheck: a watched metric that no collector describes
// is an error naming it, not a poll that never ends; a collector the
// registry refuses is in neither registry.
func TestWatchedRegistryCheck(t *testing.T) {
	w := newWatchedRegistry("a_total", "missing_total")
	w.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "a"}))
	err := w.check()
	if err == nil || !strings.Contains(err.Error(), "missing_total") || strings.Contains(err.Error(), "a_total") {
		t.Errorf("check: %v, want an error naming missing_total alone", err)
	}
	if err := w.Register(prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "a"})); err == nil {
		t.Error("a second a_total registered")
	}
	if got := sumMetrics(w.watched(), "a_total"); got != 0 {
		t.Errorf("watched a_total %v", got)
	}
}

// TestDescName reads a metric's name from its Desc, labels or not.
func TestDescName(t *testing.T) {
	for _, d := range []*prometheus.Desc{
		prometheus.NewDesc("x_total", "help with \"quotes\"", []string{"a"}, prometheus.Labels{"b": "c"}),
		prometheus.NewDesc("y", "", nil, nil),
	} {
		name, err := descName(d)
		if err != nil || (name != "x_total" && name != "y") {
			t.Errorf("descName(%s) = %q, %v", d, name, err)
		}
	}
}
