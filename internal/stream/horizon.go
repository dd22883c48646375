package stream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/topics"
)

// The restore horizon (docs/design.md, Exactly-once, 4).
//
// Compaction removes a tombstone once it is older than the changelog's
// delete.retention.ms: Kafka dates a tombstone when the cleaner first cleans
// it (never before it was appended) and drops it at a later cleaning past
// that date + delete.retention.ms. A replay from an old checkpoint can then
// miss the delete, and the state keeps a key that the changelog (and every
// other instance) no longer has: the aggregator would finalize an aggregate
// a second time, with an older value.
//
// So every checkpoint is dated (Checkpoint.At) and a restore replays only
// the tail when
//
//	now − Checkpoint.At + tail estimate + margin < delete.retention.ms
//
// and otherwise wipes the partition's state and replays the changelog from
// its start, whoever wrote the tail. The times are this instance's wall
// clock (Config.Clock) on both sides of the subtraction: the horizon is a
// broker-side wall-clock duration, not a billing decision, and the date is
// taken before the records it covers were produced, so a record's own
// (producer-set) timestamp is not needed. A full restore that is expected
// to take more than half of delete.retention.ms could itself miss deletes:
// it is refused (ErrRestoreHorizon), and the risk is reported whenever a
// restore sees it.

// Reasons of a restore, as the meterline_stream_restores_total metric, the
// logs and the status page name them.
const (
	// Full restores.
	reasonNoState          = "no_state"           // the partition has no local state
	reasonBelowLogStart    = "below_log_start"    // retention removed changelog records past the checkpoint
	reasonRetentionUnknown = "retention_unknown"  // delete.retention.ms could not be read
	reasonUndated          = "undated_checkpoint" // a checkpoint written before checkpoints were dated
	reasonFutureCheckpoint = "checkpoint_in_future"
	reasonHorizon          = "horizon" // the tail may have lost tombstones to compaction
	// Tail restores.
	reasonCurrent       = "current"        // nothing was written past the checkpoint
	reasonWithinHorizon = "within_horizon" // every tombstone past the checkpoint is still there
)

// Restore planning parameters.
const (
	// restoreMarginDivisor: the margin is delete.retention.ms divided by
	// this. It absorbs the restore estimate's error and clock steps.
	restoreMarginDivisor = 10
	// defaultRestoreRate is the restore throughput (changelog records/s)
	// assumed until one is measured: well below what a replay reads on a
	// small machine (meterline_stream_restore_rate_records_per_second shows
	// the estimate in use).
	defaultRestoreRate = 20_000
	// minRateSample: replays shorter than this many records do not update
	// the throughput estimate (their fixed costs dominate).
	minRateSample = 10_000
	// retentionTTL is how long a delete.retention.ms read from the broker is
	// used before it is read again.
	retentionTTL = 30 * time.Second
)

// ErrRestoreHorizon is returned (wrapped) when a partition needs a full
// restore that is not expected to finish well inside (within half of) the
// changelog's delete.retention.ms, or when maxHorizonAttempts replays of
// the partition in a row did not finish inside its horizon: compaction
// could remove tombstones while it replays, and the state would keep
// deleted keys. Raise the topic's delete.retention.ms (the error names the
// value).
var ErrRestoreHorizon = errors.New("a full restore would not finish well inside the changelog's delete.retention.ms")

// Copies that outlast the horizon. A copy that reads a record later than
// its date's horizon allows starts over (changelogCopy); one whose every
// attempt takes longer than the horizon (a big changelog, a slow disk, a
// low delete.retention.ms) would start over for ever, never correct:
// compaction removes a tombstone together with the values it deleted, so
// what such a copy missed leaves no record to read again, and only a copy
// read inside the horizon can be trusted. So the attempts are bounded.
const (
	// maxHorizonAttempts is how many copies of a partition in a row (a
	// restore's replays, a standby's copies) may outlast the horizon
	// before the copy is given up: one is a pause, several in a row are a
	// copy that does not fit the horizon. A restore is then refused
	// (ErrRestoreHorizon); a standby stops copying.
	maxHorizonAttempts = 3
	// A standby that gave up copies again once the changelog's
	// delete.retention.ms changes (looked at every standbyRetentionPoll,
	// read from the broker every retentionTTL), or after
	// standbyHorizonRetry.
	standbyRetentionPoll = 5 * time.Second
	standbyHorizonRetry  = 30 * time.Minute
)

