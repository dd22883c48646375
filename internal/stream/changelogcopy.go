package stream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/clock"
)

// changelogCopy copies one changelog partition into the store: a
// read_committed reader from an offset, and a pending Pebble batch of the
// records read since the last commit. A restore's replay and a standby's
// tail both go through it, so that they write a partition's state, its
// checkpoint and its warm structures the same way:
//
//   - a record with a value sets its key, a tombstone deletes it, a control
//     record (transaction marker) only moves the position;
//   - a commit writes the pending records and the checkpoint (the position
//     reached, with the copy's date) in one Pebble batch, and only then
//     gives the records to the warm structures and applies their local
//     deletes (WarmExpirer): the warm structures never reflect a record the
//     state does not hold;
//   - the date (docs/design.md, Exactly-once, 4) holds from a position:
//     every tombstone at or past it is kept until at least the date +
//     delete.retention.ms. A record read past that deadline may have lost a
//     later tombstone to compaction, so neither a commit nor a new date may
//     cover a record read after it: they fail with errBeyondHorizon, and
//     the copy starts over in full (up to maxHorizonAttempts copies in a
//     row). (The restore plan alone cannot tell: a state at the changelog's
//     end is trusted however old its date, "current".)
//
// It is used by one goroutine.
type changelogCopy struct {
	rt   *Runtime
	p    int32
	what string // "restore" or "standby", for the errors
	cl   *kgo.Client
	warm WarmState // nil: none
	// owner, for a restore, is its context: a commit writes only while it
	// has not ended (Runtime.restoreWrite). nil for a standby's tail,
	// whose writes end before another copy of the partition begins
	// (standbys.take, standbys.start).
	owner context.Context

	b       *batch
	applied []*kgo.Record // the records in b, for warm once committed
	pos     int64         // the next offset to read: everything below it is in b or committed
	at      time.Time     // the date the checkpoints carry
	atPos   int64         // the position at dates: every record read past it was read in time only if read before at + the horizon

	// The copy's pace, for a copy refused for the horizon (copyPace):
	// since it started or last took a date (redate), as the horizon only
	// concerns what it read since.
	from, firstEnd, end int64     // where it started (or was dated), the changelog's end then, and the last end listed
	started             time.Time // when it started (or was dated; Config.Clock)
	// stalled is the part of that time the copy spent waiting, not
	// reading: at the changelog's last stable offset (stall), or on
	// brokers that did not answer (out).
	stalled time.Duration
	// lso and hw are the changelog's last stable offset and high
	// watermark, as listed when the copy started and then as each fetch of
	// the partition reports them.
	lso, hw int64
	// out is the time the brokers did not answer the copy's reader.
	out *outage
}

// outage measures, from the hooks of a copy's reader, the time its brokers
// do not answer: from a failed connection or request until the next
// answered fetch (Config.Clock). It is called from the client's goroutines.
type outage struct {
	clock clock.Clock
	mu    sync.Mutex
	since time.Time // zero: answering
	total time.Duration
}

func (o *outage) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		o.down()
	}
}

func (o *outage) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	switch {
	case e2e.Err() != nil:
		o.down()
	case key == kmsg.Fetch.Int16():
		o.up()
	}
}

func (o *outage) down() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since.IsZero() {
		o.since = o.clock.Now()
	}
}

func (o *outage) up() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.since.IsZero() {
		o.total += max(o.clock.Now().Sub(o.since), 0)
		o.since = time.Time{}
	}
}

// sofar returns the time the brokers have not answered, until now.
func (o *outage) sofar() time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	d := o.total
	if !o.since.IsZero() {
		d += max(o.clock.Now().Sub(o.since), 0)
	}
	return d
}

// errCopyOutOfRange is returned (wrapped) by a copy whose next offset is
// out of the changelog partition's range: retention moved the log start
// past it (the records between were never read), or a stale leader's end
// is below it. Nothing read since the last commit is written; the copy is
// planned again from its checkpoint.
var errCopyOutOfRange = errors.New("the changelog's offset range no longer holds the copy's position")

