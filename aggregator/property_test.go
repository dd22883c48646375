package aggregator

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/testenv/oracle"
	"github.com/meterline/meterline/schemas"
)

// The property test: random event streams under fixed seeds, with random
// in-process crashes at every crash point, restarts on kept or wiped state,
// and a second instance joining and leaving (rebalances). At the end, with
// every source's watermark past every period's end + grace, the outputs
// must agree with the independent model of docs/design.md, Time, in
// internal/testenv/oracle (it calls no aggregator code), which the
// real-binary suite internal/aggcrashtest checks against too.
//
// Seeds 1–5 run on kfake, always (go test -short); seeds 101–103 run on
// the real broker (METERLINE_TEST_KAFKA, without -short).
// METERLINE_PROPERTY_SEEDS=n adds n seeds to each: from 1000 on kfake,
// from 5000 on the real broker.

func TestPropertyKFake(t *testing.T) {
	seeds := []int64{1, 2, 3, 4, 5}
	// METERLINE_PROPERTY_SEEDS=n adds n seeds from 1000.
	for i := range int64(testenv.PropertySeeds()) {
		seeds = append(seeds, 1000+i)
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			runProperty(t, nil, seed, propKFake)
		})
	}
}

func TestPropertyRealKafka(t *testing.T) {
	brokers := testenv.RealKafka(t)
	seeds := []int64{101, 102, 103}
	// METERLINE_PROPERTY_SEEDS=n adds n seeds from 5000.
	for i := range int64(testenv.PropertySeeds()) {
		seeds = append(seeds, 5000+i)
	}
	for _, seed := range seeds {
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

// ---- the model: internal/testenv/oracle, with this test's meters ----

const (
	pDay    = int64(24 * time.Hour / time.Millisecond)
	pGrace  = int64(time.Hour / time.Millisecond)
	pWindow = 3 * pDay // dedup window W (small, so state expiry runs)
	pSkew   = int64(time.Hour / time.Millisecond)
)

// pMeters are the declared meters; pMeterNames the meters events use: "x"
// is not declared, and is counted as a SUM without groups.
var (
	pMeters = oracle.Meters{
		{Name: "s", Aggregation: "SUM", GroupBy: []string{"region"}},
		{Name: "c", Aggregation: "COUNT"},
		{Name: "mx", Aggregation: "MAX"},
		{Name: "u", Aggregation: "UNIQUE_COUNT", Property: "user", GroupBy: []string{"region"}},
		{Name: "l", Aggregation: "LATEST"},
	}
	pMeterNames = []string{"s", "c", "mx", "u", "l", "x"}
	pModel      = &oracle.Model{Meters: pMeters, Period: oracle.Day, Grace: pGrace}
)

// pDayStart is the UTC day containing ms.
func pDayStart(ms int64) int64 { s, _ := oracle.Day(ms); return s }

// pEvent is an event of the model and where the test sends it. Its
// Watermark is the aggregator partition watermark when the event is
// processed: the minimum over the sources of the latest watermark sent
// before it (0 until every source sent one). Every partition gets every
// watermark record, so it is the same in all partitions. The one event that
// it makes late although it arrived on time (docs/design.md, Time) is a
// re-routed one here: it carries an arrival from before the latest
// watermarks.
type pEvent struct {
	oracle.Event
	part   int32 // usage.deduped partition
	source int32
	seq    int64 // its offset in its source (DedupedEvent.SourceOffset)
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
		e := &pEvent{Event: oracle.Event{Customer: custs[r.Intn(len(custs))], Meter: pMeterNames[r.Intn(len(pMeterNames))],
			Quantity: r.Int63n(101), EventTime: et, Arrival: arr, Properties: map[string]string{}, Watermark: minWM()},
			source: int32(r.Intn(int(s.sources)))}
		// Random ids, so LATEST's tie-break on equal event times is not
		// just the arrival order.
		e.ID = fmt.Sprintf("e%06d-%04d", r.Intn(1_000_000), id)
		e.seq = int64(id)
		id++
		if r.Intn(10) > 0 {
			e.Properties["region"] = regions[r.Intn(len(regions))]
		}
		if e.Meter == "u" || r.Intn(4) == 0 {
			e.Properties["user"] = fmt.Sprintf("user-%d", r.Intn(6))
		}
		if r.Intn(3) == 0 && e.EventTime-e.EventTime%(6*3600*1000) > e.Arrival-pWindow {
			// Coarse event times: equal event times within a period
			// (LATEST's tie-break on event_id, MAX's and first/last's ties).
			e.EventTime -= e.EventTime % (6 * 3600 * 1000)
		}
		e.part = schemas.Partition(schemas.CustomerKey(e.Customer), p.partitions)
		// Dedup's window: arrival − W < event_time ≤ arrival + S.
		if e.EventTime <= e.Arrival-pWindow || e.EventTime > e.Arrival+pSkew {
			panic(fmt.Sprintf("generated event outside the dedup window: et %d arr %d", e.EventTime, e.Arrival))
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
	// The last watermarks: past every period's end + grace, those late
	// events are booked into (the period of their arrival) included.
	final := now
	for _, e := range s.events {
		for _, t := range []int64{e.EventTime, e.Arrival} {
			if c := pDayStart(t) + pDay + pGrace + 1; c > final {
				final = c
			}
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
	// started is closed once the running instance initialised its
	// transactional ID (it logs "stage started"): an open transaction of
	// an earlier run of the instance is aborted by then.
	started chan struct{}
}

type propRun struct {
	ent     bool         // Config.Entitlements, with the test's ticks
	order   string       // Config.EntitlementsOrder
	clock   *brokerClock // nil: wall time (entGen.misplaced: the run's broker times)
	t       *testing.T
	h       *aggHarness
	p       propParams
	r       *rand.Rand
	cat     *Catalog
	insts   map[string]*propInst
	crashes map[string]int // point → crashes seen
	starts  int
}

func (pr *propRun) config(id string, fs vfs.FS, started func()) Config {
	cfg := pr.h.config(id, fs)
	cfg.Period, cfg.Grace, cfg.Window, cfg.Meters = Day, time.Hour, time.Duration(pWindow)*time.Millisecond, pr.cat
	cfg.FinalChunk = propChunk
	if pr.ent {
		cfg.Entitlements, cfg.EntitlementsTick, cfg.EntitlementsOrder = true, -1, pr.order
	}
	if pr.clock != nil {
		cfg.Stream.Clock = pr.clock
	}
	cfg.Stream.SessionTimeout = pr.p.session
	lvl := zap.InfoLevel
	if os.Getenv("PROPERTY_DEBUG") != "" {
		lvl = zap.DebugLevel
	}
	hook := zap.Hooks(func(e zapcore.Entry) error {
		if e.Message == "stage started" {
			started()
		}
		return nil
	})
	cfg.Stream.Logger = zaptest.NewLogger(pr.t, zaptest.Level(lvl), zaptest.WrapOptions(hook)).Named(fmt.Sprintf("%s#%d", id, pr.starts))
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
	started := make(chan struct{})
	var once sync.Once
	in.started = started
	in.run = pr.h.start(pr.config(id, in.fs, func() { once.Do(func() { close(started) }) }))
}

func (pr *propRun) stop(id string) {
	in := pr.insts[id]
	err := in.run.stop()
	if errors.Is(err, stream.ErrCrashed) {
		// It crashed while stopping (committing its last transaction):
		// restart it, which aborts that transaction at once (the same
		// transactional ID), and stop it again once it has (stopped
		// before, the transaction would hold every read_committed read
		// of its partitions until the transaction timeout, 10s).
		pr.crashes[crashPoint(err)]++
		_ = fault.Arm("")
		pr.t.Logf("instance %s crashed at %s while stopping; restarting it to stop it again", id, crashPoint(err))
		pr.start(id, pr.r.Intn(3) == 0)
		select {
		case <-in.started:
		case <-in.run.done:
		case <-time.After(time.Minute):
			pr.t.Fatalf("instance %s restarted to abort its transaction did not start within a minute", id)
		}
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

// dumpIfStuck logs, if the returned stop is not called within d, which
// instances are still running and every goroutine's stack: the run loops
// (stream.(*Runtime).runSession), kgo's group and producer goroutines and
// what each waits on, which is what a run whose outputs stay incomplete
// after its input was consumed needs to tell a blocked instance from an
// idle one. stop waits for a dump under way, so that nothing logs after
// the test.
func (pr *propRun) dumpIfStuck(d time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-done:
			return
		case <-tm.C:
		}
		for _, id := range []string{"a", "b"} {
			state := "stopped"
			if in := pr.insts[id]; in != nil && in.run != nil {
				state = "running"
				select {
				case <-in.run.done:
					state = fmt.Sprintf("ended (%v)", in.run.err)
				default:
				}
			}
			pr.t.Logf("after %s outputs still incomplete: instance %s %s", d, id, state)
		}
		buf := make([]byte, 8<<20)
		pr.t.Logf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	}()
	return func() {
		close(done)
		wg.Wait()
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
		if pr.ent && err == nil && ok {
			ok, err = testenv.CaughtUp(pr.h.brokers, pr.h.group, pr.h.names.EntitlementsTopic())
		}
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
	runPropertyWith(t, brokers, seed, p, nil)
}

// runPropertyWith is runProperty, with entitlements (ent not nil): the
// aggregator decides them, the test writes random plans, grants and rate
// cards to usage.entitlements and appends its ticks (entProp, with the
// generators ent switches on), and the outputs are checked with
// oracle.VerifyEntitlements, whose decisions are the entitlements
// package's reference model's.
func runPropertyWith(t *testing.T, brokers []string, seed int64, p propParams, ent *entGen) {
	fault.SetHandler(fault.CrashHandler)
	t.Cleanup(func() { fault.SetHandler(nil); _ = fault.Arm("") })
	r := rand.New(rand.NewSource(seed))
	st := genStream(r, p)
	if ent != nil && ent.lagged {
		st.bySource()
	}
	late, finalOnArrival := 0, 0
	for _, e := range st.events {
		if !pModel.OnTime(&e.Event) {
			late++
			if e.Arrival <= pModel.Cutoff(&e.Event) {
				finalOnArrival++
			}
		}
	}
	t.Logf("seed %d: %d events (%d late, of which %d arrived on time for a period already final), %d steps, %d sources, %d partitions",
		seed, len(st.events), late, finalOnArrival, len(st.steps), st.sources, p.partitions)

	cat, err := ParseMeters([]byte(pMeters.YAML()))
	if err != nil {
		t.Fatal(err)
	}
	pr := &propRun{t: t, p: p, r: r, cat: cat, insts: map[string]*propInst{}, crashes: map[string]int{}}
	var ep *entProp
	var chunks []int // with entitlements, drawn ahead: entGen.behind writes every chunk's records first
	if ent != nil {
		if brokers == nil {
			_, brokers = testenv.KFake(t)
		}
		names := testenv.Topics(t, brokers, "", testenv.TopicsOpts{Partitions: p.partitions, Sources: st.sources, EventsTimestamp: "CreateTime"})
		pr.h = &aggHarness{t: t, brokers: brokers, names: names, group: names.Prefix + "aggregate", createTime: true}
		pr.ent = true
		if ent.arrival {
			pr.order = EntitlementsOrderArrival
		}
		ep = newEntProp(rand.New(rand.NewSource(seed)), pr.h, p.partitions, st, *ent)
		if ent.misplaced {
			// The copies of misplaced records are stamped with the
			// aggregator's clock: it reads the run's broker times. Only
			// then: it dates the state's checkpoints too, and with a
			// run's days of broker time going by in seconds every
			// restore after a while would be a full one (the restore
			// horizon), which the other seeds keep testing the other way.
			pr.clock = ep.clock
		}
		// An instance that crashed at a point armed in the last chunk may
		// end after the last settle saw the group caught up: restarted
		// while the outputs are awaited.
		nudge := ep.ent.Nudge
		ep.ent.Nudge = func() { pr.reap(); nudge() }
		for i := 0; i < len(st.steps); {
			n := min(10+r.Intn(30), len(st.steps)-i)
			chunks = append(chunks, n)
			i += n
		}
		if ent.behind {
			for i, c := 0, 0; i < len(st.steps); c++ {
				ep.before(st.steps[i : i+chunks[c]])
				ep.after()
				i += chunks[c]
			}
		}
	} else {
		pr.h = newAggHarnessSources(t, brokers, p.partitions, st.sources)
	}
	pr.start("a", true)
	if ent != nil && ent.behind {
		pr.settle() // every record of usage.entitlements read before any event
	}

	// Every crash point is armed once per run, in a random order, each at
	// a random hit; a point that has not fired stays armed over later
	// chunks.
	plan := append([]string{}, propPoints...)
	if ent != nil {
		plan = append(plan, fault.ChargeDecided)
	}
	r.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	armed := ""
	armedHits := 0
	for i, chunk := 0, 0; i < len(st.steps); chunk++ {
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
		var n int
		if chunks != nil {
			n = chunks[chunk]
		} else {
			n = min(10+r.Intn(30), len(st.steps)-i)
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
		if ep != nil && !ent.behind {
			ep.before(st.steps[i : i+n])
		}
		pr.h.produce(recs...)
		if ep != nil && !ent.behind {
			ep.after()
		}
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
	t.Logf("crashes: %v (instance starts %d)", pr.crashes, pr.starts)
	defer pr.dumpIfStuck(oracle.AwaitTimeout - 15*time.Second)()
	events := make([]*oracle.Event, len(st.events))
	for i, e := range st.events {
		events[i] = &e.Event
	}
	if ent != nil && ent.arrival {
		var moved int
		events, moved = st.arrivalOrder()
		t.Logf("arrival order: %d of %d events decided elsewhere than in input order", moved, len(events))
	}
	if ep != nil {
		t.Logf("entitlements (%s): %d records, %d behind their partition's latest broker time, %d on another partition than their customer's",
			ent, len(ep.ent.Records), ep.steppedBack, ep.misplaced)
		rep := oracle.VerifyEntitlements(t, pr.h.brokers, pr.h.names, pModel, &ep.ent, events)
		if ent.outcomes != nil {
			// Read once VerifyEntitlements saw every outcome: before it,
			// the events its nudging ticks let through were not decided
			// yet, and read as accepted.
			*ent.outcomes = rejectedOutcomes(t, pr.h)
		}
		if len(rep.Rejected) == 0 {
			t.Fatalf("seed %d rejected nothing: the plans must exercise caps and credits", seed)
		}
		return
	}
	oracle.Verify(t, pr.h.brokers, pr.h.names, pModel, events)
}

func (e *pEvent) dedupedEvent() *schemas.DedupedEvent {
	return &schemas.DedupedEvent{EventID: e.ID, CustomerID: e.Customer, Meter: e.Meter, Quantity: e.Quantity, EventTime: e.EventTime,
		IngestTime: e.Arrival, Properties: schemas.Properties(e.Properties), SourcePartition: e.source, SourceOffset: e.seq, Source: "prop"}
}
