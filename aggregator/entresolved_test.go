package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/benchinput"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// TestResolvedFollowsEntitlements: what a partition keeps resolved for a
// customer in its entry of accounts (its own plans, the default plan's,
// the rate card) is dropped when a record changes any of them, in the
// open transaction and across a commit: each event is decided by the
// records read before it. The customer's events alternate with records
// that change its decision: its own plan capping api_calls at 1 (it has
// 2 by then), a tombstone of it, a default plan capping them at 1, the
// bench plan again, a rate card pricing them past its grant.
func TestResolvedFollowsEntitlements(t *testing.T) {
	in, err := procBenchInput()
	if err != nil {
		t.Fatal(err)
	}
	l, err := stream.NewLocal(procBenchProcessor(t, in.names, true), 0, in.names.DedupedTopic())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Process(in.ent[:2]); err != nil { // the bench plan and rate card
		t.Fatal(err)
	}
	cust := ""
	for i := 0; cust == ""; i++ {
		if c := fmt.Sprintf("c%d", i); schemas.Partition(schemas.CustomerKey(c), procBenchPartitions) == 0 {
			cust = c
		}
	}
	now := procBenchNow
	entOff, evOff := int64(len(in.ent)), int64(0)
	ent := func(key []byte, m schemas.Message, at time.Time) {
		t.Helper()
		var v []byte
		if m != nil {
			v = schemas.MustEncode(m)
		}
		if err := l.Process([]*kgo.Record{{Topic: in.names.EntitlementsTopic(), Offset: entOff, Key: key, Value: v, Timestamp: at}}); err != nil {
			t.Fatal(err)
		}
		entOff++
	}
	wm := schemas.MustEncode(&schemas.Watermark{SourcePartition: 0, SourcePartitions: 1, Watermark: now.Add(-time.Hour).UnixMilli()})
	if err := l.Process([]*kgo.Record{{Topic: in.names.DedupedTopic(), Offset: evOff, Value: wm, Timestamp: now}}); err != nil {
		t.Fatal(err)
	}
	evOff++
	// decide sends two api_calls events of cust arriving at at, and
	// checks how many were rejected.
	decide := func(at time.Time, step string, rejected int) {
		t.Helper()
		before := l.Emitted(in.names.RejectedTopic())
		for range 2 {
			e := &schemas.DedupedEvent{EventID: fmt.Sprint("e", evOff), CustomerID: cust, Meter: "api_calls", Quantity: 1,
				EventTime: at.UnixMilli() - 1, IngestTime: at.UnixMilli(), Source: "test",
				Properties: []schemas.Property{{Name: "region", Value: "eu-west-1"}}}
			r := &kgo.Record{Topic: in.names.DedupedTopic(), Offset: evOff, Key: schemas.CustomerKey(cust), Value: schemas.MustEncode(e), Timestamp: at}
			evOff++
			if err := l.Process([]*kgo.Record{r}); err != nil {
				t.Fatal(err)
			}
		}
		// A tick after them lets them through the gate.
		ent([]byte(schemas.TickKey), &schemas.Tick{InstanceID: "test"}, at.Add(time.Millisecond))
		if got := l.Emitted(in.names.RejectedTopic()) - before; got != rejected {
			t.Fatalf("%s: %d of 2 events rejected, want %d", step, got, rejected)
		}
	}
	capped := func(customer string) *schemas.Entitlements {
		p := benchinput.Plan()
		p.CustomerID, p.Plan, p.Caps[0].Limit = customer, "capped", 1
		return p
	}
	at := now.Add(time.Second)
	step := func() time.Time { at = at.Add(10 * time.Second); return at }
	decide(step(), "the bench plan", 0)
	ent(schemas.CustomerKey(cust), capped(cust), step())
	decide(step(), "its own plan capping api_calls at 1", 2)
	if err := l.Commit(); err != nil {
		t.Fatal(err)
	}
	decide(step(), "its own plan, after a commit", 2)
	ent(schemas.CustomerKey(cust), nil, step())
	decide(step(), "its own plan deleted", 0)
	ent([]byte(schemas.DefaultPlanKey), capped(""), step())
	decide(step(), "a default plan capping api_calls at 1", 2)
	ent([]byte(schemas.DefaultPlanKey), benchinput.Plan(), step())
	decide(step(), "the bench plan again", 0)
	rates := benchinput.Rates()
	rates.Versions[0].Rates[0].MicroCredits = 2_000_000
	ent([]byte(schemas.RateCardKey), rates, step())
	decide(step(), "a rate card pricing api_calls past the grant", 2)
}

