package stream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"
)

// Store is the local state of one instance: one Pebble DB for all the
// partitions it owns, each under its own key prefix. One DB rather than one
// per partition because the state of every partition a transaction touched
// is then applied in one atomic batch, with one WAL and one set of
// memtables for the instance.
//
// The store is a cache of the changelog topic, never the authority
// (docs/design.md, Exactly-once, 2). Each partition carries a checkpoint:
// the changelog offset its state reflects. Most writes are not fsynced: a
// lost tail is replayed from the changelog, and a batch is atomic either
// way. But a batch committed without a sync stays in Pebble's in-memory
// WAL block (32 KiB) until the block fills, so at low traffic a process
// crash would lose every write since the store was opened, checkpoints
// included, and turn each restart into a full restore. So a commit syncs
// when the last sync is walSyncInterval old (commit), and the store's
// flusher (flushWAL) syncs what was written after the last sync when no
// commit has synced it within walSyncInterval: a crash loses at most the
// batches committed within about walSyncInterval before it, also when no
// commit follows them.
//
// Key layout:
//
//	0x00 | partition (2 bytes, big-endian) | user key   state
//	0x01 | partition                                     checkpoint (Checkpoint: 16 bytes)
//	0x02 | name                                          instance metadata (restore rate, delete retention)
type Store struct {
	db  *pebble.DB
	log *zap.Logger
	// lastSync is when a commit or the flusher last synced the WAL
	// (UnixNano); 0 before the first, and after the flusher failed to.
	lastSync atomic.Int64
	// syncEvery is walSyncInterval as a time.Duration (tests change it
	// before the store is used; 0: every commit syncs).
	syncEvery atomic.Int64
	// stopFlush ends the flusher, which closes flushDone as it returns.
	stopFlush chan struct{}
	flushDone chan struct{}
	stopOnce  sync.Once
	// dir and fs locate the state (the corrupt mark, errors).
	dir string
	fs  vfs.FS
	// corrupt is the error of the first corruption Pebble found in a
	// table as the store ran (foundCorrupt); nil while none was found.
	corrupt atomic.Pointer[error]
	// onCorrupt, when set, is told that error (OnCorrupt).
	onCorrupt atomic.Pointer[func(error)]
	// rebuilt is why the state was found unusable and replaced by an
	// empty one as the store opened (rebuiltCorrupt, rebuiltDamaged); ""
	// when it was not.
	rebuilt string
}

// walSyncInterval is about the longest a committed batch stays in Pebble's
// in-memory WAL block (Store).
const walSyncInterval = time.Second

const (
	prefixData       = 0x00
	prefixCheckpoint = 0x01
	prefixMeta       = 0x02
)

// keyRestoreRate holds the instance's restore-throughput estimate
// (records/s, float64 bits), kept across restarts so that the first
// restore after one is not planned on the default.
var keyRestoreRate = []byte{prefixMeta, 'r', 'a', 't', 'e'}

// keyRetention holds the changelog's delete.retention.ms (ms, int64) as
// last read, so that a restarted instance knows which of its copies are
// within the restore horizon before it reads it again (warmCopies).
var keyRetention = []byte{prefixMeta, 'd', 'r', 'e', 't'}

// keyChangelog holds the name of the changelog topic the store caches,
// recorded by the first runtime that opens it (BindChangelog).
var keyChangelog = []byte{prefixMeta, 'c', 'l', 'o', 'g'}

// keyChangelogID holds the topic ID of that changelog, recorded by the
// first restore or standby tail that reads it (BindChangelogID).
var keyChangelogID = []byte{prefixMeta, 'c', 'l', 'i', 'd'}

// keyInputIDPrefix, followed by an input topic's name, holds that topic's
// ID, recorded by the first restore or standby tail after the store was
// bound to it (BindInputID).
var keyInputIDPrefix = []byte{prefixMeta, 'i', 'n', 'i', 'd', '/'}

// pebbleLogger sends Pebble's messages to zap: its routine messages at
// debug, its errors at error.
type pebbleLogger struct{ s *zap.SugaredLogger }

func (l pebbleLogger) Infof(format string, args ...any)  { l.s.Debugf(format, args...) }
func (l pebbleLogger) Errorf(format string, args ...any) { l.s.Errorf(format, args...) }
func (l pebbleLogger) Fatalf(format string, args ...any) { l.s.Fatalf(format, args...) }

