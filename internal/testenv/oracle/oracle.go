// Package oracle is the reference model of the bill (docs/design.md, Time)
// that the aggregator's tests check its outputs against: per customer,
// meter, group and period, the value of the on-time events (the FINAL
// revision), one adjustment per late event with the change it makes to the
// period's value, and FINAL + Σ deltas equal to the value over every event
// of the period.
//
// It calls no aggregator code: it is written from docs/design.md, Time,
// alone, so that a bug in the aggregator cannot hide by being copied into
// the model. Only tests import it (the in-process property test in
// aggregator and the real-binary crash suite in internal/aggcrashtest).
package oracle

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/meterline/meterline/schemas"
)

// Meter is a meter as the model sees it.
type Meter struct {
	Name        string
	Aggregation string // SUM, COUNT, MAX, UNIQUE_COUNT, LATEST
	Property    string // UNIQUE_COUNT's property
	GroupBy     []string
}

// Meters are the declared meters of a test.
type Meters []Meter

// YAML renders the meters as a meters file (aggregator.ParseMeters,
// `meterline aggregate --meters`), so that a test declares each meter once.
func (ms Meters) YAML() string {
	var b strings.Builder
	b.WriteString("meters:\n")
	for _, m := range ms {
		fmt.Fprintf(&b, "  - {name: %s, aggregation: %s", m.Name, m.Aggregation)
		if m.Property != "" {
			fmt.Fprintf(&b, ", property: %s", m.Property)
		}
		if len(m.GroupBy) > 0 {
			fmt.Fprintf(&b, ", group_by: [%s]", strings.Join(m.GroupBy, ", "))
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// Period returns the billing period [start, end) that contains ms (epoch
// milliseconds).
type Period func(ms int64) (start, end int64)

const (
	hourMs = int64(3600 * 1000)
	dayMs  = 24 * hourMs
)

// Day is the UTC day of ms (ms > 0; UTC days are exactly 86,400,000 ms in
// epoch time).
func Day(ms int64) (int64, int64) { s := ms - ms%dayMs; return s, s + dayMs }

// Hour is the UTC hour of ms.
func Hour(ms int64) (int64, int64) { s := ms - ms%hourMs; return s, s + hourMs }

// Event is one deduplicated event as the model knows it.
type Event struct {
	ID, Customer, Meter string
	Quantity            int64
	EventTime           int64 // ms
	Arrival             int64 // ms: the broker time dedup accepted it at (ingest_time)
	Properties          map[string]string
	// Watermark is the aggregator partition's watermark when the event is
	// processed, where the test knows it (0 otherwise). An event processed
	// when its period is already final is an adjustment even if it arrived
	// on time (docs/design.md, Time).
	Watermark int64
}

// Key identifies an aggregate: customer, meter, group ("name=value,…" in
// the meter's sorted group-by order; a missing property groups under "")
// and period start.
type Key struct {
	Customer, Meter, Group string
	PeriodStart            int64
}

// Model is the bill's rules: the declared meters, the period and the
// grace.
type Model struct {
	// Meters are the declared meters; an event of an undeclared meter
	// counts as a SUM without groups (docs/design.md, Meters and
	// aggregations: without --strict-meters).
	Meters Meters
	Period Period
	Grace  int64 // ms
}

// Meter returns the meter name as the aggregator counts it.
func (m *Model) Meter(name string) Meter {
	for _, mt := range m.Meters {
		if mt.Name == name {
			return mt
		}
	}
	return Meter{Name: name, Aggregation: "SUM"}
}

// Declared reports whether the meter is in m.Meters (an undeclared one
// counts as SUM).
func (m *Model) Declared(name string) bool {
	return slices.ContainsFunc(m.Meters, func(mt Meter) bool { return mt.Name == name })
}

// Key returns the aggregate e counts in.
func (m *Model) Key(e *Event) Key {
	names := slices.Clone(m.Meter(e.Meter).GroupBy)
	sort.Strings(names)
	g := make([]string, len(names))
	for i, n := range names {
		g[i] = n + "=" + e.Properties[n]
	}
	start, _ := m.Period(e.EventTime)
	return Key{e.Customer, e.Meter, strings.Join(g, ","), start}
}

// Cutoff is end + grace of e's period: the last arrival that is on time.
func (m *Model) Cutoff(e *Event) int64 {
	_, end := m.Period(e.EventTime)
	return end + m.Grace
}

// OnTime reports whether e counts in its period's FINAL revision: it
// arrived at or before end + grace, and its period was not final yet when
// it was processed. Otherwise it is late: an adjustment.
func (m *Model) OnTime(e *Event) bool {
	c := m.Cutoff(e)
	return e.Arrival <= c && e.Watermark <= c
}

// Value is the value of a period of the meter over exactly these events
// (0 for none).
func (m *Model) Value(meter string, evs []*Event) int64 {
	mt := m.Meter(meter)
	var v int64
	switch mt.Aggregation {
	case "SUM":
		for _, e := range evs {
			v += e.Quantity
		}
	case "COUNT":
		v = int64(len(evs))
	case "MAX":
		for _, e := range evs {
			v = max(v, e.Quantity)
		}
	case "UNIQUE_COUNT":
		seen := map[string]bool{}
		for _, e := range evs {
			seen[e.Properties[mt.Property]] = true
		}
		v = int64(len(seen))
	case "LATEST":
		// The latest event time wins; on equal event times, the greater
		// event ID.
		var best *Event
		for _, e := range evs {
			if best == nil || e.EventTime > best.EventTime || (e.EventTime == best.EventTime && e.ID > best.ID) {
				best = e
			}
		}
		if best != nil {
			v = best.Quantity
		}
	default:
		panic("oracle: unknown aggregation " + mt.Aggregation)
	}
	return v
}

// Bill is what the outputs must hold for a sequence of events.
type Bill struct {
	m *Model
	// OnTime and All are the events of each key, in processing order
	// (within a partition, the order they were produced in).
	OnTime, All map[Key][]*Event
	ByID        map[string]*Event
	// Delta is each late event's change to its period's value over the
	// on-time events and the late events before it.
	Delta  map[string]int64
	Events []*Event
	Late   int
	// Lines are the invoice lines late events were booked into (the key
	// of the period of their arrival) that have no on-time event: each
	// has one FINAL revision of value 0, revision 1, so that every line
	// turns final (docs/design.md, Time).
	Lines map[Key]bool
}

// Bill computes the bill of events, given in processing order.
func (m *Model) Bill(events []*Event) *Bill {
	b := &Bill{m: m, OnTime: map[Key][]*Event{}, All: map[Key][]*Event{}, ByID: map[string]*Event{},
		Delta: map[string]int64{}, Events: events, Lines: map[Key]bool{}}
	for _, e := range events {
		k := m.Key(e)
		b.All[k] = append(b.All[k], e)
		if m.OnTime(e) {
			b.OnTime[k] = append(b.OnTime[k], e)
		} else {
			b.Late++
			k.PeriodStart, _ = m.Period(e.Arrival)
			b.Lines[k] = true
		}
		b.ByID[e.ID] = e
	}
	for k := range b.Lines {
		if len(b.OnTime[k]) > 0 {
			delete(b.Lines, k)
		}
	}
	for k, evs := range b.All {
		seen := slices.Clone(b.OnTime[k])
		for _, e := range evs {
			if m.OnTime(e) {
				continue
			}
			before := m.Value(k.Meter, seen)
			seen = append(seen, e)
			b.Delta[e.ID] = m.Value(k.Meter, seen) - before
		}
	}
	return b
}

// Outputs are what the aggregator wrote.
type Outputs struct {
	// Aggregates are usage.aggregates in topic order (every revision of a
	// key is in one partition, in order).
	Aggregates  []*schemas.Aggregate
	Adjustments []*schemas.Adjustment
	Rejected    int // records in usage.rejected
}

// Complete reports whether out holds as many FINAL revisions as the bill
// has keys with an on-time event, and as many adjustments as it has late
// events: the count a test waits for before it checks (FINAL revisions,
// and the adjustments queued behind them, go out in chunks without input,
// after the group caught up; docs/design.md, Exactly-once, 7).
func (b *Bill) Complete(out Outputs) bool {
	finals := 0
	for _, a := range out.Aggregates {
		if a.Status == schemas.StatusFinal {
			finals++
		}
	}
	return finals >= len(b.OnTime)+len(b.Lines) && len(out.Adjustments) >= b.Late
}

// Report is what Check found.
type Report struct {
	Keys, Finals, OpenRevisions, Adjustments int
	// Problems are the differences from the bill, sorted; at most
	// maxProblems.
	Problems []string
}

const maxProblems = 40

func groupString(g []schemas.Property) string {
	parts := make([]string, len(g))
	for i, p := range g {
		parts[i] = p.Name + "=" + p.Value
	}
	return strings.Join(parts, ",")
}

// check is one Check: the report it fills and the FINAL revision found
// for each key.
type check struct {
	b      *Bill
	rep    Report
	finals map[Key]*schemas.Aggregate
}

func (c *check) fail(format string, args ...any) {
	if len(c.rep.Problems) < maxProblems {
		c.rep.Problems = append(c.rep.Problems, fmt.Sprintf(format, args...))
	}
}

// Check compares the outputs with the bill: for every key with an on-time
// event, revisions 1, 2, … and exactly one FINAL, last, with the value,
// count and first/last event time over its on-time events, decided past
// end + grace; every OPEN revision the value over a prefix of its on-time
// events; no aggregate of a key without an on-time event; one adjustment
// per late event, for its aggregate, booked into the period of its
// arrival, with the model's delta and the event's fields; FINAL + Σ deltas
// = the value over all the key's events; nothing rejected.
func (b *Bill) Check(out Outputs) Report {
	c := &check{b: b, rep: Report{Keys: len(b.All)}, finals: map[Key]*schemas.Aggregate{}}
	c.aggregates(out.Aggregates)
	adjSum := c.adjustments(out.Adjustments)
	// The invoice identity: FINAL + Σ deltas = the period over all events.
	for k, evs := range b.All {
		var final int64
		if f := c.finals[k]; f != nil {
			final = f.Value
		}
		if want := b.m.Value(k.Meter, evs); final+adjSum[k] != want {
			c.fail("%v: FINAL %d + adjustments %d = %d, want %d over all %d events", k, final, adjSum[k], final+adjSum[k], want, len(evs))
		}
	}
	if out.Rejected > 0 {
		c.fail("%d records in usage.rejected", out.Rejected)
	}
	sort.Strings(c.rep.Problems)
	return c.rep
}

// aggregates checks the revisions of every key, and the FINAL of every
// key with an on-time event.
func (c *check) aggregates(aggs []*schemas.Aggregate) {
	b, m := c.b, c.b.m
	revs := map[Key][]*schemas.Aggregate{}
	for _, a := range aggs {
		k := Key{a.CustomerID, a.Meter, groupString(a.Group), a.PeriodStart}
		revs[k] = append(revs[k], a)
	}
	for k, rs := range revs {
		ot := b.OnTime[k]
		if len(ot) == 0 {
			c.line(k, rs)
			continue
		}
		mt := m.Meter(k.Meter)
		_, end := m.Period(k.PeriodStart)
		prevCount := int64(0)
		for i, a := range rs {
			if a.Revision != int64(i+1) {
				c.fail("%v: revision %d at position %d (want %d)", k, a.Revision, i, i+1)
			}
			if a.PeriodEnd != end || a.Aggregation != mt.Aggregation {
				c.fail("%v: period end %d aggregation %s, want %d %s", k, a.PeriodEnd, a.Aggregation, end, mt.Aggregation)
			}
			if a.Status == schemas.StatusFinal {
				if i != len(rs)-1 {
					c.fail("%v: revision %d follows the FINAL (revision %d)", k, rs[len(rs)-1].Revision, a.Revision)
				}
				if c.finals[k] != nil {
					c.fail("%v: FINAL emitted twice (revisions %d and %d)", k, c.finals[k].Revision, a.Revision)
				}
				c.finals[k] = a
				continue
			}
			// An OPEN revision is the period over its first event_count
			// on-time events.
			c.rep.OpenRevisions++
			n := a.EventCount
			if n <= prevCount || n > int64(len(ot)) {
				c.fail("%v: OPEN revision %d has event_count %d (previous %d, on-time events %d)", k, a.Revision, n, prevCount, len(ot))
				continue
			}
			prevCount = n
			if want := m.Value(k.Meter, ot[:n]); a.Value != want {
				c.fail("%v: OPEN revision %d (count %d) value %d, want %d", k, a.Revision, n, a.Value, want)
			}
		}
	}
	for k, ot := range b.OnTime {
		f := c.finals[k]
		if f == nil {
			c.fail("%v: no FINAL (%d revisions, %d on-time events)", k, len(revs[k]), len(ot))
			continue
		}
		first, last := ot[0].EventTime, ot[0].EventTime
		for _, e := range ot {
			first, last = min(first, e.EventTime), max(last, e.EventTime)
		}
		if want := m.Value(k.Meter, ot); f.Value != want || f.EventCount != int64(len(ot)) {
			c.fail("%v: FINAL value %d count %d, want value %d count %d", k, f.Value, f.EventCount, want, len(ot))
		}
		if f.FirstEventTime != first || f.LastEventTime != last {
			c.fail("%v: FINAL first/last event time %d/%d, want %d/%d", k, f.FirstEventTime, f.LastEventTime, first, last)
		}
		if cut := m.Cutoff(ot[0]); f.UpdatedAt <= cut {
			c.fail("%v: FINAL updated_at %d is not past end + grace %d", k, f.UpdatedAt, cut)
		}
	}
	for k := range b.Lines {
		if revs[k] == nil {
			c.fail("%v: no FINAL for a line late events were booked into", k)
		}
	}
	c.rep.Finals = len(c.finals)
}

// line checks the revisions rs of key k, which has no on-time event: a
// line late events were booked into has one FINAL, revision 1, value 0,
// count 0, first/last event time 0, of its meter's aggregation and its
// period, emitted once its period is final there (updated_at past end +
// grace: docs/design.md, Time).
func (c *check) line(k Key, rs []*schemas.Aggregate) {
	if !c.b.Lines[k] {
		c.fail("%v: %d aggregate revisions, but no event of it arrived on time and no late event was booked into it", k, len(rs))
		return
	}
	a := rs[0]
	if len(rs) != 1 || a.Status != schemas.StatusFinal || a.Revision != 1 || a.Value != 0 || a.EventCount != 0 ||
		a.FirstEventTime != 0 || a.LastEventTime != 0 {
		c.fail("%v: %d revisions, the first %s revision %d value %d count %d first/last event time %d/%d; "+
			"want one FINAL, revision 1, value 0, count 0, event times 0, for a line late events were booked into",
			k, len(rs), a.Status, a.Revision, a.Value, a.EventCount, a.FirstEventTime, a.LastEventTime)
	}
	_, end := c.b.m.Period(k.PeriodStart)
	if mt := c.b.m.Meter(k.Meter); a.PeriodEnd != end || a.Aggregation != mt.Aggregation {
		c.fail("%v: line FINAL period end %d aggregation %s, want %d %s", k, a.PeriodEnd, a.Aggregation, end, mt.Aggregation)
	}
	if cut := end + c.b.m.Grace; a.UpdatedAt <= cut {
		c.fail("%v: line FINAL updated_at %d is not past its period's end + grace %d", k, a.UpdatedAt, cut)
	}
	c.finals[k] = a
}

// adjustments checks one adjustment per late event, booked into the period
// of its arrival, with the model's delta, and returns their sum per key.
func (c *check) adjustments(adjs []*schemas.Adjustment) map[Key]int64 {
	b, m := c.b, c.b.m
	adjSum := map[Key]int64{}
	got := map[string]int{}
	for _, a := range adjs {
		c.rep.Adjustments++
		got[a.EventID]++
		e := b.ByID[a.EventID]
		if e == nil {
			c.fail("adjustment for an event never sent: %s", a.EventID)
			continue
		}
		k := m.Key(e)
		if m.OnTime(e) {
			c.fail("%s (%v, arrival %d ≤ end + grace %d) was booked as an adjustment", e.ID, k, e.Arrival, m.Cutoff(e))
		}
		_, end := m.Period(k.PeriodStart)
		if ak := (Key{a.CustomerID, a.Meter, groupString(a.Group), a.OriginalPeriodStart}); ak != k || a.OriginalPeriodEnd != end {
			c.fail("%s: adjustment for %v (end %d), want %v (end %d)", e.ID, ak, a.OriginalPeriodEnd, k, end)
		}
		if bs, be := m.Period(e.Arrival); a.BookedPeriodStart != bs || a.BookedPeriodEnd != be {
			c.fail("%s: booked [%d, %d), want the period of its arrival [%d, %d)", e.ID, a.BookedPeriodStart, a.BookedPeriodEnd, bs, be)
		}
		if a.Delta != b.Delta[e.ID] {
			c.fail("%s (%v): delta %d, want %d", e.ID, k, a.Delta, b.Delta[e.ID])
		}
		if a.Quantity != e.Quantity || a.EventTime != e.EventTime || a.IngestTime != e.Arrival || a.Aggregation != m.Meter(e.Meter).Aggregation {
			c.fail("%s: adjustment fields %+v do not match the event", e.ID, a)
		}
		adjSum[k] += a.Delta
	}
	for _, e := range b.Events {
		if !m.OnTime(e) && got[e.ID] != 1 {
			c.fail("late event %s (%v): %d adjustments, want 1", e.ID, m.Key(e), got[e.ID])
		}
	}
	return adjSum
}
