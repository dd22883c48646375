package aggregator

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// The span of an entitlements test around its start (newEntHarness).
const entMonthBefore, entMonthAfter = 3 * time.Minute, 2 * time.Minute

// entHarness is an aggHarness whose entitlements topic takes the
// timestamps the test gives (CreateTime), so that a test chooses when
// each entitlements record was written.
//
// Its tests stamp events, ticks and records with the wall clock and read
// caps, credits and balances of the month they run in: the harness starts
// them in one UTC month (testenv.InOneMonth), none running longer than
// entMonthBefore nor stamping times more than entMonthAfter before its start.
func newEntHarness(t testing.TB, brokers []string, partitions int32) *aggHarness {
	testenv.InOneMonth(t, entMonthBefore, entMonthAfter)
	if brokers == nil {
		_, brokers = testenv.KFake(t)
	}
	names := testenv.Topics(t, brokers, "", testenv.TopicsOpts{Partitions: partitions, EventsTimestamp: "CreateTime"})
	return &aggHarness{t: t, brokers: brokers, names: names, group: names.Prefix + "aggregate", createTime: true}
}

// startDaily starts instance "a" with entitlements on state fs, billing
// by day, with a balance after every transaction if every, and metrics
// of its own (a restarted stage registers them again).
func (h *aggHarness) startDaily(fs vfs.FS, every bool) *aggRunning {
	cfg := h.entConfig("a", fs)
	cfg.Period = Day
	if every {
		cfg.BalanceInterval = BalanceEveryTransaction
	}
	cfg.Stream.Registerer = prometheus.NewRegistry()
	return h.start(cfg)
}

func (h *aggHarness) entConfig(instance string, fs vfs.FS) Config {
	cfg := h.config(instance, fs)
	cfg.Entitlements = true
	cfg.EntitlementsTick = 20 * time.Millisecond
	return cfg
}

// entitlement is a customer's record, to its canonical partition among n,
// written at broker time at.
func (h *aggHarness) entitlement(n int32, e *schemas.Entitlements, at int64) *kgo.Record {
	key := schemas.CustomerKey(e.CustomerID)
	return &kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: schemas.Partition(key, n), Key: key,
		Value: schemas.MustEncode(e), Timestamp: time.UnixMilli(at)}
}

// shared is a record under a reserved key, to every one of n partitions.
func (h *aggHarness) shared(n int32, key string, m schemas.Message, at int64) []*kgo.Record {
	var out []*kgo.Record
	for p := range n {
		out = append(out, &kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: p, Key: []byte(key),
			Value: schemas.MustEncode(m), Timestamp: time.UnixMilli(at)})
	}
	return out
}

// latestBalances returns the last balance of each customer.
func latestBalances(t testing.TB, h *aggHarness) map[string]*schemas.Balance {
	out := map[string]*schemas.Balance{}
	for _, b := range readTopic[schemas.Balance](t, h.brokers, h.names.BalancesTopic()) {
		if cur, ok := out[b.CustomerID]; !ok || b.Revision > cur.Revision {
			out[b.CustomerID] = b
		}
	}
	return out
}

// openValues returns the latest OPEN value of each customer/meter.
func openValues(t testing.TB, h *aggHarness) map[string]int64 {
	rev := map[string]int64{}
	out := map[string]int64{}
	for _, a := range readAggregates(t, h) {
		k := a.CustomerID + "/" + a.Meter
		if a.Revision >= rev[k] {
			rev[k], out[k] = a.Revision, a.Value
		}
	}
	return out
}

// capAndCredits is the records of a capped customer (its first 10
// api_calls accepted, then over_limit) and a prepaid one (a grant of 1,000
// micro-credits, no overdraft), the rate card (100 micro-credits an
// api_call) and 12 events of each customer, a second apart after t0.
func (h *aggHarness) capAndCredits(n int32, t0 int64, capped, prepaid string) []*kgo.Record {
	var recs []*kgo.Record
	recs = append(recs, h.entitlement(n, &schemas.Entitlements{CustomerID: capped, Plan: "free",
		Caps:      []schemas.Cap{{Meter: "api_calls", Limit: 10, OnLimit: schemas.OnLimitReject}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}, t0))
	recs = append(recs, h.entitlement(n, &schemas.Entitlements{CustomerID: prepaid, Plan: "prepaid",
		Grants:    []schemas.Grant{{ID: "g1", Amount: 1000}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}, t0))
	recs = append(recs, h.shared(n, schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{
		{EffectiveFrom: 0, Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: 100, PerUnits: 1}}}}}, t0)...)
	for i := range 12 {
		for _, c := range []string{capped, prepaid} {
			at := t0 + int64(i+1)*1000
			e := &schemas.DedupedEvent{EventID: fmt.Sprintf("%s-%02d", c, i), CustomerID: c, Meter: "api_calls", Quantity: 1,
				EventTime: at, IngestTime: at}
			recs = append(recs, h.dedupedEvent(schemas.Partition(schemas.CustomerKey(c), n), e))
		}
	}
	return recs
}