// OpenStore opens (or creates) the store in dir.
func OpenStore(dir string, fs vfs.FS, log *zap.Logger) (*Store, error) {
	return openStore(dir, fs, log, walSyncInterval)
}

// corruptSuffix names the copy of a state Pebble found corrupt: dir is
// moved to dir+corruptSuffix (rebuildCorrupt).
const corruptSuffix = ".corrupt"

// Reasons of meterline_stream_state_rebuilt_total.
const (
	// rebuiltCorrupt: Pebble reported the state corrupt as it opened it
	// (a damaged WAL, MANIFEST or OPTIONS file).
	rebuiltCorrupt = "corrupt"
	// rebuiltDamaged: a file the state needs is missing (a table its
	// MANIFEST names, the MANIFEST its marker names, the format-version
	// marker) or not the size its MANIFEST records; Pebble does not
	// classify those errors as corruption (stateDamage). Or the marker
	// that names the current MANIFEST is missing, which Pebble does not
	// notice (manifestMarkerLost).
	rebuiltDamaged = "damaged"
	// rebuiltCorruptRead: the state carries the mark of a corrupt table
	// found as the stage ran (foundCorrupt), which stopped it.
	rebuiltCorruptRead = "corrupt_read"
)

// corruptMarkName is the file that marks a state in which Pebble found a
// corrupt table as the stage ran: the next open rebuilds the state. Pebble
// ignores files whose names it does not know.
const corruptMarkName = "meterline-corrupt"

// rebuiltReasons lists them, each exported from the start at 0.
var rebuiltReasons = []string{rebuiltCorrupt, rebuiltDamaged, rebuiltCorruptRead}

// openStore opens the store in dir with syncEvery every. A state Pebble
// reports corrupt (a WAL or MANIFEST damaged by a failing disk or a
// crash), or that misses a file it needs (stateDamage), is only a damaged
// cache of the changelog: it is moved aside (rebuildCorrupt) and an empty
// store opened in its place, which the restores fill from the changelog
// in full (docs/operations.md, Corrupt state). Any other error (the
// directory locked by another process, not writable, a full disk, a
// failing read) is returned.
func openStore(dir string, fs vfs.FS, log *zap.Logger, every time.Duration) (*Store, error) {
	if fs == nil {
		fs = vfs.Default
	}
	s, err, reason := openMarked(dir, fs, log, every)
	if reason == "" {
		return s, err
	}
	aside, merr := rebuildCorrupt(dir, fs)
	if merr != nil {
		return nil, fmt.Errorf("%w; moving it aside to rebuild it from the changelog failed too: %w", err, merr)
	}
	log.Warn("the stage's state is corrupt: moved it aside and opened an empty state in its place, "+
		"which the restores rebuild from the changelog in full; the copy is kept for inspection until the next corrupt state replaces it "+
		"(docs/operations.md, Corrupt state)",
		zap.String("state_dir", dir), zap.String("corrupt_copy", aside), zap.String("reason", reason), zap.Error(err))
	s, err = openPebble(dir, fs, log, every)
	if err != nil {
		return nil, err
	}
	s.rebuilt = reason
	return s, nil
}

// openMarked opens the store in dir, unless the state carries the mark of
// a corrupt table (foundCorrupt): it then returns the mark's error and
// rebuiltCorruptRead, without opening it. Otherwise it returns the store,
// or the error of its open and the reason that error gives to rebuild the
// state (stateDamage).
func openMarked(dir string, fs vfs.FS, log *zap.Logger, every time.Duration) (*Store, error, string) {
	if f, err := fs.Open(fs.PathJoin(dir, corruptMarkName)); err == nil {
		b, rerr := io.ReadAll(io.LimitReader(f, 4096))
		_ = f.Close()
		return nil, fmt.Errorf("stream: the stage found a corrupt table in the state in %s as it ran: %s (read: %v)",
			dir, bytes.TrimSpace(b), rerr), rebuiltCorruptRead
	}
	if err := manifestMarkerLost(dir, fs); err != nil {
		return nil, err, rebuiltDamaged
	}
	s, err := openPebble(dir, fs, log, every)
	return s, err, stateDamage(err)
}

