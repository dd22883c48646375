package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/fault"
)

// restoreBatch is how many changelog records go into one Pebble batch
// during a restore; each batch also moves the checkpoint, so a crash in the
// middle of a restore resumes from where it got to.
const restoreBatch = 5000

// restore rebuilds partition p's state from the changelog, checks it
// against the group's committed offset, lists the start offset of each
// input topic in fromStart (those the group has no committed offset of,
// read from their start), opens the processor's partition and resumes
// fetching. It runs on its own goroutine while p is paused, so a long
// restore never holds up the rebalance.
func (rt *Runtime) restore(ctx context.Context, sess *kgo.GroupTransactSession, p int32, epoch uint64, committed map[string]int64, fromStart []string) {
	start := time.Now()
	log := rt.log.With(zap.Int32("partition", p))
	part, starts, replayed, err := rt.restorePartition(ctx, sess.Client(), log, p, epoch, committed, fromStart)
	if err != nil {
		if ctx.Err() != nil {
			log.Info("restore abandoned: partition revoked")
			// The revocation set the gauge to 0, but this goroutine may
			// have set it again before it saw the cancellation; a newer
			// restore of p (another epoch) owns it.
			rt.mu.Lock()
			if ps, ok := rt.parts[p]; !ok || ps.epoch == epoch {
				rt.m.restoring.WithLabelValues(fmt.Sprint(p)).Set(0)
			}
			rt.mu.Unlock()
			return
		}
		rt.setFatal(err)
		return
	}
	rt.m.restoreSeconds.Observe(time.Since(start).Seconds())
	fields := []zap.Field{zap.Int64("changelog_records", replayed), zap.Duration("took", time.Since(start)),
		zap.Any("committed_offsets", committed)}
	if len(starts) > 0 {
		fields = append(fields, zap.Any("start_offsets", starts))
	}
	log.Info("partition restored", fields...)
	rt.mu.Lock()
	ps, ok := rt.parts[p]
	if !ok || ps.epoch != epoch {
		rt.mu.Unlock()
		part.Close()
		return
	}
	ps.cancel = nil
	rt.events = append(rt.events, event{kind: evRestored, p: p, epoch: epoch, part: part, start: starts})
	// Queue the install before resuming: the run loop handles events
	// before it processes the records of a poll. Resume under mu, as
	// adjustOffsets pauses: a partition assigned anew once this restore
	// checked its epoch is paused after this resume, and stays paused
	// until its new restore ends (its records, polled before its new
	// instance is installed, would abort every transaction meanwhile).
	resume := map[string][]int32{}
	for _, t := range rt.cfg.inputs() {
		resume[t] = []int32{p}
	}
	if h := rt.restoredHook.Load(); h != nil {
		(*h)(p)
	}
	sess.Client().ResumeFetchPartitions(resume)
	rt.mu.Unlock()
	rt.notify()
}

