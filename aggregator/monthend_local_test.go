package aggregator

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// The month end of February 2028 (a leap year) in one partition on an
// in-memory store (stream.Local): customers × two meters (SUM and MAX)
// closing at once, with the events at the edges of the period and of its
// cutoff, then a watermark past end + grace, the FINAL revisions in
// chunks, and a watermark months later that expires the period in
// chunks.
type monthEndLocal struct {
	tb         testing.TB
	names      topics.Names
	cfg        Config
	customers  int
	start, end int64
	next       int64 // the next input offset
}

func newMonthEndLocal(tb testing.TB, customers, chunk int) *monthEndLocal {
	cat, err := ParseMeters([]byte("meters:\n  - {name: api, aggregation: SUM}\n  - {name: peak, aggregation: MAX}\n"))
	if err != nil {
		tb.Fatal(err)
	}
	names := topics.DefaultNames()
	cfg := Config{Topics: names, Meters: cat, FinalChunk: chunk}
	cfg.EnsureDefaults()
	return &monthEndLocal{tb: tb, names: names, cfg: cfg, customers: customers,
		start: time.Date(2028, 2, 1, 0, 0, 0, 0, time.UTC).UnixMilli(),
		end:   time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC).UnixMilli()}
}

// processor is the aggregator's processor of one partition everywhere
// and one source partition of usage.events.
func (m *monthEndLocal) processor() *processor {
	return &processor{cfg: m.cfg, aggregatesTopic: m.cfg.Topics.AggregatesTopic(), log: zap.NewNop(),
		counts: partitionCountsT{events: 1, deduped: 1, aggregates: 1, adjustments: 1, rejected: 1, entitlements: 1, balances: 1},
		m:      newMetrics(prometheus.NewRegistry()), now: time.Now}
}

// open opens the partition: new and keeping its records (Keep), or, with
// a changelog, restored from it.
func (m *monthEndLocal) open(changelog []*kgo.Record) *stream.Local {
	var l *stream.Local
	var err error
	if changelog == nil {
		if l, err = stream.NewLocal(m.processor(), 0, m.names.DedupedTopic()); err == nil {
			l.Keep()
		}
	} else {
		l, err = stream.RestoreLocal(m.processor(), 0, m.names.DedupedTopic(), changelog)
	}
	if err != nil {
		m.tb.Fatal(err)
	}
	return l
}

func (m *monthEndLocal) record(msg schemas.Message, key []byte, at int64) *kgo.Record {
	r := &kgo.Record{Topic: m.names.DedupedTopic(), Offset: m.next, Key: key, Value: schemas.MustEncode(msg),
		Timestamp: time.UnixMilli(at)}
	m.next++
	return r
}

func (m *monthEndLocal) watermark(at int64) *kgo.Record {
	return m.record(&schemas.Watermark{SourcePartition: 0, SourcePartitions: 1, Watermark: at}, nil, at)
}

func (m *monthEndLocal) event(id, customer, meter string, q, eventTime, arrival int64) *kgo.Record {
	e := &schemas.DedupedEvent{EventID: id, CustomerID: customer, Meter: meter, Quantity: q, EventTime: eventTime,
		IngestTime: arrival, Source: "t"}
	return m.record(e, schemas.CustomerKey(customer), arrival)
}

// edge customers: their events sit on the edges of February and its
// cutoff (m.edges).
const (
	edgeLeapDay = "edge-leap"  // 29 February 23:59:59.999: February
	edgeAtEnd   = "edge-end"   // 1 March 00:00:00.000 exactly: March
	edgeAtGrace = "edge-grace" // arrival end + grace exactly: on time
	edgeLate    = "edge-late"  // arrival end + grace + 1 ms: an adjustment
)