// manifestMarkerLost returns an error when the state in dir has Pebble's
// format-version marker but not the marker that names its current
// MANIFEST (Pebble's CURRENT). Pebble would take the directory for a new
// store: write a new MANIFEST without the tables of the old one and
// replay the WALs it finds, so that the state would open with its newest
// writes, a checkpoint among them, and without the rows in tables.
func manifestMarkerLost(dir string, fs vfs.FS) error {
	names, err := fs.List(dir)
	if err != nil {
		return nil // no directory yet, or one openPebble reports on
	}
	var format, manifest bool
	for _, n := range names {
		format = format || strings.HasPrefix(n, "marker.format-version.")
		manifest = manifest || strings.HasPrefix(n, "marker.manifest.")
	}
	if format && !manifest {
		return fmt.Errorf("stream: the state in %s has no marker.manifest.* file, which names its current MANIFEST: "+
			"Pebble would open it as a new store without its tables", dir)
	}
	return nil
}

// stateDamage returns the reason to rebuild the state whose open failed
// with err (rebuiltCorrupt, rebuiltDamaged), or "" when err (nil
// included) is no damage to the state. Pebble's corruption errors are
// damage. So are, though Pebble does not mark them, a file it needs that
// does not exist (ENOENT: a table the MANIFEST names, the MANIFEST the
// marker names), a directory holding Pebble's files without its
// format-version marker (ErrDBNotPristine) and a table whose size is not
// the one its MANIFEST records. An error of the filesystem itself (any
// other errno: permission denied, a lock held, a full disk, a failing
// read) is never damage: the state may be sound, and the error must stop
// the stage.
func stateDamage(err error) string {
	if err == nil {
		return ""
	}
	if pebble.IsCorruptionError(err) {
		return rebuiltCorrupt
	}
	var errno syscall.Errno
	if errors.As(err, &errno) && errno != syscall.ENOENT {
		return ""
	}
	if errors.Is(err, iofs.ErrNotExist) || errors.Is(err, pebble.ErrDBNotPristine) ||
		strings.Contains(err.Error(), "object size mismatch") {
		return rebuiltDamaged
	}
	return ""
}

// rebuildCorrupt moves the corrupt state in dir to dir+corruptSuffix,
// replacing the copy a previous corrupt state left there (one copy, so
// that a disk that keeps corrupting the state cannot fill with them), and
// returns that path. It holds the directory's lock while it does: an
// instance given the same directory meanwhile (a misconfiguration the
// lock reports) neither opens the state being moved nor has its own moved.
func rebuildCorrupt(dir string, fs vfs.FS) (string, error) {
	aside := dir + corruptSuffix
	lock, err := pebble.LockDirectory(dir, fs)
	if err != nil {
		return aside, fmt.Errorf("lock %s: %w", dir, err)
	}
	if err := fs.RemoveAll(aside); err != nil {
		return aside, errors.Join(fmt.Errorf("remove the older corrupt copy %s: %w", aside, err), lock.Close())
	}
	if err := fs.Rename(dir, aside); err != nil {
		return aside, errors.Join(fmt.Errorf("rename %s to %s: %w", dir, aside, err), lock.Close())
	}
	return aside, lock.Close()
}