// startMetered starts instance a with entitlements on a fresh state and a
// registry of its own, which it returns with the running stage.
func (h *aggHarness) startMetered() (*aggRunning, *prometheus.Registry) {
	h.t.Helper()
	reg := prometheus.NewRegistry()
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.Stream.Registerer = reg
	return h.start(cfg), reg
}

// canonRecords returns the records of customer's key on its canonical
// partition among n.
func (h *aggHarness) canonRecords(n int32, customer string) []*kgo.Record {
	key := schemas.CustomerKey(customer)
	canon := schemas.Partition(key, n)
	var out []*kgo.Record
	for _, r := range testenv.ReadAll(h.t, h.brokers, h.names.EntitlementsTopic()) {
		if r.Partition == canon && string(r.Key) == string(key) {
			out = append(out, r)
		}
	}
	return out
}

// acmeEvents is acme's events e<from> to e<from+k-1>, one unit of meter
// each, to partition p, each at the wall clock when it is made.
func (h *aggHarness) acmeEvents(p int32, meter string, from, k int) []*kgo.Record {
	var recs []*kgo.Record
	for i := from; i < from+k; i++ {
		at := time.Now().UnixMilli()
		recs = append(recs, h.dedupedEvent(p, &schemas.DedupedEvent{EventID: fmt.Sprint("e", i), CustomerID: "acme",
			Meter: meter, Quantity: 1, EventTime: at, IngestTime: at}))
	}
	return recs
}

// acmeCap is acme's plan "cap-<limit>": limit units of m1, over_limit
// after; overdraft allowed.
func acmeCap(limit int64) *schemas.Entitlements {
	return &schemas.Entitlements{CustomerID: "acme", Plan: fmt.Sprint("cap-", limit), Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps: []schemas.Cap{{Meter: "m1", Limit: limit, OnLimit: schemas.OnLimitReject}}}
}

// TestEntitlementsCapAndCredits: a capped customer gets its first 10 units
// and then over_limit; a customer with 1,000 micro-credits at 100 a unit
// gets 10 events and then no_credit. Rejected events go to usage.rejected
// with stage aggregator and into no aggregate; balances say where each
// customer stands.
func TestEntitlementsCapAndCredits(t *testing.T) {
	const n = 2
	h := newEntHarness(t, nil, n)
	t0 := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	h.produce(h.capAndCredits(n, t0, "free", "paid")...)
	run, reg := h.startMetered()
	h.caughtUp()
	// The last events wait for a tick read back: wait for their outcome.
	deadline := time.Now().Add(30 * time.Second)
	for len(readRejected(t, h)) < 4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	// The balances of the last changes go out within a BalanceInterval of
	// broker time (the ticks').
	awaitBalances(t, h, "free's 10 and paid's 1,000", func(bs map[string]*schemas.Balance) bool {
		f, p := bs["free"], bs["paid"]
		return f != nil && len(f.Meters) == 1 && f.Meters[0].Usage == 10 && p != nil && len(p.Grants) == 1 && p.Grants[0].Consumed == 1000
	})
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	reasons := map[string]int{}
	for _, r := range readRejected(t, h) {
		if r.Stage != "aggregator" {
			t.Errorf("rejected %s by stage %q", r.EventID, r.Stage)
		}
		reasons[r.CustomerID+" "+r.Reason]++
	}
	if want := map[string]int{"free over_limit": 2, "paid no_credit": 2}; fmt.Sprint(reasons) != fmt.Sprint(want) {
		t.Errorf("rejections %v, want %v", reasons, want)
	}
	if got := openValues(t, h); got["free/api_calls"] != 10 || got["paid/api_calls"] != 10 {
		t.Errorf("OPEN values %v, want 10 for each customer", got)
	}
	bs := latestBalances(t, h)
	if b := bs["free"]; b == nil || len(b.Meters) != 1 || b.Meters[0].Usage != 10 || b.Meters[0].Limit != 10 || b.Plan != "free" {
		t.Errorf("free's balance %+v, want usage 10 of 10", b)
	}
	if b := bs["paid"]; b == nil || len(b.Grants) != 1 || b.Grants[0].Consumed != 1000 || b.Grants[0].Remaining != 0 {
		t.Errorf("paid's balance %+v, want g1 consumed 1000, remaining 0", b)
	}
	// free's plan allows overdraft: its 10 accepted units are overdrawn.
	if b := bs["free"]; b == nil || b.Overdrawn != 1000 {
		t.Errorf("free's balance %+v, want 1000 micro-credits overdrawn", b)
	}
	if v := counterOf(reg, "meterline_aggregate_credits_consumed_micro_total"); v != 2000 {
		t.Errorf("credits consumed %v, want 2000", v)
	}
}

