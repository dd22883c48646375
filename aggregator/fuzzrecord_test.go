package aggregator

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// FuzzAggregatorRecord drives one partition of the aggregator with
// entitlements (Process, Work and Flush on the real processor, on a
// stream.Local) with a program: events of three customers on a SUM and a
// COUNT meter (quantities 0 to 2^40, event times over hourly periods,
// late ones past a period's end and grace included), watermarks, ticks of
// usage.entitlements moving its broker time, customers' records and
// default plans (caps that reject or allow, grants with windows,
// overdraft denied, allowed or limited, unmetered, scheduled ones),
// deletions, rate cards, malformed records of either topic, commits,
// aborted transactions processed again and restores of the partition
// from its changelog. After each transaction it checks that
// (docs/entitlements.md, The aggregator; docs/testing.md, Fuzzing):
//
//   - Process, Work and Flush return no error and nothing panics;
//   - every output decodes with the project's decoders;
//   - the records of an aborted transaction, processed again, give the
//     outputs they gave before;
//
// and at the end, once the gate is empty and the chunked work done:
//
//   - the program gives the same outputs, byte for byte, with its
//     restores as without them;
//   - every event is rejected (with a reason the aggregator raises), booked
//     as an adjustment or counted in its aggregate's last revision, exactly
//     once; every malformed record of usage.deduped is rejected once;
//   - per customer, meter and period, the units accepted never pass the
//     largest cap that rejects, when every plan that may have applied has
//     one (docs/entitlements.md, Plans and caps);
//   - no balance shows a grant that paid more than the largest amount
//     written for its id, a negative remainder, usage past a rejecting
//     cap, or an overdraft that no plan that may have applied allows
//     (docs/entitlements.md, Credits).
func FuzzAggregatorRecord(f *testing.F) {
	for _, p := range aggFuzzSeeds() {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, prog []byte) {
		h := newAggFuzz(t, false)
		defer h.close()
		h.run(prog)
		h.checkEnd()
		if testing.Verbose() {
			t.Logf("%d events: %d rejected %v, %d adjustments, %d aggregates, %d balances, %d outputs", len(h.events), len(h.rejections),
				h.rejections, len(h.adjusted), len(h.last), len(h.balances), len(h.outputs))
		}
		if !h.restored {
			return
		}
		// The same program without the restores: a partition restored
		// from its changelog decides as the one that kept its store.
		kept := newAggFuzz(t, true)
		defer kept.close()
		kept.run(prog)
		a, b := h.outputs, kept.outputs
		for i := range min(len(a), len(b)) {
			if !sameAggRecord(a[i], b[i]) {
				t.Fatalf("output %d is %s with restores, %s without", i, describeOut(a[i]), describeOut(b[i]))
			}
		}
		if len(a) != len(b) {
			t.Fatalf("%d outputs with restores, %d without", len(a), len(b))
		}
	})
}

// The harness's configuration: hourly periods with a grace of ten
// minutes, FINAL chunks of two aggregates, one partition of every topic.
const (
	afStart    = int64(1_796_083_200_000) // 2026-12-01T00:00:00Z, the broker clock's start
	afGrace    = 10 * time.Minute
	afChunk    = 2
	afMaxSteps = 300
	afMeters   = "meters:\n  - {name: s, aggregation: SUM}\n  - {name: c, aggregation: COUNT}\n"
)

// The program's operations (op byte mod afOps).
const (
	afEvent     = iota // customer, meter, quantity, clock step, event time offset
	afWatermark        // clock step, lag
	afTick             // clock step
	afPlan             // customer (3: the default plan), then the plan's bytes
	afRates            // rates, a change's delay
	afDelete           // customer
	afMalformed        // topic, bytes
	afCommit
	afAbort   // abort the open transaction and process its input again
	afRestore // commit, then restore the partition from its changelog
	afWork    // one call of Work, if the partition has work
	afOps
)

var afCustomers = []string{"acme", "globex", "initech"}

// afCall is one call the open transaction made: Process of recs, or
// Work (recs nil).
type afCall struct{ recs []*kgo.Record }

type aggFuzz struct {
	t         *testing.T
	names     topics.Names
	pr        *processor
	l         *stream.Local
	now       int64
	entOff    int64
	evOff     int64
	steps     int
	seq       int
	open      []afCall
	aborted   [][]*kgo.Record
	noRestore bool
	restored  bool
	outputs   []*kgo.Record // every committed output, in order
	// What the program gave: its events by id, the malformed records of
	// usage.deduped by offset and of usage.entitlements by offset, and
	// every valid plan by customer ("" the default plan).
	events     map[string]*schemas.DedupedEvent
	badEvents  map[int64]bool
	badEnt     map[int64]bool
	plans      map[string][]*schemas.Entitlements
	grantMax   map[string]int64
	rejections map[string]string // by event id: reason
	badRej     map[int64]int     // rejections of malformed records of usage.deduped, by offset
	adjusted   map[string]*schemas.Adjustment
	last       map[string]*schemas.Aggregate // each aggregate's last revision, by key
	balances   []*schemas.Balance
}