func (rt *Runtime) restorePartition(ctx context.Context, cl *kgo.Client, log *zap.Logger, p int32, epoch uint64, committed map[string]int64, fromStart []string) (Partition, map[string]int64, int64, error) {
	// A standby tail of p stops writing first; its warm structures are
	// handed to Open if the restore only replays the tail. Without a
	// tail, those the partition's revoked instance here kept (keep.go)
	// are, in step with the state it left: nothing else wrote it since,
	// and the replay of what another owner wrote meanwhile goes through
	// them.
	warm, source := rt.sb.take(ctx, p), warmStandby
	if kept := rt.takeKept(ctx, p); warm == nil && kept != nil {
		warm, source = kept, warmKept
	}
	rt.noteKept()
	if err := rt.checkChangelogID(ctx, cl, log); err != nil {
		return nil, nil, 0, fmt.Errorf("stream: restore partition %d: %w", p, err)
	}
	// The changelog must still keep what the restore reads, as at the
	// stage's start (changelogkeeps.go).
	if err := rt.keepsForRestore(ctx, kadm.NewClient(cl), p); err != nil {
		log.Error("refusing to restore", zap.Error(err))
		return nil, nil, 0, err
	}
	var replayed int64
	oor := replans{epoch: epoch}
	defer rt.endReplans(p, &oor)
	for attempts := 1; ; attempts++ {
		n, w, err := rt.restoreState(ctx, cl, log, p, warm)
		replayed += n
		var he *horizonError
		if errors.As(err, &he) && !errors.Is(err, ErrRestoreHorizon) {
			// A replay that outlasted the horizon of its checkpoint's
			// date (its reads stalled: a previous owner's open
			// transaction held them at the LSO, the process was paused):
			// it stopped at its last batch in time. The plan is now a
			// full restore, dated anew; one expected not to fit the
			// horizon is refused (ErrRestoreHorizon), as always, and so
			// is one that outlasted it maxHorizonAttempts times in a
			// row: it would start over for ever.
			rt.noteRestoreHorizon(p, epoch, attempts)
			msg, needed := rt.horizonAdvice(p, attempts, he)
			fields := []zap.Field{zap.Int("copies", attempts), zap.Duration("delete_retention_needed", needed), zap.Error(err)}
			if attempts >= maxHorizonAttempts {
				// The pace of these copies is the restore rate this
				// instance achieves: kept, so that a restart plans with
				// it and refuses the full restore at once rather than
				// copy for as long again. Only the time they read counts:
				// the time they waited at an open transaction's last
				// stable offset, or for brokers that did not answer, says
				// nothing of how fast a copy reads, and a restart once the
				// wait ended copies at the reading pace.
				rt.observeRestore(he.pace.Read, he.pace.reading())
				rt.m.restoreHorizonExceeded.Inc()
				log.Error("refusing to restore: "+msg, fields...)
				return nil, nil, replayed, fmt.Errorf("stream: restore partition %d: %w: %s", p, ErrRestoreHorizon, msg)
			}
			log.Warn("the restore read changelog records later than its checkpoint's date allows; planning again: "+msg, fields...)
			warm = nil
			continue
		}
		rt.noteRestoreHorizon(p, epoch, 0)
		if errors.Is(err, errCopyOutOfRange) && ctx.Err() == nil {
			// The state is at its last checkpoint, every record below it
			// read: planned again from there, in full if the log start
			// is past it now.
			warm = nil
			if err := rt.replanOutOfRange(ctx, log, p, &oor, err); err != nil {
				return nil, nil, replayed, err
			}
			continue
		}
		if err != nil {
			return nil, nil, replayed, err
		}
		warm = w
		break
	}

	// docs/design.md, Exactly-once, 6: the state's input offset of each
	// input topic and the group's committed offset must agree; otherwise
	// re-processing would re-count.
	for _, topic := range rt.cfg.inputs() {
		if err := rt.checkInputOffset(p, topic, committed[topic]); err != nil {
			return nil, nil, replayed, err
		}
	}
	// Listed before the partition resumes: kgo reads from the start it
	// lists itself later, at or past this one (a start offset only
	// grows), so every record the partition will be given is at or past
	// it.
	starts, err := rt.startOffsets(ctx, cl, p, fromStart)
	if err != nil {
		return nil, nil, replayed, err
	}
	if warm == nil {
		source = warmNone
	}
	part, err := rt.proc.Open(p, &PartitionState{s: rt.store, p: p, warm: warm})
	if err != nil {
		return nil, nil, replayed, fmt.Errorf("stream: open partition %d: %w", p, err)
	}
	rt.m.opens.WithLabelValues(source).Inc()
	log.Info("partition opened", zap.String("warm_state", source))
	return part, starts, replayed, nil
}

// replanMaxWait caps the wait of a restore between plans while its
// changelog fetches stay out of range: it doubles from listRetry to this.
const replanMaxWait = 30 * time.Second

// replanLogEvery is how often, at most, a restore whose changelog fetches
// stay out of range warns that it plans again, after its first warning.
const replanLogEvery = time.Minute

