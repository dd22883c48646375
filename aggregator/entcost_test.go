package aggregator

import (
	"bytes"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// benchRejected is the input of BenchmarkRejectedRecord: a record of
// usage.deduped as bench aggregate writes it (keyed by customer), and its
// decoded event.
func benchRejected(b testing.TB) (*partition, *kgo.Record, *schemas.DedupedEvent) {
	b.Helper()
	e := &schemas.DedupedEvent{EventID: "bench-123456", CustomerID: "cust-01234", Meter: "api_calls",
		Quantity: 57, EventTime: 1_790_000_000_000, IngestTime: 1_790_000_000_100, Source: "bench",
		Properties: []schemas.Property{{Name: "region", Value: "eu-west-1"}, {Name: "user", Value: "user-6"}}}
	v, err := schemas.Encode(e)
	if err != nil {
		b.Fatal(err)
	}
	r := &kgo.Record{Topic: "usage.deduped.v2", Partition: 3, Offset: 123456, Timestamp: time.UnixMilli(e.IngestTime),
		Key: schemas.CustomerKey(e.CustomerID), Value: v}
	names := topics.DefaultNames()
	names.Prefix = "bench."
	pr := &processor{cfg: Config{Topics: names}, counts: partitionCountsT{rejected: 16}, log: zap.NewNop()}
	return &partition{pr: pr, p: 3}, r, e
}

// BenchmarkRejectedRecord is what an over_limit rejection costs the
// aggregator before the producer: its usage.rejected record, encoded.
func BenchmarkRejectedRecord(b *testing.B) {
	pt, r, e := benchRejected(b)
	detail := "api_calls: usage in the period 1900 + 1 would pass the cap 1900 of plan \"bench\""
	b.ReportAllocs()
	for b.Loop() {
		if _, err := pt.rejectedRecord(r, e, schemas.ReasonOverLimit, detail); err != nil {
			b.Fatal(err)
		}
		pt.rej = schemas.Rejected{}
	}
}

// TestRejectedRecordAllocs: a rejection's record of usage.rejected costs
// one allocation (its key and value) and is, byte for byte, the record
// hamba's encoding of the bounded Rejected makes; the scratch Rejected
// keeps nothing between two.
func TestRejectedRecordAllocs(t *testing.T) {
	pt, r, e := benchRejected(t)
	detail := "api_calls: usage in the period 1900 + 57 would pass the cap 1900 of plan \"bench\""
	rec, err := pt.rejectedRecord(r, e, schemas.ReasonOverLimit, detail)
	if err != nil {
		t.Fatal(err)
	}
	want := &schemas.Rejected{Reason: schemas.ReasonOverLimit, Detail: detail, Stage: "aggregator",
		SourceTopic: r.Topic, SourcePartition: r.Partition, SourceOffset: r.Offset, SourceTimestamp: r.Timestamp.UnixMilli(),
		CustomerID: e.CustomerID, Meter: e.Meter, EventID: e.EventID, RawKey: r.Key, RawValue: r.Value}
	want.Bound()
	v, err := schemas.Encode(want)
	if err != nil {
		t.Fatal(err)
	}
	key := schemas.Identity{CustomerID: e.CustomerID, Meter: e.Meter, EventID: e.EventID}.AppendKey(nil)
	if rec.Topic != "bench.usage.rejected" || !bytes.Equal(rec.Key, key) || !bytes.Equal(rec.Value, v) ||
		rec.Partition != schemas.Partition(key, pt.pr.counts.rejected) {
		t.Fatalf("record %s/%d %q %x, want bench.usage.rejected %q %x", rec.Topic, rec.Partition, rec.Key, rec.Value, key, v)
	}
	pt.rej = schemas.Rejected{}
	if n := testing.AllocsPerRun(200, func() {
		if _, err := pt.rejectedRecord(r, e, schemas.ReasonOverLimit, detail); err != nil {
			t.Fatal(err)
		}
		pt.rej = schemas.Rejected{}
	}); n > 1 {
		t.Errorf("a rejected record: %v allocations, want 1", n)
	}
}

// TestEntMetricsRunsInterleaved: rejections between accepted events of
// one plan are counted in runs, not in the maps, until they are read
// (fold), and then in full.
func TestEntMetricsRunsInterleaved(t *testing.T) {
	var m entMetrics
	for i := range 100 {
		m.add("accepted", "bench", 3)
		if i%7 == 0 {
			m.add(schemas.ReasonOverLimit, "bench", 0)
		}
	}
	if len(m.decisions) != 0 || len(m.credits) != 0 {
		t.Fatalf("decisions %v credits %v before fold, want none", m.decisions, m.credits)
	}
	m.fold()
	if got, want := fmt.Sprint(m.decisions, m.credits), "map[[accepted bench]:100 [over_limit bench]:15] map[bench:300]"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// TestLargeRecordsOutsideTheSlab: a record larger than slabMaxBytes is
// allocated alone, so that the slab of small records, alive while any of
// them is, never keeps a large value reachable after it was acknowledged.
func TestLargeRecordsOutsideTheSlab(t *testing.T) {
	pt := &partition{}
	small := make([]byte, 100)
	first := pt.newRecord(nil, small)
	big := pt.newRecord([]byte("k"), make([]byte, slabMaxBytes))
	next := pt.newRecord(nil, small)
	slab := unsafe.Slice(first, recSlab)
	for i := range slab {
		if &slab[i] == big {
			t.Fatalf("a record of %d bytes is slot %d of the slab", len(big.Key)+len(big.Value), i)
		}
	}
	if next != &slab[1] || string(big.Key) != "k" || len(big.Value) != slabMaxBytes || len(first.Value) != 100 {
		t.Errorf("records: the small ones not in turn from one slab, or keys and values not kept")
	}
}
