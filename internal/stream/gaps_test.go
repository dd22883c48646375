package stream

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
)

// deltaRecord is a record of a batch whose offset delta is delta, key
// bucket and value id (no headers).
func deltaRecord(delta int64, bucket, id string) []byte {
	body := []byte{0}                   // attributes
	body = binary.AppendVarint(body, 0) // timestamp delta
	body = binary.AppendVarint(body, delta)
	body = binary.AppendVarint(body, int64(len(bucket)))
	body = append(body, bucket...)
	body = binary.AppendVarint(body, int64(len(id)))
	body = append(body, id...)
	body = binary.AppendVarint(body, 0)
	return append(binary.AppendVarint(nil, int64(len(body))), body...)
}

// fifthByteRecord is a record whose key length, 1, is a varint of five
// bytes whose last is 0x10: Kafka's decoder drops the bits past 32, the
// Kafka client's refuses it and ends its batch there.
func fifthByteRecord() []byte {
	body := append([]byte{0, 0, 0, 0x82, 0x80, 0x80, 0x80, 0x10, 'k'}, binary.AppendVarint(nil, 7)...)
	body = append(append(body, "hostile"...), 0)
	return append(binary.AppendVarint(nil, int64(len(body))), body...)
}

// forgedBatch is an uncompressed batch that a producer can write and the
// broker stores as written (Kafka 4.3 does not check an uncompressed
// batch's offset deltas), written at offset 1 of an input whose records
// before and after it are the test's, and the rejection it must get.
type forgedBatch struct {
	batch []byte
	// rejected is the rejection "topic/partition:from-next", %s the topic.
	rejected string
	// processed are the batch's records that are read at their own
	// offsets before the Kafka client goes wrong (their values).
	processed []string
}

// forgedBatches are batches that the Kafka client reads at offsets other
// than their own: it takes a record's offset for base + delta and drops
// every record it reads after it below that offset, other producers'
// included, and it ends a batch at a record it cannot read.
var forgedBatches = map[string]forgedBatch{
	"offset delta past the batch": {batch: testenv.RecordBatch(kgo.CodecNone, deltaRecord(5, "b0", "hostile")), rejected: "%s/0:1-2"},
	"negative offset delta":       {batch: testenv.RecordBatch(kgo.CodecNone, deltaRecord(-3, "b0", "hostile")), rejected: "%s/0:1-2"},
	"offset deltas out of order": {
		batch:    testenv.RecordBatchOf(kgo.CodecNone, 3, slices.Concat(deltaRecord(0, "b0", "h0"), deltaRecord(2, "b0", "h1"), deltaRecord(1, "b0", "h2"))),
		rejected: "%s/0:2-4", processed: []string{"h0"},
	},
	"varint of a fifth byte over 0x0f": {batch: testenv.RecordBatch(kgo.CodecNone, fifthByteRecord()), rejected: "%s/0:1-2"},
}

// rejectOutputs reads rejectProc's outputs: its rejections, and the ids
// it processed, in order.
func rejectOutputs(t *testing.T, s *suite) (rejected, processed []string) {
	for _, r := range testenv.ReadAll(t, s.brokers, s.output) {
		switch string(r.Key) {
		case "rejected":
			rejected = append(rejected, string(r.Value))
		case "txn": // countProc's record of a transaction
		default:
			processed = append(processed, string(r.Key))
		}
	}
	return rejected, processed
}

// TestForgedOffsetDeltaRejected: an uncompressed batch whose record's
// offset delta is not its own (docs/design.md, Bad input) is rejected and
// skipped as a batch, and the records of the batches after it, which the
// Kafka client dropped, are all processed: none is lost.
func TestForgedOffsetDeltaRejected(t *testing.T) { testForgedOffsetDelta(t, nil) }

// TestRealForgedOffsetDeltaRejected is TestForgedOffsetDeltaRejected on a
// real broker, which stores each batch as written.
func TestRealForgedOffsetDeltaRejected(t *testing.T) {
	testForgedOffsetDelta(t, testenv.RealKafka(t))
}