// errBeyondHorizon is returned (wrapped, in a *horizonError) by a copy
// that read a record later than the horizon of its date allows.
var errBeyondHorizon = errors.New("read changelog records past the horizon of the copy's date: a tombstone may have been compacted away unread")

// horizonError is a copy's errBeyondHorizon, with the pace the copy kept.
type horizonError struct {
	what      string
	p         int32
	at        time.Time
	pos       int64
	retention time.Duration
	pace      copyPace
}

func (e *horizonError) Error() string {
	return fmt.Sprintf("stream: %s partition %d: %s (checkpoint dated %s, at offset %d; delete.retention.ms %s)",
		e.what, e.p, errBeyondHorizon, e.at.Format(time.RFC3339), e.pos, e.retention)
}

func (e *horizonError) Unwrap() error { return errBeyondHorizon }

// copyPace is how a copy went until it was refused for the horizon, since
// it started or last took a date (a standby tail that kept up for days and
// was then paused is measured over the pause): the offsets it read, how
// far it still was from the changelog's end, how far that end moved
// meanwhile, in how long (Config.Clock), and how much of that time it
// waited rather than read: at the changelog's last stable offset
// (changelogCopy.stall), or for brokers that did not answer (outage).
type copyPace struct {
	Read, Left, Grown int64
	Elapsed, Stalled  time.Duration
}

// reading is the time the copy spent reading: Elapsed without its stalls.
func (c copyPace) reading() time.Duration { return max(c.Elapsed-c.Stalled, 0) }

// projected returns how long a copy at this pace, without its stalls,
// takes from its start to the changelog's end: the offsets between them
// when it started, at the read rate (offsets read per second of reading)
// less the rate the end grows at (per second of Elapsed, stalls included:
// the end moves whether the copy reads or waits). ok is false when the
// copy read nothing, or would not gain on the end.
func (c copyPace) projected() (d time.Duration, ok bool) {
	r := c.reading()
	if c.Read <= 0 || r <= 0 || c.Elapsed <= 0 {
		return 0, false
	}
	gain := float64(c.Read)/r.Seconds() - float64(c.Grown)/c.Elapsed.Seconds() // offsets/s
	if gain <= 0 {
		return 0, false
	}
	s := float64(c.Read+max(c.Left, 0)-c.Grown) / gain
	if s >= float64(math.MaxInt64/int64(time.Second)) {
		return time.Duration(math.MaxInt64), true
	}
	return time.Duration(max(s, 0) * float64(time.Second)), true
}

