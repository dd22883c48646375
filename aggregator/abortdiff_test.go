package aggregator

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/benchinput"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// diffTxn is one transaction of a differential run's input: Process calls
// of records of one topic each, and batches rejected unread.
type diffTxn []diffStep

// diffStep is records to process, or a batch rejected unread.
type diffStep struct {
	recs   []*kgo.Record
	reject *stream.RejectedBatch
}

// diffScript builds the input of a differential run: the plan, the rate
// card and a tick; events of customers, some past their caps; a record of
// a customer's own; a watermark past the period's end + grace (FINALs in
// chunks, balances of the next period, the prune); late events
// (adjustments); a watermark past the period's expiry.
func diffScript(names topics.Names) ([]diffTxn, error) {
	var evOff, entOff int64
	ev := func(recs ...*kgo.Record) diffStep {
		for _, r := range recs {
			r.Topic, r.Offset = names.DedupedTopic(), evOff
			evOff++
		}
		return diffStep{recs: recs}
	}
	ent := func(recs ...*kgo.Record) diffStep {
		for _, r := range recs {
			r.Topic, r.Offset = names.EntitlementsTopic(), entOff
			entOff++
		}
		return diffStep{recs: recs}
	}
	rejectEv := func(n int64) diffStep {
		b := &stream.RejectedBatch{Topic: names.DedupedTopic(), From: evOff, Next: evOff + n, Limit: 1 << 20}
		evOff += n
		return diffStep{reject: b}
	}
	rejectEnt := func(n int64) diffStep {
		b := &stream.RejectedBatch{Topic: names.EntitlementsTopic(), From: entOff, Next: entOff + n, Limit: 1 << 20}
		entOff += n
		return diffStep{reject: b}
	}
	wm := func(at time.Time) *kgo.Record {
		v := schemas.MustEncode(&schemas.Watermark{SourcePartition: 0, SourcePartitions: 1, Watermark: at.UnixMilli()})
		return &kgo.Record{Value: v, Timestamp: at}
	}
	tick := func(at time.Time) *kgo.Record {
		return &kgo.Record{Key: []byte(schemas.TickKey), Value: schemas.MustEncode(&schemas.Tick{InstanceID: "diff"}), Timestamp: at}
	}
	custs := pendingCustomers(7)
	events := func(from, n int, arrival time.Time) []*kgo.Record {
		var recs []*kgo.Record
		for i := from; i < from+n; i++ {
			e := benchinput.Event(i, custs[i%len(custs)], len(custs), arrival)
			e.CustomerID = fmt.Sprintf("cust-%05d", custs[i%len(custs)])
			recs = append(recs, &kgo.Record{Key: schemas.CustomerKey(e.CustomerID), Value: schemas.MustEncode(e), Timestamp: arrival})
		}
		return recs
	}
	first, err := procBenchEnt(names, procBenchNow)
	if err != nil {
		return nil, err
	}
	entOff = int64(len(first))
	first = first[:2] // the tick after a rejected batch
	now := procBenchNow
	own := &schemas.Entitlements{CustomerID: fmt.Sprintf("cust-%05d", custs[1]), Plan: "own",
		Grants: []schemas.Grant{{ID: "own", Amount: 500}}, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	defPlan := func(at time.Time) *kgo.Record {
		p := benchinput.Plan()
		p.Grants[0].Amount = 900_000
		return &kgo.Record{Key: []byte(schemas.DefaultPlanKey), Value: schemas.MustEncode(p), Timestamp: at}
	}
	rates := func(at time.Time) *kgo.Record {
		r := benchinput.Rates()
		r.Versions[0].Rates[0].MicroCredits = 2
		return &kgo.Record{Key: []byte(schemas.RateCardKey), Value: schemas.MustEncode(r), Timestamp: at}
	}
	// big is n events of 500 api_calls of the first customer, of
	// event_time at, arrived at arrival.
	big := func(from, n int, at, arrival time.Time) []*kgo.Record {
		var recs []*kgo.Record
		for i := from; i < from+n; i++ {
			e := &schemas.DedupedEvent{EventID: fmt.Sprintf("big-%d", i), CustomerID: fmt.Sprintf("cust-%05d", custs[0]), Meter: "api_calls",
				Quantity: 500, EventTime: at.UnixMilli(), IngestTime: arrival.UnixMilli(), Source: "diff",
				Properties: []schemas.Property{{Name: "region", Value: "eu-west-1"}}}
			recs = append(recs, &kgo.Record{Key: schemas.CustomerKey(e.CustomerID), Value: schemas.MustEncode(e), Timestamp: arrival})
		}
		return recs
	}
	end := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	script := []diffTxn{
		{{recs: first}},
		{rejectEv(3)},
		{rejectEnt(2), ent(tick(now.Add(time.Millisecond)))},
		{ev(wm(now.Add(-time.Hour))), ev(events(0, 60, now)...)},
		{ent(&kgo.Record{Key: schemas.CustomerKey(own.CustomerID), Value: schemas.MustEncode(own), Timestamp: now.Add(2 * time.Millisecond)}),
			ent(tick(now.Add(3 * time.Millisecond))), ev(events(60, 400, now.Add(3*time.Millisecond))...)},
		{ev(events(460, 300, now.Add(3*time.Millisecond))...), ent(tick(now.Add(time.Hour)))},
		// Events that wait in the gate, across transactions, while a
		// changed default plan (a sweep) and rate card are read.
		{ev(events(760, 50, now.Add(time.Hour+5*time.Millisecond))...), ent(defPlan(now.Add(time.Hour + time.Millisecond)))},
		{ev(events(810, 50, now.Add(time.Hour+6*time.Millisecond))...), ent(rates(now.Add(time.Hour + 2*time.Millisecond)))},
		{ent(tick(now.Add(2 * time.Hour))), ev(wm(now.Add(2 * time.Hour)))},
		// A customer past its cap: rejections, refunds.
		{ev(big(0, 8, now.Add(3*time.Hour), now.Add(3*time.Hour))...), ent(tick(now.Add(4 * time.Hour)))},
		{ent(tick(end.Add(2 * time.Hour))), ev(wm(end.Add(2 * time.Hour)))},
		{ent(tick(end.Add(3 * 24 * time.Hour))), ev(wm(end.Add(3 * 24 * time.Hour))), rejectEv(2)},
		// Late events of the final period: adjustments.
		{ev(big(8, 4, now.Add(5*time.Hour), end.Add(3*24*time.Hour+time.Minute))...), ent(tick(end.Add(3*24*time.Hour + 2*time.Minute)))},
		{ent(tick(end.Add(4 * 24 * time.Hour))), ev(wm(end.Add(4 * 24 * time.Hour)))},
		{ent(tick(end.Add(90 * 24 * time.Hour))), ev(wm(end.Add(90 * 24 * time.Hour)))},
		{ent(tick(end.Add(91 * 24 * time.Hour)))},
	}
	return script, nil
}

// diffEntOff is the order of a differential run with entitlements off.
const diffEntOff = "off"

// diffProcessor is procBenchProcessor with entitlements (in order, or
// off: diffEntOff), a chunk of 3 and its registry.
func diffProcessor(tb testing.TB, names topics.Names, order string) (*processor, *prometheus.Registry) {
	tb.Helper()
	cat, err := ParseMeters([]byte(benchinput.Meters))
	if err != nil {
		tb.Fatal(err)
	}
	cfg := Config{Topics: names, Meters: cat, Entitlements: order != diffEntOff, EntitlementsOrder: order}
	if order == diffEntOff {
		cfg.EntitlementsOrder = ""
	}
	cfg.EnsureDefaults()
	setFinalChunk(&cfg, 3)
	var ledger *entitlements.Ledger
	if cfg.Entitlements {
		if ledger, err = entitlements.New(cfg.ledgerConfig()); err != nil {
			tb.Fatal(err)
		}
	}
	n := int32(procBenchPartitions)
	reg := prometheus.NewRegistry()
	return &processor{ledger: ledger, cfg: cfg, aggregatesTopic: cfg.Topics.AggregatesTopic(), log: zap.NewNop(),
		counts: partitionCountsT{events: 1, deduped: n, aggregates: n, adjustments: n, rejected: n, entitlements: n, balances: n},
		m:      newMetrics(reg), now: func() time.Time { return procBenchNow }}, reg
}

// diffFault is where a differential run departs from the uninterrupted
// one: at transaction txn of the script (or at the work'th Work
// transaction, counted from the start, when work >= 0), how.
type diffFault struct {
	txn, work int
	how       string
	order     string // Config.EntitlementsOrder
}

// diffResult is what a run committed: its state, its output and its
// counters.
type diffResult struct {
	state, out, counters []string
	works                int
}

// diffRunner runs a script through partition 0 on an in-memory store,
// each transaction of input followed by Work transactions while the
// partition has work.
type diffRunner struct {
	tb      testing.TB
	names   topics.Names
	script  []diffTxn
	l       *stream.Local
	pr      *processor
	reg     *prometheus.Registry
	order   string
	works   int
	stopped bool
	res     diffResult
}

func (d *diffRunner) commit() {
	d.tb.Helper()
	if err := d.l.Commit(); err != nil {
		d.tb.Fatal(err)
	}
	for _, r := range d.l.TakeOutput() {
		if r.Topic == d.names.EntitlementsTopic() {
			continue // Punctuate's ticks
		}
		d.res.out = append(d.res.out, fmt.Sprintf("%s %x %x", r.Topic, r.Key, r.Value))
	}
}

// reopen closes the partition and opens it again from its changelog:
// with the same processor (a revoke and a reassignment), or a new one (a
// restart).
func (d *diffRunner) reopen(restart bool) {
	d.tb.Helper()
	cl := d.l.Changelog()
	if err := d.l.Close(); err != nil {
		d.tb.Fatal(err)
	}
	if restart {
		d.pr, d.reg = diffProcessor(d.tb, d.names, d.order)
	}
	l, err := stream.RestoreLocal(d.pr, 0, d.names.DedupedTopic(), cl)
	if err != nil {
		d.tb.Fatalf("the partition does not open again: %v", err)
	}
	d.l = l
}

func (d *diffRunner) process(txn diffTxn) {
	d.tb.Helper()
	for _, st := range txn {
		if d.order == diffEntOff && (len(st.recs) > 0 && st.recs[0].Topic == d.names.EntitlementsTopic() ||
			st.reject != nil && st.reject.Topic == d.names.EntitlementsTopic()) {
			continue // no usage.entitlements
		}
		var err error
		if st.reject != nil {
			err = d.l.RejectBatch(*st.reject)
		} else {
			err = d.l.Process(st.recs)
		}
		if err != nil {
			d.tb.Fatal(err)
		}
	}
}

// drain gives the partition Work transactions while it has work; the
// work'th of the run is aborted (f.how "abort"), aborted and followed by
// a punctuate-only transaction ("abort-punctuate"), by the next
// transaction of input ("abort-then-input": drain returns), committed
// and followed by a reopen ("reassign", "restart"), or not done before
// the next transaction of input ("stop").
func (d *diffRunner) drain(f diffFault) {
	d.tb.Helper()
	for n := 0; d.l.HasWork(); n++ {
		if f.how == "stop" && d.works == f.work && !d.stopped {
			// The next transaction of input goes before this work.
			d.stopped = true
			return
		}
		if n > 10_000 {
			d.tb.Fatal("no end to the work")
		}
		if _, err := d.l.Work(); err != nil {
			d.tb.Fatal(err)
		}
		d.works++
		if d.works-1 == f.work {
			switch f.how {
			case "abort":
				d.l.Abort()
				continue
			case "abort-punctuate":
				d.l.Abort()
				if err := d.l.Punctuate(); err != nil {
					d.tb.Fatal(err)
				}
				d.commit()
				continue
			case "abort-then-input":
				d.l.Abort()
				return
			case "reassign", "restart":
				d.commit()
				d.reopen(f.how == "restart")
				continue
			}
		}
		d.commit()
	}
}

func runDiff(tb testing.TB, f diffFault) diffResult {
	tb.Helper()
	names := topics.DefaultNames()
	names.Prefix = "bench."
	script, err := diffScript(names)
	if err != nil {
		tb.Fatal(err)
	}
	d := &diffRunner{tb: tb, names: names, script: script, order: f.order}
	d.pr, d.reg = diffProcessor(tb, names, f.order)
	if d.l, err = stream.NewLocal(d.pr, 0, names.DedupedTopic()); err != nil {
		tb.Fatal(err)
	}
	d.l.Keep()
	for i, txn := range script {
		d.process(txn)
		if f.work < 0 && i == f.txn {
			switch f.how {
			case "abort":
				d.l.Abort()
				d.drain(f)
				d.process(txn)
			case "abort-punctuate":
				d.l.Abort()
				if err := d.l.Punctuate(); err != nil {
					tb.Fatal(err)
				}
				d.commit()
				d.drain(f)
				d.process(txn)
			case "abort-work-reassign":
				d.l.Abort()
				d.drain(f)
				d.reopen(false)
				d.process(txn)
			case "abort-reassign", "abort-restart":
				d.l.Abort()
				d.reopen(f.how == "abort-restart")
				d.process(txn)
			}
		}
		d.commit()
		if f.work < 0 && i == f.txn && (f.how == "reassign" || f.how == "restart") {
			d.reopen(f.how == "restart")
		}
		d.drain(f)
	}
	// The work an abort or a stop left after the last transaction of input.
	d.drain(diffFault{txn: -1, work: -1})
	d.res.state, d.res.works = dbState(tb, d.l.DB()), d.works
	// The changelog restores that state, and the partition opens on it.
	d.reopen(false)
	if msg := diffLines("state restored from the changelog", d.res.state, dbState(tb, d.l.DB())); msg != "" {
		tb.Errorf("%+v:\n%s", f, msg)
	}
	if !strings.HasSuffix(f.how, "restart") && f.how != "restart" {
		d.res.counters = counters(tb, d.reg)
	}
	if err := d.l.Close(); err != nil {
		tb.Fatal(err)
	}
	return d.res
}

// dbState lists every key and value of a store.
func dbState(tb testing.TB, db *pebble.DB) []string {
	tb.Helper()
	it, err := db.NewIter(nil)
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for it.First(); it.Valid(); it.Next() {
		out = append(out, fmt.Sprintf("%q=%x", it.Key(), it.Value()))
	}
	if err := it.Close(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// counters lists the counters and histogram counts of a registry.
func counters(tb testing.TB, reg *prometheus.Registry) []string {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var b strings.Builder
			for _, lp := range m.GetLabel() {
				fmt.Fprintf(&b, "%s=%s,", lp.GetName(), lp.GetValue())
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out = append(out, fmt.Sprintf("%s{%s} %v", mf.GetName(), b.String(), m.GetCounter().GetValue()))
			case dto.MetricType_HISTOGRAM:
				out = append(out, fmt.Sprintf("%s{%s} %v", mf.GetName(), b.String(), m.GetHistogram().GetSampleCount()))
			case dto.MetricType_GAUGE:
				out = append(out, fmt.Sprintf("%s{%s} %v", mf.GetName(), b.String(), m.GetGauge().GetValue()))
			}
		}
	}
	return out
}

// diffLines reports the first differences of two listings.
func diffLines(what string, want, got []string) string {
	if slices.Equal(want, got) {
		return ""
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s: %d lines, want %d\n", what, len(got), len(want))
	n := 0
	ws, gs := map[string]int{}, map[string]int{}
	for _, w := range want {
		ws[w]++
	}
	for _, g := range got {
		gs[g]++
	}
	for _, w := range want {
		if gs[w] == 0 && n < 6 {
			fmt.Fprintf(&b, "  missing %.300s\n", w)
			n++
		}
	}
	for _, g := range got {
		if ws[g] == 0 && n < 12 {
			fmt.Fprintf(&b, "  extra   %.300s\n", g)
			n++
		}
	}
	if n == 0 {
		fmt.Fprintf(&b, "  same lines, another order or count\n")
	}
	return b.String()
}

// TestAbortDifferential: the input (diffScript: with entitlements in
// input order, in arrival order, and off) run with an abort at a
// transaction boundary (then the same input again, after a
// punctuate-only transaction, a Work transaction, a Work transaction and a
// reopen, or a reopen), or with a
// reassignment or a restart there, commits the state, the output and the
// counts of the run without: at every boundary of the input, and at
// every Work transaction (every fourth; in -short, every 23rd). A Work
// transaction aborted and followed by input commits what the run whose
// input went before that work does.
func TestAbortDifferential(t *testing.T) {
	for _, order := range []string{EntitlementsOrderInput, EntitlementsOrderArrival, diffEntOff} {
		t.Run(order, func(t *testing.T) { testAbortDifferential(t, order) })
	}
}

func testAbortDifferential(t *testing.T, order string) {
	base := runDiff(t, diffFault{txn: -1, work: -1, order: order})
	t.Logf("%d state keys, %d records out, %d work transactions", len(base.state), len(base.out), base.works)
	check := func(name string, got diffResult) {
		t.Helper()
		msg := diffLines("state", base.state, got.state) + diffLines("output", base.out, got.out)
		if got.counters != nil {
			msg += diffLines("counters", base.counters, got.counters)
		}
		if msg != "" {
			t.Errorf("%s:\n%s", name, msg)
		}
	}
	script, _ := diffScript(topics.Names{Prefix: "bench."})
	t.Run("input", func(t *testing.T) {
		for _, how := range []string{"abort", "abort-punctuate", "abort-work-reassign", "abort-reassign", "abort-restart", "reassign", "restart"} {
			for i := range script {
				check(fmt.Sprintf("%s at transaction %d", how, i), runDiff(t, diffFault{txn: i, work: -1, how: how, order: order}))
			}
		}
	})
	stride := 4
	if testing.Short() {
		stride = 23
	}
	t.Run("work", func(t *testing.T) {
		for _, how := range []string{"abort", "abort-punctuate", "reassign", "restart"} {
			for w := 0; w < base.works; w += stride {
				check(fmt.Sprintf("%s at work %d", how, w), runDiff(t, diffFault{txn: -1, work: w, how: how, order: order}))
			}
		}
		// A Work transaction aborted, then the next transaction of input: as
		// the run whose input went before that work.
		for w := 0; w < base.works; w += stride {
			stop := runDiff(t, diffFault{txn: -1, work: w, how: "stop", order: order})
			got := runDiff(t, diffFault{txn: -1, work: w, how: "abort-then-input", order: order})
			msg := diffLines("state", stop.state, got.state) + diffLines("output", stop.out, got.out) + diffLines("counters", stop.counters, got.counters)
			if msg != "" {
				t.Errorf("abort-then-input at work %d:\n%s", w, msg)
			}
		}
	})
}
