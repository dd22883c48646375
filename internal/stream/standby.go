package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/prom"
)

// Standby replicas (docs/operations.md, Standby replicas).
//
// With Config.StandbyReplicas = N, the group's leader (CopartitionStandbyBalancer)
// gives each partition number N standby members besides its owner. A
// standby tails the partition's changelog, read_committed, into its own
// store, as a restore does, and moves the partition's checkpoint with every
// batch: its copy is warm state like any other. When it becomes the owner,
// the restore stops the tail and replays only what lies past the
// checkpoint, after the same horizon test (docs/design.md, Exactly-once, 4)
// as any warm state, so failover does not wait for a full restore.
//
// Checkpoint dates. A tail keeps the date of the checkpoint it started from
// (or, when it started over from the log start, the time it did). Every
// second it is given the changelog's end E, listed at time T (one listing
// for all the runtime's standbys: standbylist.go); once it has read up to
// E, every tombstone it has not seen lies at or past E and was appended
// after T, so the checkpoint is dated T from then on. A standby that keeps
// up thus keeps a checkpoint a few seconds old, and passes the horizon test
// however long it has been a standby. That holds only if it read what lies
// below E within the horizon of its previous date: a tail that read later
// (paused, stalled) may have missed a tombstone compacted away meanwhile,
// so it takes no new date and writes no batch (changelogCopy) and starts
// over with a full copy. After maxHorizonAttempts copies in a row that
// outlasted the horizon it wipes its copy, so that the group's balancer
// does not count it warm, and stops copying until the changelog's
// delete.retention.ms changes, and says what to set it to (horizonAdvice).
//
// A Processor that keeps in-memory structures it would otherwise rebuild
// from every key in Open (dedup's Bloom filters) implements Warmer: the
// standby keeps them up to date as it applies records, the restore's tail
// goes through them too, and Open receives them (PartitionState.Warm), so
// opening a promoted partition takes a time independent of its key count.

// Warmer is implemented by a Processor that keeps warm, for a partition it
// does not own, what its Open would otherwise rebuild from the state.
type Warmer interface {
	// Warm builds partition p's structures from its state in st. It runs
	// on the standby's goroutine when the standby starts (the state may be
	// empty), and may take time proportional to the state.
	Warm(p int32, st *PartitionState) (WarmState, error)
}

// WarmState is one partition's warm in-memory structures, kept in step
// with its state.
type WarmState interface {
	// Apply is called with every changelog record applied to the
	// partition's state (value nil: a delete), once the batch holding it is
	// committed to Pebble. It runs on one goroutine at a time.
	Apply(key, value []byte)
}

// WarmExpirer is implemented by a WarmState whose processor deletes state
// locally, not through the changelog, by a rule the changelog's records
// decide (dedup drops expired arrival buckets once the watermark it records
// passes them). A standby tail and a restore's replay apply the same
// deletes, so that a standby's state stays as bounded as its owner's.
type WarmExpirer interface {
	// LocalDeletes returns the key ranges [lo, hi) to delete from the
	// state now that the records given to Apply so far are committed;
	// each range is returned once.
	LocalDeletes() [][2][]byte
}

// applyLocalDeletes deletes warm's local ranges (WarmExpirer) from
// partition p's state.
func (rt *Runtime) applyLocalDeletes(p int32, warm WarmState) error {
	we, ok := warm.(WarmExpirer)
	if !ok {
		return nil
	}
	rs := we.LocalDeletes()
	if len(rs) == 0 {
		return nil
	}
	b := rt.store.newBatch()
	for _, r := range rs {
		b.deleteRange(p, r[0], r[1])
	}
	if err := b.commit(); err != nil {
		return fmt.Errorf("stream: partition %d: local deletes: %w", p, err)
	}
	return nil
}

// Warm returns the partition's warm structures handed over by its
// standby, kept in step with the restored state; nil when there are none
// (Open must build them from the state).
func (ps *PartitionState) Warm() WarmState { return ps.warm }

// standbyListInterval is how often a standby lists its changelog's end, to
// date its checkpoint and report its lag.
const standbyListInterval = time.Second

// standbyForceInterval is the least time between two rebalances a member
// asks for to take its deferred partitions and warm-up copies.
const standbyForceInterval = 10 * time.Second

// standbyForceMaxInterval bounds the interval between the rebalances a
// member asks for when they leave its numbers deferred (setPending): Kafka
// Streams' probing.rebalance.interval.ms default.
const standbyForceMaxInterval = 10 * time.Minute

