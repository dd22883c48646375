package aggcrashtest

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// Timings of every child: short, so takeovers and aborts of dead
// instances' transactions happen within seconds.
const (
	partitions         = 4
	sessionTimeout     = 3 * time.Second
	transactionTimeout = 5 * time.Second
	rebalanceTimeout   = 10 * time.Second
	commitInterval     = 50 * time.Millisecond

	caughtUpTimeout = 2 * time.Minute
	exitTimeout     = 60 * time.Second
)

// Billing parameters of the aggregator children (except the idle test):
// day periods, 1h grace.
const (
	dayMs   = int64(24 * time.Hour / time.Millisecond)
	hourMs  = int64(time.Hour / time.Millisecond)
	graceMs = hourMs
)

const metersYAML = `meters:
  - {name: s, aggregation: SUM, group_by: [region]}
  - {name: c, aggregation: COUNT}
  - {name: mx, aggregation: MAX}
  - {name: u, aggregation: UNIQUE_COUNT, property: user}
  - {name: l, aggregation: LATEST}
`

// meterAgg is the aggregation of each meter of metersYAML, and its
// group-by and UNIQUE_COUNT property, as the model sees them.
var meterAgg = map[string]struct {
	agg, prop string
	groupBy   []string
}{
	"s":  {agg: "SUM", groupBy: []string{"region"}},
	"c":  {agg: "COUNT"},
	"mx": {agg: "MAX"},
	"u":  {agg: "UNIQUE_COUNT", prop: "user"},
	"l":  {agg: "LATEST"},
}

// suite is one test's world: its own topics (prefix), group, state dirs,
// children, and the model of everything produced.
type suite struct {
	t       *testing.T
	bin     string // the meterline binary
	brokers []string
	names   topics.Names
	group   string
	dir     string
	logs    string // the children's logs, kept if the test fails
	meters  string // meters file
	cl      *kgo.Client

	mu      sync.Mutex
	procs   []*testenv.Process
	starts  map[string]int
	events  []*mEvent // acknowledged, in production order
	wmSteps int
}

