// Package stream is the exactly-once runtime shared by Meterline's stateful
// stages (dedup, aggregator): consume → update state → produce, with the
// outputs, the changelog of every state change and the consumed offsets in
// one Kafka transaction (DESIGN §6).
//
// Invariants, and where they are kept:
//
//  1. Pebble is a cache of the changelog. Each partition's state carries a
//     checkpoint, the changelog offset it reflects (Store).
//  2. One transaction carries the outputs, the changelog records and the
//     consumed offsets (Runtime.commit; kgo's GroupTransactSession commits
//     the offsets in the transaction).
//  3. State reaches Pebble only after the commit succeeded, as one atomic
//     batch with the checkpoints (Runtime.apply); until then reads see the
//     transaction's overlay (Tx).
//  4. Restore runs after the group's offsets are stable (AdjustFetchOffsetsFn
//     with RequireStableFetchOffsets), pauses the partition, replays the
//     changelog read_committed up to the high watermark read at its start —
//     so it waits for a previous owner's transaction still in flight — and
//     resumes the partition when done (restore.go).
//  5. A fenced, failed or aborted commit discards the overlay; an unknown
//     outcome closes the client, re-initialises the same transactional ID
//     (which aborts or completes what was open), rejoins and restores.
//  6. Offsets are never reset silently: no automatic offset reset, the last
//     input offset kept in state and checked against the group's committed
//     offset on every restore.
package stream

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kzap"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/kafka"
)

// keyInputOffset is the runtime's own state key: the next input offset to
// consume, written to the changelog in every transaction that consumed
// input. Processor keys must not start with 0xFF.
const keyInputOffset = "\xffinput-offset"

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
// so the stage stops instead (DESIGN §6.6).
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

// errRestart asks Run to rebuild the session (unknown commit outcome).
var errRestart = errors.New("restart session")

// Runtime runs one stateful stage instance.
type Runtime struct {
	cfg   Config
	conn  []kgo.Opt // cfg.Kafka's seed brokers, SASL and TLS
	proc  Processor
	log   *zap.Logger
	store *Store
	m     *metrics

	sess *kgo.GroupTransactSession
	// stateBytesAt is when meterline_stream_state_bytes was last set.
	stateBytesAt time.Time
	adm          *kadm.Client

	// mu guards parts and the event queue, and orders apply against the
	// start of a restore (see apply).
	mu      sync.Mutex
	parts   map[int32]*partState
	events  []event
	wake    chan struct{}
	fatal   error
	running atomic.Bool
	joined  atomic.Bool // a session is up
	crashAt atomic.Pointer[string]
	// restores tracks restore goroutines: the store is closed only after
	// all of them returned.
	restores sync.WaitGroup
	// horizon plans restores against delete.retention.ms (DESIGN §6.8).
	horizon restoreHorizon

	// Run-loop-only state.
	active    map[int32]*activePart
	inTxn     bool
	mustAbort bool // records of a partition that is not ready were polled
	txStart   time.Time
	txRecs    int
	ovs       map[int32]*overlay
	txEpoch   map[int32]uint64
	txWorked  int32 // the partition that did Work in this transaction, or noWorker
	workNext  int32 // Work goes to partitions in turn, from this one (work.go)

	// txnEnd holds a transaction's records back until the coordinator
	// finished the previous one (settle.go).
	txnEnd txnEndWatch

	prodMu    sync.Mutex
	prodErr   error
	changeEnd map[int32]int64 // max changelog offset produced per partition in this txn
}

type partState struct {
	epoch     uint64
	committed int64 // group's committed offset at assignment; -1: none
	cancel    context.CancelFunc
}

type activePart struct {
	epoch uint64
	part  Partition
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
}