// standbys runs the instance's standby tails.
type standbys struct {
	rt *Runtime

	client atomic.Pointer[kgo.Client] // the current session's, for ForceRebalance

	mu    sync.Mutex
	tails map[int32]*tail
	// stopping holds tails cancelled by a new assignment: those that may
	// still write (a restore or a new tail of the partition waits for
	// them), and those stopped because the assignment made this instance
	// the partition's owner (kept), which stay here once done until the
	// partition's restore takes their warm structures (take) or a later
	// assignment no longer gives the partition to this instance.
	stopping  map[int32]*tail
	deferred  []int32 // deferred and warm-up numbers: caught up, maybeForce asks for a rebalance
	lastForce time.Time
	// forced: the numbers the last rebalance this member asked for was
	// to take; forceEvery: the least time between two (zero:
	// standbyForceInterval), doubled by each such rebalance that left
	// one of them deferred (setPending).
	forced     []int32
	forceEvery time.Duration

	// ends lists the changelog's end for every tail at once
	// (standbylist.go).
	ends *endLister

	// held: the partitions the session's last assignment gave this
	// instance to own or copy; heldKnown: the session had one
	// (noteHeld; the state cleanup's sweep, cleanup.go).
	held      []int32
	heldKnown bool

	// placed, members: of the last assignment (StandbyAssignment);
	// placed is -1 until one said.
	placed, members atomic.Int64
	// short: the shortfall notePlaced last warned of, if shorted (the
	// last assignment that said placed fewer copies than asked for);
	// under mu.
	short   placement
	shorted bool

	m *standbyMetrics
}

type standbyMetrics struct {
	partitions prometheus.Gauge
	lag        *prometheus.GaugeVec
	// asked: --standby-replicas; placed: the copies per partition the
	// group's last assignment placed (absent when the leader did not
	// say).
	asked    prometheus.Gauge
	placed   *prometheus.GaugeVec
	records  prometheus.Counter
	busy     prometheus.Counter
	restarts prometheus.Counter
}

func newStandbyMetrics(reg prometheus.Registerer, stage string) *standbyMetrics {
	f := prom.NewFactory(prometheus.WrapRegistererWith(prometheus.Labels{"stage": stage}, reg))
	return &standbyMetrics{
		partitions: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_stream_standby_partitions",
			Help: "Partitions this instance keeps warm as a standby (tailing their changelogs)."}),
		lag: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_stream_standby_lag_records",
			Help: "Changelog offsets a standby copy is behind the changelog's end, per partition (read every second)."}, []string{"partition"}),
		asked: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_stream_standby_replicas_asked",
			Help: "Standby copies per partition this instance asks for (--standby-replicas)."}),
		placed: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_stream_standby_replicas_placed",
			Help: "Standby copies per partition the group's last assignment placed: the leader's --standby-replicas, capped at the group's members less one."}, nil),
		records: f.NewCounter(prometheus.CounterOpts{Name: "meterline_stream_standby_records_total",
			Help: "Changelog records applied to standby copies."}),
		busy: f.NewCounter(prometheus.CounterOpts{Name: "meterline_stream_standby_apply_seconds_total",
			Help: "Time standby tails spent applying polled changelog records (decoding excluded): divided by the records, the cost of a standby per record."}),
		restarts: f.NewCounter(prometheus.CounterOpts{Name: "meterline_stream_standby_tail_restarts_total",
			Help: "Standby tails that stopped on an error and were started again after a wait."}),
	}
}

// tail is one standby partition's tailing goroutine.
type tail struct {
	p      int32
	cancel context.CancelFunc
	done   chan struct{}
	// kept (under standbys.mu): stopped by a promotion, its warm
	// structures wait in stopping for the partition's restore.
	kept bool
	// Set before done is closed.
	warm WarmState
	err  error
	// Progress, for the status page.
	pos, end atomic.Int64
	// dated: the current copy reached the latest listing of the
	// changelog's end in time (it keeps up).
	dated atomic.Bool
}

func newStandbys(rt *Runtime) *standbys {
	sb := &standbys{rt: rt, tails: map[int32]*tail{}, stopping: map[int32]*tail{},
		ends: newEndLister(rt.cfg.ChangelogTopic, func() (*kgo.Client, error) { return rt.newClient() }, rt.cfg.Clock, rt.log),
		m:    newStandbyMetrics(rt.cfg.Registerer, rt.cfg.Stage)}
	sb.placed.Store(-1)
	return sb
}