// newChangelogCopy starts reading changelog partition p from offset from
// (read_committed, control records kept, so that the position passes the
// transaction markers) towards the changelog's end, end, its checkpoints
// dated at; lso is the changelog's last stable offset listed with end (-1:
// not known). warm, when not nil, receives every record once it is
// committed. The caller closes it.
func (rt *Runtime) newChangelogCopy(p int32, what string, from, end, lso int64, at time.Time, warm WarmState) (*changelogCopy, error) {
	out := &outage{clock: rt.cfg.Clock}
	// The copy's time starts before its reader: the client fetches from
	// the moment it is made, and the pace must count that time.
	started := rt.cfg.Clock.Now()
	newClient := rt.newClient // a standby's tail lives on
	if what == "restore" {
		newClient = rt.newListedClient
	}
	cl, err := newClient(
		kgo.WithHooks(out),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{rt.cfg.ChangelogTopic: {p: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		// Out of range (below the log start: retention removed records
		// the copy had not read yet, since the offsets were listed or
		// while it tailed; past the end: a stale leader) is an error
		// (errCopyOutOfRange), never a jump: records skipped unread may
		// hold tombstones, and the state would keep keys a fresh copy
		// does not. The copy is planned again from its checkpoint, in
		// full once that is below the log start (planRestore).
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
	)
	if err != nil {
		return nil, err
	}
	return &changelogCopy{rt: rt, p: p, what: what, cl: cl, warm: warm, b: rt.store.newBatch(), pos: from, at: at, atPos: from,
		from: from, firstEnd: end, end: end, started: started, lso: lso, hw: end, out: out}, nil
}

// listed records a later listing of the changelog's end, for the pace.
func (c *changelogCopy) listed(end int64) { c.end = max(c.end, end) }

// stall reports whether the copy has read up to the changelog's last
// stable offset while the log goes on past it: read_committed returns
// nothing more until the transaction open there (a previous owner's, not
// yet timed out) commits or aborts, so the copy waits rather than reads.
// The LSO is the last one a fetch reported, or listed when the copy
// started; the log's end, the last one a fetch reported or listed (the
// standby lists it every second).
func (c *changelogCopy) stall() bool {
	return c.lso >= 0 && c.pos >= c.lso && max(c.hw, c.end) > c.lso
}

// fetch polls the changelog, for at most wait when wait > 0. Once ctx ends
// it returns ctx's error; otherwise the first fetch error other than the
// end of the poll's own wait. In the copy's pace, a poll that starts while
// the copy stalls at the last stable offset counts as stalled time, not
// reading, and so does the time during a poll that the brokers did not
// answer (outage): a copy held up by an open transaction or an outage is
// not a slow one. A receive on wake, when not nil, ends the poll as the end
// of its wait does (a standby's listing of the changelog's end arrived).
func (c *changelogCopy) fetch(ctx context.Context, wait time.Duration, wake <-chan struct{}) (kgo.Fetches, error) {
	pctx := ctx
	if wait > 0 || wake != nil {
		var cancel context.CancelFunc
		if wait > 0 {
			pctx, cancel = context.WithTimeout(ctx, wait)
		} else {
			pctx, cancel = context.WithCancel(ctx)
		}
		defer cancel()
		if wake != nil {
			polled := make(chan struct{})
			defer close(polled)
			go func() {
				select {
				case <-wake:
					cancel()
				case <-polled:
				}
			}()
		}
	}
	stalled, t0, out0 := c.stall(), c.rt.cfg.Clock.Now(), c.out.sofar()
	fs := c.cl.PollFetches(pctx)
	polled := max(c.rt.cfg.Clock.Now().Sub(t0), 0)
	if stalled {
		c.stalled += polled
	} else {
		c.stalled += min(max(c.out.sofar()-out0, 0), polled)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		if fp.Topic == c.rt.cfg.ChangelogTopic && fp.Partition == c.p && fp.Err == nil && len(fp.Records) > 0 {
			c.lso, c.hw = fp.LastStableOffset, fp.HighWatermark
		}
	})
	var ferr error
	fs.EachError(func(_ string, _ int32, err error) {
		if ferr == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			ferr = fmt.Errorf("stream: %s partition %d: fetch changelog: %w", c.what, c.p, err)
			if errors.Is(err, kerr.OffsetOutOfRange) {
				ferr = fmt.Errorf("%w at offset %d: %w", errCopyOutOfRange, c.pos, ferr)
			}
			if errors.Is(err, kerr.TopicAuthorizationFailed) {
				ferr = fmt.Errorf("%w (%s needs Read on topic %s: docs/operations.md, Security and ACLs)", ferr, c.rt.cfg.Kafka.Principal(), c.rt.cfg.ChangelogTopic)
			}
		}
	})
	return fs, ferr
}

// add adds the records of fs to the pending batch and returns how many
// data records it added. With bound >= 0, a record at or past bound is not
// added and moves the position to bound: everything below bound has then
// been read. (This is how a replay to an end listed earlier finishes when
// a previous owner's transaction that was open at that end aborts:
// read_committed never delivers its records below the end, and its abort
// marker lands at or past it.)
func (c *changelogCopy) add(fs kgo.Fetches, bound int64) int {
	n := 0
	fs.EachRecord(func(r *kgo.Record) {
		if bound >= 0 && r.Offset >= bound {
			c.pos = bound
			return
		}
		c.pos = r.Offset + 1
		if r.Attrs.IsControl() {
			return
		}
		if r.Value == nil {
			c.b.del(c.p, r.Key)
		} else {
			c.b.set(c.p, r.Key, r.Value)
		}
		if c.warm != nil {
			c.applied = append(c.applied, r)
		}
		n++
	})
	return n
}

