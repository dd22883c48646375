package stream

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// headerRecord encodes a v2 record with no key, no value and n headers
// of a key of keyLen bytes and a null value.
func headerRecord(n, keyLen int) []byte { return headerRecordAt(0, n, keyLen) }

// headerRecordAt is headerRecord at offset delta d.
func headerRecordAt(d int64, n, keyLen int) []byte {
	body := []byte{0}
	body = binary.AppendVarint(body, 0)
	body = binary.AppendVarint(body, d)
	body = binary.AppendVarint(body, -1)
	body = binary.AppendVarint(body, -1)
	body = binary.AppendVarint(body, int64(n))
	h := binary.AppendVarint(nil, int64(keyLen))
	h = append(h, bytes.Repeat([]byte{'k'}, keyLen)...)
	h = binary.AppendVarint(h, -1)
	body = append(body, bytes.Repeat(h, n)...)
	return append(binary.AppendVarint(nil, int64(len(body))), body...)
}

// TestDecodedCostCoversKgo: what kgo allocates to decode a batch, besides
// the batch's bytes, is never more than decodedCost charges for them
// (with a little for kgo's fixed costs): a producer's headers of long
// keys included, which kgo copies into strings. Nor does it charge more
// than twice as much, which would reject batches within the bound.
func TestDecodedCostCoversKgo(t *testing.T) {
	if raceDetector {
		// Its instrumentation allocates besides kgo (twice what kgo
		// allocates for records): the measure is not production's.
		t.Skip("allocations measured without the race detector only (RACE_SKIP's reason)")
	}
	for _, c := range []struct {
		name  string
		recs  []byte
		count int32
	}{
		{"empty records", emptyRecords(100_000), 100_000},
		{"empty headers", headerRecord(500_000, 0), 1},
		{"one header of a long key", headerRecord(1, 8<<20), 1},
		{"headers of 33-byte keys", headerRecord(100_000, 33), 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := kmsg.RecordBatch{Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
				LastOffsetDelta: c.count - 1, NumRecords: c.count, Records: c.recs}
			rp := kmsg.FetchResponseTopicPartition{HighWatermark: int64(c.count), LastStableOffset: int64(c.count),
				RecordBatches: b.AppendTo(nil)}
			binary.BigEndian.PutUint32(rp.RecordBatches[8:12], uint32(len(rp.RecordBatches)-12))
			charged := decodedCost(c.recs)
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			fp, _ := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{DisableCRCValidation: true, Topic: "t"}, &rp, nil, nil)
			runtime.ReadMemStats(&after)
			if fp.Err != nil || len(fp.Records) != int(c.count) {
				t.Fatalf("kgo decoded %d records (%v), want %d", len(fp.Records), fp.Err, c.count)
			}
			allocated := int64(after.TotalAlloc - before.TotalAlloc)
			if allocated > charged+64<<10 {
				t.Errorf("kgo allocated %d bytes to decode %d bytes of records; decodedCost charges %d", allocated, len(c.recs), charged)
			}
			if charged > 2*allocated+64<<10 {
				t.Errorf("decodedCost charges %d for %d bytes of records; kgo allocated %d", charged, len(c.recs), allocated)
			}
			runtime.KeepAlive(fp)
		})
	}
}

// emptyRecords encodes n records of headerRecordAt with no headers.
func emptyRecords(n int) []byte {
	var out []byte
	for i := range n {
		out = append(out, headerRecordAt(int64(i), 0, 0)...)
	}
	return out
}