// Balancer returns the runtime's group balancer: CopartitionStandbyBalancer
// over topics, with Config.StandbyReplicas, this instance's warm copies (the
// checkpoints in its store) and its standby tails.
func (rt *Runtime) Balancer(topics ...string) kgo.GroupBalancer {
	return CopartitionStandbyBalancer(StandbyOptions{
		Replicas:   rt.cfg.StandbyReplicas,
		MaxWarmups: rt.cfg.StandbyMaxWarmups,
		Warm:       rt.sb.warmCopies,
		Assigned:   rt.sb.assigned,
	}, topics...)
}

// setClient records the current session's client.
func (sb *standbys) setClient(cl *kgo.Client) { sb.client.Store(cl) }

// warmCopies lists the checkpoints in the store that are within the
// restore horizon, for the join metadata. A copy dated longer ago than the
// changelog's delete.retention.ms allows (an instance stopped for long, a
// standby stalled) is restored in full, like no copy: it is not
// advertised, so that the group's balancer does not prefer this member for
// the partition. A current copy keeps a recent date: a standby's tail
// dates it by its listings of the changelog's end, an owner re-dates the
// checkpoints of its partitions without input (redate.go). The horizon is
// judged with delete.retention.ms as last
// read (knownRetention; watchRetention reads it while the stage runs):
// the join does not wait for the broker. Unknown
// (never read), no copy is advertised, as every restore with a tail to
// replay would be a full one. An unreadable store advertises nothing: it
// costs only warmth.
func (sb *standbys) warmCopies() map[int32]int64 {
	cps, err := sb.rt.store.checkpoints()
	if err != nil {
		sb.rt.log.Warn("cannot list the local checkpoints for the group's balancer", zap.Error(err))
		return nil
	}
	retention, now := sb.rt.knownRetention(), sb.rt.cfg.Clock.Now()
	out := make(map[int32]int64, len(cps))
	var old []int32
	for p, cp := range cps {
		if withinHorizon(cp, now, retention) {
			out[p] = cp.Offset
		} else {
			old = append(old, p)
		}
	}
	if len(old) > 0 {
		slices.Sort(old)
		sb.rt.log.Info("not telling the group's balancer of local copies beyond the restore horizon: a restore from them starts over from the changelog's start",
			zap.Int32s("partitions", old), zap.Duration("delete_retention", retention))
	}
	return out
}

// assigned runs on kgo's group goroutine with each sync's standby
// assignment: it stops the tails no longer assigned and starts the new
// ones. It does not wait for a tail to stop: the restore of a partition
// waits for its tail (take). The restore runs only after the group's
// offsets are fetched, by which time the tail may have stopped already: a
// tail of a partition the assignment gives this instance to own is kept
// with its warm structures until the restore takes them, whichever of the
// two ends first. The leader's plan is followed whatever this instance's
// own Config.StandbyReplicas (0 included): a partition deferred to it as a
// standby would otherwise stay with its owner, over its quota, for as long
// as the group lasts (docs/operations.md, Standby replicas).
func (sb *standbys) assigned(a StandbyAssignment) {
	sb.rt.awaitOffsets(a.Owned)
	sb.noteHeld(a)
	sb.rt.revokeUnowned(a.Owned)
	// Warm structures kept at the revoke are for a partition given back
	// here; the others' go (keep.go).
	sb.rt.kept.retain(a.Owned)
	sb.rt.noteKept()
	sb.notePlaced(a)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.setPending(slices.Concat(a.Deferred, a.Warmup))
	// A tail kept for a restore that never took it (the partition moved
	// on first) is dropped once it no longer writes.
	for p, t := range sb.stopping {
		if t.kept && !slices.Contains(a.Owned, p) {
			t.kept = false
			select {
			case <-t.done:
				delete(sb.stopping, p)
			default: // it deletes itself when done
			}
		}
	}
	for p, t := range sb.tails {
		if !slices.Contains(a.Standby, p) {
			t.cancel()
			delete(sb.tails, p)
			t.kept = slices.Contains(a.Owned, p)
			sb.stopping[p] = t
			sb.m.lag.DeleteLabelValues(fmt.Sprint(p))
		}
	}
	for _, p := range a.Standby {
		if _, ok := sb.tails[p]; ok {
			continue
		}
		sb.start(p)
	}
	sb.m.partitions.Set(float64(len(sb.tails)))
	if len(a.Standby) > 0 || len(a.Deferred) > 0 || len(a.Warmup) > 0 {
		sb.rt.log.Info("standby assignment", zap.Int32s("standby", a.Standby), zap.Int32s("deferred", a.Deferred), zap.Int32s("warmup", a.Warmup))
	}
}

// placement is a shortfall of standby copies: the copies per partition
// an assignment placed, and the leader's --standby-replicas.
type placement struct{ placed, replicas int }

