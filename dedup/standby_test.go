package dedup

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestStandbyExpiry: a standby replica drops expired arrival buckets as its
// owner does (the owner drops them locally, not through the changelog; the
// standby follows the watermark recorded there), so its state stays as
// bounded as the owner's.
func TestStandbyExpiry(t *testing.T) {
	h := newHarness(t, nil, 1)
	cfg := func(id string) Config {
		c := h.config(id, vfs.NewMem())
		c.Window, c.Skew, c.Bucket = 2*time.Hour, time.Minute, time.Minute
		c.TickInterval = time.Hour
		c.Stream.StandbyReplicas = 1
		return c
	}
	a := h.start(cfg("a"))
	W, S, B := 2*hour, int64(60_000), int64(60_000)
	arr := t0 + 30_000
	h.produce(h.event("acme", "api_calls", "x1", 1, arr-1000, arr))
	h.caughtUp()
	b := h.start(cfg("b"))
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (owner %d keys, standby %d)", what, identityKeys(t, a.stage, 0), identityKeys(t, b.stage, 0))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	wait("the standby's copy of the key", func() bool { return identityKeys(t, b.stage, 0) == 1 })
	h.produce(h.tick(0, t0+B+W+S))
	h.caughtUp()
	wait("both to drop the expired bucket", func() bool {
		return identityKeys(t, a.stage, 0) == 0 && identityKeys(t, b.stage, 0) == 0
	})
}
