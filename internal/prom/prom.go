// Package prom registers Meterline's Prometheus metrics: get-or-register
// helpers, so that stages sharing a registry (`meterline run`) or restarted
// in-process (the demo) reuse their metrics, and the counters every stage
// shares. It depends on nothing of Meterline, so the stage runtimes and the
// HTTP side (internal/service) both use it without depending on each other.
package prom

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// GetOrRegister registers c, or returns the equal collector registered
// before. Stages that share a registry (`meterline run`) or are restarted
// in-process (the demo) reuse their metrics instead of failing.
func GetOrRegister[T prometheus.Collector](reg prometheus.Registerer, c T) T {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				return existing
			}
		}
		panic(err) // a programming error: another metric took the name
	}
	return c
}

// RejectedCounter returns meterline_rejected_total{stage,reason}, shared by
// every stage of a process, with a series at 0 for each of the reasons the
// stage can give: a series born at its first increment hides that
// increment from rate() and increase(), so a single burst of rejections of
// a new reason would show on no dashboard and fire no alert.
func RejectedCounter(reg prometheus.Registerer, stage string, reasons ...string) *prometheus.CounterVec {
	c := GetOrRegister(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meterline_rejected_total",
		Help: "Records parked in usage.rejected, by stage and reason."}, []string{"stage", "reason"}))
	for _, r := range reasons {
		c.WithLabelValues(stage, r)
	}
	return c
}

// Factory makes metrics like promauto.With, but with GetOrRegister.
type Factory struct{ reg prometheus.Registerer }

// NewFactory returns a Factory registering on reg.
func NewFactory(reg prometheus.Registerer) Factory { return Factory{reg: reg} }

// NewCounterVec gets or registers a counter vector.
func (f Factory) NewCounterVec(o prometheus.CounterOpts, labels []string) *prometheus.CounterVec {
	return GetOrRegister(f.reg, prometheus.NewCounterVec(o, labels))
}

// NewGaugeVec gets or registers a gauge vector.
func (f Factory) NewGaugeVec(o prometheus.GaugeOpts, labels []string) *prometheus.GaugeVec {
	return GetOrRegister(f.reg, prometheus.NewGaugeVec(o, labels))
}

// NewCounter gets or registers a counter.
func (f Factory) NewCounter(o prometheus.CounterOpts) prometheus.Counter {
	return GetOrRegister(f.reg, prometheus.NewCounter(o))
}

// NewGauge gets or registers a gauge.
func (f Factory) NewGauge(o prometheus.GaugeOpts) prometheus.Gauge {
	return GetOrRegister(f.reg, prometheus.NewGauge(o))
}

// NewHistogram gets or registers a histogram.
func (f Factory) NewHistogram(o prometheus.HistogramOpts) prometheus.Histogram {
	return GetOrRegister(f.reg, prometheus.NewHistogram(o))
}

// Owners records which open instance of each partition owns the
// partition's series (gauges labelled by partition). The stream runtime
// opens a partition's new instance while restoring it and closes the old
// one afterwards, when the partition was revoked and assigned back to the
// same process; the old instance must not delete the series the new one
// set, or they vanish until the process restarts. Safe for concurrent use.
type Owners struct {
	mu sync.Mutex
	m  map[int32]any
}

// Own makes who the owner of partition p's series.
func (o *Owners) Own(p int32, who any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[int32]any{}
	}
	o.m[p] = who
}

// Release reports whether who owns partition p's series, and if so makes
// no one the owner: the caller then deletes them.
func (o *Owners) Release(p int32, who any) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m[p] != who {
		return false
	}
	delete(o.m, p)
	return true
}

// TxCounts gathers a transaction's counts (docs/operations.md, Health,
// metrics and logs): Add keeps them in memory, Commit adds them to their
// counters once the transaction committed, and Drop forgets them when it
// aborts, so that a record processed again after an abort is counted once,
// as its outputs are. Counts of one counter in a row cost a comparison and
// an addition, no atomic operation on a counter shared by the partitions'
// goroutines. The zero value is ready; a TxCounts belongs to one partition
// (not safe for concurrent use).
type TxCounts struct {
	cs   []prometheus.Counter
	ns   []float64
	last int // index of the counter of the last Add
}

// Add counts n into c in the open transaction.
func (t *TxCounts) Add(c prometheus.Counter, n float64) {
	if t.last < len(t.cs) && t.cs[t.last] == c {
		t.ns[t.last] += n
		return
	}
	for i, x := range t.cs {
		if x == c {
			t.ns[i] += n
			t.last = i
			return
		}
	}
	t.cs, t.ns, t.last = append(t.cs, c), append(t.ns, n), len(t.cs)
}

// Inc counts 1 into c in the open transaction.
func (t *TxCounts) Inc(c prometheus.Counter) { t.Add(c, 1) }

// Commit adds the transaction's counts to their counters and starts the
// next transaction's.
func (t *TxCounts) Commit() {
	for i, c := range t.cs {
		if t.ns[i] != 0 {
			c.Add(t.ns[i])
		}
	}
	t.Drop()
}

// Drop forgets the transaction's counts.
func (t *TxCounts) Drop() {
	clear(t.cs)
	t.cs, t.ns, t.last = t.cs[:0], t.ns[:0], 0
}
