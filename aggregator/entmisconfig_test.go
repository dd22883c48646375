package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/schemas"
)

// TestMisconfiguredCapWarnsOncePerMeter (kfake; docs/entitlements.md, Plans
// and caps): a cap on a MAX meter (written without --meters) is ignored,
// every event counted; the aggregator says so once per meter and partition,
// not with each event.
func TestMisconfiguredCapWarnsOncePerMeter(t *testing.T) {
	const n = 1
	h := newEntHarness(t, nil, n)
	cat, err := ParseMeters([]byte("meters:\n  - {name: peak, aggregation: MAX}\n"))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-time.Minute).UnixMilli()
	recs := []*kgo.Record{h.entitlement(n, &schemas.Entitlements{CustomerID: "acme", Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps: []schemas.Cap{{Meter: "peak", Limit: 5, OnLimit: schemas.OnLimitReject}}}, t0)}
	const events = 20
	for i := range events {
		at := t0 + int64(i+1)
		recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprintf("e%02d", i), CustomerID: "acme", Meter: "peak",
			Quantity: 10, EventTime: at, IngestTime: at}))
	}
	h.produce(recs...)
	core, logs := observer.New(zap.WarnLevel)
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.Meters = cat
	cfg.Stream.Logger = zap.New(core)
	run := h.start(cfg)
	awaitDecided(t, h, events)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if rej := readRejected(t, h); len(rej) != 0 {
		t.Errorf("%d events rejected, want none: the cap on a MAX meter is ignored", len(rej))
	}
	if got := logs.FilterMessageSnippet("entitlements misconfigured for a meter").Len(); got != 1 {
		t.Errorf("%d warnings of the misconfigured cap for %d events, want 1", got, events)
	}
}
