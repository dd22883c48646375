package aggregator

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestMonthEndLocalRandom: random streams of day periods on a local
// partition, in arrival order with watermarks at arrival (which now and
// then jumps days at once, a source idle) and re-routed events with an
// arrival up to 12 hours before it, chunks of 1 to 5 keys and a few
// hundred bytes, the partition aborted mid-chunk and restored from its
// changelog at random between transactions. Every event is in its
// period's FINAL if it arrived by end + grace and the period was not final
// when it was processed, else an adjustment booked
// into the day of its arrival; SUM and MAX values and deltas as the
// design says; one FINAL per aggregate, and one per line an adjustment
// was booked into.
func TestMonthEndLocalRandom(t *testing.T) {
	seeds := 20
	if testing.Short() {
		seeds = 4
	}
	// METERLINE_PROPERTY_SEEDS=n adds n seeds.
	seeds += testenv.PropertySeeds()
	for seed := int64(1); seed <= int64(seeds); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { monthEndRandom(t, seed) })
	}
}

func monthEndRandom(t *testing.T, seed int64) {
	r := rand.New(rand.NewSource(seed))
	m := newMonthEndLocal(t, 0, 1+r.Intn(5))
	m.cfg.Period, m.cfg.Grace = Day, time.Hour
	m.cfg.Window, m.cfg.Bucket, m.cfg.Skew = 3*24*time.Hour, time.Hour, time.Hour
	m.cfg.FinalChunkBytes = 100 + r.Intn(400)
	const hour = int64(time.Hour / time.Millisecond)
	l := m.open(nil)
	defer func() { _ = l.Close() }()
	o := newRandOracle(m.cfg.Period)
	got := &monthEndOutput{finals: map[string][]*schemas.Aggregate{}}
	commit := func() {
		if err := l.Commit(); err != nil {
			t.Fatal(err)
		}
		got.add(t, m.names, l.TakeOutput())
	}
	chunks := func(max int) {
		for i := 0; i < max && l.HasWork(); i++ {
			if r.Intn(4) == 0 {
				if _, err := l.Work(); err != nil {
					t.Fatal(err)
				}
				l.Abort()
			}
			if _, err := l.Work(); err != nil {
				t.Fatal(err)
			}
			commit()
			if r.Intn(5) == 0 {
				cl := l.Changelog()
				_ = l.Close()
				l = m.open(cl)
			}
		}
	}
	now := time.Date(2028, 2, 26, 0, 0, 0, 0, time.UTC).UnixMilli()
	wm := int64(0) // the partition's watermark
	for step := 0; step < 60; step++ {
		var batch []*kgo.Record
		for range 1 + r.Intn(8) {
			now += int64(r.Intn(int(3 * hour)))
			arrival := now
			if r.Intn(6) == 0 {
				// A re-routed event: its original arrival, older than
				// the watermark.
				arrival -= int64(r.Intn(int(12 * hour)))
			}
			c := fmt.Sprintf("c%d", r.Intn(6))
			meter := []string{"api", "peak"}[r.Intn(2)]
			et := arrival - int64(r.Int63n(2*24*hour)) + int64(r.Intn(int(hour/2)))
			q := int64(1 + r.Intn(20))
			id := fmt.Sprintf("e%d", len(o.events))
			batch = append(batch, m.event(id, c, meter, q, et, arrival))
			o.events = append(o.events, randEvent{id, c, meter, q, et, arrival, wm})
		}
		if r.Intn(8) == 0 {
			now += int64(2+r.Intn(6)) * 24 * hour // a source idle for days
		}
		batch = append(batch, m.watermark(now))
		wm = now
		if err := l.Process(batch); err != nil {
			t.Fatal(err)
		}
		commit()
		chunks(r.Intn(4))
	}
	if err := l.Process([]*kgo.Record{m.watermark(now + 30*24*hour)}); err != nil {
		t.Fatal(err)
	}
	commit()
	chunks(1 << 30)
	o.check(t, got, m.cfg.Grace.Milliseconds())
}

type randEvent struct {
	id, customer, meter string
	q, et, arrival      int64
	// wm is the watermark when the event is processed.
	wm int64
}

// onTime: e arrived by end + grace of its period and the period was not
// final when it was processed.
func onTime(e randEvent, end, grace int64) bool { return e.arrival <= end+grace && e.wm <= end+grace }

type randOracle struct {
	period Period
	events []randEvent
}

func newRandOracle(p Period) *randOracle { return &randOracle{period: p} }

// check compares got with the design's rule: an event is in its period's
// FINAL when it arrived by end + grace and the period was not final when
// it was processed (onTime), else an adjustment booked into its arrival's
// period,
// measured against the FINAL and the adjustments before it (in input
// order: arrival order here).
func (o *randOracle) check(t *testing.T, got *monthEndOutput, grace int64) {
	t.Helper()
	type fin struct {
		value int64
		seen  bool
	}
	finals := map[string]*fin{} // customer/meter/period
	lines := map[string]bool{}  // customer/meter/booked period
	var adjs []string
	for _, e := range o.events {
		start, end := o.period.Bounds(e.et)
		k := fmt.Sprintf("%s/%s/%d", e.customer, e.meter, start)
		f := finals[k]
		if onTime(e, end, grace) {
			if f == nil {
				f = &fin{}
				finals[k] = f
			}
			if e.meter == "api" {
				f.value += e.q
			} else if !f.seen || e.q > f.value {
				f.value = e.q
			}
			f.seen = true
		}
	}
	work := map[string]*fin{}
	for k, f := range finals {
		work[k] = &fin{f.value, f.seen}
	}
	for _, e := range o.events {
		start, end := o.period.Bounds(e.et)
		if onTime(e, end, grace) {
			continue
		}
		k := fmt.Sprintf("%s/%s/%d", e.customer, e.meter, start)
		w := work[k]
		if w == nil {
			w = &fin{}
			work[k] = w
		}
		delta := e.q
		if e.meter == "api" {
			w.value += e.q
		} else {
			delta = 0
			if !w.seen || e.q > w.value {
				delta = e.q - w.value
				w.value = e.q
			}
		}
		w.seen = true
		b, _ := o.period.Bounds(e.arrival)
		lines[fmt.Sprintf("%s/%s/%d", e.customer, e.meter, b)] = true
		adjs = append(adjs, fmt.Sprintf("%s %+d from %d into %d", e.id, delta, start, b))
	}
	var gotAdjs []string
	for _, a := range got.adjs {
		gotAdjs = append(gotAdjs, fmt.Sprintf("%s %+d from %d into %d", a.EventID, a.Delta, a.OriginalPeriodStart, a.BookedPeriodStart))
	}
	slices.Sort(adjs)
	slices.Sort(gotAdjs)
	if d := diffLines("adjustments", adjs, gotAdjs); d != "" {
		t.Fatal(d)
	}
	var want, have []string
	for k, f := range finals {
		want = append(want, fmt.Sprintf("%s = %d", k, f.value))
	}
	for k := range lines {
		if finals[k] == nil {
			want = append(want, fmt.Sprintf("%s = 0", k))
		}
	}
	for k, fs := range got.finals {
		for _, f := range fs {
			have = append(have, fmt.Sprintf("%s = %d", k, f.Value))
		}
	}
	slices.Sort(want)
	slices.Sort(have)
	if d := diffLines("FINAL revisions", want, have); d != "" {
		t.Fatal(d)
	}
}