// New opens the state store and prepares the runtime; Run starts it.
func New(cfg Config, proc Processor) (*Runtime, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	conn, err := cfg.Kafka.Opts()
	if err != nil {
		return nil, fmt.Errorf("stream: %w", err)
	}
	st, err := OpenStore(cfg.StateDir, cfg.FS, cfg.Logger)
	if err != nil {
		return nil, err
	}
	rt := &Runtime{
		cfg:   cfg,
		conn:  conn,
		proc:  proc,
		log:   cfg.Logger.With(zap.String("stage", cfg.Stage), zap.String("instance", cfg.InstanceID)),
		store: st,
		m:     newMetrics(cfg.Registerer, cfg.Stage),
		parts: map[int32]*partState{},
		wake:  make(chan struct{}, 1),
	}
	return rt, nil
}

// Ready returns nil when the stage runs a session and no partition it
// owns is restoring; otherwise why not. It backs /readyz.
func (rt *Runtime) Ready() error {
	if !rt.joined.Load() {
		return errors.New("not connected to the group")
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
	if n > 0 {
		return fmt.Errorf("%d partitions restoring", n)
	}
	return nil
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
		rt.restores.Wait()
		if cerr := rt.store.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("stream: close state: %w", cerr))
		}
	}()
	for {
		err := rt.runSession(ctx)
		if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled) || errors.Is(err, errRestart)) {
			return nil
		}
		if !errors.Is(err, errRestart) {
			return err
		}
		rt.m.restarts.Inc()
		rt.log.Warn("commit outcome unknown: rebuilding the session with the same transactional ID, then restoring",
			zap.String("transactional_id", rt.cfg.TransactionalID()))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(rt.cfg.RestartBackoff):
		}
	}
}

