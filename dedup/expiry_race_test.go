package dedup

import (
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestLateRerouteAfterExpiry: a re-routed record keeps its original
// arrival, which may be up to W before its own broker timestamp, while keys
// expire by the partition watermark (broker time). When dedup re-routes a
// misrouted copy late (it was down, or its partition lagged), the key of the
// copy's original may already be gone when the re-routed record is read,
// although the copy's own arrival is inside the window. That copy cannot be
// judged: it must be rejected (too_old), never forwarded a second time.
func TestLateRerouteAfterExpiry(t *testing.T) {
	onBrokers(t, func(t *testing.T, brokers []string) {
		h := newHarness(t, brokers, 2)
		reg := prometheus.NewRegistry()
		cfg := h.configWith("a", reg)
		cfg.Window, cfg.Skew, cfg.Bucket = 2*time.Hour, time.Minute, time.Minute
		W := cfg.Window.Milliseconds()
		// Dedup stamps the record it re-routes with the wall clock, so the
		// times count back from now.
		now := time.Now().UnixMilli()
		a := now - W - 10*60_000 // the original's arrival and event time
		orig := h.event("acme", "api_calls", "late1", 3, a, a)
		p := orig.Partition
		// A later tick of the same partition moves its watermark past the
		// original's bucket + W + S: its key expires.
		h.produce(orig, h.tick(p, now-2*60_000))
		h.start(cfg)
		h.caughtUp()

		// A copy of it that arrived, misrouted, 1 s inside its window (W
		// after the original's event time) and that dedup re-routes only
		// now, 10 minutes later.
		cp := h.event("acme", "api_calls", "late1", 3, a, a+W-1000)
		cp.Partition = 1 - p
		h.produce(cp)
		h.caughtUp()
		deadline := time.Now().Add(30 * time.Second)
		var o outputs
		for {
			o = h.outputs()
			if len(o.rejectedOf("late1")) > 0 || len(o.dedupedOf("late1")) > 1 || len(o.duplicates) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the re-routed copy of late1 was not decided within 30s")
			}
			time.Sleep(100 * time.Millisecond)
		}
		if n := len(o.dedupedOf("late1")); n != 1 {
			t.Fatalf("late1 forwarded %d times, want 1: its re-routed copy was accepted after the original's key had expired", n)
		}
		r := o.rejectedOf("late1")
		if len(r) != 1 || r[0].Reason != schemas.ReasonTooOld || r[0].SourcePartition != p {
			t.Fatalf("late1's re-routed copy: rejected %+v, want one too_old from partition %d", r, p)
		}
		if !strings.Contains(r[0].Detail, "expired") {
			t.Errorf("detail %q does not say that the keys for its time expired", r[0].Detail)
		}
		if got := metricValues(t, reg, "meterline_rejected_total")["reason=too_old,stage=dedup"]; got != 1 {
			t.Errorf("meterline_rejected_total{stage=dedup,reason=too_old} = %v, want 1", got)
		}
	})
}

// W, S and B of shortWindow, and an arrival inside bucket [t0, t0+B).
const swW, swS, swB = 2 * hour, int64(60_000), int64(60_000)

var swArr = t0 + 30_000

// shortWindow is a config with W = 2 h, S = B = 1 min, and only the test's
// ticks.
func shortWindow(h *harness, reg *prometheus.Registry) Config {
	cfg := h.configWith("a", reg)
	cfg.Window, cfg.Skew, cfg.Bucket = time.Duration(swW)*time.Millisecond, time.Duration(swS)*time.Millisecond, time.Duration(swB)*time.Millisecond
	return cfg
}

