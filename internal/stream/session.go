package stream

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
)

// sessionOptions are the runtime's own options of one session's client,
// on top of the session's (session.Loop.Open); maxDecompress is
// Config.MaxDecompressBatchBytes, d the runtime's decompressor.
func sessionOptions(maxDecompress int, d *decompressBudget) []kgo.Opt {
	return []kgo.Opt{
		// Anything a producer controls is untrusted: a batch of a few
		// hundred KB may decompress to GBs (docs/design.md, Bad input).
		// kgo stops the partition at a batch past the bound, and
		// handleFetches rejects it; the batches of a poll share a budget
		// (decompress.go).
		kgo.MaxDecompressBatchBytes(maxDecompress),
		kgo.WithDecompressor(d),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
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
		// Uncompressed batches never reach the decompressor, and kgo
		// decodes each of their bytes into up to decodedPerWireByte
		// bytes (empty records, empty headers): at kgo's default of 50
		// MiB a fetch, a GB. A fetch is bounded so that it decodes to at
		// most the bound (docs/design.md, Bad input).
		kgo.FetchMaxBytes(fetchMaxBytes(maxDecompress)),
	}
}

// decodedPerWireByte is the most memory kgo takes decoded, the fetched
// bytes included, per byte of an uncompressed batch: an empty record is 7
// bytes on the wire and recordCost decoded, an empty header 2 bytes and
// headerCost.
const decodedPerWireByte = recordCost/7 + 1

// fetchMaxBytes is the most bytes one fetch of the input takes, so that
// its uncompressed batches decode to at most maxDecompress: 5 MiB at the
// default bound, 20 partitions of fetchMaxPartitionBytes and some
// 35,000 records of 150 bytes (the stages' transactions take up to 50,000
// input records: a few fetches, which kgo makes one after another while
// the stage works). Kafka still returns a larger first batch whole.
func fetchMaxBytes(maxDecompress int) int32 {
	return int32(max(int64(maxDecompress)/decodedPerWireByte, 1))
}

// hooks are the runtime's side of one session's group membership. ready
// is closed once rt.sess and rt.adm hold that session: kgo may join the
// group and call AdjustFetchOffsetsFn before NewGroupTransactSession has
// returned, and the callback must pause the new client's partitions, not
// read a nil or the previous session's.
func (rt *Runtime) hooks(ready <-chan struct{}) session.Hooks {
	return session.Hooks{
		Assigned: func(ctx context.Context, offs map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
			select {
			case <-ready:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return rt.adjustOffsets(ctx, offs)
		},
		Revoked: rt.onRevoked,
	}
}

// newClient returns a client on the runtime's cluster connection (seed
// brokers, SASL, TLS) with opts. A login the brokers refuse it stops the
// stage (refusedLogin).
func (rt *Runtime) newClient(opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append(append(rt.loop.Conn(), kgo.WithHooks(refusedLogin{rt})), opts...)...)
}

// newListedClient is newClient seeded with the brokers the cluster lists
// now (listedBrokers), when the session's client can ask, for a client
// that lives only as long as a restore: a seed broker paused or cut off
// would make its first requests wait for the dial timeout (3 s, over
// TLS) or the request timeout (10 s) whenever they pick it, and so every
// restore of a failover,
// a promoted standby's too. Clients that live on (a standby's tail) keep
// the configured seeds, their way back to a cluster whose brokers all
// changed address.
func (rt *Runtime) newListedClient(opts ...kgo.Opt) (*kgo.Client, error) {
	if seeds := rt.listedBrokers(); len(seeds) > 0 {
		opts = append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, opts...)
	}
	return rt.newClient(opts...)
}

// listedBrokers returns the addresses of the brokers the cluster's
// metadata lists, asked of the brokers the current session's client has
// discovered, all at once (kafka.ListedBrokers), never of a seed; nil
// without a session or when none of them answers within
// kafka.ListedBrokerWait.
func (rt *Runtime) listedBrokers() []string {
	cl := rt.sb.client.Load()
	if cl == nil {
		return nil
	}
	out, _ := kafka.ListedBrokers(context.Background(), cl.DiscoveredBrokers(), kafka.ListedBrokerWait)
	return out
}

// refusedLogin stops the stage when a connection of a client of the
// runtime's own (a restore's or a standby's copy of the changelog, a
// listing of its ends) is refused its SASL user, password or mechanism:
// the password changed on the cluster, and the stage reads it at start
// only. Such a client sees nothing but polls that end empty, as while the
// brokers are down, so a restore would wait for ever; the session's own
// clients stop the stage on the same refusal (session.FetchError,
// Loop.InitProducerID).
type refusedLogin struct{ rt *Runtime }

func (h refusedLogin) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if rerr := h.rt.cfg.Kafka.Refused(err); err != nil && rerr != nil {
		h.rt.setFatal(fmt.Errorf("stream: %w; the password is read at start only: restart the stage with the current one", rerr))
	}
}

