package aggregator

import (
	"fmt"
	"maps"
	"testing"
	"time"
)

// changedTimes is the open transaction's changed customers with their
// times.
func changedTimes(e *entPart) map[string]int64 {
	m := map[string]int64{}
	for c, i := range e.changed {
		m[c] = e.changedAt[i]
	}
	return m
}

// TestChangedTimeAcrossTransactions: a customer's change time in a
// transaction (entPart.changed, what Flush makes pending) is the latest
// arrival of its events accepted in that transaction, also when its entry
// of accounts kept where an earlier transaction noted its time: Flush
// empties changed, and every entry's index into it is forgotten with it
// (changedGen). An entry that kept its index would note the customer's
// time in the slot another customer took since.
func TestChangedTimeAcrossTransactions(t *testing.T) {
	r := newPendingRun(t, 1000)
	cs := pendingCustomers(2)
	a, b := cs[0], cs[1]
	name := func(c int) string { return fmt.Sprintf("cust-%05d", c) }
	at := func(ms int) time.Time { return procBenchNow.Add(time.Duration(ms) * time.Millisecond) }
	check := func(want map[string]int64) {
		t.Helper()
		if got := changedTimes(r.pt.ent); !maps.Equal(got, want) {
			t.Fatalf("changed customers and times %v, want %v", got, want)
		}
	}
	r.eventsAt([]int{a}, at(-10))
	check(map[string]int64{name(a): at(-10).UnixMilli()})
	r.commit()
	check(map[string]int64{})
	// b first: it takes the slot a had; a later arrival of a in the same
	// transaction raises a's time, an earlier one does not lower it.
	r.eventsAt([]int{b}, at(-5))
	r.eventsAt([]int{a}, at(-3))
	r.eventsAt([]int{a}, at(0))
	r.eventsAt([]int{a}, at(-8))
	check(map[string]int64{name(a): at(0).UnixMilli(), name(b): at(-5).UnixMilli()})
	r.commit()
	check(map[string]int64{})
}
