package dedup

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestRestoreWaitsForInFlightTransaction: a previous owner's transaction
// is open on the changelog when the new owner's restore reads the high
// watermark (docs/design.md, Exactly-once, 3). The restore must wait for
// its outcome and then finish: with a commit, its records are restored;
// with an abort, they are not — and the abort marker lands at or past the
// high watermark the restore read, while the aborted records below it are
// never delivered to a read_committed reader (regression: the restore
// waited for them forever and the partition never resumed).
func TestRestoreWaitsForInFlightTransaction(t *testing.T) {
	for _, commit := range []bool{false, true} {
		name := "abort"
		if commit {
			name = "commit"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, nil, 2)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			// The previous owner: a transaction with a state record on
			// changelog partition 0, flushed and left open.
			prev, err := kgo.NewClient(kgo.SeedBrokers(h.brokers...), kgo.TransactionalID("previous-owner"),
				kgo.TransactionTimeout(time.Minute), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err != nil {
				t.Fatal(err)
			}
			defer prev.Close()
			if err := prev.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			rec := &kgo.Record{Topic: h.names.DedupChangelogTopic(), Partition: 0, Key: []byte("in-flight"), Value: []byte("v")}
			if err := prev.ProduceSync(ctx, rec).FirstErr(); err != nil {
				t.Fatal(err)
			}

			// The new owner restores partition 0 up to a high watermark
			// that includes the open transaction, so it must wait.
			a := h.start(h.config("a", vfs.NewMem()))
			rt := a.stage.rt
			deadline := time.Now().Add(10 * time.Second)
			for {
				err := rt.Ready()
				if err != nil && strings.Contains(err.Error(), "1 partitions restoring") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("partition 0 is not restoring: %v", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(500 * time.Millisecond) // the restore has read the high watermark
			if err := rt.Ready(); err == nil {
				t.Fatal("the restore of partition 0 finished while the previous owner's transaction was open")
			}

			try := kgo.TryAbort
			if commit {
				try = kgo.TryCommit
			}
			if err := prev.EndTransaction(ctx, try); err != nil {
				t.Fatal(err)
			}
			deadline = time.Now().Add(10 * time.Second)
			for rt.Ready() != nil {
				if time.Now().After(deadline) {
					t.Fatalf("the restore never finished after the previous owner's transaction ended (commit=%v): %v", commit, rt.Ready())
				}
				time.Sleep(10 * time.Millisecond)
			}
			_, ok, err := rt.Store().Get(0, []byte("in-flight"))
			if err != nil {
				t.Fatal(err)
			}
			if ok != commit {
				t.Fatalf("state has the in-flight record: %v, want %v (committed: %v)", ok, commit, commit)
			}

			// And the partition processes input.
			h.produce(h.event("cust", "api_calls", "after", 1, t0-hour, t0))
			h.caughtUp()
			if o := h.outputs(); len(o.deduped) != 1 {
				t.Fatalf("deduped %d, want 1", len(o.deduped))
			}
		})
	}
}
