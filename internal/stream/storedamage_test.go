package stream

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/testenv"
)

// flushedState returns the directory <tmp>/dedup-d1 holding a closed
// state whose rows of partition 1 and checkpoint are in a table (.sst)
// named by its MANIFEST, not only in a WAL.
func flushedState(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "dedup-d1")
	st, err := OpenStore(dir, vfs.Default, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	b := st.newBatch()
	for i := range 2000 {
		b.set(1, []byte{byte(i >> 8), byte(i)}, make([]byte, 100))
	}
	b.checkpoint(1, Checkpoint{Offset: 2000})
	if err := b.commit(); err != nil {
		t.Fatal(err)
	}
	if err := st.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if countFiles(t, dir, isTable) == 0 {
		t.Fatalf("no table in %s: %v", dir, listFiles(t, dir))
	}
	return dir
}

func isTable(name string) bool { return strings.HasSuffix(name, ".sst") }

// firstFile returns the path of the first file of dir (by name) that
// matches.
func firstFile(t *testing.T, dir string, match func(string) bool) string {
	t.Helper()
	for _, name := range listFiles(t, dir) {
		if match(name) {
			return filepath.Join(dir, name)
		}
	}
	t.Fatalf("no such file in %s: %v", dir, listFiles(t, dir))
	return ""
}

func isFormatMarker(name string) bool { return strings.HasPrefix(name, "marker.format-version.") }

// damageCases are damage to a state that Pebble does not classify as
// corruption, and what Pebble answers to each as it opens the state.
var damageCases = []struct {
	name   string
	damage func(t *testing.T, dir string)
	err    string
}{
	{"table missing", func(t *testing.T, dir string) { remove(t, firstFile(t, dir, isTable)) },
		"unknown to the objstorage provider: file does not exist"},
	{"table truncated", func(t *testing.T, dir string) {
		if err := os.Truncate(firstFile(t, dir, isTable), 100); err != nil {
			t.Fatal(err)
		}
	}, "object size mismatch"},
	{"manifest missing", func(t *testing.T, dir string) { remove(t, firstFile(t, dir, isManifest)) },
		"could not open manifest file"},
	{"format marker missing", func(t *testing.T, dir string) { remove(t, firstFile(t, dir, isFormatMarker)) },
		"database already exists and is not pristine"},
}

func remove(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedStateRebuilt: a state missing a file Pebble needs (a table
// its MANIFEST names, the MANIFEST its marker names, the format-version
// marker), or with a table shorter than its MANIFEST records, is as
// damaged a cache of the changelog as a corrupt one, but Pebble does not
// classify the error as corruption: the stage failed every restart the
// same way. The store now moves it aside to <dir>.corrupt, says so with
// the reason, counts it as damaged and opens empty for a full restore.
func TestDamagedStateRebuilt(t *testing.T) {
	for _, tc := range damageCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := flushedState(t)
			tc.damage(t, dir)
			before := listFiles(t, dir)
			_, err := pebble.Open(dir, &pebble.Options{Logger: pebbleLogger{zap.NewNop().Sugar()}})
			if err == nil || pebble.IsCorruptionError(err) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("pebble.Open of the damaged state: %v, want an error that is not corruption saying %q", err, tc.err)
			}

			core, logs := observer.New(zapcore.WarnLevel)
			reg := prometheus.NewRegistry()
			rt := newCorruptRuntime(t, dir, zap.New(core), reg)
			if v := metricSum(t, reg, "meterline_stream_state_rebuilt_total", "reason", rebuiltDamaged); v != 1 {
				t.Errorf("meterline_stream_state_rebuilt_total{reason=damaged} = %v, want 1", v)
			}
			if v := metricSum(t, reg, "meterline_stream_state_rebuilt_total", "reason", rebuiltCorrupt); v != 0 {
				t.Errorf("meterline_stream_state_rebuilt_total{reason=corrupt} = %v, want 0", v)
			}
			parts, err := rt.store.partitions()
			if err != nil || len(parts) != 0 {
				t.Errorf("partitions of the rebuilt state: %v, %v; want none (a full restore)", parts, err)
			}
			if err := rt.store.Close(); err != nil {
				t.Fatal(err)
			}
			if kept := listFiles(t, dir+corruptSuffix); !sameNames(kept, before) {
				t.Errorf("the damaged state is not kept as it was in %s: %v, was %v", dir+corruptSuffix, kept, before)
			}
			warns := logs.FilterMessageSnippet("corrupt").All()
			if len(warns) != 1 {
				t.Fatalf("%d warnings of the damaged state, want 1: %v", len(warns), logs.All())
			}
			f := warns[0].ContextMap()
			if f["state_dir"] != dir || f["corrupt_copy"] != dir+corruptSuffix || f["reason"] != rebuiltDamaged ||
				!strings.Contains(f["error"].(string), tc.err) {
				t.Errorf("the warning does not name the state, its copy, the reason and Pebble's error: %v", f)
			}
		})
	}
}