// retentionFor returns the delete.retention.ms under which a full copy that
// takes d is planned (at most half of it, planRestore) and so fits the
// horizon, with the margin of the current retention.
func retentionFor(d, retention time.Duration) time.Duration {
	d = min(d, time.Duration(math.MaxInt64/4))
	return (2*d + retention/restoreMarginDivisor).Round(time.Second) + time.Second
}

// horizonAdvice explains n copies in a row of partition p that outlasted
// the horizon, the last one refused with e, and says what to change. needed
// is the delete.retention.ms a full copy at e's pace fits; zero when none
// does (the copy read nothing, or did not gain on the changelog's end).
func (rt *Runtime) horizonAdvice(p int32, n int, e *horizonError) (msg string, needed time.Duration) {
	copies := "copies in a row"
	if n == 1 {
		copies = "copy"
	}
	stalled := ""
	if e.pace.Stalled > 0 {
		stalled = fmt.Sprintf(" (%s of it waiting, not reading: at the changelog's last stable offset for an open transaction's outcome, or for brokers that did not answer)", e.pace.Stalled.Round(time.Millisecond))
	}
	msg = fmt.Sprintf("%d %s of changelog %s partition %d outlasted the restore horizon (nine tenths of delete.retention.ms %s): the last read %d offsets in %s%s, and was %d offsets short of the changelog's end, which moved %d offsets meanwhile",
		n, copies, rt.cfg.ChangelogTopic, p, e.retention, e.pace.Read, e.pace.Elapsed.Round(time.Millisecond), stalled, max(e.pace.Left, 0), e.pace.Grown)
	const openTxn = "a previous owner's open transaction holds the changelog at its last stable offset until it commits, aborts or times out (transaction.timeout.ms)"
	d, ok := e.pace.projected()
	switch {
	case e.pace.Read <= 0:
		return msg + ": its reads stall (" + openTxn + ", or the brokers do not answer), and no delete.retention.ms helps until they read", 0
	case !ok && e.pace.Stalled > 0 && e.pace.reading() <= 0:
		return msg + ": it spent the time waiting (" + openTxn + ", or the brokers do not answer), and no delete.retention.ms helps until the wait ends", 0
	case !ok:
		return msg + ": the changelog grows faster than the copy reads it, and no delete.retention.ms is enough; give the instance more read throughput (disk, CPU, network)", 0
	}
	needed = retentionFor(d, e.retention)
	if e.pace.Stalled > 0 && needed <= e.retention {
		// Reading, the copy fits: the wait made it outlast the horizon.
		return msg + fmt.Sprintf(": without the wait the copy takes %s to the end, which delete.retention.ms fits, and a copy fits once the wait ends (%s, or the brokers do not answer)",
			d.Round(time.Millisecond), openTxn), 0
	}
	return msg + fmt.Sprintf(": at that pace the copy takes %s to the end; raise delete.retention.ms of %s to at least %s",
		d.Round(time.Second), rt.cfg.ChangelogTopic, needed), needed
}

// Partition p's meterline_stream_horizon_attempts belongs to the writer
// that plans p's copies: the restore of p's current epoch (rt.parts)
// while p is held, its standby tail otherwise. A restore abandoned by a
// revoke or a new assignment of p may still be inside a fetch when a
// newer restore or a standby tail of p begins: it writes the gauge only
// while it owns p (noteRestoreHorizon), and the revoke that ends its
// ownership ends its export (forgetHorizonAttempts). A tail writes it
// unchecked: it begins only once p is not held (revokeUnowned precedes
// it), after the previous tail of p ended, and every newer writer of p
// waits for it to end (a new tail, a restore's take), its last write, a
// deletion, included.

