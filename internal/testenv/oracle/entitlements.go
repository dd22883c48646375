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

// Entitlements (docs/entitlements.md, The aggregator) in the model: which
// events the aggregator accepts, decided by the entitlements package's
// reference model (entitlements/entref), which shares no code with the
// Ledger. The bill is then the bill of the accepted events; each rejected
// one is in usage.rejected once, with its reason and stage aggregator.

// EntRecord is a record a test wrote to partition Partition of
// usage.entitlements, or one the aggregator wrote there (FromTopic). A
// customer's record on another partition than its customer's (a client with
// another partitioner; docs/entitlements.md, Topics) changes nothing there
// but the partition's broker time: the aggregator re-produces it to the
// customer's partition, where the copy applies by its own broker time and
// place in that partition, unless the customer's record in effect there
// reached the topic after its original (FromTopic has the rules). A tick
// (Key schemas.TickKey) changes nothing either: only its broker time
// counts, for the records read after it. A test need not list its ticks,
// nor the copies and restated records: FromTopic reads them from the topic.
type EntRecord struct {
	Partition int32
	entref.Record
	// Skip: a copy or restated record the aggregator does not apply
	// (FromTopic); only its broker time counts.
	Skip bool
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
	// Copies counts what FromTopic found: the copies of misplaced
	// records applied, those not applied (stale), and the restated
	// records.
	Copies struct{ Applied, Stale, Restated int }
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
	recs := make([][]EntRecord, e.Partitions)
	next := make([]int, e.Partitions)
	for p := range models {
		models[p] = entref.New(m.Period)
		if e.Window != 0 {
			models[p].Window(e.Window)
		}
	}
	for _, r := range e.Records {
		recs[r.Partition] = append(recs[r.Partition], r)
	}
	read := func(p int32, r EntRecord) {
		if r.Skip || e.readOnly(p, r.Record) {
			models[p].Read(r.Written)
			return
		}
		models[p].Add(r.Record)
	}
	out := map[string]string{}
	for _, ev := range events {
		p := schemas.Partition(schemas.CustomerKey(ev.Customer), e.Partitions)
		for next[p] < len(recs[p]) && recs[p][next[p]].Written <= ev.Arrival {
			read(p, recs[p][next[p]])
			next[p]++
		}
		d := models[p].Decide(ev.Customer, entref.Event{Meter: ev.Meter, Aggregation: m.Meter(ev.Meter).Aggregation,
			Quantity: ev.Quantity, EventTime: ev.EventTime, Arrival: ev.Arrival, Undeclared: !m.Declared(ev.Meter)})
		out[ev.ID] = d.Outcome
	}
	for p := range models {
		for _, r := range recs[p][next[p]:] {
			read(int32(p), r)
		}
	}
	return out, models
}

// The headers of a copy the aggregator re-produced, and of a record it
// restated (docs/entitlements.md, The aggregator, step 1): the origin's
// partition and offset, and its broker time.
const (
	headerRerouted = "meterline-rerouted"
	headerArrival  = "meterline-arrival"
	// headerMoved marks the delete the aggregator writes after a
	// misplaced record (not a delete) on the partition where it found
	// it, so that compaction removes the original; its value is the
	// original's offset.
	headerMoved = "meterline-moved"
)

// origin orders the records of a customer's key on its partition by when
// they reached usage.entitlements (docs/entitlements.md, The aggregator,
// step 1): the broker time of the original, then its partition and
// offset.
type origin struct {
	arrival   int64
	partition int32
	offset    int64
}

func (o origin) later(p origin) bool {
	if o.arrival != p.arrival {
		return o.arrival > p.arrival
	}
	if o.partition != p.partition {
		return o.partition > p.partition
	}
	return o.offset > p.offset
}

// claimedOrigin returns the origin r's headers claim (each once, well
// formed); ok is false for a record without them.
func claimedOrigin(r *kgo.Record) (o origin, ok bool) {
	var rv, av []byte
	nr, na := 0, 0
	for _, h := range r.Headers {
		switch h.Key {
		case headerRerouted:
			rv, nr = h.Value, nr+1
		case headerArrival:
			av, na = h.Value, na+1
		}
	}
	if nr != 1 || na != 1 {
		return origin{}, false
	}
	var p int32
	var off, a int64
	if _, err := fmt.Sscanf(string(rv), "%d/%d", &p, &off); err != nil || fmt.Sprintf("%d/%d", p, off) != string(rv) || p < 0 || off < 0 {
		return origin{}, false
	}
	if _, err := fmt.Sscanf(string(av), "%d", &a); err != nil || fmt.Sprint(a) != string(av) || a < 0 {
		return origin{}, false
	}
	return origin{a, p, off}, true
}

