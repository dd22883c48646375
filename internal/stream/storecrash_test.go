package stream

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
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

	crashed, err := OpenStore(copyFiles(t, dir), vfs.Default, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer crashed.Close()
	cp, ok, err := crashed.Checkpoint(1)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatal("no checkpoint of partition 1 in the store's files after 3 committed batches: a process crash would cost a full restore")
	}
	if cp.Offset < 1 {
		t.Fatalf("checkpoint %d after a process crash, want at least 1", cp.Offset)
	}
	t.Logf("checkpoint in the files after a process crash: %d (the last commit's: 3)", cp.Offset)
}
