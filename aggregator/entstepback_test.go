package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestSteppedBackRecordBalance (kfake; docs/entitlements.md, The ordering
// rule: broker time): a customer's record whose broker time is behind the
// latest one read from its partition (a broker clock that stepped back)
// counts as read at that latest time, and so does the balance it writes:
// a cap raised so shows in the customer's next balance, as the aggregator
// now decides it. A balance as of the record's own broker time would say
// the cap before it.
func TestSteppedBackRecordBalance(t *testing.T) {
	const n = 1
	h := newEntHarness(t, nil, n)
	t0 := time.Now().Add(-90 * time.Second).Truncate(time.Second).UnixMilli()
	capOf := func(limit int64) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: "acme", Plan: fmt.Sprint("cap-", limit), Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
			Caps: []schemas.Cap{{Meter: "api_calls", Limit: limit, OnLimit: schemas.OnLimitReject}}}
	}
	recs := []*kgo.Record{h.entitlement(n, capOf(2), t0)}
	for i := range 2 {
		at := t0 + 1000 + int64(i)*100
		recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprint("e", i), CustomerID: "acme", Meter: "api_calls",
			Quantity: 1, EventTime: at, IngestTime: at}))
	}
	// The partition is read up to now, then comes the raise, stamped 5s
	// after t0: behind.
	recs = append(recs, h.shared(n, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, time.Now().UnixMilli())...)
	h.produce(recs...)
	run := h.start(h.entConfig("a", vfs.NewMem()))
	defer func() {
		if err := run.stop(); err != nil {
			t.Error(err)
		}
	}()
	awaitBalances(t, h, "usage 2 of 2", func(bs map[string]*schemas.Balance) bool {
		b := bs["acme"]
		return b != nil && len(b.Meters) == 1 && b.Meters[0].Usage == 2
	})
	n0 := len(balancesOf(t, h, "acme"))
	h.produce(h.entitlement(n, capOf(10), t0+5000))
	deadline := time.Now().Add(30 * time.Second)
	for len(balancesOf(t, h, "acme")) == n0 {
		if time.Now().After(deadline) {
			t.Fatal("no balance of acme after its record after 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	bs := balancesOf(t, h, "acme")
	if b := bs[len(bs)-1]; b.Plan != "cap-10" || b.Meters[0].Limit != 10 {
		t.Errorf("acme's balance after its raise: plan %q, limit %d as of %d; want cap-10's 10", b.Plan, b.Meters[0].Limit, b.UpdatedAt)
	}
}
