package oracle

import (
	"bytes"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

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
// usage.entitlements. A customer's record on another partition than its
// customer's (a client with another partitioner, DESIGN §12) changes
// nothing there but the partition's broker time: the aggregator
// re-produces it to the customer's partition, where the copy applies by
// its own broker time and place in that partition (FromTopic finds it).
// The model does not know stale copies (one whose original arrived no
// later than the customer's last record applied is not applied, and the
// aggregator restates that record: docs/entitlements.md): a test must not
// write a record to a wrong partition after a later one of its customer. A
// tick (Key schemas.TickKey) changes nothing either: only its broker time
// counts, for the records read after it. A test need not list its ticks:
// VerifyEntitlements reads them from the topic.
type EntRecord struct {
	Partition int32
	entref.Record
}

// Entitlements are the records of usage.entitlements, in the order each
// partition got them, and the partition count of usage.deduped (and so
// of usage.entitlements). A partition's broker times may step back (a
// broker clock that went back): a record read behind the latest broker
// time its partition was read up to applies from that time
// (entref.Model.Add).
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

// readOnly reports whether r, read from partition p, changes nothing but
// the partition's broker time: a tick, or a customer's record on another
// partition than its customer's.
func (e *Entitlements) readOnly(p int32, r entref.Record) bool {
	switch r.Key {
	case schemas.TickKey:
		return true
	case schemas.DefaultPlanKey, schemas.RateCardKey:
		return false
	}
	return schemas.Partition(schemas.CustomerKey(r.Key), e.Partitions) != p
}

// Decide decides every event as the aggregator must: the events of each
// usage.deduped partition in the order given (the input order), each
// against the records of its entitlements partition up to the first
// written after its arrival (the gate lets an event through once its
// partition has been read past its arrival; a record after that one
// applies from that broker time or later, so not to the event). It
// returns each event's outcome by ID (entref.Accepted or a reason code)
// and each partition's reference model after the last event.
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
	read := func(p int32, r entref.Record) {
		if e.readOnly(p, r) {
			models[p].Read(r.Written)
			return
		}
		models[p].Add(r)
	}
	out := map[string]string{}
	for _, ev := range events {
		p := schemas.Partition(schemas.CustomerKey(ev.Customer), e.Partitions)
		for next[p] < len(recs[p]) && recs[p][next[p]].Written <= ev.Arrival {
			read(p, recs[p][next[p]])
			next[p]++
		}
		d := models[p].Decide(ev.Customer, entref.Event{Meter: ev.Meter, Aggregation: m.Meter(ev.Meter).Aggregation,
			Quantity: ev.Quantity, EventTime: ev.EventTime, Arrival: ev.Arrival})
		out[ev.ID] = d.Outcome
	}
	for p := range models {
		for _, r := range recs[p][next[p]:] {
			read(int32(p), r)
		}
	}
	return out, models
}

