package aggregator

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// orderInput is one customer's input from two usage.events partitions
// (sources): acme's plan (a cap of 12 api_calls, a grant of 900
// micro-credits, no overdraft), the rate card (100 micro-credits a call),
// and four events of different sizes, A1 and A2 of source 0, B1 and B2 of
// source 1, arriving A1 < B1 < A2 < B2, with the watermark records dedup
// forwards once both sources passed them.
//
// In arrival order: A1 (4) and B1 (5) are paid (900), A2 (4) would take
// the cap to 13 (over_limit), B2 (3) lands on 12 but no credit is left
// (no_credit). In the order of a backlog (source 0's batch, then source
// 1's): A1 and A2 are paid (800), B1 over_limit, B2 no_credit (100 left).
type orderInput struct {
	ent                 []*kgo.Record // usage.entitlements
	a1, a2, b1, b2      *kgo.Record   // acme's events
	wmA, wmB            *kgo.Record   // watermarks of sources 0 and 1
	caughtUp, afterBack []*kgo.Record // usage.deduped in either interleaving
}

const orderN = 2 // partitions of every topic; sources of the watermark

// orderQuantities are the events' quantities (orderInput).
var orderQuantities = map[string]int64{"A1": 4, "B1": 5, "A2": 4, "B2": 3}

func (h *aggHarness) orderInput() *orderInput {
	t0 := time.Now().Add(-90 * time.Second).UnixMilli()
	p := schemas.Partition(schemas.CustomerKey("acme"), orderN)
	in := &orderInput{}
	in.ent = append(in.ent, h.entitlement(orderN, &schemas.Entitlements{CustomerID: "acme", Plan: "capped",
		Caps:      []schemas.Cap{{Meter: "api_calls", Limit: 12, OnLimit: schemas.OnLimitReject}},
		Grants:    []schemas.Grant{{ID: "g1", Amount: 900}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}, t0-10_000))
	in.ent = append(in.ent, h.shared(orderN, schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{
		{EffectiveFrom: 0, Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: 100, PerUnits: 1}}}}}, t0-10_000)...)
	ev := func(id string, src int32, off, at, q int64) *kgo.Record {
		return h.dedupedEvent(p, &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "api_calls", Quantity: q,
			EventTime: at, IngestTime: at, SourcePartition: src, SourceOffset: off})
	}
	q := orderQuantities
	in.a1, in.b1 = ev("A1", 0, 10, t0+1000, q["A1"]), ev("B1", 1, 20, t0+2000, q["B1"])
	in.a2, in.b2 = ev("A2", 0, 11, t0+3000, q["A2"]), ev("B2", 1, 21, t0+4000, q["B2"])
	in.wmA, in.wmB = h.watermark(p, 0, orderN, t0+5000), h.watermark(p, 1, orderN, t0+5000)
	in.caughtUp = []*kgo.Record{in.a1, in.b1, in.a2, in.b2, in.wmA, in.wmB}
	in.afterBack = []*kgo.Record{in.a1, in.a2, in.wmA, in.b1, in.b2, in.wmB}
	return in
}

// orderDecisions is what the test compares: each event's outcome and the
// credits drawn.
type orderDecisions struct {
	outcome map[string]string
	credits int64
}

func (d orderDecisions) String() string {
	return fmt.Sprintf("%v, %d micro-credits", d.outcome, d.credits)
}

// decisionsOf waits for acme's four events to be decided and returns the
// decisions: rejected ones by reason, the others "accepted" (the OPEN
// value must be their quantities' sum), and the credits its balance says
// g1 paid.
func decisionsOf(t *testing.T, h *aggHarness) orderDecisions {
	t.Helper()
	awaitDecided(t, h, 4)
	d := orderDecisions{outcome: map[string]string{}}
	for _, r := range readRejected(t, h) {
		d.outcome[r.EventID] = r.Reason
	}
	accepted := int64(0)
	for id, q := range orderQuantities {
		if _, ok := d.outcome[id]; !ok {
			d.outcome[id] = "accepted"
			accepted += q
		}
	}
	if got := openValues(t, h)["acme/api_calls"]; got != accepted {
		t.Errorf("acme's OPEN value %d, want %d, the accepted events' (%v)", got, accepted, d.outcome)
	}
	bs := awaitBalances(t, h, "acme's credits of its accepted events", func(bs map[string]*schemas.Balance) bool {
		b := bs["acme"]
		return b != nil && len(b.Grants) == 1 && b.Grants[0].Consumed == 100*accepted
	})
	d.credits = bs["acme"].Grants[0].Consumed
	return d
}

