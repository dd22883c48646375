package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/benchinput"
	"github.com/meterline/meterline/internal/stream"
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