// fill processes the month's events in transactions of 50,000 records:
// per customer one api and one peak event late on 29 February, arriving
// an hour into March; then the edge events, and a watermark at
// end + grace exactly (nothing final yet).
func (m *monthEndLocal) fill(l *stream.Local) {
	grace := m.cfg.Grace.Milliseconds()
	et, arrival := m.end-1, m.end+time.Hour.Milliseconds()
	var batch []*kgo.Record
	flush := func() {
		if err := l.Process(batch); err != nil {
			m.tb.Fatal(err)
		}
		if err := l.Commit(); err != nil {
			m.tb.Fatal(err)
		}
		batch = batch[:0]
	}
	for i := range m.customers {
		c := fmt.Sprintf("cust-%06d", i)
		batch = append(batch, m.event(c+"-a", c, "api", int64(i%100+1), et-int64(i%1000), arrival),
			m.event(c+"-p", c, "peak", int64(i%7+1), et, arrival))
		if len(batch) >= 50_000 {
			flush()
		}
	}
	batch = append(batch,
		m.event("leap", edgeLeapDay, "api", 5, m.end-1, m.end),
		m.event("at-end", edgeAtEnd, "api", 7, m.end, m.end),
		m.event("at-grace", edgeAtGrace, "api", 11, m.end-time.Hour.Milliseconds(), m.end+grace),
		m.event("late", edgeLate, "api", 13, m.end-time.Hour.Milliseconds(), m.end+grace+1),
		m.watermark(m.end+grace))
	flush()
}

// txnStats is what the chunked work's transactions carried.
type txnStats struct {
	txns, maxFinals, finals int
	// maxBytes: the most bytes (keys and values of its records, emitted
	// and changelog) one transaction wrote; kept runs only.
	maxBytes int
	peakHeap uint64
	elapsed  time.Duration
}

// work runs the partition's chunked work, one transaction per chunk, until
// none is left or stop says so after a committed one; kept: the Local keeps
// its output (Keep), which work takes after each transaction and hands to
// out.
func (m *monthEndLocal) work(l *stream.Local, kept bool, out func([]*kgo.Record), stop func(int) bool) txnStats {
	var st txnStats
	var ms runtime.MemStats
	t0 := time.Now()
	topic := m.names.AggregatesTopic()
	clSeen := len(l.Changelog())
	for l.HasWork() {
		before := l.Emitted(topic)
		if _, err := l.Work(); err != nil {
			m.tb.Fatal(err)
		}
		if err := l.Commit(); err != nil {
			m.tb.Fatal(err)
		}
		st.txns++
		n := l.Emitted(topic) - before
		st.finals += n
		st.maxFinals = max(st.maxFinals, n)
		if kept {
			recs := l.TakeOutput()
			cl := l.Changelog()
			st.maxBytes = max(st.maxBytes, recordBytes(recs)+recordBytes(cl[clSeen:]))
			clSeen = len(cl)
			out(recs)
		}
		if st.txns%8 == 1 {
			runtime.ReadMemStats(&ms)
			st.peakHeap = max(st.peakHeap, ms.HeapInuse)
		}
		if stop != nil && stop(st.txns) {
			break
		}
	}
	st.elapsed = time.Since(t0)
	return st
}

// pass processes a watermark at wm in a transaction of its own.
func (m *monthEndLocal) pass(l *stream.Local, wm int64) {
	if err := l.Process([]*kgo.Record{m.watermark(wm)}); err != nil {
		m.tb.Fatal(err)
	}
	if err := l.Commit(); err != nil {
		m.tb.Fatal(err)
	}
}

// monthEndOutput folds the records a month end emits: the FINAL revisions
// per aggregate and period, and the adjustments.
type monthEndOutput struct {
	finals map[string][]*schemas.Aggregate // customer/meter/period start
	adjs   []*schemas.Adjustment
}