// lesserValue orders record values: a delete (nil) least, then by bytes.
func lesserValue(a, b []byte) bool {
	switch {
	case a == nil:
		return b != nil
	case b == nil:
		return false
	}
	return bytes.Compare(a, b) < 0
}

// FromTopic returns the records of usage.entitlements (topic) as the
// aggregator reads them: every record, read_committed, in each
// partition's order, with its broker time, and which of them the
// aggregator applies. Each must be a record e lists, in the order e lists
// the partition's and with the broker time it gives; or a tick; or the
// copy of a customer's record e lists on another partition than its
// customer's (the same key and value, its headers giving the original's
// partition, offset and broker time), which the aggregator re-produced to
// the customer's partition at a broker time of its own, exactly once; or
// a customer's record restated there. problems names every record that is
// none of these, every record of e the topic lacks, every misplaced
// record not copied exactly once, and every restated record missing or
// out of place.
//
// On a customer's partition, FromTopic decides by the rules of
// docs/entitlements.md (The aggregator, step 1), written here apart from
// the aggregator's code, which customer records apply: a record is
// ordered by its origin (a copy's headers, else its own broker time,
// partition and offset); one without the headers always applies, at the
// earliest just after the one in effect (a broker clock that stepped
// back); a copy whose origin is before the one in effect is not applied
// (rerouted_repeat), and the aggregator then restates the record in
// effect, marked with its origin; a copy of the origin in effect applies
// only with a greater value (bytes, a delete least), and when it does not
// and its value differs, the one in effect is restated. A restated record
// is a copy like any other: read after the record in effect it restates,
// it changes nothing; read after a later one, it is stale in turn. A
// record not applied counts only by its broker time (EntRecord.Skip).
func (e *Entitlements) FromTopic(t testing.TB, brokers []string, topic string) (got *Entitlements, problems []string) {
	t.Helper()
	m, problems := e.matchWritten(t, brokers, topic)
	byPart, mine, misplaced, misplacedAt := m.byPart, m.mine, m.misplaced, m.misplacedAt
	// The records of each partition in order, with the copy rules per
	// customer.
	type applied struct {
		o     origin
		value []byte
		rec   entref.Record
	}
	got = &Entitlements{Partitions: e.Partitions, Window: e.Window, Nudge: e.Nudge}
	for p := range e.Partitions {
		last := map[string]*applied{}
		restates := map[string][]applied{} // the restated records due, in order
		for i, r := range byPart[p] {
			at := r.Timestamp.UnixMilli()
			w := mine[p][i]
			switch {
			case string(r.Key) == schemas.TickKey:
				got.Records = append(got.Records, EntRecord{Partition: p, Record: entref.Record{Key: schemas.TickKey, Written: at}})
				continue
			case w != nil && (w.rec.Key == schemas.DefaultPlanKey || w.rec.Key == schemas.RateCardKey || e.readOnly(p, w.rec.Record)):
				got.Records = append(got.Records, w.rec)
				continue
			case w == nil && !hasCopyHeaders(r):
				if off, moved := movedFrom(r); moved {
					// The aggregator's delete after a record it moved
					// from here: it counts by its broker time only.
					if m := misplacedAt[p][off]; m == nil || off >= r.Offset || !bytes.Equal(m.key, r.Key) || m.value == nil {
						problems = append(problems, fmt.Sprintf("%s %d/%d (key %q) is marked moved from offset %d, no record of its key written there that is not a delete",
							topic, p, r.Offset, r.Key, off))
					} else {
						m.marks++
						got.Records = append(got.Records, EntRecord{Partition: p, Record: entref.Record{Key: m.rec.Key, Written: at}, Skip: true})
					}
				}
				continue // else a problem already
			}
			var rec entref.Record
			var o origin
			copied, misplacedCopy := w == nil, false
			if !copied {
				rec, o = w.rec.Record, origin{at, p, r.Offset}
			} else {
				c, err := schemas.ParseCustomerKey(r.Key)
				claimed, ok := claimedOrigin(r)
				if err != nil || !ok || schemas.Partition(r.Key, e.Partitions) != p {
					problems = append(problems, fmt.Sprintf("%s %d/%d (key %q, broker time %d) has headers %v: no copy or restated record of its customer's partition",
						topic, p, r.Offset, r.Key, at, r.Headers))
					continue
				}
				o = claimed
				if m := misplaced[o]; m != nil && m.copies == 0 && m.rec.Written == o.arrival && bytes.Equal(m.key, r.Key) && bytes.Equal(m.value, r.Value) {
					m.copies++
					rec = m.rec.Record
					misplacedCopy = true
				} else if q := restates[c]; len(q) > 0 && q[0].o == o && sameValue(q[0].value, r.Value) {
					rec = q[0].rec
					restates[c] = q[1:]
					got.Copies.Restated++
				} else {
					problems = append(problems, fmt.Sprintf("%s %d/%d (customer %s, broker time %d, origin %+v) is neither the one copy of a record written to another partition nor the restated record due",
						topic, p, r.Offset, c, at, o))
					continue
				}
			}
			l := last[rec.Key]
			apply, restate := true, false
			switch {
			case l == nil || o.later(l.o):
			case !copied:
				o.arrival = l.o.arrival + 1
			case o.partition != l.o.partition || o.offset != l.o.offset:
				apply, restate = false, true
			case sameValue(r.Value, l.value):
				apply = false
			case lesserValue(l.value, r.Value):
				o = l.o
			default:
				apply, restate = false, true
			}
			switch {
			case misplacedCopy && apply:
				got.Copies.Applied++
			case misplacedCopy:
				got.Copies.Stale++
			}
			if !apply {
				got.Records = append(got.Records, EntRecord{Partition: p, Record: entref.Record{Key: rec.Key, Written: at}, Skip: true})
				if restate {
					restates[rec.Key] = append(restates[rec.Key], *l)
				}
				continue
			}
			rec.Written = at
			got.Records = append(got.Records, EntRecord{Partition: p, Record: rec})
			last[rec.Key] = &applied{o: o, value: r.Value, rec: rec}
		}
		for c, q := range restates {
			for _, a := range q {
				problems = append(problems, fmt.Sprintf("%s partition %d lacks the record of %s of origin %+v restated after a stale copy", topic, p, c, a.o))
			}
		}
	}
	return got, append(problems, misplacedProblems(misplaced, e.Partitions)...)
}