// notePlaced exports the standby copies asked for and placed by a new
// assignment, and warns when the group places fewer than this instance
// asks for (docs/operations.md, Standby replicas): fewer members than
// --standby-replicas+1, or a leader with a lower value. It warns when the
// shortfall begins or changes (placed, or the leader's value), not again
// on a rebalance that leaves it as it was, and says once when it ends. An
// assignment that does not say what it placed changes nothing.
func (sb *standbys) notePlaced(a StandbyAssignment) {
	asked := sb.rt.cfg.StandbyReplicas
	sb.m.asked.Set(float64(max(asked, 0)))
	sb.placed.Store(int64(a.Placed))
	sb.members.Store(int64(a.Members))
	if a.Placed < 0 {
		sb.m.placed.Reset()
		return
	}
	sb.m.placed.WithLabelValues().Set(float64(a.Placed))
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if a.Placed >= asked {
		if sb.shorted {
			sb.shorted = false
			sb.rt.log.Info("the group places the standby copies per partition --standby-replicas asks for",
				zap.Int("standby_replicas", asked), zap.Int("placed", a.Placed), zap.Int("members", a.Members))
		}
		return
	}
	now := placement{placed: a.Placed, replicas: a.Replicas}
	if sb.shorted && now == sb.short {
		return
	}
	sb.short, sb.shorted = now, true
	sb.rt.log.Warn("the group places fewer standby copies per partition than --standby-replicas asks for: a failover may find no warm copy",
		zap.Int("standby_replicas", asked), zap.Int("placed", a.Placed), zap.Int("members", a.Members),
		zap.Int("leader_standby_replicas", a.Replicas),
		zap.String("why", "each partition gets min(the leader's --standby-replicas, members less one) standby copies"))
}

// start starts partition p's tail; sb.mu is held.
func (sb *standbys) start(p int32) {
	ctx, cancel := context.WithCancel(context.Background())
	t := &tail{p: p, cancel: cancel, done: make(chan struct{})}
	t.pos.Store(-1)
	t.end.Store(-1)
	// The tail writes p's state, and not through what a revoked instance
	// of p kept (keep.go).
	sb.rt.kept.invalidate(p)
	sb.rt.noteKept()
	// A previous tail of p, stopped but not yet done, still writes: the
	// new one waits for it.
	prev := sb.stopping[p]
	sb.tails[p] = t
	sb.rt.restores.Add(1)
	go func() {
		defer sb.rt.restores.Done()
		defer close(t.done)
		if prev != nil {
			<-prev.done
		}
		// attempts: copies in a row that outlasted the horizon.
		attempts := 0
		defer sb.rt.noteHorizonAttempts(p, 0)
		// backoff: the wait before the tail starts again after an error
		// other than the horizon's (tailFailed).
		var backoff time.Duration
		for {
			began := time.Now()
			t.warm, t.err = sb.run(ctx, t)
			var he *horizonError
			if t.err == nil || ctx.Err() != nil {
				break
			}
			if !errors.As(t.err, &he) {
				backoff = sb.tailFailed(t, backoff, time.Since(began))
				select {
				case <-ctx.Done():
				case <-time.After(backoff):
				}
				if ctx.Err() != nil {
					break
				}
				continue
			}
			if t.dated.Swap(false) {
				attempts = 0 // it kept up for a while: a new series
			}
			attempts++
			sb.rt.noteHorizonAttempts(p, attempts)
			msg, needed := sb.rt.horizonAdvice(p, attempts, he)
			fields := []zap.Field{zap.Int32("partition", p), zap.Int("copies", attempts), zap.Duration("delete_retention_needed", needed), zap.Error(t.err)}
			if attempts < maxHorizonAttempts {
				// Its state stays at its last checkpoint, dated before:
				// the new copy's plan is a full one.
				sb.rt.log.Warn("standby tail read changelog records later than its checkpoint's date allows (it was paused, or could not keep up); copying the partition again from the changelog's start: "+msg, fields...)
				select {
				case <-ctx.Done():
				case <-time.After(standbyListInterval):
				}
				continue
			}
			// Starting over would repeat it for ever: the standby stops
			// copying until delete.retention.ms changes, or for
			// standbyHorizonRetry. Its state, dated before, is no warm
			// copy: a restore of the partition here would plan a full one,
			// at the pace that just failed. It is wiped, checkpoint and
			// all, so that the group's balancer is not told of a copy
			// (warmCopies) and hands the partition to a member that can
			// do better; the next copy starts from the log start anyway.
			// Nor is it catching up: its lag is not known (the status
			// page, the lag gauge), so that maybeForce does not take a
			// deferred partition for it.
			if err := sb.rt.store.wipe(p); err != nil {
				sb.rt.log.Warn("standby cannot wipe the copy it gave up; the group's balancer may still count it as warm", zap.Int32("partition", p), zap.Error(err))
			}
			t.end.Store(-1)
			sb.m.lag.DeleteLabelValues(fmt.Sprint(p))
			sb.rt.m.restoreHorizonExceeded.Inc()
			sb.rt.log.Error(fmt.Sprintf("standby stops copying the partition until the changelog's delete.retention.ms changes (or for %s): %s", standbyHorizonRetry, msg), fields...)
			if sb.waitRetention(ctx, he.retention) {
				attempts = 0
			}
			if ctx.Err() != nil {
				t.err = ctx.Err()
				break
			}
		}
		sb.stopped(t)
	}()
}