// newSuite creates the topics (topics.Specs, unique prefix) and a
// producer, and registers the cleanup: topics and groups deleted. (The
// children that spawn runs are killed when the test ends; their logs are
// kept in s.logs if the test failed.)
func newSuite(t *testing.T) *suite {
	t.Helper()
	brokers := testenv.RealKafka(t)
	bin := testenv.Meterline(t)
	prefix := testenv.Name(t, "agg") + "."
	s := &suite{t: t, bin: bin, brokers: brokers, names: topics.DefaultNames(), group: prefix + "aggregate", dir: t.TempDir(),
		logs: testenv.LogDir(t, "meterline-aggcrashtest-logs-"), starts: map[string]int{}}
	s.names.Prefix = prefix
	s.meters = filepath.Join(s.dir, "meters.yaml")
	if err := os.WriteFile(s.meters, []byte(metersYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	layout := topics.DefaultLayout() // usage.events: LogAppendTime
	layout.Partitions = partitions
	specs := topics.Specs(s.names, layout)
	adm := testenv.Admin(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := topics.Create(ctx, adm, specs, -1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var ns []string
		for _, sp := range specs {
			ns = append(ns, sp.Name)
		}
		_, _ = adm.DeleteGroups(ctx, s.group, prefix+"dedup")
		_, _ = adm.DeleteTopics(ctx, ns...)
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	s.cl = cl
	t.Cleanup(cl.Close)
	return s
}

// ---- the input: events and watermarks straight into usage.deduped ----

// mEvent is one event as the model knows it.
type mEvent struct {
	id, cust, meter string
	qty, et, arr    int64
	props           map[string]string
}

func (e *mEvent) record(topic string) *kgo.Record {
	key := schemas.AppendFramed(nil, e.cust, e.meter)
	return &kgo.Record{Topic: topic, Partition: schemas.Partition(key, partitions), Key: key,
		Value: schemas.MustEncode(&schemas.DedupedEvent{EventID: e.id, CustomerID: e.cust, Meter: e.meter, Quantity: e.qty,
			EventTime: e.et, IngestTime: e.arr, Properties: schemas.Properties(e.props), Source: "aggcrashtest"})}
}

// step is an event, or a watermark from one dedup source partition (sent
// to every usage.deduped partition, as dedup does).
type step struct {
	ev *mEvent
	wm *schemas.Watermark
}

// stream is a generated input: batches of steps, then the final
// watermarks, past every period's end + grace.
type stream struct {
	batches [][]step
	final   []step
}

// genStream generates a deterministic stream over days of broker time:
// events mostly recent, some exactly at a day's start, some days older
// than their arrival (late), some up to an hour in the future; watermarks
// from sources dedup source partitions (usage.events' partition count: the
// aggregator ignores watermark records that claim another), each
// non-decreasing and never past the broker time (so no event arrives before
// a watermark that passed it).
func genStream(seed int64, days, customers, batch int, sources int32) *stream {
	r := rand.New(rand.NewSource(seed))
	start := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC).UnixMilli() + seed*hourMs
	now := start
	wms := make([]int64, sources)
	var steps []step
	var evs []*mEvent
	meters := []string{"s", "c", "mx", "u", "l"}
	for n := 0; now < start+int64(days)*dayMs; n++ {
		now += r.Int63n(20 * 60 * 1000)
		if r.Intn(100) < 75 {
			e := &mEvent{id: fmt.Sprintf("ev-%d-%05d", seed, n), cust: fmt.Sprintf("cust-%02d", r.Intn(customers)),
				meter: meters[r.Intn(len(meters))], qty: r.Int63n(100), arr: now, props: map[string]string{}}
			switch k := r.Intn(100); {
			case k < 65:
				e.et = now - r.Int63n(2*hourMs)
			case k < 75:
				e.et = now - now%dayMs
			case k < 90:
				e.et = now - graceMs - r.Int63n(2*dayMs)
			default:
				e.et = now + r.Int63n(hourMs+1)
			}
			if r.Intn(3) == 0 {
				e.et -= e.et % (6 * hourMs) // equal event times: LATEST's tie-break
			}
			e.props["region"] = []string{"eu", "us"}[r.Intn(2)]
			e.props["user"] = fmt.Sprintf("user-%d", r.Intn(5))
			evs = append(evs, e)
			steps = append(steps, step{ev: e})
			continue
		}
		src := int32(r.Intn(int(sources)))
		at := wms[src] + r.Int63n(now-wms[src]+1)
		if r.Intn(3) == 0 {
			at = now
		}
		if at > wms[src] {
			wms[src] = at
			steps = append(steps, step{wm: &schemas.Watermark{SourcePartition: src, SourcePartitions: sources, Watermark: at}})
		}
	}
	st := &stream{}
	for i := 0; i < len(steps); i += batch {
		st.batches = append(st.batches, steps[i:min(i+batch, len(steps))])
	}
	final := now
	for _, e := range evs {
		if c := e.et - e.et%dayMs + dayMs + graceMs + 1; c > final {
			final = c
		}
	}
	for src := int32(0); src < sources; src++ {
		st.final = append(st.final, step{wm: &schemas.Watermark{SourcePartition: src, SourcePartitions: sources, Watermark: final}})
	}
	return st
}

// send produces the steps, in order, and records the events in the model
// once acknowledged.
func (s *suite) send(steps []step) {
	s.t.Helper()
	if err := s.trySend(steps); err != nil {
		s.t.Fatal(err)
	}
}

// trySend is send for other goroutines than the test's.
func (s *suite) trySend(steps []step) error {
	var recs []*kgo.Record
	var evs []*mEvent
	for _, st := range steps {
		if st.ev != nil {
			recs = append(recs, st.ev.record(s.names.DedupedTopic()))
			evs = append(evs, st.ev)
			continue
		}
		v := schemas.MustEncode(st.wm)
		for p := int32(0); p < partitions; p++ {
			recs = append(recs, &kgo.Record{Topic: s.names.DedupedTopic(), Partition: p, Value: v})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	s.mu.Lock()
	s.events = append(s.events, evs...)
	s.wmSteps += len(steps) - len(evs)
	s.mu.Unlock()
	return nil
}

// ---- children ----

// spawn runs a meterline stage (args) as instance id; faultSpec arms a
// fault point ("" none). It is killed when the test ends, and its log tail
// printed if the test failed.
func (s *suite) spawn(id string, faultSpec string, args []string) *testenv.Process {
	s.t.Helper()
	s.mu.Lock()
	s.starts[id]++
	run := s.starts[id]
	s.mu.Unlock()
	// The late events' lines are many and say little.
	p := testenv.StartProcessOpts(s.t, testenv.ProcessOpts{Fault: faultSpec, MayDie: true, TailSkip: `"msg":"late event booked as an adjustment"`, ExitTimeout: exitTimeout},
		fmt.Sprintf("%s#%d", id, run), filepath.Join(s.logs, fmt.Sprintf("%s-%d.log", id, run)), s.bin, args...)
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return p
}

// aggOpts are per-run options of `meterline aggregate`.
type aggOpts struct {
	fault  string   // METERLINE_FAULT
	period string   // default day
	grace  string   // default 1h
	extra  []string // more flags
}

// startAgg runs `meterline aggregate` as instance id with its Pebble state
// under stateDir.
func (s *suite) startAgg(id, stateDir string, o aggOpts) *testenv.Process {
	s.t.Helper()
	if o.period == "" {
		o.period = "day"
	}
	if o.grace == "" {
		o.grace = "1h"
	}
	args := []string{"aggregate",
		"--brokers", strings.Join(s.brokers, ","),
		"--topic-prefix", s.names.Prefix,
		"--group", s.group,
		"--instance-id", id,
		"--state-dir", stateDir,
		"--metrics-addr", "127.0.0.1:0",
		"--commit-interval", commitInterval.String(),
		"--session-timeout", sessionTimeout.String(),
		"--transaction-timeout", transactionTimeout.String(),
		"--rebalance-timeout", rebalanceTimeout.String(),
		"--period", o.period,
		"--grace", o.grace,
		"--meters", s.meters,
		"--log-level", "info",
	}
	return s.spawn(id, o.fault, append(args, o.extra...))
}

// waitCaughtUp waits until the aggregator group is caught up on
// usage.deduped, failing at once if one of the live children exits.
func (s *suite) waitCaughtUp(live ...*testenv.Process) {
	s.t.Helper()
	s.waitGroupCaughtUp(s.group, s.names.DedupedTopic(), live...)
}

func (s *suite) waitGroupCaughtUp(group, topic string, live ...*testenv.Process) {
	s.t.Helper()
	start := time.Now()
	var lastErr error
	for {
		for _, p := range live {
			if p.Exited() {
				s.t.Fatalf("%s exited (%s) while waiting for %s to catch up\n%s", p.Name(), p.ExitString(), group, p.Tail(30))
			}
		}
		ok, err := testenv.CaughtUp(s.brokers, group, topic)
		if err == nil && ok {
			s.t.Logf("%s caught up on %s after %s", group, topic, time.Since(start).Round(time.Millisecond))
			return
		}
		lastErr = err
		if time.Since(start) > caughtUpTimeout {
			s.t.Fatalf("group %s not caught up on %s after %s (last error: %v)", group, topic, caughtUpTimeout, lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ---- the model and the check ----

type mKey struct {
	cust, meter, group string
	period             int64
}

func (e *mEvent) key(periodOf func(int64) (int64, int64)) mKey {
	m := meterAgg[e.meter]
	var g []string
	for _, name := range m.groupBy {
		g = append(g, name+"="+e.props[name])
	}
	start, _ := periodOf(e.et)
	return mKey{e.cust, e.meter, strings.Join(g, ","), start}
}

// dayPeriod is the UTC day of ms.
func dayPeriod(ms int64) (int64, int64) { s := ms - ms%dayMs; return s, s + dayMs }

// hourPeriod is the UTC hour of ms.
func hourPeriod(ms int64) (int64, int64) { s := ms - ms%hourMs; return s, s + hourMs }

// aggOf is the value of a period over exactly these events (DESIGN §3, §5).
func aggOf(meter string, evs []*mEvent) int64 {
	m := meterAgg[meter]
	var v int64
	switch m.agg {
	case "SUM":
		for _, e := range evs {
			v += e.qty
		}
	case "COUNT":
		v = int64(len(evs))
	case "MAX":
		for _, e := range evs {
			v = max(v, e.qty)
		}
	case "UNIQUE_COUNT":
		seen := map[string]bool{}
		for _, e := range evs {
			seen[e.props[m.prop]] = true
		}
		v = int64(len(seen))
	case "LATEST":
		var best *mEvent
		for _, e := range evs {
			if best == nil || e.et > best.et || (e.et == best.et && e.id > best.id) {
				best = e
			}
		}
		if best != nil {
			v = best.qty
		}
	}
	return v
}

// awaitOutputs waits until usage.aggregates holds as many FINAL revisions
// as the model has keys with an on-time event, and usage.adjustments as
// many adjustments as it has late events (or caughtUpTimeout passes): the
// input is consumed by then, but FINAL revisions, and the adjustments
// queued behind them, go out in chunks without input (DESIGN §6 invariant
// 9). check then says what differs.
func (s *suite) awaitOutputs(events []*mEvent, periodOf func(int64) (int64, int64), grace int64) {
	s.t.Helper()
	keys := map[mKey]bool{}
	late := 0
	for _, e := range events {
		if _, end := periodOf(e.et); e.arr <= end+grace {
			keys[e.key(periodOf)] = true
		} else {
			late++
		}
	}
	deadline := time.Now().Add(caughtUpTimeout)
	for {
		finals := 0
		for _, r := range testenv.ReadAll(s.t, s.brokers, s.names.AggregatesTopic()) {
			var a schemas.Aggregate
			if schemas.DecodeInto(r.Value, &a) == nil && a.Status == schemas.StatusFinal {
				finals++
			}
		}
		adjs := len(testenv.ReadAll(s.t, s.brokers, s.names.AdjustmentsTopic()))
		if (finals >= len(keys) && adjs >= late) || time.Now().After(deadline) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkResult is what check saw.
type checkResult struct {
	keys, finals, adjustments, openRevisions int
}

// check compares usage.aggregates and usage.adjustments with the model of
// every event sent so far: for every key with an on-time event exactly one
// FINAL, last, with the value over its on-time events; revisions 1, 2, …;
// every OPEN revision the value over a prefix of its on-time events; one
// adjustment per late event, booked into the period of its arrival, with
// the model's delta; FINAL + Σ deltas = the value over all events; nothing
// rejected.
func (s *suite) check(periodOf func(int64) (int64, int64), grace int64) checkResult {
	s.t.Helper()
	s.mu.Lock()
	events := append([]*mEvent(nil), s.events...)
	s.mu.Unlock()
	s.awaitOutputs(events, periodOf, grace)
	onTime := map[mKey][]*mEvent{}
	all := map[mKey][]*mEvent{}
	byID := map[string]*mEvent{}
	isOnTime := func(e *mEvent) bool { _, end := periodOf(e.et); return e.arr <= end+grace }
	for _, e := range events {
		k := e.key(periodOf)
		all[k] = append(all[k], e)
		if isOnTime(e) {
			onTime[k] = append(onTime[k], e)
		}
		byID[e.id] = e
	}
	wantDelta := map[string]int64{}
	for k, evs := range all {
		seen := append([]*mEvent(nil), onTime[k]...)
		for _, e := range evs {
			if isOnTime(e) {
				continue
			}
			before := aggOf(k.meter, seen)
			seen = append(seen, e)
			wantDelta[e.id] = aggOf(k.meter, seen) - before
		}
	}
	var errs []string
	fail := func(format string, args ...any) {
		if len(errs) < 30 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	res := checkResult{keys: len(all)}

	revs := map[mKey][]*schemas.Aggregate{}
	for _, r := range testenv.ReadAll(s.t, s.brokers, s.names.AggregatesTopic()) {
		var a schemas.Aggregate
		if err := schemas.DecodeInto(r.Value, &a); err != nil {
			s.t.Fatal(err)
		}
		var g []string
		for _, p := range a.Group {
			g = append(g, p.Name+"="+p.Value)
		}
		k := mKey{a.CustomerID, a.Meter, strings.Join(g, ","), a.PeriodStart}
		revs[k] = append(revs[k], &a)
	}
	finals := map[mKey]*schemas.Aggregate{}
	for k, rs := range revs {
		ot := onTime[k]
		if len(ot) == 0 {
			fail("%v: %d revisions, but none of its events arrived on time", k, len(rs))
			continue
		}
		prev := int64(0)
		for i, a := range rs {
			if a.Revision != int64(i+1) {
				fail("%v: revision %d at position %d", k, a.Revision, i)
			}
			if a.Status == schemas.StatusFinal {
				if finals[k] != nil {
					fail("%v: FINAL emitted twice (revisions %d and %d)", k, finals[k].Revision, a.Revision)
				}
				if i != len(rs)-1 {
					fail("%v: revision %d follows the FINAL", k, rs[len(rs)-1].Revision)
				}
				finals[k] = a
				continue
			}
			res.openRevisions++
			if a.EventCount <= prev || a.EventCount > int64(len(ot)) {
				fail("%v: OPEN revision %d event_count %d (previous %d, on-time events %d)", k, a.Revision, a.EventCount, prev, len(ot))
				continue
			}
			prev = a.EventCount
			if want := aggOf(k.meter, ot[:a.EventCount]); a.Value != want {
				fail("%v: OPEN revision %d value %d, want %d", k, a.Revision, a.Value, want)
			}
		}
	}
	for k, ot := range onTime {
		f := finals[k]
		if f == nil {
			fail("%v: no FINAL (%d revisions)", k, len(revs[k]))
			continue
		}
		if want := aggOf(k.meter, ot); f.Value != want || f.EventCount != int64(len(ot)) {
			fail("%v: FINAL value %d count %d, want %d count %d", k, f.Value, f.EventCount, want, len(ot))
		}
	}
	res.finals = len(finals)

	adjSum := map[mKey]int64{}
	got := map[string]int{}
	for _, r := range testenv.ReadAll(s.t, s.brokers, s.names.AdjustmentsTopic()) {
		var a schemas.Adjustment
		if err := schemas.DecodeInto(r.Value, &a); err != nil {
			s.t.Fatal(err)
		}
		res.adjustments++
		got[a.EventID]++
		e := byID[a.EventID]
		if e == nil {
			fail("adjustment for an event never sent: %s", a.EventID)
			continue
		}
		k := e.key(periodOf)
		if isOnTime(e) {
			fail("%s (%v) arrived on time but was booked as an adjustment", e.id, k)
		}
		if b, _ := periodOf(e.arr); a.BookedPeriodStart != b || a.OriginalPeriodStart != k.period {
			fail("%s: original %d booked %d, want original %d booked %d", e.id, a.OriginalPeriodStart, a.BookedPeriodStart, k.period, b)
		}
		if a.Delta != wantDelta[e.id] {
			fail("%s (%v): delta %d, want %d", e.id, k, a.Delta, wantDelta[e.id])
		}
		adjSum[k] += a.Delta
	}
	for _, e := range events {
		if !isOnTime(e) && got[e.id] != 1 {
			fail("late event %s: %d adjustments, want 1", e.id, got[e.id])
		}
	}
	for k, evs := range all {
		var final int64
		if f := finals[k]; f != nil {
			final = f.Value
		}
		if want := aggOf(k.meter, evs); final+adjSum[k] != want {
			fail("%v: FINAL %d + adjustments %d ≠ %d over all its events", k, final, adjSum[k], want)
		}
	}
	if rej := testenv.ReadAll(s.t, s.brokers, s.names.RejectedTopic()); len(rej) > 0 {
		fail("%d records in usage.rejected", len(rej))
	}
	if len(errs) > 0 {
		sort.Strings(errs)
		s.t.Fatalf("aggregates disagree with the model (%d events):\n  %s", len(events), strings.Join(errs, "\n  "))
	}
	s.t.Logf("exact: %d events, %d keys, %d FINAL (one each), %d OPEN revisions, %d adjustments",
		len(events), res.keys, res.finals, res.openRevisions, res.adjustments)
	return res
}
