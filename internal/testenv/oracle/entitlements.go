package oracle

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/entitlements/entref"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// Entitlements (DESIGN §12) in the model: which events the aggregator
// accepts, decided by the entitlements package's reference model
// (entitlements/entref), which shares no code with the Ledger. The bill is
// then the bill of the accepted events; each rejected one is in
// usage.rejected once, with its reason and stage aggregator.

// EntRecord is a record a test wrote to partition Partition of
// usage.entitlements.
type EntRecord struct {
	Partition int32
	entref.Record
}

// Entitlements are the records of usage.entitlements, in the order each
// partition got them (broker times non-decreasing per partition, as the
// broker stamps them), and the partition count of usage.deduped (and so
// of usage.entitlements).
type Entitlements struct {
	Partitions int32
	// Window is the aggregator's dedup window W (0: entref.DefaultWindow),
	// by which a grant id offered again continues its generation or
	// starts a new one (docs/entitlements.md, Credits).
	Window  time.Duration
	Records []EntRecord
	// Nudge, when set, is called while VerifyEntitlements waits for the
	// outputs: a test that appends the entitlements ticks itself moves the
	// broker time on with it, so that the balances still pending go out
	// (aggregator.Config.BalanceInterval).
	Nudge func()
}

// Decide decides every event as the aggregator must: the events of each
// usage.deduped partition in the order given (the input order), each
// against the records of its entitlements partition written at or before
// its arrival (and any before them in that partition's order). It returns
// each event's outcome by ID (entref.Accepted or a reason code) and each
// partition's reference model after the last event.
func (e *Entitlements) Decide(m *Model, events []*Event) (map[string]string, []*entref.Model) {
	models := make([]*entref.Model, e.Partitions)
	recs := make([][]entref.Record, e.Partitions)
	next := make([]int, e.Partitions)
	for p := range models {
		models[p] = entref.New(m.Period)
		if e.Window != 0 {
			models[p].Window(e.Window)
		}
	}
	for _, r := range e.Records {
		recs[r.Partition] = append(recs[r.Partition], r.Record)
	}
	out := map[string]string{}
	for _, ev := range events {
		p := schemas.Partition(schemas.CustomerKey(ev.Customer), e.Partitions)
		for next[p] < len(recs[p]) && recs[p][next[p]].Written <= ev.Arrival {
			models[p].Add(recs[p][next[p]])
			next[p]++
		}
		d := models[p].Decide(ev.Customer, entref.Event{Meter: ev.Meter, Aggregation: m.Meter(ev.Meter).Aggregation,
			Quantity: ev.Quantity, EventTime: ev.EventTime, Arrival: ev.Arrival})
		out[ev.ID] = d.Outcome
	}
	for p := range models {
		for _, r := range recs[p][next[p]:] {
			models[p].Add(r)
		}
	}
	return out, models
}

// EntReport is what VerifyEntitlements found.
type EntReport struct {
	Report
	Accepted int
	Rejected map[string]int // by reason
	Balances int            // customers whose last balance was checked
}