func (o *monthEndOutput) add(tb testing.TB, names topics.Names, recs []*kgo.Record) {
	for _, r := range recs {
		switch r.Topic {
		case names.AggregatesTopic():
			var a schemas.Aggregate
			if err := schemas.DecodeInto(r.Value, &a); err != nil {
				tb.Fatal(err)
			}
			if a.Status == schemas.StatusFinal {
				k := fmt.Sprintf("%s/%s/%d", a.CustomerID, a.Meter, a.PeriodStart)
				o.finals[k] = append(o.finals[k], &a)
			}
		case names.AdjustmentsTopic():
			var a schemas.Adjustment
			if err := schemas.DecodeInto(r.Value, &a); err != nil {
				tb.Fatal(err)
			}
			o.adjs = append(o.adjs, &a)
		}
	}
}

// TestMonthEndLocalCrashBetweenChunks: customers × 2 meters close at
// once in one partition at the end of February 2028 (29 days), chunks of
// 1,000. The partition is lost after 5 chunks with the 6th uncommitted,
// restored from its changelog and goes on: every aggregate has exactly
// one FINAL revision with its value, none carries more than a chunk,
// the event at 1 March 00:00 exactly is March's, the one that arrived at
// end + grace exactly is in February's FINAL, the one a millisecond later
// is an adjustment booked into March; a watermark four months later
// decides March and expires February's state in chunks.
func TestMonthEndLocalCrashBetweenChunks(t *testing.T) {
	customers := 20_000
	if testing.Short() {
		customers = 3_000
	}
	const chunk = 1_000
	m := newMonthEndLocal(t, customers, chunk)
	l := m.open(nil)
	m.fill(l)
	l.TakeOutput()
	out := &monthEndOutput{finals: map[string][]*schemas.Aggregate{}}
	add := func(recs []*kgo.Record) { out.add(t, m.names, recs) }
	m.pass(l, m.end+m.cfg.Grace.Milliseconds()+1)
	add(l.TakeOutput())
	first := m.work(l, true, add, func(n int) bool { return n == 5 })
	if _, err := l.Work(); err != nil { // the 6th chunk, lost uncommitted
		t.Fatal(err)
	}
	changelog := l.Changelog()
	_ = l.Close()
	proc := m.processor()
	l, err := stream.RestoreLocal(proc, 0, m.names.DedupedTopic(), changelog)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	// The restored partition shows February finalizing, due at its
	// end + grace.
	due := float64(m.end+m.cfg.Grace.Milliseconds()) / 1000
	if f, d := testutil.ToFloat64(proc.m.finalizing.WithLabelValues("0")), testutil.ToFloat64(proc.m.finalDue.WithLabelValues("0")); f != 1 || d != due {
		t.Fatalf("restored between chunks: finalizing %v, final due %v; want 1, %v", f, d, due)
	}
	rest := m.work(l, true, add, nil)
	// Done: nothing finalizing; March (the event at its start) is due next.
	marchDue := float64(time.Date(2028, 4, 1, 0, 0, 0, 0, time.UTC).UnixMilli()+m.cfg.Grace.Milliseconds()) / 1000
	if f, d := testutil.ToFloat64(proc.m.finalizing.WithLabelValues("0")), testutil.ToFloat64(proc.m.finalDue.WithLabelValues("0")); f != 0 || d != marchDue {
		t.Fatalf("after the chunks: finalizing %v, final due %v; want 0, %v", f, d, marchDue)
	}
	if first.maxFinals > chunk || rest.maxFinals > chunk {
		t.Fatalf("a transaction carried %d FINAL revisions, chunk %d", max(first.maxFinals, rest.maxFinals), chunk)
	}
	want := 2*customers + 2 // and edge-leap, edge-grace (edge-late has none: it is queued, then an adjustment)
	checkMonthEndFinals(t, m, out, want)
	// Four months later: March (the event at its start, the line the
	// adjustment was booked into) is decided, February expires.
	m.pass(l, time.Date(2028, 7, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
	m.work(l, true, add, nil)
	march := time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	for _, c := range []string{edgeAtEnd, edgeLate} {
		if f := out.finals[fmt.Sprintf("%s/api/%d", c, march)]; len(f) != 1 {
			t.Errorf("%s: %d FINAL revisions in March, want 1", c, len(f))
		}
	}
	live := map[string]bool{}
	for _, r := range l.Changelog() {
		live[string(r.Key)] = r.Value != nil
	}
	for k, ok := range live {
		if ok && len(k) >= 9 && k[0] != pfxSource && int64(uint64FromKey(k)) == m.start {
			t.Fatalf("February's state key %q is live after its expiry", k)
		}
	}
}

func uint64FromKey(k string) uint64 {
	var v uint64
	for i := 1; i < 9; i++ {
		v = v<<8 | uint64(k[i])
	}
	return v
}

// checkMonthEndFinals checks February's FINAL revisions and the
// adjustment of out.
func checkMonthEndFinals(t *testing.T, m *monthEndLocal, out *monthEndOutput, want int) {
	t.Helper()
	feb := 0
	for k, f := range out.finals {
		if f[0].PeriodStart != m.start {
			continue
		}
		feb++
		if len(f) != 1 {
			t.Fatalf("%s: %d FINAL revisions", k, len(f))
		}
	}
	if feb != want {
		t.Fatalf("%d FINAL revisions in February, want %d", feb, want)
	}
	for i := range m.customers {
		c := fmt.Sprintf("cust-%06d", i)
		api, peak := out.finals[fmt.Sprintf("%s/api/%d", c, m.start)], out.finals[fmt.Sprintf("%s/peak/%d", c, m.start)]
		if api[0].Value != int64(i%100+1) || peak[0].Value != int64(i%7+1) {
			t.Fatalf("%s: FINAL api %d peak %d", c, api[0].Value, peak[0].Value)
		}
	}
	if f := out.finals[fmt.Sprintf("%s/api/%d", edgeAtEnd, m.start)]; f != nil {
		t.Fatalf("the event at 1 March 00:00 is in February's FINAL: %+v", f[0])
	}
	if f := out.finals[fmt.Sprintf("%s/api/%d", edgeLeapDay, m.start)]; f[0].Value != 5 {
		t.Fatalf("29 February's event: FINAL %+v", f[0])
	}
	if f := out.finals[fmt.Sprintf("%s/api/%d", edgeAtGrace, m.start)]; f[0].Value != 11 {
		t.Fatalf("the event that arrived at end + grace: FINAL %+v", f[0])
	}
	if f := out.finals[fmt.Sprintf("%s/api/%d", edgeLate, m.start)]; f != nil && f[0].Value != 0 {
		t.Fatalf("the event that arrived after end + grace is in February's FINAL: %+v", f[0])
	}
	march := time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	if len(out.adjs) != 1 || out.adjs[0].CustomerID != edgeLate || out.adjs[0].Delta != 13 ||
		out.adjs[0].OriginalPeriodStart != m.start || out.adjs[0].BookedPeriodStart != march {
		t.Fatalf("adjustments %+v, want edge-late's +13 from February booked into March", out.adjs)
	}
}

func recordBytes(recs []*kgo.Record) int {
	n := 0
	for _, r := range recs {
		n += len(r.Key) + len(r.Value)
	}
	return n
}

// BenchmarkMonthEndClose is the close of February 2028 in one partition
// of 100,000 customers × 2 meters (METERLINE_SCALE_CUSTOMERS), with the
// product's chunks: an op is the watermark past end + grace and every
// chunk of FINAL revisions after it, until the partition has no work
// (the month's input, before, is not timed). It reports the
// transactions, the most FINAL revisions one carried, the most bytes one
// wrote (the first op's, which keeps its records), the peak heap in use
// while the chunks of the other ops ran, and the time and the process's
// CPU time per aggregate (steadier on a shared machine).
func BenchmarkMonthEndClose(b *testing.B) {
	customers := 100_000
	if v := os.Getenv(EnvScaleCustomers); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("%s=%q", EnvScaleCustomers, v)
		}
		customers = n
	}
	var st, kept txnStats
	var cpu time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		m := newMonthEndLocal(b, customers, DefaultFinalChunk)
		l, err := stream.NewLocal(m.processor(), 0, m.names.DedupedTopic())
		if err != nil {
			b.Fatal(err)
		}
		keep := i == 0
		if keep {
			l.Keep()
		}
		m.fill(l)
		l.TakeOutput()
		runtime.GC()
		b.StartTimer()
		c0 := processCPU(b)
		m.pass(l, m.end+m.cfg.Grace.Milliseconds()+1)
		s := m.work(l, keep, func([]*kgo.Record) {}, nil)
		cpu += processCPU(b) - c0
		b.StopTimer()
		if keep {
			kept = s
		} else {
			st.peakHeap = max(st.peakHeap, s.peakHeap)
		}
		st.txns, st.maxFinals = s.txns, max(st.maxFinals, s.maxFinals)
		if s.finals != 2*customers+2 {
			b.Fatalf("%d FINAL revisions, want %d", s.finals, 2*customers+2)
		}
		_ = l.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(st.txns), "txns")
	b.ReportMetric(float64(st.maxFinals), "max-finals/txn")
	b.ReportMetric(float64(kept.maxBytes)/(1<<20), "max-MiB/txn")
	b.ReportMetric(float64(st.peakHeap)/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*(2*customers+2)), "ns/aggregate")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*(2*customers+2)), "cpu-ns/aggregate")
}

