package aggregator

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsRejectedRunRestatedOnce: a customer's record in effect
// of about 270 KB, then 200 invalid records of the customer of a few dozen
// bytes each, written at once. Each was followed by the record in effect,
// restated (docs/entitlements.md, The aggregator, 1): 54 MB written for
// 10 KB read, at a producer's will. The records rejected one after
// another are followed by one restatement: the last record of the key
// is still the one in effect, and each rejected record is in
// usage.rejected.
func TestEntitlementsRejectedRunRestatedOnce(t *testing.T) {
	h := newEntHarness(t, nil, 1)
	big := &schemas.Entitlements{CustomerID: "acme", Plan: "big", Grants: bigGrants("g"), Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	bad := &schemas.Entitlements{CustomerID: "acme", Caps: []schemas.Cap{{Meter: "m", OnLimit: schemas.OnLimitReject}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	t0 := time.Now().Add(-time.Minute).UnixMilli()
	h.produce(h.entitlement(1, big, t0))
	const n = 200
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, h.entitlement(1, bad, t0+1+int64(i)))
	}
	h.produce(recs...)
	h.runPastRecords(t, "acme", t0+1000)
	if rej := readRejected(t, h); len(rej) != n {
		t.Fatalf("%d rejected, want %d", len(rej), n)
	}
	var restated int
	var last *kgo.Record
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.EntitlementsTopic()) {
		if string(r.Key) != string(schemas.CustomerKey("acme")) {
			continue
		}
		last = r
		if _, ok := headerValue(r, HeaderRerouted); ok {
			restated++
		}
	}
	if restated == 0 || restated > 5 {
		t.Errorf("%d restated records after %d rejected in a row, want one per batch read", restated, n)
	}
	if _, ok := headerValue(last, HeaderRerouted); !ok || string(last.Value) != string(schemas.MustEncode(big)) {
		t.Errorf("the last record of acme is not the one in effect, restated")
	}
}
