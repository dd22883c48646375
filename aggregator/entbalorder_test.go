package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestBalanceNeverGoesBackInTime: a customer's balance goes out as of a
// time (updated_at, and so its period) never earlier than the one of its
// balance before, even when an event decided after that balance arrived
// before the change it showed. The watermark is the minimum over two
// dedup sources, and lags: source 1 is behind; the customer's change on
// day d+1 (an event that came through source 0, or a record of
// usage.entitlements) goes out as of its own time, on day d+1; then an
// event of source 1 that arrived on day d draws credits. As of its own
// arrival, its balance would be of day d with a higher revision than day
// d+1's, and when the watermark enters day d+1 the period start would
// skip the customer when its account notes the change of day d+1: the
// row of the latest period, the customer's current balance to an
// analyst (docs/entitlements.md, Balances in ClickHouse), would keep the
// credits before that event's until the customer's next change. The
// aggregator restarts between the two balances: the time of the first
// comes from the committed state.
func TestBalanceNeverGoesBackInTime(t *testing.T) { balanceOrderCases(t, nil) }

// TestRealBalanceNeverGoesBackInTime is TestBalanceNeverGoesBackInTime on
// the real broker.
func TestRealBalanceNeverGoesBackInTime(t *testing.T) { balanceOrderCases(t, testenv.RealKafka(t)) }

// balanceOrderCases runs the cases of TestBalanceNeverGoesBackInTime on
// brokers (nil: kfake).
func balanceOrderCases(t *testing.T, brokers []string) {
	d := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	for _, tc := range []struct {
		name string
		// next is the change on day d+1, at broker time at.
		next func(h *aggHarness, at int64) *kgo.Record
	}{
		{"an event of the next day", func(h *aggHarness, at int64) *kgo.Record {
			return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "next", CustomerID: "acme", Meter: "api_calls", Quantity: 1,
				EventTime: at, IngestTime: at})
		}},
		{"a top-up of the next day", func(h *aggHarness, at int64) *kgo.Record {
			return h.entitlement(1, &schemas.Entitlements{CustomerID: "acme", Plan: "prepaid",
				Grants:    []schemas.Grant{{ID: "g1", Amount: 1000}, {ID: "g2", Amount: 500}},
				Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}, at)
		}},
		{"a cap of the next day", func(h *aggHarness, at int64) *kgo.Record {
			return h.entitlement(1, &schemas.Entitlements{CustomerID: "acme", Plan: "prepaid",
				Grants:    []schemas.Grant{{ID: "g1", Amount: 1000}},
				Caps:      []schemas.Cap{{Meter: "api_calls", Limit: 1000, OnLimit: schemas.OnLimitReject}},
				Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}, at)
		}},
	} {
		for _, every := range []bool{false, true} {
			name := tc.name
			if every {
				name += ", a balance every transaction"
			}
			t.Run(name, func(t *testing.T) { balanceOrderRun(t, brokers, d, tc.next, every) })
		}
	}
}

// balanceOrderRun is a case of TestBalanceNeverGoesBackInTime: next makes
// the change of day d+1.
func balanceOrderRun(t *testing.T, brokers []string, d int64, next func(h *aggHarness, at int64) *kgo.Record, every bool) {
	day := int64(24 * time.Hour / time.Millisecond)
	h := newEntHarness(t, brokers, 1)
	recs := []*kgo.Record{h.entitlement(1, &schemas.Entitlements{CustomerID: "acme", Plan: "prepaid",
		Grants:    []schemas.Grant{{ID: "g1", Amount: 1000}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}, d+1000)}
	recs = append(recs, h.shared(1, schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{
		{EffectiveFrom: 0, Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: 100, PerUnits: 1}}}}}, d+1000)...)
	recs = append(recs, h.watermark(0, 0, 2, d+2000), h.watermark(0, 1, 2, d+2000))
	ev := func(id string, at int64) *kgo.Record {
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "api_calls", Quantity: 1,
			EventTime: at, IngestTime: at})
	}
	recs = append(recs, ev("first", d+3000))
	h.produce(recs...)
	fs := vfs.NewMem()
	start := func() *aggRunning { return h.startDaily(fs, every) }
	run := start()
	g1 := func(b *schemas.Balance) int64 {
		for _, g := range b.Grants {
			if g.ID == "g1" {
				return g.Consumed
			}
		}
		return -1
	}
	consumed := func(n int64, start int64) func(map[string]*schemas.Balance) bool {
		return func(bs map[string]*schemas.Balance) bool {
			b := bs["acme"]
			return b != nil && g1(b) == n && (start == 0 || b.PeriodStart == start)
		}
	}
	awaitBalances(t, h, "100 of g1 consumed", consumed(100, 0))
	at := d + day + 5000
	h.produce(next(h, at))
	awaitBalances(t, h, "the change of day d+1 out", func(bs map[string]*schemas.Balance) bool {
		b := bs["acme"]
		return b != nil && b.UpdatedAt >= at
	})
	want := g1(latestBalances(t, h)["acme"]) + 100
	// A restart: what the balance of day d+1 left is in the committed
	// state only.
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	run = start()
	// Source 1's event of the last second of day d.
	h.produce(ev("late", d+day-1000))
	awaitBalances(t, h, fmt.Sprintf("%d of g1 consumed", want), consumed(want, 0))
	// The watermark enters day d+1.
	h.produce(h.watermark(0, 0, 2, d+day+10_000), h.watermark(0, 1, 2, d+day+10_000))
	h.caughtUp()
	time.Sleep(500 * time.Millisecond) // the period start's chunks, if any
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	bs := balancesOf(t, h, "acme")
	checkRevisions(t, bs)
	for i, b := range bs {
		t.Logf("balance %d: revision %d, as of %s, period %s, g1 consumed %d", i, b.Revision, msTime(b.UpdatedAt),
			msTime(b.PeriodStart), g1(b))
		if i > 0 && b.UpdatedAt < bs[i-1].UpdatedAt {
			t.Errorf("balance %d (revision %d) is as of %s, before the balance before it (%s)", i, b.Revision,
				msTime(b.UpdatedAt), msTime(bs[i-1].UpdatedAt))
		}
	}
	// The change of day d+1 (a grant, a cap) shows in every balance after
	// it: none goes back to the plan before it.
	if last, before := bs[len(bs)-1], bs[len(bs)-2]; len(last.Grants) != len(before.Grants) || len(last.Meters) != len(before.Meters) {
		t.Errorf("the last balance has grants %+v and caps %+v, the one before it %+v and %+v", last.Grants, last.Meters,
			before.Grants, before.Meters)
	}
	// The analysts' current balance: the highest revision of the
	// latest period.
	var cur *schemas.Balance
	for _, b := range bs {
		if cur == nil || b.PeriodStart > cur.PeriodStart || b.PeriodStart == cur.PeriodStart && b.Revision > cur.Revision {
			cur = b
		}
	}
	if got := g1(cur); got != want {
		t.Errorf("the latest period's balance (revision %d, period %s) has %d of g1 consumed, want %d", cur.Revision,
			msTime(cur.PeriodStart), got, want)
	}
}