// orderingRun feeds one hour of events of three capped customers, the
// entitlements partition's ticks and a cap raised half-way, and returns
// the decisions: each rejected event's reason, and each customer's OPEN
// value. live: the aggregator runs while the hour is produced, and every
// minute's events reach usage.deduped three minutes ahead of the
// entitlements partition's records and ticks for that minute; otherwise
// it starts once the whole hour is in the topics.
func orderingRun(t *testing.T, brokers []string, live bool) (map[string]string, map[string]int64) {
	const n = 4
	h := newEntHarness(t, brokers, n)
	t0 := time.Date(2026, 11, 10, 9, 0, 0, 0, time.UTC).UnixMilli()
	minute := int64(time.Minute / time.Millisecond)
	custs := []string{"acme", "globex", "initech"}
	plan := func(c string, limit int64, from int64) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: c, Plan: "free", EffectiveFrom: from, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
			Caps: []schemas.Cap{{Meter: "api_calls", Limit: limit, OnLimit: schemas.OnLimitReject}}}
	}
	// Minute by minute: entitlements records (a cap of 40, raised to 50
	// at minute 29, and at minute 32 to 70 from minute 40 on), a tick,
	// and the events of the minute.
	ent := make([][]*kgo.Record, 60)
	evs := make([][]*kgo.Record, 60)
	for m := range int64(60) {
		at := t0 + m*minute
		for _, c := range custs {
			switch m {
			case 0:
				ent[m] = append(ent[m], h.entitlement(n, plan(c, 40, 0), at))
			case 29:
				ent[m] = append(ent[m], h.entitlement(n, plan(c, 50, 0), at))
			case 32:
				ent[m] = append(ent[m], h.entitlement(n, plan(c, 70, t0+40*minute), at))
			}
		}
		ent[m] = append(ent[m], h.shared(n, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, at)...)
		for i, c := range custs {
			e := &schemas.DedupedEvent{EventID: fmt.Sprintf("%s-%02d", c, m), CustomerID: c, Meter: "api_calls",
				Quantity: int64(1 + (int(m)+i)%3), EventTime: at + 1, IngestTime: at + 1}
			evs[m] = append(evs[m], h.dedupedEvent(schemas.Partition(schemas.CustomerKey(c), n), e))
		}
	}
	// The last tick lets every event through.
	last := h.shared(n, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, t0+60*minute)
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.EntitlementsTick = -1
	var run *aggRunning
	if live {
		run = h.start(cfg)
		for m := range 63 {
			if m < 60 {
				h.produce(evs[m]...)
			}
			if m >= 3 {
				h.produce(ent[m-3]...)
			}
			time.Sleep(5 * time.Millisecond)
		}
		h.produce(last...)
	} else {
		for m := range 60 {
			h.produce(ent[m]...)
			h.produce(evs[m]...)
		}
		h.produce(last...)
		run = h.start(cfg)
	}
	h.caughtUp()
	awaitDecided(t, h, 60*len(custs))
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	rejected := map[string]string{}
	for _, r := range readRejected(t, h) {
		rejected[r.EventID] = r.Reason
	}
	return rejected, openValues(t, h)
}

