package stream

import (
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/meterline/meterline/internal/service"
)

// Status reports the instance for the status page (service.Server.
// AddStatus): its group, whether it runs a session, why it stopped, and
// every input partition assigned to it with its restore state. A
// partition is restoring from its assignment until its state is rebuilt
// and checked against the committed offset (DESIGN §6.4), processing after.
// The server adds counters, rates and lag from the metrics.
func (rt *Runtime) Status() service.StageStatus {
	joined := rt.joined.Load()
	st := service.StageStatus{
		Stage:    rt.cfg.Stage,
		Group:    rt.cfg.Group,
		Instance: rt.cfg.InstanceID,
		Input:    rt.cfg.InputTopic,
		Joined:   &joined,
	}
	remaining := restoreRemaining(rt.m.restoring)
	rt.mu.Lock()
	if rt.fatal != nil {
		st.Error = rt.fatal.Error()
	}
	st.Partitions = make([]service.PartitionStatus, 0, len(rt.parts))
	for p, ps := range rt.parts {
		s := service.PartitionStatus{Partition: p, State: service.PartitionProcessing}
		if pl, ok := rt.lastRestore(p); ok {
			s.RestoreKind, s.RestoreReason = pl.Kind(), pl.Reason
		}
		if ps.cancel != nil { // restore goroutine still running
			s.State = service.PartitionRestoring
			// Zero until the replay has read the changelog's end (and
			// again once it reached it): not known, rather than done.
			if n := remaining[p]; n > 0 {
				s.RestoreRemaining = &n
			}
		}
		st.Partitions = append(st.Partitions, s)
	}
	rt.mu.Unlock()
	slices.SortFunc(st.Partitions, func(a, b service.PartitionStatus) int { return int(a.Partition - b.Partition) })
	return st
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
