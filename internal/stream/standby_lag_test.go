package stream

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
)

// gateWarm is warmProc whose first Warm waits until release is closed,
// after sending its partition on started: a standby tail held while it
// builds its warm structures, as dedup's Bloom filters of a large state
// take seconds.
type gateWarm struct {
	*warmProc
	once    sync.Once
	started chan int32
	release chan struct{}
}

func (g *gateWarm) Warm(p int32, st *PartitionState) (WarmState, error) {
	g.once.Do(func() {
		g.started <- p
		<-g.release
	})
	return g.warmProc.Warm(p, st)
}

// lagExported reports whether reg exports
// meterline_stream_standby_lag_records of partition p.
func lagExported(t *testing.T, reg prometheus.Gatherer, p int32) bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "meterline_stream_standby_lag_records" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" && l.GetValue() == fmt.Sprint(p) {
					return true
				}
			}
		}
	}
	return false
}

// TestStandbyLagNotExportedAfterPromotion: a standby tail promoted while
// it still builds its warm structures (its owner died just after the
// standby started) stops without exporting a lag for the partition, which
// this instance now owns: a lag series left behind would show a standby
// copy that no longer exists, forever behind (MeterlineStandbyFallingBehind).
func TestStandbyLagNotExportedAfterPromotion(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	standby := func(c *Config) { c.StandbyReplicas = 1 }
	procB := &gateWarm{warmProc: &warmProc{countProc: &countProc{output: s.output}, opened: map[int32]openInfo{}},
		started: make(chan int32, 1), release: make(chan struct{})}
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	a := s.startProc("a", fsA, &warmProc{countProc: &countProc{output: s.output}, opened: map[int32]openInfo{}}, standby)
	b := s.startProc("b", fsB, procB, standby)
	var p int32
	select {
	case p = <-procB.started:
	case <-time.After(30 * time.Second):
		t.Fatal("b's standby tail did not start")
	}
	s.waitFor("one partition each", func() bool { return a.owned() == 1 && b.owned() == 1 })
	a.shutdown()
	// The assignment that promotes b stops the tail, still in Warm.
	s.waitFor("b's tail of partition to be stopped", func() bool {
		b.rt.sb.mu.Lock()
		defer b.rt.sb.mu.Unlock()
		_, running := b.rt.sb.tails[p]
		return !running
	})
	close(procB.release)
	s.waitFor("b to own both partitions", func() bool { return b.owned() == 2 })
	if lagExported(t, b.reg, p) {
		t.Fatalf("b exports a standby lag of partition %d, which it owns and no longer copies", p)
	}
	s.finish(b, fsB)
}