// openPebble opens the Pebble DB in dir as the store, syncEvery every.
func openPebble(dir string, fs vfs.FS, log *zap.Logger, every time.Duration) (*Store, error) {
	// The block cache holds the index, filter and data blocks of hot
	// state; Pebble's 8 MiB default sends most reads of a lookup-heavy
	// stage to the OS.
	cache := pebble.NewCache(blockCacheBytes)
	opts := &pebble.Options{FS: fs, Logger: pebbleLogger{log.Named("pebble").Sugar()}, Cache: cache,
		MemTableSize: memTableBytes}
	// A range deletion (dedup's expiry of a bucket, a partition's state
	// dropped) gives the disk back only once it is flushed: Pebble then
	// deletes the sstables it covers whole (a delete-only compaction).
	// Without a delay it waits in the memtable until new writes fill it:
	// at low traffic for days, with none for ever.
	opts.FlushDelayDeleteRange = flushDelayDeleteRange
	// State keys are hashes and values mostly hashes too: compression
	// would cost CPU and save nothing.
	opts.ApplyCompressionSettings(func() pebble.DBCompressionSettings { return pebble.DBCompressionNone })
	s := &Store{dir: dir, fs: fs, log: log, stopFlush: make(chan struct{}), flushDone: make(chan struct{})}
	// A corrupt table found as the store runs stops the stage, not the
	// process (Pebble's default handler calls Fatalf, and every restart
	// read the table again and exited again).
	opts.EventListener = &pebble.EventListener{DataCorruption: s.foundCorrupt}
	opts.EnsureDefaults()
	// Bloom filters make the misses of a lookup-heavy stage cheap.
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	db, err := pebble.Open(dir, opts)
	cache.Unref() // the DB holds its own reference
	if (errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES)) && !errors.As(err, new(*iofs.PathError)) {
		// Pebble's lock on the directory (fcntl) is held by another
		// process: two instances given one --instance-id and --state-dir.
		// fcntl's errno comes bare; the same errno in a path error is the
		// filesystem refusing a mkdir or the lock file's open (a directory
		// this user may not write), which the error below reports as is.
		return nil, fmt.Errorf("stream: the state in %s is in use by another process: another instance of this stage "+
			"with the same --instance-id and --state-dir (an instance keeps its state in <state-dir>/<stage>-<instance-id>) runs on this host; "+
			"give each instance its own --instance-id: %w", dir, err)
	}
	if err != nil {
		return nil, fmt.Errorf("stream: open state in %s: %w", dir, err)
	}
	s.db = db
	s.syncEvery.Store(int64(every))
	go s.flushWAL()
	return s, nil
}

// Pebble sizing for one instance's state.
const (
	blockCacheBytes = 256 << 20
	memTableBytes   = 64 << 20
)

// flushDelayDeleteRange is how long Pebble keeps a memtable that holds a
// range deletion before it flushes it (Options.FlushDelayDeleteRange).
// Range deletions are rare (dedup: one a bucket and partition, and one as
// a partition opens; a partition's state dropped), so the early flushes
// cost little.
const flushDelayDeleteRange = 10 * time.Second

// Close stops the flusher and closes the store.
func (s *Store) Close() error {
	s.stopOnce.Do(func() { close(s.stopFlush) })
	<-s.flushDone
	return s.db.Close()
}

// foundCorrupt is Pebble's DataCorruption handler: a table it read (for a
// lookup, an iterator or a compaction) failed its checksum or would not
// load. The state is a damaged cache of the changelog. The first report
// marks it (corruptMarkName), so that the next open moves it aside and
// rebuilds it; logs it; and becomes the error of every later read that
// fails on corruption and of every commit (Get, Scan, commit), and what
// the runtime is told (OnCorrupt), which stops the stage. Rebuilding in
// place is not attempted: every partition's restore, standby copy and
// open transaction reads the store, and a restart rebuilds it with the
// paths every start takes.
func (s *Store) foundCorrupt(info pebble.DataCorruptionInfo) {
	err := fmt.Errorf("stream: the state in %s is corrupt: table %s: %v; the stage stops, and its next start moves the state aside "+
		"and rebuilds it from the changelog (docs/operations.md, Corrupt state)", s.dir, info.Path, info.Details)
	if !s.corrupt.CompareAndSwap(nil, &err) {
		return
	}
	fields := []zap.Field{zap.String("state_dir", s.dir), zap.String("table", info.Path), zap.Error(info.Details)}
	if merr := s.markCorrupt(info); merr != nil {
		s.log.Error("the stage's state has a corrupt table, and marking it for a rebuild failed: the next start will not rebuild it; "+
			"delete the state directory while the stage is stopped (docs/operations.md, Corrupt state)",
			append(fields, zap.NamedError("mark_error", merr))...)
	} else {
		s.log.Error("the stage's state has a corrupt table: the stage stops, and its next start moves the state aside and rebuilds it "+
			"from the changelog (docs/operations.md, Corrupt state)", fields...)
	}
	if f := s.onCorrupt.Load(); f != nil {
		(*f)(err)
	}
}

