package aggregator

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestEmptyAccountBalanceNeverGoesBackInTime is
// TestBalanceNeverGoesBackInTime for a customer whose account holds
// nothing: the rate card prices api_calls and its plan has no grant and
// denies overdraft, so every event of that meter is rejected (no_credit),
// and the rest are of a meter neither capped nor priced, whose usage is
// not kept. The customer's cap of day d+1 goes out as of its own
// time while the watermark is behind; then, after a restart, an event of
// day d is decided. Rejected, it changes nothing and no balance goes out;
// accepted, its balance goes out as of the later of its arrival and the
// cap's time, with the plan of day d+1: not as of day d with the plan of
// day d and a higher revision, which the gate and the analysts' current
// balance would then show until the customer's next change.
func TestEmptyAccountBalanceNeverGoesBackInTime(t *testing.T) { emptyNoteCases(t, nil) }

// TestRealEmptyAccountBalanceNeverGoesBackInTime is
// TestEmptyAccountBalanceNeverGoesBackInTime on the real broker.
func TestRealEmptyAccountBalanceNeverGoesBackInTime(t *testing.T) {
	emptyNoteCases(t, testenv.RealKafka(t))
}

// emptyNoteCases runs the cases of TestEmptyAccountBalanceNeverGoesBackInTime
// on brokers (nil: kfake).
func emptyNoteCases(t *testing.T, brokers []string) {
	for _, tc := range []struct {
		name, meter string
		accepted    bool
	}{
		{"a late event rejected", "api_calls", false},
		{"a late event accepted, its usage not kept", "logins", true},
	} {
		for _, every := range []bool{false, true} {
			name := tc.name
			if every {
				name += ", a balance every transaction"
			}
			t.Run(name, func(t *testing.T) { emptyNoteRun(t, brokers, tc.meter, tc.accepted, every) })
		}
	}
}

// emptyNoteRun is a case of TestEmptyAccountBalanceNeverGoesBackInTime:
// the late event is of meter, and accepted or not.
func emptyNoteRun(t *testing.T, brokers []string, meter string, accepted, every bool) {
	d := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	day := int64(24 * time.Hour / time.Millisecond)
	h := newEntHarness(t, brokers, 1)
	plan := func(name string, limit int64) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: "acme", Plan: name,
			Caps:      []schemas.Cap{{Meter: "api_calls", Limit: limit, OnLimit: schemas.OnLimitReject}},
			Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
	}
	ev := func(id, meter string, at int64) *kgo.Record {
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: meter, Quantity: 1,
			EventTime: at, IngestTime: at})
	}
	card := h.shared(1, schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{
		{EffectiveFrom: 0, Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: 100, PerUnits: 1}}}}}, d+1000)
	h.produce(append(card, h.entitlement(1, plan("free", 5), d+1000), h.watermark(0, 0, 2, d+2000), h.watermark(0, 1, 2, d+2000),
		ev("first", "api_calls", d+3000), ev("first-login", "logins", d+3000))...)
	fs := vfs.NewMem()
	start := func() *aggRunning { return h.startDaily(fs, every) }
	run := start()
	awaitDecided(t, h, 2)
	if rej := readRejected(t, h); len(rej) != 1 || rej[0].EventID != "first" {
		t.Fatalf("rejected %v, want the event first alone", rejectedIDs(rej))
	}
	at := d + day + 5000
	h.produce(h.entitlement(1, plan("pro", 1000), at))
	awaitBalances(t, h, "the cap of day d+1 out", func(bs map[string]*schemas.Balance) bool {
		b := bs["acme"]
		return b != nil && b.UpdatedAt >= at && b.Plan == "pro"
	})
	// A restart: what the balance of day d+1 left is in the committed
	// state only.
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	run = start()
	// Source 1's event of the last second of day d.
	h.produce(ev("late", meter, d+day-1000))
	awaitDecided(t, h, 3)
	if rej := readRejected(t, h); accepted != (len(rej) == 1) {
		t.Fatalf("rejected %v; the late event accepted: %v", rejectedIDs(rej), accepted)
	}
	if accepted {
		// Its balance, the customer's fourth.
		deadline := time.Now().Add(30 * time.Second)
		for len(balancesOf(t, h, "acme")) < 4 {
			if time.Now().After(deadline) {
				t.Fatal("after 30s the late event's balance is not out")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// The watermark enters day d+1.
	h.produce(h.watermark(0, 0, 2, d+day+10_000), h.watermark(0, 1, 2, d+day+10_000))
	h.caughtUp()
	time.Sleep(500 * time.Millisecond) // balances still to go out, if any
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	bs := balancesOf(t, h, "acme")
	checkRevisions(t, bs)
	for i, b := range bs {
		t.Logf("balance %d: revision %d, as of %s, period %s, plan %s", i, b.Revision, msTime(b.UpdatedAt),
			msTime(b.PeriodStart), b.Plan)
		if i > 0 && b.UpdatedAt < bs[i-1].UpdatedAt {
			t.Errorf("balance %d (revision %d) is as of %s, before the balance before it (%s)", i, b.Revision,
				msTime(b.UpdatedAt), msTime(bs[i-1].UpdatedAt))
		}
	}
	// The analysts' current balance: the highest revision of the latest
	// period; the gate's: the highest revision.
	var cur *schemas.Balance
	for _, b := range bs {
		if cur == nil || b.PeriodStart > cur.PeriodStart || b.PeriodStart == cur.PeriodStart && b.Revision > cur.Revision {
			cur = b
		}
	}
	if last := bs[len(bs)-1]; last.Plan != "pro" || cur.Plan != "pro" {
		t.Errorf("the last balance (revision %d) is of plan %s, the latest period's (revision %d) of plan %s; want pro",
			last.Revision, last.Plan, cur.Revision, cur.Plan)
	}
}

// rejectedIDs returns the event ids and reasons of rejected events.
func rejectedIDs(rej []*schemas.Rejected) []string {
	var out []string
	for _, r := range rej {
		out = append(out, r.EventID+": "+r.Reason+" "+r.Detail)
	}
	return out
}
