package stream

import (
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// warmProc is countProc with warm state (Warmer): a copy of the partition's
// keys, kept by the standby's Apply. Open records whether it got one and
// whether it matched the restored state.
type warmProc struct {
	*countProc
	mu     sync.Mutex
	opened map[int32]openInfo
}

type openInfo struct {
	warm    bool
	matches bool // the warm copy equals the state's keys
	keys    int
}

type warmKeys struct{ m map[string]string }

func (w *warmKeys) Apply(k, v []byte) {
	if v == nil {
		delete(w.m, string(k))
		return
	}
	w.m[string(k)] = string(v)
}

func stateKeys(st *PartitionState) (map[string]string, error) {
	m := map[string]string{}
	err := st.Scan(nil, nil, func(k, v []byte) error { m[string(k)] = string(v); return nil })
	return m, err
}

func (w *warmProc) Warm(p int32, st *PartitionState) (WarmState, error) {
	m, err := stateKeys(st)
	return &warmKeys{m: m}, err
}

func (w *warmProc) Open(p int32, st *PartitionState) (Partition, error) {
	info := openInfo{}
	if wk, ok := st.Warm().(*warmKeys); ok {
		m, err := stateKeys(st)
		if err != nil {
			return nil, err
		}
		info = openInfo{warm: true, matches: maps.Equal(m, wk.m), keys: len(m)}
	}
	w.mu.Lock()
	w.opened[p] = info
	w.mu.Unlock()
	return w.countProc.Open(p, st)
}

// TestStandbyFailover: two instances with one standby replica each own one
// partition and keep the other's warm. When one leaves, the other takes its
// partition, restores only the changelog's tail past its standby
// checkpoint (not the partition's whole changelog), hands the processor
// its warm state in step with the restored store, and counts every input
// exactly once.
func TestStandbyFailover(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	standby := func(c *Config) { c.StandbyReplicas = 1 }
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	procB := &warmProc{countProc: &countProc{output: s.output}, opened: map[int32]openInfo{}}
	a := s.startProc("a", fsA, &warmProc{countProc: &countProc{output: s.output}, opened: map[int32]openInfo{}}, standby)
	b := s.startProc("b", fsB, procB, standby)
	s.waitFor("one partition each", func() bool { return a.owned() == 1 && b.owned() == 1 })
	s.waitFor("one standby each", func() bool {
		return a.metric("meterline_stream_standby_partitions") == 1 && b.metric("meterline_stream_standby_partitions") == 1
	})
	// Many small transactions: a long changelog.
	for range 30 {
		s.send(10)
		time.Sleep(30 * time.Millisecond)
	}
	s.caughtUp()
	var aOwns int32 = -1
	a.rt.EachPartitionStatus(func(p int32, _ bool, _ int64, _, _ string) { aOwns = p })
	ends := s.changelogEnd()
	s.waitFor("b's standby copy to catch up", func() bool {
		caught := false
		b.rt.EachStandbyStatus(func(p int32, off, lag int64) { caught = p == aOwns && off >= ends[p] })
		return caught
	})
	if got := b.metric("meterline_stream_standby_records_total"); got < 100 {
		t.Fatalf("b's standby applied %v changelog records, want the partition's (≥ 100)", got)
	}
	restoredBefore := b.metric("meterline_stream_restore_records_total")

	a.shutdown()
	s.waitFor("b to own both partitions", func() bool { return b.owned() == 2 })
	replayed := b.metric("meterline_stream_restore_records_total") - restoredBefore
	full := ends[aOwns]
	t.Logf("b took partition %d: replayed %v changelog records of %d", aOwns, replayed, full)
	if replayed > float64(full)/10 {
		t.Fatalf("the promoted standby replayed %v changelog records, want only the tail past its checkpoint (the changelog holds %d)", replayed, full)
	}
	procB.mu.Lock()
	info := procB.opened[aOwns]
	procB.mu.Unlock()
	if !info.warm || !info.matches || info.keys == 0 {
		t.Fatalf("Open of the promoted partition: %+v, want the standby's warm state, equal to the restored state", info)
	}
	if n := b.metric("meterline_stream_restores_total", "kind", "tail"); n < 1 {
		t.Fatalf("tail restores %v", n)
	}
	s.finish(b, fsB)
}

// TestStandbyJoinDefers: a cold instance joining a warm one with standbys
// takes nothing at first; it tails as a standby, asks for a rebalance when
// caught up, and then takes its share with a tail restore.
func TestStandbyJoinDefers(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	standby := func(c *Config) { c.StandbyReplicas = 1 }
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	a := s.startProc("a", fsA, &warmProc{countProc: &countProc{output: s.output}, opened: map[int32]openInfo{}}, standby)
	s.waitFor("a to own both partitions", func() bool { return a.owned() == 2 })
	for range 20 {
		s.send(10)
		time.Sleep(20 * time.Millisecond)
	}
	s.caughtUp()
	b := s.startProc("b", fsB, &warmProc{countProc: &countProc{output: s.output}, opened: map[int32]openInfo{}}, standby)
	s.waitFor("b to be a standby", func() bool { return b.metric("meterline_stream_standby_partitions") >= 1 })
	if b.owned() != 0 {
		t.Fatalf("the cold joiner owns %d partitions at once", b.owned())
	}
	s.waitFor("b to take its share", func() bool { return b.owned() == 1 && a.owned() == 1 })
	if full := b.metric("meterline_stream_restores_total", "kind", "full"); full != 0 {
		t.Fatalf("b restored %v partitions in full", full)
	}
	b.shutdown()
	s.finish(a, fsA)
}
