package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsGateDrainsAhead: a stage whose gate holds ready records
// lets them through ahead of the records it reads next, so that those skip
// the gate instead of being written to the state (and the changelog) and
// deleted again. 300 events wait for a tick that never comes (no ticks of
// the stage's own); then a tick past their arrival comes with 300 more
// events that arrived at the same time. The tick's transaction lets 100
// through (FinalChunk); without draining ahead, the 300 new events would
// queue behind the other 200, and the changelog would carry about 600
// gate records instead of about 300. Every event is counted once either
// way.
func TestEntitlementsGateDrainsAhead(t *testing.T) {
	h := newEntHarness(t, nil, 1)
	t1 := time.Date(2026, 11, 10, 0, 0, 10, 0, time.UTC).UnixMilli()
	events := func(from int) []*kgo.Record {
		var recs []*kgo.Record
		for i := from; i < from+300; i++ {
			recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprintf("e-%03d", i), CustomerID: "acme",
				Meter: "api_calls", Quantity: 1, EventTime: t1, IngestTime: t1}))
		}
		return recs
	}
	h.produce(events(0)...)
	reg := prometheus.NewRegistry()
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.EntitlementsTick = -1
	cfg.FinalChunk = 100
	cfg.Stream.Registerer = reg
	run := h.start(cfg)
	defer run.stop()
	waitGated := func(want float64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			if v, _ := gaugeOf(reg, "meterline_aggregate_gated_records", "partition", "0"); v == want {
				return
			}
			if time.Now().After(deadline) {
				v, _ := gaugeOf(reg, "meterline_aggregate_gated_records", "partition", "0")
				t.Fatalf("%v records gated, want %v", v, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitGated(300)
	tick := &kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: 0, Key: []byte(schemas.TickKey),
		Value: schemas.MustEncode(&schemas.Tick{InstanceID: "test"}), Timestamp: time.UnixMilli(t1 + 1)}
	h.produce(append([]*kgo.Record{tick}, events(300)...)...)
	h.caughtUp()
	waitGated(0)
	deadline := time.Now().Add(30 * time.Second)
	for openValues(t, h)["acme/api_calls"] != 600 {
		if time.Now().After(deadline) {
			t.Fatalf("OPEN values %v, want 600 api_calls of acme", openValues(t, h))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	puts := 0
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.AggregateChangelogTopic()) {
		if len(r.Key) > 0 && r.Key[0] == pfxGate && r.Value != nil {
			puts++
		}
	}
	t.Logf("%d records written to the gate for 600 events", puts)
	if puts > 400 {
		t.Errorf("%d records written to the gate, want about 300: the new events queued behind ready ones", puts)
	}
}
