package dedup

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

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
	h := productionHarness(t, brokers)
	const n = 200
	bomb := testenv.ZstdBomb(t, 1<<20-1<<10)
	for i := 0; i < n; i++ {
		testenv.ProduceBatch(t, h.brokers, h.names.EventsTopic(), 0, bomb)
	}
	arr := time.Now().UnixMilli()
	h.produce(h.event("acme", "api_calls", "after-the-batches", 1, arr-hour, arr))

	// The wait reads the outputs only: a read of usage.events would
	// decompress the batches in this process too.
	peak := liveHeapGrowth(t, func() {
		r := h.start(bombConfig(h))
		within(t, time.Minute, "every batch rejected and the event after them forwarded", func() bool {
			if err, done := r.wait(0); done {
				t.Fatalf("dedup stopped: %v", err)
			}
			o := h.outputs()
			return len(o.rejected) >= n && o.byID()["after-the-batches"] >= 1
		})
	})
	if got := peak >> 20; got > 64 {
		t.Errorf("the live heap grew by %d MiB while dedup read %d batches of 224 bytes, want at most 64 MiB", got, n)
	} else {
		t.Logf("the live heap grew by at most %d MiB", got)
	}
	time.Sleep(500 * time.Millisecond) // a copy would have been committed by now
	o := h.outputs()
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

// TestDecompressionBombOfHeaders: a batch of 1,702 bytes, under the bound
// decompressed (8 MiB at a bound of 16 MiB), whose one record has 4 Mi
// empty headers, which the Kafka client decodes into 160 MiB, is a batch
// past the bound: rejected as oversized and skipped, and the live heap
// stays small (docs/design.md, Bad input).
func TestDecompressionBombOfHeaders(t *testing.T) { onBrokers(t, testDecompressionBombOfHeaders) }

func testDecompressionBombOfHeaders(t *testing.T, brokers []string) {
	h := productionHarness(t, brokers)
	testenv.ProduceBatch(t, h.brokers, h.names.EventsTopic(), 0, headersBomb(t, 4<<20))
	arr := time.Now().UnixMilli()
	h.produce(h.event("acme", "api_calls", "after-the-batch", 1, arr-hour, arr))
	cfg := bombConfig(h)
	cfg.Stream.MaxDecompressBatchBytes = 16 << 20
	peak := liveHeapGrowth(t, func() {
		r := h.start(cfg)
		within(t, time.Minute, "the event after the batch forwarded", func() bool {
			if err, done := r.wait(0); done {
				t.Fatalf("dedup stopped: %v", err)
			}
			return h.outputs().byID()["after-the-batch"] >= 1
		})
	})
	if got := peak >> 20; got > 64 {
		t.Errorf("the live heap grew by %d MiB for a batch of 4 Mi headers, want at most 64 MiB", got)
	}
	o := h.outputs()
	want := fmt.Sprintf("record batch at offsets 0 to 0 decompresses to more than %d bytes with its decoded records; not decoded, skipped", 16<<20)
	if len(o.rejected) != 1 || o.rejected[0].Reason != schemas.ReasonOversized || o.rejected[0].Detail != want {
		t.Fatalf("rejected %s, want the batch at offset 0 as %s", rejections(o.rejected), schemas.ReasonOversized)
	}
}

// headersBomb is a zstd record batch of one record with no key and no
// value and n empty headers (2 bytes each).
func headersBomb(t *testing.T, n int) []byte {
	var comp bytes.Buffer
	enc, err := zstd.NewWriter(&comp, zstd.WithWindowSize(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = enc.Write(headersRecord(-1, n))
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return testenv.ZstdRecordBatch(comp.Bytes())
}

// headersRecord is a record of a batch with no key, a value of valueLen
// zeros (-1: none) and n empty headers (2 bytes each).
func headersRecord(valueLen, n int) []byte {
	body := []byte{0}                    // attributes
	body = binary.AppendVarint(body, 0)  // timestamp delta
	body = binary.AppendVarint(body, 0)  // offset delta
	body = binary.AppendVarint(body, -1) // no key
	body = binary.AppendVarint(body, int64(valueLen))
	body = append(body, make([]byte, max(valueLen, 0))...)
	body = binary.AppendVarint(body, int64(n))
	body = append(body, bytes.Repeat([]byte{0, 1}, n)...) // key "", value null
	return append(binary.AppendVarint(nil, int64(len(body))), body...)
}

// liveHeapGrowth runs fn and returns by how much the live heap grew
// above where it was before, at most, sampled every 10 ms.
func liveHeapGrowth(t *testing.T, fn func()) (grew uint64) {
	t.Helper()
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
	defer func() { // fn may end the test (t.Fatal)
		close(stop)
		<-sampled
		grew = peak.Load()
	}()
	fn()
	return 0 // set by the deferred function
}

// productionHarness is a harness of one partition whose usage.events is
// LogAppendTime on a real broker, as in production (CreateTime on kfake).
func productionHarness(t *testing.T, brokers []string) *harness {
	if brokers == nil {
		return newHarness(t, nil, 1)
	}
	return newHarnessWith(t, brokers, 1, "LogAppendTime")
}