// clientOptions are the options of one session's client. ready is closed
// once rt.sess and rt.adm hold that session: kgo may join the group and
// call AdjustFetchOffsetsFn before NewGroupTransactSession has returned,
// and the callback must pause the new client's partitions, not read a nil
// or the previous session's.
func (rt *Runtime) clientOptions(ready <-chan struct{}) []kgo.Opt {
	c := &rt.cfg
	opts := []kgo.Opt{
		kgo.TransactionalID(c.TransactionalID()),
		kgo.TransactionTimeout(c.TransactionTimeout),
		kgo.ConsumerGroup(c.Group),
		kgo.ConsumeTopics(c.InputTopic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		// No automatic reset: an out-of-range offset is a fatal error, never
		// a silent jump (DESIGN §6.6). adjustOffsets sets the start.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.SessionTimeout(c.SessionTimeout),
		kgo.RebalanceTimeout(c.RebalanceTimeout),
		kgo.HeartbeatInterval(c.SessionTimeout / 10),
		kgo.FetchMaxWait(500 * time.Millisecond),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(0),
		// A commit produces its changelog records (and the aggregator its
		// OPEN revisions) in one burst of up to a few records per input
		// record; with kgo's default buffer of 10,000 records Produce
		// blocked half-way through that burst until earlier batches were
		// acknowledged (bench aggregate: ending a transaction took 143 ms
		// on average with the default, 80 ms with this).
		kgo.MaxBufferedRecords(1 << 20),
		// A poll drains the buffered fetch partition by partition, and a
		// partition's records are processed by one goroutine. With kgo's
		// default of 1 MiB per partition per fetch, one partition held
		// about 85% of a poll's records in bench dedup (10,000 records of
		// ~150 bytes), so Process ran on one core; at 256 KiB a poll spans
		// several partitions and the largest held about 40%
		// (handleFetches runs partitions in parallel).
		kgo.FetchMaxPartitionBytes(fetchMaxPartitionBytes),
		kgo.AdjustFetchOffsetsFn(func(ctx context.Context, offs map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
			select {
			case <-ready:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return rt.adjustOffsets(ctx, offs)
		}),
		kgo.OnPartitionsRevoked(rt.onRevoked),
		kgo.OnPartitionsLost(rt.onRevoked),
		kgo.WithLogger(kzap.New(rt.log.Named("kgo"), kzap.Level(kgoLevel(rt.log)))),
	}
	return slices.Concat(rt.conn, opts, c.ClientOptions)
}

// newClient returns a client on the runtime's cluster connection (seed
// brokers, SASL, TLS) with opts.
func (rt *Runtime) newClient(opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(slices.Concat(rt.conn, opts)...)
}

// fetchMaxPartitionBytes caps what one fetch returns of one partition (see
// clientOptions). Kafka still returns a larger first batch whole.
const fetchMaxPartitionBytes = 256 << 10

func kgoLevel(l *zap.Logger) kgo.LogLevel {
	if l.Core().Enabled(zap.DebugLevel) {
		return kgo.LogLevelDebug
	}
	return kgo.LogLevelWarn
}

func (rt *Runtime) runSession(ctx context.Context) (err error) {
	ready := make(chan struct{})
	sess, err := kgo.NewGroupTransactSession(rt.clientOptions(ready)...)
	if err != nil {
		return fmt.Errorf("stream: kafka client: %w", err)
	}
	rt.sess = sess
	rt.adm = kadm.NewClient(sess.Client())
	rt.joined.Store(true)
	defer rt.joined.Store(false)
	rt.active = map[int32]*activePart{}
	rt.resetTxn()
	close(ready)
	defer func() {
		rt.txnEnd.stop()
		rt.closeAll()
		// Leaving the group revokes our partitions; an open transaction
		// was already ended (or the client is being abandoned after an
		// unknown outcome, in which case the next session's InitProducerID
		// aborts it).
		sess.Close()
	}()
	// Initialise the transactional ID now, not at the first produce: it
	// fences a previous incarnation of this instance and aborts (or
	// completes) its open transaction, which a restore of our own
	// partitions would otherwise wait on until the transaction timeout
	// (DESIGN §6.5).
	ictx, cancel := context.WithTimeout(ctx, rt.cfg.TransactionTimeout+rt.cfg.SessionTimeout)
	_, _, perr := sess.Client().ProducerID(ictx)
	cancel()
	if perr != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rt.log.Warn("initialising the transactional ID failed; retrying", zap.Error(perr))
		return errRestart
	}
	rt.log.Info("stage started", zap.String("group", rt.cfg.Group), zap.String("input", rt.cfg.InputTopic),
		zap.String("changelog", rt.cfg.ChangelogTopic), zap.String("transactional_id", rt.cfg.TransactionalID()))

	var nextPunct time.Time
	if rt.cfg.PunctuateInterval > 0 {
		nextPunct = rt.cfg.Clock.Now().Add(rt.cfg.PunctuateInterval)
	}
	for {
		if err := rt.takeFatal(); err != nil {
			rt.abortOpen()
			return err
		}
		if ctx.Err() != nil {
			if rt.inTxn {
				if err := rt.commit(context.WithoutCancel(ctx)); err != nil {
					return err
				}
			}
			return ctx.Err()
		}
		// Wait for input, but no longer than the next deadline.
		wait := time.Second
		now := rt.cfg.Clock.Now()
		if rt.inTxn {
			wait = rt.txStart.Add(rt.cfg.CommitInterval).Sub(now)
		}
		if !nextPunct.IsZero() {
			if d := nextPunct.Sub(now); d < wait {
				wait = d
			}
		}
		if rt.pendingWork() {
			wait = 0 // take what input there is, then work (work.go)
		}
		fetches := rt.poll(ctx, wait)
		rt.handleEvents()
		if err := rt.handleFetches(fetches); err != nil {
			rt.abortOpen()
			return err
		}
		now = rt.cfg.Clock.Now()
		if !nextPunct.IsZero() && !now.Before(nextPunct) {
			for !nextPunct.After(now) {
				nextPunct = nextPunct.Add(rt.cfg.PunctuateInterval)
			}
			if err := rt.punctuate(); err != nil {
				rt.abortOpen()
				return err
			}
		}
		if err := rt.work(); err != nil {
			rt.abortOpen()
			return err
		}
		if rt.inTxn && (rt.txWorked != noWorker || rt.txRecs >= rt.cfg.MaxBatchRecords || !now.Before(rt.txStart.Add(rt.cfg.CommitInterval))) {
			if err := rt.commit(ctx); err != nil {
				return err
			}
		}
	}
}

// poll waits up to d for records, waking early for a restored partition.
func (rt *Runtime) poll(ctx context.Context, d time.Duration) kgo.Fetches {
	if d <= 0 {
		d = time.Millisecond
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t := rt.cfg.Clock.AfterFunc(d, cancel)
	defer t.Stop()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-rt.wake:
			cancel()
		case <-stop:
		}
	}()
	max := rt.cfg.MaxBatchRecords - rt.txRecs
	if max <= 0 {
		max = 1
	}
	return rt.sess.PollRecords(pctx, max)
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

// handleEvents installs restored partitions and closes revoked ones, in the
// order they happened.
func (rt *Runtime) handleEvents() {
	rt.mu.Lock()
	evs := rt.events
	rt.events = nil
	rt.mu.Unlock()
	for _, ev := range evs {
		switch ev.kind {
		case evRevoked:
			if a, ok := rt.active[ev.p]; ok && a.epoch < ev.epoch {
				a.part.Close()
				delete(rt.active, ev.p)
				rt.log.Info("partition revoked", zap.Int32("partition", ev.p))
			}
		case evRestored:
			rt.mu.Lock()
			ps, ok := rt.parts[ev.p]
			current := ok && ps.epoch == ev.epoch
			rt.mu.Unlock()
			if !current {
				ev.part.Close()
				continue
			}
			if a, ok := rt.active[ev.p]; ok {
				a.part.Close()
			}
			rt.active[ev.p] = &activePart{epoch: ev.epoch, part: ev.part}
		}
	}
	rt.m.owned.Set(float64(len(rt.active)))
}

// producerStateError reports whether a record failed because of the
// transactional producer's own state (fenced, epoch bumped, state expired)
// or a timeout, rather than because the broker refuses the record.
func producerStateError(err error) bool {
	return errors.Is(err, kerr.InvalidProducerEpoch) || errors.Is(err, kerr.ProducerFenced) ||
		errors.Is(err, kerr.InvalidProducerIDMapping) || errors.Is(err, kerr.UnknownProducerID) ||
		errors.Is(err, kerr.InvalidTxnState) || errors.Is(err, kerr.TransactionAbortable) ||
		errors.Is(err, kerr.ConcurrentTransactions) || errors.Is(err, kgo.ErrRecordTimeout) ||
		errors.Is(err, kgo.ErrAborting) || errors.Is(err, context.DeadlineExceeded)
}

func (rt *Runtime) handleFetches(fs kgo.Fetches) error {
	var ferr error
	fs.EachError(func(t string, p int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed) {
			return
		}
		// kgo injects this when the member was dropped from the group (a
		// zombie after a long pause, a missed session timeout) or could
		// not reach the group coordinator (a broker that died or paused,
		// a coordinator that moved). It has already called onLost (our
		// partitions are revoked; an open transaction can only abort) and
		// keeps rejoining; the next assignment restores as usual (DESIGN
		// §6, "zombie instance after a rebalance"). It is a notification,
		// not a reason to stop.
		var gs *kgo.ErrGroupSession
		if errors.As(err, &gs) && kafka.GroupRejoins(gs.Err) {
			rt.log.Warn("lost the consumer group or its coordinator; rejoining", zap.Error(err))
			return
		}
		if ferr == nil {
			ferr = fmt.Errorf("stream: fetch %s/%d: %w (offsets are never reset automatically; see DESIGN §6.6)", t, p, err)
		}
	})
	if ferr != nil {
		return ferr
	}
	// First, serially: which partitions can take their records, the open
	// transaction and each partition's overlay. Then the partitions'
	// Process calls run in parallel: each has its own overlay, its own
	// state prefix and its own output order, and shares nothing mutable
	// with the others.
	type job struct {
		a    *activePart
		tx   *Tx
		recs []*kgo.Record
	}
	var jobs []job
	var perr error
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		if perr != nil || len(fp.Records) == 0 {
			return
		}
		a, ok := rt.active[fp.Partition]
		if !ok {
			// Records of a partition that is not restored (a revoke and
			// re-assign raced the poll). They were polled, so the session
			// would commit their offsets: abort instead, which rewinds.
			rt.log.Info("records for a partition not ready; aborting the transaction to rewind",
				zap.Int32("partition", fp.Partition))
			if !rt.inTxn {
				if err := rt.begin(); err != nil {
					perr = err
					return
				}
			}
			rt.mustAbort = true
			return
		}
		if !rt.inTxn {
			if err := rt.begin(); err != nil {
				perr = err
				return
			}
		}
		ov := rt.overlayFor(fp.Partition, a.epoch)
		rt.m.recordsIn.WithLabelValues(fp.Topic).Add(float64(len(fp.Records)))
		jobs = append(jobs, job{a: a, tx: &Tx{rt: rt, p: fp.Partition, ov: ov}, recs: fp.Records})
	})
	if perr != nil {
		return perr
	}
	err := parallel(len(jobs), func(i int) error {
		j := jobs[i]
		if err := j.a.part.Process(j.tx, j.recs); err != nil {
			return fmt.Errorf("stream: process partition %d: %w", j.tx.p, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, j := range jobs {
		j.tx.ov.inputNext = j.recs[len(j.recs)-1].Offset + 1
		j.tx.ov.touched = true
		rt.txRecs += len(j.recs)
	}
	return nil
}

// parallel calls fn(0) … fn(n-1) on up to GOMAXPROCS goroutines and
// returns the error of the lowest i that failed. A panic in fn (a
// simulated crash, fault.Crash, or a bug) is raised again in the caller's
// goroutine once every call has returned, so that Run's recovery sees it.
func parallel(n int, fn func(i int) error) error {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 {
		for i := range n {
			if err := fn(i); err != nil {
				return err
			}
		}
		return nil
	}
	errs := make([]error, n)
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		panicMu  sync.Mutex
		panicked any
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if v := recover(); v != nil {
					if _, crash := v.(fault.Crash); !crash {
						v = fmt.Sprintf("%v\n\ngoroutine stack of the panic:\n%s", v, debug.Stack())
					}
					panicMu.Lock()
					if panicked == nil {
						panicked = v
					}
					panicMu.Unlock()
				}
			}()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				errs[i] = fn(i)
			}
		}()
	}
	wg.Wait()
	if panicked != nil {
		panic(panicked)
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (rt *Runtime) punctuate() error {
	for _, p := range sortedPartitions(rt.active) {
		a := rt.active[p]
		if !rt.inTxn {
			if err := rt.begin(); err != nil {
				return err
			}
		}
		tx := &Tx{rt: rt, p: p, ov: rt.overlayFor(p, a.epoch)}
		if err := a.part.Punctuate(tx); err != nil {
			return fmt.Errorf("stream: punctuate partition %d: %w", p, err)
		}
	}
	return nil
}

func (rt *Runtime) overlayFor(p int32, epoch uint64) *overlay {
	ov, ok := rt.ovs[p]
	if !ok {
		ov = newOverlay()
		rt.ovs[p] = ov
		rt.txEpoch[p] = epoch
	}
	return ov
}

func (rt *Runtime) begin() error {
	if err := rt.sess.Begin(); err != nil {
		return fmt.Errorf("stream: begin transaction: %w", err)
	}
	rt.inTxn = true
	rt.txStart = rt.cfg.Clock.Now()
	return nil
}

// discardTxn tells the partitions of a transaction that is not committing
// to forget it, then resets the transaction state.
func (rt *Runtime) discardTxn() {
	for p := range rt.ovs {
		if a, ok := rt.active[p]; ok {
			if ab, ok := a.part.(Aborter); ok {
				ab.Abort()
			}
		}
	}
	rt.resetTxn()
}

func (rt *Runtime) resetTxn() {
	rt.inTxn = false
	rt.txRecs = 0
	rt.txWorked = noWorker
	rt.mustAbort = false
	rt.ovs = map[int32]*overlay{}
	rt.txEpoch = map[int32]uint64{}
	rt.prodMu.Lock()
	rt.prodErr = nil
	rt.changeEnd = map[int32]int64{}
	rt.prodMu.Unlock()
}

func (rt *Runtime) emit(r *kgo.Record) {
	rt.m.recordsOut.WithLabelValues(r.Topic).Inc()
	rt.txnEnd.produce(rt, r) // held back until the coordinator finished the previous transaction
}

func (rt *Runtime) promise(r *kgo.Record, err error) {
	rt.prodMu.Lock()
	defer rt.prodMu.Unlock()
	if err != nil {
		if rt.prodErr == nil {
			rt.prodErr = fmt.Errorf("produce to %s/%d: %w", r.Topic, r.Partition, err)
		}
		return
	}
	if r.Topic == rt.cfg.ChangelogTopic {
		if cur, ok := rt.changeEnd[r.Partition]; !ok || r.Offset > cur {
			rt.changeEnd[r.Partition] = r.Offset
		}
	}
}

// abortOpen ends an open transaction with an abort, best effort, before a
// fatal return.
func (rt *Runtime) abortOpen() {
	if !rt.inTxn {
		return
	}
	rt.txnEnd.stop()
	ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.TransactionTimeout)
	defer cancel()
	_, _ = rt.sess.End(ctx, kgo.TryAbort)
	rt.discardTxn()
}