// Restarts of a standby tail that stopped on an error (tailFailed): after
// standbyRestartMin, doubled by each failure in a row up to
// standbyRestartMax; a tail that ran for standbyRestartMax starts a new
// series.
const (
	standbyRestartMin = time.Second
	standbyRestartMax = time.Minute
)

// tailFailed notes that tail t stopped on an error other than the
// horizon's after running for ran, and returns how long to wait before
// starting it again, given the previous wait. Until it copies again its
// copy is not known to be current: its lag is not known (the status page,
// the lag gauge) and maybeForce does not count it caught up.
func (sb *standbys) tailFailed(t *tail, backoff, ran time.Duration) time.Duration {
	if backoff == 0 || ran >= standbyRestartMax {
		backoff = standbyRestartMin
	} else {
		backoff = min(2*backoff, standbyRestartMax)
	}
	t.end.Store(-1)
	sb.m.lag.DeleteLabelValues(fmt.Sprint(t.p))
	sb.m.restarts.Inc()
	sb.rt.log.Warn("standby tail stopped; copying the partition again after a wait (a restore of it here meanwhile restores normally)",
		zap.Int32("partition", t.p), zap.Duration("restart_in", backoff), zap.Error(t.err))
	return backoff
}

// stopped forgets tail t, which no longer writes, unless it is kept for
// its partition's restore (take).
func (sb *standbys) stopped(t *tail) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.stopping[t.p] == t && !t.kept {
		delete(sb.stopping, t.p)
	}
}

// take stops partition p's tail, if any, waits until it no longer writes,
// and returns its warm structures when it stopped cleanly (nil otherwise),
// also when the tail had stopped before take was called. The restore of a
// partition this instance now owns calls it first, with its context: a
// restore whose context has ended (the partition was revoked, and may be
// a standby here again by now) takes nothing, and stops no tail.
func (sb *standbys) take(ctx context.Context, p int32) WarmState {
	sb.mu.Lock()
	if ctx.Err() != nil {
		// The revoke cancels the context before the next assignment
		// starts a tail (under mu), so a tail seen here is not this
		// restore's.
		sb.mu.Unlock()
		return nil
	}
	t, ok := sb.tails[p]
	if ok {
		delete(sb.tails, p)
		sb.m.partitions.Set(float64(len(sb.tails)))
	} else {
		t, ok = sb.stopping[p]
	}
	delete(sb.stopping, p)
	sb.mu.Unlock()
	sb.m.lag.DeleteLabelValues(fmt.Sprint(p))
	if !ok {
		return nil
	}
	t.cancel()
	<-t.done
	if t.err != nil && !errors.Is(t.err, context.Canceled) {
		return nil
	}
	return t.warm
}

// stopAll stops every tail (the stage stops).
func (sb *standbys) stopAll() {
	sb.mu.Lock()
	tails := make([]*tail, 0, len(sb.tails))
	for p, t := range sb.tails {
		tails = append(tails, t)
		delete(sb.tails, p)
	}
	for p, t := range sb.stopping {
		t.kept = false
		tails = append(tails, t)
		delete(sb.stopping, p)
	}
	sb.mu.Unlock()
	for _, t := range tails {
		t.cancel()
		<-t.done
	}
	if sb.ends != nil {
		sb.ends.stop()
	}
	sb.m.partitions.Set(0)
}

