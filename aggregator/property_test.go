package aggregator

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// The property test: random event streams under fixed seeds, with random
// in-process crashes at every crash point, restarts on kept or wiped state,
// and a second instance joining and leaving (rebalances). At the end, with
// every source's watermark past every period's end + grace, the outputs
// must agree with an independent in-memory model of DESIGN §3 written
// below (it calls no aggregator code).
//
// Seeds 1–5 run on kfake, always (go test -short); seeds 101–103 run on
// the real broker (METERLINE_TEST_KAFKA, without -short).

func TestPropertyKFake(t *testing.T) {
	for seed := int64(1); seed <= 5; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			runProperty(t, nil, seed, propKFake)
		})
	}
}

func TestPropertyRealKafka(t *testing.T) {
	brokers := testenv.RealKafka(t)
	for seed := int64(101); seed <= 103; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			runProperty(t, brokers, seed, propReal)
		})
	}
}

// propParams sizes a run.
type propParams struct {
	days       int           // of broker time
	meanStep   time.Duration // mean broker-time advance per step
	partitions int32
	session    time.Duration
}

var (
	propKFake = propParams{days: 5, meanStep: 12 * time.Minute, partitions: 2, session: 6 * time.Second}
	propReal  = propParams{days: 6, meanStep: 15 * time.Minute, partitions: 3, session: 6 * time.Second}
)

// ---- the model's own view of meters, periods and aggregations ----

const (
	pDay    = int64(24 * time.Hour / time.Millisecond)
	pGrace  = int64(time.Hour / time.Millisecond)
	pWindow = 3 * pDay // dedup window W (small, so state expiry runs)
	pSkew   = int64(time.Hour / time.Millisecond)
)

type pMeter struct {
	name    string
	agg     string // SUM, COUNT, MAX, UNIQUE_COUNT, LATEST
	prop    string // UNIQUE_COUNT's property
	groupBy []string
}

// "x" is not declared: it is counted as a SUM without groups.
var pMeters = []pMeter{
	{name: "s", agg: "SUM", groupBy: []string{"region"}},
	{name: "c", agg: "COUNT"},
	{name: "mx", agg: "MAX"},
	{name: "u", agg: "UNIQUE_COUNT", prop: "user", groupBy: []string{"region"}},
	{name: "l", agg: "LATEST"},
	{name: "x", agg: "SUM"},
}

const pMetersYAML = `meters:
  - {name: s, aggregation: SUM, group_by: [region]}
  - {name: c, aggregation: COUNT}
  - {name: mx, aggregation: MAX}
  - {name: u, aggregation: UNIQUE_COUNT, property: user, group_by: [region]}
  - {name: l, aggregation: LATEST}
`

func pMeterOf(name string) pMeter {
	for _, m := range pMeters {
		if m.name == name {
			return m
		}
	}
	panic(name)
}

// pDayStart is the UTC day containing ms (epoch ms > 0; UTC days are
// exactly 86,400,000 ms in epoch time).
func pDayStart(ms int64) int64 { return ms - ms%pDay }

type pEvent struct {
	id, cust, meter string
	qty, et, arr    int64
	props           map[string]string
	part            int32 // usage.deduped partition
	source          int32
	// wmAt is the aggregator partition watermark when the event is
	// processed: the minimum over the sources of the latest watermark sent
	// before it (0 until every source sent one). Every partition gets
	// every watermark record, so it is the same in all partitions.
	wmAt int64
}

type pKey struct {
	cust, meter, group string
	period             int64
}

func (e *pEvent) key() pKey {
	m := pMeterOf(e.meter)
	var g []string
	for _, name := range m.groupBy {
		g = append(g, name+"="+e.props[name])
	}
	return pKey{e.cust, e.meter, strings.Join(g, ","), pDayStart(e.et)}
}

// onTime: arrival at or before the period's end + grace (DESIGN §3: late
// is after end + grace).
//
// The one exception (DESIGN §3): an event processed when its period is
// already final — the watermark passed end + grace — is an adjustment even
// if it arrived on time. That happens only to re-routed events here: they
// carry an arrival from before the latest watermarks.
func (e *pEvent) onTime() bool {
	cutoff := pDayStart(e.et) + pDay + pGrace
	return e.arr <= cutoff && e.wmAt <= cutoff
}

