package aggregator

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestInvoiceKeysExpire: the invoice keys ('i' P K, invoice.go) of a
// period expire with it, a period whose only keys they are (adjustments
// booked into a day without usage of its own) included.
func TestInvoiceKeysExpire(t *testing.T) {
	_, brokers := testenv.KFake(t)
	h := newAggHarnessSources(t, brokers, 1, 1)
	cat, err := ParseMeters([]byte("meters:\n  - {name: s, aggregation: SUM}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := h.config("a", vfs.NewMem())
	cfg.Period, cfg.Grace, cfg.Window, cfg.Meters = Day, time.Hour, 2*24*time.Hour, cat
	run := h.start(cfg)
	defer func() { _ = run.stop() }()
	const hourMs = int64(3600 * 1000)
	day0 := ms(t, "2026-05-04")
	ev := func(id string, qty, et, arrival int64) *kgo.Record {
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "s", Quantity: qty, EventTime: et, IngestTime: arrival})
	}
	// May 4 is final at May 5 01:00; a late event of it arrives on May 5,
	// a day with no usage of acme's: booked into it, its only key there.
	h.produce(ev("on-time", 5, day0+10*hourMs, day0+10*hourMs), h.watermark(0, 0, 1, day0+25*hourMs+hourMs/2))
	h.caughtUp()
	h.produce(ev("late", 3, day0+20*hourMs, day0+26*hourMs))
	h.caughtUp()
	if n := len(readAdjustments(t, h)); n != 1 {
		t.Fatalf("%d adjustments, want 1", n)
	}
	count := func() int {
		n := 0
		for _, start := range []int64{day0, day0 + 24*hourMs} {
			for _, k := range liveStateKeys(t, h, start) {
				if k[0] == pfxInvoice {
					n++
				}
			}
		}
		return n
	}
	if n := count(); n != 2 {
		t.Fatalf("%d invoice keys after the late event, want 2 (May 4's FINAL, May 5's adjustments)", n)
	}
	h.produce(h.watermark(0, 0, 1, day0+20*24*hourMs))
	h.caughtUp()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n := count()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d invoice keys left after every period expired", n)
		}
	}
}