// copartitionedFirst orders the co-partitioned topics before InputTopic in
// every fetch request. Kafka fills a full fetch response (the first of a
// fetch session, which is the one a start depends on) in the order of its
// request; later, incremental fetches follow the session's own order,
// which moves a partition that returned data to its end. A poll drains
// the buffered fetch in that order, up to the
// records the transaction can still take: with InputTopic first, a stage
// starting on a backlog polled up to a whole fetch of InputTopic (16
// partitions of 256 KiB in bench aggregate, about 100,000 records) before
// its first records of a co-partitioned topic, and the aggregator with
// entitlements gated all of them (each written to the state and the
// changelog, and deleted again). The co-partitioned topics are small
// (usage.entitlements: entitlements and ticks), so putting them first
// starves nothing.
func copartitionedFirst(topics []string) kgo.PreferLagFn {
	return func(map[string]map[int32]int64, []string, map[string][]int32) ([]string, map[string][]int32) {
		return slices.Clone(topics), nil // kgo edits the slice it gets
	}
}

// fetchMaxPartitionBytes caps what one fetch returns of one partition (see
// sessionOptions). Kafka still returns a larger first batch whole.
const fetchMaxPartitionBytes = 256 << 10

// runSession opens one session, initialises its transactional ID and runs
// the loop of poll, process, punctuate, work and commit until ctx ends (it
// then commits the open transaction), a commit's outcome is unknown
// (session.ErrRestart) or a fatal error occurs. Leaving it closes the
// partitions and the session, which leaves the group.
func (rt *Runtime) runSession(ctx context.Context) (err error) {
	ready := make(chan struct{})
	inputs := rt.cfg.inputs()
	// One balancer for every stage: partition p of each input topic goes
	// to one member (docs/design.md, Exactly-once, "Co-partitioned
	// inputs"), and partitions follow warm copies (standby.go;
	// docs/operations.md, Standby replicas); eager, so a group that ran
	// kgo's cooperative-sticky balancer before needs every member stopped
	// first, or a new group name.
	opts := append(sessionOptions(rt.cfg.MaxDecompressBatchBytes, rt.decomp), kgo.Balancers(rt.Balancer(inputs...)))
	if len(rt.cfg.CopartitionedTopics) > 0 {
		opts = append(opts, kgo.ConsumePreferringLagFn(copartitionedFirst(rt.cfg.CopartitionedTopics)))
	}
	sess, err := rt.loop.Open(inputs, rt.hooks(ready), opts...)
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	rt.sess = sess
	defer rt.dropOffsetWaits(nil) // after the session closed (deferred below)
	rt.sb.setClient(sess.Client())
	rt.sb.forgetHeld()
	rt.adm = kadm.NewClient(sess.Client())
	defer rt.startWatchRetention(ctx, rt.adm)()
	defer rt.startWatchKeeps(ctx, rt.adm)()
	rt.joined.Store(true)
	defer rt.joined.Store(false)
	rt.active = map[int32]*activePart{}
	rt.skips = map[topicPartition]skipRewind{}
	rt.skipRebuild = false
	rt.resetTxn()
	rt.prodMu.Lock()
	rt.seqKnown = map[topicPartition]struct{}{} // a new client holds none yet
	rt.prodMu.Unlock()
	close(ready)
	defer func() {
		rt.txnEnd.stop()
		rt.closeAll()
		// Leaving the group revokes our partitions; an open transaction
		// was already ended (or the client is being abandoned after an
		// unknown outcome, in which case the next session's InitProducerID
		// aborts it).
		rt.loop.Close(sess)
	}()
	// Stopped before the session's client closes (deferred above); from
	// here on, kgo may be fetching the offsets of an assignment.
	probeCtx, stopProbe := context.WithCancel(ctx)
	defer stopProbe()
	go rt.probeOffsetWaits(probeCtx, sess.Client())
	// Stopped before the session's client closes (deferred above).
	redates, stopRedates := rt.startOwnerRedates(ctx, sess.Client())
	defer stopRedates()
	if err := rt.initProducerID(ctx, sess.Client()); err != nil {
		return err
	}
	rt.txnInit.Store(true)
	defer rt.txnInit.Store(false)
	rt.log.Info("stage started", zap.String("group", rt.cfg.Group), zap.Strings("inputs", inputs),
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
		if err := rt.handleFetches(ctx, fetches); err != nil {
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
		rt.redateIdle(redates)
		rt.cleanState()
	}
}

// initProducerID initialises the transactional ID now, not at the first
// produce (session.Loop.InitProducerID): a restore of our own partitions
// would otherwise wait on a previous incarnation's open transaction until
// the transaction timeout. A failure restarts the session
// (session.ErrRestart), but a missing ACL stops the stage.
func (rt *Runtime) initProducerID(ctx context.Context, cl *kgo.Client) error {
	if err := rt.loop.InitProducerID(ctx, cl); err != nil {
		if errors.Is(err, session.ErrRestart) && ctx.Err() == nil {
			// The coordinator answers CONCURRENT_TRANSACTIONS while it
			// cannot write the markers of the transaction it ends.
			rt.writeRefusalCause(ctx, kadm.NewClient(cl))
		}
		return fmt.Errorf("stream: %w", err)
	}
	return nil
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
				delete(rt.active, ev.p)
				rt.closeRevoked(ev.p, a.part, ev.gen)
			}
			rt.closedRevoked(ev)
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
			rt.active[ev.p] = &activePart{epoch: ev.epoch, part: ev.part, start: ev.start}
		}
	}
	rt.m.owned.Set(float64(len(rt.active)))
}