// TestMonthEndLocalWatermarkJumpsMonths: a partition whose watermark
// stayed in January 2028 (a source idle for weeks) while events went on
// arriving: January's OPEN aggregates, January events that arrived in
// February (late by their arrival: queued), February's OPEN aggregates
// for some customers only. One watermark then jumps to June, past both
// periods' expiry: January and February are decided in its transaction,
// their FINAL revisions and the queued adjustments go out in chunks of 3,
// then their state expires; every aggregate and every line has exactly
// one FINAL revision, each queued event one adjustment booked into
// February, and no state of either period is left.
func TestMonthEndLocalWatermarkJumpsMonths(t *testing.T) {
	const customers, chunk = 20, 3
	m := newMonthEndLocal(t, customers, chunk)
	jan := time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	feb, mar := m.start, m.end
	l := m.open(nil)
	defer func() { _ = l.Close() }()
	day := 24 * time.Hour.Milliseconds()
	recs := []*kgo.Record{m.watermark(jan + 10*day)}
	for i := range customers {
		c := fmt.Sprintf("c%02d", i)
		recs = append(recs, m.event(c+"-jan", c, "api", 1, jan+5*day, jan+5*day),
			m.event(c+"-late", c, "api", 2, jan+20*day, feb+10*day))
		if i%2 == 0 {
			recs = append(recs, m.event(c+"-feb", c, "api", 4, feb+9*day, feb+10*day))
		}
	}
	if err := l.Process(recs); err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(); err != nil {
		t.Fatal(err)
	}
	l.TakeOutput()
	out := &monthEndOutput{finals: map[string][]*schemas.Aggregate{}}
	add := func(recs []*kgo.Record) { out.add(t, m.names, recs) }
	m.pass(l, time.Date(2028, 6, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
	add(l.TakeOutput())
	st := m.work(l, true, add, nil)
	if st.maxFinals > chunk {
		t.Fatalf("a transaction carried %d FINAL revisions, chunk %d", st.maxFinals, chunk)
	}
	for i := range customers {
		c := fmt.Sprintf("c%02d", i)
		for _, p := range []struct {
			start, value int64
		}{{jan, 1}, {feb, 4 * int64(1-i%2)}} {
			f := out.finals[fmt.Sprintf("%s/api/%d", c, p.start)]
			if len(f) != 1 || f[0].Value != p.value {
				t.Errorf("%s, period %s: FINAL revisions %v, want one of value %d", c, msTime(p.start), f, p.value)
			}
		}
	}
	if len(out.adjs) != customers {
		t.Fatalf("%d adjustments, want %d", len(out.adjs), customers)
	}
	for _, a := range out.adjs {
		if a.OriginalPeriodStart != jan || a.BookedPeriodStart != feb || a.Delta != 2 {
			t.Fatalf("adjustment %+v", a)
		}
	}
	live := map[string]bool{}
	for _, r := range l.Changelog() {
		live[string(r.Key)] = r.Value != nil
	}
	for k, ok := range live {
		if ok && len(k) >= 9 && k[0] != pfxSource {
			if s := int64(uint64FromKey(k)); s == jan || s == feb {
				t.Errorf("state key %q of %s is live after its expiry", k, msTime(s))
			}
		}
	}
	_ = mar
}

// TestMonthEndLocalRestoreAtEveryChunk: February 2028 closes in chunks of
// 7 (SUM and MAX aggregates, and late events queued behind their FINAL
// revisions, MAX ones among them), then expires, with the partition
// restored from its changelog after every committed chunk and, every
// other time, a chunk aborted before that: the FINAL revisions and the
// adjustments are those of a run without a crash, each once.
func TestMonthEndLocalRestoreAtEveryChunk(t *testing.T) {
	const customers, chunk = 60, 7
	run := func(crash bool) []string {
		m := newMonthEndLocal(t, customers, chunk)
		l := m.open(nil)
		m.fill(l)
		grace := m.cfg.Grace.Milliseconds()
		var late []*kgo.Record
		for i := 0; i < customers; i += 3 {
			c := fmt.Sprintf("cust-%06d", i)
			late = append(late, m.event(c+"-late-a", c, "api", 3, m.end-10, m.end+grace+1+int64(i)),
				m.event(c+"-late-p", c, "peak", int64(i%11), m.end-10, m.end+grace+1+int64(i)))
		}
		if err := l.Process(late); err != nil {
			t.Fatal(err)
		}
		if err := l.Commit(); err != nil {
			t.Fatal(err)
		}
		l.TakeOutput()
		var got []string
		collect := func(recs []*kgo.Record) {
			for _, r := range recs {
				var a schemas.Aggregate
				if r.Topic == m.names.AggregatesTopic() && schemas.DecodeInto(r.Value, &a) == nil && a.Status == schemas.StatusFinal {
					got = append(got, fmt.Sprintf("final %s/%s/%d r%d = %d", a.CustomerID, a.Meter, a.PeriodStart, a.Revision, a.Value))
				}
				var d schemas.Adjustment
				if r.Topic == m.names.AdjustmentsTopic() && schemas.DecodeInto(r.Value, &d) == nil {
					got = append(got, fmt.Sprintf("adj %s %+d into %d", d.EventID, d.Delta, d.BookedPeriodStart))
				}
			}
		}
		for _, wm := range []int64{m.end + grace + time.Hour.Milliseconds(), time.Date(2028, 7, 1, 0, 0, 0, 0, time.UTC).UnixMilli()} {
			m.pass(l, wm)
			collect(l.TakeOutput())
			for i := 0; l.HasWork(); i++ {
				if crash && i%2 == 1 {
					if _, err := l.Work(); err != nil {
						t.Fatal(err)
					}
					l.Abort()
				}
				if _, err := l.Work(); err != nil {
					t.Fatal(err)
				}
				if err := l.Commit(); err != nil {
					t.Fatal(err)
				}
				collect(l.TakeOutput())
				if crash {
					cl := l.Changelog()
					_ = l.Close()
					l = m.open(cl)
				}
			}
		}
		_ = l.Close()
		slices.Sort(got)
		return got
	}
	want, got := run(false), run(true)
	t.Logf("%d outputs", len(want))
	if !slices.Equal(got, want) {
		t.Fatal(diffLines("restored at every chunk", want, got))
	}
	for i := 1; i < len(want); i++ {
		if want[i] == want[i-1] {
			t.Fatalf("twice: %s", want[i])
		}
	}
}
