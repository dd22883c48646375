package dedup

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/schemas"
)

// TestSkewLoweredAfterAccept: S lowered on a state holding a key of an
// event that was accepted under the longer S, with an event time ahead
// of its arrival by more than the new S. Its key must live until its
// first arrival + W + the S it was accepted under: an exact copy that
// arrives after first arrival + W + new S (+ a bucket), inside the window
// by its own arrival, is a duplicate (or too_old), never a second first
// copy; alike from the local state and from a restore.
func TestSkewLoweredAfterAccept(t *testing.T) {
	onBrokers(t, func(t *testing.T, brokers []string) {
		localOrRestored(t, func(t *testing.T, keep bool) { skewLowered(t, brokers, keep) })
	})
}

func skewLowered(t *testing.T, brokers []string, keep bool) {
	h := newHarness(t, brokers, 1)
	fs := vfs.NewMem()
	cfg := shortWindow(h, prometheus.NewRegistry())
	cfg.Stream.FS = fs
	cfg.Skew = 30 * time.Minute
	a := h.start(cfg)
	et := swArr + 20*60_000 // 20 min ahead of its arrival: inside S = 30 min
	h.produce(h.event("acme", "api_calls", "k1", 1, et, swArr))
	h.caughtUp()
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	if !keep {
		fs = vfs.NewMem()
	}
	cfg = shortWindow(h, prometheus.NewRegistry()) // S = 1 min
	cfg.Stream.FS = fs
	b := h.start(cfg)
	// The watermark passes the bucket's end + W + the new S, then an
	// exact copy arrives: inside the window by its own arrival (its
	// event time is less than W before it).
	arr2 := t0 + swB + swW + swS + 1000
	h.produce(h.tick(0, t0+swB+swW+swS))
	h.caughtUp()
	h.produce(h.event("acme", "api_calls", "k1", 1, et, arr2))
	h.caughtUp()
	o := h.outputs()
	if n := len(o.dedupedOf("k1")); n != 1 {
		t.Fatalf("k1 forwarded %d times, want 1: its copy was accepted after the key, stored under the longer S, expired by the shorter one", n)
	}
	if len(o.duplicates) != 1 && len(o.rejectedOf("k1")) != 1 {
		t.Errorf("k1's copy: duplicates %d, rejected %+v; want a duplicate or a too_old", len(o.duplicates), o.rejectedOf("k1"))
	}
	if r := o.rejectedOf("k1"); len(r) == 1 && r[0].Reason != schemas.ReasonTooOld {
		t.Errorf("k1's copy rejected as %s, want a duplicate or too_old", r[0].Reason)
	}
	// The key goes once the watermark passes its bucket's end + W +
	// the S it was accepted under.
	h.produce(h.tick(0, t0+swB+swW+30*60_000))
	h.caughtUp()
	within(t, 10*time.Second, "the key expired by the longer S", func() bool { return identityKeys(t, b.stage, 0) == 0 })
}

// standbyConfig is shortWindow for instance id, with W and S (0: its
// own) and a standby replica.
func standbyConfig(h *harness, id string, w, s time.Duration) Config {
	c := shortWindow(h, prometheus.NewRegistry())
	c.Stream.InstanceID = id
	if w != 0 {
		c.Window = w
	}
	if s != 0 {
		c.Skew = s
	}
	c.Stream.StandbyReplicas = 1
	return c
}

// TestStandbySkewLowered: a standby keeps a key accepted under a longer S
// as long as its owner does, whatever its own S.
func TestStandbySkewLowered(t *testing.T) {
	h := newHarness(t, nil, 1)
	cfg := func(id string, skew time.Duration) Config { return standbyConfig(h, id, 0, skew) }
	first := h.start(cfg("a", 30*time.Minute))
	et := swArr + 20*60_000
	h.produce(h.event("acme", "api_calls", "k1", 1, et, swArr))
	h.caughtUp()
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	a := h.start(cfg("a", time.Minute))
	h.produce(h.tick(0, t0+1000)) // a transaction of the owner with the new S
	h.caughtUp()
	b := h.start(cfg("b", time.Minute))
	within(t, 20*time.Second, "the standby's copy of the key", func() bool { return identityKeys(t, b.stage, 0) == 1 })
	h.produce(h.tick(0, t0+swB+swW+swS)) // past the bucket + W + the new S
	h.caughtUp()
	time.Sleep(time.Second)
	if n := identityKeys(t, b.stage, 0); n != 1 {
		t.Fatalf("the standby holds %d keys, want 1: it expired by its own S a key its owner keeps (owner: %d)", n, identityKeys(t, a.stage, 0))
	}
	h.produce(h.tick(0, t0+swB+swW+30*60_000)) // past the bucket + W + the S it was accepted under
	h.caughtUp()
	within(t, 20*time.Second, "both to drop the bucket", func() bool {
		return identityKeys(t, a.stage, 0) == 0 && identityKeys(t, b.stage, 0) == 0
	})
}

// TestKeepSkew: what a run records of S, and the S keys expire by.
func TestKeepSkew(t *testing.T) {
	c := &Config{Window: 2 * time.Hour, Skew: time.Minute, Bucket: time.Minute}
	W, B := int64(2*hour), int64(60_000)
	const m = int64(60_000)
	for _, tc := range []struct {
		name   string
		k      skewKeep
		ok     bool
		wm     int64
		want   skewKeep
		expire map[int64]int64 // watermark -> S keys expire by
	}{
		{"new state", skewKeep{}, false, 5, skewKeep{last: m}, map[int64]int64{5: m}},
		{"same S", skewKeep{last: m}, true, 5, skewKeep{last: m}, map[int64]int64{5: m}},
		{"lowered", skewKeep{last: 30 * m}, true, 1000, skewKeep{last: m, older: 30 * m, until: 1000 + 2*W + 30*m + B},
			map[int64]int64{1000: 30 * m, 1000 + 2*W + 30*m + B - 1: 30 * m, 1000 + 2*W + 30*m + B: m}},
		{"lowered again while pending", skewKeep{last: 10 * m, older: 30 * m, until: 5000}, true, 1000,
			skewKeep{last: m, older: 30 * m, until: 1000 + 2*W + 10*m + B}, map[int64]int64{1000: 30 * m}},
		{"pending over", skewKeep{last: m, older: 30 * m, until: 5000}, true, 5000, skewKeep{last: m}, map[int64]int64{5000: m}},
		{"raised past the pending one", skewKeep{last: 90 * m, older: 100 * m, until: 5000}, true, 1000,
			skewKeep{last: m, older: 100 * m, until: 1000 + 2*W + 90*m + B}, map[int64]int64{1000: 100 * m}},
	} {
		got := keepSkew(c, tc.k, tc.ok, tc.wm)
		if got != tc.want {
			t.Errorf("%s: keepSkew = %+v, want %+v", tc.name, got, tc.want)
		}
		for wm, s := range tc.expire {
			if e := expirySkew(c, got, wm); e != s {
				t.Errorf("%s: expirySkew at %d = %d, want %d", tc.name, wm, e, s)
			}
		}
	}
	raised := *c
	raised.Skew = time.Hour
	if got := keepSkew(&raised, skewKeep{last: m, older: 30 * m, until: 5000}, true, 1000); got != (skewKeep{last: 60 * m}) {
		t.Errorf("S raised above the pending one: %+v, want only the new S", got)
	}
}