// TestHeldLinkDroppedWithAccounts: an OPEN aggregate's link to its
// customer's entry of accounts (openAgg.held) is not followed once the
// entry has left accounts. The default plan caps api_calls at 3. A
// customer's first api_calls event (region eu-west-1) is accepted and
// committed; then more than maxAccounts other customers' events, each
// over the cap (rejected: no aggregate, no change), make accounts sweep
// its unchanged entries, the customer's among them. Its next three
// api_calls events, one of us-east-1 (a new aggregate, a new entry read
// from the state) and two of eu-west-1 (the aggregate linked to the entry
// swept), see the usage of one another: the last one is over the cap.
func TestHeldLinkDroppedWithAccounts(t *testing.T) {
	names := topics.DefaultNames()
	l, err := stream.NewLocal(procBenchProcessor(t, names, true), 0, names.DedupedTopic())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	now := procBenchNow
	plan := benchinput.Plan()
	plan.Caps[0].Limit = 3
	tick := func(off int64, at time.Time) *kgo.Record {
		return &kgo.Record{Topic: names.EntitlementsTopic(), Offset: off, Key: []byte(schemas.TickKey),
			Value: schemas.MustEncode(&schemas.Tick{InstanceID: "test"}), Timestamp: at}
	}
	at := now.Add(time.Second)
	if err := l.Process([]*kgo.Record{{Topic: names.EntitlementsTopic(), Offset: 0, Key: []byte(schemas.DefaultPlanKey),
		Value: schemas.MustEncode(plan), Timestamp: now.Add(-time.Minute)}, tick(1, at.Add(time.Millisecond))}); err != nil {
		t.Fatal(err)
	}
	evOff := int64(0)
	record := func(v []byte, key []byte) *kgo.Record {
		r := &kgo.Record{Topic: names.DedupedTopic(), Offset: evOff, Key: key, Value: v, Timestamp: at}
		evOff++
		return r
	}
	event := func(cust, region string, quantity int64) *kgo.Record {
		return record(schemas.MustEncode(&schemas.DedupedEvent{EventID: fmt.Sprint("e", evOff), CustomerID: cust, Meter: "api_calls",
			Quantity: quantity, EventTime: at.UnixMilli() - 1, IngestTime: at.UnixMilli(), Source: "test",
			Properties: []schemas.Property{{Name: "region", Value: region}}}), schemas.CustomerKey(cust))
	}
	process := func(recs []*kgo.Record) {
		t.Helper()
		if err := l.Process(recs); err != nil {
			t.Fatal(err)
		}
	}
	// Customers of partition 0: the target, then the others.
	var custs []string
	for i := 0; len(custs) <= maxAccounts+1; i++ {
		if c := fmt.Sprintf("c%d", i); schemas.Partition(schemas.CustomerKey(c), procBenchPartitions) == 0 {
			custs = append(custs, c)
		}
	}
	target := custs[0]
	wm := schemas.MustEncode(&schemas.Watermark{SourcePartition: 0, SourcePartitions: 1, Watermark: now.Add(-time.Hour).UnixMilli()})
	process([]*kgo.Record{record(wm, nil), event(target, "eu-west-1", 1)})
	if err := l.Commit(); err != nil {
		t.Fatal(err)
	}
	rejected := l.Emitted(names.RejectedTopic())
	if rejected != 0 {
		t.Fatalf("%d events rejected, want none", rejected)
	}
	var batch []*kgo.Record
	for _, c := range custs[1:] {
		if batch = append(batch, event(c, "eu-west-1", 4)); len(batch) == 5_000 {
			process(batch)
			batch = batch[:0]
		}
	}
	process(batch)
	if got := l.Emitted(names.RejectedTopic()) - rejected; got != len(custs)-1 {
		t.Fatalf("%d of the other customers' %d events rejected, want all", got, len(custs)-1)
	}
	rejected = l.Emitted(names.RejectedTopic())
	process([]*kgo.Record{event(target, "us-east-1", 1), event(target, "eu-west-1", 1)})
	if got := l.Emitted(names.RejectedTopic()) - rejected; got != 0 {
		t.Fatalf("%d of the customer's events 2 and 3 rejected, want none (usage 3, the cap)", got)
	}
	process([]*kgo.Record{event(target, "eu-west-1", 1)})
	if got := l.Emitted(names.RejectedTopic()) - rejected; got != 1 {
		t.Fatalf("the customer's 4th event: %d rejected, want 1 (usage 4 would pass the cap of 3): "+
			"a decision read an entry of accounts no longer kept", got)
	}
	if err := l.Commit(); err != nil {
		t.Fatal(err)
	}
}
