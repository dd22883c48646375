package aggcrashtest

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/testenv/crash"
	"github.com/meterline/meterline/internal/testenv/oracle"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// TestIdlePartition runs the real `meterline dedup` and `meterline
// aggregate` together on real topics (usage.events with LogAppendTime:
// arrival is the broker's "now"). Events go to only some usage.events
// partitions, and land in only some usage.deduped partitions. After the
// last event nothing but dedup's ticks reaches the brokers, yet:
//
//   - every aggregator partition's watermark passes the period's end +
//     grace, including the partitions that received no event at all, and
//     although two of the four source partitions never saw an event (their
//     watermarks come from ticks alone);
//   - the period is finalized: exactly one FINAL per key, exact values.
//
// To finish in about half a minute with real arrival times, the period is
// the previous hour [H−1h, H) (events have event times in it) and the grace
// is chosen so that end + grace = H + grace is about 25 s from now: the
// events arrive on time, and only the ticks of the next 25 s can finalize.
func TestIdlePartition(t *testing.T) {
	s := newSuite(t) // usage.events: LogAppendTime
	now := time.Now().UTC()
	h := now.Truncate(time.Hour)
	grace := (now.Sub(h) + 25*time.Second).Truncate(time.Second) + time.Second
	cutoff := h.Add(grace) // end + grace of [h−1h, h)
	t.Logf("period [%s, %s), grace %s: final once the watermark passes %s", h.Add(-time.Hour).Format(time.RFC3339), h.Format(time.RFC3339), grace, cutoff.Format(time.RFC3339))

	d := s.Stage("dedup", "d", filepath.Join(s.Dir, "dedup-state"), crash.StageOpts{}) // ticks every 500 ms
	a := s.startAgg("a", filepath.Join(s.Dir, "agg-state"), aggOpts{period: "hour", grace: grace.String()})

	// Events only in usage.events partitions 0 and 1, for two customers
	// whose aggregates land in one or two usage.deduped partitions.
	p, err := producer.New(producer.WithBrokers(s.Brokers...), producer.WithTopic(s.Names.EventsTopic()), producer.WithLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	custs := []string{"idle-acme", "idle-globex"}
	aggParts := map[int32]bool{}
	sent := 0
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; sent < 40; i++ {
		c := custs[i%2]
		e := producer.Event{EventID: fmt.Sprintf("idle-%d", i), CustomerID: c, Meter: "s", Quantity: int64(i%7 + 1),
			EventTime: h.Add(-time.Hour + time.Duration(i)*time.Minute/2), Properties: map[string]string{"region": "eu"}}
		if schemas.Partition(e.Key(), partitions) > 1 {
			continue
		}
		if err := p.Send(ctx, e); err != nil {
			t.Fatal(err)
		}
		aggParts[schemas.Partition(schemas.CustomerKey(c), partitions)] = true
		sent++
	}
	if len(aggParts) == partitions {
		t.Fatal("every usage.deduped partition got events; choose other customers")
	}
	t.Logf("%d events sent to usage.events partitions 0–1; they land in usage.deduped partitions %v", sent, aggParts)

	// Wait until every aggregator partition's watermark passed the cutoff.
	deadline := time.Now().Add(grace + 90*time.Second)
	var wms map[int32]float64
	for {
		if a.Exited() || d.Exited() {
			t.Fatalf("a stage exited: aggregate %s, dedup %s\n%s\n%s", a.ExitString(), d.ExitString(), a.Tail(20), d.Tail(20))
		}
		m, err := a.Metrics()
		wms = map[int32]float64{}
		if err == nil {
			for p := int32(0); p < partitions; p++ {
				if v, ok := m[fmt.Sprintf(`meterline_aggregate_watermark_seconds{partition="%d"}`, p)]; ok {
					wms[p] = v
				}
			}
		}
		passed := 0
		for _, v := range wms {
			if int64(v*1000) > cutoff.UnixMilli() {
				passed++
			}
		}
		if passed == partitions {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("aggregator watermarks %v (seconds) did not all pass %s", wms, cutoff.Format(time.RFC3339))
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("every aggregator partition's watermark passed the cutoff: %v", wms)
	s.WaitCaughtUp(s.Group("dedup"), s.Names.EventsTopic(), d)
	s.waitCaughtUp(a)

	// The model's events are what dedup forwarded, with their broker
	// arrival times.
	var onTime, late int
	for _, r := range testenv.ReadAll(t, s.Brokers, s.Names.DedupedTopic()) {
		if k, _ := schemas.PeekKind(r.Value); k != schemas.KindDedupedEvent {
			continue
		}
		var e schemas.DedupedEvent
		if err := schemas.DecodeInto(r.Value, &e); err != nil {
			t.Fatal(err)
		}
		if e.SourcePartition > 1 {
			t.Errorf("event %s came from usage.events partition %d", e.EventID, e.SourcePartition)
		}
		if e.IngestTime <= cutoff.UnixMilli() {
			onTime++
		} else {
			late++
		}
		s.events = append(s.events, &oracle.Event{ID: e.EventID, Customer: e.CustomerID, Meter: e.Meter, Quantity: e.Quantity,
			EventTime: e.EventTime, Arrival: e.IngestTime, Properties: schemas.PropertyMap(e.Properties)})
	}
	if len(s.events) != sent || late > 0 {
		t.Fatalf("usage.deduped holds %d events (%d on time, %d late), want all %d on time: the machine was too slow for the chosen grace", len(s.events), onTime, late, sent)
	}
	res := s.check(oracle.Hour, grace.Milliseconds())
	if res.Finals != len(custs) {
		t.Fatalf("%d FINAL aggregates, want %d (one per customer)", res.Finals, len(custs))
	}
}
