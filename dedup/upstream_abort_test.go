package dedup

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestUpstreamAbortedTransaction: dedup reads usage.events read_committed
// (docs/design.md, Architecture). What a producer's aborted transaction wrote
// is no input: an event in it is neither forwarded nor rejected nor a
// copy, and its broker timestamp moves no watermark (one stamped past the
// expiry of an earlier key would expire it, and a committed copy of that
// event, arriving inside its window, would be forwarded twice).
func TestUpstreamAbortedTransaction(t *testing.T) {
	onBrokers(t, func(t *testing.T, brokers []string) {
		h := newHarness(t, brokers, 1)
		cfg := shortWindow(h, prometheus.NewRegistry())
		h.produce(h.event("acme", "api_calls", "x1", 1, swArr, swArr))
		h.start(cfg)
		h.caughtUp()

		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		txp, err := kgo.NewClient(kgo.SeedBrokers(h.brokers...), kgo.TransactionalID(h.names.Prefix+"upstream"),
			kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err != nil {
			t.Fatal(err)
		}
		defer txp.Close()
		if err := txp.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		expire := t0 + swB + swW + swS // would expire x1's bucket
		if err := txp.ProduceSync(ctx,
			h.event("acme", "api_calls", "x1", 1, swArr, swArr+1000), // a copy
			h.event("acme", "api_calls", "y1", 1, swArr, swArr+2000), // a new event
			h.event("acme", "api_calls", "z1", 1, expire-hour, expire),
		).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := txp.EndTransaction(ctx, kgo.TryAbort); err != nil {
			t.Fatal(err)
		}
		// A committed copy of x1, inside its window and before its key's
		// expiry by every committed arrival.
		h.produce(h.event("acme", "api_calls", "x1", 1, swArr, swArr+swW-1000), h.tick(0, swArr+swW))
		h.caughtUp()

		o := h.outputs()
		if n := len(o.dedupedOf("x1")); n != 1 {
			t.Errorf("x1 forwarded %d times, want 1", n)
		}
		if len(o.duplicates) != 1 {
			t.Errorf("%d duplicates, want 1 (x1's committed copy)", len(o.duplicates))
		}
		for _, id := range []string{"y1", "z1"} {
			if n, r := len(o.dedupedOf(id)), o.rejectedOf(id); n != 0 || len(r) != 0 {
				t.Errorf("%s, written only in an aborted transaction: forwarded %d times, rejected %d times", id, n, len(r))
			}
		}
		if len(o.rejected) != 0 {
			t.Errorf("%d rejections, want none", len(o.rejected))
		}
		for _, w := range watermarksOf(o, 0) {
			if w >= expire {
				t.Errorf("watermark %d forwarded: the aborted record's timestamp %d moved it", w, expire)
			}
		}
	})
}