// awaitDecided waits until n events are decided: counted in an OPEN
// aggregate, or rejected.
func awaitDecided(t testing.TB, h *aggHarness, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		counts := map[string]*schemas.Aggregate{}
		for _, a := range readAggregates(t, h) {
			k := a.CustomerID + "/" + a.Meter + "/" + fmt.Sprint(a.PeriodStart)
			if cur := counts[k]; cur == nil || a.Revision > cur.Revision {
				counts[k] = a
			}
		}
		got := len(readRejected(t, h))
		for _, a := range counts {
			got += int(a.EventCount)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events decided after a minute", got, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestEntitlementsOrderingByBrokerTime: the same hour of input gives the
// same decisions with the aggregator caught up (events reaching it
// minutes before the entitlements partition's records of their time) and
// with the aggregator started an hour behind; the cap raised half-way
// applies to the events that arrived after its effective_from in both,
// and a raise written for later applies from then.
func TestEntitlementsOrderingByBrokerTime(t *testing.T) {
	testOrdering(t, nil)
}

// TestRealEntitlementsOrderingByBrokerTime is the same on the real broker
// of METERLINE_TEST_KAFKA.
func TestRealEntitlementsOrderingByBrokerTime(t *testing.T) {
	testOrdering(t, testenv.RealKafka(t))
}

func testOrdering(t *testing.T, brokers []string) {
	liveRej, liveVals := orderingRun(t, brokers, true)
	lagRej, lagVals := orderingRun(t, brokers, false)
	if fmt.Sprint(liveRej) != fmt.Sprint(lagRej) || fmt.Sprint(liveVals) != fmt.Sprint(lagVals) {
		t.Fatalf("decisions differ:\n caught up: rejected %v, values %v\n behind:    rejected %v, values %v", liveRej, liveVals, lagRej, lagVals)
	}
	// Each customer: 40 units before the first raise, then up to 50,
	// then 70.
	for _, c := range []string{"acme", "globex", "initech"} {
		if v := lagVals[c+"/api_calls"]; v <= 50 || v > 70 {
			t.Errorf("%s counted %d units, want more than the cap 50 and at most the raised 70", c, v)
		}
	}
	if len(lagRej) == 0 {
		t.Fatal("no event rejected: the test must reach the cap")
	}
	t.Logf("identical decisions: %d rejected, values %v", len(lagRej), lagVals)
}

// TestEntitlementsMisroutedStillApplies: a customer's record produced to
// another partition than its customer's (a client with another
// partitioner) is re-produced to the canonical partition, counted, and
// then decides the customer's events there.
func TestEntitlementsMisroutedStillApplies(t *testing.T) {
	const n = 4
	h := newEntHarness(t, nil, n)
	key := schemas.CustomerKey("acme")
	canon := schemas.Partition(key, n)
	wrong := (canon + 1) % n
	run, reg := h.startMetered()
	h.produce(&kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: wrong, Key: key, Timestamp: time.Now(),
		Value: schemas.MustEncode(&schemas.Entitlements{CustomerID: "acme", Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
			Caps: []schemas.Cap{{Meter: "api_calls", Limit: 5, OnLimit: schemas.OnLimitReject}}})})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if len(h.canonRecords(n, "acme")) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the misrouted record was not re-produced to its canonical partition")
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.produce(h.acmeEvents(canon, "api_calls", 0, 8)...)
	h.caughtUp()
	awaitDecided(t, h, 8)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if got := openValues(t, h)["acme/api_calls"]; got != 5 {
		t.Errorf("acme counted %d, want 5 (the cap of the re-routed record)", got)
	}
	if n := len(readRejected(t, h)); n != 3 {
		t.Errorf("%d rejected, want 3 over_limit", n)
	}
	if v := counterOf(reg, "meterline_aggregate_entitlements_records_total"); v < 1 {
		t.Errorf("entitlements records counted %v", v)
	}
}

// TestEntitlementsRatesAndCredits: two meters at different rates draw from
// one balance; the rate card changes on the 15th, and each event is priced
// by the rate at its own event_time (a late event for the 14th arriving on
// the 20th too); grants are drawn by priority then earliest expiry, an
// expired grant pays nothing, and a grant pays only for event times in
// its window; with overdraft denied the event that the grants cannot pay
// is no_credit, with overdraft allowed it is overdrawn.
func TestEntitlementsRatesAndCredits(t *testing.T) { testRatesAndCredits(t, nil) }

// TestRealEntitlementsRatesAndCredits is the same on the real broker.
func TestRealEntitlementsRatesAndCredits(t *testing.T) { testRatesAndCredits(t, testenv.RealKafka(t)) }

func testRatesAndCredits(t *testing.T, brokers []string) {
	const n = 2
	h := newEntHarness(t, brokers, n)
	day := func(d int) int64 { return time.Date(2026, 11, d, 12, 0, 0, 0, time.UTC).UnixMilli() }
	written := time.Date(2026, 10, 31, 0, 0, 0, 0, time.UTC).UnixMilli()
	var recs []*kgo.Record
	recs = append(recs, h.shared(n, schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{
		{EffectiveFrom: 0, Rates: []schemas.Rate{{Meter: "tokens", MicroCredits: 2, PerUnits: 1}, {Meter: "api_calls", MicroCredits: 100, PerUnits: 1}}},
		{EffectiveFrom: time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC).UnixMilli(),
			Rates: []schemas.Rate{{Meter: "tokens", MicroCredits: 3, PerUnits: 1}, {Meter: "api_calls", MicroCredits: 150, PerUnits: 1}}}}}, written)...)
	grants := []schemas.Grant{
		{ID: "promo", Amount: 10_000, ExpiresAt: time.Date(2026, 11, 18, 0, 0, 0, 0, time.UTC).UnixMilli()},
		{ID: "base", Amount: 50_000},
		{ID: "old", Amount: 1_000, ExpiresAt: time.Date(2026, 11, 5, 0, 0, 0, 0, time.UTC).UnixMilli()},
		{ID: "later", Amount: 1_000, Priority: 1, EffectiveFrom: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()},
	}
	custs := map[string]schemas.Overdraft{"deny": {Policy: schemas.OverdraftDeny}, "allow": {Policy: schemas.OverdraftAllow}}
	for c, od := range custs {
		recs = append(recs, h.entitlement(n, &schemas.Entitlements{CustomerID: c, Plan: "prepaid-" + c, Grants: grants, Overdraft: od}, written))
	}
	type ev struct {
		id              string
		meter           string
		qty             int64
		arrival, evTime int64
	}
	evs := []ev{
		{"e1", "tokens", 1000, day(10), day(10)},   // 2,000 from promo (earliest expiry)
		{"e2", "api_calls", 10, day(10), day(10)},  // 1,000 from promo
		{"e3", "tokens", 1000, day(16), day(16)},   // new rate: 3,000 from promo
		{"e4", "tokens", 1000, day(20), day(14)},   // late, old rate: 2,000 from promo (its window holds the 14th)
		{"e5", "tokens", 2000, day(20), day(20)},   // 6,000 from base: promo expired for event time the 20th
		{"e6", "api_calls", 400, day(21), day(21)}, // 60,000: base has 44,000 left
	}
	for c := range custs {
		for _, e := range evs {
			recs = append(recs, h.dedupedEvent(schemas.Partition(schemas.CustomerKey(c), n), &schemas.DedupedEvent{
				EventID: c + "-" + e.id, CustomerID: c, Meter: e.meter, Quantity: e.qty, EventTime: e.evTime, IngestTime: e.arrival}))
		}
	}
	h.produce(recs...)
	run, reg := h.startMetered()
	h.caughtUp()
	awaitDecided(t, h, 2*len(evs))
	awaitBalances(t, h, "with every charge", func(bs map[string]*schemas.Balance) bool {
		d, a := bs["deny"], bs["allow"]
		return d != nil && d.UpdatedAt >= day(20) && a != nil && a.UpdatedAt == day(21)
	})
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	rej := readRejected(t, h)
	if len(rej) != 1 || rej[0].EventID != "deny-e6" || rej[0].Reason != schemas.ReasonNoCredit {
		t.Errorf("rejected %+v, want only deny-e6 as no_credit", rej)
	}
	bs := latestBalances(t, h)
	consumed := func(b *schemas.Balance) map[string]int64 {
		out := map[string]int64{}
		for _, g := range b.Grants {
			out[g.ID] = g.Consumed
		}
		return out
	}
	// As of the 21st: promo (consumed 8,000) and old have expired.
	if b := bs["deny"]; b == nil || fmt.Sprint(consumed(b)) != fmt.Sprint(map[string]int64{"base": 6000, "later": 0}) || b.Overdrawn != 0 {
		t.Errorf("deny's balance %+v, want base 6,000 consumed and nothing overdrawn", b)
	}
	if b := bs["allow"]; b == nil || fmt.Sprint(consumed(b)) != fmt.Sprint(map[string]int64{"base": 50000, "later": 0}) || b.Overdrawn != 16000 {
		t.Errorf("allow's balance %+v, want base 50,000 consumed and 16,000 overdrawn", b)
	}
	// deny: 8,000 + 6,000; allow: 8,000 + 6,000 + 60,000.
	if v := counterOf(reg, "meterline_aggregate_credits_consumed_micro_total"); v != 14000+74000 {
		t.Errorf("credits consumed %v, want %d", v, 14000+74000)
	}
}

