package stream

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// Idle owned partitions keep their checkpoints dated (docs/design.md,
// Exactly-once, 4).
//
// An owned partition's checkpoint is dated when a transaction that wrote
// its changelog is applied (apply). A partition without input writes
// none, and its date ages: past the restore horizon its copy, current
// all along, is not advertised to the group's balancer (warmCopies), and
// a restore from it, after a restart, starts over from the changelog's
// start. So the run loop re-dates such a checkpoint, as a standby of an
// idle changelog does (standbys.run): once a partition's date is a tenth
// of delete.retention.ms old (the margin of the horizon), it lists the
// changelog's last stable offset and then its end, the time T taken
// (Config.Clock) before both, and when neither has moved past the
// checkpoint it stores the checkpoint again, dated T. Everything the state
// has not seen was then appended after T, which is what Checkpoint.At
// says.
//
// "Not moved past" is exact about transaction markers. The checkpoint
// apply writes is the offset after the transaction's last changelog
// record: the transaction's commit marker sits there, so the end is one
// past it. A restore's checkpoint is the end it read to. The end may thus
// be the checkpoint's offset, or one past it when this epoch's own last
// commit wrote the checkpoint; and the last stable offset must be the end
// (no transaction open there). Listed in that order, an LSO equal to the
// end listed after it means the partition had no open transaction and that
// end when the LSO was listed. Any other writer (the member that owns the
// partition now while this one, fenced, has not heard of it) appends at
// least a record and its marker, or leaves a transaction open: the end is
// then further, or the LSO behind it, and the copy is not re-dated. Nor is
// it after a transaction of this member's own aborted on the partition
// (its records and abort marker lie past the checkpoint): the next commit,
// or a restore, dates it again.
//
// The listing runs on a goroutine of its own, at most one at a time, and
// its result is written by the run loop, so that processing never waits on
// the broker; the write is skipped if the partition was revoked or
// assigned anew, or its checkpoint written, meanwhile. A partition is
// re-dated at most once per tenth of delete.retention.ms (its date must be
// that old), and one whose changelog had moved is listed again only a
// tenth later. Errors are logged; they cost only the date.

// ownerRedatePoll is how often the run loop looks for owned partitions
// whose checkpoints are due for a new date.
const ownerRedatePoll = 5 * time.Second

// ownerRedateTimeout bounds one listing of the changelog for them.
const ownerRedateTimeout = 10 * time.Second

// ownerRedates is one session's re-dating of idle owned partitions: the
// run loop's state, and the listing goroutine it may have started.
type ownerRedates struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	cl     *kgo.Client // the session's
	// Run-loop-only.
	next  time.Time // wall clock: when to look again
	busy  bool      // a listing is under way
	retry map[int32]time.Time
	// done receives the listing's result; it holds one.
	done chan redateListing
}

// redateCandidate is an owned partition's checkpoint as read when its
// listing started, and the epoch it was owned in.
type redateCandidate struct {
	cp    Checkpoint
	epoch uint64
}

// redateListing is a listing of the changelog for re-dating.
type redateListing struct {
	at       time.Time // Config.Clock, before the listing
	cands    map[int32]redateCandidate
	lso, end kadm.ListedOffsets
	err      error
}

// startOwnerRedates prepares one session's re-dating (cl: the session's
// client); stop ends it and waits for its listing.
func (rt *Runtime) startOwnerRedates(ctx context.Context, cl *kgo.Client) (r *ownerRedates, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	r = &ownerRedates{ctx: ctx, cancel: cancel, cl: cl, retry: map[int32]time.Time{}, done: make(chan redateListing, 1)}
	return r, func() {
		cancel()
		r.wg.Wait()
	}
}

