package dedup

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestDecompressionBombsUnderBound: batches that each decompress to just
// under the bound (a record of a MiB of zeros, 224 bytes compressed), 200
// of them in one fetch of 256 KiB, are each a record dedup rejects as
// oversized, once, and the event after them is forwarded once; the
// stage's heap never holds more than a few of them at a time (stream's
// decompression budget: docs/design.md, Bad input). Without the budget kgo
// decompressed the whole fetch, 200 MiB live here and GBs at the default
// bound, before the stage saw a record: out of memory, again at every
// restart. On a real broker, usage.events is LogAppendTime, as in
// production.
func TestDecompressionBombsUnderBound(t *testing.T) { onBrokers(t, testDecompressionBombsUnderBound) }

func testDecompressionBombsUnderBound(t *testing.T, brokers []string) {
	ts := "CreateTime"
	if brokers != nil {
		ts = "LogAppendTime"
	}
	h := newHarnessWith(t, brokers, 1, ts)
	const n = 200
	bomb := testenv.ZstdBomb(t, 1<<20-1<<10)
	for i := 0; i < n; i++ {
		testenv.ProduceBatch(t, h.brokers, h.names.EventsTopic(), 0, bomb)
	}
	arr := time.Now().UnixMilli()
	h.produce(h.event("acme", "api_calls", "after-the-batches", 1, arr-hour, arr))

	// The live heap, sampled until the stage is done. The wait reads the
	// outputs only: a read of usage.events would decompress the batches
	// in this process too.
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak atomic.Uint64
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		var m runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			runtime.GC()
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > base && m.HeapAlloc-base > peak.Load() {
				peak.Store(m.HeapAlloc - base)
			}
		}
	}()
	r := h.start(bombConfig(h))
	var o outputs
	within(t, time.Minute, "every batch rejected and the event after them forwarded", func() bool {
		if err, done := r.wait(0); done {
			t.Fatalf("dedup stopped: %v", err)
		}
		o = h.outputs()
		return len(o.rejected) >= n && o.byID()["after-the-batches"] >= 1
	})
	close(stop)
	<-sampled

	if got := peak.Load() >> 20; got > 64 {
		t.Errorf("the live heap grew by %d MiB while dedup read %d batches of 224 bytes, want at most 64 MiB", got, n)
	} else {
		t.Logf("the live heap grew by at most %d MiB", got)
	}
	time.Sleep(500 * time.Millisecond) // a copy would have been committed by now
	o = h.outputs()
	if got := o.byID()["after-the-batches"]; got != 1 {
		t.Errorf("the event after the batches forwarded %d times, want 1", got)
	}
	if len(o.rejected) != n {
		t.Fatalf("%d rejections, want %d", len(o.rejected), n)
	}
	for i, rj := range o.rejected {
		if rj.Reason != schemas.ReasonOversized || rj.SourceOffset != int64(i) || rj.RawValueLength != 1<<20-1<<10 {
			t.Fatalf("rejection %d: %s at offset %d of a value of %d bytes, want %s at offset %d of %d bytes",
				i, rj.Reason, rj.SourceOffset, rj.RawValueLength, schemas.ReasonOversized, i, 1<<20-1<<10)
		}
	}
}
