package stream

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/testenv"
)

// TestCorruptTableFoundReading: a table whose block a failing disk
// changed opens (Pebble checks a block's checksum only as it reads it);
// the read that finds it used to exit the process (Pebble's default
// DataCorruption handler calls Fatalf), and every restart read it again.
// The read now returns an error naming the state's directory, the store
// marks the state corrupt on disk and tells its runtime, and the next
// open moves the state aside and opens an empty one (reason
// corrupt_read).
func TestCorruptTableFoundReading(t *testing.T) {
	dir := flushedState(t)
	table := filepath.Base(corruptFile(t, dir, isTable))
	core, logs := observer.New(zapcore.ErrorLevel)
	st, err := OpenStore(dir, vfs.Default, zap.New(core))
	if err != nil {
		t.Fatalf("the state with a corrupt table block does not open: %v", err)
	}
	told := make(chan error, 1)
	st.OnCorrupt(func(err error) { told <- err })
	err = st.Scan(1, nil, nil, func(k, v []byte) error { return nil })
	if err == nil {
		t.Fatal("the scan of the corrupt table returned no error")
	}
	for _, want := range []string{dir, table, "corrupt", "next start"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	select {
	case terr := <-told:
		if terr.Error() != err.Error() {
			t.Errorf("the runtime was told %q, the read returned %q", terr, err)
		}
	default:
		t.Error("the runtime was not told")
	}
	b := st.newBatch()
	b.set(1, []byte("k"), []byte("v"))
	if cerr := b.commit(); cerr == nil || cerr.Error() != err.Error() {
		t.Errorf("a commit to the corrupt state: %v, want %q", cerr, err)
	}
	if len(logs.FilterField(zap.String("state_dir", dir)).All()) != 1 {
		t.Errorf("want one error naming the state: %v", logs.All())
	}
	if err := st.Close(); err != nil {
		t.Logf("close: %v", err)
	}

	core, logs = observer.New(zapcore.WarnLevel)
	st, err = OpenStore(dir, vfs.Default, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.rebuilt != rebuiltCorruptRead {
		t.Errorf("rebuilt %q, want %q", st.rebuilt, rebuiltCorruptRead)
	}
	if parts, err := st.partitions(); err != nil || len(parts) != 0 {
		t.Errorf("partitions of the rebuilt state: %v, %v; want none", parts, err)
	}
	if _, err := os.Stat(filepath.Join(dir+corruptSuffix, table)); err != nil {
		t.Errorf("the corrupt table is not kept aside: %v", err)
	}
	if w := logs.FilterField(zap.String("reason", rebuiltCorruptRead)).All(); len(w) != 1 ||
		!strings.Contains(w[0].ContextMap()["error"].(string), table) {
		t.Errorf("want one warning of the rebuild naming the table %s: %v", table, logs.All())
	}
}

// TestStageStopsOnCorruptTable: a count stage on kfake whose state's
// table was corrupted while it was stopped. Found as the stage starts (the
// table holds the store's metadata) New returns the error, and found as
// it runs (by a compaction here) Run does: either names the state, and no
// longer exits the process. The next start rebuilds the state from the
// changelog, exactly-once.
func TestStageStopsOnCorruptTable(t *testing.T) { stageStopsOnCorruptTable(t, nil) }

// TestRealStageStopsOnCorruptTable is TestStageStopsOnCorruptTable on the
// real broker of METERLINE_TEST_KAFKA.
func TestRealStageStopsOnCorruptTable(t *testing.T) {
	stageStopsOnCorruptTable(t, testenv.RealKafka(t))
}

func stageStopsOnCorruptTable(t *testing.T, brokers []string) {
	for _, running := range []bool{false, true} {
		t.Run(map[bool]string{false: "at start", true: "running"}[running], func(t *testing.T) {
			var fill func(st *Store)
			if running {
				// Partition 0's state grows keys after its own, so that
				// the middle of the table, which corruptFile damages,
				// holds none the stage reads.
				fill = func(st *Store) {
					b := st.newBatch()
					for i := range 3000 {
						b.set(0, fmt.Appendf(nil, "zz-%05d", i), make([]byte, 100))
					}
					if err := b.commit(); err != nil {
						t.Fatal(err)
					}
				}
			}
			s := stoppedWithTable(t, brokers, fill)
			if running {
				// The largest table, the middle of which holds fill's
				// keys only: a table with the stage's own keys alone
				// (its memtable flushed as it ran, or its WAL as the
				// state opened for fill) is read as the stage starts.
				corruptFile(t, "state-a", largestTable(t, "state-a"))
			} else {
				corruptFile(t, "state-a", isTable)
			}

			s.send(20)
			var stopped error
			if running {
				a2 := s.start("a", vfs.Default)
				s.caughtUp()
				if err := a2.rt.Store().DB().Compact(context.Background(), []byte{0}, []byte{0xff}, true); err == nil {
					t.Error("the compaction of the corrupt table succeeded")
				}
				stopped = a2.exit()
			} else {
				_, stopped = New(s.config("a", vfs.Default), &countProc{output: s.output})
			}
			if stopped == nil || !strings.Contains(stopped.Error(), "the state in state-a is corrupt") ||
				!strings.Contains(stopped.Error(), "next start") {
				t.Fatalf("the stage stopped with %v, want the corrupt state's error", stopped)
			}
			a3 := s.start("a", vfs.Default)
			if v := a3.metric("meterline_stream_state_rebuilt_total", "reason", rebuiltCorruptRead); v != 1 {
				t.Errorf("meterline_stream_state_rebuilt_total{reason=corrupt_read} = %v, want 1", v)
			}
			s.finish(a3, vfs.Default)
		})
	}
}

// largestTable matches the largest table (.sst) of dir alone.
func largestTable(t *testing.T, dir string) func(string) bool {
	t.Helper()
	var name string
	var size int64 = -1
	for _, n := range listFiles(t, dir) {
		if !isTable(n) {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > size {
			name, size = n, fi.Size()
		}
	}
	return func(n string) bool { return n == name }
}
