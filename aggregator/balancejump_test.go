package aggregator

import (
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// TestBalancesAfterBrokerClockJumpedBack: the entitlements partition's
// broker clock jumps a day ahead for one record (an NTP step, a leader
// with a skewed clock for a moment) and then reads the wall clock again.
// The partition's broker time (the latest read) stays a day ahead, but the
// ticks the aggregator appends keep moving, a second apart: a customer's
// pending balance still goes out about --balance-interval after its change,
// not a day later. Each event here is decided in a transaction of its own.
func TestBalancesAfterBrokerClockJumpedBack(t *testing.T) {
	r := newBalanceRun(t)
	r.h.start(r.config(time.Second))
	r.first()
	// One record a day ahead; the aggregator's own ticks after it are
	// stamped with the wall clock again.
	r.h.produce(r.h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, time.Now().Add(24*time.Hour).UnixMilli())...)
	// The first change after the jump goes out at once: the partition's
	// broker time is a day past the last emission.
	r.event()
	awaitBalances(t, r.h, "usage 2", usageIs("acme", 2))
	// The next ones go out an interval after they were decided, as the
	// ticks move the read time a second on.
	for range 2 {
		r.event()
		awaitBalances(t, r.h, "the latest event's usage", usageIs("acme", int64(r.n)))
	}
	checkRevisions(t, balancesOf(t, r.h, "acme"))
}