// redateIdle is the run loop's step of re-dating: it writes the result of
// a finished listing, and starts a new one when owned partitions are due.
// It never waits on the broker.
func (rt *Runtime) redateIdle(r *ownerRedates) {
	select {
	case l := <-r.done:
		r.busy = false
		rt.writeRedates(r, l)
	default:
	}
	if r.busy || time.Now().Before(r.next) {
		return
	}
	poll := rt.redatePoll
	if poll <= 0 {
		poll = ownerRedatePoll
	}
	r.next = time.Now().Add(poll)
	retention := rt.knownRetention()
	if retention <= 0 || len(rt.active) == 0 {
		return // unknown: no copy is within the horizon anyway
	}
	now := rt.cfg.Clock.Now()
	cands := map[int32]redateCandidate{}
	for p, a := range rt.active {
		if now.Before(r.retry[p]) {
			continue
		}
		cp, ok, err := rt.store.Checkpoint(p)
		if err != nil {
			rt.log.Warn("cannot read a partition's checkpoint to re-date it", zap.Int32("partition", p), zap.Error(err))
			continue
		}
		if ok && now.Sub(cp.At) >= retention/restoreMarginDivisor {
			cands[p] = redateCandidate{cp: cp, epoch: a.epoch}
		}
	}
	if len(cands) == 0 {
		return
	}
	r.busy = true
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		l := redateListing{at: rt.cfg.Clock.Now(), cands: cands}
		ctx, cancel := context.WithTimeout(r.ctx, ownerRedateTimeout)
		defer cancel()
		// The LSO first: see the comment at the top of the file. Both
		// fenced by the partitions' leader epochs (listoffsets.go): a
		// paused broker's stale end could equal the checkpoint while the
		// changelog moved on.
		ps := make([]int32, 0, len(cands))
		for p := range cands {
			ps = append(ps, p)
		}
		l.lso, l.err = listFenced(ctx, r.cl, rt.cfg.ChangelogTopic, ps, listLastStable)
		if l.err == nil {
			l.end, l.err = listFenced(ctx, r.cl, rt.cfg.ChangelogTopic, ps, listEnd)
		}
		r.done <- l
		rt.notify()
	}()
}

// idleSince reports whether a changelog partition whose last stable offset
// lso and then end were listed has nothing past checkpoint cp: the end is
// cp's offset, or one past it when marker (the checkpoint offset this
// epoch's last commit wrote; -1: none) is cp's offset, and no transaction
// is open there.
func idleSince(cp Checkpoint, marker, lso, end int64) bool {
	return lso == end && (end == cp.Offset || end == cp.Offset+1 && marker == cp.Offset)
}

// writeRedates writes the new dates a listing allows.
func (rt *Runtime) writeRedates(r *ownerRedates, l redateListing) {
	if l.err != nil {
		if r.ctx.Err() == nil {
			rt.log.Warn("cannot list the changelog to re-date the checkpoints of idle partitions", zap.Error(l.err))
		}
		return
	}
	retention := rt.knownRetention()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	b := rt.store.newBatch()
	var redated []int32
	for p, c := range l.cands {
		ps, ok := rt.parts[p]
		if !ok || ps.epoch != c.epoch {
			continue // revoked or assigned anew: its restore decides
		}
		cp, ok, err := rt.store.Checkpoint(p)
		if err != nil || !ok || cp.Offset != c.cp.Offset || !cp.At.Equal(c.cp.At) || !l.at.After(cp.At) {
			continue // written meanwhile (apply)
		}
		lso, lok := l.lso.Lookup(rt.cfg.ChangelogTopic, p)
		end, eok := l.end.Lookup(rt.cfg.ChangelogTopic, p)
		if !lok || !eok || lso.Err != nil || end.Err != nil {
			rt.log.Warn("cannot list a changelog partition to re-date its checkpoint", zap.Int32("partition", p),
				zap.NamedError("lso_error", lso.Err), zap.NamedError("end_error", end.Err))
			continue
		}
		if !idleSince(cp, ps.marker, lso.Offset, end.Offset) {
			r.retry[p] = l.at.Add(retention / restoreMarginDivisor)
			rt.log.Info("not re-dating the checkpoint of an owned partition: its changelog moved past it (a transaction of this member's aborted there, or another member writes the partition and this one was fenced)",
				zap.Int32("partition", p), zap.Int64("checkpoint", cp.Offset), zap.Time("checkpoint_date", cp.At),
				zap.Int64("changelog_end", end.Offset), zap.Int64("last_stable", lso.Offset))
			continue
		}
		b.checkpoint(p, Checkpoint{Offset: cp.Offset, At: l.at})
		redated = append(redated, p)
	}
	if len(redated) == 0 {
		_ = b.b.Close()
		return
	}
	if err := b.commit(); err != nil {
		rt.log.Warn("cannot write the new dates of idle partitions' checkpoints", zap.Error(err))
		return
	}
	slices.Sort(redated)
	rt.log.Debug("re-dated the checkpoints of idle owned partitions", zap.Int32s("partitions", redated), zap.Time("at", l.at))
}