// TestAbortKeepsBucketsAlive: a transaction whose watermark expires a
// bucket drops it from memory at once, and from the store only if it
// commits. When it aborts and the partition stays, its records are
// processed again from the committed state: a copy among them, which the
// aborted attempt recognised before the bucket expired, must be recognised
// again, not forwarded as a first copy because the bucket's filter is gone.
func TestAbortKeepsBucketsAlive(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newHarness(t, brokers, 1)
	reg := prometheus.NewRegistry()
	cfg := shortWindow(h, reg)
	h.produce(h.event("acme", "api_calls", "x1", 1, swArr, swArr))
	st := h.start(cfg)
	h.caughtUp()

	// One transaction: a copy 1 s inside its window, then a tick that
	// expires the original's bucket. It aborts.
	testenv.FailNextTxnOffsetCommit(c)
	h.produce(h.event("acme", "api_calls", "x1", 1, swArr, swArr+swW-1000), h.tick(0, t0+swB+swW+swS))
	h.caughtUp()
	if got := metricValues(t, reg, "meterline_stream_transactions_total")["outcome=aborted,stage=dedup"]; got < 1 {
		t.Fatalf("no aborted transaction (%v): the test did not test anything", metricValues(t, reg, "meterline_stream_transactions_total"))
	}
	if err, done := st.wait(0); done {
		t.Fatalf("dedup stopped: %v", err)
	}
	o := h.outputs()
	if n := len(o.dedupedOf("x1")); n != 1 {
		t.Errorf("x1 forwarded %d times, want 1: the copy replayed after the abort missed the bucket the aborted transaction dropped", n)
	}
	if len(o.duplicates) != 1 {
		t.Errorf("%d duplicates, want 1 (the copy)", len(o.duplicates))
	}
	if n := identityKeys(t, st.stage, 0); n != 0 {
		t.Errorf("%d identity keys after the bucket expired, want 0", n)
	}
}

// TestClockStepBackAfterExpiry: the broker's clock steps back after the
// watermark expired a key. A copy stamped with the earlier time is inside
// the window by its own arrival, but its original's key is gone: it is
// rejected (too_old), not forwarded a second time.
func TestClockStepBackAfterExpiry(t *testing.T) {
	h := newHarness(t, nil, 1)
	cfg := shortWindow(h, prometheus.NewRegistry())
	h.produce(h.event("acme", "api_calls", "s1", 1, swArr, swArr), h.tick(0, t0+swB+swW+swS))
	h.start(cfg)
	h.caughtUp()
	// The clock steps back 10 minutes: a copy 1 s inside its window.
	h.produce(h.event("acme", "api_calls", "s1", 1, swArr, swArr+swW-1000))
	h.caughtUp()
	o := h.outputs()
	if n := len(o.dedupedOf("s1")); n != 1 {
		t.Fatalf("s1 forwarded %d times, want 1", n)
	}
	if r := o.rejectedOf("s1"); len(r) != 1 || r[0].Reason != schemas.ReasonTooOld {
		t.Errorf("s1's copy: rejected %+v, want too_old", r)
	}
}

// TestBrokerClockJumpAhead: one record stamped by a broker clock years
// ahead (docs/design.md, Known limits) moves the watermark there for good.
// Every bucket expires at once and the end of the dropped keys is recorded
// in the state, so from then on, on the local state as after a restore from
// the changelog, a copy of an event dedup forwarded is rejected (too_old),
// never forwarded again, and so is an event never seen, inside its window
// by its own arrival: usage is dropped into usage.rejected, never counted
// twice, until broker time reaches the jump.
func TestBrokerClockJumpAhead(t *testing.T) {
	localOrRestored(t, func(t *testing.T, keep bool) {
		jump := t0 + 10*365*day
		h := restartAfterExpiry(t, keep, "c1", swArr, jump, func(*Config) {})
		// The clock is back: an exact copy of c1 and a new event c2, an
		// hour after c1, both inside the window by their own arrival.
		arr := swArr + hour
		h.produce(h.event("acme", "api_calls", "c1", 1, swArr, arr), h.event("acme", "api_calls", "c2", 1, arr, arr))
		h.caughtUp()
		o := h.outputs()
		if n, d := len(o.dedupedOf("c1")), len(o.duplicates); n != 1 || d != 0 {
			t.Fatalf("c1 forwarded %d times and %d copies dropped, want 1 and 0", n, d)
		}
		for _, id := range []string{"c1", "c2"} {
			r := o.rejectedOf(id)
			if len(r) != 1 || r[0].Reason != schemas.ReasonTooOld || !strings.Contains(r[0].Detail, msTime(jump)) {
				t.Errorf("%s: rejected %+v, want one too_old naming the watermark %s", id, r, msTime(jump))
			}
		}
		if n := len(o.dedupedOf("c2")); n != 0 {
			t.Errorf("c2 forwarded %d times, want 0", n)
		}
	})
}