// markCorrupt writes the corrupt mark, with info, into the state's
// directory, synced.
func (s *Store) markCorrupt(info pebble.DataCorruptionInfo) error {
	f, err := s.fs.Create(s.fs.PathJoin(s.dir, corruptMarkName), vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "table %s: %v\n", info.Path, info.Details)
	err = errors.Join(err, f.Sync(), f.Close())
	if err != nil {
		return err
	}
	d, err := s.fs.OpenDir(s.dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// OnCorrupt sets f to be told the error of a corrupt table Pebble finds
// (foundCorrupt); f is told at once when one was found already.
func (s *Store) OnCorrupt(f func(error)) {
	s.onCorrupt.Store(&f)
	if err := s.corrupt.Load(); err != nil {
		f(*err)
	}
}

// readErr returns err, or the store's corruption error when err is a
// corruption Pebble reported (foundCorrupt): it names the directory and
// what the next start does.
func (s *Store) readErr(err error) error {
	if c := s.corrupt.Load(); c != nil && pebble.IsCorruptionError(err) {
		return *c
	}
	return err
}

// DB exposes the Pebble DB (metrics, compaction in benchmarks).
func (s *Store) DB() *pebble.DB { return s.db }

func partPrefix(kind byte, p int32) []byte {
	return []byte{kind, byte(p >> 8), byte(p)}
}

// appendDataKey appends dataKey(p, k) to dst; k is a string or a []byte.
func appendDataKey[K string | []byte](dst []byte, p int32, k K) []byte {
	return append(append(dst, prefixData, byte(p>>8), byte(p)), k...)
}

func dataKey(p int32, k []byte) []byte {
	out := make([]byte, 3+len(k))
	copy(out, partPrefix(prefixData, p))
	copy(out[3:], k)
	return out
}

// Get reads a state key of partition p from Pebble (not the overlay).
func (s *Store) Get(p int32, k []byte) ([]byte, bool, error) {
	v, closer, err := s.db.Get(dataKey(p, k))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, s.readErr(err)
	}
	out := bytes.Clone(v)
	return out, true, closer.Close()
}

// Scan calls fn for every state key of partition p in [lower, upper), in
// order; nil bounds are open. fn must not keep k or v.
func (s *Store) Scan(p int32, lower, upper []byte, fn func(k, v []byte) error) error {
	pre := partPrefix(prefixData, p)
	lo := append(append([]byte{}, pre...), lower...)
	var hi []byte
	if upper != nil {
		hi = append(append([]byte{}, pre...), upper...)
	} else {
		hi = partPrefix(prefixData, p+1)
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return s.readErr(err)
		}
		if err := fn(it.Key()[3:], v); err != nil {
			_ = it.Close()
			return err
		}
	}
	return s.readErr(it.Close())
}

// Checkpoint is where a partition's state stands in its changelog, and
// since when (docs/design.md, Exactly-once, 4).
type Checkpoint struct {
	// Offset is the next changelog offset to replay: the state reflects
	// every changelog record below it.
	Offset int64
	// At dates the state for the restore horizon: every tombstone the state
	// has not seen sits at or past Offset and was appended to the changelog
	// at or after At (on this instance's clock), or, for a key the state
	// read after At, was first cleaned after it. Either way the broker keeps
	// it until at least At + delete.retention.ms. Zero when not known (a
	// checkpoint written before checkpoints were dated): the state is then
	// restored in full.
	At time.Time
}

func (c Checkpoint) encode() []byte {
	var v [16]byte
	binary.BigEndian.PutUint64(v[:8], uint64(c.Offset))
	if !c.At.IsZero() {
		binary.BigEndian.PutUint64(v[8:], uint64(c.At.UnixMilli()))
	}
	return v[:]
}

// Checkpoint returns partition p's checkpoint. ok is false when the
// partition has no state.
func (s *Store) Checkpoint(p int32) (cp Checkpoint, ok bool, err error) {
	v, closer, err := s.db.Get(partPrefix(prefixCheckpoint, p))
	if errors.Is(err, pebble.ErrNotFound) {
		return Checkpoint{}, false, nil
	}
	if err != nil {
		return Checkpoint{}, false, s.readErr(err)
	}
	defer closer.Close()
	cp, err = decodeCheckpoint(v)
	if err != nil {
		return Checkpoint{}, false, fmt.Errorf("stream: partition %d: %w", p, err)
	}
	return cp, true, nil
}

