package stream

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The status page (internal/service) reads a Runtime through these
// methods, its Stage interface; the server adds counters, rates and lag
// from the metrics.

// StatusIdentity returns the stage name, consumer group, instance ID and
// input topic.
func (rt *Runtime) StatusIdentity() (stage, group, instance, input string) {
	return rt.cfg.Stage, rt.cfg.Group, rt.cfg.InstanceID, rt.cfg.InputTopic
}

// Joined reports whether the stage runs a consumer-group session.
func (rt *Runtime) Joined() bool { return rt.joined.Load() }

// Fatal returns the error the stage stopped with (or is stopping with);
// nil while it runs.
func (rt *Runtime) Fatal() error { return rt.takeFatal() }

// EachPartitionStatus calls fn for every input partition assigned to this
// instance, in partition order. A partition is restoring from its
// assignment until its state is rebuilt and checked against the committed
// offset (docs/design.md, Exactly-once, 3), processing after. remaining is
// the number of changelog offsets its restore has left to replay, negative
// when not known (before the replay has read the changelog's end, and once
// it reached it); kind and reason are its last restore's plan (horizon.go),
// empty before the first. fn runs after the runtime's locks are released.
func (rt *Runtime) EachPartitionStatus(fn func(p int32, restoring bool, remaining int64, kind, reason string)) {
	type partStatus struct {
		p            int32
		restoring    bool
		remaining    int64
		kind, reason string
	}
	left := restoreRemaining(rt.m.restoring)
	rt.mu.Lock()
	out := make([]partStatus, 0, len(rt.parts))
	for _, p := range sortedPartitions(rt.parts) {
		s := partStatus{p: p, restoring: rt.parts[p].cancel != nil, remaining: -1} // cancel: the restore goroutine runs
		if pl, ok := rt.lastRestore(p); ok {
			s.kind, s.reason = pl.Kind(), pl.Reason
		}
		if n := left[p]; s.restoring && n > 0 {
			s.remaining = n
		}
		out = append(out, s)
	}
	rt.mu.Unlock()
	for _, s := range out {
		fn(s.p, s.restoring, s.remaining, s.kind, s.reason)
	}
}

// restoreRemaining reads the restore gauge of every partition without
// creating series (WithLabelValues would).
func restoreRemaining(g *prometheus.GaugeVec) map[int32]int64 {
	ch := make(chan prometheus.Metric, 16)
	go func() {
		g.Collect(ch)
		close(ch)
	}()
	out := map[int32]int64{}
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) != nil {
			continue
		}
		for _, l := range d.GetLabel() {
			if l.GetName() != "partition" {
				continue
			}
			if p, err := strconv.ParseInt(l.GetValue(), 10, 32); err == nil {
				out[int32(p)] = int64(d.GetGauge().GetValue())
			}
		}
	}
	return out
}
