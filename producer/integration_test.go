package producer

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestRealBrokerPlacement sends 100,000 events through the producer to a
// real Kafka broker, reads them back, and checks that every identity landed
// in the partition murmur2 of its key selects; then sends the same events
// again and checks that each copy has the same key and partition.
func TestRealBrokerPlacement(t *testing.T) {
	brokers := testenv.RealKafka(t)
	const (
		n          = 100_000
		partitions = 16
	)
	topic := testenv.Name(t, "usage.events")
	lat := "LogAppendTime"
	testenv.CreateTopic(t, brokers, topic, partitions, map[string]*string{"message.timestamp.type": &lat})

	p, err := New(WithBrokers(brokers...), WithTopic(topic), WithSource("placement-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	base := time.Now().Add(-time.Hour)
	event := func(i int) Event {
		return Event{
			EventID:    EventID("req", fmt.Sprint(i)),
			CustomerID: fmt.Sprintf("cust-%04d", i%997),
			Meter:      []string{"api_calls", "tokens", "storage_bytes", "a:b", "ünï"}[i%5],
			Quantity:   int64(i % 1000),
			EventTime:  base.Add(time.Duration(i) * time.Millisecond),
		}
	}
	send := func() {
		var failed atomic.Int64
		var firstErr atomic.Value
		for i := 0; i < n; i++ {
			p.SendAsync(event(i), func(err error) {
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := p.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if f := failed.Load(); f > 0 {
			t.Fatalf("%d sends failed, first: %v", f, firstErr.Load())
		}
	}

	send()
	first := testenv.ReadAll(t, brokers, topic)
	if len(first) != n {
		t.Fatalf("read %d records, sent %d", len(first), n)
	}
	placed := make(map[string]int32, n)
	for _, r := range first {
		if _, err := schemas.ParseKey(r.Key); err != nil {
			t.Fatalf("key %q: %v", r.Key, err)
		}
		if want := schemas.Partition(r.Key, partitions); r.Partition != want {
			t.Fatalf("%s in partition %d, murmur2(key) mod %d = %d", r.Key, r.Partition, partitions, want)
		}
		if _, dup := placed[string(r.Key)]; dup {
			t.Fatalf("%s read twice after one send", r.Key)
		}
		placed[string(r.Key)] = r.Partition
	}
	for i := 0; i < n; i++ {
		if _, ok := placed[string(event(i).Key())]; !ok {
			t.Fatalf("event %d (%s) never arrived", i, event(i).Key())
		}
	}

	send() // the same events again, as a retrying service would
	all := testenv.ReadAll(t, brokers, topic)
	if len(all) != 2*n {
		t.Fatalf("read %d records after the second send, want %d", len(all), 2*n)
	}
	seen := make(map[string]int, n)
	for _, r := range all {
		part, ok := placed[string(r.Key)]
		if !ok {
			t.Fatalf("second send made a new key %q", r.Key)
		}
		if r.Partition != part {
			t.Fatalf("%s: copies in partitions %d and %d", r.Key, part, r.Partition)
		}
		seen[string(r.Key)]++
		var ue schemas.UsageEvent
		if err := schemas.DecodeInto(r.Value, &ue); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(ue.Identity().Key(), r.Key) {
			t.Fatalf("payload identity %v does not match key %q", ue.Identity(), r.Key)
		}
	}
	for k, c := range seen {
		if c != 2 {
			t.Fatalf("%s arrived %d times over two sends", k, c)
		}
	}
}
