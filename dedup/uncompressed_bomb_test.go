package dedup

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

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
	batch := uncompressedHeadersBatch(headers)
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

// uncompressedHeadersBatch is an uncompressed record batch of one record
// with no key, an empty value and n empty headers.
func uncompressedHeadersBatch(n int) []byte {
	body := []byte{0}                    // attributes
	body = binary.AppendVarint(body, 0)  // timestamp delta
	body = binary.AppendVarint(body, 0)  // offset delta
	body = binary.AppendVarint(body, -1) // no key
	body = binary.AppendVarint(body, 0)  // an empty value
	body = binary.AppendVarint(body, int64(n))
	body = append(body, bytes.Repeat([]byte{0, 1}, n)...) // key "", value null
	now := time.Now().UnixMilli()
	b := kmsg.RecordBatch{Magic: 2, FirstTimestamp: now, MaxTimestamp: now, ProducerID: -1, ProducerEpoch: -1,
		FirstSequence: -1, NumRecords: 1, Records: append(binary.AppendVarint(nil, int64(len(body))), body...)}
	out := b.AppendTo(nil)
	binary.BigEndian.PutUint32(out[8:12], uint32(len(out)-12))
	binary.BigEndian.PutUint32(out[17:21], crc32.Checksum(out[21:], crc32.MakeTable(crc32.Castagnoli)))
	return out
}
