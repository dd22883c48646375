package testenv

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Record batches written as raw bytes, as a producer that does not use a
// client library can write them.

// ZstdBomb is a record batch as any producer can write it: one record
// whose value is n zero bytes, zstd-compressed, a few KiB for MiBs (a
// decompression bomb: docs/design.md, Bad input).
func ZstdBomb(t testing.TB, n int) []byte { return ZstdBombKey(t, nil, n) }

// ZstdBombKey is ZstdBomb whose record has key (nil: none), as a
// compacted topic requires.
func ZstdBombKey(t testing.TB, key []byte, n int) []byte {
	var comp bytes.Buffer
	enc, err := zstd.NewWriter(&comp, zstd.WithWindowSize(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = enc.Write(EncodeRecord(key, make([]byte, n)))
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return ZstdRecordBatch(comp.Bytes())
}

// EncodeRecord returns a record of a batch (offset and timestamp deltas
// 0, no headers); a nil key is none.
func EncodeRecord(key, value []byte) []byte {
	body := []byte{0}                   // attributes
	body = binary.AppendVarint(body, 0) // timestamp delta
	body = binary.AppendVarint(body, 0) // offset delta
	if key == nil {
		body = binary.AppendVarint(body, -1)
	} else {
		body = binary.AppendVarint(body, int64(len(key)))
		body = append(body, key...)
	}
	body = binary.AppendVarint(body, int64(len(value)))
	body = append(body, value...)
	body = binary.AppendVarint(body, 0) // no headers
	return append(binary.AppendVarint(nil, int64(len(body))), body...)
}

// ZstdRecordBatch returns a batch of one record whose zstd-compressed
// bytes are comp.
func ZstdRecordBatch(comp []byte) []byte { return RecordBatch(kgo.CodecZstd, comp) }

// RecordBatch returns a batch of one record whose bytes, compressed with
// codec, are records.
func RecordBatch(codec kgo.CompressionCodecType, records []byte) []byte {
	return RecordBatchOf(codec, 1, records)
}

// RecordBatchOf returns a batch of n records whose bytes, compressed with
// codec, are records.
func RecordBatchOf(codec kgo.CompressionCodecType, n int32, records []byte) []byte {
	now := time.Now().UnixMilli()
	b := kmsg.RecordBatch{Magic: 2, Attributes: int16(codec), FirstTimestamp: now, MaxTimestamp: now,
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: n, LastOffsetDelta: n - 1, Records: records}
	out := b.AppendTo(nil)
	binary.BigEndian.PutUint32(out[8:12], uint32(len(out)-12))
	binary.BigEndian.PutUint32(out[17:21], crc32.Checksum(out[21:], crc32.MakeTable(crc32.Castagnoli)))
	return out
}

// ZstdFrame is one zstd frame holding content as a raw block, with a
// window of 2^windowLog bytes and no content size: what a streaming
// compressor writes (Kafka's Java producer at compression.zstd.level 22
// declares a window of 2^27).
func ZstdFrame(windowLog int, content []byte) []byte {
	f := []byte{0x28, 0xB5, 0x2F, 0xFD, 0, byte((windowLog - 10) << 3)}
	v := 1 | len(content)<<3 // the last block, raw
	f = append(f, byte(v), byte(v>>8), byte(v>>16))
	return append(f, content...)
}

// ProduceBatch writes a raw record batch to partition p of topic.
func ProduceBatch(t testing.TB, brokers []string, topic string, p int32, batch []byte) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	td, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = -1, 60000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic, rt.TopicID = topic, td[topic].ID
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Partition, rp.Records = p, batch
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if c := resp.Topics[0].Partitions[0].ErrorCode; c != 0 {
		t.Fatalf("produce the batch: error code %d", c)
	}
}