// replans are a restore's plans in a row that ended with a changelog
// fetch out of range.
type replans struct {
	epoch     uint64        // of the restore (partState.epoch)
	n         int           // re-plans in a row
	wait      time.Duration // before the last one
	logged    time.Time     // when the last warning was logged
	notLogged int           // re-plans since that warning
}

// next counts a re-plan at now and returns the wait before it, and
// whether to warn of it.
func (r *replans) next(now time.Time) (wait time.Duration, warn bool) {
	r.n++
	r.wait = min(max(2*r.wait, listRetry), replanMaxWait)
	if r.n > 1 && now.Sub(r.logged) < replanLogEvery {
		r.notLogged++
		return r.wait, false
	}
	return r.wait, true
}

// replanOutOfRange counts a re-plan of partition p's restore after err, a
// changelog fetch out of range (errCopyOutOfRange), exports the re-plans
// in a row, warns of it (the first, then at most once every
// replanLogEvery, with the count) and waits before the next plan: from
// listRetry, doubling to replanMaxWait. Retention that deleted what the
// copy had not read is over at the next plan, from the new log start; a
// stale leader is usually replaced within seconds. Fetches out of range
// plan after plan (a retention that stays ahead of the copy, a leader
// stale for longer) would otherwise plan and log every 500 ms for as
// long as it lasts, with nothing in the metrics to say so. It returns
// ctx's error if ctx ends during the wait.
func (rt *Runtime) replanOutOfRange(ctx context.Context, log *zap.Logger, p int32, r *replans, err error) error {
	now := rt.cfg.Clock.Now()
	wait, warn := r.next(now)
	rt.mu.Lock()
	if rt.ownsRestore(p, r.epoch) {
		rt.m.outOfRangeReplans.WithLabelValues(fmt.Sprint(p)).Set(float64(r.n))
	}
	rt.mu.Unlock()
	if warn {
		log.Warn("the changelog's offset range moved past the restore's position (retention deleted records it had not read, or a stale leader answered); planning again",
			zap.Int("replans", r.n), zap.Int("not_logged", r.notLogged), zap.Duration("next_in", wait), zap.Error(err))
		r.logged, r.notLogged = now, 0
	}
	return rt.waitReplan(ctx, wait)
}

// endReplans ends the export of partition p's re-plans in a row, r, once
// its restore ended (restored, refused or abandoned), unless a newer
// restore of p, begun while this abandoned one still fetched or waited,
// owns the gauge (ownsRestore): that one's count stays exported.
func (rt *Runtime) endReplans(p int32, r *replans) {
	if r.n == 0 {
		return
	}
	rt.mu.Lock()
	if rt.ownsRestore(p, r.epoch) {
		rt.m.outOfRangeReplans.DeleteLabelValues(fmt.Sprint(p))
	}
	rt.mu.Unlock()
}

// ownsRestore reports whether the restore of partition p of epoch epoch
// owns p's per-partition restore gauges: no newer restore of p began
// since (p is not held, or held by that epoch). Called with mu held.
func (rt *Runtime) ownsRestore(p int32, epoch uint64) bool {
	ps, ok := rt.parts[p]
	return !ok || ps.epoch == epoch
}

