package oracle

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/entitlements/entref"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// The copy rules of FromTopic (docs/entitlements.md, The aggregator, step
// 1) on a topic written by hand as an aggregator leaves it: a customer's
// records misplaced on the other partition, their copies on the
// customer's partition with the original's coordinates and broker time,
// stale copies followed by the record in effect restated, a record
// whose broker time stepped back behind a copy's origin, and the deletes
// marked moved after the misplaced records.
func TestFromTopicCopyRules(t *testing.T) {
	_, brokers := testenv.KFake(t)
	c := "acme"
	canon := schemas.Partition(schemas.CustomerKey(c), 2)
	wrong := 1 - canon
	plan := func(name string) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: c, Plan: name, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	}
	m1, m2, m3, n1, n2 := plan("m1"), plan("m2"), plan("m3"), plan("n1"), plan("n2")

	type rec struct {
		p     int32
		at    int64
		ent   *schemas.Entitlements
		from  string // headers: the origin's partition/offset, "" none
		claim int64  // headers: the origin's arrival
		moved string // a delete marked moved from this offset
	}
	at := func(ms int64) int64 { return day + ms }
	all := []rec{
		{p: wrong, at: at(1000), ent: m1},    // offset 0
		{p: wrong, at: at(3500), moved: "0"}, // 1: the delete after m1 moved
		{p: wrong, at: at(3000), ent: m2},    // 2
		{p: wrong, at: at(3600), moved: "2"}, // 3
		{p: wrong, at: at(2500), ent: m3},    // 4
		{p: wrong, at: at(3700), moved: "4"}, // 5
		{p: canon, at: at(2000), ent: n1},    // 0: applied
		// 1: the copy of m1, from before n1: not applied, n1 restated.
		{p: canon, at: at(4000), ent: m1, from: fmt.Sprintf("%d/0", wrong), claim: at(1000)},
		// 2: n1 restated, its own origin: changes nothing.
		{p: canon, at: at(4001), ent: n1, from: fmt.Sprintf("%d/0", canon), claim: at(2000)},
		// 3: the copy of m2, after n1: applied.
		{p: canon, at: at(4002), ent: m2, from: fmt.Sprintf("%d/2", wrong), claim: at(3000)},
		// 4: a broker clock that stepped back: applied, just after m2.
		{p: canon, at: at(1500), ent: n2},
		// 5: the copy of m3, from before n2 (3001): not applied, n2
		// restated with the origin it was given.
		{p: canon, at: at(4003), ent: m3, from: fmt.Sprintf("%d/4", wrong), claim: at(2500)},
		// 6: n2 restated.
		{p: canon, at: at(4004), ent: n2, from: fmt.Sprintf("%d/4", canon), claim: at(3001)},
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	write := func(recs []rec) (string, *Entitlements) {
		topic := testenv.Name(t, "usage.entitlements")
		testenv.CreateTopic(t, brokers, topic, 2, nil)
		ent := &Entitlements{Partitions: 2, Window: 3 * 24 * time.Hour}
		for _, r := range recs {
			kr := &kgo.Record{Topic: topic, Partition: r.p, Key: schemas.CustomerKey(c), Timestamp: time.UnixMilli(r.at)}
			if r.ent != nil {
				kr.Value = schemas.MustEncode(r.ent)
			}
			if r.moved != "" {
				kr.Headers = []kgo.RecordHeader{{Key: headerMoved, Value: []byte(r.moved)}}
			} else if r.from != "" {
				kr.Headers = []kgo.RecordHeader{{Key: headerRerouted, Value: []byte(r.from)}, {Key: headerArrival, Value: fmt.Append(nil, r.claim)}}
			} else {
				ent.Records = append(ent.Records, EntRecord{Partition: r.p, Record: entref.Record{Key: c, Written: r.at, Ent: r.ent}})
			}
			if err := cl.ProduceSync(context.Background(), kr).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		return topic, ent
	}

	// Wrong: no delete marked moved after m3; n1 not restated after the
	// stale copy of m1; the copy of m2 and n2 twice, so that n2's
	// restated record does not claim the origin due (n2's second, a
	// millisecond after its first).
	bad := append(append(append(append([]rec{}, all[:5]...), all[6:8]...), all[9:11]...), all[9:]...)
	topic, ent := write(bad)
	_, problems := ent.FromTopic(t, brokers, topic)
	for _, want := range []string{
		fmt.Sprintf("%s %d/7 (customer acme, broker time %d, origin {arrival:%d partition:%d offset:4}) is neither", topic, canon, at(4004), at(3001), canon),
		fmt.Sprintf("%s %d/4 (customer acme, broker time %d, origin {arrival:%d partition:%d offset:2}) is neither", topic, canon, at(4002), at(3000), wrong),
		fmt.Sprintf("the record of acme written to partition %d at %d (offset 4) is followed there by 0 deletes marked moved, want 1", wrong, at(2500)),
		fmt.Sprintf("%s partition %d lacks the record of acme of origin {arrival:%d partition:%d offset:0} restated", topic, canon, at(2000), canon),
	} {
		found := false
		for _, p := range problems {
			found = found || strings.HasPrefix(p, want)
		}
		if !found {
			t.Errorf("no problem %q among\n  %s", want, strings.Join(problems, "\n  "))
		}
	}

	topic, ent = write(all)
	got, problems := ent.FromTopic(t, brokers, topic)
	if len(problems) > 0 {
		t.Fatalf("problems:\n  %s", strings.Join(problems, "\n  "))
	}
	if got.Window != ent.Window {
		t.Errorf("window %s, want %s", got.Window, ent.Window)
	}
	if want := (struct{ Applied, Stale, Restated int }{1, 2, 2}); got.Copies != want {
		t.Errorf("copies %+v, want %+v", got.Copies, want)
	}
	var trace []string
	for _, r := range got.Records {
		if r.Partition != canon {
			continue
		}
		s := "skip"
		if !r.Skip {
			s = r.Ent.Plan
		}
		trace = append(trace, fmt.Sprintf("%s@%d", s, r.Written-day))
	}
	if g, w := strings.Join(trace, " "), "n1@2000 skip@4000 skip@4001 m2@4002 n2@1500 skip@4003 skip@4004"; g != w {
		t.Errorf("partition %d read as\n  %s\nwant\n  %s", canon, g, w)
	}
	_, models := got.Decide(&Model{Period: Day}, nil)
	if p := models[canon].PlanAt(c, at(10000)); p == nil || p.Plan != "n2" {
		t.Errorf("plan in effect %+v, want n2", p)
	}
}
