package dedup

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
)

// TestUncompressedHeaderBatches: uncompressed batches never reach the
// decompressor, and kgo decodes a record of empty headers (2 bytes each
// on the wire) into 40 bytes a header. One batch of 240 KB (one record of
// 120,000 headers) on each of 64 partitions, 15 MB on the wire, is 300
// MiB decoded when a fetch takes them all; the stage's fetches are
// bounded so that one fetch decodes to at most the decompression bound
// (docs/design.md, Bad input), and the live heap stays near it. Each
// record is rejected (an empty value).
func TestUncompressedHeaderBatches(t *testing.T) { onBrokers(t, testUncompressedHeaderBatches) }

func testUncompressedHeaderBatches(t *testing.T, brokers []string) {
	const parts, headers = 64, 120_000
	h := newHarnessWith(t, brokers, parts, "LogAppendTime")
	if brokers == nil {
		h = newHarness(t, nil, parts)
	}
	batch := testenv.RecordBatch(kgo.CodecNone, headersRecord(0, headers))
	for p := int32(0); p < parts; p++ {
		testenv.ProduceBatch(t, h.brokers, h.names.EventsTopic(), p, batch)
	}
	cfg := bombConfig(h)
	cfg.Stream.MaxDecompressBatchBytes = 16 << 20
	peak := liveHeapGrowth(t, func() {
		r := h.start(cfg)
		within(t, 2*time.Minute, "every record rejected", func() bool {
			if err, done := r.wait(0); done {
				t.Fatalf("dedup stopped: %v", err)
			}
			return len(h.outputs().rejected) >= parts
		})
	})
	t.Logf("the live heap grew by at most %d MiB for %d batches of %d bytes", peak>>20, parts, len(batch))
	if got := peak >> 20; got > 64 {
		t.Errorf("the live heap grew by %d MiB for %d uncompressed batches of %d bytes, want at most 64 MiB", got, parts, len(batch))
	}
	if got := len(h.outputs().rejected); got != parts {
		t.Errorf("%d rejections, want %d", got, parts)
	}
}
