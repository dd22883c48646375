package aggregator

import (
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/benchinput"
	"github.com/meterline/meterline/schemas"
)

var procArriving struct {
	once sync.Once
	in   procInput
	err  error
}

// procArrivingInput is BenchmarkPartitionProcess's input with arrivals
// that advance through it, as the broker stamps them: the k-th of its n
// events arrives k × benchinput.EventSpread / n after the rate card's
// broker time (a millisecond after it, at the latest procBenchNow), so
// that most events of a customer arrive later than its one before.
func procArrivingInput() (procInput, error) {
	procArriving.once.Do(func() {
		in, err := procBenchInput()
		if err != nil {
			procArriving.err = err
			return
		}
		out := in
		out.events = make([]*kgo.Record, len(in.events))
		first := procBenchNow.Add(-benchinput.EventSpread)
		k := 0
		for i, r := range in.events {
			out.events[i] = r
			if r.Key == nil {
				continue // a watermark
			}
			var e schemas.DedupedEvent
			if err := schemas.DecodeInto(r.Value, &e); err != nil {
				procArriving.err = err
				return
			}
			at := first.Add(time.Duration(int64(benchinput.EventSpread) * int64(k) / int64(in.n)))
			k++
			e.IngestTime = at.UnixMilli()
			c := *r
			if c.Value, err = schemas.Encode(&e); err != nil {
				procArriving.err = err
				return
			}
			c.Timestamp = at
			out.events[i] = &c
		}
		procArriving.in = out
	})
	return procArriving.in, procArriving.err
}

// BenchmarkPartitionProcessArriving is BenchmarkPartitionProcess's "with"
// on procArrivingInput: the same decisions, with each customer's change
// time moving with its events (entPart.changed).
func BenchmarkPartitionProcessArriving(b *testing.B) {
	in, err := procArrivingInput()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		var c0 time.Duration
		l := runProcInput(b, in, true, func() { b.StartTimer(); c0 = processCPU(b) })
		cpu += processCPU(b) - c0
		b.StopTimer()
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*in.n), "cpu-ns/event")
}

// TestPartitionProcessArrivingDecidesAsBench: procArrivingInput decides
// as the benchmark's input does (the arrivals change no decision): as
// many rejections and revisions.
func TestPartitionProcessArrivingDecidesAsBench(t *testing.T) {
	in, err := procBenchInput()
	if err != nil {
		t.Fatal(err)
	}
	arr, err := procArrivingInput()
	if err != nil {
		t.Fatal(err)
	}
	l0 := runProcInput(t, in, true, func() {})
	defer l0.Close()
	l1 := runProcInput(t, arr, true, func() {})
	defer l1.Close()
	for _, topic := range []string{in.names.RejectedTopic(), in.names.AggregatesTopic()} {
		if n0, n1 := l0.Emitted(topic), l1.Emitted(topic); n0 != n1 || n0 == 0 {
			t.Errorf("%s: %d records, %d with the arrivals advancing", topic, n0, n1)
		}
	}
}