// commit writes the changelog, ends the transaction and, if it committed,
// applies the overlay to Pebble.
func (rt *Runtime) commit(ctx context.Context) error {
	start := time.Now()
	// Guarantee: every record emitted in the transaction was handed to the
	// client (held-back ones after the coordinator finished the previous
	// transaction, settle.go).
	rt.txnEnd.wait()
	// Every changelog record of this transaction, and so everything past
	// the checkpoints apply writes, is appended after this instant: it
	// dates those checkpoints (Checkpoint.At, DESIGN §6.8).
	at := rt.cfg.Clock.Now()
	abort := rt.mustAbort
	ps := sortedPartitions(rt.ovs)
	if !abort {
		// Partitions flush in parallel, as they process (handleFetches).
		var flushers []Flusher
		var fps []int32
		for _, p := range ps {
			a, ok := rt.active[p]
			if !ok || a.epoch != rt.txEpoch[p] {
				continue
			}
			if f, isFlusher := a.part.(Flusher); isFlusher {
				flushers = append(flushers, f)
				fps = append(fps, p)
			}
		}
		err := parallel(len(flushers), func(i int) error {
			if err := flushers[i].Flush(&Tx{rt: rt, p: fps[i], ov: rt.ovs[fps[i]]}); err != nil {
				return fmt.Errorf("stream: flush partition %d: %w", fps[i], err)
			}
			return nil
		})
		if err != nil {
			rt.abortOpen()
			return err
		}
	}
	_ = parallel(len(ps), func(i int) error {
		ov := rt.ovs[ps[i]]
		if !ov.touched {
			return nil
		}
		for _, r := range ov.changelogRecords(rt.cfg.ChangelogTopic, ps[i]) {
			rt.sess.Produce(context.Background(), r, rt.promise)
		}
		return nil
	})
	// Guarantee: nothing of this transaction is visible to read_committed
	// readers yet; a crash here aborts it (the next session with this
	// transactional ID, or the transaction timeout, aborts it) and the input
	// is re-consumed from the committed offset.
	rt.hit(fault.BeforeCommit)
	try := kgo.TryCommit
	if abort {
		try = kgo.TryAbort
	}
	// Every record of the transaction must have been written before it may
	// commit: kgo can end a transaction with TryCommit even after a record
	// failed (seen with INVALID_RECORD on a real broker), which would commit
	// the consumed offsets past a lost output. Flush, check, and abort.
	fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), rt.cfg.TransactionTimeout)
	ferr := rt.sess.Client().Flush(fctx)
	fcancel()
	rt.prodMu.Lock()
	failed := rt.prodErr
	rt.prodMu.Unlock()
	if ferr != nil || failed != nil {
		try = kgo.TryAbort
	}
	// End flushes, so every promise has run when it returns. It is never
	// cancelled half-way (kgo: that leaves the client in an invalid state);
	// the deadline bounds it.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rt.cfg.TransactionTimeout+rt.cfg.SessionTimeout)
	defer cancel()
	committed, err := rt.sess.End(rt.fenceWork(ectx), try)
	if err == nil {
		rt.txnEnd.start(context.WithoutCancel(ctx), rt, rt.adm)
	}
	rt.prodMu.Lock()
	perr := rt.prodErr
	rt.prodMu.Unlock()
	rt.m.commitSeconds.Observe(time.Since(start).Seconds())
	switch {
	case err != nil:
		rt.m.txns.WithLabelValues("unknown").Inc()
		rt.log.Error("ending the transaction failed; outcome unknown", zap.Error(err))
		rt.discardTxn()
		return errRestart
	case perr != nil && committed:
		// A record failed after the flush above, which only a concurrent
		// producer error can do: the transaction is committed without it.
		rt.resetTxn()
		return fmt.Errorf("stream: transaction committed with a failed record: %w", perr)
	case !committed:
		rt.m.txns.WithLabelValues("aborted").Inc()
		if perr != nil {
			rt.discardTxn()
			if producerStateError(perr) {
				// Fenced (a zombie whose group moved on) or the producer's
				// transactional state is gone: rebuild the session with the
				// same transactional ID, rejoin and restore (DESIGN §6).
				rt.log.Warn("transaction aborted: the producer was fenced or lost its state; rebuilding the session", zap.Error(perr))
				if errors.Is(perr, kerr.InvalidProducerEpoch) || errors.Is(perr, kerr.ProducerFenced) {
					rt.m.fenced.Inc() // a zombie's commit, refused
				}
				return errRestart
			}
			// kgo retries what can be retried; a record the broker still
			// refused (INVALID_RECORD, a topic that is gone) would fail
			// again. Stop without loss: nothing of the transaction is
			// committed and the input is re-consumed after a restart.
			rt.log.Error("transaction aborted: a record could not be written; stopping", zap.Error(perr))
			return fmt.Errorf("stream: a record of the transaction could not be written (nothing committed): %w", perr)
		}
		if !abort {
			rt.log.Info("transaction aborted: the group rebalanced or the commit was fenced; re-consuming from the committed offsets")
			rt.m.fenced.Inc()
		}
		rt.discardTxn()
		return nil
	}
	rt.m.txns.WithLabelValues("committed").Inc()
	// Guarantee: outputs, changelog and offsets are committed; Pebble is
	// behind the changelog. A crash here is repaired by replaying the
	// changelog tail from the checkpoint on restore.
	rt.hit(fault.AfterCommit)
	if err := rt.apply(at); err != nil {
		return err
	}
	// Guarantee: Pebble matches the changelog for every applied partition.
	rt.hit(fault.AfterApply)
	rt.resetTxn()
	rt.reportStateBytes()
	return nil
}