// noteHorizonAttempts exports n, the copies of partition p in a row that
// outlasted the horizon (n = 0: a copy fitted, the series goes). Standby
// tails call it; restores call noteRestoreHorizon.
func (rt *Runtime) noteHorizonAttempts(p int32, n int) {
	if n == 0 {
		rt.m.horizonAttempts.DeleteLabelValues(fmt.Sprint(p))
		return
	}
	rt.m.horizonAttempts.WithLabelValues(fmt.Sprint(p)).Set(float64(n))
}

// noteRestoreHorizon exports n as noteHorizonAttempts does for the restore
// of partition p of epoch epoch, if p is held by that epoch: otherwise
// the restore was abandoned, and p's gauge is a newer restore's or a
// standby's.
func (rt *Runtime) noteRestoreHorizon(p int32, epoch uint64, n int) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if ps, ok := rt.parts[p]; ok && ps.epoch == epoch {
		rt.noteHorizonAttempts(p, n)
	}
}

// forgetHorizonAttempts ends the export of partition p's copies in a row
// that outlasted the horizon when the restore that exported them loses p
// (revoked, or assigned anew). Called with rt.mu held.
func (rt *Runtime) forgetHorizonAttempts(p int32) {
	rt.m.horizonAttempts.DeleteLabelValues(fmt.Sprint(p))
}

// restoreInput is what a restore plan is decided from.
type restoreInput struct {
	Now        time.Time
	Checkpoint Checkpoint
	HasState   bool
	// LogStart and End are the changelog partition's log start offset and
	// high watermark.
	LogStart, End int64
	// Retention is the changelog's delete.retention.ms; zero when unknown.
	Retention time.Duration
	// Rate is the restore throughput estimate, in records/s.
	Rate float64
}

// restorePlan is how a partition is restored, and why.
type restorePlan struct {
	Full   bool
	Reason string
	// Age is how old the checkpoint is (zero without a date).
	Age    time.Duration
	Margin time.Duration
	// TailEstimate and FullEstimate are the expected durations of a replay
	// from the checkpoint and from the log start: offsets to read (an upper
	// bound on the records left by compaction) at the estimated rate.
	TailEstimate, FullEstimate time.Duration
	// FullFits reports whether a full restore is expected to take at most
	// half of delete.retention.ms; false when the retention is unknown.
	FullFits bool
}

// Kind is "full" or "tail".
func (p restorePlan) Kind() string {
	if p.Full {
		return "full"
	}
	return "tail"
}

// planRestore decides between a tail and a full restore (docs/design.md,
// Exactly-once, 4).
func planRestore(in restoreInput) restorePlan {
	rate := in.Rate
	if !(rate > 0) || math.IsInf(rate, 0) {
		rate = defaultRestoreRate
	}
	est := func(records int64) time.Duration {
		if records <= 0 {
			return 0
		}
		s := float64(records) / rate
		if s >= float64(math.MaxInt64/int64(time.Second)) {
			return time.Duration(math.MaxInt64)
		}
		return time.Duration(s * float64(time.Second))
	}
	pl := restorePlan{FullEstimate: est(in.End - in.LogStart), Margin: in.Retention / restoreMarginDivisor}
	pl.FullFits = in.Retention > 0 && pl.FullEstimate <= in.Retention/2
	full := func(reason string) restorePlan { pl.Full, pl.Reason = true, reason; return pl }
	if !in.HasState {
		return full(reasonNoState)
	}
	cp := in.Checkpoint
	pl.TailEstimate = est(in.End - cp.Offset)
	if !cp.At.IsZero() {
		pl.Age = in.Now.Sub(cp.At)
	}
	switch {
	case cp.Offset < in.LogStart:
		return full(reasonBelowLogStart)
	case cp.Offset >= in.End:
		// Nothing was appended past the checkpoint when End was read:
		// nothing can have been missed, however old the state.
		pl.Reason = reasonCurrent
		return pl
	case in.Retention <= 0:
		return full(reasonRetentionUnknown)
	case cp.At.IsZero():
		return full(reasonUndated)
	case pl.Age < -pl.Margin:
		// Dated in the future beyond the margin: this clock stepped back,
		// or the state came from another machine. The age is not known.
		return full(reasonFutureCheckpoint)
	}
	age := max(pl.Age, 0)
	if pl.TailEstimate >= in.Retention || age+pl.TailEstimate+pl.Margin >= in.Retention {
		return full(reasonHorizon)
	}
	pl.Reason = reasonWithinHorizon
	return pl
}