func decodeCheckpoint(v []byte) (cp Checkpoint, err error) {
	switch len(v) {
	case 16:
		if ms := int64(binary.BigEndian.Uint64(v[8:])); ms > 0 {
			cp.At = time.UnixMilli(ms)
		}
		fallthrough
	case 8: // an undated checkpoint of an older version
		cp.Offset = int64(binary.BigEndian.Uint64(v[:8]))
		return cp, nil
	}
	return Checkpoint{}, fmt.Errorf("corrupt checkpoint (%d bytes)", len(v))
}

// RestoreRate returns the persisted restore-throughput estimate in
// records/s; ok is false when none was measured yet.
func (s *Store) RestoreRate() (rate float64, ok bool, err error) {
	v, ok, err := s.meta8(keyRestoreRate, "restore rate")
	if !ok || err != nil {
		return 0, false, err
	}
	rate = math.Float64frombits(v)
	return rate, rate > 0 && !math.IsInf(rate, 0) && !math.IsNaN(rate), nil
}

// meta8 reads the 8-byte instance metadata at key (what names it in
// errors); ok is false when there is none.
func (s *Store) meta8(key []byte, what string) (v uint64, ok bool, err error) {
	b, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, s.readErr(err)
	}
	defer closer.Close()
	if len(b) != 8 {
		return 0, false, fmt.Errorf("stream: corrupt %s (%d bytes)", what, len(b))
	}
	return binary.BigEndian.Uint64(b), true, nil
}

// SetRestoreRate persists the restore-throughput estimate (records/s).
func (s *Store) SetRestoreRate(rate float64) error {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], math.Float64bits(rate))
	return s.db.Set(keyRestoreRate, v[:], pebble.NoSync)
}

// Retention returns the persisted delete.retention.ms of the changelog;
// ok is false when none was read yet.
func (s *Store) Retention() (d time.Duration, ok bool, err error) {
	v, ok, err := s.meta8(keyRetention, "delete retention")
	if !ok || err != nil {
		return 0, false, err
	}
	ms := int64(v)
	return time.Duration(ms) * time.Millisecond, ms > 0, nil
}

// SetRetention persists the changelog's delete.retention.ms.
func (s *Store) SetRetention(d time.Duration) error {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(d.Milliseconds()))
	return s.db.Set(keyRetention, v[:], pebble.NoSync)
}

// BindChangelog records topic as the changelog the store caches, or
// returns an error when it caches another. A store is a cache of one
// changelog: its checkpoints are offsets of that log, and a restore from
// another would replay that log's tail onto this state (a topic prefix or
// a changelog name changed, another pipeline's state directory given). A
// store that records no changelog (made before the name was recorded) is
// bound to topic.
func (s *Store) BindChangelog(topic, dir string) error {
	b, err := s.bind(keyChangelog, []byte(topic), "the changelog", dir)
	if err != nil || b == nil {
		return err
	}
	return fmt.Errorf("stream: the state in %s is a cache of changelog %q, not of this stage's changelog %q: "+
		"give the stage a --state-dir of its own, or delete %s to rebuild it from %q",
		dir, b, topic, dir, topic)
}

// BindChangelogID records id as the topic ID of the changelog topic the
// store caches, or returns an error when it recorded another: the
// changelog was deleted and created again since, and the store's
// checkpoints are offsets of a log that no longer exists. A zero id (a
// broker without topic IDs) is not recorded. A store that records no ID
// (made before IDs were recorded) is bound to id.
func (s *Store) BindChangelogID(topic string, id [16]byte, dir string) error {
	if id == ([16]byte{}) {
		return nil
	}
	b, err := s.bind(keyChangelogID, id[:], "the changelog's topic ID", dir)
	if err != nil || b == nil {
		return err
	}
	return fmt.Errorf("stream: the state in %s is a cache of changelog %q as it was before it was deleted and created again "+
		"(topic ID %x, now %x): its checkpoints are offsets of a log that no longer exists; delete %s to rebuild it from %q",
		dir, topic, b, id[:], dir, topic)
}

