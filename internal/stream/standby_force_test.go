package stream

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// TestStandbyForceBackoff: a member asks for a rebalance once its
// deferred copy is caught up by its own reckoning (the changelog's end),
// but the leader judges it against the owner's checkpoint written when
// the owner joined, later: on a busy changelog the leader may defer the
// partition again, every time. Asking again every standbyForceInterval
// would then stop the whole group every 10 s for as long as the load
// lasts; each rebalance that leaves a number it asked for deferred
// doubles the interval (up to standbyForceMaxInterval), and one that
// takes them resets it.
func TestStandbyForceBackoff(t *testing.T) {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	sb := &standbys{rt: &Runtime{log: zap.NewNop()}, tails: map[int32]*tail{}}
	sb.client.Store(cl)
	tl := &tail{p: 0}
	tl.pos.Store(1000)
	tl.end.Store(1000)
	sb.tails[0] = tl
	forced := func(ago time.Duration) bool {
		t.Helper()
		sb.mu.Lock()
		sb.lastForce = time.Now().Add(-ago)
		sb.mu.Unlock()
		before := sb.lastForce
		sb.maybeForce()
		return sb.lastForce != before
	}
	pending := func(ps ...int32) {
		sb.mu.Lock()
		sb.setPending(ps)
		sb.mu.Unlock()
	}
	pending(0)
	if !forced(standbyForceInterval + time.Second) {
		t.Fatal("a caught-up deferred copy did not ask for a rebalance")
	}
	for k, wait := range []time.Duration{2 * standbyForceInterval, 4 * standbyForceInterval, 8 * standbyForceInterval} {
		pending(0) // deferred again by the leader
		if forced(wait/2 + time.Second) {
			t.Fatalf("deferred again %d times, asked again after %s; want %s", k+1, wait/2+time.Second, wait)
		}
		if !forced(wait + time.Second) {
			t.Fatalf("deferred again %d times, did not ask again after %s", k+1, wait+time.Second)
		}
	}
	for range 10 {
		pending(0)
		forced(standbyForceMaxInterval + time.Second)
	}
	pending(0)
	if !forced(standbyForceMaxInterval + time.Second) {
		t.Fatalf("the interval grew past %s", standbyForceMaxInterval)
	}
	pending() // taken
	pending(0)
	if !forced(standbyForceInterval + time.Second) {
		t.Fatal("after a rebalance that took the deferred numbers, the interval was not reset")
	}
}
