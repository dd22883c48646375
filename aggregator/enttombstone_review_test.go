package aggregator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsDeleteUnderInvalidCustomerRejected: a delete under the
// key of a customer_id no record can have is rejected invalid and counted
// (it was applied: state kept for its key for as long as the state
// lives); the partition goes on deciding.
func TestEntitlementsDeleteUnderInvalidCustomerRejected(t *testing.T) {
	h := newEntHarness(t, nil, 1)
	t0 := time.Now().Add(-time.Minute).UnixMilli()
	h.produce(h.entitlement(1, acmeCap(1), t0))
	for i, c := range []string{"ac\x1bme", strings.Repeat("x", 4096)} {
		h.produce(&kgo.Record{Topic: h.names.EntitlementsTopic(), Key: schemas.CustomerKey(c), Timestamp: time.UnixMilli(t0 + 1 + int64(i))})
	}
	h.produce(h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, t0+5000)...)
	for i := range 2 {
		at := t0 + 100 + int64(i)
		h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprint("e", i), CustomerID: "acme", Meter: "m1", Quantity: 1, EventTime: at, IngestTime: at}))
	}
	run, reg := h.startMetered()
	h.caughtUp()
	deadline := time.Now().Add(20 * time.Second)
	for len(readRejected(t, h)) < 3 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	rejected := counterOf(reg, "meterline_rejected_total")
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(rejectedReasons(t, h)); got != "[:invalid :invalid e1:over_limit]" {
		t.Errorf("rejected %s, want both deletes invalid, then acme's second event over its cap of 1", got)
	}
	if rejected != 3 {
		t.Errorf("meterline_rejected_total %v, want 3", rejected)
	}
}