// pAgg aggregates events by the meter's aggregation: the value of a period
// over exactly these events (0 for none).
func pAgg(m pMeter, evs []*pEvent) int64 {
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
			if e.qty > v {
				v = e.qty
			}
		}
	case "UNIQUE_COUNT":
		seen := map[string]bool{}
		for _, e := range evs {
			seen[e.props[m.prop]] = true
		}
		v = int64(len(seen))
	case "LATEST":
		var best *pEvent
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

// ---- the stream ----

type pStep struct {
	ev *pEvent
	wm *schemas.Watermark // sent to every partition
}

type pStream struct {
	steps   []pStep
	events  []*pEvent
	sources int32
	final   int64 // the last watermark, past every period's end + grace
}

func genStream(r *rand.Rand, p propParams) *pStream {
	s := &pStream{sources: int32(1 + r.Intn(3))}
	start := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).UnixMilli() + r.Int63n(6*3600*1000)
	now := start
	wms := make([]int64, s.sources)
	custs := []string{"acme", "globex", "initech"}
	regions := []string{"eu", "us"}
	id := 0
	emitWM := func(src int32, at int64) {
		wms[src] = at
		s.steps = append(s.steps, pStep{wm: &schemas.Watermark{SourcePartition: src, SourcePartitions: s.sources, Watermark: at}})
	}
	minWM := func() int64 {
		m := wms[0]
		for _, w := range wms[1:] {
			m = min(m, w)
		}
		return m
	}
	eventAt := func(et, arr int64) {
		e := &pEvent{cust: custs[r.Intn(len(custs))], meter: pMeters[r.Intn(len(pMeters))].name,
			qty: r.Int63n(101), et: et, arr: arr, props: map[string]string{}, source: int32(r.Intn(int(s.sources))),
			wmAt: minWM()}
		// Random ids, so LATEST's tie-break on equal event times is not
		// just the arrival order.
		e.id = fmt.Sprintf("e%06d-%04d", r.Intn(1_000_000), id)
		id++
		if r.Intn(10) > 0 {
			e.props["region"] = regions[r.Intn(len(regions))]
		}
		if e.meter == "u" || r.Intn(4) == 0 {
			e.props["user"] = fmt.Sprintf("user-%d", r.Intn(6))
		}
		if r.Intn(3) == 0 && e.et-e.et%(6*3600*1000) > e.arr-pWindow {
			// Coarse event times: equal event times within a period
			// (LATEST's tie-break on event_id, MAX's and first/last's ties).
			e.et -= e.et % (6 * 3600 * 1000)
		}
		e.part = schemas.Partition(schemas.AppendFramed(nil, e.cust, e.meter), p.partitions)
		// Dedup's window: arrival − W < event_time ≤ arrival + S.
		if e.et <= e.arr-pWindow || e.et > e.arr+pSkew {
			panic(fmt.Sprintf("generated event outside the dedup window: et %d arr %d", e.et, e.arr))
		}
		s.events = append(s.events, e)
		s.steps = append(s.steps, pStep{ev: e})
	}
	event := func(et int64) { eventAt(et, now) }
	end := start + int64(p.days)*pDay
	for now < end {
		step := r.Int63n(2 * p.meanStep.Milliseconds())
		// The next cutoff (end + grace of some day) at or after now.
		cut := pDayStart(now-pGrace) + pDay + pGrace
		if cut > now && cut <= now+step && r.Intn(10) < 7 {
			// Broker time lands exactly on the cutoff, or 1 ms after it,
			// and an event of the day before arrives then: on time, or
			// late by 1 ms.
			now = cut + r.Int63n(2)
			prevStart := cut - pGrace - pDay
			switch r.Intn(3) {
			case 0:
				event(prevStart)
			case 1:
				event(prevStart + pDay - 1)
			default:
				event(prevStart + r.Int63n(pDay))
			}
			continue
		}
		now += step
		if r.Intn(100) < 65 {
			switch k := r.Intn(100); {
			case k < 50: // recent
				event(now - r.Int63n(2*3600*1000))
			case k < 60: // exactly at the start of this or the previous day
				et := pDayStart(now) - int64(r.Intn(2))*pDay
				if et <= now-pWindow {
					et = pDayStart(now)
				}
				event(et)
			case k < 75: // far older than its arrival: often late
				event(now - pGrace - r.Int63n(pWindow-pGrace-1))
			case k < 80: // in the future, up to the skew
				event(now + r.Int63n(pSkew+1))
			case k < 83: // the oldest the window allows
				event(now - pWindow + 1)
			case k < 87:
				// Re-routed by dedup: it keeps its original arrival, up to
				// 3h ago, possibly before watermarks already sent.
				arr := now - r.Int63n(3*3600*1000)
				if cut := pDayStart(minWM()-pGrace) + pGrace; k < 85 && cut < minWM() && cut > pDay {
					// Targeted: it arrived on time (up to 1h before the
					// cutoff, possibly exactly at it) for the day before
					// the latest cutoff the watermark passed, so that day
					// is already final when it is processed (a broker clock
					// that stepped back, or a slow re-route).
					arr = cut - r.Int63n(pGrace)
					eventAt(cut-pGrace-1-r.Int63n(pDay/2), arr)
					break
				}
				eventAt(arr-r.Int63n(2*3600*1000), arr)
			default:
				event(now - 2*3600*1000 - r.Int63n(pDay))
			}
			continue
		}
		// A watermark from one source: non-decreasing, never past the
		// broker time (dedup's watermark is an arrival time it saw).
		src := int32(r.Intn(int(s.sources)))
		at := max(wms[src], start) // dedup saw nothing before the stream
		switch k := r.Intn(10); {
		case k < 3:
			at = now
		case k < 4:
			// Exactly a cutoff, if one lies in (wm, now]: not yet final.
			if cut := pDayStart(now-pGrace) + pGrace; cut > wms[src] && cut <= now {
				at = cut
			}
		default:
			if now > at {
				at += r.Int63n(now - at + 1)
			}
		}
		if at > wms[src] {
			emitWM(src, at)
		}
	}
	// The last watermarks: past every period's end + grace.
	final := now
	for _, e := range s.events {
		if c := pDayStart(e.et) + pDay + pGrace + 1; c > final {
			final = c
		}
	}
	for src := int32(0); src < s.sources; src++ {
		emitWM(src, final)
	}
	s.final = final
	return s
}

