package stream

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
)

// crashedState returns a state directory as a process killed while it
// committed leaves it: two WALs (the first memtable filled and was
// rotated) and no flush, with tag's rows and a checkpoint of partition 1.
func crashedState(t *testing.T, tag string) string {
	t.Helper()
	dir := t.TempDir()
	st, err := OpenStore(dir, vfs.Default, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i := range 2000 {
		b := st.newBatch()
		b.set(1, fmt.Appendf(nil, "%s-%d", tag, i), make([]byte, 100))
		b.checkpoint(1, Checkpoint{Offset: int64(i + 1), At: time.Now()})
		if err := b.commit(); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.syncApply(st.db.NewBatch()); err != nil {
		t.Fatal(err)
	}
	return copyFiles(t, dir) // the files the OS has, without a Close
}

// corruptFile flips 64 bytes in the middle of the first file of dir
// (by name) whose name matches: what a failing disk or a torn write
// leaves there. It returns the file's name.
func corruptFile(t *testing.T, dir string, match func(name string) bool) string {
	t.Helper()
	var names []string
	for _, name := range listFiles(t, dir) {
		if match(name) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		t.Fatalf("no file to corrupt in %s", dir)
	}
	p := filepath.Join(dir, names[0]) // os.ReadDir sorts by name
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	lo := max(len(b)/2-32, 0)
	for i := lo; i < min(lo+64, len(b)); i++ {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return names[0]
}

func isWAL(name string) bool      { return strings.HasSuffix(name, ".log") }
func isManifest(name string) bool { return strings.HasPrefix(name, "MANIFEST-") }

// corruptCases are the two corruptions a probe with real Kafka left in
// the state of a killed dedup process, and what Pebble answers to each.
var corruptCases = []struct {
	name  string
	match func(string) bool
	err   string
}{
	{"wal", isWAL, "error when replaying WAL"},
	{"manifest", isManifest, "malformed manifest file"},
}

// newCorrupt returns the directory <tmp>/dedup-d1 holding a crashed state
// with tag's rows whose file of case c is corrupt.
func newCorrupt(t *testing.T, c int, tag string) (dir, file string) {
	t.Helper()
	src := crashedState(t, tag)
	if n := countFiles(t, src, isWAL); n < 2 {
		t.Fatalf("the crashed state has %d WALs, want 2: the first one's corruption would be a tolerated torn tail", n)
	}
	file = corruptFile(t, src, corruptCases[c].match)
	dir = filepath.Join(t.TempDir(), "dedup-d1")
	if err := os.Rename(src, dir); err != nil {
		t.Fatal(err)
	}
	return dir, file
}

func countFiles(t *testing.T, dir string, match func(string) bool) int {
	t.Helper()
	n := 0
	for _, name := range listFiles(t, dir) {
		if match(name) {
			n++
		}
	}
	return n
}

// TestCorruptStateRebuilt: a state Pebble finds corrupt as it opens (a
// WAL, the MANIFEST) is a damaged cache of the changelog. It failed every
// restart the same way, and was never rebuilt though the changelog holds
// it all. The store now moves it aside to <dir>.corrupt, says so (both
// paths and Pebble's error), counts it, and opens empty: the restores
// replay the changelog in full (no_state). A second corrupt state replaces
// the first copy, so that a failing disk cannot fill with them.
func TestCorruptStateRebuilt(t *testing.T) {
	for c, tc := range corruptCases {
		t.Run(tc.name, func(t *testing.T) {
			dir, file := newCorrupt(t, c, "first")
			bad, err := os.ReadFile(filepath.Join(dir, file))
			if err != nil {
				t.Fatal(err)
			}
			// What Pebble says of it, the store's fix aside.
			if _, err := pebble.Open(dir, &pebble.Options{Logger: pebbleLogger{zap.NewNop().Sugar()}}); err == nil || !pebble.IsCorruptionError(err) ||
				!strings.Contains(err.Error(), tc.err) {
				t.Fatalf("pebble.Open of the corrupt state: %v, want a corruption error saying %q", err, tc.err)
			}

			core, logs := observer.New(zapcore.WarnLevel)
			reg := prometheus.NewRegistry()
			rt := newCorruptRuntime(t, dir, zap.New(core), reg)
			if v, ok := rebuiltMetric(t, reg); !ok || v != 1 {
				t.Errorf("meterline_stream_state_rebuilt_total{reason=corrupt} = %v (exported: %v), want 1", v, ok)
			}
			parts, err := rt.store.partitions()
			if err != nil || len(parts) != 0 {
				t.Errorf("partitions of the rebuilt state: %v, %v; want none (a full restore)", parts, err)
			}
			if err := rt.store.Close(); err != nil {
				t.Fatal(err)
			}
			aside := dir + corruptSuffix
			kept, err := os.ReadFile(filepath.Join(aside, file))
			if err != nil || !bytes.Equal(kept, bad) {
				t.Errorf("the corrupt %s is not kept as it was in %s: %v", file, aside, err)
			}
			warns := logs.FilterMessageSnippet("corrupt").All()
			if len(warns) != 1 {
				t.Fatalf("%d warnings of the corrupt state, want 1: %v", len(warns), logs.All())
			}
			fields := warns[0].ContextMap()
			if fields["state_dir"] != dir || fields["corrupt_copy"] != aside || !strings.Contains(fmt.Sprint(fields["error"]), tc.err) {
				t.Errorf("the warning does not name the state %s, its copy %s and Pebble's error: %v", dir, aside, fields)
			}

			// Corrupt again: the copy of the second replaces the first.
			again, _ := newCorrupt(t, c, "second")
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(again, dir); err != nil {
				t.Fatal(err)
			}
			st, err := OpenStore(dir, vfs.Default, zap.NewNop())
			if err != nil {
				t.Fatalf("second corrupt state: %v", err)
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			siblings, err := os.ReadDir(filepath.Dir(dir))
			if err != nil {
				t.Fatal(err)
			}
			if len(siblings) != 2 {
				t.Errorf("%d entries beside the state, want it and one corrupt copy: %v", len(siblings), siblings)
			}
			if !walHolds(t, aside, "second-") || walHolds(t, aside, "first-") {
				t.Errorf("the copy in %s is not the second corrupt state's alone: the second did not replace the first", aside)
			}
		})
	}
}

// walHolds reports whether a WAL of the state in dir holds s.
func walHolds(t *testing.T, dir, s string) bool {
	t.Helper()
	for _, name := range listFiles(t, dir) {
		if isWAL(name) {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(b, []byte(s)) {
				return true
			}
		}
	}
	return false
}

// newCorruptRuntime opens a runtime (no broker reached) on the state in
// dir.
func newCorruptRuntime(t *testing.T, dir string, log *zap.Logger, reg *prometheus.Registry) *Runtime {
	t.Helper()
	rt, err := New(Config{Stage: "dedup",
		Config:     session.Config{Kafka: kafka.Config{Brokers: []string{"127.0.0.1:1"}}, Group: "g", InstanceID: "d1"},
		InputTopic: "in", ChangelogTopic: "dedup.changelog", StateDir: dir, FS: vfs.Default,
		Logger: log, Registerer: reg}, keepProc{})
	if err != nil {
		t.Fatalf("open a corrupt state: %v", err)
	}
	return rt
}

// rebuiltMetric returns meterline_stream_state_rebuilt_total{reason="corrupt"}.
func rebuiltMetric(t *testing.T, reg *prometheus.Registry) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "meterline_stream_state_rebuilt_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelOf(m, "reason") == rebuiltCorrupt {
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestStateRebuiltExportedAtZero: the counter is exported from the start,
// so that the alert's increase() sees its first increment.
func TestStateRebuiltExportedAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	rt := newCorruptRuntime(t, filepath.Join(t.TempDir(), "dedup-d1"), zap.NewNop(), reg)
	defer rt.store.Close()
	if v, ok := rebuiltMetric(t, reg); !ok || v != 0 {
		t.Errorf("meterline_stream_state_rebuilt_total{reason=corrupt} of a sound state = %v (exported: %v), want 0", v, ok)
	}
}

// holdLockEnv names the directory whose lock TestHoldStateLock holds in a
// process of its own.
const holdLockEnv = "METERLINE_TEST_HOLD_STATE_LOCK"

// TestHoldStateLock is not a test: run by TestCorruptStateOtherErrors in
// a process of its own, it takes Pebble's lock on the directory
// holdLockEnv names (without reading the state), says so on stdout and
// holds it until its stdin closes.
func TestHoldStateLock(t *testing.T) {
	dir := os.Getenv(holdLockEnv)
	if dir == "" {
		return
	}
	l, err := pebble.LockDirectory(dir, vfs.Default)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	os.Stdout.WriteString("held\n")
	_, _ = os.Stdin.Read(make([]byte, 1))
}

// holdLock holds Pebble's lock on dir in another process until the test
// ends.
func holdLock(t *testing.T, dir string) {
	t.Helper()
	holdInChild(t, "TestHoldStateLock", holdLockEnv, dir, "held")
}

// holdInChild runs test (a holder such as TestHoldStateLock) in a process
// of its own with env set to dir, waits until it writes ready on stdout,
// and ends it (closing its stdin) when the test ends.
func holdInChild(t *testing.T, test, env, dir, ready string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	said := make(chan string, 1)
	go func() {
		b := make([]byte, len(ready))
		n, _ := io.ReadFull(out, b)
		said <- string(b[:n])
	}()
	select {
	case s := <-said:
		if s != ready {
			t.Fatalf("the other process (%s on %s) did not say %q: %q", test, dir, ready, s)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the other process (%s on %s) did not say %q within 30 s", test, dir, ready)
	}
}

// failFS fails as a full disk does (ENOSPC on creating the WAL every open
// starts; not on a MANIFEST, which Pebble takes as fatal and exits on,
// nor on the flush of the replayed WALs, which it retries for ever), or
// as a failing read (EIO on opening the MANIFEST), or refuses renames.
type failFS struct {
	vfs.FS
	noSpace, readEIO, noRename bool
}

func (fs failFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if fs.noSpace && isWAL(filepath.Base(name)) {
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.ENOSPC}
	}
	return fs.FS.Create(name, c)
}

func (fs failFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	if fs.readEIO && isManifest(filepath.Base(name)) {
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EIO}
	}
	return fs.FS.Open(name, opts...)
}

func (fs failFS) Rename(from, to string) error {
	if fs.noRename {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: syscall.EXDEV}
	}
	return fs.FS.Rename(from, to)
}

// TestCorruptStateOtherErrors: only what Pebble reports as corruption
// moves a state aside. A lock another process holds on the directory
// (two instances given one directory), a directory this user may not
// write, a full disk, a read that fails, still fail the open with their
// own error, the state left where it is: moving it would hand another
// instance's live state, or a sound one, to a full restore. And when the
// move itself fails, the open fails naming both errors.
func TestCorruptStateOtherErrors(t *testing.T) {
	cases := []struct {
		name    string
		corrupt bool
		fs      func(dir string) vfs.FS
		want    []string
	}{
		{"locked by another process", true, func(dir string) vfs.FS { holdLock(t, dir); return vfs.Default },
			[]string{"in use by another process", "--instance-id"}},
		{"permission denied", true, func(string) vfs.FS { return deniedFS{FS: vfs.Default} },
			[]string{"permission denied"}},
		{"disk full", false, func(string) vfs.FS { return failFS{FS: vfs.Default, noSpace: true} },
			[]string{"no space left on device"}},
		{"read error", false, func(string) vfs.FS { return failFS{FS: vfs.Default, readEIO: true} },
			[]string{"input/output error"}},
		{"move aside fails", true, func(string) vfs.FS { return failFS{FS: vfs.Default, noRename: true} },
			[]string{"malformed manifest file", "moving it aside", "invalid cross-device link"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var dir string
			if tc.corrupt {
				dir, _ = newCorrupt(t, 1, "state")
			} else {
				dir = filepath.Join(t.TempDir(), "dedup-d1")
				if err := os.Rename(crashedState(t, "state"), dir); err != nil {
					t.Fatal(err)
				}
			}
			before := listFiles(t, dir)
			var cpBefore int64
			if !tc.corrupt {
				cpBefore = checkpointInFiles(t, dir)
			}
			st, err := OpenStore(dir, tc.fs(dir), zap.NewNop())
			if err == nil {
				st.Close()
				t.Fatal("opened")
			}
			if pebble.IsCorruptionError(err) != (tc.name == "move aside fails") {
				t.Errorf("error %q: corruption %v", err, pebble.IsCorruptionError(err))
			}
			for _, want := range append(tc.want, dir) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if _, serr := os.Stat(dir + corruptSuffix); !errors.Is(serr, os.ErrNotExist) {
				t.Errorf("%s%s exists (%v): a state that is not corrupt was moved aside", dir, corruptSuffix, serr)
			}
			if !tc.corrupt {
				// Pebble may have flushed the WALs it replayed: the state
				// must be whole, not its files the same.
				st, err := OpenStore(dir, vfs.Default, zap.NewNop())
				if err != nil {
					t.Fatal(err)
				}
				cp, ok, err := st.Checkpoint(1)
				if err != nil || !ok || cp.Offset != cpBefore {
					t.Errorf("checkpoint of the state after the failed open: %v, %v, %v; want offset %d", cp, ok, err, cpBefore)
				}
				if err := st.Close(); err != nil {
					t.Fatal(err)
				}
			} else if after := listFiles(t, dir); !slices.Equal(before, after) {
				t.Errorf("the state's files changed: %v, then %v", before, after)
			}
		})
	}
}

func listFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