// BindInputID records id as the topic ID of the input topic, or returns
// an error when the store recorded another: the topic was deleted and
// created again since, and the input offsets of the state (and of its
// changelog) name records of a log that no longer exists. On the new log
// a stage resumed at them would never count the records below them. A
// zero id (a broker without topic IDs) is not recorded; a store that
// records none (made before input IDs were recorded) is bound to id.
func (s *Store) BindInputID(topic string, id [16]byte, dir string) error {
	if id == ([16]byte{}) {
		return nil
	}
	key := append(slices.Clone(keyInputIDPrefix), topic...)
	b, err := s.bind(key, id[:], "the topic ID of input "+topic, dir)
	if err != nil || b == nil {
		return err
	}
	return fmt.Errorf("stream: the state in %s holds input offsets of %q as it was before it was deleted and created again "+
		"(topic ID %x, now %x): on the new log they name other records, and those below them would never be counted. "+
		"Do not set the group's offsets to the state's; count the new topic on a new changelog, a new consumer group and an empty state directory "+
		"(docs/operations.md, Outages)", dir, topic, b, id[:])
}

// bind records v under the metadata key, synced, when the store holds
// nothing there, and returns nil. When it holds v it returns nil too; when
// it holds another value it returns a copy of that value, never nil (also
// when empty), for the caller's error. what names the key's value in the
// error of a failed read of the state in dir.
func (s *Store) bind(key, v []byte, what, dir string) ([]byte, error) {
	b, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, s.db.Set(key, v, pebble.Sync)
	}
	if err != nil {
		return nil, fmt.Errorf("stream: read %s of the state in %s: %w", what, dir, s.readErr(err))
	}
	defer closer.Close()
	if bytes.Equal(b, v) {
		return nil, nil
	}
	return append([]byte{}, b...), nil
}

// batch accumulates state writes of several partitions.
type batch struct {
	s *Store
	b *pebble.Batch
	n int
	// key is the store key of the last set or del: Pebble copies a key
	// into the batch, so one buffer serves them all.
	key []byte
}

func (s *Store) newBatch() *batch { return &batch{s: s, b: s.db.NewBatch()} }

// set writes state key k (a string or a []byte) of partition p.
func set[K string | []byte](b *batch, p int32, k K, v []byte) {
	b.key = appendDataKey(b.key[:0], p, k)
	_ = b.b.Set(b.key, v, nil)
	b.n++
}

// del deletes state key k (a string or a []byte) of partition p.
func del[K string | []byte](b *batch, p int32, k K) {
	b.key = appendDataKey(b.key[:0], p, k)
	_ = b.b.Delete(b.key, nil)
	b.n++
}

func (b *batch) set(p int32, k, v []byte) { set(b, p, k, v) }

func (b *batch) del(p int32, k []byte) { del(b, p, k) }

func (b *batch) deleteRange(p int32, lo, hi []byte) {
	_ = b.b.DeleteRange(dataKey(p, lo), dataKey(p, hi), nil)
	b.n++
}

func (b *batch) checkpoint(p int32, cp Checkpoint) {
	_ = b.b.Set(partPrefix(prefixCheckpoint, p), cp.encode(), nil)
}

// dropPartition deletes all of partition p's state and its checkpoint.
func (b *batch) dropPartition(p int32) {
	_ = b.b.DeleteRange(partPrefix(prefixData, p), partPrefix(prefixData, p+1), nil)
	_ = b.b.Delete(partPrefix(prefixCheckpoint, p), nil)
}

// wipe deletes all of partition p's state and its checkpoint, in a batch
// of its own.
func (s *Store) wipe(p int32) error {
	b := s.newBatch()
	b.dropPartition(p)
	return b.commit()
}

// commit applies the batch atomically. It syncs the WAL when the last sync
// is walSyncInterval old or more (the first commit after open always) and
// the batch is not empty (Pebble writes no empty batch, and syncs
// nothing for it): that writes this batch and every earlier one out of
// Pebble's in-memory WAL block, so that a process crash cannot lose them
// (Store). A batch after the last sync stays in that block until the block
// fills, a later commit syncs it, or the flusher does (flushWAL).
func (b *batch) commit() error {
	defer b.b.Close()
	if c := b.s.corrupt.Load(); c != nil {
		return *c // foundCorrupt: the stage stops
	}
	now := time.Now().UnixNano()
	last := b.s.lastSync.Load()
	if now-last < b.s.syncEvery.Load() || b.b.Empty() || !b.s.lastSync.CompareAndSwap(last, now) {
		return b.b.Commit(pebble.NoSync)
	}
	return b.s.syncApply(b.b)
}

