package stream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/klauspost/compress/zstd"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// The decompression bound (Config.MaxDecompressBatchBytes) is per batch,
// and kgo decompresses every batch of a fetch response before the stage
// sees any of its records, keeping each batch's bytes for as long as its
// records live. A producer's batch of one record of a MiB of zeros is a
// few hundred bytes compressed, and a fetch takes up to 256 KiB of each
// partition (fetchMaxPartitionBytes): with each batch under the bound, a
// fetch would decompress to GBs and crash the stage out of memory on the
// same batches at every restart. So the batches decompressed between two
// polls share a budget of the bound: a batch is decompressed only while
// the budget is not spent (the one that crosses it included, so that any
// one batch always fits, and what a poll's fetches hold stays under
// twice the bound plus one batch per broker fetching at once), and a
// batch past the budget is left where it is: kgo ends the partition's
// records of that fetch before it (or returns errDecompressBudget when it
// is the partition's first batch, which handleFetches clears), and
// fetches it again after the poll, whose end renews the budget. A batch
// is never skipped for the budget; only a batch past the bound is
// (oversized.go).

// errDecompressBudget is the decompressor's answer to a batch of a fetch
// whose earlier batches spent the budget.
var errDecompressBudget = errors.New("stream: batch left for a later fetch: the batches of this poll's fetches decompressed to the budget")

// decompressBudget is the clients' decompressor: kgo's, bounded at the
// bound per batch, and the budget of the batches between two polls.
type decompressBudget struct {
	inner kgo.Decompressor
	limit int64
	used  atomic.Int64
	log   *zap.Logger
}

// newDecompressBudget returns the decompressor of a bound of max bytes per
// batch and a budget of as much between two polls, logging to log.
func newDecompressBudget(max int, log *zap.Logger) (*decompressBudget, error) {
	// kgo's own decompressor, bounded at MaxDecompressBatchBytes, is what
	// a client builds from the option; no client connects before it is used.
	cl, err := kgo.NewClient(kgo.MaxDecompressBatchBytes(max), kgo.DisableClientMetrics())
	if err != nil {
		return nil, fmt.Errorf("stream: decompressor: %w", err)
	}
	defer cl.Close()
	inner, ok := cl.OptValue(kgo.WithDecompressor).(kgo.Decompressor)
	if !ok || inner == nil {
		return nil, errors.New("stream: decompressor: the client has none")
	}
	return &decompressBudget{inner: inner, limit: int64(max), log: log}, nil
}

// codecName is codec's name in a log line.
func codecName(codec kgo.CompressionCodecType) string {
	switch codec {
	case kgo.CodecGzip:
		return "gzip"
	case kgo.CodecSnappy:
		return "snappy"
	case kgo.CodecLz4:
		return "lz4"
	case kgo.CodecZstd:
		return "zstd"
	}
	return fmt.Sprintf("codec %d", codec)
}

// Decompress implements kgo.Decompressor.
func (d *decompressBudget) Decompress(src []byte, codec kgo.CompressionCodecType) ([]byte, error) {
	if codec == kgo.CodecNone {
		return d.inner.Decompress(src, codec)
	}
	if d.used.Load() >= d.limit {
		return nil, errDecompressBudget
	}
	out, err := d.inner.Decompress(src, codec)
	if err != nil {
		if errors.Is(err, kgo.ErrMaxDecompress) || errors.Is(err, zstd.ErrWindowSizeExceeded) {
			// A zstd window over the bound stops the stage: a bound
			// below what producers compress with (config.go).
			return nil, err
		}
		// Bytes the broker accepted, its Java decoders reading them, and
		// Go's refuse (bytes after a gzip member or an lz4 frame, xerial
		// snappy streams one after the other): as a fetch error it would
		// stop the stage on the same batch at every start. Bad input,
		// rejected and skipped as a batch past the bound (oversized.go),
		// which is how kgo hands it to the stage with its offsets.
		d.log.Warn("an input batch does not decompress: rejecting it as past the decompression bound",
			zap.String("codec", codecName(codec)), zap.Error(err))
		return nil, fmt.Errorf("stream: the batch does not decompress: %v: %w", err, kgo.ErrMaxDecompress)
	}
	decoded := decodedCost(out)
	if int64(len(out))+decoded > d.limit {
		// Its records take more decoded than the bound (a record of
		// millions of empty headers): a batch past the bound.
		return nil, fmt.Errorf("stream: the batch's %d bytes take %d more decoded: %w", len(out), decoded, kgo.ErrMaxDecompress)
	}
	if !kgoDecodes(out) {
		// Kafka's decoder read it (it takes a varint's fifth byte up to
		// 0x7f, kgo up to 0x0f), kgo's stops at the record it cannot
		// read and fetches the batch again from that record, for ever:
		// the partition would stall without an error. Bad input too.
		d.log.Warn("an input batch's records do not decode: rejecting it as past the decompression bound", zap.String("codec", codecName(codec)))
		return nil, fmt.Errorf("stream: the batch's records do not decode: %w", kgo.ErrMaxDecompress)
	}
	d.used.Add(int64(cap(out)) + decoded)
	return out, nil
}

