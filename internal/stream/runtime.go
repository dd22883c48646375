// Package stream is the exactly-once runtime shared by Meterline's stateful
// stages (dedup, aggregator): consume → update state → produce, with the
// outputs, the changelog of every state change and the consumed offsets in
// one Kafka transaction (docs/design.md, Exactly-once, 1).
//
// Invariants, and where they are kept:
//
//  1. Pebble is a cache of the changelog. Each partition's state carries a
//     checkpoint, the changelog offset it reflects (Store).
//  2. One transaction carries the outputs, the changelog records and the
//     consumed offsets (Runtime.commit in commit.go; kgo's
//     GroupTransactSession commits the offsets in the transaction).
//  3. State reaches Pebble only after the commit succeeded, as one atomic
//     batch with the checkpoints (Runtime.apply in commit.go); until then
//     reads see the transaction's overlay (Tx).
//  4. Restore runs after the group's offsets are stable (AdjustFetchOffsetsFn
//     with RequireStableFetchOffsets), pauses the partition, replays the
//     changelog read_committed up to the high watermark read at its start —
//     so it waits for a previous owner's transaction still in flight — and
//     resumes the partition when done (session.go's adjustOffsets starts
//     it; restore.go).
//  5. A fenced, failed or aborted commit discards the overlay
//     (Runtime.notCommitted in commit.go); an unknown outcome closes the
//     client, re-initialises the same transactional ID (which aborts or
//     completes what was open), rejoins and restores (session.Loop, and
//     runSession in session.go).
//  6. Offsets are never reset silently: no automatic offset reset, the last
//     input offset kept in state and checked against the group's committed
//     offset on every restore. A partition the group has no committed
//     offset of is read from its start, which the first transaction that
//     writes for it commits, state included, so that a zombie's
//     transactions for it are fenced too (fenceFirst in work.go).
//
// Files: runtime.go (Runtime, Run), session.go (one Kafka session: its
// loop, the group's assign and revoke callbacks), process.go (polled
// records and punctuation into the open transaction), commit.go (the
// commit path: flush, changelog, end, apply), processor.go (what a stage
// implements), txn.go (Tx, the overlay), settle.go (a transaction's records
// wait for the previous one's end), seqreset.go (a transaction's partitions
// are in the client's metadata before it ends), restore.go, redate.go
// (the checkpoints of idle owned partitions keep a date), work.go,
// copartition.go (the group balancer), standby.go and standby_balance.go
// (docs/operations.md, Standby replicas).
package stream

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/session"
)

// keyInputOffset is the runtime's own state key: the next input offset to
// consume, written to the changelog in every transaction that consumed
// input. Processor keys must not start with 0xFF.
const keyInputOffset = "\xffinput-offset"

// inputs returns the input topics: InputTopic, then the co-partitioned
// ones.
func (c *Config) inputs() []string {
	return append([]string{c.InputTopic}, c.CopartitionedTopics...)
}

// inputOffsetKey returns the state key of a topic's next input offset:
// keyInputOffset for InputTopic (as with one input), that key, "/" and the
// topic's name for a co-partitioned topic.
func (c *Config) inputOffsetKey(topic string) string {
	if topic == c.InputTopic {
		return keyInputOffset
	}
	return keyInputOffset + "/" + topic
}

func encodeOffset(o int64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(o))
	return b[:]
}