// sameNames reports whether a and b list the same files, LOCK aside
// (Pebble creates it as it opens a directory).
func sameNames(a, b []string) bool {
	drop := func(s []string) []string {
		var out []string
		for _, n := range s {
			if n != "LOCK" {
				out = append(out, n)
			}
		}
		return out
	}
	return slices.Equal(drop(a), drop(b))
}

// statFS fails the stat and open of tables with errno.
type statFS struct {
	vfs.FS
	errno error
}

func (fs statFS) Stat(name string) (vfs.FileInfo, error) {
	if isTable(filepath.Base(name)) {
		return nil, &os.PathError{Op: "stat", Path: name, Err: fs.errno}
	}
	return fs.FS.Stat(name)
}

func (fs statFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	if isTable(filepath.Base(name)) {
		return nil, &os.PathError{Op: "open", Path: name, Err: fs.errno}
	}
	return fs.FS.Open(name, opts...)
}

// TestDamageNotGuessed: a table the filesystem refuses to show (permission
// denied, a failing read) is not a damaged state: the open fails with the
// error, naming the directory, and the state stays where it is.
func TestDamageNotGuessed(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EACCES, syscall.EIO} {
		t.Run(errno.Error(), func(t *testing.T) {
			dir := flushedState(t)
			before := listFiles(t, dir)
			st, err := OpenStore(dir, statFS{FS: vfs.Default, errno: errno}, zap.NewNop())
			if err == nil {
				st.Close()
				t.Fatal("opened")
			}
			if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), errno.Error()) {
				t.Errorf("error %q does not name %s and %q", err, dir, errno)
			}
			if _, serr := os.Stat(dir + corruptSuffix); !errors.Is(serr, os.ErrNotExist) {
				t.Errorf("%s exists (%v): a state that is not damaged was moved aside", dir+corruptSuffix, serr)
			}
			if after := listFiles(t, dir); !sameNames(before, after) {
				t.Errorf("the state's files changed: %v, then %v", before, after)
			}
		})
	}
}

// TestStageRebuildsDamagedState: a count stage on kfake whose state lost
// its table (deleted by hand, a failed disk) while it was stopped. It
// failed every start with Pebble's error; it now moves the state aside,
// counts it as damaged, restores every partition from the changelog in
// full and stays exactly-once.
func TestStageRebuildsDamagedState(t *testing.T) { stageRebuildsDamagedState(t, nil) }

// TestRealStageRebuildsDamagedState is TestStageRebuildsDamagedState on
// the real broker of METERLINE_TEST_KAFKA.
func TestRealStageRebuildsDamagedState(t *testing.T) {
	stageRebuildsDamagedState(t, testenv.RealKafka(t))
}

func stageRebuildsDamagedState(t *testing.T, brokers []string) {
	s := stoppedWithTable(t, brokers, nil)
	remove(t, firstFile(t, "state-a", isTable))

	a2 := s.start("a", vfs.Default)
	if v := a2.metric("meterline_stream_state_rebuilt_total", "reason", rebuiltDamaged); v != 1 {
		t.Errorf("meterline_stream_state_rebuilt_total{reason=damaged} = %v, want 1", v)
	}
	s.send(20)
	s.finish(a2, vfs.Default)
	if n := a2.metric("meterline_stream_restores_total", "kind", "full"); n != float64(s.parts) {
		t.Errorf("%v full restores, want one a partition", n)
	}
}

