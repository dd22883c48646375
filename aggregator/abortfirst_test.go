package aggregator

import (
	"testing"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
)

// TestFirstTransactionAbortedThenWork: new state's first transaction
// (the one that records the key scheme, the entitlements mode, the
// partition counts and the period) aborts; the partition's next
// transaction is the reload's Work, which writes state of its own and
// commits. The state it leaves records what the first one would have:
// the partition opens again from its changelog (without them it read as
// state of another key scheme and the stage stopped).
func TestFirstTransactionAbortedThenWork(t *testing.T) {
	for _, ent := range []bool{false, true} {
		names := topics.DefaultNames()
		names.Prefix = "bench."
		l, err := stream.NewLocal(procBenchProcessor(t, names, ent), 0, names.DedupedTopic())
		if err != nil {
			t.Fatal(err)
		}
		l.Keep()
		if ent {
			recs, err := procBenchEnt(names, procBenchNow)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Process(recs); err != nil {
				t.Fatal(err)
			}
		} else if err := l.Process(nil); err != nil {
			t.Fatal(err)
		}
		l.Abort()
		if worked, err := l.Work(); err != nil || !worked {
			t.Fatalf("entitlements %v: Work after the abort: worked %v, %v; want a reload", ent, worked, err)
		}
		if err := l.Commit(); err != nil {
			t.Fatal(err)
		}
		changelog := l.Changelog()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if len(changelog) == 0 {
			t.Fatalf("entitlements %v: the Work transaction wrote no state: the test tests nothing", ent)
		}
		again, err := stream.RestoreLocal(procBenchProcessor(t, names, ent), 0, names.DedupedTopic(), changelog)
		if err != nil {
			t.Fatalf("entitlements %v: the partition does not open again from its state: %v", ent, err)
		}
		if err := again.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