// syncApply applies pb and waits for the WAL sync that writes it and
// everything before it. Not Commit(pebble.Sync): Pebble treats an error
// of a commit that waits for its sync as fatal and exits the process;
// SyncWait returns it, to stop the stage as any failed apply does.
func (s *Store) syncApply(pb *pebble.Batch) error {
	if err := s.db.ApplyNoSyncWait(pb, pebble.Sync); err != nil {
		return err
	}
	return pb.SyncWait()
}

// flushWAL is the store's flusher: the goroutine that syncs the WAL when a
// batch was written after the last sync and no commit has synced it within
// walSyncInterval, so that the last batches before the traffic stops do
// not stay in Pebble's in-memory WAL block (Store). It costs the commits
// nothing: it learns of their writes from Pebble's count of bytes written
// to the WAL (Metrics), read about once a walSyncInterval, and an idle
// store syncs nothing. A sync that fails ends it: the sync of the next commit,
// which it then asks for, fails on the same error of Pebble's WAL and
// stops the stage (Close reports it too). It returns when Close stops it.
func (s *Store) flushWAL() {
	defer close(s.flushDone)
	// seen: Pebble's WAL byte count once everything up to it was synced
	// (or written before the store was opened).
	seen := s.db.Metrics().WAL.BytesIn
	t := time.NewTimer(s.flushInterval())
	defer t.Stop()
	for {
		select {
		case <-s.stopFlush:
			return
		case <-t.C:
		}
		wait, err := s.flushStep(&seen)
		if err != nil {
			s.lastSync.Store(0)
			s.log.Error("cannot sync the state's write-ahead log; the next commit syncs it again, and stops the stage on the error", zap.Error(err))
			return
		}
		t.Reset(wait)
	}
}

// flushInterval is how long the flusher waits between looks at most:
// syncEvery, or walSyncInterval when every commit syncs.
func (s *Store) flushInterval() time.Duration {
	if every := time.Duration(s.syncEvery.Load()); every > 0 {
		return every
	}
	return walSyncInterval
}

// flushStep is one look of the flusher: it syncs the WAL when bytes were
// written past seen and the last sync is walSyncInterval old, and returns
// when to look again: when the last sync is walSyncInterval old, or
// walSyncInterval from now.
func (s *Store) flushStep(seen *uint64) (time.Duration, error) {
	every := time.Duration(s.syncEvery.Load())
	if every <= 0 {
		return s.flushInterval(), nil // every commit syncs
	}
	in := s.db.Metrics().WAL.BytesIn
	if in == *seen {
		return every, nil
	}
	now := time.Now().UnixNano()
	last := s.lastSync.Load()
	if since := time.Duration(now - last); since >= 0 && since < every {
		// That sync wrote out everything before it; look again when it
		// is an interval old, for what came after it. (A wall clock set
		// back makes since negative: sync.)
		return every - since, nil
	}
	if !s.lastSync.CompareAndSwap(last, now) {
		return every, nil // a commit is syncing now
	}
	// A record of no data: its sync writes out everything before it.
	pb := s.db.NewBatch()
	defer pb.Close()
	_ = pb.LogData(nil, nil)
	n := uint64(len(pb.Repr()))
	if err := s.syncApply(pb); err != nil {
		return 0, err
	}
	// Bytes written between the count and the record make the count
	// differ from seen at the next look, which syncs them.
	*seen = in + n
	return every, nil
}

// DiskUsage estimates the bytes of partition p's state on disk.
func (s *Store) DiskUsage(p int32) (uint64, error) {
	return s.db.EstimateDiskUsage(partPrefix(prefixData, p), partPrefix(prefixData, p+1))
}

// partitions returns the number of every partition with state rows or a
// checkpoint in the store.
func (s *Store) partitions() ([]int32, error) {
	seen := map[int32]bool{}
	for _, kind := range []byte{prefixData, prefixCheckpoint} {
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{kind}, UpperBound: []byte{kind + 1}})
		if err != nil {
			return nil, err
		}
		for it.First(); it.Valid(); {
			k := it.Key()
			if len(k) < 3 {
				it.Next()
				continue
			}
			p := int32(k[1])<<8 | int32(k[2])
			seen[p] = true
			if p == 0xFFFF {
				break
			}
			it.SeekGE(partPrefix(kind, p+1)) // the next partition's first key
		}
		if err := it.Close(); err != nil {
			return nil, err
		}
	}
	out := make([]int32, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out, nil
}
