package stream

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
)

// TestTooLargeNotRejecter: a batch that decompresses past the bound, in the
// input of a partition that is no BatchRejecter, stops the stage with an
// error naming the batch (docs/design.md, Bad input), and nothing past it
// is committed.
func TestTooLargeNotRejecter(t *testing.T) {
	s := newSuite(t, nil, nil)
	testenv.ProduceBatch(t, s.brokers, s.input, 0, testenv.ZstdBomb(t, 4<<20))
	a := s.start("a", vfs.NewMem(), func(c *Config, _ *countProc) { c.MaxDecompressBatchBytes = 1 << 20 })
	select {
	case <-a.done:
	case <-time.After(time.Minute):
		t.Fatal("the stage did not stop")
	}
	var tl *kgo.ErrDecompressTooLarge
	if err := a.err; !errors.As(err, &tl) || tl.Offset != 0 || tl.NextOffset != 1 || !strings.Contains(err.Error(), "cannot reject") {
		t.Fatalf("stopped with %v, want the batch at offset 0 past the bound, which the stage cannot reject", err)
	}
	offs, err := s.adm.FetchOffsets(t.Context(), s.group)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offs.Lookup(s.input, 0); ok && o.At > 0 {
		t.Errorf("committed offset %d of partition 0, want none past the batch", o.At)
	}
}

// rejectProc is countProc whose partitions reject a batch past the bound:
// one output record, "rejected", naming its offsets.
type rejectProc struct{ countProc }

func (c *rejectProc) Open(p int32, st *PartitionState) (Partition, error) {
	part, err := c.countProc.Open(p, st)
	return &rejectPart{part.(*countPart)}, err
}

type rejectPart struct{ *countPart }

func (c *rejectPart) RejectBatch(tx *Tx, b RejectedBatch) error {
	tx.Emit(&kgo.Record{Topic: c.proc.output, Partition: c.p, Key: []byte("rejected"), Value: fmt.Appendf(nil, "%s/%d:%d-%d", b.Topic, b.Partition, b.From, b.Next)})
	return nil
}

// TestTooLargeLastCommitsPast: a batch past the bound with nothing after
// it, on a partition the group has an offset of: the transaction that
// rejects it commits the offset past it, the state's (kgo's own commit
// would name the partition only for records consumed), and a restart on
// the state finds the two agree (docs/design.md, Exactly-once, 6). The
// session is rebuilt after that transaction, for oversized_batch.
func TestTooLargeLastCommitsPast(t *testing.T) {
	s := newSuite(t, nil, nil)
	fs := vfs.NewMem()
	proc := func() Processor { return &rejectProc{countProc{output: s.output}} }
	bound := func(c *Config) { c.MaxDecompressBatchBytes = 1 << 20 }
	a := s.startProc("a", fs, proc(), bound)
	s.sendTo(0, "b0", "i1")
	s.caughtUp()
	testenv.ProduceBatch(t, s.brokers, s.input, 0, testenv.ZstdBomb(t, 4<<20))
	s.caughtUp()
	s.waitFor("the session to be rebuilt for oversized_batch", func() bool {
		return a.metric("meterline_stream_session_restarts_total", "reason", "oversized_batch") >= 1
	})
	a.shutdown()
	s.startProc("a", fs, proc(), bound)
	s.sendTo(0, "b0", "i2")
	s.caughtUp()
	var rejected []string
	for _, r := range testenv.ReadAll(t, s.brokers, s.output) {
		if string(r.Key) == "rejected" {
			rejected = append(rejected, string(r.Value))
		}
	}
	if want := s.input + "/0:1-2"; len(rejected) != 1 || rejected[0] != want {
		t.Errorf("rejections %q, want one, %q", rejected, want)
	}
}