// pending returns how many records the pending batch holds.
func (c *changelogCopy) pending() int { return c.b.n }

// inTime reports whether every record the copy read since its date was
// read within the horizon of that date (now − date + margin <
// delete.retention.ms, the margin a tenth of it, as planRestore's), or it
// read none. An unknown retention (zero) is not checked: every restore
// with a tail to replay is then a full one.
func (c *changelogCopy) inTime(retention time.Duration) bool {
	if c.pos == c.atPos || retention <= 0 {
		return true
	}
	return c.rt.cfg.Clock.Now().Sub(c.at)+retention/restoreMarginDivisor < retention
}

// redate dates the copy's checkpoints at from now on: the caller has read
// up to an end listed at at, so every tombstone it has not read was
// appended after at. It fails with errBeyondHorizon if the records read
// under the current date were not read in time (inTime).
func (c *changelogCopy) redate(at time.Time, retention time.Duration) error {
	if !at.After(c.at) {
		return nil
	}
	if !c.inTime(retention) {
		return c.beyondHorizon(retention)
	}
	c.at, c.atPos = at, c.pos
	c.from, c.firstEnd, c.started, c.stalled = c.pos, c.end, c.rt.cfg.Clock.Now(), 0
	return nil
}

// pace returns the copy's pace since it started or last took a date.
func (c *changelogCopy) pace() copyPace {
	return copyPace{Read: c.pos - c.from, Left: c.end - c.pos, Grown: c.end - c.firstEnd,
		Elapsed: c.rt.cfg.Clock.Now().Sub(c.started), Stalled: c.stalled}
}

func (c *changelogCopy) beyondHorizon(retention time.Duration) error {
	return &horizonError{what: c.what, p: c.p, at: c.at, pos: c.pos, retention: retention, pace: c.pace()}
}

// commit writes the pending records with the checkpoint {position, date},
// then gives them to the warm structures and applies their local deletes.
// It fails with errBeyondHorizon, writing nothing, if the records read
// under the date were not read in time (inTime).
func (c *changelogCopy) commit(retention time.Duration) error {
	if !c.inTime(retention) {
		return c.beyondHorizon(retention)
	}
	if h := c.rt.copyHook.Load(); h != nil {
		(*h)(c.what, c.p)
	}
	if c.owner != nil {
		return c.rt.restoreWrite(c.owner, c.write)
	}
	return c.write()
}

// write writes the pending batch with the checkpoint, then gives its
// records to the warm structures and applies their local deletes.
func (c *changelogCopy) write() error {
	b := c.b
	c.b = c.rt.store.newBatch()
	b.checkpoint(c.p, Checkpoint{Offset: c.pos, At: c.at})
	if err := b.commit(); err != nil {
		return fmt.Errorf("stream: %s partition %d: write state: %w", c.what, c.p, err)
	}
	if c.warm == nil {
		return nil
	}
	for _, r := range c.applied {
		c.warm.Apply(r.Key, r.Value)
	}
	c.applied = c.applied[:0]
	return c.rt.applyLocalDeletes(c.p, c.warm)
}

// close drops the pending records and closes the reader.
func (c *changelogCopy) close() {
	_ = c.b.b.Close()
	c.cl.Close()
}

// copyStart is where a copy of a changelog partition starts, for a restore
// or a standby tail alike: the changelog's bounds, its delete retention,
// the plan (docs/design.md, Exactly-once, 4) and, from it, the offset to
// read from and the date the checkpoints carry until the copy reaches a
// listed end.
type copyStart struct {
	plan      restorePlan
	end       int64 // the changelog's end offset, listed at now
	lso       int64 // its last stable offset, listed then
	logStart  int64
	retention time.Duration // zero when unknown
	now       time.Time
	from      int64     // the checkpoint's offset, or the log start for a full copy
	at        time.Time // the checkpoint's date, or now for a full copy
}