// run tails partition p's changelog into the store until ctx ends, and
// returns the warm structures, in step with the state written.
func (sb *standbys) run(ctx context.Context, t *tail) (WarmState, error) {
	rt, p := sb.rt, t.p
	log := rt.log.With(zap.Int32("partition", p), zap.Bool("standby", true))
	cl, err := rt.newClient()
	if err != nil {
		return nil, err
	}
	adm := kadm.NewClient(cl)
	defer cl.Close()
	if err := rt.checkChangelogID(ctx, cl, log); err != nil {
		return nil, err
	}

	cs, warm, err := sb.begin(ctx, p, cl, log)
	if err != nil {
		return nil, err
	}
	end, now := cs.end, cs.now

	c, err := rt.newChangelogCopy(p, "standby", cs.from, end, cs.lso, cs.at, warm)
	if err != nil {
		return nil, err
	}
	defer c.close()
	// retention is the changelog's delete.retention.ms, for the copy's
	// horizon checks (read again once the cache is stale).
	retention := func() time.Duration { return rt.deleteRetention(ctx, adm, log) }

	// targets: the ends listed (oldest first) the copy has not read up
	// to yet; reaching one dates the checkpoint by its listing.
	targets := &listedTargets{}
	targets.add(listedEnd{end: end, at: now})
	// redate dates the copy by the latest listing whose end it has read
	// up to: not only the latest listing, which a copy that reads the
	// owner's transactions a listing interval or more after they
	// commit would never reach (the next transaction is open by then).
	redate := func() error {
		l, ok := targets.reached(c.pos)
		if !ok {
			return nil
		}
		was := c.at
		if err := c.redate(l.at, retention()); err != nil {
			return err
		}
		// A copy that reached the latest listing keeps up: this copy
		// fits. One that dates itself by older listings only may be
		// falling behind, and its copies in a row that outlast the
		// horizon go on counting.
		if c.at != was && len(targets.ls) == 0 && !t.dated.Swap(true) {
			rt.noteHorizonAttempts(p, 0)
		}
		return nil
	}

	t.pos.Store(c.pos)
	// written: the date of the checkpoint last written.
	written := c.at
	if err := redate(); err != nil {
		return nil, err
	}
	t.end.Store(end)
	lagGauge := sb.lagGauge(t)
	lagGauge.Set(float64(end - c.pos))
	// The changelog's end comes every standbyListInterval from the
	// listing the runtime's tails share (standbylist.go).
	ends := sb.ends.subscribe(p)
	defer sb.ends.unsubscribe(ends)
	for {
		fs, err := c.fetch(ctx, standbyListInterval, ends.ready)
		if ctx.Err() != nil {
			return warm, ctx.Err()
		}
		if err != nil {
			return nil, err
		}
		start := time.Now()
		n := c.add(fs, -1)
		if err := redate(); err != nil {
			return nil, err
		}
		if n > 0 || c.pos != t.pos.Load() {
			if err := c.commit(retention()); err != nil {
				return nil, err
			}
			written = c.at
			sb.m.records.Add(float64(n))
			sb.m.busy.Add(time.Since(start).Seconds())
		}
		t.pos.Store(c.pos)
		if l, ok := ends.take(); ok {
			e := l.end
			targets.add(l)
			c.listed(e)
			if err := redate(); err != nil {
				return nil, err
			}
			// A copy that read nothing new (the changelog is idle)
			// writes its new date now and then all the same: the
			// stored checkpoint is what warmCopies advertises and a
			// restore plans from, and left at the date of its last
			// record an idle copy, current, would fall outside the
			// restore horizon. Once per margin of the horizon, so
			// that the stored date is never more than that behind.
			if d := retention(); d > 0 && c.at.Sub(written) >= d/restoreMarginDivisor {
				if err := c.commit(d); err != nil {
					return nil, err
				}
				written = c.at
			}
			t.end.Store(e)
			lagGauge.Set(float64(max(e-c.pos, 0)))
			sb.maybeForce()
		}
	}
}

// maxListedTargets bounds the listings a standby tail keeps until it
// reads up to their ends: one a second while it catches up.
const maxListedTargets = 64

// listedTargets are the ends of the changelog listed for a standby tail
// that it has not read up to yet, oldest first (an end only grows).
type listedTargets struct{ ls []listedEnd }

// add appends listing l. Past maxListedTargets every second one is
// dropped, the oldest and the latest kept: a copy far behind still dates
// itself by listings spread over the time it catches up.
func (ts *listedTargets) add(l listedEnd) {
	if len(ts.ls) >= maxListedTargets {
		kept := ts.ls[:0]
		for i, x := range ts.ls {
			if i%2 == 0 || i == len(ts.ls)-1 {
				kept = append(kept, x)
			}
		}
		ts.ls = kept
	}
	ts.ls = append(ts.ls, l)
}

