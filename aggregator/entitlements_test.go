package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// entHarness is an aggHarness whose entitlements topic takes the
// timestamps the test gives (CreateTime), so that a test chooses when
// each entitlements record was written.
func newEntHarness(t testing.TB, brokers []string, partitions int32) *aggHarness {
	if brokers == nil {
		_, brokers = testenv.KFake(t)
	}
	names := testenv.Topics(t, brokers, "", testenv.TopicsOpts{Partitions: partitions, EventsTimestamp: "CreateTime"})
	return &aggHarness{t: t, brokers: brokers, names: names, group: names.Prefix + "aggregate"}
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

// TestEntitlementsCapAndCredits: a capped customer gets its first 10 units
// and then over_limit; a customer with 1,000 micro-credits at 100 a unit
// gets 10 events and then no_credit. Rejected events go to usage.rejected
// with stage aggregator and into no aggregate; balances say where each
// customer stands.
func TestEntitlementsCapAndCredits(t *testing.T) {
	const n = 2
	h := newEntHarness(t, nil, n)
	t0 := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	var recs []*kgo.Record
	recs = append(recs, h.entitlement(n, &schemas.Entitlements{CustomerID: "free", Plan: "free",
		Caps:      []schemas.Cap{{Meter: "api_calls", Limit: 10, OnLimit: schemas.OnLimitReject}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}, t0))
	recs = append(recs, h.entitlement(n, &schemas.Entitlements{CustomerID: "paid", Plan: "prepaid",
		Grants:    []schemas.Grant{{ID: "g1", Amount: 1000}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}, t0))
	recs = append(recs, h.shared(n, schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{
		{EffectiveFrom: 0, Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: 100, PerUnits: 1}}}}}, t0)...)
	for i := range 12 {
		for _, c := range []string{"free", "paid"} {
			at := t0 + int64(i+1)*1000
			e := &schemas.DedupedEvent{EventID: fmt.Sprintf("%s-%02d", c, i), CustomerID: c, Meter: "api_calls", Quantity: 1,
				EventTime: at, IngestTime: at}
			recs = append(recs, h.dedupedEvent(schemas.Partition(schemas.CustomerKey(c), n), e))
		}
	}
	h.produce(recs...)
	reg := prometheus.NewRegistry()
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.Stream.Registerer = reg
	run := h.start(cfg)
	h.caughtUp()
	// The last events wait for a tick read back: wait for their outcome.
	deadline := time.Now().Add(30 * time.Second)
	for len(readRejected(t, h)) < 4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
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