// orderRun writes in (interleaved as caught up or after a backlog) and
// returns the decisions of an aggregator in order, with FinalChunk chunk
// (0: the default).
func orderRun(t *testing.T, brokers []string, order string, backlog bool, chunk int) orderDecisions {
	h := newEntHarness(t, brokers, orderN)
	in := h.orderInput()
	h.produce(in.ent...)
	if backlog {
		h.produce(in.afterBack...)
	} else {
		h.produce(in.caughtUp...)
	}
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.EntitlementsOrder = order
	cfg.FinalChunk = chunk
	cfg.Stream.Registerer = prometheus.NewRegistry()
	run := h.start(cfg)
	h.caughtUp()
	d := decisionsOf(t, h)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	return d
}

// wantArrivalOrder is the decisions in arrival order (orderInput).
var wantArrivalOrder = orderDecisions{outcome: map[string]string{"A1": "accepted", "B1": "accepted", "A2": "over_limit", "B2": "no_credit"}, credits: 900}

// TestEntitlementsArrivalOrderDeterministic: one customer's events from
// two sources, in usage.deduped as they come while dedup keeps up and as
// they come after a backlog (one source's batch before the other's). In
// input order the cap and the credits decide them differently; with
// EntitlementsOrderArrival both give the decisions of arrival order, also
// when the release is chunked one event a transaction.
func TestEntitlementsArrivalOrderDeterministic(t *testing.T) { testArrivalOrder(t, nil) }

// TestRealEntitlementsArrivalOrderDeterministic is the same on the real
// broker of METERLINE_TEST_KAFKA.
func TestRealEntitlementsArrivalOrderDeterministic(t *testing.T) {
	testArrivalOrder(t, testenv.RealKafka(t))
}

func testArrivalOrder(t *testing.T, brokers []string) {
	inCaught := orderRun(t, brokers, EntitlementsOrderInput, false, 0)
	inBack := orderRun(t, brokers, EntitlementsOrderInput, true, 0)
	if inCaught.String() == inBack.String() {
		t.Errorf("input order decided alike after a backlog (%v): the test shows nothing", inCaught)
	}
	t.Logf("input order: caught up %v; after a backlog %v", inCaught, inBack)
	for _, backlog := range []bool{false, true} {
		for _, chunk := range []int{0, 1} {
			if got := orderRun(t, brokers, EntitlementsOrderArrival, backlog, chunk); got.String() != wantArrivalOrder.String() {
				t.Errorf("arrival order, backlog %v, chunk %d: %v, want %v", backlog, chunk, got, wantArrivalOrder)
			}
		}
	}
}

// TestEntitlementsArrivalOrderCrash: the events wait for the watermark in
// the committed state; the transaction that reads the watermark and decides
// them crashes after its second decision (before its commit), or before the
// commit of the transaction that held them; or, released one event a
// transaction, the third transaction of the release crashes, two chunks
// committed. The restart, on the state kept or on a fresh one (restored
// from the changelog), decides them as in arrival order, each once.
func TestEntitlementsArrivalOrderCrash(t *testing.T) { testArrivalOrderCrash(t, nil) }

// TestRealEntitlementsArrivalOrderCrash is the same on the real broker of
// METERLINE_TEST_KAFKA.
func TestRealEntitlementsArrivalOrderCrash(t *testing.T) {
	testArrivalOrderCrash(t, testenv.RealKafka(t))
}