// ---- running it, with crashes and rebalances ----

var propPoints = []string{fault.BeforeCommit, fault.AfterCommit, fault.DuringApply, fault.AfterApply,
	fault.FinalDecided, fault.BetweenChunks, fault.DuringRestore}

// propChunk is the FINAL chunk of the property runs: a period's ten or so
// aggregates per partition go out over several transactions, and events
// of the period arrive between them.
const propChunk = 2

type propInst struct {
	id  string
	fs  vfs.FS
	run *aggRunning
}

type propRun struct {
	t       *testing.T
	h       *aggHarness
	p       propParams
	r       *rand.Rand
	cat     *Catalog
	insts   map[string]*propInst
	crashes map[string]int // point → crashes seen
	starts  int
}

func (pr *propRun) config(id string, fs vfs.FS) Config {
	cfg := pr.h.config(id, fs)
	cfg.Period, cfg.Grace, cfg.Window, cfg.Meters = Day, time.Hour, time.Duration(pWindow)*time.Millisecond, pr.cat
	cfg.FinalChunk = propChunk
	cfg.Stream.SessionTimeout = pr.p.session
	lvl := zap.InfoLevel
	if os.Getenv("PROPERTY_DEBUG") != "" {
		lvl = zap.DebugLevel
	}
	cfg.Stream.Logger = zaptest.NewLogger(pr.t, zaptest.Level(lvl)).Named(fmt.Sprintf("%s#%d", id, pr.starts))
	return cfg
}

func (pr *propRun) start(id string, fresh bool) {
	in := pr.insts[id]
	if in == nil {
		in = &propInst{id: id}
		pr.insts[id] = in
		fresh = true
	}
	if fresh {
		in.fs = vfs.NewMem()
	}
	pr.starts++
	in.run = pr.h.start(pr.config(id, in.fs))
}

func (pr *propRun) stop(id string) {
	in := pr.insts[id]
	err := in.run.stop()
	if errors.Is(err, stream.ErrCrashed) {
		// It crashed while stopping (committing its last transaction):
		// restart it, which aborts that transaction at once (the same
		// transactional ID), and stop it again.
		pr.crashes[crashPoint(err)]++
		_ = fault.Arm("")
		pr.t.Logf("instance %s crashed at %s while stopping; restarting it to stop it again", id, crashPoint(err))
		pr.start(id, pr.r.Intn(3) == 0)
		err = in.run.stop()
	}
	if err != nil {
		pr.t.Fatalf("stopping %s: %v", id, err)
	}
	in.run = nil
}