func testForgedOffsetDelta(t *testing.T, brokers []string) {
	for name, fb := range forgedBatches {
		t.Run(name, func(t *testing.T) {
			s := newSuite(t, brokers, nil)
			s.startProc("a", vfs.NewMem(), &rejectProc{countProc{output: s.output}}, func(c *Config) { c.VerifyInputGaps = true })
			s.sendTo(0, "b0", "i0")
			s.caughtUp()
			testenv.ProduceBatch(t, s.brokers, s.input, 0, fb.batch)
			for i := 1; i <= 7; i++ {
				s.sendTo(0, "b1", fmt.Sprintf("i%d", i))
			}
			s.caughtUp()
			rejected, seen := rejectOutputs(t, s)
			if want := fmt.Sprintf(fb.rejected, s.input); len(rejected) != 1 || rejected[0] != want {
				t.Errorf("rejections %q, want one, %q", rejected, want)
			}
			want := slices.Concat([]string{"i0"}, fb.processed, []string{"i1", "i2", "i3", "i4", "i5", "i6", "i7"})
			if !slices.Equal(seen, want) {
				t.Errorf("processed %q, want %q: each once, in order, none of the batch's past where the client went wrong", seen, want)
			}
		})
	}
}

// TestTransactionalInputGapsSound: the gaps a transactional producer
// leaves in the input (a commit marker per transaction, an aborted
// transaction's records and its marker) are checked and found sound: no
// rejection, every committed record processed once, none of the aborted.
func TestTransactionalInputGapsSound(t *testing.T) { testTransactionalInputGaps(t, nil) }

// TestRealTransactionalInputGapsSound is TestTransactionalInputGapsSound
// on a real broker.
func TestRealTransactionalInputGapsSound(t *testing.T) {
	testTransactionalInputGaps(t, testenv.RealKafka(t))
}

