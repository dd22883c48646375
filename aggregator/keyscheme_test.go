package aggregator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestKeySchemeRefused: the aggregator refuses state of another key
// scheme of usage.deduped, and state built before schemes were recorded
// (keyed by customer and meter: any key of its own and no scheme); new
// state and state of this scheme are taken.
func TestKeySchemeRefused(t *testing.T) {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], 500)
	src := string([]byte{pfxSource, 0, 0, 0, 0})
	for _, tc := range []struct {
		name    string
		st      mapState
		refused bool
	}{
		{"new state", mapState{"\xffinput-offset": []byte{1}}, false},
		{"this scheme", mapState{string(keyKeyScheme): []byte(schemas.DedupedKeyScheme), src: v[:]}, false},
		{"older state", mapState{src: v[:]}, true},
		{"other scheme", mapState{string(keyKeyScheme): []byte("customer+meter"), src: v[:]}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pt := &partition{pr: &processor{counts: partitionCountsT{events: 1, deduped: 1, entitlements: 1}}}
			err := pt.load(tc.st)
			switch {
			case tc.refused && !errors.Is(err, schemas.ErrKeyScheme):
				t.Fatalf("load = %v, want ErrKeyScheme", err)
			case !tc.refused && err != nil:
				t.Fatalf("load = %v", err)
			}
			t.Log(err)
			if _, has := tc.st[string(keyKeyScheme)]; !tc.refused && pt.writeScheme == has {
				t.Errorf("writeScheme %v with the scheme recorded: %v", pt.writeScheme, has)
			}
		})
	}
}

// TestKeySchemeInState: a new aggregator records the key scheme in its
// changelog, and an aggregator whose changelog holds state of the earlier
// scheme stops with ErrKeyScheme before it counts anything.
func TestKeySchemeInState(t *testing.T) {
	day := ms(t, "2026-05-04")
	ev := &schemas.DedupedEvent{EventID: "e1", CustomerID: "acme", Meter: "m", Quantity: 7, EventTime: day + 1000, IngestTime: day + 2000}
	t.Run("recorded", func(t *testing.T) {
		h := newAggHarness(t, nil, 1)
		h.start(h.config("a", vfs.NewMem()))
		h.produce(h.dedupedEvent(0, ev))
		h.caughtUp()
		found := false
		for _, r := range testenv.ReadAll(t, h.brokers, h.names.AggregateChangelogTopic()) {
			found = found || (bytes.Equal(r.Key, keyKeyScheme) && string(r.Value) == schemas.DedupedKeyScheme)
		}
		if !found {
			t.Errorf("the changelog does not record the key scheme %q", schemas.DedupedKeyScheme)
		}
	})
	t.Run("refused", func(t *testing.T) {
		h := newAggHarness(t, nil, 1)
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], uint64(day))
		h.produce(&kgo.Record{Topic: h.names.AggregateChangelogTopic(), Partition: 0, Key: []byte{pfxSource, 0, 0, 0, 0}, Value: v[:]})
		h.produce(h.dedupedEvent(0, ev))
		run := h.start(h.config("a", vfs.NewMem()))
		select {
		case <-run.done:
		case <-time.After(30 * time.Second):
			t.Fatal("the aggregator runs on state of the earlier key scheme")
		}
		if !errors.Is(run.err, schemas.ErrKeyScheme) {
			t.Fatalf("Run = %v, want ErrKeyScheme", run.err)
		}
		t.Log(run.err)
		if a := readAggregates(t, h); len(a) != 0 {
			t.Errorf("%d aggregates written on state of the earlier key scheme", len(a))
		}
	})
}

// TestRejectedKeyedByIdentity: the aggregator keys what it rejects by the
// event's identity (docs/design.md, Topics), not by the record's key, which
// is the customer.
func TestRejectedKeyedByIdentity(t *testing.T) {
	h := newAggHarness(t, nil, 2)
	h.start(h.config("a", vfs.NewMem()))
	day := ms(t, "2026-05-04")
	ev := &schemas.DedupedEvent{EventID: "neg", CustomerID: "acme", Meter: "m", Quantity: -1, EventTime: day + 1000, IngestTime: day + 2000}
	h.produce(h.dedupedEvent(schemas.Partition(schemas.CustomerKey("acme"), 2), ev))
	h.caughtUp()
	recs := testenv.ReadAll(t, h.brokers, h.names.RejectedTopic())
	if len(recs) != 1 {
		t.Fatalf("%d rejected records, want 1", len(recs))
	}
	want := schemas.Identity{CustomerID: "acme", Meter: "m", EventID: "neg"}.Key()
	if r := recs[0]; !bytes.Equal(r.Key, want) || r.Partition != schemas.Partition(want, 2) {
		t.Errorf("rejected record keyed %q in partition %d, want %q in %d", r.Key, r.Partition, want, schemas.Partition(want, 2))
	}
}

// TestAbortedTransactionRewritesKeyScheme: the first transaction of new
// state carries the key scheme; when it aborts and the partition stays,
// the next transaction carries it again.
func TestAbortedTransactionRewritesKeyScheme(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newAggHarness(t, brokers, 1)
	day := ms(t, "2026-05-04")
	h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "e1", CustomerID: "acme", Meter: "m", Quantity: 7,
		EventTime: day + 1000, IngestTime: day + 2000}))
	testenv.FailNextTxnOffsetCommit(c)
	reg := prometheus.NewRegistry()
	cfg := h.config("a", vfs.NewMem())
	cfg.Stream.Registerer = reg
	run := h.start(cfg)
	h.caughtUp()
	aborted := transactionCounts(reg)["aborted"]
	if aborted < 1 {
		t.Fatal("no aborted transaction: the test did not test anything")
	}
	select {
	case <-run.done:
		t.Fatalf("the aggregator stopped: %v", run.err)
	default:
	}
	found := false
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.AggregateChangelogTopic()) {
		found = found || (bytes.Equal(r.Key, keyKeyScheme) && string(r.Value) == schemas.DedupedKeyScheme)
	}
	if !found {
		t.Error("after an aborted first transaction the changelog lacks the key scheme")
	}
}
