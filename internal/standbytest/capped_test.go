package standbytest

import (
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// placedFewer is the line an instance logs when the group places fewer
// standby copies per partition than it asks for.
const placedFewer = "the group places fewer standby copies per partition than --standby-replicas asks for: a failover may find no warm copy"

// TestRealStandbyReplicasCapped: two dedup instances with
// `--standby-replicas 2` keep one copy of the partition, not two, and
// each says so (docs/operations.md, Standby replicas); once a third
// joins, the group holds the two copies and none of them says it again.
func TestRealStandbyReplicasCapped(t *testing.T) {
	w := newWorld(t, "standby-capped")
	a := w.dedup("a", 2)
	b := w.dedup("b", 2)
	start := time.Now()
	for _, p := range []*testenv.Process{a, b} {
		for {
			l := lastLine(t, p, placedFewer, start, 90*time.Second)
			if l.Int("members") == 2 {
				if l.Int("placed") != 1 || l.Int("standby_replicas") != 2 || l.Int("leader_standby_replicas") != 2 {
					t.Errorf("%s: %v; want placed 1 of standby_replicas 2", p.Name(), l.Fields)
				}
				break
			}
			start = l.TS.Add(time.Millisecond) // a alone: placed 0
		}
		start = time.Now().Add(-time.Minute)
	}

	c := w.dedup("c", 2)
	joined := lastLine(t, c, "standby assignment", time.Now().Add(-time.Minute), 90*time.Second)
	time.Sleep(3 * time.Second) // a and b log their syncs of the same generation
	for _, p := range []*testenv.Process{a, b, c} {
		for _, l := range p.Lines(placedFewer) {
			if !l.TS.Before(joined.TS) {
				t.Errorf("%s still warns with three members: %v", p.Name(), l.Fields)
			}
		}
	}
	for _, p := range []*testenv.Process{c, b, a} {
		p.Stop(t)
	}
}