func testArrivalOrderCrash(t *testing.T, brokers []string) {
	for _, c := range []struct {
		point string
		keep  bool
		chunk int
	}{
		{fault.ChargeDecided + "@2", true, 0},
		{fault.ChargeDecided + "@3", false, 0},
		{fault.BeforeCommit + "@1", true, 0},
		{fault.ChargeDecided + "@3", true, 1},
		{fault.ChargeDecided + "@4", false, 1},
	} {
		t.Run(fmt.Sprintf("%s keep=%v chunk=%d", c.point, c.keep, c.chunk), func(t *testing.T) {
			h := newEntHarness(t, brokers, orderN)
			in := h.orderInput()
			h.produce(in.ent...)
			fs := vfs.NewMem()
			cfg := func(fs vfs.FS) Config {
				cfg := h.entConfig("a", fs)
				cfg.EntitlementsOrder = EntitlementsOrderArrival
				cfg.FinalChunk = c.chunk
				cfg.Stream.Registerer = prometheus.NewRegistry()
				return cfg
			}
			fault.SetHandler(fault.CrashHandler)
			t.Cleanup(func() { fault.SetHandler(nil); _ = fault.Arm("") })
			if c.point == fault.BeforeCommit+"@1" {
				// The first transaction of the events: it holds them.
				if err := fault.Arm(c.point); err != nil {
					t.Fatal(err)
				}
				h.produce(in.afterBack[:len(in.afterBack)-1]...)
			} else {
				// Held and committed, then the watermark that releases
				// them.
				h.produce(in.afterBack[:len(in.afterBack)-1]...)
			}
			run := h.start(cfg(fs))
			if c.point != fault.BeforeCommit+"@1" {
				h.caughtUp()
				if n := len(readRejected(t, h)) + len(readAggregates(t, h)); n != 0 {
					t.Fatalf("%d outputs before the watermark passed the events' arrival", n)
				}
				if err := fault.Arm(c.point); err != nil {
					t.Fatal(err)
				}
			}
			h.produce(in.wmB)
			run.awaitCrash(t, "the aggregator did not crash")
			_ = fault.Arm("")
			// Released in one transaction, nothing of it was committed;
			// in chunks, the first ones were.
			if n := len(readAggregates(t, h)); (n > 0) != (c.chunk == 1) {
				t.Errorf("%d OPEN revisions committed before the crash, chunk %d", n, c.chunk)
			}
			if !c.keep {
				fs = vfs.NewMem()
			}
			run = h.start(cfg(fs))
			h.caughtUp()
			if got := decisionsOf(t, h); got.String() != wantArrivalOrder.String() {
				t.Errorf("after the crash: %v, want %v", got, wantArrivalOrder)
			}
			if n := len(readRejected(t, h)); n != 2 {
				t.Errorf("%d rejections, want 2 (each event decided once)", n)
			}
			if err := run.stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEntitlementsHeldGauges: with EntitlementsOrderArrival the events
// waiting for the watermark are counted per partition, with the arrival
// of the oldest, after they were held, after a restart that loads them
// from the state, and after the watermark released them (in chunks of
// one) but for one that arrived after it: 1 held, its arrival; and once
// the next watermark released that one: 0 held, no oldest arrival.
func TestEntitlementsHeldGauges(t *testing.T) { testHeldGauges(t, nil) }

// TestRealEntitlementsHeldGauges is the same on the real broker of
// METERLINE_TEST_KAFKA.
func TestRealEntitlementsHeldGauges(t *testing.T) { testHeldGauges(t, testenv.RealKafka(t)) }

func testHeldGauges(t *testing.T, brokers []string) {
	h := newEntHarness(t, brokers, orderN)
	in := h.orderInput()
	h.produce(in.ent...)
	h.produce(in.afterBack[:len(in.afterBack)-1]...) // all four, source 1's watermark missing
	pl := fmt.Sprint(in.a1.Partition)
	fs := vfs.NewMem()
	start := func() (*aggRunning, *prometheus.Registry) {
		cfg := h.entConfig("a", fs)
		cfg.EntitlementsOrder = EntitlementsOrderArrival
		cfg.FinalChunk = 1
		reg := prometheus.NewRegistry()
		cfg.Stream.Registerer = reg
		return h.start(cfg), reg
	}
	check := func(reg *prometheus.Registry, when string, n float64, oldest *kgo.Record) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, _ := gaugeOf(reg, "meterline_aggregate_held_events", "partition", pl)
			at, ok := gaugeOf(reg, "meterline_aggregate_held_oldest_arrival_seconds", "partition", pl)
			want := oldest != nil
			wantAt := 0.0
			if want {
				var e schemas.DedupedEvent
				if err := schemas.DecodeInto(oldest.Value, &e); err != nil {
					t.Fatal(err)
				}
				wantAt = float64(e.IngestTime) / 1000
			}
			if got == n && ok == want && at == wantAt {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v held, oldest arrival %v (present %v); want %v, %v (present %v)", when, got, at, ok, n, wantAt, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	run, reg := start()
	h.caughtUp()
	check(reg, "held", 4, in.a1)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	run, reg = start()
	h.caughtUp()
	check(reg, "restarted", 4, in.a1)
	// C arrives after the watermark that releases the four: it stays.
	var b2 schemas.DedupedEvent
	if err := schemas.DecodeInto(in.b2.Value, &b2); err != nil {
		t.Fatal(err)
	}
	c := h.dedupedEvent(in.b2.Partition, &schemas.DedupedEvent{EventID: "C", CustomerID: "acme", Meter: "api_calls", Quantity: 1,
		EventTime: b2.IngestTime + 2000, IngestTime: b2.IngestTime + 2000, SourcePartition: 1, SourceOffset: 22})
	h.produce(c)
	h.caughtUp()
	check(reg, "C held", 5, in.a1)
	h.produce(in.wmB)
	h.caughtUp()
	awaitDecided(t, h, 4)
	check(reg, "released", 1, c)
	h.produce(h.watermark(in.wmA.Partition, 0, orderN, b2.IngestTime+5000), h.watermark(in.wmB.Partition, 1, orderN, b2.IngestTime+5000))
	h.caughtUp()
	awaitDecided(t, h, 5)
	check(reg, "all released", 0, nil)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestHeldGaugesAfterAbort: the gauges of held events count what the open
// transaction held; once it aborts, the reload from the committed state
// (the next Process or Work) counts the committed held events again.
func TestHeldGaugesAfterAbort(t *testing.T) {
	l, err := entitlements.New(entitlements.Config{Prefix: []byte{pfxLedger}, Period: dayBoundsMs})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	pt := &partition{pl: "0", pr: &processor{cfg: Config{EntitlementsOrder: EntitlementsOrderArrival},
		counts: partitionCountsT{events: 1, deduped: 1, entitlements: 1}, ledger: l, m: newMetrics(reg)}}
	held := func(arrival int64, off byte) string {
		k := append([]byte{pfxHold}, binary.BigEndian.AppendUint64(nil, uint64(arrival))...)
		return string(append(k, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, off))
	}
	st := mapState{string(keyKeyScheme): []byte(schemas.DedupedKeyScheme), string(keyEntMode): []byte(entModeOn),
		held(7000, 1): encodeGateRecord(&kgo.Record{Offset: 1, Value: []byte{1}}),
		held(9000, 2): encodeGateRecord(&kgo.Record{Offset: 2, Value: []byte{1}})}
	want := func(when string, n, oldest float64) {
		t.Helper()
		got, _ := gaugeOf(reg, "meterline_aggregate_held_events", "partition", "0")
		at, _ := gaugeOf(reg, "meterline_aggregate_held_oldest_arrival_seconds", "partition", "0")
		if got != n || at != oldest {
			t.Errorf("%s: %v held, oldest arrival %v; want %v, %v", when, got, at, n, oldest)
		}
	}
	if err := pt.load(st); err != nil {
		t.Fatal(err)
	}
	want("loaded", 2, 7)
	// The open transaction holds three more, one older.
	pt.ent.arrHold.n, pt.ent.arrHold.oldest = 5, 5000
	pt.publishHold()
	want("held in the open transaction", 5, 5)
	pt.Abort()
	if err := pt.load(st); err != nil {
		t.Fatal(err)
	}
	want("reloaded after the abort", 2, 7)
}

// TestEntitlementsOrderSwitch: the order changes on a restart
// (docs/entitlements.md, Decision order): events held by an aggregator in
// arrival order, or a release in chunks it left half done, are decided
// at the next watermark advance by an aggregator in input order, in
// arrival order, each once; and an aggregator in arrival order on the
// state of one in input order holds from then on.
func TestEntitlementsOrderSwitch(t *testing.T) {
	for _, c := range []struct {
		name        string
		first, then string
		crash       bool
		want        orderDecisions
	}{
		{"held arrival to input", EntitlementsOrderArrival, EntitlementsOrderInput, false, wantArrivalOrder},
		{"half released arrival to input", EntitlementsOrderArrival, EntitlementsOrderInput, true, wantArrivalOrder},
		{"input to arrival", EntitlementsOrderInput, EntitlementsOrderArrival, false, wantArrivalOrder},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newEntHarness(t, nil, orderN)
			in := h.orderInput()
			h.produce(in.ent...)
			fs := vfs.NewMem()
			cfg := func(order string, chunk int) Config {
				cfg := h.entConfig("a", fs)
				cfg.EntitlementsOrder = order
				cfg.FinalChunk = chunk
				cfg.Stream.Registerer = prometheus.NewRegistry()
				return cfg
			}
			chunk := 0
			if c.crash {
				chunk = 1
				fault.SetHandler(fault.CrashHandler)
				t.Cleanup(func() { fault.SetHandler(nil); _ = fault.Arm("") })
			}
			run := h.start(cfg(c.first, chunk))
			if c.first == EntitlementsOrderInput {
				// The entitlements are read before the order switches;
				// no event yet.
				h.caughtUp()
			} else {
				h.produce(in.afterBack[:len(in.afterBack)-1]...)
				h.caughtUp()
				if n := len(readRejected(t, h)) + len(readAggregates(t, h)); n != 0 {
					t.Fatalf("%d outputs before the watermark passed the events' arrival", n)
				}
			}
			if c.crash {
				// The second held event's decision: the first chunk
				// (A1) is committed with the release under way.
				if err := fault.Arm(fault.ChargeDecided + "@2"); err != nil {
					t.Fatal(err)
				}
				h.produce(in.wmB)
				run.awaitCrash(t, "the aggregator did not crash")
				_ = fault.Arm("")
			} else if err := run.stop(); err != nil {
				t.Fatal(err)
			}
			c2 := cfg(c.then, 0)
			reg := prometheus.NewRegistry()
			c2.Stream.Registerer = reg
			run = h.start(c2)
			if c.first == EntitlementsOrderArrival && !c.crash {
				// Still waiting, and counted: a source that stopped
				// forwarding its watermark holds them in input order too.
				awaitHeldGauge(t, reg, fmt.Sprint(in.a1.Partition), 4)
			}
			switch {
			case c.first == EntitlementsOrderInput:
				h.produce(in.afterBack...)
			case !c.crash:
				h.produce(in.wmB)
			}
			h.caughtUp()
			if got := decisionsOf(t, h); got.String() != c.want.String() {
				t.Errorf("%v, want %v", got, c.want)
			}
			if n := len(readRejected(t, h)); n != 2 {
				t.Errorf("%d rejections, want 2 (each event decided once)", n)
			}
			if c.first == EntitlementsOrderArrival {
				awaitHeldGauge(t, reg, fmt.Sprint(in.a1.Partition), 0)
			}
			if err := run.stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// awaitHeldGauge waits until meterline_aggregate_held_events of partition
// pl is n (0: absent or 0, its oldest arrival absent).
func awaitHeldGauge(t *testing.T, reg *prometheus.Registry, pl string, n float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _ := gaugeOf(reg, "meterline_aggregate_held_events", "partition", pl)
		_, oldest := gaugeOf(reg, "meterline_aggregate_held_oldest_arrival_seconds", "partition", pl)
		if got == n && oldest == (n > 0) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v held events (oldest arrival present %v), want %v", got, oldest, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEntitlementsArrivalOrderHeldBeforeFinal: events held in arrival
// order whose arrival is before their period's end + grace are decided,
// and counted on time in the period, before the watermark that passes
// end + grace decides the period final; also released one a transaction,
// and so with a crash between two chunks (the restart goes on at the
// watermark the release moves from).
func TestEntitlementsArrivalOrderHeldBeforeFinal(t *testing.T) {
	for _, c := range []struct {
		chunk int
		crash bool
	}{{0, false}, {1, false}, {1, true}} {
		chunk := c.chunk
		t.Run(fmt.Sprintf("chunk=%d crash=%v", chunk, c.crash), func(t *testing.T) {
			h := newEntHarness(t, nil, orderN)
			now := time.Now().UTC()
			end := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).UnixMilli()
			const grace = time.Second
			if end+grace.Milliseconds()+5000 > now.UnixMilli()-5000 {
				t.Skip("too close to the start of the month")
			}
			in := h.orderInput()
			p := in.a1.Partition
			h.produce(h.entitlement(orderN, &schemas.Entitlements{CustomerID: "acme", Plan: "capped",
				Caps:      []schemas.Cap{{Meter: "api_calls", Limit: 12, OnLimit: schemas.OnLimitReject}},
				Grants:    []schemas.Grant{{ID: "g1", Amount: 900}},
				Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}, end-60_000))
			h.produce(h.shared(orderN, schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{
				{EffectiveFrom: 0, Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: 100, PerUnits: 1}}}}}, end-60_000)...)
			ev := func(id string, src int32, off, at int64) *kgo.Record {
				return h.dedupedEvent(p, &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "api_calls",
					Quantity: orderQuantities[id], EventTime: at, IngestTime: at, SourcePartition: src, SourceOffset: off})
			}
			// In the order of a backlog; source 0's watermark passes
			// end + grace, source 1's is still before all of them.
			h.produce(ev("A1", 0, 10, end-4000), ev("A2", 0, 11, end-2000), h.watermark(p, 0, orderN, end+grace.Milliseconds()+5000),
				h.watermark(p, 1, orderN, end-5000), ev("B1", 1, 20, end-3000), ev("B2", 1, 21, end-1000))
			fs := vfs.NewMem()
			cfg := func() Config {
				cfg := h.entConfig("a", fs)
				cfg.EntitlementsOrder = EntitlementsOrderArrival
				cfg.FinalChunk = chunk
				cfg.Grace = grace
				cfg.Stream.Registerer = prometheus.NewRegistry()
				return cfg
			}
			run := h.start(cfg())
			h.caughtUp()
			if c.crash {
				fault.SetHandler(fault.CrashHandler)
				t.Cleanup(func() { fault.SetHandler(nil); _ = fault.Arm("") })
				// The second held event's decision: A1's chunk is
				// committed with the release under way.
				if err := fault.Arm(fault.ChargeDecided + "@2"); err != nil {
					t.Fatal(err)
				}
			}
			h.produce(h.watermark(p, 1, orderN, end+grace.Milliseconds()+5000))
			if c.crash {
				run.awaitCrash(t, "the aggregator did not crash")
				_ = fault.Arm("")
				run = h.start(cfg())
			}
			h.caughtUp()
			if got := decisionsOf(t, h); got.String() != wantArrivalOrder.String() {
				t.Errorf("%v, want %v", got, wantArrivalOrder)
			}
			var final int64 = -1
			deadline := time.Now().Add(20 * time.Second)
			for final < 0 && time.Now().Before(deadline) {
				for _, a := range readAggregates(t, h) {
					if a.Status == schemas.StatusFinal && a.CustomerID == "acme" {
						final = a.Value
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			if want := orderQuantities["A1"] + orderQuantities["B1"]; final != want {
				t.Errorf("acme's FINAL %d, want %d (the accepted events, on time)", final, want)
			}
			if adjs := readAdjustments(t, h); len(adjs) != 0 {
				t.Errorf("%d adjustments, want none: every event arrived before end + grace", len(adjs))
			}
			if err := run.stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