// waitReplan waits d, or until ctx ends (its error).
func (rt *Runtime) waitReplan(ctx context.Context, d time.Duration) error {
	if rt.replanWait != nil {
		return rt.replanWait(ctx, d)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// startOffsets lists the start offset of partition p of each topic in
// topics: where the partition's reading of a topic the group has no
// committed offset of starts, the offset its first transaction commits
// (fenceFirst). nil if topics is empty.
func (rt *Runtime) startOffsets(ctx context.Context, cl *kgo.Client, p int32, topics []string) (map[string]int64, error) {
	if len(topics) == 0 {
		return nil, nil
	}
	starts := make(map[string]int64, len(topics))
	for _, t := range topics {
		list := func(ctx context.Context) (kadm.ListedOffsets, error) {
			return listFenced(ctx, cl, t, []int32{p}, listStart)
		}
		o, err := rt.listedOffset(ctx, list, t, "topic "+t, p, "start")
		if err != nil {
			return nil, err
		}
		starts[t] = o
	}
	return starts, nil
}

// restoreState plans partition p's copy of the changelog and replays it
// into the store (docs/design.md, Exactly-once, 4). It returns the records
// replayed and the warm structures, which are warm's if the replay was only
// the tail past warm's state (nil otherwise). A replay that outlasts the
// horizon of its checkpoint's date fails with errBeyondHorizon; a full
// restore expected not to fit the horizon is refused with
// ErrRestoreHorizon.
func (rt *Runtime) restoreState(ctx context.Context, cl *kgo.Client, log *zap.Logger, p int32, warm WarmState) (int64, WarmState, error) {
	// Read the checkpoint under mu so it is ordered against apply (see
	// apply): any apply of a transaction that began before this epoch
	// either happened already or is skipped.
	var cp Checkpoint
	var has bool
	err := rt.restoreWrite(ctx, func() (err error) {
		cp, has, err = rt.store.Checkpoint(p)
		if err == nil && !has {
			// No checkpoint: whatever is there is not known to match the
			// changelog. Start from nothing.
			err = rt.store.wipe(p)
		}
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("stream: restore partition %d: read checkpoint: %w", p, err)
	}
	// docs/design.md, Exactly-once, 4: a tail replay only while every
	// tombstone past the checkpoint is certain to be still in the
	// changelog.
	cs, err := rt.planCopy(ctx, cl, log, p, "restore", cp, has)
	if err != nil {
		return 0, nil, err
	}
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	plan, hw, logStart, retention := cs.plan, cs.end, cs.logStart, cs.retention
	rt.noteRestore(p, plan)
	fields := []zap.Field{zap.String("kind", plan.Kind()), zap.String("reason", plan.Reason),
		zap.Int64("checkpoint", cp.Offset), zap.Int64("log_start", logStart), zap.Int64("to", hw), zap.Bool("had_state", has),
		zap.Duration("checkpoint_age", plan.Age), zap.Duration("delete_retention", retention),
		zap.Duration("tail_estimate", plan.TailEstimate), zap.Duration("full_estimate", plan.FullEstimate)}
	if retention > 0 && !plan.FullFits {
		rt.m.restoreHorizonExceeded.Inc()
		msg := fmt.Sprintf("a full restore of changelog %s partition %d (%d offsets) is expected to take %s at %.0f records/s, more than half of its delete.retention.ms %s: compaction could remove tombstones during it; raise delete.retention.ms of %s to at least %s",
			rt.cfg.ChangelogTopic, p, hw-logStart, plan.FullEstimate.Round(time.Millisecond), rt.restoreRate(), retention,
			rt.cfg.ChangelogTopic, retentionFor(plan.FullEstimate, retention))
		if plan.Full {
			log.Error("refusing to restore: "+msg, fields...)
			return 0, nil, fmt.Errorf("stream: restore partition %d: %w: %s", p, ErrRestoreHorizon, msg)
		}
		log.Error(msg, fields...)
	}

	from, at := cs.from, cs.at
	if plan.Full {
		// Wipe and replay from the start (planCopy dates its checkpoints).
		if has {
			if err := rt.restoreWrite(ctx, func() error { return rt.store.wipe(p) }); err != nil {
				return 0, nil, fmt.Errorf("stream: restore partition %d: wipe state: %w", p, err)
			}
		}
		warm = nil // built from the state in Open
	}
	log.Info("restoring partition from the changelog", append(fields, zap.Int64("from", from), zap.Bool("warm", warm != nil))...)
	var replayed int64
	if from < hw {
		var reading time.Duration
		replayed, reading, err = rt.replay(ctx, p, from, hw, cs.lso, at, retention, warm)
		if err != nil {
			return replayed, nil, err
		}
		rt.observeRestore(replayed, reading)
	}
	rt.m.restoring.WithLabelValues(fmt.Sprint(p)).Set(0)
	return replayed, warm, nil
}

// restoreWrite runs write, a write of a restore's to its partition's
// state, under mu unless ctx, the restore's, has ended. Every revoke and
// every new assignment of the partition ends that context under mu
// (onRevoked, adjustOffsets, closeAll), before the partition's next
// restore or standby tail here begins: a restore abandoned while it was
// about to write (descheduled, or behind a slow batch) writes nothing
// after that, where its batch, older than what the next copy and the
// partition's transactions since wrote, would take their keys and
// checkpoint back. A write under way when the context ends finishes
// first. Pebble serialises the writes of a batch anyway; mu is held for
// one restore batch at a time, as apply holds it for a transaction's.
func (rt *Runtime) restoreWrite(ctx context.Context, write func() error) error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	return write()
}

// checkInputOffset compares the restored state's next input offset of
// topic's partition p with the group's committed offset (-1: none).
func (rt *Runtime) checkInputOffset(p int32, topic string, committed int64) error {
	v, ok, err := rt.store.Get(p, []byte(rt.cfg.inputOffsetKey(topic)))
	if err != nil {
		return err
	}
	state := int64(-1)
	if ok {
		if state, err = decodeOffset(v); err != nil {
			return fmt.Errorf("stream: restore partition %d: input offset of %s: %w", p, topic, err)
		}
	}
	if state != committed {
		return fmt.Errorf("stream: restore partition %d: %w: state says the next input offset of %s is %s, the group %s has committed %s; refusing to re-count (%s)",
			p, ErrOffsetMismatch, topic, offsetString(state), rt.cfg.Group, offsetString(committed), rt.mismatchHint(topic, state, committed))
	}
	return nil
}

// mismatchHint says what most likely made a partition's state and its
// group's committed offset (of input topic) disagree.
func (rt *Runtime) mismatchHint(topic string, state, committed int64) string {
	switch {
	case committed < 0:
		// A group's offsets of a topic go with the topic: a recreated
		// input looks like a new group, and the state's offset means
		// other records on the new log.
		return fmt.Sprintf("the group has committed nothing on it: a new or renamed group on the state of changelog %s, which another group committed (run with that group), "+
			"or %s was deleted and created again (do not set the group's offset to the state's: on the new log it would skip records uncounted); "+
			"or run with a new changelog and an empty state directory to count the input again from its start", rt.cfg.ChangelogTopic, topic)
	case state < 0:
		return fmt.Sprintf("the state has no input offset: changelog %s is new, or was deleted or recreated, while the group kept its offsets", rt.cfg.ChangelogTopic)
	default:
		return "was the group's offset reset, or the changelog deleted and written again?"
	}
}

// missingAttempts is how many listings of the changelog may lack the
// partition before a restore stops on it: a partition just created (the
// input's and the changelog's together, by CreatePartitions) can be missing
// from the broker's metadata for a moment after the group assigned it, and
// the stage's own check of the partition count must get to say so.
const missingAttempts = 6

// listRetry is how long listedOffset waits before listing again.
var listRetry = 500 * time.Millisecond

// changelogOffset lists the start or end offset of changelog partition p
// (listedOffset; list: changelogLister's, fenced by the partition's
// leader epoch).
func (rt *Runtime) changelogOffset(ctx context.Context, list func(context.Context) (kadm.ListedOffsets, error), p int32, which string) (int64, error) {
	return rt.listedOffset(ctx, list, rt.cfg.ChangelogTopic, "changelog "+rt.cfg.ChangelogTopic, p, which)
}

// listedOffset lists an offset (which: start, end, last stable) of
// partition p of topic, named what in errors, with list (listFenced's: a
// broker that lost the leadership answers NOT_LEADER_OR_FOLLOWER,
// FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH, retried as the others). A
// new or moving partition answers with retriable errors (no leader yet)
// for a moment, and on a cluster a listing fails outright while the
// partition's leader is a broker that died or paused and the controller
// has not moved its leadership yet (a shard error: the dial is refused or
// times out, and the partition is missing from the answer), or for as
// long as that broker is down when it held the only replica: both are
// retried every 500 ms for as long as the restore lasts (a revoke or the
// session's end cancels it), with a warning a minute, as a running stage
// waits for the leaders of its outputs (docs/design.md, Exactly-once, 5).
// A topic that is gone (UNKNOWN_TOPIC_OR_PARTITION) is retried for a
// minute. An authorization failure is not retried, and neither is a
// listing that succeeds without p (the topic has fewer partitions than the
// input).
func (rt *Runtime) listedOffset(ctx context.Context, list func(context.Context) (kadm.ListedOffsets, error), topic, what string, p int32, which string) (int64, error) {
	const attempts = 120 // a minute
	for attempt := 1; ; attempt++ {
		offs, err := list(ctx)
		lo, ok := offs.Lookup(topic, p)
		switch {
		case ok && lo.Err == nil:
			return lo.Offset, nil
		case ctx.Err() != nil:
			return 0, ctx.Err()
		case errors.As(err, new(*kadm.AuthError)):
			return 0, fmt.Errorf("stream: restore partition %d: %s %s offset: %w", p, what, which, err)
		case err == nil && !ok && attempt >= missingAttempts:
			return 0, fmt.Errorf("stream: restore partition %d: %s has no partition %d (it must have as many partitions as %s)",
				p, what, p, rt.cfg.InputTopic)
		case ok && !kerr.IsRetriable(lo.Err):
			return 0, fmt.Errorf("stream: restore partition %d: %s %s offset: %w", p, what, which, lo.Err)
		}
		if err == nil {
			err = lo.Err
		}
		if attempt%attempts == 0 {
			if errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID) {
				return 0, fmt.Errorf("stream: restore partition %d: %s %s offset, %d attempts: %w", p, what, which, attempt, err)
			}
			rt.log.Warn("restore waiting for the partition's leader", zap.Int32("partition", p), zap.String("topic", topic),
				zap.String("offset", which), zap.Int("attempts", attempt), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(listRetry):
		}
	}
}

func offsetString(o int64) string {
	if o < 0 {
		return "none"
	}
	return fmt.Sprint(o)
}

// replay reads the changelog partition read_committed from `from` until it
// has seen offset hw-1, in batches of restoreBatch records that each move
// the checkpoint (changelogCopy). Control records (transaction markers) are
// kept so the end is recognised even when the last offsets are markers; a
// previous owner's transaction still open below hw holds the read at the
// LSO until it commits or aborts.
// at dates the checkpoints it writes (Checkpoint.At); a batch read later
// than the horizon of that date (retention: delete.retention.ms) is not
// written, and the replay fails with errBeyondHorizon.
// warm, when not nil, is given every record once its batch is committed.
// lso is the changelog's last stable offset listed with hw. It returns the
// records replayed and the time it spent reading them (Config.Clock),
// without the time it waited at the last stable offset for a transaction's
// outcome (changelogCopy.stall).
func (rt *Runtime) replay(ctx context.Context, p int32, from, hw, lso int64, at time.Time, retention time.Duration, warm WarmState) (int64, time.Duration, error) {
	c, err := rt.newChangelogCopy(p, "restore", from, hw, lso, at, warm)
	if err != nil {
		return 0, 0, err
	}
	c.owner = ctx
	defer c.close()
	gauge := rt.m.restoring.WithLabelValues(fmt.Sprint(p))
	var n int64
	for c.pos < hw {
		gauge.Set(float64(hw - c.pos))
		fs, err := c.fetch(ctx, 0, nil)
		if err != nil {
			return n, 0, err
		}
		added := c.add(fs, hw)
		n += int64(added)
		rt.m.restoreRecords.Add(float64(added))
		if c.pending() >= restoreBatch || c.pos >= hw {
			if err := c.commit(retention); err != nil {
				return n, 0, err
			}
			fault.Hit(fault.DuringRestore)
		}
	}
	return n, c.pace().reading(), nil
}