// reap restarts every instance that crashed; it fails on any other stop.
func (pr *propRun) reap() {
	for _, id := range []string{"a", "b"} {
		in := pr.insts[id]
		if in == nil || in.run == nil {
			continue
		}
		select {
		case <-in.run.done:
		default:
			continue
		}
		err := in.run.err
		if !errors.Is(err, stream.ErrCrashed) {
			pr.t.Fatalf("instance %s stopped: %v", id, err)
		}
		point := crashPoint(err)
		pr.crashes[point]++
		_ = fault.Arm("")
		// Keep the state (a restart) or lose it (a new machine).
		fresh := pr.r.Intn(3) == 0
		pr.t.Logf("instance %s crashed at %s; restarting on %s state", id, point, map[bool]string{true: "wiped", false: "kept"}[fresh])
		pr.start(id, fresh)
	}
}

// crashPoint is the point named by a simulated crash's error.
func crashPoint(err error) string {
	return err.Error()[strings.LastIndex(err.Error(), " at ")+4:]
}

// settle waits until the group caught up, restarting crashed instances.
func (pr *propRun) settle() {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pr.reap()
		ok, err := testenv.CaughtUp(pr.h.brokers, pr.h.group, pr.h.names.DedupedTopic())
		if err == nil && ok {
			pr.reap()
			return
		}
		if time.Now().After(deadline) {
			pr.t.Fatalf("not caught up after 2 minutes (last error %v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func runProperty(t *testing.T, brokers []string, seed int64, p propParams) {
	fault.SetHandler(fault.CrashHandler)
	t.Cleanup(func() { fault.SetHandler(nil); _ = fault.Arm("") })
	r := rand.New(rand.NewSource(seed))
	st := genStream(r, p)
	late, finalOnArrival := 0, 0
	for _, e := range st.events {
		if !e.onTime() {
			late++
			if e.arr <= pDayStart(e.et)+pDay+pGrace {
				finalOnArrival++
			}
		}
	}
	t.Logf("seed %d: %d events (%d late, of which %d arrived on time for a period already final), %d steps, %d sources, %d partitions",
		seed, len(st.events), late, finalOnArrival, len(st.steps), st.sources, p.partitions)

	cat, err := ParseMeters([]byte(pMetersYAML))
	if err != nil {
		t.Fatal(err)
	}
	pr := &propRun{t: t, h: newAggHarnessSources(t, brokers, p.partitions, st.sources), p: p, r: r, cat: cat,
		insts: map[string]*propInst{}, crashes: map[string]int{}}
	pr.start("a", true)

	// Every crash point is armed once per run, in a random order, each at
	// a random hit; a point that has not fired stays armed over later
	// chunks.
	plan := append([]string{}, propPoints...)
	r.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	armed := ""
	armedHits := 0
	for i := 0; i < len(st.steps); {
		// Arm the next point once the previous one fired.
		if armed != "" && pr.crashes[armed] > armedHits {
			armed = ""
		}
		if armed == "" && len(plan) > 0 && i > 0 {
			armed, plan = plan[0], plan[1:]
			armedHits = pr.crashes[armed]
			spec := fmt.Sprintf("%s@%d", armed, 1+r.Intn(3))
			if armed == fault.DuringRestore {
				// Only a restore hits it: restart a on wiped state.
				pr.stop("a")
				spec = armed + "@1"
				if err := fault.Arm(spec); err != nil {
					t.Fatal(err)
				}
				pr.start("a", true)
			} else if err := fault.Arm(spec); err != nil {
				t.Fatal(err)
			}
			t.Logf("armed %s at step %d", spec, i)
		}
		// A rebalance now and then: b joins, or leaves, while the chunk
		// below is being processed or before it is produced. A rebalance
		// aborts the open transaction of an instance that keeps some of
		// its partitions (cooperative-sticky).
		rebalance, midChunk := r.Intn(6) == 0, r.Intn(2) == 0
		toggleB := func() {
			if b := pr.insts["b"]; b == nil || b.run == nil {
				pr.start("b", r.Intn(2) == 0)
				t.Logf("b joined at step %d", i)
			} else {
				pr.stop("b")
				t.Logf("b left at step %d", i)
			}
		}
		if rebalance && !midChunk {
			toggleB()
		}
		n := 10 + r.Intn(30)
		if i+n > len(st.steps) {
			n = len(st.steps) - i
		}
		var recs []*kgo.Record
		for _, s := range st.steps[i : i+n] {
			if s.ev != nil {
				recs = append(recs, pr.h.dedupedEvent(s.ev.part, s.ev.dedupedEvent()))
			} else {
				for part := int32(0); part < p.partitions; part++ {
					recs = append(recs, pr.h.watermark(part, s.wm.SourcePartition, s.wm.SourcePartitions, s.wm.Watermark))
				}
			}
		}
		pr.h.produce(recs...)
		if (rebalance && midChunk) || i+n == len(st.steps) {
			toggleB() // the last chunk always
		}
		i += n
		t0 := time.Now()
		pr.settle()
		if os.Getenv("PROPERTY_TIMING") != "" {
			t.Logf("chunk of %d steps settled in %s", n, time.Since(t0))
		}
	}
	_ = fault.Arm("")
	pr.settle()
	awaitOutputs(t, pr.h, st)
	t.Logf("crashes: %v (instance starts %d)", pr.crashes, pr.starts)
	checkModel(t, pr.h, st)
}

// awaitOutputs waits until usage.aggregates holds as many FINAL revisions
// as the model has keys with an on-time event, and usage.adjustments as
// many adjustments as it has late events (or two minutes pass): the input
// is consumed by then, but FINALs and the adjustments queued behind them
// go out in chunks, without input. checkModel then says what differs.
func awaitOutputs(t *testing.T, h *aggHarness, st *pStream) {
	t.Helper()
	keys := map[pKey]bool{}
	late := 0
	for _, e := range st.events {
		if e.onTime() {
			keys[e.key()] = true
		} else {
			late++
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		finals := 0
		for _, a := range readAggregates(t, h) {
			if a.Status == schemas.StatusFinal {
				finals++
			}
		}
		adjs := len(testenv.ReadAll(t, h.brokers, h.names.AdjustmentsTopic()))
		if finals >= len(keys) && adjs >= late {
			return
		}
		if time.Now().After(deadline) {
			t.Logf("after 2 minutes: %d FINAL revisions of %d keys, %d adjustments of %d late events", finals, len(keys), adjs, late)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *pEvent) dedupedEvent() *schemas.DedupedEvent {
	return &schemas.DedupedEvent{EventID: e.id, CustomerID: e.cust, Meter: e.meter, Quantity: e.qty, EventTime: e.et,
		IngestTime: e.arr, Properties: schemas.Properties(e.props), SourcePartition: e.source, Source: "prop"}
}

// ---- the check ----

func checkModel(t *testing.T, h *aggHarness, st *pStream) {
	// The model: events per key, in arrival order (= production order,
	// which is the processing order within a partition).
	onTime := map[pKey][]*pEvent{}
	all := map[pKey][]*pEvent{}
	byID := map[string]*pEvent{}
	for _, e := range st.events {
		k := e.key()
		all[k] = append(all[k], e)
		if e.onTime() {
			onTime[k] = append(onTime[k], e)
		}
		byID[e.id] = e
	}
	// The delta of each late event: the change it makes to the period's
	// value over the on-time events and the late events before it.
	wantDelta := map[string]int64{}
	for k, evs := range all {
		m := pMeterOf(k.meter)
		var seen []*pEvent
		seen = append(seen, onTime[k]...)
		for _, e := range evs {
			if e.onTime() {
				continue
			}
			before := pAgg(m, seen)
			seen = append(seen, e)
			wantDelta[e.id] = pAgg(m, seen) - before
		}
	}

	var errs []string
	fail := func(format string, args ...any) {
		if len(errs) < 40 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	// Aggregates.
	revs := map[pKey][]*schemas.Aggregate{}
	for _, a := range readAggregates(t, h) {
		k := pKey{a.CustomerID, a.Meter, groupString(a.Group), a.PeriodStart}
		revs[k] = append(revs[k], a)
	}
	finals := map[pKey]*schemas.Aggregate{}
	for k, rs := range revs {
		ot := onTime[k]
		if len(ot) == 0 {
			fail("%v: %d aggregate revisions, but no event of it arrived on time", k, len(rs))
			continue
		}
		m := pMeterOf(k.meter)
		prevCount := int64(0)
		for i, a := range rs {
			if a.Revision != int64(i+1) {
				fail("%v: revision %d at position %d (want %d)", k, a.Revision, i, i+1)
			}
			if a.PeriodEnd != k.period+pDay || a.Aggregation != m.agg {
				fail("%v: period end %d aggregation %s", k, a.PeriodEnd, a.Aggregation)
			}
			if a.Status == schemas.StatusFinal {
				if i != len(rs)-1 {
					fail("%v: revision %d follows the FINAL (revision %d)", k, rs[len(rs)-1].Revision, a.Revision)
				}
				if finals[k] != nil {
					fail("%v: a second FINAL", k)
				}
				finals[k] = a
				continue
			}
			// An OPEN revision is the period over the first event_count
			// on-time events.
			c := a.EventCount
			if c <= prevCount || c > int64(len(ot)) {
				fail("%v: OPEN revision %d has event_count %d (previous %d, on-time events %d)", k, a.Revision, c, prevCount, len(ot))
				continue
			}
			prevCount = c
			if want := pAgg(m, ot[:c]); a.Value != want {
				fail("%v: OPEN revision %d (count %d) value %d, want %d", k, a.Revision, c, a.Value, want)
			}
		}
	}
	for k, ot := range onTime {
		m := pMeterOf(k.meter)
		f := finals[k]
		if f == nil {
			fail("%v: no FINAL (%d revisions, %d on-time events)", k, len(revs[k]), len(ot))
			continue
		}
		first, last := ot[0].et, ot[0].et
		for _, e := range ot {
			first, last = min(first, e.et), max(last, e.et)
		}
		if want := pAgg(m, ot); f.Value != want || f.EventCount != int64(len(ot)) {
			fail("%v: FINAL value %d count %d, want value %d count %d", k, f.Value, f.EventCount, want, len(ot))
		}
		if f.FirstEventTime != first || f.LastEventTime != last {
			fail("%v: FINAL first/last event time %d/%d, want %d/%d", k, f.FirstEventTime, f.LastEventTime, first, last)
		}
		if f.UpdatedAt <= k.period+pDay+pGrace {
			fail("%v: FINAL updated_at %d is not past end + grace %d", k, f.UpdatedAt, k.period+pDay+pGrace)
		}
	}

	// Adjustments: one per late event, booked into the period of its
	// arrival, with the model's delta.
	adjSum := map[pKey]int64{}
	gotAdj := map[string]int{}
	nAdj := 0
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.AdjustmentsTopic()) {
		var a schemas.Adjustment
		if err := schemas.DecodeInto(r.Value, &a); err != nil {
			t.Fatal(err)
		}
		nAdj++
		gotAdj[a.EventID]++
		e := byID[a.EventID]
		if e == nil {
			fail("adjustment for unknown event %s", a.EventID)
			continue
		}
		k := e.key()
		if e.onTime() {
			fail("%s (%v, arrival %d ≤ end + grace %d) was booked as an adjustment", e.id, k, e.arr, k.period+pDay+pGrace)
		}
		got := pKey{a.CustomerID, a.Meter, groupString(a.Group), a.OriginalPeriodStart}
		if got != k || a.OriginalPeriodEnd != k.period+pDay {
			fail("%s: adjustment for %v (end %d), want %v", e.id, got, a.OriginalPeriodEnd, k)
		}
		if b := pDayStart(e.arr); a.BookedPeriodStart != b || a.BookedPeriodEnd != b+pDay {
			fail("%s: booked [%d, %d), want the period of its arrival [%d, %d)", e.id, a.BookedPeriodStart, a.BookedPeriodEnd, b, b+pDay)
		}
		if a.Delta != wantDelta[e.id] {
			fail("%s (%v): delta %d, want %d", e.id, k, a.Delta, wantDelta[e.id])
		}
		if a.Quantity != e.qty || a.EventTime != e.et || a.IngestTime != e.arr || a.Aggregation != pMeterOf(e.meter).agg {
			fail("%s: adjustment fields %+v do not match the event", e.id, a)
		}
		adjSum[k] += a.Delta
	}
	for _, e := range st.events {
		if !e.onTime() && gotAdj[e.id] != 1 {
			fail("late event %s (%v): %d adjustments, want 1", e.id, e.key(), gotAdj[e.id])
		}
	}
	// The invoice identity: FINAL + Σ deltas = the period over all events.
	for k, evs := range all {
		final := int64(0)
		if f := finals[k]; f != nil {
			final = f.Value
		}
		if want := pAgg(pMeterOf(k.meter), evs); final+adjSum[k] != want {
			fail("%v: FINAL %d + adjustments %d = %d, want %d over all %d events", k, final, adjSum[k], final+adjSum[k], want, len(evs))
		}
	}
	if rej := testenv.ReadAll(t, h.brokers, h.names.RejectedTopic()); len(rej) > 0 {
		fail("%d records rejected", len(rej))
	}
	if len(errs) > 0 {
		sort.Strings(errs)
		t.Fatalf("the outputs disagree with the model of DESIGN §3:\n  %s", strings.Join(errs, "\n  "))
	}
	t.Logf("model agrees: %d keys, %d FINAL, %d adjustments", len(all), len(finals), nAdj)
}
