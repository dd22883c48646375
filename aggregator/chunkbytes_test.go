package aggregator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestFinalChunkBoundedInBytes: a month end of aggregates whose group
// values are large (an event may be 16 KiB, schemas.MaxEventBytes, and a
// group value nearly as much) goes out in chunks bounded in bytes too, not
// only in keys (docs/design.md, Exactly-once, 9: no transaction grows
// without bound). 2,000 aggregates with 8 KiB group values are about
// 64 MB of FINAL revisions and changelog records: with the default chunk
// of 10,000 keys they would all be one transaction.
func TestFinalChunkBoundedInBytes(t *testing.T) {
	const n, valueBytes = 2000, 8 << 10
	h := newAggHarnessSources(t, nil, 1, 1)
	cat, err := ParseMeters([]byte("meters:\n  - {name: s, aggregation: SUM, group_by: [g]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	meter := newTxnMeter(h.names)
	cfg := h.config("a", vfs.NewMem())
	cfg.Period, cfg.Grace, cfg.Meters = Day, time.Hour, cat
	cfg.Stream.ClientOptions = []kgo.Opt{kgo.WithHooks(meter)}
	h.start(cfg)
	day := ms(t, "2026-05-04")
	const hourMs = 3600 * 1000
	for from := 0; from < n; from += 200 {
		var recs []*kgo.Record
		for i := from; i < from+200; i++ {
			g := fmt.Sprintf("%05d-%s", i, strings.Repeat("x", valueBytes))
			recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprint(i), CustomerID: "c", Meter: "s",
				Quantity: 1, EventTime: day + 1000, IngestTime: day + 2000, Properties: []schemas.Property{{Name: "g", Value: g}}}))
		}
		h.produce(recs...)
	}
	h.caughtUp()
	meter.reset()
	h.produce(h.watermark(0, 0, 1, day+24*hourMs+hourMs+1))
	finals := 0
	for _, a := range awaitFinals(t, h, n, time.Minute) {
		if a.Status == schemas.StatusFinal {
			finals++
		}
	}
	if finals != n {
		t.Fatalf("%d FINAL revisions, want %d", finals, n)
	}
	rep := meter.report()
	t.Logf("%d transactions with FINAL revisions, the largest transaction %d records, %d bytes", rep.finalTxs, rep.max.records, rep.max.bytes)
	const limit = 8 * DefaultFinalChunkBytes
	if rep.max.bytes > limit {
		t.Errorf("a transaction of the month end wrote %d bytes, more than %d", rep.max.bytes, limit)
	}
}
