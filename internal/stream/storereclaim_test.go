package stream

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/testenv"
)

// TestWipedPartitionGivesDiskBack: the sstables that hold only a wiped
// partition's state leave the disk within a bounded time, with no more
// writes to the store: a range deletion is flushed after
// flushDelayDeleteRange, not when the memtable fills, and Pebble then
// deletes the files it covers (docs/operations.md, State on disk). Two
// partitions of 150,000 keys each, compacted to the bottom level; the
// first is wiped, as the cleanup of partitions held elsewhere and a full
// restore do.
func TestWipedPartitionGivesDiskBack(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for Pebble's delayed flush (10 s)")
	}
	dir := t.TempDir()
	st, err := OpenStore(dir, vfs.Default, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	value := bytes.Repeat([]byte{'v'}, 24)
	for p := int32(1); p <= 2; p++ {
		b := st.newBatch()
		for i := range 150_000 {
			k := sha256.Sum256(binary.BigEndian.AppendUint64(nil, uint64(i)))
			b.set(p, k[:16], value)
			if i%10_000 == 9_999 {
				if err := b.commit(); err != nil {
					t.Fatal(err)
				}
				b = st.newBatch()
			}
		}
		b.checkpoint(p, Checkpoint{Offset: 1})
		if err := b.commit(); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.DB().Compact(context.Background(), []byte{0}, []byte{0xff}, true); err != nil {
		t.Fatal(err)
	}
	wiped := testenv.TablesWithin(t, st.DB(), partPrefix(prefixData, 1), partPrefix(prefixData, 2))
	if len(wiped) < 2 {
		t.Fatalf("%d tables hold only partition 1's state: the test tests nothing", len(wiped))
	}

	if err := st.wipe(1); err != nil {
		t.Fatal(err)
	}
	took := testenv.WaitTablesGone(t, st.DB(), dir, wiped, 30*time.Second, "the wiped partition's state")
	t.Logf("%d tables of partition 1 deleted %s after the wipe", len(wiped), took.Round(100*time.Millisecond))
	k := sha256.Sum256(binary.BigEndian.AppendUint64(nil, 7))
	if v, ok, err := st.Get(2, k[:16]); err != nil || !ok || !bytes.Equal(v, value) {
		t.Fatalf("partition 2's key after the wipe of partition 1: %q %v %v", v, ok, err)
	}
}
