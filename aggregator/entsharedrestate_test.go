package aggregator

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsSharedRejectedRestated (kfake; docs/entitlements.md, The
// aggregator, 1): a record under a shared key (the default plan, the rate
// card) that the aggregator rejects, undecodable or refused by the Ledger,
// after a valid one it applied. The rejected record leaves the valid one
// in effect, and the aggregator writes that one again after it, byte for
// byte, marked with its origin: the last record of the key on the
// partition, which compaction keeps, is the one in effect. The aggregator
// reads the bad record on a state restored from its changelog (a new
// local store), and its restatement read back is not restated again. A
// new group reading the topic as compaction leaves it decides the events
// as the running aggregator did: a cap of the default plan, a price of
// the rate card.
func TestEntitlementsSharedRejectedRestated(t *testing.T) { testSharedRejected(t, nil) }

func TestRealEntitlementsSharedRejectedRestated(t *testing.T) {
	testSharedRejected(t, testenv.RealKafka(t))
}

func testSharedRejected(t *testing.T, brokers []string) {
	for _, c := range []struct {
		name string
		key  string
		big  bool
	}{
		{"default plan undecodable", schemas.DefaultPlanKey, false},
		{"rate card undecodable", schemas.RateCardKey, false},
		{"default plan refused by the ledger", schemas.DefaultPlanKey, true},
	} {
		t.Run(c.name, func(t *testing.T) { testSharedRejectedRestated(t, brokers, c.key, c.big) })
	}
}

func testSharedRejectedRestated(t *testing.T, brokers []string, key string, big bool) {
	const n = 1
	h := newEntHarness(t, brokers, n)
	t0 := time.Now().Add(-time.Minute).UnixMilli()
	var valid, bad []*kgo.Record
	switch {
	case key == schemas.RateCardKey:
		// acme's credits pay for one event at the card's price, not two.
		h.produce(h.entitlement(n, &schemas.Entitlements{CustomerID: "acme", Plan: "prepaid",
			Grants: []schemas.Grant{{ID: "g1", Amount: 150}}, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}, t0-1))
		valid = h.shared(n, key, &schemas.RateCard{Versions: []schemas.RateVersion{
			{Rates: []schemas.Rate{{Meter: "m1", MicroCredits: 100, PerUnits: 1}}}}}, t0)
	case big:
		// Two plans of about 530 KB: the second is refused for the
		// bytes of the key's versions (TestEntitlementsVersionsTooLargeRefused).
		valid = h.shared(n, key, bigDefault(2), t0)
		bad = h.shared(n, key, bigDefault(3), t0+1000)
	default:
		valid = h.shared(n, key, &schemas.Entitlements{Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
			Caps: []schemas.Cap{{Meter: "m1", Limit: 2, OnLimit: schemas.OnLimitReject}}}, t0)
	}
	if bad == nil {
		bad = []*kgo.Record{{Topic: h.names.EntitlementsTopic(), Key: []byte(key), Value: []byte("not a record"), Timestamp: time.UnixMilli(t0 + 1000)}}
	}
	h.produce(valid...)
	a := h.start(h.entConfig("a", vfs.NewMem()))
	testenv.WaitCaughtUp(t, h.brokers, h.group, h.names.EntitlementsTopic(), time.Minute)
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}

	// The bad record, read on the state restored from the changelog.
	h.produce(bad...)
	a = h.start(h.entConfig("a", vfs.NewMem()))
	testenv.WaitCaughtUp(t, h.brokers, h.group, h.names.EntitlementsTopic(), time.Minute)
	h.produce(h.acmeEvents(0, "m1", 1, 3)...)
	awaitDecided(t, h, 4)
	time.Sleep(time.Second) // a restatement read back, restated again, would show
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.EntitlementsTopic()) {
		if string(r.Key) == key {
			recs = append(recs, r)
		}
	}
	switch last := recs[len(recs)-1]; {
	case len(recs) > 3:
		t.Errorf("%d records of %s, want 3 (the valid one, the bad one, one restatement)", len(recs), key)
	case !bytes.Equal(last.Value, valid[0].Value):
		t.Errorf("the last of %d records of %s (offset %d) is not the one in effect: compaction keeps the rejected one", len(recs), key, last.Offset)
	default:
		if o, copied := OriginOf(last); !copied || o != (RecordOrigin{Arrival: t0, Partition: 0, Offset: recs[0].Offset}) {
			t.Errorf("the restated record's origin %+v (a copy: %v), want the valid record's", o, copied)
		}
	}
	want, refused := eventReasons(t, h), "[e3:over_limit]" // the default plan's cap of 2
	if key == schemas.RateCardKey {
		refused = "[e2:no_credit e3:no_credit]" // 100 micro-credits each, 150 granted
	}
	if want != refused {
		t.Errorf("the running aggregator rejected %s, want %s", want, refused)
	}

	// A new group reads the topic as compaction leaves it.
	c, hc := h.startCompacted(testenv.Admin(t, h.brokers), n, "c")
	awaitDecided(t, hc, 3)
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	if got := eventReasons(t, hc); got != want {
		t.Errorf("after compaction the events' rejections are %s, the running aggregator's %s", got, want)
	}
}

// eventReasons lists the events of usage.rejected (not the records of
// usage.entitlements) as event_id:reason.
func eventReasons(t testing.TB, h *aggHarness) string {
	var out []string
	for _, r := range rejectedReasons(t, h) {
		if !strings.HasPrefix(r, ":") {
			out = append(out, r)
		}
	}
	return fmt.Sprint(out)
}

// bigDefault is a default plan of about 530 KB whose first cap is limit
// units of m1 (entitlements.MaxCaps caps, entitlements.MaxGrants grants,
// names of entitlements.MaxNameBytes).
func bigDefault(limit int64) *schemas.Entitlements {
	e := &schemas.Entitlements{Plan: fmt.Sprint("big-", limit), Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps: []schemas.Cap{{Meter: "m1", Limit: limit, OnLimit: schemas.OnLimitReject}}}
	for i := 1; i < entitlements.MaxCaps; i++ {
		e.Caps = append(e.Caps, schemas.Cap{Meter: fmt.Sprintf("%04d", i) + strings.Repeat("m", entitlements.MaxNameBytes-4),
			Limit: 1, OnLimit: schemas.OnLimitReject})
	}
	for i := range entitlements.MaxGrants {
		e.Grants = append(e.Grants, schemas.Grant{ID: fmt.Sprintf("%04d", i) + strings.Repeat("g", entitlements.MaxNameBytes-4), Amount: 1})
	}
	return e
}
