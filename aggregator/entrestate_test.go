package aggregator

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsRestateBehindLastOrigin: a customer's record whose
// broker time is ahead of the broker clock that appends the aggregator's
// later records (a broker clock that stepped back; here the test gives
// the record a time an hour ahead and the aggregator stamps its own with
// the wall clock, as LogAppendTime would after the step back), then a
// misrouted older record of the customer. Its copy is stale and the
// aggregator restates the customer's record once (docs/entitlements.md,
// The aggregator, step 1): the restatement is marked with that record's
// origin, so it is stale too and changes nothing. It must not be restated
// again: the customer's canonical partition gets the record, the copy and
// at most one restatement.
func TestEntitlementsRestateBehindLastOrigin(t *testing.T) {
	const n = 2
	h := newEntHarness(t, nil, n)
	key := schemas.CustomerKey("acme")
	canon := schemas.Partition(key, n)
	wrong := (canon + 1) % n
	plan := func(name string) []byte {
		return schemas.MustEncode(&schemas.Entitlements{CustomerID: "acme", Plan: name, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}})
	}
	a := h.start(h.entConfig("a", vfs.NewMem()))
	defer func() { _ = a.stop() }()
	ahead := time.Now().Add(time.Hour)
	h.produce(&kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: canon, Key: key, Value: plan("new"), Timestamp: ahead})
	testenv.WaitCaughtUp(t, h.brokers, h.group, h.names.EntitlementsTopic(), time.Minute)
	h.produce(&kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: wrong, Key: key, Value: plan("old"), Timestamp: time.Now()})
	time.Sleep(3 * time.Second)
	if got := len(h.canonRecords(n, "acme")); got > 3 {
		t.Fatalf("%d records of acme on its canonical partition 3s after the misrouted one, want at most 3 (the record, the copy, one restatement): the restatement is restated again", got)
	}
}
