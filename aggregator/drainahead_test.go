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
	waitGated := func(want float64) { t.Helper(); waitGatedRecords(t, reg, want) }
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

// TestEntitlementsGateForgetsWithinTransaction: a record that enters the
// gate and leaves it in the same transaction leaves no changelog record
// (stream.Tx.Forget); one that entered in an earlier, committed
// transaction is deleted with a tombstone. The first run (transactions of
// 20ms) gates 50 events and commits them before the tick that lets them
// through; the second (one transaction) gates 50 more that arrived after
// the first tick, and lets them through when a second tick comes in the
// same transaction. Without the Forget, the second run's 50 would each
// leave a tombstone. Every event is counted once.
func TestEntitlementsGateForgetsWithinTransaction(t *testing.T) {
	h := newEntHarness(t, nil, 1)
	t1 := time.Date(2026, 11, 10, 0, 0, 10, 0, time.UTC).UnixMilli()
	t2 := t1 + 10_000
	events := func(from int, at int64) []*kgo.Record {
		var recs []*kgo.Record
		for i := from; i < from+50; i++ {
			recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprintf("e-%03d", i), CustomerID: "acme",
				Meter: "api_calls", Quantity: 1, EventTime: at, IngestTime: at}))
		}
		return recs
	}
	tick := func(at int64) *kgo.Record {
		return &kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: 0, Key: []byte(schemas.TickKey),
			Value: schemas.MustEncode(&schemas.Tick{InstanceID: "test"}), Timestamp: time.UnixMilli(at)}
	}
	gateRecords := func() (puts, tombstones map[string]int) {
		puts, tombstones = map[string]int{}, map[string]int{}
		for _, r := range testenv.ReadAll(t, h.brokers, h.names.AggregateChangelogTopic()) {
			if len(r.Key) > 0 && r.Key[0] == pfxGate {
				if r.Value == nil {
					tombstones[string(r.Key)]++
				} else {
					puts[string(r.Key)]++
				}
			}
		}
		return puts, tombstones
	}
	fs := vfs.NewMem()
	run1 := func(reg *prometheus.Registry, commit time.Duration) *aggRunning {
		cfg := h.entConfig("a", fs)
		cfg.EntitlementsTick = -1
		cfg.Stream.CommitInterval = commit
		cfg.Stream.TransactionTimeout = time.Minute
		cfg.Stream.Registerer = reg
		return h.start(cfg)
	}
	waitGated := func(reg *prometheus.Registry, want float64) { t.Helper(); waitGatedRecords(t, reg, want) }

	// First run: 50 events gated and committed, then let through.
	h.produce(events(0, t1)...)
	reg := prometheus.NewRegistry()
	run := run1(reg, 20*time.Millisecond)
	waitGated(reg, 50)
	deadline := time.Now().Add(30 * time.Second)
	for puts, _ := gateRecords(); len(puts) < 50; puts, _ = gateRecords() {
		if time.Now().After(deadline) {
			t.Fatalf("%d gate records committed, want 50", len(puts))
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.produce(tick(t1 + 1))
	waitGated(reg, 0)
	h.caughtUp()
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	puts, tombstones := gateRecords()
	if len(puts) != 50 || len(tombstones) != 50 {
		t.Fatalf("first run: %d gate keys written and %d deleted, want 50 and 50", len(puts), len(tombstones))
	}

	// Second run: one transaction gates 50 events and lets them through.
	reg = prometheus.NewRegistry()
	run = run1(reg, 30*time.Second)
	h.produce(events(50, t2)...)
	waitGated(reg, 50)
	h.produce(tick(t2 + 1))
	waitGated(reg, 0)
	if err := run.stop(); err != nil { // commits the open transaction
		t.Fatal(err)
	}
	puts2, tombstones2 := gateRecords()
	if n, d := len(puts2)-len(puts), len(tombstones2)-len(tombstones); n != 0 || d != 0 {
		t.Errorf("second run: %d gate records written and %d deleted, want none: gated and released in one transaction", n, d)
	}
	for k, n := range puts2 {
		if n != 1 || tombstones2[k] != 1 {
			t.Errorf("gate key %x: %d puts and %d tombstones, want one of each", k, n, tombstones2[k])
		}
	}
	if v := openValues(t, h)["acme/api_calls"]; v != 100 {
		t.Errorf("OPEN value %d, want 100 api_calls of acme", v)
	}
}

// TestEntitlementsStartReadsEntitlementsFirst: a stage starting on a
// backlog reads its entitlements partition before the records of
// usage.deduped in the same fetch (stream: co-partitioned topics first in
// every fetch request), so that events whose arrival the partition has
// been read past never wait in the gate. 3,000 events wait behind a tick
// written after their arrival; transactions of 500 records. Without the
// order, the first polls take events only, gate them and commit them to
// the changelog, and delete them again once the tick is read.
func TestEntitlementsStartReadsEntitlementsFirst(t *testing.T) {
	h := newEntHarness(t, nil, 1)
	t1 := time.Date(2026, 11, 10, 0, 0, 10, 0, time.UTC).UnixMilli()
	var recs []*kgo.Record
	for i := range 3000 {
		recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprintf("e-%04d", i), CustomerID: "acme",
			Meter: "api_calls", Quantity: 1, EventTime: t1, IngestTime: t1}))
	}
	recs = append(recs, &kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: 0, Key: []byte(schemas.TickKey),
		Value: schemas.MustEncode(&schemas.Tick{InstanceID: "test"}), Timestamp: time.UnixMilli(t1 + 1)})
	h.produce(recs...)
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.EntitlementsTick = -1
	cfg.Stream.MaxBatchRecords = 500
	run := h.start(cfg)
	h.caughtUp()
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	gated := 0
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.AggregateChangelogTopic()) {
		if len(r.Key) > 0 && r.Key[0] == pfxGate {
			gated++
		}
	}
	if gated != 0 {
		t.Errorf("%d gate records in the changelog, want none: the events were read before the tick", gated)
	}
	if v := openValues(t, h)["acme/api_calls"]; v != 3000 {
		t.Errorf("OPEN value %d, want 3000", v)
	}
}

// waitGatedRecords waits until partition 0's gate holds want records.
func waitGatedRecords(t *testing.T, reg *prometheus.Registry, want float64) {
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
