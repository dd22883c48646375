package stream

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestStandbyJoinDefersToMemberWithoutReplicas: the group's leader runs
// with --standby-replicas 1 and a member with 0 joins it (a rolling
// restart that turns standbys on or off). The leader decides, with its
// own value: it defers the joiner's share to it as a standby, and the
// joiner copies it and takes it once caught up, as a member with standbys
// does; it does not sit without partitions for as long as the group lasts.
func TestStandbyJoinDefersToMemberWithoutReplicas(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	a := s.startProc("a", fsA, &warmProc{countProc: &countProc{output: s.output}, opened: map[int32]openInfo{}},
		func(c *Config) { c.StandbyReplicas = 1 })
	s.waitFor("a to own both partitions", func() bool { return a.owned() == 2 })
	for range 20 {
		s.send(10)
		time.Sleep(20 * time.Millisecond)
	}
	s.caughtUp()
	b := s.startProc("b", fsB, &warmProc{countProc: &countProc{output: s.output}, opened: map[int32]openInfo{}}, func(*Config) {})
	s.waitFor("b to take its share", func() bool { return b.owned() == 1 && a.owned() == 1 })
	if full := b.metric("meterline_stream_restores_total", "kind", "full"); full != 0 {
		t.Fatalf("b restored %v partitions in full", full)
	}
	s.send(20)
	s.caughtUp()
	b.shutdown()
	s.finish(a, fsA)
}
