package dedup

import (
	"testing"
	"time"
)

// TestStandbyFollowsOwnerExpiry: a standby drops the buckets its owner
// dropped, whatever its own W (a rolling restart that raises W runs an
// owner with the new W beside a standby with the old one). Expiring by its
// own shorter W, it dropped keys its owner keeps; promoted, it forwarded
// a copy of their events again.
func TestStandbyFollowsOwnerExpiry(t *testing.T) {
	onBrokers(t, standbyFollowsOwnerExpiry)
}

func standbyFollowsOwnerExpiry(t *testing.T, brokers []string) {
	h := newHarness(t, brokers, 1)
	cfg := func(id string, w time.Duration) Config { return standbyConfig(h, id, w, 0) }
	longW := 4 * time.Hour
	a := h.start(cfg("a", longW))
	h.produce(h.event("acme", "api_calls", "f1", 1, swArr, swArr))
	h.caughtUp()
	bc := cfg("b", time.Duration(swW)*time.Millisecond) // the old, shorter W
	b := h.start(bc)
	within(t, 20*time.Second, "the standby's copy of the key", func() bool { return identityKeys(t, b.stage, 0) == 1 })
	h.produce(h.tick(0, t0+swB+swW+swS)) // past the bucket + the standby's W + S, not the owner's
	h.caughtUp()
	time.Sleep(time.Second)
	if n, o := identityKeys(t, b.stage, 0), identityKeys(t, a.stage, 0); n != o {
		t.Errorf("the standby holds %d keys, its owner %d: it dropped a bucket its owner keeps", n, o)
	}
	// The rolling restart goes on: b gets the new W, on its local state,
	// and takes the partition over.
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	nb := cfg("b", longW)
	nb.Stream.FS = bc.Stream.FS
	h.start(nb)
	// A copy inside the new W by its own arrival.
	h.produce(h.event("acme", "api_calls", "f1", 1, swArr, t0+swB+swW+swS+1000))
	h.caughtUp()
	o := h.outputs()
	if n := len(o.dedupedOf("f1")); n != 1 {
		t.Fatalf("f1 forwarded %d times, want 1", n)
	}
}