// restartWithWindowRaised runs dedup with shortWindow's W on event w1 of
// acme until w1's expiry bucket is deleted, then restarts it with twice
// the W, on its local state (keep) or restored from the changelog.
func restartWithWindowRaised(t *testing.T, keep bool) *harness {
	t.Helper()
	return restartAfterExpiry(t, keep, "w1", swArr-1000, t0+swB+swW+swS, func(c *Config) { c.Window *= 2 })
}

// restartAfterExpiry runs dedup with shortWindow's config on event id of
// acme (event_time eventTime, arrival swArr) until a tick at tick expired
// its bucket and the bucket is deleted, then restarts it with that config
// changed by edit, on its local state (keep) or restored from the
// changelog.
func restartAfterExpiry(t *testing.T, keep bool, id string, eventTime, tick int64, edit func(*Config)) *harness {
	t.Helper()
	h := newHarness(t, nil, 1)
	fs := vfs.NewMem()
	cfg := shortWindow(h, prometheus.NewRegistry())
	cfg.Stream.FS = fs
	a := h.start(cfg)
	h.produce(h.event("acme", "api_calls", id, 1, eventTime, swArr))
	h.caughtUp() // the key is in the changelog
	h.produce(h.tick(0, tick))
	h.caughtUp()
	within(t, 10*time.Second, "the expired bucket was deleted", func() bool { return identityKeys(t, a.stage, 0) == 0 })
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	if !keep {
		fs = vfs.NewMem()
	}
	cfg = shortWindow(h, prometheus.NewRegistry())
	cfg.Stream.FS = fs
	edit(&cfg)
	h.start(cfg)
	return h
}

// TestWindowRaisedAfterExpiry: W (or S) raised on a state whose keys
// already expired under the shorter one. A copy that the longer window
// admits, of an event whose key is gone, cannot be recognised: it is
// rejected (too_old), never forwarded again; and alike from the local
// state, where the expired bucket is deleted, and from a restore, where
// the changelog still holds it (Pebble is a cache of the changelog: the
// decision must not depend on which one is read).
func TestWindowRaisedAfterExpiry(t *testing.T) {
	localOrRestored(t, func(t *testing.T, keep bool) {
		h := restartWithWindowRaised(t, keep)
		// 2.5 h after the original: inside the new window of 4 h.
		h.produce(h.event("acme", "api_calls", "w1", 1, swArr-1000, swArr+swW+30*60_000))
		h.caughtUp()
		o := h.outputs()
		if n := len(o.dedupedOf("w1")); n != 1 {
			t.Fatalf("w1 forwarded %d times, want 1: a copy whose key expired under the shorter window was accepted", n)
		}
		if r := o.rejectedOf("w1"); len(r) != 1 || r[0].Reason != schemas.ReasonTooOld {
			t.Errorf("w1's copy: rejected %+v (duplicates %d), want too_old", r, len(o.duplicates))
		}
	})
}

// TestWindowRaisedConflictAfterExpiry: as TestWindowRaisedAfterExpiry, a
// copy of an event whose key expired under the shorter W, but with a
// different, recent event_time: the expiry check admits it, and no copy
// can be recognised, the key being gone. A restore must not bring the key
// back from the changelog: it would flag as a conflict what the local
// state forwards. Both forward it.
func TestWindowRaisedConflictAfterExpiry(t *testing.T) {
	localOrRestored(t, func(t *testing.T, keep bool) {
		h := restartWithWindowRaised(t, keep)
		// 2.5 h after the original, inside the new window of 4 h, with an
		// event_time of its own.
		arr := swArr + swW + 30*60_000
		h.produce(h.event("acme", "api_calls", "w1", 1, arr-1000, arr))
		h.caughtUp()
		o := h.outputs()
		if n, d := len(o.dedupedOf("w1")), len(o.duplicates); n != 2 || d != 0 {
			t.Fatalf("w1 forwarded %d times and %d copies dropped, want 2 and 0: the key expired under the shorter window, from the local state as from a restore", n, d)
		}
	})
}
