package stream

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
)

// forgedAt is an uncompressed batch of one record whose offset delta is
// delta (docs/design.md, Bad input).
func forgedAt(delta int64) []byte {
	return testenv.RecordBatch(kgo.CodecNone, deltaRecord(delta, "b0", "hostile"))
}

// processedOnce waits until the group has committed every input, fails
// the test unless rejectProc processed want, each once and in order, and
// returns its rejections.
func processedOnce(t *testing.T, s *suite, want []string) (rejected []string) {
	t.Helper()
	s.caughtUp()
	rejected, seen := rejectOutputs(t, s)
	if !slices.Equal(seen, want) {
		t.Errorf("processed %q, want %q: each record once, in order", seen, want)
	}
	return rejected
}

// inputWrite is one write to partition 0 of a suite's input: a record of
// id (its value; key b1), else a raw batch, else what do writes.
type inputWrite struct {
	id    string
	batch []byte
	do    func(t *testing.T, s *suite)
}

// abortedTxn writes n records of size bytes, each its own batch, in a
// transaction that aborts.
func abortedTxn(n, size int) func(t *testing.T, s *suite) {
	return func(t *testing.T, s *suite) {
		txp := testenv.ManualProducer(t, s.brokers, s.input, kgo.TransactionalID(s.input+"-big"), kgo.ProducerBatchMaxBytes(2<<20))
		ctx := context.Background()
		if err := txp.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for range n {
			if err := txp.ProduceSync(ctx, &kgo.Record{Partition: 0, Key: []byte("b9"), Value: make([]byte, size)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := txp.EndTransaction(ctx, kgo.TryAbort); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRealForgedBatchesAround: on a real broker, forged batches next to
// each other, next to a batch past the decompression bound, and after an
// aborted transaction of more bytes than a fetch of a gap reads (its
// batches, one of nearly the fetch's size, straddle the fetches), written
// before the stage starts and while it reads: each is rejected once, and
// every other record processed once, in order.
func TestRealForgedBatchesAround(t *testing.T) {
	brokers := testenv.RealKafka(t)
	bomb := func(t *testing.T, s *suite) {
		testenv.ProduceBatch(t, s.brokers, s.input, 0, testenv.ZstdBomb(t, 4<<20))
	}
	for _, c := range []struct {
		name     string
		writes   []inputWrite
		rejected int
	}{
		{"two forged in a row", []inputWrite{{batch: forgedAt(5)}, {batch: forgedAt(5)}}, 2},
		{"forged then past the bound", []inputWrite{{batch: forgedAt(3)}, {do: bomb}}, 2},
		{"past the bound then forged", []inputWrite{{do: bomb}, {batch: forgedAt(2)}}, 2},
		{"aborted MiBs then forged", []inputWrite{{do: abortedTxn(12, 200<<10)}, {batch: forgedAt(3)}}, 1},
		{"aborted batches near a fetch's size then forged", []inputWrite{{do: abortedTxn(3, 1000<<10)}, {batch: forgedAt(3)}}, 1},
	} {
		for _, running := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/running=%v", c.name, running), func(t *testing.T) {
				s := newSuite(t, brokers, nil)
				start := func() {
					s.startProc("a", vfs.NewMem(), &rejectProc{countProc{output: s.output}}, func(cfg *Config) {
						cfg.VerifyInputGaps, cfg.MaxDecompressBatchBytes = true, 1<<20
					})
				}
				if running {
					start()
				}
				want := []string{"i0"}
				s.sendTo(0, "b1", "i0")
				if running {
					s.caughtUp()
				}
				for _, w := range c.writes {
					if w.batch != nil {
						testenv.ProduceBatch(t, s.brokers, s.input, 0, w.batch)
					} else {
						w.do(t, s)
					}
				}
				for i := 1; i <= 6; i++ {
					want = append(want, fmt.Sprintf("i%d", i))
					s.sendTo(0, "b1", want[i])
				}
				if !running {
					start()
				}
				if rejected := processedOnce(t, s, want); len(rejected) != c.rejected {
					t.Errorf("rejections %q, want %d", rejected, c.rejected)
				}
			})
		}
	}
}
