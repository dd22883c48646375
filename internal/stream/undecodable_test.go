package stream

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/klauspost/compress/s2"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/testenv"
)

// undecodableBatches are compressed record batches of one record that
// Kafka (4.3) accepts from a producer, its Java decoders reading them,
// and that kgo's Go decoders refuse: gzip with bytes after its member
// (Java's GZIPInputStream ignores them), an lz4 frame with bytes after it
// (Kafka reads one frame), two xerial snappy streams one after the other
// (snappy-java reads both), and a record kgo cannot read (without an
// error: it fetched the batch again and again).
func undecodableBatches(t *testing.T) map[string][]byte {
	rec := testenv.EncodeRecord([]byte("b0"), []byte("hostile"))
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	if _, err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	comp, err := kgo.DefaultCompressor(kgo.Lz4Compression())
	if err != nil {
		t.Fatal(err)
	}
	lz, codec := comp.Compress(new(bytes.Buffer), rec)
	if codec != kgo.CodecLz4 {
		t.Fatalf("codec %d, want lz4", codec)
	}
	xerial := func(b []byte) []byte {
		out := []byte{130, 83, 78, 65, 80, 80, 89, 0, 0, 0, 0, 1, 0, 0, 0, 1}
		blk := s2.EncodeSnappy(nil, b)
		return append(binary.BigEndian.AppendUint32(out, uint32(len(blk))), blk...)
	}
	// A record whose key length, 1, is a varint of five bytes whose last
	// is 0x10: Kafka's decoder drops the bits past 32, kgo's refuses it.
	body := append([]byte{0, 0, 0, 0x82, 0x80, 0x80, 0x80, 0x10, 'k'}, binary.AppendVarint(nil, 7)...)
	body = append(append(body, "hostile"...), 0)
	fifth := append(binary.AppendVarint(nil, int64(len(body))), body...)
	var gzFifth bytes.Buffer
	w = gzip.NewWriter(&gzFifth)
	if _, err := w.Write(fifth); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		"gzip varint of a fifth byte over 0x0f": testenv.RecordBatch(kgo.CodecGzip, gzFifth.Bytes()),
		"gzip trailing bytes":                   testenv.RecordBatch(kgo.CodecGzip, append(gz.Bytes(), "trailing"...)),
		"lz4 trailing bytes":                    testenv.RecordBatch(kgo.CodecLz4, append(bytes.Clone(lz), "trailing"...)),
		"xerial concatenated":                   testenv.RecordBatch(kgo.CodecSnappy, append(xerial(rec[:3]), xerial(rec[3:])...)),
	}
}

// TestUndecodableBatchRejected: a batch of the input that the broker
// accepted and that does not decompress in the stage is bad input
// (docs/design.md, Bad input): the partition rejects it and moves past
// it, as it does a batch past the bound, and the records after it are
// processed; the stage does not stop on it at every start.
func TestUndecodableBatchRejected(t *testing.T) { testUndecodableBatch(t, nil) }

// TestRealUndecodableBatchRejected is TestUndecodableBatchRejected on a
// real broker, which shows it accepts each batch.
func TestRealUndecodableBatchRejected(t *testing.T) { testUndecodableBatch(t, testenv.RealKafka(t)) }

func testUndecodableBatch(t *testing.T, brokers []string) {
	for name, batch := range undecodableBatches(t) {
		t.Run(name, func(t *testing.T) {
			s := newSuite(t, brokers, nil)
			s.startProc("a", vfs.NewMem(), &rejectProc{countProc{output: s.output}}, func(*Config) {})
			s.sendTo(0, "b0", "i1")
			s.caughtUp()
			testenv.ProduceBatch(t, s.brokers, s.input, 0, batch)
			s.sendTo(0, "b0", "i2")
			s.caughtUp()
			var rejected, counted []string
			for _, r := range testenv.ReadAll(t, s.brokers, s.output) {
				if string(r.Key) == "rejected" {
					rejected = append(rejected, string(r.Value))
				} else {
					counted = append(counted, string(r.Value))
				}
			}
			if want := s.input + "/0:1-2"; len(rejected) != 1 || rejected[0] != want {
				t.Errorf("rejections %q, want one, %q", rejected, want)
			}
			if !slices.Contains(counted, "i1") || !slices.Contains(counted, "i2") || slices.Contains(counted, "hostile") {
				t.Errorf("outputs %q, want i1's and i2's, none of the batch's", counted)
			}
		})
	}
}

// TestZstdWindowOverBoundStops: a zstd frame whose window is over the
// bound is not taken for bad input: the bound is below what producers
// compress with (DefaultMaxDecompressBatchBytes), and rejecting every
// batch they write would not say so; the error stops the stage.
func TestZstdWindowOverBoundStops(t *testing.T) {
	d, err := newDecompressBudget(1<<20, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	frame := testenv.ZstdFrame(27, testenv.EncodeRecord(nil, []byte("v")))
	if _, err := d.Decompress(frame, kgo.CodecZstd); err == nil || errors.Is(err, kgo.ErrMaxDecompress) {
		t.Fatalf("decompress: %v, want the decoder's error, not one past the bound", err)
	}
	if _, err := d.Decompress([]byte("not gzip"), kgo.CodecGzip); !errors.Is(err, kgo.ErrMaxDecompress) {
		t.Fatalf("decompress: %v, want an undecodable batch taken as one past the bound", err)
	}
}