func testTransactionalInputGaps(t *testing.T, brokers []string) {
	s := newSuite(t, brokers, nil)
	in := s.startProc("a", vfs.NewMem(), &rejectProc{countProc{output: s.output}}, func(c *Config) { c.VerifyInputGaps = true })
	txp := testenv.ManualProducer(t, s.brokers, s.input, kgo.TransactionalID(s.input+"-txp"))
	ctx := context.Background()
	want := []string{}
	for txn, commit := range []bool{true, false, true, true} {
		if err := txp.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			id := fmt.Sprintf("t%d-%d", txn, i)
			if err := txp.ProduceSync(ctx, &kgo.Record{Partition: 0, Key: []byte("b0"), Value: []byte(id)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			if commit {
				want = append(want, id)
			}
		}
		if err := txp.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	s.sendTo(0, "b0", "last")
	want = append(want, "last")
	s.caughtUp()
	rejected, seen := rejectOutputs(t, s)
	if len(rejected) != 0 {
		t.Errorf("rejections %q, want none", rejected)
	}
	if !slices.Equal(seen, want) {
		t.Errorf("processed %q, want %q", seen, want)
	}
	sound := testutil.ToFloat64(in.rt.m.gapsChecked.WithLabelValues(gapSound))
	if malformed := testutil.ToFloat64(in.rt.m.gapsChecked.WithLabelValues(gapMalformed)); sound == 0 || malformed != 0 {
		t.Errorf("gaps checked: %v sound, %v malformed; want some sound, none malformed", sound, malformed)
	}
}

// batchBytes is b as the broker stores it at offset base.
func batchBytes(base int64, b []byte) []byte {
	out := bytes.Clone(b)
	binary.BigEndian.PutUint64(out, uint64(base))
	return out
}

// TestCheckGapBatches: the walk of a gap's batches finds the first
// malformed one that holds an offset of the gap, and reads on past sound
// ones, control batches and compressed ones, and stops at a cut batch.
func TestCheckGapBatches(t *testing.T) {
	sound := func(n int32) []byte {
		var recs []byte
		for i := range n {
			recs = append(recs, deltaRecord(int64(i), "b", "v")...)
		}
		return testenv.RecordBatchOf(kgo.CodecNone, n, recs)
	}
	control := batchBytes(0, sound(1))
	control[22] |= 0x20 // attributes, low byte: a control batch
	forged := testenv.RecordBatch(kgo.CodecNone, deltaRecord(3, "b", "v"))
	compressedForged := testenv.RecordBatch(kgo.CodecGzip, deltaRecord(3, "b", "v")) // not read: the broker checks it
	for _, c := range []struct {
		name     string
		raw      []byte
		at, to   int64
		next     int64
		from, nx int64 // the malformed batch's, when from > 0
	}{
		{name: "sound batches", raw: slices.Concat(batchBytes(10, sound(2)), batchBytes(12, sound(3)), batchBytes(15, sound(1))), at: 10, to: 15, next: 15},
		{name: "control batch", raw: slices.Concat(batchBytes(10, control), batchBytes(11, sound(1))), at: 10, to: 11, next: 11},
		{name: "compressed", raw: slices.Concat(batchBytes(10, compressedForged), batchBytes(11, sound(1))), at: 10, to: 11, next: 11},
		{name: "forged in the gap", raw: slices.Concat(batchBytes(10, sound(2)), batchBytes(12, forged), batchBytes(13, sound(1))), at: 10, to: 17, from: 12, nx: 13},
		{name: "forged before the gap", raw: slices.Concat(batchBytes(8, forged), batchBytes(9, sound(2))), at: 9, to: 11, next: 11},
		{name: "forged after the gap", raw: slices.Concat(batchBytes(10, sound(1)), batchBytes(11, forged)), at: 10, to: 11, next: 11},
		{name: "cut batch", raw: slices.Concat(batchBytes(10, sound(2)), batchBytes(12, sound(3))[:30]), at: 10, to: 17, next: 12},
	} {
		t.Run(c.name, func(t *testing.T) {
			next, _, bad := checkGapBatches(c.raw, c.at, c.to)
			switch {
			case c.from > 0 && (bad == nil || bad.From != c.from || bad.Next != c.nx || bad.Malformed == ""):
				t.Errorf("malformed %+v, want the batch of offsets %d to %d", bad, c.from, c.nx-1)
			case c.from == 0 && (bad != nil || next != c.next):
				t.Errorf("next %d, malformed %+v; want %d and none", next, bad, c.next)
			}
		})
	}
}

// TestBatchProblem: what makes an uncompressed batch malformed for the
// Kafka client.
func TestBatchProblem(t *testing.T) {
	batch := func(n int32, recs ...[]byte) *kmsg.RecordBatch {
		var b kmsg.RecordBatch
		if err := b.ReadFrom(testenv.RecordBatchOf(kgo.CodecNone, n, slices.Concat(recs...))); err != nil {
			t.Fatal(err)
		}
		return &b
	}
	for _, c := range []struct {
		name string
		b    *kmsg.RecordBatch
		want string
	}{
		{"sound", batch(2, deltaRecord(0, "b", "v"), deltaRecord(1, "b", "v")), ""},
		{"empty", batch(0), ""},
		{"past the batch", batch(2, deltaRecord(0, "b", "v"), deltaRecord(2, "b", "v")), "record 1 has offset delta 2 (the batch's deltas run from 0 to 1)"},
		{"repeated", batch(2, deltaRecord(0, "b", "v"), deltaRecord(0, "b", "v")), "record 1 has offset delta 0 (the batch's deltas run from 0 to 1)"},
		{"negative", batch(1, deltaRecord(-1, "b", "v")), "record 0 has offset delta -1 (the batch's deltas run from 0 to 0)"},
		{"fewer records than counted", batch(3, deltaRecord(0, "b", "v"), deltaRecord(1, "b", "v")), "record 2 of 3 does not decode"},
		{"undecodable", batch(1, fifthByteRecord()), "record 0 of 1 does not decode"},
	} {
		if got := batchProblem(c.b); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestManyGapsFewFetches: a transactional producer whose every other
// transaction aborts leaves a gap between each two records it commits;
// their check costs fetches in proportion to the bytes of the input, not
// to the gaps (a producer cannot make the stage fetch once a record).
func TestManyGapsFewFetches(t *testing.T) {
	s := newSuite(t, nil, nil)
	const txns = 60
	txp := testenv.ManualProducer(t, s.brokers, s.input, kgo.TransactionalID(s.input+"-txp"))
	ctx := context.Background()
	for txn := range txns {
		if err := txp.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := txp.ProduceSync(ctx, &kgo.Record{Partition: 0, Key: []byte("b0"), Value: []byte(fmt.Sprintf("t%d", txn))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := txp.EndTransaction(ctx, kgo.TransactionEndTry(txn%2 == 0)); err != nil {
			t.Fatal(err)
		}
	}
	var gapFetches atomic.Int64
	s.cluster.ControlKey(kmsg.Fetch.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		s.cluster.KeepControl()
		if kreq.(*kmsg.FetchRequest).MaxWaitMillis == 0 { // the gap check's
			gapFetches.Add(1)
		}
		return nil, nil, false
	})
	in := s.startProc("a", vfs.NewMem(), &rejectProc{countProc{output: s.output}}, func(c *Config) { c.VerifyInputGaps = true })
	s.sendTo(0, "b0", "last")
	s.caughtUp()
	rejected, seen := rejectOutputs(t, s)
	if len(rejected) != 0 || len(seen) != txns/2+1 {
		t.Errorf("%d rejections, %d records processed; want none and %d", len(rejected), len(seen), txns/2+1)
	}
	gaps := testutil.ToFloat64(in.rt.m.gapsChecked.WithLabelValues(gapSound))
	if n := gapFetches.Load(); gaps < txns/2 || n > 4 {
		t.Errorf("%v gaps checked with %d fetches; want at least %d gaps, and at most 4 fetches", gaps, n, txns/2)
	}
}