// FromTopic returns the records of usage.entitlements (topic) as the
// aggregator reads them: every record, read_committed, in each
// partition's order, with its broker time. Each must be a record e lists,
// in the order e lists the partition's and with the broker time it gives;
// or a tick; or the copy of a customer's record e lists on another
// partition than its customer's (the same key and value), which the
// aggregator re-produced to the customer's partition at a broker time of
// its own (DESIGN §12), exactly once. problems names every record that is
// none of these, every record of e the topic lacks, and every misplaced
// record not copied exactly once.
func (e *Entitlements) FromTopic(t testing.TB, brokers []string, topic string) (got *Entitlements, problems []string) {
	t.Helper()
	type misplaced struct {
		rec    entref.Record
		key    []byte
		value  []byte
		copies int
	}
	encode := func(r entref.Record) (key, value []byte) {
		key = []byte(r.Key)
		if r.Key != schemas.DefaultPlanKey && r.Key != schemas.RateCardKey && r.Key != schemas.TickKey {
			key = schemas.CustomerKey(r.Key)
		}
		var m schemas.Message
		switch {
		case r.Ent != nil:
			m = r.Ent
		case r.Card != nil:
			m = r.Card
		}
		if m != nil {
			v, err := schemas.Encode(m)
			if err != nil {
				t.Fatalf("oracle: encode the entitlements record of %s: %v", r.Key, err)
			}
			value = v
		}
		return key, value
	}
	want := make([][]EntRecord, e.Partitions)
	copies := make([][]*misplaced, e.Partitions)
	for _, r := range e.Records {
		want[r.Partition] = append(want[r.Partition], r)
		if r.Key != schemas.TickKey && e.readOnly(r.Partition, r.Record) {
			c := schemas.Partition(schemas.CustomerKey(r.Key), e.Partitions)
			k, v := encode(r.Record)
			copies[c] = append(copies[c], &misplaced{rec: r.Record, key: k, value: v})
		}
	}
	byPart := make([][]*kgo.Record, e.Partitions)
	for _, r := range testenv.ReadAll(t, brokers, topic) {
		if r.Partition < 0 || r.Partition >= e.Partitions {
			t.Fatalf("oracle: %s has partition %d, want fewer than %d", topic, r.Partition, e.Partitions)
		}
		byPart[r.Partition] = append(byPart[r.Partition], r)
	}
	got = &Entitlements{Partitions: e.Partitions, Nudge: e.Nudge}
	for p := range e.Partitions {
		next := 0
	records:
		for _, r := range byPart[p] {
			at := r.Timestamp.UnixMilli()
			if string(r.Key) == schemas.TickKey {
				got.Records = append(got.Records, EntRecord{Partition: p, Record: entref.Record{Key: schemas.TickKey, Written: at}})
				continue
			}
			for j := next; j < len(want[p]); j++ {
				w := want[p][j]
				k, v := encode(w.Record)
				if bytes.Equal(k, r.Key) && bytes.Equal(v, r.Value) && w.Written == at {
					for _, l := range want[p][next:j] {
						problems = append(problems, fmt.Sprintf("%s partition %d lacks the record of %s at broker time %d before offset %d",
							topic, p, l.Key, l.Written, r.Offset))
					}
					got.Records = append(got.Records, w)
					next = j + 1
					continue records
				}
			}
			for _, c := range copies[p] {
				if c.copies == 0 && bytes.Equal(c.key, r.Key) && bytes.Equal(c.value, r.Value) {
					c.copies++
					rec := c.rec
					rec.Written = at
					got.Records = append(got.Records, EntRecord{Partition: p, Record: rec})
					continue records
				}
			}
			problems = append(problems, fmt.Sprintf("%s %d/%d (key %q, broker time %d) is no record the test wrote there, nor the one copy of one written to another partition",
				topic, p, r.Offset, r.Key, at))
		}
		for _, w := range want[p][next:] {
			problems = append(problems, fmt.Sprintf("%s partition %d lacks the record of %s at broker time %d at its end", topic, p, w.Key, w.Written))
		}
		for _, c := range copies[p] {
			if c.copies == 0 {
				problems = append(problems, fmt.Sprintf("the record of %s written to another partition at %d was not re-produced to its partition %d", c.rec.Key, c.rec.Written, p))
			}
		}
	}
	return got, problems
}

// EntReport is what VerifyEntitlements found.
type EntReport struct {
	Report
	Accepted int
	Rejected map[string]int // by reason
	Balances int            // customers whose last balance was checked
}

// VerifyEntitlements is Verify with entitlements: usage.entitlements as
// the aggregator left it (FromTopic: the test's records, its ticks, one
// copy of each record written to another partition than its customer's),
// the bill of the events the reference accepts against it (every
// aggregate and adjustment, as Verify checks), each rejected event exactly
// once in usage.rejected with its reason and stage aggregator and no other
// record there, and each customer's last balance in usage.balances equal
// to the reference's as of that balance's time (waiting for it: a
// customer's last balance goes out up to an interval of broker time after
// its last change). It fails the test with every problem found.
func VerifyEntitlements(t testing.TB, brokers []string, names topics.Names, m *Model, ent *Entitlements, events []*Event) EntReport {
	t.Helper()
	inTopic, problems := ent.FromTopic(t, brokers, names.EntitlementsTopic())
	if len(problems) > 0 {
		// The model would decide on other records than the aggregator read.
		t.Fatalf("%s is not what the test wrote and the aggregator re-produced:\n  %s", names.EntitlementsTopic(), strings.Join(problems, "\n  "))
	}
	outcome, models := inTopic.Decide(m, events)
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
	problems = nil
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