func decodeOffset(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("corrupt offset (%d bytes)", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

// ErrOffsetMismatch is returned (wrapped) when a partition's restored state
// and the group's committed offset disagree: re-processing would re-count,
// so the stage stops instead (docs/design.md, Exactly-once, 6).
var ErrOffsetMismatch = errors.New("state and committed offset disagree")

// CrashAt makes this instance crash in-process the next time it reaches
// point (a fault point name), as fault.CrashHandler does, without affecting
// other instances in the process. The demo uses it to show recovery.
func (rt *Runtime) CrashAt(point string) { rt.crashAt.Store(&point) }

// hit is a fault point: the process-wide one, then this instance's own.
func (rt *Runtime) hit(point string) {
	fault.Hit(point)
	if p := rt.crashAt.Load(); p != nil && *p == point && rt.crashAt.CompareAndSwap(p, nil) {
		panic(fault.Crash{Point: point})
	}
}

// ErrCrashed is returned by Run after a simulated crash in a test
// (fault.CrashHandler).
var ErrCrashed = errors.New("simulated crash")

// Runtime runs one stateful stage instance.
type Runtime struct {
	cfg   Config
	loop  *session.Loop // opens the sessions, rebuilds them after ErrRestart
	proc  Processor
	log   *zap.Logger
	store *Store
	m     *metrics

	sess *kgo.GroupTransactSession
	// decomp is the sessions' decompressor: the bound per batch and the
	// budget of a poll's batches (decompress.go).
	decomp *decompressBudget
	// stateBytesAt is when meterline_stream_state_bytes was last set.
	stateBytesAt time.Time
	adm          *kadm.Client

	// mu guards parts, writers and the event queue, and orders apply
	// against the start of a restore (see apply). The state cleanup's
	// sweep takes sb.mu before it (cleanup.go); nothing else holds both.
	mu    sync.Mutex
	parts map[int32]*partState
	// writers counts the restore goroutines of each partition that may
	// still write its state (cleanup.go).
	writers map[int32]int
	events  []event
	wake    chan struct{}
	fatal   error
	running atomic.Bool
	joined  atomic.Bool // a session is up
	// txnInit is true once the session's transactional ID is initialised
	// (initProducerID): until then no transaction can start.
	txnInit atomic.Bool
	crashAt atomic.Pointer[string]
	// restores tracks restore goroutines: the store is closed only after
	// all of them returned.
	restores sync.WaitGroup
	// horizon plans restores against delete.retention.ms (docs/design.md,
	// Exactly-once, 4).
	horizon restoreHorizon
	// keeps is the last check of the changelog's cleanup policy
	// (changelogkeeps.go).
	keeps keepsWatch
	// offWait follows the assigned partitions waiting for the group's
	// committed offsets (offsetwait.go).
	offWait offsetWait
	// refusal is why the brokers refuse the stage's writes, as last
	// diagnosed (unwritten.go); refusalGen counts the transactions
	// committed, so that a diagnosis begun before one does not record a
	// refusal after it.
	refusalMu  sync.Mutex
	refusal    *writeRefusal
	refusalGen atomic.Uint64
	// sb runs the standby tails (standby.go).
	sb *standbys
	// cleanup deletes the state of partitions held elsewhere (cleanup.go).
	cleanup stateCleanup
	// kept holds the warm structures of revoked partitions for their next
	// restore here (keep.go); closing (under mu) the close of each revoked
	// partition's instance that the run loop has yet to do.
	kept    keptWarm
	closing map[int32]chan struct{}

	// Run-loop-only state.
	active    map[int32]*activePart
	inTxn     bool
	mustAbort bool // records of a partition that is not ready were polled
	txStart   time.Time
	txRecs    int
	ovs       map[int32]*overlay
	ovHint    map[int32]int // the room for each partition's next overlay (overlay.sizeHint)
	txEpoch   map[int32]uint64
	txWorked  int32 // the partition that did Work in this transaction, or noWorker
	workNext  int32 // Work goes to partitions in turn, from this one (work.go)
	// skips: the partitions of the session's client that had a batch
	// skipped, and where to put them back after a transaction that did
	// not commit (oversized.go).
	skips map[topicPartition]skipRewind

	// txnEnd holds a transaction's records back until the coordinator
	// finished the previous one (settle.go).
	txnEnd txnEndWatch
	// sink takes the emitted records instead of the session (Local); nil
	// in a Runtime.
	sink func(*kgo.Record)

	prodMu  sync.Mutex
	prodErr error
	// pidFailed is closed once a record of the open transaction failed
	// with an error for which kgo failed the producer ID (pidfail.go).
	// Guarded by prodMu.
	pidFailed chan struct{}
	changeEnd map[int32]int64 // max changelog offset produced per partition in this txn
	// seqKnown holds the partitions the session's client was seen to hold
	// in its stored metadata; txProduced those the open transaction wrote
	// to that are not in seqKnown (seqreset.go). Guarded by prodMu.
	seqKnown   map[topicPartition]struct{}
	txProduced map[topicPartition]struct{}

	// Run-loop-only (seqreset.go): seqRebuild is set when a partition the
	// transaction wrote to may keep its sequence numbers past the end of
	// the transaction, seqRestarts counts the sessions in a row ended by
	// OUT_OF_ORDER_SEQUENCE_NUMBER.
	seqRebuild  bool
	seqRestarts int
	// skipRebuild is set when the transaction skipped a batch past the
	// decompression bound (oversized.go): the session is rebuilt after it.
	skipRebuild bool
	// topicIDs caches the IDs of the topics whose gaps are checked
	// (gaps.go).
	topicIDs map[string][16]byte
	// gapClient fetches those gaps' batches: its own connections, where
	// no consumer's fetch waits for data ahead of its requests (a broker
	// answers a connection's requests in order). Made at its first use,
	// closed when Run returns.
	gapClient *kgo.Client
	// Tests: storedFn replaces the client's answer to whether it holds a
	// partition in its stored metadata, metadataWait the wait for it
	// (zero: producedMetadataWait).
	storedFn     func(topicPartition) bool
	metadataWait time.Duration
	// Tests: how often the run loop looks for idle owned partitions to
	// re-date (zero: ownerRedatePoll).
	redatePoll time.Duration
	// truncationWait replaces the package's truncationWait when positive
	// (tests).
	truncationWait time.Duration
	// Tests: replanWait, when set, replaces the timer a restore waits on
	// before it plans again after a changelog fetch out of range
	// (waitReplan).
	replanWait func(ctx context.Context, d time.Duration) error
	// Tests: restoredHook, when set, runs when a restore of partition p has
	// queued its install, just before it resumes the partition's fetching
	// (with mu held).
	restoredHook atomic.Pointer[func(p int32)]
	// Tests: copyHook, when set, runs before a copy of the changelog (a
	// restore's or a standby's, what) writes a batch of partition p.
	copyHook atomic.Pointer[func(what string, p int32)]
}

type partState struct {
	epoch     uint64
	committed map[string]int64 // group's committed offset per input topic at assignment; -1: none
	cancel    context.CancelFunc
	// marker is the checkpoint offset the last transaction applied in
	// this epoch wrote, where its commit marker sits (-1: none yet): an
	// end one past it is that marker (redate.go).
	marker int64
}

type activePart struct {
	epoch uint64
	part  Partition
	// start holds, for each input topic the group had no committed offset
	// of when the partition was assigned, the offset its reading starts
	// from (listed by the restore before the partition resumed); nil:
	// none. The first transaction that writes for the partition commits
	// these offsets (fenceFirst), and later ones fence with them
	// (startCommitted) until the group's offsets say more.
	start          map[string]int64
	startCommitted bool
}

type eventKind int

const (
	evRestored eventKind = iota
	evRevoked
)

type event struct {
	kind  eventKind
	p     int32
	epoch uint64
	part  Partition
	start map[string]int64 // evRestored: activePart.start
	// evRevoked: the generation of the partition's state at the revoke,
	// and the channel closed once the run loop closed its instance
	// (keep.go).
	gen    uint64
	closed chan struct{}
}

// New opens the state store and prepares the runtime; Run starts it.
func New(cfg Config, proc Processor) (*Runtime, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With(zap.String("stage", cfg.Stage), zap.String("instance", cfg.InstanceID))
	m := newMetrics(cfg.Registerer, cfg.Stage)
	for _, t := range cfg.inputs() {
		m.session.RecordsIn.WithLabelValues(t)
		m.timeIn.WithLabelValues(t)
	}
	for _, t := range cfg.OutputTopics {
		m.out(t)
	}
	loop, err := session.NewLoop(cfg.Config, log, m.session, "then restoring")
	if err != nil {
		return nil, fmt.Errorf("stream: %w", err)
	}
	st, err := OpenStore(cfg.StateDir, cfg.FS, cfg.Logger)
	if err != nil {
		return nil, err
	}
	if st.rebuilt != "" {
		m.stateRebuilt.WithLabelValues(st.rebuilt).Inc()
	}
	if err := st.BindChangelog(cfg.ChangelogTopic, cfg.StateDir); err != nil {
		return nil, errors.Join(err, st.Close())
	}
	decomp, err := newDecompressBudget(cfg.MaxDecompressBatchBytes, log)
	if err != nil {
		return nil, errors.Join(err, st.Close())
	}
	rt := &Runtime{
		decomp: decomp,
		cfg:    cfg,
		loop:   loop,
		proc:   proc,
		log:    log,
		store:  st,
		m:      m,
		parts:  map[int32]*partState{},
		wake:   make(chan struct{}, 1),
	}
	rt.sb = newStandbys(rt)
	// A corrupt table Pebble finds as the stage runs stops it; the next
	// start rebuilds the state (Store.foundCorrupt).
	st.OnCorrupt(rt.setFatal)
	return rt, nil
}

// Ready returns nil when the stage runs a session that is a member of its
// consumer group (session.Loop.InGroup: not while the brokers cannot be
// reached), has initialised its transactional ID (its transaction
// coordinator answered: until then no transaction can start, however
// long the group and the restores took) and no partition it owns is
// restoring or waiting for the group's committed offsets (a previous
// owner's open transaction holds them: offsetwait.go); otherwise why not.
// It backs /readyz. While the brokers refuse the stage's writes
// (WriteRefused: NOT_ENOUGH_REPLICAS, no leader) it is not ready either,
// and says so first, with whatever else keeps it from being ready.
func (rt *Runtime) Ready() error {
	err := rt.ready()
	if refused := rt.WriteRefused(); refused != nil {
		if err != nil {
			return fmt.Errorf("%w; %w", refused, err)
		}
		return refused
	}
	return err
}

func (rt *Runtime) ready() error {
	if !rt.joined.Load() {
		return errors.New("not connected to the group")
	}
	if err := rt.loop.InGroup(); err != nil {
		return err
	}
	if !rt.txnInit.Load() {
		return fmt.Errorf("initialising transactional ID %s: no transaction can start until its coordinator answers", rt.cfg.TransactionalID())
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.fatal != nil {
		return rt.fatal
	}
	n := 0
	for _, ps := range rt.parts {
		if ps.cancel != nil {
			n++
		}
	}
	wait := rt.offsetWaitNotReady()
	if n > 0 && wait != nil {
		return fmt.Errorf("%d partitions restoring; %w", n, wait)
	}
	if n > 0 {
		return fmt.Errorf("%d partitions restoring", n)
	}
	return wait
}

// Store returns the local state store.
func (rt *Runtime) Store() *Store { return rt.store }

// Run runs the stage until ctx ends (then it commits the open transaction,
// leaves the group and returns nil) or a fatal error occurs. It is called
// once; the store is closed when it returns, and an error closing it is
// returned too, joined with the one that stopped the stage.
func (rt *Runtime) Run(ctx context.Context) (err error) {
	if !rt.running.CompareAndSwap(false, true) {
		return errors.New("stream: Run called twice")
	}
	defer func() {
		// An in-process test's simulated crash (fault.CrashHandler):
		// return at once, as a killed process would stop.
		if r := recover(); r != nil {
			c, ok := r.(fault.Crash)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("stream: %w at %s", ErrCrashed, c.Point)
		}
		rt.closeAll()
		if rt.gapClient != nil {
			rt.gapClient.Close()
		}
		rt.sb.stopAll()
		rt.restores.Wait()
		if cerr := rt.store.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("stream: close state: %w", cerr))
		}
	}()
	return rt.loop.Run(ctx, rt.runSession)
}

func (rt *Runtime) notify() {
	select {
	case rt.wake <- struct{}{}:
	default:
	}
}

func (rt *Runtime) setFatal(err error) {
	rt.mu.Lock()
	if rt.fatal == nil {
		rt.fatal = err
	}
	rt.mu.Unlock()
	rt.notify()
}

func (rt *Runtime) takeFatal() error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.fatal
}