// planCopy lists changelog partition p's bounds and delete retention and
// plans a copy of it onto state at checkpoint cp (has: the store holds one).
// A full copy reads from the log start, its checkpoints dated now, before
// its first read: a key it reads had no tombstone cleaned yet (a cleaning
// drops older values with the tombstone), so every tombstone it has still
// to read is kept until at least now + delete.retention.ms. The caller
// wipes the state first. A checkpoint beyond the changelog's end is an
// error: the changelog was recreated or truncated (confirmEnd: once the
// end, listed again for truncationWait, stays below it).
func (rt *Runtime) planCopy(ctx context.Context, cl *kgo.Client, log *zap.Logger, p int32, what string, cp Checkpoint, has bool) (copyStart, error) {
	adm := kadm.NewClient(cl)
	end, err := rt.changelogOffset(ctx, rt.changelogLister(cl, p, listEnd), p, "end")
	if err != nil {
		return copyStart{}, err
	}
	if !has {
		cp = Checkpoint{}
	}
	if cp.Offset > end {
		if end, err = rt.confirmEnd(ctx, cl, log, p, what, cp, end); err != nil {
			return copyStart{}, err
		}
	}
	lso, err := rt.changelogOffset(ctx, rt.changelogLister(cl, p, listLastStable), p, "last stable")
	if err != nil {
		return copyStart{}, err
	}
	logStart, err := rt.changelogOffset(ctx, rt.changelogLister(cl, p, listStart), p, "start")
	if err != nil {
		return copyStart{}, err
	}
	retention := rt.deleteRetention(ctx, adm, log)
	now := rt.cfg.Clock.Now()
	plan := planRestore(restoreInput{Now: now, Checkpoint: cp, HasState: has, LogStart: logStart, End: end,
		Retention: retention, Rate: rt.restoreRate()})
	cs := copyStart{plan: plan, end: end, lso: lso, logStart: logStart, retention: retention, now: now, from: cp.Offset, at: cp.At}
	if plan.Full {
		cs.from, cs.at = logStart, now
	}
	return cs, nil
}

// truncationWait is how long a copy whose checkpoint is beyond the
// changelog's listed end lists the end again before it concludes that the
// changelog was recreated or truncated; truncationPoll, how often.
const (
	truncationWait = 30 * time.Second
	truncationPoll = time.Second
)

// confirmEnd lists changelog partition p's end again, every
// truncationPoll for up to truncationWait (Runtime.truncationWait in
// tests), while it is below checkpoint cp, and returns the first end at or
// past it. A listing is fenced by the partition's leader epoch, but the
// epoch comes from the brokers' metadata: a broker that was paused, still
// behind, can be the only one to answer it and name itself the leader. The
// true end of a log never moves back, so an end below a checkpoint that
// stays is a changelog that was recreated or truncated: the error, as
// before.
func (rt *Runtime) confirmEnd(ctx context.Context, cl *kgo.Client, log *zap.Logger, p int32, what string, cp Checkpoint, end int64) (int64, error) {
	wait := rt.truncationWait
	if wait <= 0 {
		wait = truncationWait
	}
	log.Warn("the changelog's end is listed below the checkpoint: listing it again before concluding the changelog was recreated or truncated",
		zap.String("copy", what), zap.Int64("checkpoint", cp.Offset), zap.Int64("changelog_end", end), zap.Duration("for", wait))
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(min(truncationPoll, wait)):
		}
		e, err := rt.changelogOffset(ctx, rt.changelogLister(cl, p, listEnd), p, "end")
		if err != nil {
			return 0, err
		}
		if e >= cp.Offset {
			log.Info("the changelog's end, listed again, is at or past the checkpoint: the earlier listing was stale",
				zap.String("copy", what), zap.Int64("checkpoint", cp.Offset), zap.Int64("changelog_end", e), zap.Int64("listed_before", end))
			return e, nil
		}
		end = e
	}
	return 0, fmt.Errorf("stream: %s partition %d: checkpoint %d beyond changelog end %d (listed for %s): the changelog was recreated or truncated; delete the state directory to rebuild from it", what, p, cp.Offset, end, wait)
}