// TestEntitlementsPeriodStartBalancesInChunks: when the watermark enters a
// new period, the balance of every customer with usage in the period that
// ended goes out (its usage in the new one is 0), at most FinalChunk
// customers per transaction (docs/design.md, Exactly-once, 7).
func TestEntitlementsPeriodStartBalancesInChunks(t *testing.T) {
	const n = 2
	h := newEntHarness(t, nil, n)
	d := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	day := int64(24 * time.Hour / time.Millisecond)
	var recs []*kgo.Record
	recs = append(recs, h.shared(n, schemas.DefaultPlanKey, &schemas.Entitlements{Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps: []schemas.Cap{{Meter: "api_calls", Limit: 100, OnLimit: schemas.OnLimitReject}}}, d-day)...)
	wm := func(at int64) {
		for p := range int32(n) {
			for src := range int32(n) {
				recs = append(recs, h.watermark(p, src, n, at))
			}
		}
	}
	wm(d + 1)
	custs := []string{"c1", "c2", "c3", "c4", "c5", "c6", "c7"}
	for i, c := range custs {
		at := d + 1000 + int64(i)
		recs = append(recs, h.dedupedEvent(schemas.Partition(schemas.CustomerKey(c), n), &schemas.DedupedEvent{EventID: c, CustomerID: c,
			Meter: "api_calls", Quantity: 3, EventTime: at, IngestTime: at}))
	}
	h.produce(recs...)
	reg := prometheus.NewRegistry()
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.Period, cfg.FinalChunk = Day, 2
	cfg.Stream.Registerer = reg
	run := h.start(cfg)
	awaitBalances := func(start int64) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			done := 0
			for _, b := range latestBalances(t, h) {
				if b.PeriodStart == start {
					done++
				}
			}
			if done == len(custs) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d customers got their balance of the period of %s", done, len(custs), msTime(start))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	awaitBalances(d)
	// Then the watermark enters the next day: no event, only the roll.
	recs = recs[:0]
	wm(d + day + 5000)
	h.produce(recs...)
	awaitBalances(d + day)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	for c, b := range latestBalances(t, h) {
		if len(b.Meters) != 1 || b.Meters[0].Usage != 0 || b.UpdatedAt != d+day+5000 {
			t.Errorf("%s's balance %+v, want usage 0 of the new period, as of the watermark", c, b)
		}
	}
	// 2 customers a transaction, in each partition.
	want := 0.0
	per := map[int32]int{}
	for _, c := range custs {
		per[schemas.Partition(schemas.CustomerKey(c), n)]++
	}
	for _, k := range per {
		want += float64((k + 1) / 2)
	}
	chunks := 0.0
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "meterline_aggregate_chunks_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "work" && l.GetValue() == "balances" {
						chunks += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	if chunks != want {
		t.Errorf("%v transactions emitted period-start balances, want %v (customers per partition %v, 2 a transaction)", chunks, want, per)
	}
}

