package aggregator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestPartitionCountChangeStops: the aggregator records the partition
// counts of usage.deduped and usage.entitlements in its state, and when
// partitions were added to them (and to its changelog, so that the
// start-up check that they are equal passes) it stops with an error that
// names the counts before and after, before it decides anything: its
// customers would be routed to other partitions than their caps and
// credits.
func TestPartitionCountChangeStops(t *testing.T) { testPartitionCountChange(t, nil) }

func TestRealPartitionCountChangeStops(t *testing.T) {
	testPartitionCountChange(t, testenv.RealKafka(t))
}

func testPartitionCountChange(t *testing.T, brokers []string) {
	const n = 2
	h := newEntHarness(t, brokers, n)
	day := ms(t, "2026-11-10")
	ev := func(id string) *schemas.DedupedEvent {
		return &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "api_calls", Quantity: 1, EventTime: day + 1000, IngestTime: day + 2000}
	}
	acme := schemas.Partition(schemas.CustomerKey("acme"), n)
	h.produce(h.dedupedEvent(acme, ev("e1")))
	fs := vfs.NewMem()
	run := h.start(h.entConfig("a", fs))
	h.caughtUp()
	awaitDecided(t, h, 1)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	adm := testenv.Admin(t, h.brokers)
	if _, err := adm.CreatePartitions(context.Background(), 1, h.names.DedupedTopic(), h.names.EntitlementsTopic(),
		h.names.AggregateChangelogTopic()); err != nil {
		t.Fatal(err)
	}
	h.produce(h.dedupedEvent(acme, ev("e2")))
	before := len(readAggregates(t, h))
	run = h.start(h.entConfig("a", fs))
	select {
	case <-run.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the aggregator runs after partitions were added to its input topics")
	}
	if !errors.Is(run.err, ErrPartitionCountChanged) {
		t.Fatalf("Run = %v, want ErrPartitionCountChanged", run.err)
	}
	t.Log(run.err)
	for _, s := range []string{fmt.Sprintf("%d partitions of %s and %d of %s", n, h.names.DedupedTopic(), n, h.names.EntitlementsTopic()),
		fmt.Sprintf("now have %d and %d", n+1, n+1)} {
		if !strings.Contains(run.err.Error(), s) {
			t.Errorf("the error does not say %q", s)
		}
	}
	if after := len(readAggregates(t, h)); after != before {
		t.Errorf("%d aggregates written after the partition count changed", after-before)
	}
}

// TestPartitionCountsRecorded: state that does not record the partition
// counts (new, or built before they were recorded) is taken and records
// them in its next transaction; state recording usage.deduped's only gets
// usage.entitlements' when entitlements are on; other counts are refused.
func TestPartitionCountsRecorded(t *testing.T) {
	count := func(ns ...uint32) []byte {
		var b []byte
		for _, n := range ns {
			b = binary.BigEndian.AppendUint32(b, n)
		}
		return b
	}
	scheme := string(keyKeyScheme)
	ledger, err := entitlements.New(entitlements.Config{Prefix: []byte{pfxLedger}, Window: 35 * 24 * time.Hour, Period: Month.Bounds})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		ent     bool
		st      mapState
		refused bool
		write   bool
	}{
		{"new state", true, mapState{}, false, true},
		{"state from before the counts", false, mapState{scheme: []byte(schemas.DedupedKeyScheme)}, false, true},
		{"same count", false, mapState{scheme: []byte(schemas.DedupedKeyScheme), "N": count(4)}, false, false},
		{"same counts", true, mapState{scheme: []byte(schemas.DedupedKeyScheme), "N": count(4, 4), "m": []byte(entModeOn)}, false, false},
		{"entitlements turned on", true, mapState{scheme: []byte(schemas.DedupedKeyScheme), "N": count(4)}, false, true},
		{"entitlements turned off", false, mapState{scheme: []byte(schemas.DedupedKeyScheme), "N": count(4, 4)}, false, false},
		{"deduped changed", false, mapState{scheme: []byte(schemas.DedupedKeyScheme), "N": count(2)}, true, false},
		{"entitlements changed", true, mapState{scheme: []byte(schemas.DedupedKeyScheme), "N": count(4, 2), "m": []byte(entModeOn)}, true, false},
		{"corrupt", false, mapState{scheme: []byte(schemas.DedupedKeyScheme), "N": count(4)[:3]}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := &processor{counts: partitionCountsT{events: 1, deduped: 4, entitlements: 4}}
			if tc.ent {
				pr.ledger = ledger
			}
			pt := &partition{pr: pr}
			err := pt.checkPartitionCounts(tc.st)
			switch {
			case tc.refused && err == nil:
				t.Fatal("taken, want refused")
			case !tc.refused && err != nil:
				t.Fatalf("refused: %v", err)
			}
			t.Log(err)
			if pt.writeCounts != tc.write {
				t.Errorf("writeCounts %v, want %v", pt.writeCounts, tc.write)
			}
		})
	}
}
