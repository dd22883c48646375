package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsMovedMarkOnOwnPartitionDeletes: a delete marked moved
// (HeaderMoved) found on its customer's own partition is no mark of the
// aggregator's, which writes them on wrong partitions only: a client
// wrote it, and it deletes the customer's entitlements like any delete.
// Skipped, the customer's cap of 5 would reject 3 of the 8 events.
func TestEntitlementsMovedMarkOnOwnPartitionDeletes(t *testing.T) {
	const n = 2
	h := newEntHarness(t, nil, n)
	key := schemas.CustomerKey("acme")
	canon := schemas.Partition(key, n)
	a := h.start(h.entConfig("a", vfs.NewMem()))
	capped := &kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: canon, Key: key, Timestamp: time.Now(),
		Value: schemas.MustEncode(acmeCap(5))}
	h.produce(capped)
	h.produce(&kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: canon, Key: key, Timestamp: time.Now(),
		Headers: []kgo.RecordHeader{{Key: HeaderMoved, Value: fmt.Append(nil, capped.Offset)}}})
	var recs []*kgo.Record
	for i := range 8 {
		at := time.Now().UnixMilli()
		recs = append(recs, h.dedupedEvent(canon, &schemas.DedupedEvent{EventID: fmt.Sprint("e", i), CustomerID: "acme",
			Meter: "m1", Quantity: 1, EventTime: at, IngestTime: at}))
	}
	h.produce(recs...)
	awaitDecided(t, h, 8)
	for _, r := range readRejected(t, h) {
		t.Errorf("%s rejected %s: %s (the cap deleted by the marked delete on acme's partition applied)", r.EventID, r.Reason, r.Detail)
	}
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
}