// sameMilliRun decides one event that arrived at T, in the millisecond of
// a tick and of a cap raise of the entitlements partition (the tick read
// first), and returns its rejection reason ("" when accepted). live: the
// stage has read the tick at T before the event reaches it, and the raise
// only after; otherwise it starts with all of it in the topics.
func sameMilliRun(t *testing.T, live bool) string {
	h := newEntHarness(t, nil, 1)
	T := time.Date(2026, 11, 10, 9, 0, 0, 0, time.UTC).UnixMilli()
	plan := func(limit int64) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: "acme", Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
			Caps: []schemas.Cap{{Meter: "api_calls", Limit: limit, OnLimit: schemas.OnLimitReject}}}
	}
	ev := func(id string, at int64) *kgo.Record {
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "api_calls", Quantity: 1,
			EventTime: at, IngestTime: at})
	}
	first := []*kgo.Record{h.entitlement(1, plan(1), T-10)}
	first = append(first, h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, T)...)
	raise := []*kgo.Record{h.entitlement(1, plan(5), T)}
	raise = append(raise, h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, T+1)...)
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.EntitlementsTick = -1
	var run *aggRunning
	if live {
		run = h.start(cfg)
		h.produce(first...)
		h.produce(ev("e1", T-5))
		awaitDecided(t, h, 1) // the tick at T has been read
		h.produce(ev("e2", T))
		// Give the stage the time to decide e2 if it would now.
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && len(readRejected(t, h)) == 0; {
			time.Sleep(50 * time.Millisecond)
		}
		h.produce(raise...)
	} else {
		h.produce(first...)
		h.produce(ev("e1", T-5), ev("e2", T))
		h.produce(raise...)
		run = h.start(cfg)
	}
	awaitDecided(t, h, 2)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	out := ""
	for _, r := range readRejected(t, h) {
		out += r.EventID + ":" + r.Reason + " "
	}
	return out
}

