package stream

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
)

// produceTxnBatch writes batch, an uncompressed batch of one record, to
// partition 0 of s.input as the next batch of the open transaction of txp,
// a transactional producer that has produced one record to it.
func produceTxnBatch(t *testing.T, s *suite, txp *kgo.Client, txnID string, batch []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id, epoch, err := txp.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var b kmsg.RecordBatch
	if err := b.ReadFrom(batch); err != nil {
		t.Fatal(err)
	}
	b.Attributes |= 0x10 // transactional
	b.ProducerID, b.ProducerEpoch, b.FirstSequence = id, epoch, 1
	out := b.AppendTo(nil)
	binary.BigEndian.PutUint32(out[8:12], uint32(len(out)-12))
	binary.BigEndian.PutUint32(out[17:21], crc32.Checksum(out[21:], crc32.MakeTable(crc32.Castagnoli)))
	td, err := kadm.NewClient(txp).ListTopics(ctx, s.input)
	if err != nil {
		t.Fatal(err)
	}
	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis, req.TransactionID = -1, 60000, &txnID
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic, rt.TopicID = s.input, td[s.input].ID
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = out
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, txp)
	if err != nil {
		t.Fatal(err)
	}
	if c := resp.Topics[0].Partitions[0].ErrorCode; c != 0 {
		t.Fatalf("produce the transaction's batch: error code %d", c)
	}
}

// TestForgedAbortedPastTheEnd: a transactional producer's uncompressed
// batch whose record's offset delta points past the end of the log, in a
// transaction it aborts. The Kafka client keeps no record of an aborted
// transaction, but takes its offset all the same: it drops every record
// after the batch, leaves no record after a gap for the stage to see, and
// asks next for an offset past the log's end, OFFSET_OUT_OF_RANGE, which
// stopped the stage on every start. The batch is rejected and skipped, and
// every record of the other producers processed once.
func TestForgedAbortedPastTheEnd(t *testing.T) { testForgedAbortedPastTheEnd(t, nil) }

// TestRealForgedAbortedPastTheEnd is TestForgedAbortedPastTheEnd on a real
// broker.
func TestRealForgedAbortedPastTheEnd(t *testing.T) {
	testForgedAbortedPastTheEnd(t, testenv.RealKafka(t))
}

// TestForgedAbortedPastTheEndCommitsRefused: the transaction that rejects
// the batch, and skips it, does not commit, twice: the batch is checked
// and rejected again, and in the end rejected once.
func TestForgedAbortedPastTheEndCommitsRefused(t *testing.T) {
	testForgedAbortedPastTheEnd(t, nil, 2)
}

func testForgedAbortedPastTheEnd(t *testing.T, brokers []string, refuse ...int) {
	for _, running := range []bool{false, true} {
		t.Run(fmt.Sprintf("running=%v", running), func(t *testing.T) {
			s := newSuite(t, brokers, nil)
			refused := func() int { return 0 }
			if len(refuse) > 0 {
				refused = testenv.RefuseCommitsPast(s.cluster, s.group, "", [16]byte{}, 2, refuse[0])
			}
			start := func() {
				s.startProc("a", vfs.NewMem(), &rejectProc{countProc{output: s.output}}, func(c *Config) { c.VerifyInputGaps = true })
			}
			if running {
				start()
			}
			s.sendTo(0, "b1", "i0")
			if running {
				s.caughtUp()
			}
			txnID := s.input + "-txp"
			txp := testenv.ManualProducer(t, s.brokers, s.input, kgo.TransactionalID(txnID))
			if err := txp.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := txp.ProduceSync(ctx, &kgo.Record{Partition: 0, Key: []byte("b0"), Value: []byte("aborted")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			produceTxnBatch(t, s, txp, txnID, testenv.RecordBatch(kgo.CodecNone, deltaRecord(1000, "b0", "hostile")))
			s.sendTo(0, "b1", "i1") // another producer's, inside the transaction's offsets
			if err := txp.EndTransaction(ctx, kgo.TryAbort); err != nil {
				t.Fatal(err)
			}
			s.sendTo(0, "b1", "i2")
			if !running {
				start()
			}
			s.caughtUp()
			s.sendTo(0, "b1", "i3")
			rejected := processedOnce(t, s, []string{"i0", "i1", "i2", "i3"})
			if want := s.input + "/0:2-3"; len(rejected) != 1 || rejected[0] != want {
				t.Errorf("rejections %q, want one, %q", rejected, want)
			}
			if len(refuse) > 0 && refused() != refuse[0] {
				t.Errorf("%d commits past the batch refused, want %d", refused(), refuse[0])
			}
		})
	}
}

// TestInputOutOfRangeStillStops: with the input's gaps checked, an input
// offset that retention deleted before the stage read it still stops the
// stage (docs/design.md, Exactly-once, 6): the check of the log from
// there finds it out of range too, and no malformed batch to explain it.
func TestInputOutOfRangeStillStops(t *testing.T) {
	s := newSuite(t, nil, nil)
	fs := vfs.NewMem()
	proc := func() Processor { return &rejectProc{countProc{output: s.output}} }
	verify := func(c *Config) { c.VerifyInputGaps = true }
	a := s.startProc("a", fs, proc(), verify)
	s.sendTo(0, "b1", "i0")
	s.caughtUp()
	a.shutdown()
	for _, id := range []string{"i1", "i2", "i3"} {
		s.sendTo(0, "b1", id)
	}
	ctx := context.Background()
	deleted, err := s.adm.DeleteRecords(ctx, kadm.Offsets{s.input: {0: {Topic: s.input, Partition: 0, At: 3}}})
	if err == nil {
		err = deleted.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	b := s.startProc("a", fs, proc(), verify)
	err = b.exit()
	if err == nil || !strings.Contains(err.Error(), "OFFSET_OUT_OF_RANGE") || !strings.Contains(err.Error(), "never reset automatically") {
		t.Fatalf("stopped with %v, want OFFSET_OUT_OF_RANGE of the input, never reset", err)
	}
	if n := b.metric("meterline_stream_input_gaps_checked_total", "result", gapMalformed); n != 0 {
		t.Errorf("%v malformed batches found, want none", n)
	}
}