// TestOptionsFileDamage: an OPTIONS file missing or cut short is no
// damage (Pebble writes a new one and the state is kept, checkpoint and
// all); one of garbage is corruption, and rebuilds the state.
func TestOptionsFileDamage(t *testing.T) {
	isOptions := func(name string) bool { return strings.HasPrefix(name, "OPTIONS-") }
	for _, tc := range []struct {
		name    string
		damage  func(t *testing.T, path string)
		rebuilt string
	}{
		{"missing", func(t *testing.T, path string) { remove(t, path) }, ""},
		{"empty", func(t *testing.T, path string) {
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"garbage", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("\x00\xff[garbage\n=="), 0o644); err != nil {
				t.Fatal(err)
			}
		}, rebuiltCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := flushedState(t)
			tc.damage(t, firstFile(t, dir, isOptions))
			st, err := OpenStore(dir, vfs.Default, zap.NewNop())
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if st.rebuilt != tc.rebuilt {
				t.Errorf("rebuilt %q, want %q", st.rebuilt, tc.rebuilt)
			}
			_, ok, err := st.Checkpoint(1)
			if err != nil || ok != (tc.rebuilt == "") {
				t.Errorf("checkpoint of partition 1: %v, %v; want one only when the state is kept", ok, err)
			}
		})
	}
}

// TestManifestMarkerMissing: a state whose marker.manifest.* file is gone
// (the file that names the current MANIFEST; Pebble has no CURRENT file)
// but whose format-version marker is there. Pebble then takes the
// directory for a new store: it writes a new MANIFEST, drops every table
// the old one named and replays the WALs it finds, so the state opened
// silently with the newest writes (a checkpoint among them) and without
// the rows in tables: dedup would have accepted again identities it had
// seen. It is damage: moved aside and rebuilt in full.
func TestManifestMarkerMissing(t *testing.T) {
	dir := flushedState(t)
	st, err := OpenStore(dir, vfs.Default, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	b := st.newBatch()
	b.set(1, []byte("late"), []byte("v"))
	b.checkpoint(1, Checkpoint{Offset: 2001})
	if err := b.commit(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range listFiles(t, dir) {
		// The WALs the flush made obsolete, as a state that ran longer
		// no longer has them.
		if isWAL(name) {
			if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil && !strings.Contains(string(b), "late") {
				remove(t, filepath.Join(dir, name))
			}
		}
	}
	remove(t, firstFile(t, dir, func(n string) bool { return strings.HasPrefix(n, "marker.manifest.") }))

	st, err = OpenStore(dir, vfs.Default, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, early, _ := st.Get(1, []byte{0, 0})
	cp, _, _ := st.Checkpoint(1)
	if st.rebuilt != rebuiltDamaged {
		t.Errorf("rebuilt %q, want %q (the state opened with checkpoint %d, its first row: %v)", st.rebuilt, rebuiltDamaged, cp.Offset, early)
	}
	if parts, err := st.partitions(); err != nil || len(parts) != 0 {
		t.Errorf("partitions of the state: %v, %v; want none (a full restore)", parts, err)
	}
}

// stoppedWithTable runs a count stage's instance a, on kfake or on the
// real broker brokers, with its state in state-a under a new working
// directory, until it counted 40 inputs; stops it; lets fill (when not
// nil) write to its state; and flushes the state to a table.
func stoppedWithTable(t *testing.T, brokers []string, fill func(st *Store)) *suite {
	t.Helper()
	t.Chdir(t.TempDir()) // the instances' state-<id> directories
	s := newSuite(t, brokers, nil)
	a := s.start("a", vfs.Default)
	s.send(40)
	s.caughtUp()
	a.shutdown()
	st, err := OpenStore("state-a", vfs.Default, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if fill != nil {
		fill(st)
	}
	if err := st.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if fill != nil {
		// Every table to the bottom level: the stage that opens the
		// state next starts no compaction of its own, which could read
		// a damaged table before the test asks for one.
		if err := st.db.Compact(context.Background(), []byte{0}, []byte{0xff}, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	return s
}