func newAggFuzz(t *testing.T, noRestore bool) *aggFuzz {
	names := topics.DefaultNames()
	names.Prefix = "fz."
	cat, err := ParseMeters([]byte(afMeters))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Topics: names, Meters: cat, Entitlements: true, Period: Hour, Grace: afGrace}
	cfg.EnsureDefaults()
	setFinalChunk(&cfg, afChunk)
	ledger, err := entitlements.New(cfg.ledgerConfig())
	if err != nil {
		t.Fatal(err)
	}
	h := &aggFuzz{t: t, names: names, now: afStart, noRestore: noRestore, events: map[string]*schemas.DedupedEvent{},
		badEvents: map[int64]bool{}, badEnt: map[int64]bool{}, plans: map[string][]*schemas.Entitlements{},
		grantMax: map[string]int64{}, rejections: map[string]string{}, badRej: map[int64]int{},
		adjusted: map[string]*schemas.Adjustment{}, last: map[string]*schemas.Aggregate{}}
	h.pr = &processor{ledger: ledger, cfg: cfg, aggregatesTopic: cfg.Topics.AggregatesTopic(), log: zap.NewNop(),
		counts: partitionCountsT{events: 1, deduped: 1, aggregates: 1, adjustments: 1, rejected: 1, entitlements: 1, balances: 1},
		m:      newMetrics(prometheus.NewRegistry()), now: func() time.Time { return time.UnixMilli(h.now) }}
	if h.l, err = stream.NewLocal(h.pr, 0, names.DedupedTopic()); err != nil {
		t.Fatal(err)
	}
	h.l.Keep()
	return h
}

func (h *aggFuzz) close() {
	if h.l != nil {
		_ = h.l.Close()
	}
}

// run runs a program: a prelude (a rate card, a default plan and a tick
// at the start), the program, then the end: a tick past everything, the
// chunked work done, each in transactions of their own.
func (h *aggFuzz) run(prog []byte) {
	h.rates(&schemas.RateCard{Versions: []schemas.RateVersion{{Rates: []schemas.Rate{{Meter: "s", MicroCredits: 1, PerUnits: 1},
		{Meter: "c", MicroCredits: 10, PerUnits: 1}}}}})
	h.plan("", &schemas.Entitlements{Plan: "free", Caps: []schemas.Cap{{Meter: "s", Limit: 50, OnLimit: schemas.OnLimitReject},
		{Meter: "c", Limit: 4, OnLimit: schemas.OnLimitReject}}, Grants: []schemas.Grant{{ID: "g0", Amount: 1000}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}})
	h.tick()
	h.commit()
	r := &progReader{b: prog}
	for !r.done() && h.steps < afMaxSteps {
		h.steps++
		h.op(r)
	}
	// A watermark at the clock and a tick past it: the gate empties and
	// every period an event arrived late for is final.
	h.commit()
	h.give(h.names.DedupedTopic(), nil, schemas.MustEncode(&schemas.Watermark{SourcePartitions: 1, Watermark: h.now}))
	h.now++
	h.tick()
	h.commit()
	for i := 0; i < 1000 && h.l.HasWork(); i++ {
		h.work()
		h.commit()
	}
	if h.l.HasWork() {
		h.t.Fatal("work left after 1,000 transactions of work")
	}
}

func (h *aggFuzz) op(r *progReader) {
	switch r.byte() % afOps {
	case afEvent:
		h.opEvent(r)
	case afWatermark:
		h.step(r)
		lag := int64(r.byte()%16) * 5 * 60_000
		h.give(h.names.DedupedTopic(), nil, schemas.MustEncode(&schemas.Watermark{SourcePartitions: 1, Watermark: h.now - lag}))
	case afTick:
		h.step(r)
		h.tick()
	case afPlan:
		h.opPlan(r)
	case afRates:
		h.opRates(r)
	case afDelete:
		c := afCustomers[int(r.byte())%len(afCustomers)]
		h.plans[c] = append(h.plans[c], nil) // the default plan applies
		h.give(h.names.EntitlementsTopic(), schemas.CustomerKey(c), nil)
	case afMalformed:
		ent := r.byte()%2 == 1
		v := append([]byte{0xc3, 0x01}, r.bytes(int(r.byte()%24))...)
		if ent {
			h.badEnt[h.entOff] = true
			h.give(h.names.EntitlementsTopic(), schemas.CustomerKey(afCustomers[0]), v)
		} else {
			h.badEvents[h.evOff] = true
			h.give(h.names.DedupedTopic(), schemas.CustomerKey(afCustomers[0]), v)
		}
	case afCommit:
		h.commit()
	case afAbort:
		h.abort()
	case afRestore:
		h.commit()
		if !h.noRestore {
			h.restore()
		}
	case afWork:
		h.work()
	}
}