// stateBytesEvery is how often a committing runtime refreshes
// meterline_stream_state_bytes (a metric only: wall time decides nothing
// here).
const stateBytesEvery = 10 * time.Second

// reportStateBytes sets the state's size on disk, at most every
// stateBytesEvery.
func (rt *Runtime) reportStateBytes() {
	if now := time.Now(); now.Sub(rt.stateBytesAt) >= stateBytesEvery {
		rt.stateBytesAt = now
		rt.m.stateBytes.Set(float64(rt.store.DB().Metrics().DiskSpaceUsage()))
	}
}

// apply writes the committed overlay and the checkpoints to Pebble in one
// atomic batch. A partition whose restore began since the transaction
// started (a new epoch) is skipped: its restore replays the changelog
// anyway, and writing here could overwrite newer replayed values. at dates
// the checkpoints (Checkpoint.At): taken before the transaction's changelog
// records were produced.
func (rt *Runtime) apply(at time.Time) error {
	rt.prodMu.Lock()
	ends := rt.changeEnd
	rt.prodMu.Unlock()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	b := rt.store.newBatch()
	ps := sortedPartitions(rt.ovs)
	for i, p := range ps {
		ov := rt.ovs[p]
		st, ok := rt.parts[p]
		end, produced := ends[p]
		if !ok || st.epoch != rt.txEpoch[p] {
			continue
		}
		for _, rd := range ov.rangeDels {
			b.deleteRange(p, rd.lo, rd.hi)
		}
		for _, k := range ov.order {
			e, ok := ov.writes[k]
			if !ok {
				continue
			}
			if e.del {
				b.del(p, []byte(k))
			} else {
				b.set(p, []byte(k), e.val)
			}
		}
		if ov.inputNext >= 0 {
			b.set(p, []byte(keyInputOffset), encodeOffset(ov.inputNext))
		}
		if produced {
			b.checkpoint(p, Checkpoint{Offset: end + 1, At: at})
		}
		if i == len(ps)/2 {
			// Guarantee: the batch is not committed; a crash here leaves
			// Pebble at the previous checkpoint.
			rt.hit(fault.DuringApply)
		}
	}
	if err := b.commit(); err != nil {
		return fmt.Errorf("stream: apply committed state to Pebble: %w", err)
	}
	return nil
}

