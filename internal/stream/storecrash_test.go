package stream

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.uber.org/zap"
)

// copyFiles copies the files of dir into a new directory as the OS has
// them now: what a process killed at this moment leaves on disk.
func copyFiles(t *testing.T, dir string) string {
	t.Helper()
	out := t.TempDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestStoreCommitsSurviveProcessCrash: the checkpoints of batches
// committed at low traffic (far less than Pebble's 32 KiB WAL block) are
// in the files the OS has, without a Close: a process killed after them
// restarts from its checkpoints (Store, commit).
func TestStoreCommitsSurviveProcessCrash(t *testing.T) {
	dir := t.TempDir()
	st, err := OpenStore(dir, vfs.Default, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	at := time.Now().Truncate(time.Millisecond)
	for i := range 3 {
		b := st.newBatch()
		b.set(1, []byte{byte(i)}, []byte("v"))
		b.checkpoint(1, Checkpoint{Offset: int64(i + 1), At: at})
		if err := b.commit(); err != nil {
			t.Fatal(err)
		}
	}

	cp := checkpointInFiles(t, dir)
	if cp < 1 {
		t.Fatalf("checkpoint %d of partition 1 (0: none) in the store's files after 3 committed batches, want at least 1: a process crash would cost a full restore", cp)
	}
	t.Logf("checkpoint in the files after a process crash: %d (the last commit's: 3)", cp)
}

// checkpointInFiles returns partition 1's checkpoint offset in the files
// the OS has of the store in dir (copyFiles): what a process killed now
// would restart from; 0 when there is none.
func checkpointInFiles(t *testing.T, dir string) int64 {
	t.Helper()
	st, err := OpenStore(copyFiles(t, dir), vfs.Default, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cp, _, err := st.Checkpoint(1)
	if err != nil {
		t.Fatal(err)
	}
	return cp.Offset
}

// flushers counts the goroutines of stores' flushers, once it is want
// or after a second (at once for a negative want).
func flushers(want int) int {
	buf := make([]byte, 1<<22)
	deadline := time.Now().Add(time.Second)
	for {
		n := strings.Count(string(buf[:runtime.Stack(buf, true)]), "stream.(*Store).flushWAL(")
		if n == want || want < 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStoreFlushesTheLastCommit: a batch committed right after a synced
// one, with no commit after it, reaches the store's files within about the
// sync interval, without a Close (Store: the flusher); an idle store syncs
// no more once it has; Close ends the flusher. Not parallel, for its count
// of flushers.
func TestStoreFlushesTheLastCommit(t *testing.T) {
	const every = 300 * time.Millisecond
	dir := t.TempDir()
	var walSyncs atomic.Int64
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		sync := op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo
		if sync && strings.HasSuffix(op.Path, ".log") {
			walSyncs.Add(1)
		}
		return nil
	}))
	before := flushers(-1)
	st, err := openStore(dir, fs, zap.NewNop(), every)
	if err != nil {
		t.Fatal(err)
	}
	if n := flushers(before + 1); n != before+1 {
		t.Fatalf("%d flushers running after the store opened, want %d", n, before+1)
	}
	at := time.Now().Truncate(time.Millisecond)
	for i := range 2 {
		if i > 0 {
			// Past the first sync, with Pebble's WAL writer idle again:
			// it would otherwise write out a batch that comes as it
			// finishes.
			time.Sleep(every / 6)
		}
		b := st.newBatch()
		b.set(1, []byte{byte(i)}, []byte("v"))
		b.checkpoint(1, Checkpoint{Offset: int64(i + 1), At: at})
		if err := b.commit(); err != nil {
			t.Fatal(err)
		}
	}
	committed := time.Now()
	// The first commit after open syncs; the second, within the interval
	// after it, does not.
	if cp := checkpointInFiles(t, dir); cp != 1 {
		t.Fatalf("checkpoint %d in the files right after the second commit, want 1 (the first commit's, which synced)", cp)
	}
	for checkpointInFiles(t, dir) != 2 {
		if time.Since(committed) > 3*every {
			t.Fatalf("the last commit's checkpoint is not in the store's files %s after it, with no commit after it: a process crash loses it", time.Since(committed).Round(time.Millisecond))
		}
		time.Sleep(every / 10)
	}
	t.Logf("the last commit's checkpoint reached the store's files after %s (sync interval %s)", time.Since(committed).Round(time.Millisecond), every)

	idle := walSyncs.Load()
	time.Sleep(3 * every)
	if n := walSyncs.Load() - idle; n != 0 {
		t.Errorf("an idle store synced its WAL %d times in %s", n, 3*every)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if n := flushers(before); n != before {
		t.Errorf("%d flushers running after the store closed, want %d", n, before)
	}
}
