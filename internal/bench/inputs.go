package bench

import (
	"bufio"
	"fmt"
	"os"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/benchinput"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// The inputs of the benchmarks. Each is a function of its parameters and
// of now alone, so that two binaries (or two runs) measure the same input
// shifted in time: scripts/bench-ab.sh compares binaries on it. Changing
// an input changes what every earlier number measured.

var meters = []string{"api_calls", "tokens", "storage_bytes", "compute_ms", "egress_bytes"}

// produceEvent is event i of bench produce's input.
func produceEvent(i, customers int, now time.Time) producer.Event {
	return producer.Event{
		EventID:    producer.EventID("bench", fmt.Sprint(i)),
		CustomerID: fmt.Sprintf("cust-%05d", i%customers),
		Meter:      meters[i%len(meters)],
		Quantity:   int64(1 + i%100),
		EventTime:  now.Add(-30 * time.Minute).Add(time.Duration(i%1_000_000) * time.Millisecond),
		Source:     "bench",
		Properties: map[string]string{"region": []string{"eu-west-1", "us-east-1"}[i%2]},
	}
}

// writeProduceEvents writes bench produce's input, n NDJSON events, to
// path.
func writeProduceEvents(path string, n, customers int, now time.Time) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	for i := 0; i < n; i++ {
		e := produceEvent(i, customers, now)
		b, err := e.MarshalJSON()
		if err != nil {
			return err
		}
		w.Write(b)
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// dedupInput is bench dedup's input: n events, of which a share rate
// are exact copies of earlier ones (every 1/rate-th event repeats an
// earlier one).
type dedupInput struct {
	n    int
	rate float64
	now  time.Time
}

// each calls f with every event in order and returns the number of unique
// events.
func (in dedupInput) each(f func(producer.Event) error) (unique int, err error) {
	every := 0
	if in.rate > 0 {
		every = int(1 / in.rate)
	}
	for i := 0; i < in.n; i++ {
		id := unique
		if every > 0 && i%every == every-1 && unique > 0 {
			id = (i * 7919) % unique // a copy of an earlier event
		} else {
			unique++
		}
		e := producer.Event{EventID: producer.EventID("bench", fmt.Sprint(id)), CustomerID: fmt.Sprintf("cust-%05d", id%10000),
			Meter: meters[id%5], Quantity: int64(1 + id%100),
			EventTime: in.now.Add(-time.Hour).Add(time.Duration(id%3_600_000) * time.Millisecond), Source: "bench"}
		if err := f(e); err != nil {
			return 0, err
		}
	}
	return unique, nil
}

// aggregateMeters are bench aggregate's five meters: every aggregation.
const aggregateMeters = benchinput.Meters

var aggregateMeterNames = benchinput.MeterNames

// aggregateEventSpread is how far before its arrival an event of bench
// aggregate's input can have its event_time (benchinput.EventSpread).
const aggregateEventSpread = benchinput.EventSpread

// aggregateEvent is event i of bench aggregate's input.
func aggregateEvent(i, customers int, now time.Time) *schemas.DedupedEvent {
	return aggregateEventOf(i, i%customers, customers, now)
}

// skewedAggregateEvent is event i of bench aggregate's skewed input: every
// other event is customer 0's (half of the input, in one partition of
// usage.deduped, docs/design.md, Topics); the others go round the remaining
// customers-1 (at least 2 customers).
func skewedAggregateEvent(i, customers int, now time.Time) *schemas.DedupedEvent {
	cust := 0
	if i%2 == 1 {
		cust = 1 + (i/2)%(customers-1)
	}
	return aggregateEventOf(i, cust, customers, now)
}

// aggregateEventOf is event i of customer cust, with aggregateEvent's
// meters, quantities and times.
func aggregateEventOf(i, cust, customers int, now time.Time) *schemas.DedupedEvent {
	return benchinput.Event(i, cust, customers, now)
}

// dedupedRecord places an event as dedup does: keyed and partitioned by
// customer (schemas.CustomerKey, docs/design.md, Topics).
func dedupedRecord(topic string, partitions int32, e *schemas.DedupedEvent) (*kgo.Record, error) {
	key := schemas.CustomerKey(e.CustomerID)
	v, err := schemas.Encode(e)
	if err != nil {
		return nil, fmt.Errorf("bench: encode event %s: %w", e.EventID, err)
	}
	return &kgo.Record{Topic: topic, Partition: schemas.Partition(key, partitions), Key: key, Value: v}, nil
}

// aggregateWatermarkEvery is how many events of bench aggregate's input
// come between two watermark records (one per partition, as dedup's ticks
// would write, with a watermark that finalizes nothing).
const aggregateWatermarkEvery = 100_000

// aggregateWatermark is the watermark record of bench aggregate's input:
// the bytes b9acd11 wrote, in the first Watermark schema
// (history/watermark.v0.avsc, before window_ms), so that every binary
// compared reads the same input (TestInputsAreTheSame). It claims one
// source partition, and bench aggregate's usage.events has one (specs):
// the aggregator applies it. It finalizes nothing.
func aggregateWatermark(now time.Time) ([]byte, error) {
	v0, err := avro.Parse(string(schemas.SchemaFiles()["history/watermark.v0.avsc"]))
	if err != nil {
		return nil, fmt.Errorf("bench: watermark schema v0: %w", err)
	}
	body, err := avro.Marshal(v0, map[string]any{"source_partition": int32(0), "source_partitions": int32(1),
		"watermark": now.UnixMilli() - int64(time.Hour/time.Millisecond)})
	if err != nil {
		return nil, fmt.Errorf("bench: encode watermark: %w", err)
	}
	fp, err := v0.FingerprintUsing(avro.CRC64AvroLE)
	if err != nil {
		return nil, fmt.Errorf("bench: watermark fingerprint: %w", err)
	}
	return append(append([]byte{0xC3, 0x01}, fp...), body...), nil
}

// sinkRecords are bench sink's input: n usage.deduped records spread
// round-robin over the partitions, their broker times a microsecond apart
// from start.
func sinkRecords(topic string, n, partitions, customers int, start time.Time) ([]*kgo.Record, error) {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		p := int32(i % partitions)
		ts := start.Add(time.Duration(i) * time.Microsecond)
		e := &schemas.DedupedEvent{
			EventID: schemas.EventID("bench", fmt.Sprint(i)), CustomerID: fmt.Sprintf("customer-%d", i%customers), Meter: "api_calls",
			Quantity: int64(i%100 + 1), EventTime: ts.UnixMilli(), Source: "bench",
			Properties: []schemas.Property{{Name: "model", Value: fmt.Sprint("m", i%4)}, {Name: "region", Value: "eu"}},
			IngestTime: ts.UnixMilli(), SourcePartition: p, SourceOffset: int64(i / partitions),
		}
		v, err := schemas.Encode(e)
		if err != nil {
			return nil, fmt.Errorf("bench: encode row %d: %w", i, err)
		}
		recs[i] = &kgo.Record{Topic: topic, Partition: p, Key: []byte(e.CustomerID + "/api_calls"), Value: v, Timestamp: ts}
	}
	return recs, nil
}
