package stream

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// A failing apply, with Pebble's vfs/errorfs (docs/design.md, Exactly-once,
// 2: Pebble is a cache of the changelog, never the authority).
//
// What Pebble does when the disk fails under the runtime's apply: the
// runtime commits most of its batches without fsync (store.go), and such a
// commit succeeds into the memtable while the write-ahead log is flushed in
// the background; a failed WAL write is reported by the next sync — a
// commit's (one every walSyncInterval: the apply fails and the stage
// stops), or the store's flusher's, which makes the next commit sync and
// fail on it — or when the log is closed — by DB.Close, or by the next WAL
// rotation, where Pebble gives up and the process dies (as on kill -9).
// Either way the restart finds the local state at an older checkpoint and
// replays the changelog's tail.

// walFailures returns a filesystem over mem whose writes to instance id's
// Pebble WAL fail while the toggle is on.
func walFailures(mem vfs.FS, id string) (vfs.FS, *errorfs.Toggle, *errorfs.Counter) {
	tog := &errorfs.Toggle{Injector: errorfs.ErrInjected.If(errorfs.And(errorfs.PathMatch("state-"+id+"/*.log"), errorfs.Writes))}
	n := &errorfs.Counter{Injector: tog}
	return errorfs.Wrap(mem, n), tog, n
}

// isInjected reports whether err carries an error errorfs injected. (Its
// errors carry their predicate, so errors.Is against ErrInjected fails.)
func isInjected(err error) bool {
	var le errorfs.LabelledError
	return errors.As(err, &le) && le.Label == errorfs.ErrInjected.Label
}

// noSync makes the instance's store commit without syncing the WAL, and
// its flusher sync nothing, so that a WAL failure surfaces when the store
// is closed.
func noSync(rt *Runtime) {
	rt.store.syncEvery.Store(int64(time.Hour))
	rt.store.lastSync.Store(time.Now().UnixNano())
}

// TestFailingApplyRestoresFromTheChangelog: the WAL fails while the stage
// applies committed transactions, with no commit syncing it. Run reports
// it when the stage stops; the restart, on the state that did reach the
// disk, replays the changelog's tail and counts every input once.
func TestFailingApplyRestoresFromTheChangelog(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	fs, failing, injected := walFailures(vfs.NewMem(), "a")
	a := s.start("a", fs)
	s.send(20)
	s.caughtUp()
	a.shutdown() // this state is on disk

	a = s.startRuntime("a", fs, &countProc{output: s.output}, func(*Config) {}, noSync)
	failing.On()
	s.send(20)
	s.caughtUp()
	if err := a.halt(); !isInjected(err) || !strings.Contains(err.Error(), "stream: close state") {
		t.Fatalf("Run = %v; want the WAL failure, reported as the state's close error", err)
	}
	if injected.Load() == 0 {
		t.Fatal("no WAL write failed")
	}

	failing.Off()
	a = restartFromTails(t, s, fs)
	if n := a.metric("meterline_stream_restore_records_total"); n == 0 {
		t.Error("the restart replayed no changelog record: the transactions applied while the WAL failed were not lost?")
	}
}

// restartFromTails starts instance a again on fs, lets it count every
// input, and checks that it restored both partitions from their tails.
func restartFromTails(t *testing.T, s *suite, fs vfs.FS) *instance {
	t.Helper()
	a := s.start("a", fs)
	s.finish(a, fs)
	if tail, full := a.metric("meterline_stream_restores_total", "kind", "tail"), a.metric("meterline_stream_restores_total", "kind", "full"); tail < 2 || full != 0 {
		t.Errorf("the restart restored %v partitions from their tail and %v in full; want both from their tail", tail, full)
	}
	return a
}

// TestRunReturnsCloseErrorWithFatalError: a stage that stops on an error
// (here, its processor's) while its state cannot be closed cleanly returns
// both errors (goka's Run: every error, Close's included); then a restart
// counts every input once.
func TestRunReturnsCloseErrorWithFatalError(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	fs, failing, _ := walFailures(vfs.NewMem(), "a")
	a := s.startRuntime("a", fs, &countProc{output: s.output, poison: "i0045"}, func(*Config) {}, noSync)
	s.send(20)
	s.caughtUp()
	failing.On()
	s.send(20) // applied while the WAL fails
	s.caughtUp()
	s.send(20) // i0045 stops the stage
	if err := a.exit(); !errors.Is(err, errPoison) || !isInjected(err) {
		t.Fatalf("Run = %v; want the processor's error and the state's close error", err)
	}

	failing.Off()
	a = s.start("a", fs)
	s.finish(a, fs)
}

// TestFailingWALSyncStopsTheStage: the WAL fails under an apply whose
// commit syncs it (here every commit does). Pebble would exit the process
// on the error of a commit that waits for its sync; the store's commit
// returns it instead, so the stage stops with it, and the restart replays
// the changelog's tail and counts every input once.
func TestFailingWALSyncStopsTheStage(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	fs, failing, _ := walFailures(vfs.NewMem(), "a")
	a := s.startRuntime("a", fs, &countProc{output: s.output}, func(*Config) {}, func(rt *Runtime) { rt.store.syncEvery.Store(0) })
	s.send(20)
	s.caughtUp()
	failing.On()
	s.send(20)
	if err := a.exit(); !isInjected(err) || !strings.Contains(err.Error(), "apply committed state to Pebble") {
		t.Fatalf("Run = %v; want the WAL failure, reported by the apply", err)
	}

	failing.Off()
	restartFromTails(t, s, fs)
}
