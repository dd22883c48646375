package stream

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestLocalCommitsToTheStore: a Local's Commit leaves in its store what a
// committed transaction leaves in Pebble (the writes, the deletes, the
// next input offset of each topic), and a Process after it sees them.
func TestLocalCommitsToTheStore(t *testing.T) {
	l, err := NewLocal(kvProc{}, 3, "in")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Process([]*kgo.Record{{Topic: "in", Offset: 7, Key: []byte("a"), Value: []byte("1")},
		{Topic: "in", Offset: 8, Key: []byte("b"), Value: []byte("2")}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Process([]*kgo.Record{{Topic: "side", Offset: 41, Key: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	if v, ok, _ := l.rt.store.Get(3, []byte("a")); ok {
		t.Fatalf("a is %q in the store before Commit", v)
	}
	if err := l.Commit(); err != nil {
		t.Fatal(err)
	}
	c := Config{InputTopic: "in"}
	for k, want := range map[string]string{"a": "1", "b": "", c.inputOffsetKey("in"): string(encodeOffset(9)),
		c.inputOffsetKey("side"): string(encodeOffset(42))} {
		v, ok, err := l.rt.store.Get(3, []byte(k))
		if err != nil || ok != (want != "") || string(v) != want {
			t.Errorf("store %q: %q %v %v, want %q", k, v, ok, err, want)
		}
	}
}

// echoProc stores each record's key and value and emits it to "out".
type echoProc struct{}

func (echoProc) Open(int32, *PartitionState) (Partition, error) { return echoPart{}, nil }

type echoPart struct{ kvPart }

func (echoPart) Process(tx *Tx, recs []*kgo.Record) error {
	for _, r := range recs {
		tx.Put(r.Key, r.Value)
		tx.Emit(&kgo.Record{Topic: "out", Key: r.Key, Value: r.Value})
	}
	return nil
}

// TestLocalAbortAndRestore: a kept Local hands out only the records of
// committed transactions; an aborted one's writes and records are gone;
// a Local restored from the changelog sees the committed writes.
func TestLocalAbortAndRestore(t *testing.T) {
	l, err := NewLocal(echoProc{}, 1, "in")
	if err != nil {
		t.Fatal(err)
	}
	l.Keep()
	if err := l.Process([]*kgo.Record{{Topic: "in", Offset: 0, Key: []byte("a"), Value: []byte("1")}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := l.Process([]*kgo.Record{{Topic: "in", Offset: 1, Key: []byte("b"), Value: []byte("2")}}); err != nil {
		t.Fatal(err)
	}
	if dropped := l.Abort(); len(dropped) != 1 || string(dropped[0].Key) != "b" {
		t.Fatalf("Abort returned %v, want the record of b", dropped)
	}
	if _, ok, _ := l.rt.store.Get(1, []byte("b")); ok {
		t.Fatal("b in the store after its transaction aborted")
	}
	if out := l.TakeOutput(); len(out) != 1 || string(out[0].Key) != "a" {
		t.Fatalf("output %v, want a's record only", out)
	}
	cl := l.Changelog()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := RestoreLocal(echoProc{}, 1, "in", cl)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	v, ok, err := r.rt.store.Get(1, []byte("a"))
	if err != nil || !ok || string(v) != "1" {
		t.Fatalf("restored a: %q %v %v", v, ok, err)
	}
	if _, ok, _ := r.rt.store.Get(1, []byte("b")); ok {
		t.Fatal("b restored from the changelog of an aborted transaction")
	}
}

// TestRestoreLocalOfNothingKeeps: a Local restored from the changelog of
// a kept Local that committed nothing (an empty changelog: its first
// transaction aborted) keeps its records and changelog, as any restored
// Local does.
func TestRestoreLocalOfNothingKeeps(t *testing.T) {
	l, err := NewLocal(echoProc{}, 1, "in")
	if err != nil {
		t.Fatal(err)
	}
	l.Keep()
	if err := l.Process([]*kgo.Record{{Topic: "in", Offset: 0, Key: []byte("a"), Value: []byte("1")}}); err != nil {
		t.Fatal(err)
	}
	l.Abort()
	cl := l.Changelog()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := RestoreLocal(echoProc{}, 1, "in", cl)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Process([]*kgo.Record{{Topic: "in", Offset: 0, Key: []byte("a"), Value: []byte("1")}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Commit(); err != nil {
		t.Fatal(err)
	}
	if out := r.TakeOutput(); len(out) != 1 {
		t.Errorf("%d records out of the committed transaction, want 1", len(out))
	}
	if len(r.Changelog()) == 0 {
		t.Error("no changelog records of the committed transaction")
	}
}