// TestEntitlementsSameMillisecondGate: an event that arrived in the
// millisecond of an entitlements record is decided with that record whether
// the stage was caught up (and read a tick of that millisecond before the
// record) or behind (docs/entitlements.md, The ordering rule: broker time:
// the same decisions however far behind): the gate lets an event through
// only once the partition has been read past its arrival.
func TestEntitlementsSameMillisecondGate(t *testing.T) {
	live, lag := sameMilliRun(t, true), sameMilliRun(t, false)
	if live != lag {
		t.Fatalf("decisions differ: caught up rejected [%s], behind rejected [%s]", live, lag)
	}
	if lag != "" {
		t.Fatalf("rejected [%s], want e2 accepted under the raise written at its arrival", lag)
	}
}

// TestEntitlementsOffRefusesGatedState: an aggregator restarted without
// entitlements on the state of one run with them, its events still
// waiting in the gate, stops with ErrEntitlementsOff naming the flag
// instead of leaving them there with their offsets committed.
func TestEntitlementsOffRefusesGatedState(t *testing.T) {
	h := newEntHarness(t, nil, 1)
	day := ms(t, "2026-05-04")
	reg := prometheus.NewRegistry()
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.EntitlementsTick = -1 // nothing lets the events through
	cfg.Stream.Registerer = reg
	run := h.start(cfg)
	h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "e1", CustomerID: "acme", Meter: "api_calls", Quantity: 1,
		EventTime: day, IngestTime: day}))
	h.caughtUp()
	if v, _ := gaugeOf(reg, "meterline_aggregate_gated_records", "partition", "0"); v != 1 {
		t.Fatalf("%v records gated, want 1", v)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	run = h.start(h.config("b", vfs.NewMem()))
	select {
	case <-run.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the aggregator runs without entitlements on state with gated events")
	}
	if !errors.Is(run.err, ErrEntitlementsOff) || !strings.Contains(run.err.Error(), "--entitlements") {
		t.Fatalf("Run = %v, want ErrEntitlementsOff naming --entitlements", run.err)
	}
	t.Log(run.err)
	// With entitlements on again, the event is decided.
	h.produce(h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, day+1)...)
	h.start(h.entConfig("c", vfs.NewMem()))
	awaitDecided(t, h, 1)
}

// TestEntitlementsRefusedByAggregateNotCharged: an event that its
// entitlements accept and its aggregate then refuses (a sum that would
// wrap, counted before entitlements were turned on) consumes nothing: the
// customer's grant is charged for the events counted only.
func TestEntitlementsRefusedByAggregateNotCharged(t *testing.T) {
	const n = 1
	h := newEntHarness(t, nil, n)
	day := ms(t, "2026-05-04")
	ev := func(id string, q, at int64) *kgo.Record {
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: "paid", Meter: "api_calls", Quantity: q,
			EventTime: at, IngestTime: at})
	}
	// Without entitlements: an aggregate 5 short of wrapping.
	run := h.start(h.config("a", vfs.NewMem()))
	h.produce(ev("big", math.MaxInt64-5, day+1000))
	h.caughtUp()
	awaitDecided(t, h, 1)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	recs := []*kgo.Record{h.entitlement(n, &schemas.Entitlements{CustomerID: "paid", Plan: "prepaid",
		Grants: []schemas.Grant{{ID: "g1", Amount: 1000}}, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}, day)}
	recs = append(recs, h.shared(n, schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{
		{EffectiveFrom: 0, Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: 1, PerUnits: 1}}}}}, day)...)
	recs = append(recs, h.shared(n, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, day+10_000)...)
	h.produce(recs...)
	h.produce(ev("wraps", 10, day+2000), ev("fits", 3, day+3000))
	cfg := h.entConfig("b", vfs.NewMem())
	cfg.EntitlementsTick = -1
	// No ticks move the broker time past the one written: a balance
	// goes out in the transaction that changed it.
	cfg.BalanceInterval = BalanceEveryTransaction
	run = h.start(cfg)
	h.caughtUp()
	awaitDecided(t, h, 3)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	reasons := rejectedReasons(t, h)
	if fmt.Sprint(reasons) != "[wraps:invalid]" {
		t.Fatalf("rejected %v, want [wraps:invalid]", reasons)
	}
	b := latestBalances(t, h)["paid"]
	if b == nil || len(b.Grants) != 1 || b.Grants[0].Consumed != 3 {
		t.Fatalf("paid's balance %+v, want g1 consumed 3 (the event counted, not the one refused)", b)
	}
}

