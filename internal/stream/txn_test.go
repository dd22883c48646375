package stream

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// txOver returns a Tx of partition 0 over a store that holds committed.
func txOver(t *testing.T, committed map[string]string) *Tx {
	t.Helper()
	st, err := OpenStore("state", vfs.NewMem(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	b := st.newBatch()
	for k, v := range committed {
		b.set(0, []byte(k), []byte(v))
	}
	if err := b.commit(); err != nil {
		t.Fatal(err)
	}
	return &Tx{rt: &Runtime{store: st}, p: 0, ov: newOverlay()}
}

// changelog returns the transaction's changelog records as "key=value" or
// "key tombstone", in order, without the input offsets.
func changelog(tx *Tx) []string {
	var out []string
	for _, r := range tx.ov.changelogRecords("cl", 0) {
		if r.Value == nil {
			out = append(out, string(r.Key)+" tombstone")
		} else {
			out = append(out, string(r.Key)+"="+string(r.Value))
		}
	}
	return out
}

// view returns what Scan sees of the whole key space.
func view(t *testing.T, tx *Tx) []string {
	t.Helper()
	var out []string
	if err := tx.Scan(nil, nil, func(k, v []byte) error {
		out = append(out, string(k)+"="+string(v))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTxForget: Forget undoes the transaction's writes of a key. A key
// the transaction created is gone with no changelog record (Delete would
// leave a tombstone); a committed key shows its committed value again and
// is not deleted; a key written again after Forget gets one record, at its
// first write's place.
func TestTxForget(t *testing.T) {
	tx := txOver(t, map[string]string{"c": "committed"})
	tx.Put([]byte("n1"), []byte("1"))
	tx.Put([]byte("c"), []byte("changed"))
	tx.Put([]byte("n2"), []byte("2"))
	tx.Put([]byte("n3"), []byte("3"))
	tx.Delete([]byte("n3"))
	tx.Forget([]byte("n1"))
	tx.Forget([]byte("c"))
	tx.Forget([]byte("n3"))
	tx.Forget([]byte("absent")) // never written: nothing to undo

	if _, ok, err := tx.Get([]byte("n1")); err != nil || ok {
		t.Errorf("Get(n1) after Forget: ok=%v err=%v, want absent", ok, err)
	}
	if v, ok, err := tx.Get([]byte("c")); err != nil || !ok || string(v) != "committed" {
		t.Errorf("Get(c) after Forget = %q, %v, %v; want the committed value", v, ok, err)
	}
	if got, want := view(t, tx), []string{"c=committed", "n2=2"}; !slices.Equal(got, want) {
		t.Errorf("Scan = %v, want %v", got, want)
	}
	if got, want := changelog(tx), []string{"n2=2"}; !slices.Equal(got, want) {
		t.Errorf("changelog = %v, want %v (no record for a forgotten key)", got, want)
	}
	tx.Put([]byte("n1"), []byte("again"))
	if got, want := changelog(tx), []string{"n1=again", "n2=2"}; !slices.Equal(got, want) {
		t.Errorf("changelog after writing n1 again = %v, want %v", got, want)
	}
}

// TestTxForgetMany: forgetting most of a large transaction's keys, with
// others written in between (the order compacts as it goes), leaves
// exactly the others in the changelog, in first-write order, each once,
// also when some forgotten keys are written again.
func TestTxForgetMany(t *testing.T) {
	tx := txOver(t, nil)
	var want []string
	for i := range 1000 {
		k := fmt.Sprintf("q%04d", i)
		tx.Put([]byte(k), []byte("x"))
		if i%10 == 0 {
			l := fmt.Sprintf("k%04d", i)
			tx.Put([]byte(l), []byte("y"))
			want = append(want, l+"=y")
		}
		if i >= 3 {
			tx.Forget([]byte(fmt.Sprintf("q%04d", i-3)))
		}
	}
	for i := 997; i < 1000; i++ {
		want = append(want, fmt.Sprintf("q%04d=x", i))
	}
	tx.Put([]byte("q0500"), []byte("back"))
	want = append(want, "q0500=back")
	if got := changelog(tx); !slices.Equal(got, want) {
		t.Errorf("changelog has %d records, want %d:\n%v\nwant\n%v", len(got), len(want), got, want)
	}
}

// TestTxForgetCompactedReads: after the order compacts (most of its keys
// forgotten), every live key still reads, scans and rewrites as its own:
// Get, Scan and a later Put find each key's write where compact moved it.
func TestTxForgetCompactedReads(t *testing.T) {
	tx := txOver(t, nil)
	for i := range 300 {
		tx.Put([]byte(fmt.Sprintf("k%03d", i)), []byte(fmt.Sprintf("v%03d", i)))
	}
	var want []string
	for i := range 300 {
		if i%7 != 0 {
			tx.Forget([]byte(fmt.Sprintf("k%03d", i)))
			continue
		}
		want = append(want, fmt.Sprintf("k%03d=v%03d", i, i))
	}
	if len(tx.ov.order) == 300 {
		t.Fatal("the order did not compact")
	}
	for i := 0; i < 300; i += 7 {
		if v, ok, err := tx.Get([]byte(fmt.Sprintf("k%03d", i))); err != nil || !ok || string(v) != fmt.Sprintf("v%03d", i) {
			t.Fatalf("Get(k%03d) = %q, %v, %v after compaction", i, v, ok, err)
		}
	}
	if got := view(t, tx); !slices.Equal(got, want) {
		t.Fatalf("Scan after compaction = %v, want %v", got, want)
	}
	tx.Put([]byte("k007"), []byte("new"))
	want[1] = "k007=new"
	if got := changelog(tx); !slices.Equal(got, want) {
		t.Fatalf("changelog after a rewrite = %v, want %v", got, want)
	}
}

// TestTxDeleteRangeLocalRewrite: a key removed by DeleteRangeLocal and
// written again in the same transaction gets one changelog record, not
// one per write.
func TestTxDeleteRangeLocalRewrite(t *testing.T) {
	tx := txOver(t, nil)
	tx.Put([]byte("a1"), []byte("1"))
	tx.DeleteRangeLocal([]byte("a"), []byte("b"))
	tx.Put([]byte("a1"), []byte("2"))
	if got, want := changelog(tx), []string{"a1=2"}; !slices.Equal(got, want) {
		t.Errorf("changelog = %v, want %v", got, want)
	}
}

// TestChangelogRecordsShape: the changelog records of a transaction are
// its live keys in first-write order, then its input offsets, each a
// record of its own: topic and partition set, an empty key or value an
// empty (not null) one, a deletion a null value, and a key whose append
// cannot reach the next record's.
func TestChangelogRecordsShape(t *testing.T) {
	tx := txOver(t, nil)
	tx.Put([]byte("b"), []byte("1"))
	tx.Put([]byte(""), nil)
	tx.Put([]byte("gone"), []byte("x"))
	tx.Delete([]byte("a"))
	tx.Forget([]byte("gone"))
	tx.Put([]byte("b"), []byte("2"))
	tx.ov.inputNext = map[string]int64{"\xffin": 7}
	recs := tx.ov.changelogRecords("cl", 3)
	type rec struct {
		key, value   string
		nullK, nullV bool
	}
	var got []rec
	for _, r := range recs {
		if r.Topic != "cl" || r.Partition != 3 || len(r.Headers) != 0 {
			t.Errorf("record %q: topic %q, partition %d, headers %v", r.Key, r.Topic, r.Partition, r.Headers)
		}
		got = append(got, rec{string(r.Key), string(r.Value), r.Key == nil, r.Value == nil})
	}
	for _, r := range recs {
		_ = append(r.Key, 'z')
	}
	for i, r := range recs {
		if string(r.Key) != got[i].key {
			t.Errorf("record %d: key %q after an append to the keys, was %q", i, r.Key, got[i].key)
		}
	}
	want := []rec{{"b", "2", false, false}, {"", "", false, false}, {"a", "", false, true},
		{"\xffin", string(encodeOffset(7)), false, false}}
	if !slices.Equal(got, want) {
		t.Errorf("changelog records = %+v, want %+v", got, want)
	}
}

// closeCounter is a Partition that counts its Close calls.
type closeCounter struct{ closed int }

func (c *closeCounter) Process(*Tx, []*kgo.Record) error { return nil }
func (c *closeCounter) Punctuate(*Tx) error              { return nil }
func (c *closeCounter) Close()                           { c.closed++ }

// TestCloseAllClosesRestoredNotInstalled: a session that ends between a
// partition's restore and its install (its run loop never handled the
// event: InitProducerID failed, say) closes that partition too, once; the
// installed ones as before. An aggregator's partition left open kept its
// gauges (final due, watermark) after another instance took it over.
func TestCloseAllClosesRestoredNotInstalled(t *testing.T) {
	installed, restored, revoked := &closeCounter{}, &closeCounter{}, &closeCounter{}
	rt := &Runtime{m: newMetrics(prometheus.NewRegistry(), "test"), active: map[int32]*activePart{0: {part: installed}}, parts: map[int32]*partState{},
		events: []event{{kind: evRestored, p: 1, part: restored}, {kind: evRevoked, p: 0, part: revoked}}}
	rt.closeAll()
	if installed.closed != 1 || restored.closed != 1 || revoked.closed != 0 {
		t.Errorf("closed: installed %d, restored %d, revoked event's %d; want 1, 1, 0", installed.closed, restored.closed, revoked.closed)
	}
	if len(rt.events) != 0 || len(rt.active) != 0 {
		t.Errorf("left %d events, %d active partitions", len(rt.events), len(rt.active))
	}
}

// TestOverlaySizedByThePrevious: a partition's next overlay has room for
// the keys its previous one wrote, up to maxOverlayHint, whether the
// transaction committed or not; a partition without a previous one starts
// empty.
func TestOverlaySizedByThePrevious(t *testing.T) {
	rt := &Runtime{ovs: map[int32]*overlay{}, txEpoch: map[int32]uint64{}}
	for _, c := range []struct{ p, keys int32 }{{0, 300}, {1, maxOverlayHint + 5}} {
		tx := &Tx{rt: rt, p: c.p, ov: rt.overlayFor(c.p, 1)}
		for i := range c.keys {
			tx.Put(fmt.Appendf(nil, "k%d", i), []byte("v"))
		}
	}
	rt.resetTxn()
	for _, c := range []struct{ p, want int32 }{{0, 300}, {1, maxOverlayHint}, {2, 0}} {
		if got := rt.overlayFor(c.p, 2).room; got != int(c.want) {
			t.Errorf("partition %d: next overlay has room for %d keys, want %d", c.p, got, c.want)
		}
	}
}

// TestOverlayRoomOutlivesAnEmptyTransaction: a transaction in which a
// partition wrote no key, or a few (it only punctuated, or read a tick),
// leaves its next overlay most of the room of the one before (an eighth
// less a transaction), not room for those few keys: the aggregator with
// entitlements punctuates every partition every tick, and such an
// overlay's successor grew to the partition's size key by key again.
func TestOverlayRoomOutlivesAnEmptyTransaction(t *testing.T) {
	rt := &Runtime{ovs: map[int32]*overlay{}, txEpoch: map[int32]uint64{}}
	write := func(p int32, keys int) {
		tx := &Tx{rt: rt, p: p, ov: rt.overlayFor(p, 1)}
		for i := range keys {
			tx.Put(fmt.Appendf(nil, "k%d", i), []byte("v"))
		}
		rt.resetTxn()
	}
	write(0, 4000)
	write(0, 0)
	write(0, 1)
	if got, want := rt.overlayFor(0, 1).room, 4000-500-(3500/8); got != want {
		t.Errorf("after 4,000 keys, then none, then one: room for %d keys, want %d", got, want)
	}
	rt.resetTxn()
	for range 80 {
		write(0, 10)
	}
	if got := rt.overlayFor(0, 1).room; got != 10 {
		t.Errorf("after 80 transactions of 10 keys: room for %d keys, want 10", got)
	}
	l, err := NewLocal(kvProc{}, 0, "in")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.ov = newOverlaySized(800)
	if err := l.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := l.ov.room; got != 700 {
		t.Errorf("Local: after an empty transaction of room 800: room for %d keys, want 700", got)
	}
}

// BenchmarkOverlayWrites is a partition's writes of keys keys a
// transaction into its overlay, its transactions with input alternating
// with as many in which it writes none (empty: the aggregator with
// entitlements punctuates every partition at every tick, whether or not
// the transaction reads input of the partition). ns/key is a write's
// share of the transaction pair.
func BenchmarkOverlayWrites(b *testing.B) {
	const keys = 3_000
	ks := make([][]byte, keys)
	for i := range ks {
		ks[i] = fmt.Appendf(nil, "a-customer-%05d-meter-%d", i/5, i%5)
	}
	v := make([]byte, 60)
	for _, empty := range []bool{false, true} {
		b.Run(fmt.Sprintf("empty=%t", empty), func(b *testing.B) {
			rt := &Runtime{ovs: map[int32]*overlay{}, txEpoch: map[int32]uint64{}}
			for b.Loop() {
				tx := &Tx{rt: rt, p: 0, ov: rt.overlayFor(0, 1)}
				for _, k := range ks {
					tx.Put(k, v)
				}
				rt.resetTxn()
				if empty {
					rt.overlayFor(0, 1)
					rt.resetTxn()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*keys), "ns/key")
		})
	}
}