// written is a record the test wrote, as FromTopic matches it to the
// topic: its encoded key and value, how often it was copied and marked
// moved.
type written struct {
	rec    EntRecord
	key    []byte
	value  []byte
	copies int
	marks  int
}

// encodeEntRecord is r's key and value as the test wrote them.
func encodeEntRecord(t testing.TB, r entref.Record) (key, value []byte) {
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

// hasCopyHeaders reports whether r carries a header of a copy.
func hasCopyHeaders(r *kgo.Record) bool {
	for _, h := range r.Headers {
		if h.Key == headerRerouted || h.Key == headerArrival {
			return true
		}
	}
	return false
}

// movedFrom returns the offset a delete marked moved names.
func movedFrom(r *kgo.Record) (int64, bool) {
	if r.Value != nil || len(r.Headers) != 1 || r.Headers[0].Key != headerMoved {
		return 0, false
	}
	var off int64
	if _, err := fmt.Sscanf(string(r.Headers[0].Value), "%d", &off); err != nil || fmt.Sprint(off) != string(r.Headers[0].Value) {
		return 0, false
	}
	return off, true
}

// matched is the topic's records by partition and, for each, the record
// of the test it is (nil: none), and the test's misplaced records, by
// origin and by partition and offset.
type matched struct {
	byPart      [][]*kgo.Record
	mine        [][]*written
	misplaced   map[origin]*written
	misplacedAt []map[int64]*written
}

// matchWritten reads topic and finds the records e lists in it, in each
// partition's order (FromTopic); problems names each missing one and each
// record without headers that is none of them.
func (e *Entitlements) matchWritten(t testing.TB, brokers []string, topic string) (m *matched, problems []string) {
	t.Helper()
	want := make([][]*written, e.Partitions)
	for _, r := range e.Records {
		k, v := encodeEntRecord(t, r.Record)
		want[r.Partition] = append(want[r.Partition], &written{rec: r, key: k, value: v})
	}
	byPart := make([][]*kgo.Record, e.Partitions)
	for _, r := range testenv.ReadAll(t, brokers, topic) {
		if r.Partition < 0 || r.Partition >= e.Partitions {
			t.Fatalf("oracle: %s has partition %d, want fewer than %d", topic, r.Partition, e.Partitions)
		}
		byPart[r.Partition] = append(byPart[r.Partition], r)
	}
	// First the records the test wrote, in each partition's order: the
	// misplaced ones by their coordinates, for their copies.
	mine := make([][]*written, e.Partitions) // by partition and index in byPart: the test's record, or nil
	misplaced := map[origin]*written{}
	misplacedAt := make([]map[int64]*written, e.Partitions) // by partition and offset
	for p := range e.Partitions {
		misplacedAt[p] = map[int64]*written{}
		mine[p] = make([]*written, len(byPart[p]))
		next := 0
	records:
		for i, r := range byPart[p] {
			at := r.Timestamp.UnixMilli()
			if _, moved := movedFrom(r); string(r.Key) == schemas.TickKey || hasCopyHeaders(r) || moved {
				continue
			}
			for j := next; j < len(want[p]); j++ {
				w := want[p][j]
				if bytes.Equal(w.key, r.Key) && bytes.Equal(w.value, r.Value) && w.rec.Written == at {
					for _, l := range want[p][next:j] {
						problems = append(problems, fmt.Sprintf("%s partition %d lacks the record of %s at broker time %d before offset %d",
							topic, p, l.rec.Key, l.rec.Written, r.Offset))
					}
					mine[p][i] = w
					if e.readOnly(p, w.rec.Record) && w.rec.Key != schemas.TickKey {
						misplaced[origin{at, p, r.Offset}] = w
						misplacedAt[p][r.Offset] = w
					}
					next = j + 1
					continue records
				}
			}
			problems = append(problems, fmt.Sprintf("%s %d/%d (key %q, broker time %d) is no record the test wrote there", topic, p, r.Offset, r.Key, at))
		}
		for _, w := range want[p][next:] {
			problems = append(problems, fmt.Sprintf("%s partition %d lacks the record of %s at broker time %d at its end", topic, p, w.rec.Key, w.rec.Written))
		}
	}
	return &matched{byPart: byPart, mine: mine, misplaced: misplaced, misplacedAt: misplacedAt}, problems
}

// misplacedProblems names each misplaced record not copied exactly once
// to its customer's partition, and each not followed by exactly one
// delete marked moved (none after a delete).
func misplacedProblems(misplaced map[origin]*written, partitions int32) (problems []string) {
	for o, m := range misplaced {
		if m.copies != 1 {
			problems = append(problems, fmt.Sprintf("the record of %s written to partition %d at %d (offset %d) was not re-produced to its partition %d",
				m.rec.Key, o.partition, o.arrival, o.offset, schemas.Partition(schemas.CustomerKey(m.rec.Key), partitions)))
		}
		if want := min(1, len(m.value)); m.value == nil && m.marks != 0 || m.value != nil && m.marks != 1 {
			problems = append(problems, fmt.Sprintf("the record of %s written to partition %d at %d (offset %d) is followed there by %d deletes marked moved, want %d",
				m.rec.Key, o.partition, o.arrival, o.offset, m.marks, want))
		}
	}
	return problems
}

// sameValue reports whether two record values are the same (a delete
// only equals a delete).
func sameValue(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }

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
// its last change), and no balance of a customer as of an earlier time
// than the one before it (docs/entitlements.md, The aggregator, 4). It
// fails the test with every problem found.
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
		var problems []string
		for _, r := range testenv.ReadAll(t, brokers, names.BalancesTopic()) {
			var bl schemas.Balance
			if err := schemas.DecodeInto(r.Value, &bl); err != nil {
				t.Fatalf("%s %d/%d: %v", names.BalancesTopic(), r.Partition, r.Offset, err)
			}
			cur := last[bl.CustomerID]
			if cur != nil && bl.Revision > cur.Revision && bl.UpdatedAt < cur.UpdatedAt {
				problems = append(problems, fmt.Sprintf("balance of %s revision %d is as of %d, before revision %d's %d: it goes back in time",
					bl.CustomerID, bl.Revision, bl.UpdatedAt, cur.Revision, cur.UpdatedAt))
			}
			if cur == nil || bl.Revision > cur.Revision {
				last[bl.CustomerID] = &bl
			}
		}
		for c, got := range last {
			p := schemas.Partition(schemas.CustomerKey(c), ent.Partitions)
			if w := balanceOf(models[p], got); !reflect.DeepEqual(got, w) {
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
		t.Fatalf("the outputs disagree with the model of docs/design.md (Time) and docs/entitlements.md (%d events, %d accepted):\n  %s", len(events), len(accepted), strings.Join(problems, "\n  "))
	}
	t.Logf("the model agrees: %d events, %d accepted, rejected %v; %d keys, %d FINAL, %d adjustments, %d balances checked; copies of misplaced records %+v",
		len(events), len(accepted), rep.Rejected, rep.Keys, rep.Finals, rep.Adjustments, rep.Balances, inTopic.Copies)
	return rep
}

// balanceOf is the reference's balance of got's customer as of got's time
// and with its revision. Its caps_until is what the aggregator knew of
// the records it had read when it wrote got, which the topic does not
// say: the one of the first n records read, for the n that gives got's,
// if any does (the reference's by every record otherwise).
func balanceOf(m *entref.Model, got *schemas.Balance) *schemas.Balance {
	w := m.Balance(got.CustomerID, got.UpdatedAt, got.Revision)
	for n := m.Len(); n >= 0 && w.CapsUntil != got.CapsUntil; n-- {
		if m.BalanceRead(got.CustomerID, got.UpdatedAt, got.Revision, n).CapsUntil == got.CapsUntil {
			w.CapsUntil = got.CapsUntil
		}
	}
	return w
}