// kgoDecodes reports whether kgo decodes every record of b, the
// decompressed records of a batch, reading them as it does
// (readRawRecordsDirect, franz-go v1.22.3).
func kgoDecodes(b []byte) bool {
	for len(b) > 0 {
		_, n, ok := kgoRecord(b)
		if !ok {
			return false
		}
		b = b[n:]
	}
	return true
}

// kgoRecord reads the record that b starts with as kgo does
// (readRawRecordsDirect, franz-go v1.22.3): its offset delta and its
// length with its own; ok is false if kgo cannot decode it.
func kgoRecord(b []byte) (delta int64, n int, ok bool) {
	length, used := kbin.Varint(b)
	total := used + int(length)
	if used <= 0 || length < 0 || len(b) < total {
		return 0, 0, false
	}
	r := kbin.Reader{Src: b[used:total]}
	r.Int8()
	r.Varlong()
	delta = int64(r.Varint())
	r.VarintBytes()
	r.VarintBytes()
	for range max(r.VarintArrayLen(), 0) {
		r.VarintBytes()
		r.VarintBytes()
	}
	return delta, total, r.Ok()
}

// What kgo allocates to decode a record (the Record, and its pointer in
// the fetch) and each of its headers.
const (
	recordCost = int64(unsafe.Sizeof(kgo.Record{})) + 8
	headerCost = int64(unsafe.Sizeof(kgo.RecordHeader{}))
)

// decodedCost is the memory kgo takes, besides b, to decode the records
// of a batch whose decompressed records are b: each record and each of its
// headers, which kgo allocates as many of as a record claims, up to one
// per byte left in it, before it reads them. A few bytes of headers take
// tens of times as much decoded. It reads b as kgo does, and stops where
// kgo stops decoding.
func decodedCost(b []byte) int64 {
	var cost int64
	for len(b) > 0 {
		l, n := binary.Varint(b)
		if n <= 0 || l < 0 || int64(len(b)-n) < l {
			break
		}
		rec := b[n : n+int(l)]
		b = b[n+int(l):]
		cost += recordCost
		// attributes, timestamp and offset deltas, key, value
		if len(rec) == 0 {
			break
		}
		rec = rec[1:]
		ok := true
		for i := 0; i < 4 && ok; i++ {
			v, m := binary.Varint(rec)
			switch {
			case m <= 0:
				ok = false
			case i < 2 || v < 0: // a delta, or a null key or value
				rec = rec[m:]
			case int64(len(rec)-m) < v:
				ok = false
			default:
				rec = rec[m+int(v):]
			}
		}
		if !ok {
			break
		}
		nh, m := binary.Varint(rec)
		if m <= 0 || nh > int64(len(rec)-m) {
			break
		}
		if nh > 0 {
			keys, ok := headerKeysCost(rec[m:], nh)
			cost += nh*headerCost + keys
			if !ok {
				break
			}
		}
	}
	return cost
}

// headerKeysCost is what kgo allocates for the keys of the n headers
// that b starts with: it copies each key into a string, which Go
// allocates in a size class of up to half as much again as its length
// (33 bytes take 48; a large one, whole pages of 8 KiB). ok is false where
// kgo stops decoding the record, after the keys it allocated.
func headerKeysCost(b []byte, n int64) (cost int64, ok bool) {
	for range n {
		kl, m := binary.Varint(b)
		if m <= 0 || kl > int64(len(b)-m) {
			return cost, false
		}
		if kl > 0 {
			cost += kl + kl/2 + 8
			b = b[m+int(kl):]
		} else {
			b = b[m:]
		}
		vl, m := binary.Varint(b)
		if m <= 0 || vl > int64(len(b)-m) {
			return cost, false
		}
		b = b[m+max(int(vl), 0):]
	}
	return cost, true
}

// reset renews the budget: the records of the last poll have been
// processed. A nil d (a Runtime a test built by hand) has none.
func (d *decompressBudget) reset() {
	if d != nil {
		d.used.Store(0)
	}
}

// takeDeferred clears from fs the errors of batches left for a later
// fetch (errDecompressBudget): not errors of the stage, the partition is
// fetched from that batch again.
func (rt *Runtime) takeDeferred(fs kgo.Fetches) {
	for i := range fs {
		for ti := range fs[i].Topics {
			ps := fs[i].Topics[ti].Partitions
			for pi := range ps {
				if ps[pi].Err != nil && errors.Is(ps[pi].Err, errDecompressBudget) {
					rt.log.Debug("batch left for a later fetch: the poll's batches decompressed to the budget",
						zap.String("topic", fs[i].Topics[ti].Topic), zap.Int32("partition", ps[pi].Partition))
					ps[pi].Err = nil
				}
			}
		}
	}
}