// reached returns the latest listing whose end is at or below pos, and
// forgets it and those before it.
func (ts *listedTargets) reached(pos int64) (listedEnd, bool) {
	i := 0
	for i < len(ts.ls) && ts.ls[i].end <= pos {
		i++
	}
	if i == 0 {
		return listedEnd{}, false
	}
	l := ts.ls[i-1]
	ts.ls = ts.ls[i:]
	return l, true
}

// lagGauge returns tail t's series of the lag gauge, exported only while
// t is its partition's current tail: a tail stopped (a promotion, a new
// assignment) while it planned or built its warm structures, whose
// series was deleted then, must not export it again, for a copy that no
// longer exists. Those who stop a tail take it out of tails under mu
// before they delete its series.
func (sb *standbys) lagGauge(t *tail) prometheus.Gauge {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.tails[t.p] != t {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: "meterline_stream_standby_lag_records"})
	}
	return sb.m.lag.WithLabelValues(fmt.Sprint(t.p))
}

// waitRetention waits, once a standby gave up copying partition p's
// changelog for the horizon, until the changelog's delete.retention.ms
// differs from retention (the value the copies were refused under),
// standbyHorizonRetry passes, or ctx ends. It reports whether the
// retention changed.
func (sb *standbys) waitRetention(ctx context.Context, retention time.Duration) bool {
	rt := sb.rt
	retry := time.NewTimer(standbyHorizonRetry)
	defer retry.Stop()
	poll := time.NewTicker(standbyRetentionPoll)
	defer poll.Stop()
	cl, err := rt.newClient()
	if err != nil {
		rt.log.Warn("standby cannot watch the changelog's delete.retention.ms", zap.Error(err))
	} else {
		defer cl.Close()
	}
	for {
		select {
		case <-ctx.Done():
			return false
		case <-retry.C:
			return false
		case <-poll.C:
			if cl == nil {
				continue
			}
			if d := rt.deleteRetention(ctx, kadm.NewClient(cl), rt.log); d > 0 && d != retention {
				rt.log.Info("the changelog's delete.retention.ms changed: standby copies again", zap.Duration("delete_retention", d), zap.Duration("was", retention))
				return true
			}
		}
	}
}

// setPending records the deferred and warm-up numbers of a new
// assignment; sb.mu is held.
//
// The member judges its copies caught up by the changelog's end, the
// leader by the owner's checkpoint as of the owner's join, which the
// owner writes until it hears of the rebalance: on a busy changelog the
// leader may find the copy behind each time, and a member that asked
// again every standbyForceInterval would stop the whole group that often
// for as long as the load lasts. Each rebalance it asked for that leaves
// one of those numbers deferred doubles the interval, up to
// standbyForceMaxInterval; one that takes them all resets it.
func (sb *standbys) setPending(ps []int32) {
	if len(sb.forced) > 0 {
		if slices.ContainsFunc(sb.forced, func(p int32) bool { return slices.Contains(ps, p) }) {
			sb.forceEvery = min(2*max(sb.forceEvery, standbyForceInterval), standbyForceMaxInterval)
			sb.rt.log.Warn("the rebalance this instance asked for left partitions deferred (the group's leader found their copies behind the owner's): asking again later",
				zap.Int32s("deferred", ps), zap.Duration("next_in", sb.forceEvery))
		} else {
			sb.forceEvery = 0
		}
		sb.forced = nil
	}
	sb.deferred = ps
}

// maybeForce asks for a rebalance when every deferred partition's and
// warm-up copy's copy is caught up (within DefaultAcceptableLag of the
// changelog's end), so that this member takes them (the partitions, the
// standby copies); at most once per standbyForceInterval, or longer after
// rebalances that left them deferred (setPending).
func (sb *standbys) maybeForce() {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if len(sb.deferred) == 0 || time.Since(sb.lastForce) < max(sb.forceEvery, standbyForceInterval) {
		return
	}
	for _, p := range sb.deferred {
		t, ok := sb.tails[p]
		if !ok {
			return
		}
		pos, end := t.pos.Load(), t.end.Load()
		if pos < 0 || end < 0 || end-pos > DefaultAcceptableLag {
			return
		}
	}
	cl := sb.client.Load()
	if cl == nil {
		return
	}
	sb.lastForce = time.Now()
	sb.rt.log.Info("standby copies of deferred partitions (and warm-up copies) caught up: asking for a rebalance to take them", zap.Int32s("deferred", sb.deferred))
	sb.forced, sb.deferred = sb.deferred, nil
	cl.ForceRebalance()
}

// StandbyPlacement returns the standby copies per partition this
// instance asks for (Config.StandbyReplicas), those the group's last
// assignment placed (negative while not known) and the group's member
// count.
func (rt *Runtime) StandbyPlacement() (asked, placed, members int) {
	return rt.cfg.StandbyReplicas, int(rt.sb.placed.Load()), int(rt.sb.members.Load())
}