// VerifyEntitlements is Verify with entitlements: the bill of the events
// the reference accepts (every aggregate and adjustment, as Verify
// checks), each rejected event exactly once in usage.rejected with its
// reason and stage aggregator and no other record there, and each
// customer's last balance in usage.balances equal to the reference's as
// of that balance's time (waiting for it: a customer's last balance goes
// out up to an interval of broker time after its last change). It fails
// the test with every problem found.
func VerifyEntitlements(t testing.TB, brokers []string, names topics.Names, m *Model, ent *Entitlements, events []*Event) EntReport {
	t.Helper()
	outcome, models := ent.Decide(m, events)
	var accepted []*Event
	want := map[string]string{}
	rep := EntReport{Rejected: map[string]int{}}
	for _, ev := range events {
		if o := outcome[ev.ID]; o != entref.Accepted {
			want[schemas.Identity{CustomerID: ev.Customer, Meter: ev.Meter, EventID: ev.ID}.String()] = o
			rep.Rejected[o]++
			continue
		}
		accepted = append(accepted, ev)
	}
	rep.Accepted = len(accepted)
	charged := map[string]bool{}
	for _, ev := range accepted {
		charged[ev.Customer] = true
	}
	b := m.Bill(accepted)
	balances := func() []string {
		last := map[string]*schemas.Balance{}
		for _, r := range testenv.ReadAll(t, brokers, names.BalancesTopic()) {
			var bl schemas.Balance
			if err := schemas.DecodeInto(r.Value, &bl); err != nil {
				t.Fatalf("%s %d/%d: %v", names.BalancesTopic(), r.Partition, r.Offset, err)
			}
			if cur := last[bl.CustomerID]; cur == nil || bl.Revision > cur.Revision {
				last[bl.CustomerID] = &bl
			}
		}
		var problems []string
		for c, got := range last {
			p := schemas.Partition(schemas.CustomerKey(c), ent.Partitions)
			if w := models[p].Balance(c, got.UpdatedAt, got.Revision); !reflect.DeepEqual(got, w) {
				problems = append(problems, fmt.Sprintf("balance of %s:\n    got  %+v\n    want %+v", c, got, w))
			}
		}
		for c := range charged {
			if last[c] == nil {
				problems = append(problems, fmt.Sprintf("no balance of %s, which has accepted events", c))
			}
		}
		rep.Balances = len(last)
		return problems
	}
	deadline := time.Now().Add(AwaitTimeout)
	for {
		out := read(t, brokers, names)
		if b.Complete(out) && len(testenv.ReadAll(t, brokers, names.RejectedTopic())) >= len(want) && len(balances()) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Logf("after %s the outputs are still incomplete", AwaitTimeout)
			break
		}
		if ent.Nudge != nil {
			ent.Nudge()
		}
		time.Sleep(100 * time.Millisecond)
	}
	out := read(t, brokers, names)
	var problems []string
	seen := map[string]int{}
	for _, r := range testenv.ReadAll(t, brokers, names.RejectedTopic()) {
		var rj schemas.Rejected
		if err := schemas.DecodeInto(r.Value, &rj); err != nil {
			t.Fatalf("%s %d/%d: %v", names.RejectedTopic(), r.Partition, r.Offset, err)
		}
		id := schemas.Identity{CustomerID: rj.CustomerID, Meter: rj.Meter, EventID: rj.EventID}.String()
		seen[id]++
		switch w, ok := want[id]; {
		case !ok:
			problems = append(problems, fmt.Sprintf("rejected %s (%s: %s), which the model accepts", id, rj.Reason, rj.Detail))
		case rj.Reason != w || rj.Stage != "aggregator":
			problems = append(problems, fmt.Sprintf("rejected %s as %s by %q, want %s by aggregator", id, rj.Reason, rj.Stage, w))
		}
	}
	for id, w := range want {
		if seen[id] != 1 {
			problems = append(problems, fmt.Sprintf("%s is in usage.rejected %d times, want once (%s)", id, seen[id], w))
		}
	}
	problems = append(problems, balances()...)
	rep.Report = b.Check(out)
	problems = append(problems, rep.Problems...)
	if len(problems) > 0 {
		sort.Strings(problems)
		if len(problems) > maxProblems {
			problems = problems[:maxProblems]
		}
		t.Fatalf("the outputs disagree with the model of DESIGN §3 and §12 (%d events, %d accepted):\n  %s", len(events), len(accepted), strings.Join(problems, "\n  "))
	}
	t.Logf("the model agrees: %d events, %d accepted, rejected %v; %d keys, %d FINAL, %d adjustments, %d balances checked",
		len(events), len(accepted), rep.Rejected, rep.Keys, rep.Finals, rep.Adjustments, rep.Balances)
	return rep
}