// step moves the broker clock on by up to 85 minutes, by 20 seconds.
func (h *aggFuzz) step(r *progReader) { h.now += int64(r.byte()) * 20_000 }

// afQuantities are the quantities an event can have.
var afQuantities = []int64{0, 1, 2, 3, 5, 10, 40, 1 << 40}

// opEvent gives an event arriving now: its customer, meter, quantity, and
// event time up to about four hours before its arrival or half an hour
// after it.
func (h *aggFuzz) opEvent(r *progReader) {
	c, m, q := r.byte(), r.byte(), r.byte()
	h.step(r)
	off := int64(int8(r.byte())) * 2 * 60_000
	if off > 0 {
		off /= 4
	}
	h.seq++
	e := &schemas.DedupedEvent{EventID: fmt.Sprintf("e%d", h.seq), CustomerID: afCustomers[int(c)%len(afCustomers)],
		Meter: []string{"s", "c"}[m%2], Quantity: afQuantities[int(q)%len(afQuantities)], EventTime: h.now + off,
		IngestTime: h.now, Source: "fuzz", SourceOffset: int64(h.seq)}
	h.events[e.EventID] = e
	h.give(h.names.DedupedTopic(), schemas.CustomerKey(e.CustomerID), schemas.MustEncode(e))
}

// opPlan gives a customer's record, or the default plan's: its caps on s
// and c (none, one that rejects or one that allows, of a few limits),
// up to two grants (amount, priority, a window around now), an overdraft
// policy, unmetered now and then, and now and then an effective time
// ahead.
func (h *aggFuzz) opPlan(r *progReader) {
	who := int(r.byte()) % (len(afCustomers) + 1)
	c := ""
	if who < len(afCustomers) {
		c = afCustomers[who]
	}
	capb, grants, od, flags := r.byte(), r.byte(), r.byte(), r.byte()
	e := &schemas.Entitlements{CustomerID: c, Plan: fmt.Sprintf("p%d", flags%4), Unmetered: flags&0x80 != 0 && flags&0x40 != 0}
	limits := []int64{0, 3, 10, 50, 1 << 41}
	for i, m := range []string{"s", "c"} {
		b := capb >> (4 * i)
		if b&3 == 0 {
			continue
		}
		on := schemas.OnLimitReject
		if b&3 == 3 {
			on = schemas.OnLimitAllow
		}
		e.Caps = append(e.Caps, schemas.Cap{Meter: m, Limit: limits[int(b>>2)%len(limits)], OnLimit: on})
	}
	for i := range int(grants % 3) {
		g := schemas.Grant{ID: fmt.Sprintf("g%d", i), Amount: []int64{5, 100, 1000, 1 << 42}[(grants>>(2+2*i))&3], Priority: int32(i)}
		if grants&0x40 != 0 {
			g.EffectiveFrom = h.now - 3600_000
			g.ExpiresAt = h.now + int64(1+i)*3600_000
		}
		e.Grants = append(e.Grants, g)
	}
	switch od % 3 {
	case 0:
		e.Overdraft = schemas.Overdraft{Policy: schemas.OverdraftDeny}
	case 1:
		e.Overdraft = schemas.Overdraft{Policy: schemas.OverdraftAllow, Limit: int64(od/3) * 7}
	default:
		e.Overdraft = schemas.Overdraft{Policy: schemas.OverdraftAllow}
	}
	if flags&0x20 != 0 {
		e.EffectiveFrom = h.now + int64(flags&0x1f)*5*60_000
	}
	h.step(r)
	h.plan(c, e)
}

// opRates gives a rate card: the rates of s and c from now, and a change
// of both some minutes later.
func (h *aggFuzz) opRates(r *progReader) {
	s, c, later := r.byte(), r.byte(), r.byte()
	h.step(r)
	v := []schemas.RateVersion{{Rates: []schemas.Rate{{Meter: "s", MicroCredits: int64(s % 16), PerUnits: 1 + int64(s>>4)},
		{Meter: "c", MicroCredits: int64(c % 32), PerUnits: 1}}}}
	if later != 0 {
		v = append(v, schemas.RateVersion{EffectiveFrom: h.now + int64(later)*60_000,
			Rates: []schemas.Rate{{Meter: "s", MicroCredits: int64(s%16) + 3, PerUnits: 1}}})
	}
	h.rates(&schemas.RateCard{Versions: v})
}

func (h *aggFuzz) rates(c *schemas.RateCard) {
	h.give(h.names.EntitlementsTopic(), []byte(schemas.RateCardKey), schemas.MustEncode(c))
}