// closeAll closes the active partitions and cancels the restores.
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
	// A partition restored but not installed yet (the session ends before
	// its run loop handled the event: a failed InitProducerID, a fatal
	// error) is open too: close it, or what it published (its gauges)
	// outlives it.
	evs := rt.events
	rt.events = nil
	rt.mu.Unlock()
	for _, ev := range evs {
		switch ev.kind {
		case evRestored:
			ev.part.Close()
		case evRevoked:
			rt.closedRevoked(ev)
		}
	}
	// Nothing is kept past the session: its partitions were closed
	// without (keep.go).
	rt.kept.clear()
	rt.noteKept()
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
		rt.queueRevoke(p, epochSeq.Add(1))
		delete(rt.parts, p)
		rt.m.restoring.WithLabelValues(fmt.Sprint(p)).Set(0)
		rt.forgetHorizonAttempts(p)
	}
	rt.mu.Unlock()
	if ps := revoked[rt.cfg.InputTopic]; len(ps) > 0 {
		rt.dropOffsetWaits(ps)
	}
	rt.cleanup.due.Store(true)
	rt.notify()
}

var epochSeq atomic.Uint64

// adjustOffsets runs on kgo's group goroutine after the group's committed
// offsets for newly assigned partitions are fetched (stable, KIP-447). It
// pauses each partition, of every input topic, and starts its restore;
// the partition resumes when its state is restored and checked against
// the committed offset of each input topic. The balancer assigns partition
// p of every input topic together.
func (rt *Runtime) adjustOffsets(_ context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	inputs := rt.cfg.inputs()
	parts := offsets[rt.cfg.InputTopic]
	rt.offsetsArrived(slices.Collect(maps.Keys(parts)))
	if len(parts) == 0 {
		return offsets, nil
	}
	pause := map[string][]int32{}
	for _, t := range inputs {
		for p := range offsets[t] {
			pause[t] = append(pause[t], p)
		}
	}
	var reassigned []int32
	rt.mu.Lock()
	// Paused under mu, which orders it against a previous restore's
	// resume of the partition (restore).
	rt.sess.Client().PauseFetchPartitions(pause)
	for p := range parts {
		committed := make(map[string]int64, len(inputs))
		var fromStart []string // the topics of p the group has no committed offset of
		for _, t := range inputs {
			committed[t] = -1 // not assigned with p: the restore's check says so
			o, ok := offsets[t][p]
			if !ok {
				continue
			}
			if c := o.EpochOffset().Offset; c >= 0 {
				committed[t] = c
				continue
			}
			// The group has none. A first start reads from the earliest
			// offset (docs/design.md, Exactly-once, 6). kgo passes the
			// reset offset here, and NoResetOffset means the end of the
			// partition, which would skip existing input. The restore lists
			// that offset too, and the partition's first transaction
			// commits it (fenceFirst in work.go).
			offsets[t][p] = kgo.NoResetOffset().AtStart()
			fromStart = append(fromStart, t)
		}
		old, held := rt.parts[p]
		if held && old.cancel != nil {
			old.cancel()
		}
		ctx, cancel := context.WithCancel(context.Background())
		ps := &partState{epoch: epochSeq.Add(1), committed: committed, cancel: cancel, marker: -1}
		rt.parts[p] = ps
		if held {
			// Assigned anew without its revoke (kgo's transact session
			// passes on only the first revoke after a transaction ended):
			// the partition's old instance is closed like a revoked one
			// before the run loop punctuates or works again, and a
			// transaction that wrote to it does not commit (end).
			rt.queueRevoke(p, ps.epoch)
			reassigned = append(reassigned, p)
			rt.forgetHorizonAttempts(p)
		}
		rt.restores.Add(1)
		rt.addWriter(p)
		go func() {
			defer rt.restores.Done()
			defer rt.doneWriter(p)
			defer func() {
				if r := recover(); r != nil {
					c, ok := r.(fault.Crash)
					if !ok {
						panic(r)
					}
					rt.setFatal(fmt.Errorf("stream: %w at %s", ErrCrashed, c.Point))
				}
			}()
			rt.restore(ctx, rt.sess, p, ps.epoch, committed, fromStart)
		}()
	}
	rt.mu.Unlock()
	if len(reassigned) > 0 {
		slices.Sort(reassigned)
		rt.log.Info("partitions assigned anew without their revoke (not passed on): their old instances are closed and restored again", zap.Int32s("partitions", reassigned))
		rt.notify()
	}
	return offsets, nil
}