func (rt *Runtime) closeAll() {
	for p, a := range rt.active {
		a.part.Close()
		delete(rt.active, p)
	}
	rt.mu.Lock()
	for p, ps := range rt.parts {
		if ps.cancel != nil {
			ps.cancel()
		}
		delete(rt.parts, p)
	}
	rt.events = nil
	rt.mu.Unlock()
	rt.m.owned.Set(0)
}

// onRevoked runs on kgo's group goroutine for revoked and lost partitions.
// The GroupTransactSession has already marked an open transaction as
// failed, so it cannot commit; the run loop's End aborts it. Here we stop
// restores and queue the partitions' close.
func (rt *Runtime) onRevoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	rt.mu.Lock()
	for _, p := range revoked[rt.cfg.InputTopic] {
		ps, ok := rt.parts[p]
		if !ok {
			continue
		}
		if ps.cancel != nil {
			ps.cancel()
		}
		rt.events = append(rt.events, event{kind: evRevoked, p: p, epoch: epochSeq.Add(1)})
		delete(rt.parts, p)
		rt.m.restoring.WithLabelValues(fmt.Sprint(p)).Set(0)
	}
	rt.mu.Unlock()
	rt.notify()
}

var epochSeq atomic.Uint64

// adjustOffsets runs on kgo's group goroutine after the group's committed
// offsets for newly assigned partitions are fetched (stable, KIP-447). It
// pauses each partition and starts its restore; the partition resumes when
// its state is restored and checked against the committed offset.
func (rt *Runtime) adjustOffsets(_ context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	parts := offsets[rt.cfg.InputTopic]
	if len(parts) == 0 {
		return offsets, nil
	}
	pause := make([]int32, 0, len(parts))
	for p := range parts {
		pause = append(pause, p)
	}
	rt.sess.Client().PauseFetchPartitions(map[string][]int32{rt.cfg.InputTopic: pause})
	rt.mu.Lock()
	for p, o := range parts {
		committed := o.EpochOffset().Offset // negative: the group has none
		if committed < 0 {
			committed = -1
			// A first start reads from the earliest offset (DESIGN §6.6).
			// kgo passes the reset offset here, and NoResetOffset means
			// the end of the partition, which would skip existing input.
			parts[p] = kgo.NoResetOffset().AtStart()
		}
		if old, ok := rt.parts[p]; ok && old.cancel != nil {
			old.cancel()
		}
		ctx, cancel := context.WithCancel(context.Background())
		ps := &partState{epoch: epochSeq.Add(1), committed: committed, cancel: cancel}
		rt.parts[p] = ps
		rt.restores.Add(1)
		go func() {
			defer rt.restores.Done()
			defer func() {
				if r := recover(); r != nil {
					c, ok := r.(fault.Crash)
					if !ok {
						panic(r)
					}
					rt.setFatal(fmt.Errorf("stream: %w at %s", ErrCrashed, c.Point))
				}
			}()
			rt.restore(ctx, rt.sess, rt.adm, p, ps.epoch, committed)
		}()
	}
	rt.mu.Unlock()
	return offsets, nil
}