// plan gives customer c's record ("" the default plan's) and keeps it
// among the plans that may apply to c.
func (h *aggFuzz) plan(c string, e *schemas.Entitlements) {
	key := []byte(schemas.DefaultPlanKey)
	if c != "" {
		key = schemas.CustomerKey(c)
	}
	h.plans[c] = append(h.plans[c], e)
	for _, g := range e.Grants {
		h.grantMax[g.ID] = max(h.grantMax[g.ID], g.Amount)
	}
	h.give(h.names.EntitlementsTopic(), key, schemas.MustEncode(e))
}

func (h *aggFuzz) tick() {
	h.give(h.names.EntitlementsTopic(), []byte(schemas.TickKey), schemas.MustEncode(&schemas.Tick{InstanceID: "fuzz"}))
}

// give processes a record of topic at the broker clock in the open
// transaction.
func (h *aggFuzz) give(topic string, key, value []byte) {
	off := &h.evOff
	if topic == h.names.EntitlementsTopic() {
		off = &h.entOff
	}
	rec := &kgo.Record{Topic: topic, Offset: *off, Key: key, Value: value, Timestamp: time.UnixMilli(h.now)}
	*off++
	h.open = append(h.open, afCall{recs: []*kgo.Record{rec}})
	if err := h.l.Process([]*kgo.Record{afClone(rec)}); err != nil {
		h.t.Fatalf("%s offset %d: Process: %v", topic, rec.Offset, err)
	}
}

func (h *aggFuzz) work() {
	if !h.l.HasWork() {
		return
	}
	h.open = append(h.open, afCall{})
	if _, err := h.l.Work(); err != nil {
		h.t.Fatalf("Work: %v", err)
	}
}

func (h *aggFuzz) commit() {
	if err := h.l.Commit(); err != nil {
		h.t.Fatalf("commit: %v", err)
	}
	outs := h.l.TakeOutput()
	for i, a := range h.aborted {
		if len(a) > len(outs) {
			h.t.Fatalf("aborted attempt %d emitted %d records, processed again %d", i, len(a), len(outs))
		}
		for j := range a {
			if !sameAggRecord(a[j], outs[j]) {
				h.t.Fatalf("output %d of aborted attempt %d is %s, processed again %s", j, i, describeOut(a[j]), describeOut(outs[j]))
			}
		}
	}
	h.open, h.aborted = nil, nil
	h.outputs = append(h.outputs, outs...)
	for _, o := range outs {
		h.check(o)
	}
}

// abort aborts the open transaction and makes its calls again in a new
// one, as the runtime does from the committed offsets.
func (h *aggFuzz) abort() {
	h.aborted = append(h.aborted, h.l.Abort())
	for _, c := range h.open {
		if c.recs == nil {
			if _, err := h.l.Work(); err != nil {
				h.t.Fatalf("Work after an abort: %v", err)
			}
			continue
		}
		recs := make([]*kgo.Record, len(c.recs))
		for i, r := range c.recs {
			recs[i] = afClone(r)
		}
		if err := h.l.Process(recs); err != nil {
			h.t.Fatalf("Process after an abort: %v", err)
		}
	}
}

// restore replaces the partition by one restored from its changelog.
func (h *aggFuzz) restore() {
	cl := h.l.Changelog()
	if err := h.l.Close(); err != nil {
		h.t.Fatal(err)
	}
	h.l = nil
	l, err := stream.RestoreLocal(h.pr, 0, h.names.DedupedTopic(), cl)
	if err != nil {
		h.t.Fatalf("restore from the changelog: %v", err)
	}
	h.l = l
	h.restored = true
}

func sameAggRecord(x, y *kgo.Record) bool {
	return x.Topic == y.Topic && x.Partition == y.Partition && bytes.Equal(x.Key, y.Key) && bytes.Equal(x.Value, y.Value) &&
		fmt.Sprint(x.Headers) == fmt.Sprint(y.Headers)
}

func describeOut(r *kgo.Record) string {
	m, err := schemas.Decode(r.Value)
	if err != nil {
		return fmt.Sprintf("%s key %q (%d bytes, %v)", r.Topic, r.Key, len(r.Value), err)
	}
	return fmt.Sprintf("%s key %q %+v", r.Topic, r.Key, m)
}

// progReader reads a program; past its end every read is zero.
type progReader struct{ b []byte }

func (r *progReader) done() bool { return len(r.b) == 0 }

func (r *progReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *progReader) bytes(n int) []byte {
	n = min(n, len(r.b))
	b := bytes.Clone(r.b[:n])
	r.b = r.b[n:]
	return b
}

// afClone copies a record of the program: a partition gets its own.
func afClone(r *kgo.Record) *kgo.Record {
	c := *r
	c.Key, c.Value = bytes.Clone(r.Key), bytes.Clone(r.Value)
	return &c
}