// TestEntitlementsFarFutureDoesNotStallGate: an event whose ingest_time
// is days past its record's broker time, and a watermark as far ahead,
// would hold the gate until the entitlements partition is read that far,
// and every record behind them with it: they are rejected as invalid when
// their turn comes, and the event behind them is decided.
func TestEntitlementsFarFutureDoesNotStallGate(t *testing.T) {
	h := newEntHarness(t, nil, 1)
	day := ms(t, "2026-05-04")
	ts := time.UnixMilli(day + 1000)
	far := day + 10*24*3600*1000
	bad := h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "far", CustomerID: "acme", Meter: "api_calls", Quantity: 1,
		EventTime: far, IngestTime: far})
	bad.Timestamp = ts
	wm := h.watermark(0, 0, 1, far)
	wm.Timestamp = ts
	ok := h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "ok", CustomerID: "acme", Meter: "api_calls", Quantity: 1,
		EventTime: day + 500, IngestTime: day + 500})
	ok.Timestamp = ts
	h.produce(bad, wm, ok)
	h.produce(h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, day+2000)...)
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.EntitlementsTick = -1
	run := h.start(cfg)
	h.caughtUp()
	deadline := time.Now().Add(20 * time.Second)
	for len(readRejected(t, h)) < 2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	for openValues(t, h)["acme/api_calls"] != 1 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	reasons := rejectedReasons(t, h)
	if fmt.Sprint(reasons) != "[far:invalid :invalid]" {
		t.Errorf("rejected %v, want the far event and the watermark as invalid", reasons)
	}
	if v := openValues(t, h)["acme/api_calls"]; v != 1 {
		t.Errorf("acme counted %d, want the event behind them counted (1)", v)
	}
}

// TestEntitlementsRecordsCountedOnce: a record of usage.entitlements read
// in a transaction that aborts is read again in the next one; the metric
// counts it once, when its transaction committed.
func TestEntitlementsRecordsCountedOnce(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newEntHarness(t, brokers, 1)
	reg := prometheus.NewRegistry()
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.EntitlementsTick = -1 // no ticks: the records below are the only input
	cfg.Stream.Registerer = reg
	testenv.FailNextTxnOffsetCommit(c)
	run := h.start(cfg)
	at := time.Now().UnixMilli()
	h.produce(
		h.entitlement(1, &schemas.Entitlements{CustomerID: "acme", Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}, at),
		h.entitlement(1, &schemas.Entitlements{CustomerID: "globex", Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}, at),
		h.entitlement(1, &schemas.Entitlements{CustomerID: "initech", Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}, at))
	deadline := time.Now().Add(30 * time.Second)
	for {
		tc := transactionCounts(reg)
		if tc["aborted"] >= 1 && tc["committed"] >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no aborted and then committed transaction with the records: transactions %v", tc)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The next transaction publishes what the committed one counted.
	h.produce(h.entitlement(1, &schemas.Entitlements{CustomerID: "hooli", Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}, at))
	deadline = time.Now().Add(30 * time.Second)
	for counterOf(reg, "meterline_aggregate_entitlements_records_total") < 3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if v := counterOf(reg, "meterline_aggregate_entitlements_records_total"); v != 4 && v != 3 {
		t.Fatalf("entitlements records counted %v times, want 3 or 4 (each record once; the aborted transaction's reads not counted)", v)
	}
}

// rejectedReasons lists usage.rejected as event_id:reason, in order.
func rejectedReasons(t testing.TB, h *aggHarness) []string {
	t.Helper()
	var reasons []string
	for _, r := range readRejected(t, h) {
		reasons = append(reasons, r.EventID+":"+r.Reason)
	}
	return reasons
}