// restoreHorizon is the runtime's restore-planning state, shared by the
// restore goroutines. The zero value is ready to use.
type restoreHorizon struct {
	// cfgMu guards the cached delete.retention.ms; it is held while the
	// config is read, so concurrent restores read it once.
	cfgMu           sync.Mutex
	retention       time.Duration // zero: unknown
	retentionReadAt time.Time
	// known is the last delete.retention.ms read (ns; zero: none yet),
	// for warmCopies, which must not wait on cfgMu (held during a read).
	known atomic.Int64

	mu   sync.Mutex
	rate float64 // records/s; zero: not loaded yet
	last map[int32]restorePlan
}

// deleteRetention returns the changelog topic's delete.retention.ms, read
// with kadm and cached for retentionTTL; zero when it cannot be read (then
// every restore with a tail to replay is a full one).
func (rt *Runtime) deleteRetention(ctx context.Context, adm *kadm.Client, log *zap.Logger) time.Duration {
	h := &rt.horizon
	h.cfgMu.Lock()
	defer h.cfgMu.Unlock()
	now := rt.cfg.Clock.Now()
	if age := now.Sub(h.retentionReadAt); !h.retentionReadAt.IsZero() && age >= 0 && age < retentionTTL {
		return h.retention
	}
	var d time.Duration
	var err error
	for attempt := 0; ; attempt++ {
		d, err = readDeleteRetention(ctx, adm, rt.cfg.ChangelogTopic)
		if err == nil || !kerr.IsRetriable(err) || attempt >= 20 || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0
		}
		log.Warn("cannot read the changelog's delete.retention.ms: restoring partitions in full (grant DescribeConfigs on the topic)",
			zap.String("changelog", rt.cfg.ChangelogTopic), zap.Error(err))
	}
	if err == nil {
		rt.knowRetention(d, log)
	}
	h.retention, h.retentionReadAt = d, now
	return d
}

// knowRetention records d, read from the broker, as the changelog's
// delete.retention.ms known to warmCopies, persisted when it changed.
func (rt *Runtime) knowRetention(d time.Duration, log *zap.Logger) {
	if d > 0 && time.Duration(rt.horizon.known.Swap(int64(d))) != d {
		if err := rt.store.SetRetention(d); err != nil {
			log.Warn("cannot persist the changelog's delete.retention.ms", zap.Error(err))
		}
	}
}

// startWatchRetention runs watchRetention until ctx ends or the returned
// function is called, which returns once it stopped.
func (rt *Runtime) startWatchRetention(ctx context.Context, adm *kadm.Client) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rt.watchRetention(ctx, adm)
	}()
	return func() {
		cancel()
		<-done
	}
}

// watchRetention reads the changelog's delete.retention.ms every
// standbyRetentionPoll, from the broker once the cached value is older
// than retentionTTL, until ctx ends. Restores and standby tails read it
// when they need it; this keeps the value warmCopies judges the join
// metadata with as current for an instance that restores nothing and
// tails nothing (it owns its partitions): lowered on the broker, the value
// its last restore read would keep advertising copies past the new
// horizon. A failed read changes nothing and is not logged here: the
// restores that need the value log it (deleteRetention).
func (rt *Runtime) watchRetention(ctx context.Context, adm *kadm.Client) {
	h := &rt.horizon
	poll := time.NewTicker(standbyRetentionPoll)
	defer poll.Stop()
	for {
		h.cfgMu.Lock()
		now := rt.cfg.Clock.Now()
		if age := now.Sub(h.retentionReadAt); h.retentionReadAt.IsZero() || age < 0 || age >= retentionTTL {
			rctx, cancel := context.WithTimeout(ctx, standbyRetentionPoll)
			d, err := readDeleteRetention(rctx, adm, rt.cfg.ChangelogTopic)
			cancel()
			if err == nil {
				rt.knowRetention(d, rt.log)
				h.retention, h.retentionReadAt = d, now
			} else {
				rt.log.Debug("cannot read the changelog's delete.retention.ms", zap.Error(err))
			}
		}
		h.cfgMu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		}
	}
}