// EachStandbyStatus calls fn for every partition this instance keeps warm
// as a standby, in partition order: the changelog offset its copy reflects
// and how far behind the changelog's end it is (negative when not known
// yet). fn runs after the runtime's locks are released.
func (rt *Runtime) EachStandbyStatus(fn func(p int32, offset, lag int64)) {
	type st struct{ p, off, lag int64 }
	rt.sb.mu.Lock()
	out := make([]st, 0, len(rt.sb.tails))
	for p, t := range rt.sb.tails {
		pos, end := t.pos.Load(), t.end.Load()
		lag := int64(-1)
		if pos >= 0 && end >= 0 {
			lag = max(end-pos, 0)
		}
		out = append(out, st{int64(p), pos, lag})
	}
	rt.sb.mu.Unlock()
	slices.SortFunc(out, func(a, b st) int { return int(a.p - b.p) })
	for _, s := range out {
		fn(int32(s.p), s.off, s.lag)
	}
}

// checkpoints returns every partition's checkpoint in the store.
func (s *Store) checkpoints() (map[int32]Checkpoint, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixCheckpoint}, UpperBound: []byte{prefixCheckpoint + 1}})
	if err != nil {
		return nil, err
	}
	out := map[int32]Checkpoint{}
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return nil, err
		}
		if len(k) != 3 {
			continue
		}
		if cp, err := decodeCheckpoint(v); err == nil {
			out[int32(k[1])<<8|int32(k[2])] = cp
		}
	}
	return out, it.Close()
}

// revokeUnowned revokes every partition the runtime still holds that the
// new assignment does not give it. kgo's GroupTransactSession passes on
// only the first revoke after a transaction ended: an idle instance that
// goes through two rebalances without a transaction in between never
// hears of the second one, and would keep a partition it no longer owns
// (its punctuation and work would then go on in another member's
// partition). The assignment is authoritative: what it lacks is revoked
// here, before the new session's partitions are restored.
func (rt *Runtime) revokeUnowned(owned []int32) {
	rt.mu.Lock()
	var gone []int32
	for p := range rt.parts {
		if !slices.Contains(owned, p) {
			gone = append(gone, p)
		}
	}
	rt.mu.Unlock()
	if len(gone) == 0 {
		return
	}
	slices.Sort(gone)
	rt.log.Info("revoking partitions the new assignment does not give this instance (their revoke was not passed on)", zap.Int32s("partitions", gone))
	rt.onRevoked(context.Background(), nil, map[string][]int32{rt.cfg.InputTopic: gone})
}

// begin plans partition p's tail as a restore plans (planCopy;
// docs/design.md, Exactly-once, 4: from the checkpoint while within the
// horizon, otherwise from the log start on wiped state) and builds the
// processor's warm structures from the state (nil when it keeps none).
func (sb *standbys) begin(ctx context.Context, p int32, cl *kgo.Client, log *zap.Logger) (copyStart, WarmState, error) {
	rt := sb.rt
	cp, has, err := rt.store.Checkpoint(p)
	if err != nil {
		return copyStart{}, nil, fmt.Errorf("stream: standby partition %d: read checkpoint: %w", p, err)
	}
	cs, err := rt.planCopy(ctx, cl, log, p, "standby", cp, has)
	if err != nil {
		return copyStart{}, nil, err
	}
	plan := cs.plan
	if plan.Full {
		if err := rt.store.wipe(p); err != nil {
			return copyStart{}, nil, fmt.Errorf("stream: standby partition %d: wipe state: %w", p, err)
		}
	}
	var warm WarmState
	if w, ok := rt.proc.(Warmer); ok {
		if warm, err = w.Warm(p, &PartitionState{s: rt.store, p: p}); err != nil {
			return copyStart{}, nil, fmt.Errorf("stream: standby partition %d: %w", p, err)
		}
	}
	log.Info("standby tailing the changelog", zap.String("kind", plan.Kind()), zap.String("reason", plan.Reason),
		zap.Int64("from", cs.from), zap.Int64("changelog_end", cs.end))

	if plan.Full {
		// The copy exists from now on, for the group's balancer: empty
		// state that reflects the changelog below from.
		b := rt.store.newBatch()
		b.checkpoint(p, Checkpoint{Offset: cs.from, At: cs.at})
		if err := b.commit(); err != nil {
			return copyStart{}, nil, fmt.Errorf("stream: standby partition %d: write state: %w", p, err)
		}
	}
	return cs, warm, nil
}
