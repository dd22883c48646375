package dedup

import (
	"testing"
	"time"
)

// TestStandbyFollowsOwnerBucket: a standby whose configured bucket B is
// not the one its owner's state records (a rolling restart that tries a
// new --bucket, which the owner's Open refuses) drops the buckets its
// owner dropped, counted in the state's bucket: counted in its own, it
// dropped live keys from its copy, and the instance, back on the state's
// bucket and owner of the partition after a tail restore from that copy,
// forwarded a copy of their events again.
func TestStandbyFollowsOwnerBucket(t *testing.T) {
	onBrokers(t, standbyFollowsOwnerBucket)
}

func standbyFollowsOwnerBucket(t *testing.T, brokers []string) {
	h := newHarness(t, brokers, 1)
	cfg := func(id string, b time.Duration) Config {
		c := standbyConfig(h, id, 0, 0)
		c.Bucket = b
		return c
	}
	ownerB := time.Hour
	a := h.start(cfg("a", ownerB))
	f1 := t0 + 3*hour // in a live bucket when the tick below drops the first
	h.produce(h.event("acme", "api_calls", "e0", 1, swArr, swArr), h.event("acme", "api_calls", "f1", 1, f1, f1))
	h.caughtUp()
	bc := cfg("b", time.Duration(swB)*time.Millisecond) // another bucket
	b := h.start(bc)
	sameKeys := func(what string, want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			n, o := identityKeys(t, b.stage, 0), identityKeys(t, a.stage, 0)
			if n == want && o == want {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: the standby holds %d keys, its owner %d, want %d: it dropped buckets its owner keeps", what, n, o, want)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	sameKeys("standby started", 2)
	// Past e0's bucket + W + S, not f1's: the owner drops e0's bucket.
	tick := t0 + hour + swW + swS + 1000
	h.produce(h.tick(0, tick))
	h.caughtUp()
	sameKeys("after the owner dropped a bucket", 1)
	// The new bucket is given up: b runs with the state's again, on its
	// local copy, and takes the partition over.
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	nb := cfg("b", ownerB)
	nb.Stream.FS = bc.Stream.FS
	h.start(nb)
	// A copy inside W by its own arrival.
	h.produce(h.event("acme", "api_calls", "f1", 1, f1, tick+1000))
	h.caughtUp()
	o := h.outputs()
	if n := len(o.dedupedOf("f1")); n != 1 {
		t.Fatalf("f1 forwarded %d times, want 1", n)
	}
}
