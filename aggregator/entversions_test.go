package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsFullTimelineTakesRecordsPastTheHorizon (kfake;
// docs/entitlements.md, The aggregator, 1): a key (a customer, the default
// plan) whose record was written entitlements.MaxVersions times within the
// window has its next record refused (invalid), but only while those
// versions take effect within W + B + S of a record's broker time: a
// record of the key written hours after them is applied (the versions
// before that span no longer count, pruned or not:
// entitlements.TestVersionBoundSameWhenLagging).
func TestEntitlementsFullTimelineTakesRecordsPastTheHorizon(t *testing.T) {
	for _, name := range []string{"customer", "default plan"} {
		t.Run(name, func(t *testing.T) { testFullTimeline(t, name == "default plan") })
	}
}

func testFullTimeline(t *testing.T, def bool) {
	const n = 1
	h := newEntHarness(t, nil, n)
	// Broker times around the wall clock (the record the aggregator
	// restates after one it refuses is stamped by it), W, B and S an hour
	// each: the first records are ten hours before the watermark.
	t0 := time.Now().Add(-10 * time.Hour).UnixMilli()
	record := func(limit int64, at int64) []*kgo.Record {
		e := &schemas.Entitlements{CustomerID: "busy", Plan: fmt.Sprintf("p%d", limit),
			Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
			Caps:      []schemas.Cap{{Meter: "api_calls", Limit: limit, OnLimit: schemas.OnLimitReject}}}
		if def {
			e.CustomerID = ""
			return h.shared(n, schemas.DefaultPlanKey, e, at)
		}
		return []*kgo.Record{h.entitlement(n, e, at)}
	}
	var recs []*kgo.Record
	for i := range entitlements.MaxVersions {
		recs = append(recs, record(int64(i+1), t0+int64(i)*1_000)...)
	}
	// One too many within the window: refused, the cap of 256 stays.
	recs = append(recs, record(300, t0+600_000)...)
	// No ticks: the entitlements partition's time is its records' (one of
	// another customer lets the watermark through).
	wm := time.Now().Add(-time.Minute).UnixMilli()
	recs = append(recs, h.watermark(0, 0, 1, wm), h.entitlement(n, &schemas.Entitlements{CustomerID: "other",
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}, wm+30_000))
	h.produce(recs...)
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.EntitlementsTick = -1
	cfg.Window, cfg.Bucket, cfg.Skew = time.Hour, time.Hour, time.Hour
	run := h.start(cfg)
	h.caughtUp()
	// Hours past the window, the cap is raised to 1,000; a watermark
	// after it, let through once it is read, says when it was.
	now := time.Now().UnixMilli()
	h.produce(record(1000, now)...)
	h.produce(h.watermark(0, 0, 1, now), h.entitlement(n, &schemas.Entitlements{CustomerID: "other", Plan: "again",
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}, now+1))
	h.caughtUp()
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	var refused int
	for _, r := range readRejected(t, h) {
		if r.Reason == schemas.ReasonInvalid {
			refused++
			t.Logf("refused: %s", r.Detail)
		}
	}
	if refused != 1 {
		t.Errorf("%d records refused invalid, want 1: the one past %d versions within the window, not the one hours after it",
			refused, entitlements.MaxVersions)
	}
}
