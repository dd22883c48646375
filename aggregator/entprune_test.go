package aggregator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsPruneKeepsReroutedEventsVersions (kfake; docs/design.md,
// Event identity and keys; docs/entitlements.md, The aggregator): pruning
// keeps the plan version in effect at the arrival, and the rate card as it
// stood at the earlier of the arrival and the event_time, of every event
// dedup can still accept, a re-routed one included. Dedup (W 24h, S 1h, B
// 24h) at a watermark of 16 October 00:59 has expired the keys before
// ⌊(wm − W − S)/B⌋·B = 14 October 00:00, so it accepts a re-routed event of
// event_time 14 October 01:00 (event_time − S not before that) that arrived
// at 14 October 00:00 (S before its event_time): its arrival is
// W + B + S − 1 min before the watermark, more than W.
//
//   - lowered: a cap of 100 lowered to 5 on 14 October at 00:30; the
//     event's 7 units arrived before: accepted.
//   - raised: a cap of 5 raised to 100 then; the same event: over_limit
//     (with the cap of 5 pruned, the customer had no plan at its arrival).
//     The change is less than S after the arrival: a horizon of W + B
//     without S drops the cap of 5 too.
//   - prepaid (a grant of 1,000 micro-credits, overdraft denied): the rate
//     card of 1 October (10 micro-credits a unit) is replaced on
//     14 October at 00:30 by one of 30 from then; the event arrived before
//     the new card was written, so it is priced by the old one: 70 (with
//     the old card pruned, no card stood at its arrival: it cost nothing).
//
// Once the watermark is there, a record of each kind (the customers', and
// the rate card's, rewritten) prunes what their keys keep at the horizon:
// at the watermark less W, the cap of 5 and the first card went.
func TestEntitlementsPruneKeepsReroutedEventsVersions(t *testing.T) {
	const n = 1
	h := newEntHarness(t, nil, n)
	at := func(d, hour, min int) int64 {
		return time.Date(2026, time.October, d, hour, min, 0, 0, time.UTC).UnixMilli()
	}
	const w = 24 * time.Hour
	wm := at(16, 0, 59)
	// The event is one dedup accepts at wm (dedup/decide.go, event()).
	eventTime, arrival := at(14, 1, 0), at(14, 0, 0)
	b, s := dedup.DefaultBucket.Milliseconds(), dedup.DefaultSkew.Milliseconds()
	if expiredBefore := (wm - w.Milliseconds() - s) / b * b; eventTime-s < expiredBefore || eventTime > arrival+s || arrival-eventTime >= w.Milliseconds() {
		t.Fatalf("dedup would reject the event (expired before %s)", msTime(expiredBefore))
	}
	if arrival >= wm-w.Milliseconds() {
		t.Fatal("the event's arrival is within W of the watermark: it shows nothing")
	}

	allow := schemas.Overdraft{Policy: schemas.OverdraftAllow}
	capped := func(c string, limit int64) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: c, Plan: "free", Overdraft: allow,
			Caps: []schemas.Cap{{Meter: "api_calls", Limit: limit, OnLimit: schemas.OnLimitReject}}}
	}
	card := func(from, rate int64) *schemas.RateCard {
		return &schemas.RateCard{Versions: []schemas.RateVersion{{EffectiveFrom: from, Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: rate, PerUnits: 1}}}}}
	}
	prepaid := &schemas.Entitlements{CustomerID: "prepaid", Plan: "prepaid", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny},
		Grants: []schemas.Grant{{ID: "g", Amount: 1_000}}}

	var recs []*kgo.Record
	recs = append(recs, h.shared(n, schemas.RateCardKey, card(0, 10), at(1, 0, 0))...)
	recs = append(recs, h.entitlement(n, capped("lowered", 100), at(1, 0, 0)), h.entitlement(n, capped("raised", 5), at(1, 0, 0)),
		h.entitlement(n, prepaid, at(1, 0, 0)))
	recs = append(recs, h.shared(n, schemas.RateCardKey, card(at(14, 0, 30), 30), at(14, 0, 30))...)
	recs = append(recs, h.entitlement(n, capped("lowered", 5), at(14, 0, 30)), h.entitlement(n, capped("raised", 100), at(14, 0, 30)),
		h.watermark(0, 0, 1, wm))
	h.produce(recs...)
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.Window = w
	cfg.BalanceInterval = BalanceEveryTransaction
	run := h.start(cfg)
	h.caughtUp()

	// The records that prune, written after the watermark was read; raised's
	// balance as of their broker time says they were read.
	pruneAt := wm + int64(time.Hour/time.Millisecond)
	recs = append(h.shared(n, schemas.RateCardKey, card(at(14, 0, 30), 30), pruneAt),
		h.entitlement(n, capped("lowered", 5), pruneAt), h.entitlement(n, capped("raised", 100), pruneAt))
	h.produce(recs...)
	awaitBalances(t, h, "raised's as of its last record", func(bs map[string]*schemas.Balance) bool {
		return bs["raised"] != nil && bs["raised"].UpdatedAt >= pruneAt
	})

	// The re-routed events.
	ev := func(id, c string) *kgo.Record {
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: c, Meter: "api_calls", Quantity: 7,
			EventTime: eventTime, IngestTime: arrival})
	}
	h.produce(ev("lowered-1", "lowered"), ev("raised-1", "raised"), ev("prepaid-1", "prepaid"))
	awaitDecided(t, h, 3)
	// prepaid's record again: its balance as of then follows the charge.
	h.produce(h.entitlement(n, prepaid, pruneAt+1))
	awaitBalances(t, h, "prepaid's as of its last record", func(bs map[string]*schemas.Balance) bool {
		return bs["prepaid"] != nil && bs["prepaid"].UpdatedAt > pruneAt
	})
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	rejected := map[string]string{}
	for _, r := range readRejected(t, h) {
		rejected[r.EventID] = r.Reason
	}
	if want := map[string]string{"raised-1": schemas.ReasonOverLimit}; fmt.Sprint(rejected) != fmt.Sprint(want) {
		t.Errorf("rejected %v, want %v (each event decided by the plan version in effect at its arrival)", rejected, want)
	}
	if got, want := openValues(t, h), map[string]int64{"lowered/api_calls": 7, "prepaid/api_calls": 7}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("OPEN values %v, want %v", got, want)
	}
	if b := latestBalances(t, h)["prepaid"]; b == nil || len(b.Grants) != 1 || b.Grants[0].Consumed != 70 {
		t.Errorf("prepaid's balance %+v, want grant g consumed 70 (7 units at the rate card in effect at its arrival, 10 a unit)", b)
	}
}

// TestConfigSkew: Skew defaults to dedup's and must be positive.
func TestConfigSkew(t *testing.T) {
	var c Config
	c.EnsureDefaults()
	if c.Skew != dedup.DefaultSkew {
		t.Errorf("default Skew %s, want dedup's %s", c.Skew, dedup.DefaultSkew)
	}
	if err := c.Validate(); err != nil && strings.Contains(err.Error(), "skew") {
		t.Fatalf("defaults: %v", err)
	}
	for _, skew := range []time.Duration{-time.Second, 0} {
		c.Skew = skew
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "skew must be positive") {
			t.Errorf("Validate with skew %s: %v", skew, err)
		}
	}
}
