package stream

import (
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// keeperProc is warmProc whose partitions keep their warm structures through
// a revoke (Keeper): a copy of the partition's keys as applied, read from
// the state when the partition is revoked. Open records every warm state
// it is handed that differs from the restored state.
type keeperProc struct {
	*warmProc
	mu         sync.Mutex
	warmOpens  int
	mismatches []string
}

type keeperPart struct {
	*countPart
	st *PartitionState
}

func (k *keeperPart) Keep() WarmState {
	m, err := stateKeys(k.st)
	if err != nil {
		return nil
	}
	return &warmKeys{m: m}
}

func (k *keeperProc) Open(p int32, st *PartitionState) (Partition, error) {
	if wk, ok := st.Warm().(*warmKeys); ok {
		m, err := stateKeys(st)
		if err != nil {
			return nil, err
		}
		k.mu.Lock()
		k.warmOpens++
		if !maps.Equal(m, wk.m) {
			k.mismatches = append(k.mismatches, "partition "+string(rune('0'+p)))
		}
		k.mu.Unlock()
	}
	part, err := k.countProc.Open(p, st)
	if err != nil {
		return nil, err
	}
	return &keeperPart{countPart: part.(*countPart), st: st}, nil
}

// TestStandbyKeptAndPromotedWarmState: a partition's warm state goes from
// owner to standby and back while input flows and members come and go:
// kept by a revoked owner given its partition straight back (keep.go),
// dropped when the partition moves on, kept warm by a standby tail and
// handed to it when promoted. Every warm state Open is handed equals the
// state it opens on, and every input is counted exactly once.
func TestStandbyKeptAndPromotedWarmState(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	standby := func(c *Config) { c.StandbyReplicas = 1 }
	newProc := func() *keeperProc {
		return &keeperProc{warmProc: &warmProc{countProc: &countProc{output: s.output}, opened: map[int32]openInfo{}}}
	}
	fsA, fsB, fsC := vfs.NewMem(), vfs.NewMem(), vfs.NewMem()
	procA := newProc()
	a := s.startProc("a", fsA, procA, standby)
	s.waitFor("a to own both partitions", func() bool { return a.owned() == 2 })
	load := func(rounds int) {
		for range rounds {
			s.send(10)
			time.Sleep(10 * time.Millisecond)
		}
	}
	load(10)
	b := s.startProc("b", fsB, newProc(), standby)
	load(20)
	s.waitFor("b to take its share", func() bool { return a.owned() == 1 && b.owned() == 1 })
	load(10)
	c := s.startProc("c", fsC, newProc(), standby)
	load(20)
	b.shutdown()
	load(20)
	s.waitFor("a and c to own both partitions", func() bool { return a.owned()+c.owned() == 2 })
	load(10)
	s.caughtUp()
	c.shutdown()
	s.waitFor("a to own both partitions", func() bool { return a.owned() == 2 })
	kept := a.metric("meterline_stream_partition_opens_total", "warm", "kept")
	standbyOpens := a.metric("meterline_stream_partition_opens_total", "warm", "standby")
	procA.mu.Lock()
	t.Logf("a opened %d partitions with warm state (%v kept, %v a standby's); mismatched: %v", procA.warmOpens, kept, standbyOpens, procA.mismatches)
	if len(procA.mismatches) > 0 {
		t.Errorf("a opened partitions with warm state that differs from its store: %v", procA.mismatches)
	}
	procA.mu.Unlock()
	s.finish(a, fsA)
}