// knownRetention returns the changelog's delete.retention.ms as last read,
// by this process or, until it reads it, by an earlier one (persisted);
// zero when it was never read. It does not wait for the broker.
func (rt *Runtime) knownRetention() time.Duration {
	h := &rt.horizon
	if d := h.known.Load(); d > 0 {
		return time.Duration(d)
	}
	d, ok, err := rt.store.Retention()
	if err != nil || !ok {
		return 0
	}
	h.known.CompareAndSwap(0, int64(d))
	return time.Duration(h.known.Load())
}

// withinHorizon reports whether a restore from checkpoint cp would replay
// only its tail if it had one (planRestore, with a tail of one offset):
// the copy is dated, and its horizon, under delete.retention.ms retention,
// has not passed at now. A copy older than that is restored in full.
func withinHorizon(cp Checkpoint, now time.Time, retention time.Duration) bool {
	return !planRestore(restoreInput{Now: now, Checkpoint: cp, HasState: true, End: cp.Offset + 1, Retention: retention}).Full
}

func readDeleteRetention(ctx context.Context, adm *kadm.Client, topic string) (time.Duration, error) {
	v, err := topics.ConfigValue(ctx, adm, topic, "delete.retention.ms")
	if err != nil {
		return 0, fmt.Errorf("stream: changelog %s: %w", topic, err)
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 {
		return 0, fmt.Errorf("stream: changelog %s: delete.retention.ms %q is not a duration in ms", topic, v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// restoreRate returns the restore throughput estimate (records/s): the
// persisted one, or defaultRestoreRate.
func (rt *Runtime) restoreRate() float64 {
	h := &rt.horizon
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rate == 0 {
		h.rate = defaultRestoreRate
		if r, ok, err := rt.store.RestoreRate(); err == nil && ok {
			h.rate = r
		}
		rt.m.restoreRate.Set(h.rate)
	}
	return h.rate
}

// observeRestore folds a measured replay into the throughput estimate and
// persists it. The estimate stays conservative: a slower replay lowers it
// at once, a faster one raises it by a quarter of the difference. Replays
// of fewer than minRateSample records are not measured.
func (rt *Runtime) observeRestore(records int64, took time.Duration) {
	if records < minRateSample || took <= 0 {
		return
	}
	sample := float64(records) / took.Seconds()
	cur := rt.restoreRate()
	h := &rt.horizon
	h.mu.Lock()
	next := cur
	if sample < cur {
		next = sample
	} else {
		next = cur + (sample-cur)/4
	}
	h.rate = next
	h.mu.Unlock()
	rt.m.restoreRate.Set(next)
	if err := rt.store.SetRestoreRate(next); err != nil {
		rt.log.Warn("cannot persist the restore rate estimate", zap.Error(err))
	}
}

// noteRestore records a partition's restore plan for the status page and
// counts it.
func (rt *Runtime) noteRestore(p int32, pl restorePlan) {
	rt.m.restores.WithLabelValues(pl.Kind(), pl.Reason).Inc()
	h := &rt.horizon
	h.mu.Lock()
	if h.last == nil {
		h.last = map[int32]restorePlan{}
	}
	h.last[p] = pl
	h.mu.Unlock()
}

// lastRestore returns the plan of partition p's last restore.
func (rt *Runtime) lastRestore(p int32) (restorePlan, bool) {
	h := &rt.horizon
	h.mu.Lock()
	defer h.mu.Unlock()
	pl, ok := h.last[p]
	return pl, ok
}
