package aggcrashtest

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/testenv/crash"
	"github.com/meterline/meterline/internal/testenv/oracle"
	"github.com/meterline/meterline/schemas"
)

// The suite's timings (crash.Suite), named as the tests use them.
const (
	partitions     = crash.Partitions
	commitInterval = crash.CommitInterval
	exitTimeout    = crash.ExitTimeout
)

// Billing parameters of the aggregator children (except the idle test):
// day periods, 1h grace.
const (
	dayMs   = int64(24 * time.Hour / time.Millisecond)
	hourMs  = int64(time.Hour / time.Millisecond)
	graceMs = hourMs
)

// meters are the meters of every aggregator child (--meters), as the
// model sees them.
var meters = oracle.Meters{
	{Name: "s", Aggregation: "SUM", GroupBy: []string{"region"}},
	{Name: "c", Aggregation: "COUNT"},
	{Name: "mx", Aggregation: "MAX"},
	{Name: "u", Aggregation: "UNIQUE_COUNT", Property: "user"},
	{Name: "l", Aggregation: "LATEST"},
}

// suite is one test's world (crash.Suite: topics under its own prefix,
// groups, state dirs, children), a client producing to usage.deduped, and
// the model's record of every event produced.
type suite struct {
	*crash.Suite
	t      *testing.T
	group  string // the aggregator's
	meters string // meters file
	cl     *kgo.Client

	mu      sync.Mutex
	events  []*oracle.Event  // acknowledged, in production order
	offsets map[string]int64 // each acknowledged event's offset in usage.deduped, by ID
	wmSteps int
}

// newSuite makes the test's crash.Suite, the meters file and a client.
func newSuite(t *testing.T) *suite {
	t.Helper()
	return newSuiteWith(t, testenv.TopicsOpts{})
}

// newSuiteWith is newSuite with the topics shaped by o (crash.NewWith).
func newSuiteWith(t *testing.T, o testenv.TopicsOpts) *suite {
	t.Helper()
	cs := crash.NewWith(t, "agg", o)
	s := &suite{Suite: cs, t: t, group: cs.Group("aggregate"), meters: filepath.Join(cs.Dir, "meters.yaml")}
	if err := os.WriteFile(s.meters, []byte(meters.YAML()), 0o644); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(cs.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	s.cl = cl
	t.Cleanup(cl.Close)
	return s
}

// ---- the input: events and watermarks straight into usage.deduped ----

// record is e as dedup would have written it to usage.deduped.
func record(topic string, e *oracle.Event) *kgo.Record {
	key := schemas.CustomerKey(e.Customer)
	return &kgo.Record{Topic: topic, Partition: schemas.Partition(key, partitions), Key: key,
		Value: schemas.MustEncode(&schemas.DedupedEvent{EventID: e.ID, CustomerID: e.Customer, Meter: e.Meter, Quantity: e.Quantity,
			EventTime: e.EventTime, IngestTime: e.Arrival, Properties: schemas.Properties(e.Properties), Source: "aggcrashtest"})}
}

// step is an event, or a watermark from one dedup source partition (sent
// to every usage.deduped partition, as dedup does).
type step struct {
	ev *oracle.Event
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
	var evs []*oracle.Event
	meters := []string{"s", "c", "mx", "u", "l"}
	for n := 0; now < start+int64(days)*dayMs; n++ {
		now += r.Int63n(20 * 60 * 1000)
		if r.Intn(100) < 75 {
			e := &oracle.Event{ID: fmt.Sprintf("ev-%d-%05d", seed, n), Customer: fmt.Sprintf("cust-%02d", r.Intn(customers)),
				Meter: meters[r.Intn(len(meters))], Quantity: r.Int63n(100), Arrival: now, Properties: map[string]string{}}
			switch k := r.Intn(100); {
			case k < 65:
				e.EventTime = now - r.Int63n(2*hourMs)
			case k < 75:
				e.EventTime = now - now%dayMs
			case k < 90:
				e.EventTime = now - graceMs - r.Int63n(2*dayMs)
			default:
				e.EventTime = now + r.Int63n(hourMs+1)
			}
			if r.Intn(3) == 0 {
				e.EventTime -= e.EventTime % (6 * hourMs) // equal event times: LATEST's tie-break
			}
			e.Properties["region"] = []string{"eu", "us"}[r.Intn(2)]
			e.Properties["user"] = fmt.Sprintf("user-%d", r.Intn(5))
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
	// Past every period's end + grace, those late events are booked into
	// (the period of their arrival) included.
	final := now
	for _, e := range evs {
		for _, t := range []int64{e.EventTime, e.Arrival} {
			if c := t - t%dayMs + dayMs + graceMs + 1; c > final {
				final = c
			}
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
	var evs []*oracle.Event
	ofRec := map[*kgo.Record]*oracle.Event{}
	for _, st := range steps {
		if st.ev != nil {
			r := record(s.Names.DedupedTopic(), st.ev)
			recs = append(recs, r)
			evs = append(evs, st.ev)
			ofRec[r] = st.ev
			continue
		}
		v := schemas.MustEncode(st.wm)
		for p := int32(0); p < partitions; p++ {
			recs = append(recs, &kgo.Record{Topic: s.Names.DedupedTopic(), Partition: p, Value: v})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := s.cl.ProduceSync(ctx, recs...)
	if err := res.FirstErr(); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	s.mu.Lock()
	if s.offsets == nil {
		s.offsets = map[string]int64{}
	}
	for _, r := range res {
		if e := ofRec[r.Record]; e != nil {
			s.offsets[e.ID] = r.Record.Offset
		}
	}
	s.events = append(s.events, evs...)
	s.wmSteps += len(steps) - len(evs)
	s.mu.Unlock()
	return nil
}

// ---- children ----

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
	args := append([]string{"--period", o.period, "--grace", o.grace, "--meters", s.meters}, o.extra...)
	return s.Stage("aggregate", id, stateDir, crash.StageOpts{Fault: o.fault, Args: args})
}

// waitCaughtUp waits until the aggregator group is caught up on
// usage.deduped, failing at once if one of the live children exits.
func (s *suite) waitCaughtUp(live ...*testenv.Process) {
	s.t.Helper()
	s.WaitCaughtUp(s.group, s.Names.DedupedTopic(), live...)
}

// ---- the check ----

// check waits for the outputs of every event sent so far and checks them
// against the bill (oracle.Verify) of periods periodOf with grace (ms).
func (s *suite) check(periodOf oracle.Period, grace int64) oracle.Report {
	s.t.Helper()
	s.mu.Lock()
	events := append([]*oracle.Event(nil), s.events...)
	s.mu.Unlock()
	return oracle.Verify(s.t, s.Brokers, s.Names, &oracle.Model{Meters: meters, Period: periodOf, Grace: grace}, events)
}

// checkRestores checks that the partitions moved between the instances of
// a rebalance test: at least two restores per partition over every
// instance run.
func (s *suite) checkRestores() {
	s.t.Helper()
	restores := 0
	procs := s.Procs()
	for _, p := range procs {
		_, n := p.Replayed()
		restores += n
	}
	if restores < 2*partitions {
		s.t.Errorf("only %d partition restores over all instances: the partitions did not move as intended", restores)
	}
	s.t.Logf("%d partition restores over %d instance runs", restores, len(procs))
}
