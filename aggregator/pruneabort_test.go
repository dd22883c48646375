package aggregator

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// watermark reads into the open transaction a watermark record of at, the
// partition's one source partition.
func (r *pendingRun) watermark(at time.Time) {
	r.tb.Helper()
	v := schemas.MustEncode(&schemas.Watermark{SourcePartition: 0, SourcePartitions: 1, Watermark: at.UnixMilli()})
	r.process([]*kgo.Record{{Topic: r.names.DedupedTopic(), Offset: r.evOff, Value: v, Timestamp: at}})
	r.evOff++
}

// periodIndexKeys counts the Ledger's period index keys ('e' 'P') in the
// committed state of partition 0.
func (r *pendingRun) periodIndexKeys() int {
	r.tb.Helper()
	lo := []byte{0, 0, 0, pfxLedger, 'P'}
	it, err := r.l.DB().NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: []byte{0, 0, 0, pfxLedger, 'P' + 1}})
	if err != nil {
		r.tb.Fatal(err)
	}
	n := 0
	for it.First(); it.Valid(); it.Next() {
		n++
	}
	if err := it.Close(); err != nil {
		r.tb.Fatal(err)
	}
	return n
}

// TestEntitlementsPruneInChunksAfterAbort: a watermark far past a month of
// usage by 200 customers prunes their period index in chunks of the
// FinalChunk, each going on from the cursor the last committed one left
// (docs/design.md, Exactly-once, 7); a chunk's transaction aborted goes
// again from the committed cursor: every key is pruned, no chunk is
// skipped, and the prune takes the chunks it needs and no more.
func TestEntitlementsPruneInChunksAfterAbort(t *testing.T) {
	const n, chunk = 200, 7
	r := newPendingRun(t, chunk)
	r.watermark(procBenchNow.Add(-time.Hour))
	r.commit()
	r.events(pendingCustomers(n))
	r.commit()
	if k := r.periodIndexKeys(); k != n {
		t.Fatalf("%d period index keys before the prune, want %d", k, n)
	}
	// Past December's end + W + B + S and W more: December is pruned.
	at := procBenchNow.Add(120 * 24 * time.Hour)
	r.watermark(at)
	r.tick(at.Add(time.Millisecond))
	r.commit()
	prunes := func() float64 { return testutil.ToFloat64(r.pt.pr.m.chunks.WithLabelValues("prune")) }
	aborted := 0
	for works := 0; r.l.HasWork(); works++ {
		if works > 10*n {
			t.Fatal("no end to the work")
		}
		pruning := r.pt.ent.roll.phase == rollPrune && r.pt.ent.roll.cursor != ""
		if _, err := r.l.Work(); err != nil {
			t.Fatal(err)
		}
		if pruning && aborted < 3 && works%3 == 0 {
			// Between two chunks of the prune: this one is lost.
			before := r.periodIndexKeys()
			r.l.Abort()
			aborted++
			if k := r.periodIndexKeys(); k != before {
				t.Fatalf("an aborted chunk changed the state: %d period index keys, %d before", k, before)
			}
			continue
		}
		r.commit()
	}
	if aborted == 0 {
		t.Fatal("no prune chunk aborted")
	}
	if k := r.periodIndexKeys(); k != 0 {
		t.Errorf("%d period index keys left after the prune, want none", k)
	}
	if got, want := prunes(), float64((n+chunk-1)/chunk); got != want && got != want+1 {
		t.Errorf("%v prune chunks committed for %d customers in chunks of %d, want %v (or one more, empty)", got, n, chunk, want)
	}
}
