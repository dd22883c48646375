package oracle

import (
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// The oracle's own test: a day of events whose bill is written out by hand
// below (not computed by the oracle), the outputs a correct aggregator
// writes for it, and one wrong output per rule of the bill, each of which
// the check must name.

const (
	h = int64(time.Hour / time.Millisecond)
	d = 24 * h
)

var day = time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

var testModel = &Model{
	Meters: Meters{
		{Name: "s", Aggregation: "SUM", GroupBy: []string{"region"}},
		{Name: "mx", Aggregation: "MAX"},
		{Name: "u", Aggregation: "UNIQUE_COUNT", Property: "user"},
		{Name: "l", Aggregation: "LATEST"},
	},
	Period: Day,
	Grace:  h,
}

func ev(id, meter string, qty, et, arr int64, props map[string]string) *Event {
	return &Event{ID: id, Customer: "acme", Meter: meter, Quantity: qty, EventTime: et, Arrival: arr, Properties: props}
}

// testEvents are the day's events in processing order. The cutoff of the
// day is day + 1d + 1h.
func testEvents() []*Event {
	eu, us := map[string]string{"region": "eu"}, map[string]string{"region": "us"}
	cut := day + d + h
	w1 := ev("w1", "s", 1, day+h, day+2*h, us)
	w1.Watermark = cut + 5 // processed when the day was already final
	return []*Event{
		ev("s1", "s", 5, day+h, day+2*h, eu),
		ev("s2", "s", 7, day+3*h, day+4*h, eu),
		ev("s3", "s", 2, day+5*h, cut+1, eu), // late by 1 ms
		ev("m1", "mx", 10, day+h, day+2*h, nil),
		ev("m2", "mx", 4, day+2*h, day+2*d, nil),  // late, below the max
		ev("m3", "mx", 12, day+2*h, day+2*d, nil), // late, a new max
		ev("l-b", "l", 3, day+5*h, day+6*h, nil),
		ev("l-a", "l", 9, day+5*h, day+6*h, nil),  // same event time: the greater ID wins
		ev("l3", "l", 100, day+2*h, day+2*d, nil), // late and older
		ev("u1", "u", 1, day+h, day+2*h, map[string]string{"user": "x"}),
		ev("u2", "u", 1, day+h, day+2*h, map[string]string{"user": "y"}),
		ev("u3", "u", 1, day+h, day+2*d, map[string]string{"user": "x"}), // late, seen
		ev("u4", "u", 1, day+h, day+2*d, map[string]string{"user": "z"}), // late, new
		ev("x1", "x", 4, day+h, day+2*h, nil),                            // undeclared: a SUM
		w1,
	}
}

func agg(meter, agg, group string, rev int64, status schemas.AggregateStatus, count, value, first, last int64) *schemas.Aggregate {
	a := &schemas.Aggregate{CustomerID: "acme", Meter: meter, Aggregation: agg, PeriodStart: day, PeriodEnd: day + d,
		Revision: rev, Status: status, EventCount: count, Value: value, FirstEventTime: first, LastEventTime: last,
		UpdatedAt: day + 2*h}
	if group != "" {
		n, v, _ := strings.Cut(group, "=")
		a.Group = []schemas.Property{{Name: n, Value: v}}
	}
	if status == schemas.StatusFinal {
		a.UpdatedAt = day + d + h + 1
	}
	return a
}

// line is the FINAL revision of a line late events were booked into,
// period start, with no on-time event of its own.
func line(meter, aggregation, group string, start int64) *schemas.Aggregate {
	a := agg(meter, aggregation, group, 1, schemas.StatusFinal, 0, 0, 0, 0)
	a.PeriodStart, a.PeriodEnd, a.UpdatedAt = start, start+d, start+d+h+1
	return a
}

func adj(e *Event, aggregation, group string, booked, delta int64) *schemas.Adjustment {
	a := &schemas.Adjustment{EventID: e.ID, CustomerID: e.Customer, Meter: e.Meter, Aggregation: aggregation,
		OriginalPeriodStart: day, OriginalPeriodEnd: day + d, BookedPeriodStart: booked, BookedPeriodEnd: booked + d,
		Quantity: e.Quantity, EventTime: e.EventTime, IngestTime: e.Arrival, Delta: delta}
	if group != "" {
		n, v, _ := strings.Cut(group, "=")
		a.Group = []schemas.Property{{Name: n, Value: v}}
	}
	return a
}

// correctOutputs is the bill of testEvents, by hand.
func correctOutputs(evs []*Event) Outputs {
	by := map[string]*Event{}
	for _, e := range evs {
		by[e.ID] = e
	}
	open, final := schemas.StatusOpen, schemas.StatusFinal
	return Outputs{
		Aggregates: []*schemas.Aggregate{
			agg("s", "SUM", "region=eu", 1, open, 1, 5, day+h, day+h),
			agg("s", "SUM", "region=eu", 2, final, 2, 12, day+h, day+3*h),
			agg("mx", "MAX", "", 1, final, 1, 10, day+h, day+h),
			agg("l", "LATEST", "", 1, final, 2, 3, day+5*h, day+5*h),
			agg("u", "UNIQUE_COUNT", "", 1, final, 2, 2, day+h, day+h),
			agg("x", "SUM", "", 1, final, 1, 4, day+h, day+h),
			// The lines the late events were booked into.
			line("s", "SUM", "region=eu", day+d),
			line("mx", "MAX", "", day+2*d),
			line("l", "LATEST", "", day+2*d),
			line("u", "UNIQUE_COUNT", "", day+2*d),
			line("s", "SUM", "region=us", day),
		},
		Adjustments: []*schemas.Adjustment{
			adj(by["s3"], "SUM", "region=eu", day+d, 2),
			adj(by["m2"], "MAX", "", day+2*d, 0),
			adj(by["m3"], "MAX", "", day+2*d, 2),
			adj(by["l3"], "LATEST", "", day+2*d, 0),
			adj(by["u3"], "UNIQUE_COUNT", "", day+2*d, 0),
			adj(by["u4"], "UNIQUE_COUNT", "", day+2*d, 1),
			adj(by["w1"], "SUM", "region=us", day, 1),
		},
	}
}

func TestCheckAcceptsTheBill(t *testing.T) {
	evs := testEvents()
	b := testModel.Bill(evs)
	out := correctOutputs(evs)
	if !b.Complete(out) {
		t.Fatalf("Complete = false for the whole bill: %d keys with an on-time event, %d late", len(b.OnTime), b.Late)
	}
	rep := b.Check(out)
	if len(rep.Problems) > 0 {
		t.Fatalf("problems in a correct bill:\n  %s", strings.Join(rep.Problems, "\n  "))
	}
	if rep.Keys != 6 || rep.Finals != 10 || rep.OpenRevisions != 1 || rep.Adjustments != 7 {
		t.Errorf("report %+v, want 6 keys, 10 FINAL (5 of lines late events were booked into), 1 OPEN revision, 7 adjustments", rep)
	}
}

func TestCheckFindsEveryWrongOutput(t *testing.T) {
	find := func(out Outputs, id string) *schemas.Adjustment {
		for _, a := range out.Adjustments {
			if a.EventID == id {
				return a
			}
		}
		t.Fatalf("no adjustment %s", id)
		return nil
	}
	for _, c := range []struct {
		name       string
		break_     func(*Outputs)
		want       string // in one of the problems
		incomplete bool   // Complete must say false
	}{
		{"wrong FINAL value", func(o *Outputs) { o.Aggregates[1].Value = 13 }, "FINAL value 13 count 2, want value 12 count 2", false},
		{"LATEST tie-break", func(o *Outputs) { o.Aggregates[3].Value = 9 }, "FINAL value 9 count 2, want value 3", false},
		{"UNIQUE_COUNT counts copies", func(o *Outputs) { o.Aggregates[4].Value = 3 }, "FINAL value 3 count 2, want value 2", false},
		{"FINAL twice", func(o *Outputs) {
			f := *o.Aggregates[2]
			f.Revision = 2
			o.Aggregates = append(o.Aggregates, &f)
		}, "FINAL emitted twice", false},
		{"no FINAL", func(o *Outputs) { o.Aggregates = append(o.Aggregates[:2], o.Aggregates[3:]...) }, "no FINAL", true},
		{"revision gap", func(o *Outputs) { o.Aggregates[1].Revision = 3 }, "revision 3 at position 1", false},
		{"wrong OPEN value", func(o *Outputs) { o.Aggregates[0].Value = 6 }, "OPEN revision 1 (count 1) value 6, want 5", false},
		{"revision after the FINAL", func(o *Outputs) {
			o.Aggregates[0], o.Aggregates[1] = o.Aggregates[1], o.Aggregates[0]
			o.Aggregates[0].Revision, o.Aggregates[1].Revision = 1, 2
		}, "revision 2 follows the FINAL", false},
		{"FINAL before end + grace", func(o *Outputs) { o.Aggregates[2].UpdatedAt = day + d + h }, "is not past end + grace", false},
		{"first/last event time", func(o *Outputs) { o.Aggregates[1].LastEventTime = day + h }, "first/last event time", false},
		{"wrong period end", func(o *Outputs) { o.Aggregates[2].PeriodEnd = day + 2*d }, "period end", false},
		{"aggregate without an on-time event", func(o *Outputs) {
			o.Aggregates = append(o.Aggregates, agg("s", "SUM", "region=ap", 1, schemas.StatusOpen, 1, 1, day+h, day+h))
		}, "no event of it arrived on time", false},
		{"line without its FINAL", func(o *Outputs) {
			o.Aggregates = o.Aggregates[:len(o.Aggregates)-1]
		}, "no FINAL for a line late events were booked into", true},
		{"line FINAL with a value", func(o *Outputs) {
			o.Aggregates[len(o.Aggregates)-1].Value = 1
		}, "want one FINAL, revision 1, value 0", false},
		{"line FINAL twice", func(o *Outputs) {
			f := *o.Aggregates[len(o.Aggregates)-1]
			o.Aggregates = append(o.Aggregates, &f)
		}, "want one FINAL, revision 1, value 0", false},
		{"line FINAL before its period is final", func(o *Outputs) {
			o.Aggregates[len(o.Aggregates)-1].UpdatedAt = day + d + h
		}, "line FINAL updated_at", false},
		{"line FINAL with event times", func(o *Outputs) {
			o.Aggregates[len(o.Aggregates)-1].LastEventTime = day + h
		}, "want one FINAL, revision 1, value 0", false},
		{"line FINAL of another aggregation", func(o *Outputs) {
			o.Aggregates[len(o.Aggregates)-1].Aggregation = "MAX"
		}, "line FINAL period end", false},
		{"MAX delta", func(o *Outputs) { find(*o, "m3").Delta = 12 }, "delta 12, want 2", false},
		{"UNIQUE_COUNT delta", func(o *Outputs) { find(*o, "u3").Delta = 1 }, "delta 1, want 0", false},
		{"LATEST delta", func(o *Outputs) { find(*o, "l3").Delta = 97 }, "delta 97, want 0", false},
		{"booked into the original period", func(o *Outputs) {
			a := find(*o, "s3")
			a.BookedPeriodStart, a.BookedPeriodEnd = day, day+d
		}, "want the period of its arrival", false},
		{"on-time event as an adjustment", func(o *Outputs) {
			o.Adjustments = append(o.Adjustments, adj(testEvents()[0], "SUM", "region=eu", day, 5))
		}, "was booked as an adjustment", false},
		{"late on arrival, final when processed", func(o *Outputs) { o.Adjustments = o.Adjustments[:6] }, "late event w1", true},
		{"adjustment of an unknown event", func(o *Outputs) {
			a := *o.Adjustments[0]
			a.EventID = "nope"
			o.Adjustments = append(o.Adjustments, &a)
		}, "never sent: nope", false},
		{"adjustment fields", func(o *Outputs) { find(*o, "u4").Quantity = 2 }, "do not match the event", false},
		{"invoice identity", func(o *Outputs) { find(*o, "s3").Delta = 3 }, "FINAL 12 + adjustments 3 = 15, want 14", false},
		{"rejected", func(o *Outputs) { o.Rejected = 1 }, "1 records in usage.rejected", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			evs := testEvents()
			b := testModel.Bill(evs)
			out := correctOutputs(evs)
			c.break_(&out)
			if got := b.Complete(out); got == c.incomplete {
				t.Errorf("Complete = %v", got)
			}
			rep := b.Check(out)
			for _, p := range rep.Problems {
				if strings.Contains(p, c.want) {
					return
				}
			}
			t.Fatalf("no problem says %q; problems:\n  %s", c.want, strings.Join(rep.Problems, "\n  "))
		})
	}
}

func TestMetersYAML(t *testing.T) {
	want := "meters:\n" +
		"  - {name: s, aggregation: SUM, group_by: [region]}\n" +
		"  - {name: mx, aggregation: MAX}\n" +
		"  - {name: u, aggregation: UNIQUE_COUNT, property: user}\n" +
		"  - {name: l, aggregation: LATEST}\n"
	if got := testModel.Meters.YAML(); got != want {
		t.Errorf("YAML:\n%s\nwant\n%s", got, want)
	}
}
