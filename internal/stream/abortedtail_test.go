package stream

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
)

// TestRestoreEndsOnAbortedTail: the changelog ends with transactions that
// aborted (their records, then their abort markers, the last offsets of
// the log) and a committed one between them. A restore lists an end past
// every marker, reads none of the aborted records, and ends: at the end,
// not waiting for records read_committed never returns.
func TestRestoreEndsOnAbortedTail(t *testing.T) { restoreEndsOnAbortedTail(t, newSuite(t, nil, nil)) }

// TestRealRestoreEndsOnAbortedTail is the same on the real broker of
// METERLINE_TEST_KAFKA.
func TestRealRestoreEndsOnAbortedTail(t *testing.T) {
	restoreEndsOnAbortedTail(t, newSuite(t, testenv.RealKafka(t), nil))
}

func restoreEndsOnAbortedTail(t *testing.T, s *suite) {
	t.Parallel()
	fsA := vfs.NewMem()
	a := s.start("a", fsA)
	s.send(20)
	s.caughtUp()
	a.shutdown()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prev, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...), kgo.TransactionalID(s.group+"-previous"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prev.Close()
	for i, try := range []kgo.TransactionEndTry{kgo.TryAbort, kgo.TryCommit, kgo.TryAbort, kgo.TryAbort} {
		if err := prev.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for p := range s.parts {
			v := "999"
			if try == kgo.TryCommit {
				v = "x"
			}
			r := &kgo.Record{Topic: s.changelog, Partition: p, Key: []byte("b0"), Value: []byte(v)}
			if try == kgo.TryCommit {
				r.Key = []byte("tick")
			}
			if err := prev.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatalf("transaction %d: %v", i, err)
			}
		}
		if err := prev.EndTransaction(ctx, try); err != nil {
			t.Fatalf("transaction %d: %v", i, err)
		}
	}
	// The markers are written asynchronously on a real broker: wait until
	// the last stable offset reaches the end.
	s.waitFor("the changelog's last abort markers", func() bool {
		lso, err1 := s.adm.ListCommittedOffsets(ctx, s.changelog)
		end, err2 := s.adm.ListEndOffsets(ctx, s.changelog)
		if err1 != nil || err2 != nil {
			return false
		}
		ok := true
		end.Each(func(o kadm.ListedOffset) {
			l, _ := lso.Lookup(s.changelog, o.Partition)
			ok = ok && l.Offset == o.Offset
		})
		return ok
	})

	for _, who := range []struct {
		id string
		fs vfs.FS
	}{{"a", fsA}, {"b", vfs.NewMem()}} { // a restores the tail, b in full
		in := s.start(who.id, who.fs)
		s.waitFor(who.id+" to restore both partitions", func() bool { return in.owned() == int(s.parts) && in.rt.Ready() == nil })
		for p := range s.parts {
			if v, ok, err := in.rt.Store().Get(p, []byte("tick")); err != nil || !ok || string(v) != "x" {
				t.Errorf("%s: partition %d: tick = %q, %v (%v); want the committed x", who.id, p, v, ok, err)
			}
		}
		s.send(20)
		s.caughtUp()
		if who.id == "a" {
			in.shutdown()
			continue
		}
		s.finish(in, who.fs)
	}
}
