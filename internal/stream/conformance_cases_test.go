package stream

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/testenv"
)

// conformanceCases walk the crash windows that the runtime owns
// (docs/design.md, Exactly-once, "Crash windows"; the aggregator's and the
// sink's are theirs). Each ends with one instance owning every partition
// and suite.verify counting.
var conformanceCases = []struct {
	name string
	// changelog holds the changelog topic's configs (nil: defaults).
	changelog map[string]*string
	// kfake: the case needs kfake's request controls or compaction, so it
	// does not run on a real broker.
	kfake bool
	run   func(t *testing.T, s *suite)
}{
	// "stage, before commit": outputs and changelog produced, the
	// transaction not ended. The restart aborts it and re-processes.
	{name: "CrashBeforeCommit", run: crashAt(fault.BeforeCommit)},
	// "stage, after commit, before the Pebble apply": the changelog is
	// ahead of Pebble; the restart replays its tail.
	{name: "CrashAfterCommitBeforeApply", run: crashAt(fault.AfterCommit)},
	// "stage, during the Pebble apply": the batch is atomic, so as above.
	{name: "CrashDuringApply", run: crashAt(fault.DuringApply)},
	// Pebble updated, before the next poll: the restart replays nothing.
	{name: "CrashAfterApply", run: crashAt(fault.AfterApply)},
	{name: "PartitionMoved", run: partitionMoved},
	// A rebalance while a transaction is open aborts it; the instance
	// keeps a partition and re-processes its input from the committed
	// offset, its overlay and its processor's per-transaction memory
	// (Aborter) discarded.
	{name: "RebalanceMidTransaction", run: rebalanceMidTransaction},
	{name: "PreviousOwnerInFlightCommits", run: previousOwnerInFlightCommits},
	{name: "ZombieAfterRebalance", kfake: true, run: zombieAfterRebalance},
	{name: "CommitOutcomeUnknownCommitted", kfake: true, run: commitOutcomeUnknown(true)},
	{name: "CommitOutcomeUnknownAborted", kfake: true, run: commitOutcomeUnknown(false)},
	{name: "RestoreHorizon", kfake: true, run: restoreHorizonCase,
		changelog: map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr(horizonCaseRetention())}},
}

// horizonCaseRetention is the changelog's delete.retention.ms in
// restoreHorizonCase: short, so that compaction removes the tombstone
// soon, but a's restore of a dozen records must fit nine tenths of it,
// which under the race detector on a loaded machine took up to 700 ms.
func horizonCaseRetention() string {
	if raceDetector {
		return "2000"
	}
	return "250"
}

// TestConformance runs every case of the suite, each in its own world on
// kfake, in parallel. TestConformancePreviousOwnerInFlightAborts is the
// one case that arms a process-wide fault point, so it runs alone.
func TestConformance(t *testing.T) {
	runConformance(t, nil)
}

// TestRealConformance runs the cases that need no kfake control on the
// real broker of METERLINE_TEST_KAFKA.
func TestRealConformance(t *testing.T) {
	runConformance(t, testenv.RealKafka(t))
}

func runConformance(t *testing.T, brokers []string) {
	for _, c := range conformanceCases {
		if c.kfake && brokers != nil {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newSuite(t, brokers, c.changelog))
		})
		// The same window with a second input topic co-partitioned with
		// the first (Config.CopartitionedTopics): an offset per topic in
		// the state, committed in the same transactions.
		t.Run(c.name+"TwoTopics", func(t *testing.T) {
			t.Parallel()
			c.run(t, newSuite(t, brokers, c.changelog, true))
		})
	}
}

// crashAt kills an instance in-process (Runtime.CrashAt: no transaction
// ended, nothing applied) at point, in the first transaction of new input,
// restarts it with the same transactional ID on its state, and counts.
func crashAt(point string) func(t *testing.T, s *suite) {
	return func(t *testing.T, s *suite) {
		fs := vfs.NewMem()
		a := s.start("a", fs)
		s.send(20)
		s.caughtUp()
		a.rt.CrashAt(point)
		s.send(20)
		a.crashed(point)

		a = s.start("a", fs)
		s.finish(a, fs)
		if point == fault.AfterCommit || point == fault.DuringApply {
			// The committed transaction reached Pebble only through the
			// replay of the changelog's tail.
			if n := a.metric("meterline_stream_restore_records_total"); n == 0 {
				t.Errorf("the restart after a crash at %s replayed no changelog record", point)
			}
		}
	}
}

// partitionMoved: "partition moved to another instance — the new owner
// has no local state, or old state". b joins a and takes one partition
// (no state), then both when a leaves (no state for the second); a comes
// back on its old state of both and replays the tails b wrote.
func partitionMoved(t *testing.T, s *suite) {
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	a := s.start("a", fsA)
	s.send(20)
	s.caughtUp()
	b := s.start("b", fsB)
	s.waitFor("a and b to own one partition each", func() bool { return a.owned() == 1 && b.owned() == 1 })
	s.send(20)
	s.caughtUp()
	a.shutdown()
	s.waitFor("b to own both partitions", func() bool { return b.owned() == 2 })
	s.send(20)
	s.caughtUp()
	if n := b.metric("meterline_stream_restores_total", "kind", "full", "reason", reasonNoState); n != 2 {
		t.Errorf("b restored %v partitions in full without state, want 2", n)
	}
	b.shutdown()

	a = s.start("a", fsA)
	s.finish(a, fsA)
	if tail, full := a.metric("meterline_stream_restores_total", "kind", "tail"), a.metric("meterline_stream_restores_total", "kind", "full"); tail < 2 || full != 0 {
		t.Errorf("a, back on its old state, restored %v partitions from their tails and %v in full; want both from their tails", tail, full)
	}
}

// rebalanceMidTransaction: a stalls in the middle of a transaction that
// holds input of both partitions; b joins and takes one of them, a keeps
// the other. When a wakes its transaction must abort, and what it counted
// in it must be forgotten — the overlay, and its processor's cached counts
// (Abort) — or the input re-processed from the committed offset counts
// twice.
func rebalanceMidTransaction(t *testing.T, s *suite) {
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	stalled, wake := make(chan struct{}), make(chan struct{})
	var stall, woken sync.Once
	t.Cleanup(func() { woken.Do(func() { close(wake) }) })
	a := s.start("a", fsA, func(_ *Config, p *countProc) {
		p.hold = func(id string) {
			if id == "i0020" || id == "i0021" { // one per partition
				stall.Do(func() { close(stalled) })
				<-wake
			}
		}
	})
	s.send(20)
	s.caughtUp()
	s.send(20)
	<-stalled
	b := s.start("b", fsB)
	s.waitFor("b to take one partition from a", func() bool { return b.owned() == 1 })
	woken.Do(func() { close(wake) })
	s.waitFor("a's open transaction to be refused", func() bool {
		return a.metric("meterline_stream_commits_refused_total") >= 1
	})
	s.caughtUp()
	s.finish(a, fsA, b)
}

// previousOwnerInFlightCommits: "previous owner's transaction still in
// flight at assignment". A previous owner's transaction on changelog
// partition 0 (state not tied to input, as a punctuation writes) is open
// when b restores: b waits for it, and takes its outcome, a commit.
func previousOwnerInFlightCommits(t *testing.T, s *suite) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prev, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...), kgo.TransactionalID(s.group+"-previous"),
		kgo.TransactionTimeout(time.Minute), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prev.Close()
	if err := prev.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	tick := &kgo.Record{Topic: s.changelog, Partition: 0, Key: []byte("tick"), Value: []byte("1")}
	if err := prev.ProduceSync(ctx, tick).FirstErr(); err != nil {
		t.Fatal(err)
	}

	fs := vfs.NewMem()
	b := s.start("b", fs)
	s.send(20)
	s.waitFor("b to restore partition 0 up to the open transaction", func() bool {
		rs := partitionsRestoring(b.rt)
		return len(rs) == 1 && rs[0] == 0 && b.owned() == 1
	})
	if err := b.rt.Ready(); err == nil {
		t.Fatal("b is ready while the previous owner's transaction is open")
	}
	if err := prev.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	s.waitFor("b's restore to end once the transaction committed", func() bool { return b.rt.Ready() == nil })
	if v, ok, err := b.rt.Store().Get(0, []byte("tick")); err != nil || !ok || string(v) != "1" {
		t.Errorf("b's state of partition 0 has tick = %q, %v (%v); want the committed 1", v, ok, err)
	}
	s.finish(b, fs)
}

// TestConformancePreviousOwnerInFlightAborts: "previous owner's
// transaction still in flight at assignment", the owner an instance killed
// before its commit, with its outputs and changelog records on the
// broker. b restores up to the high watermark, which includes them, and
// waits; when the previous owner's transactional ID is initialised again
// (its restart), the transaction aborts and b goes on without it.
//
// It arms fault.BeforeCommit process-wide (to stop only once the records
// reached the broker), so it does not run in parallel.
func TestConformancePreviousOwnerInFlightAborts(t *testing.T) {
	previousOwnerInFlightAborts(t, newSuite(t, nil, nil))
}

// TestRealConformancePreviousOwnerInFlightAborts is the same on the real
// broker of METERLINE_TEST_KAFKA.
func TestRealConformancePreviousOwnerInFlightAborts(t *testing.T) {
	previousOwnerInFlightAborts(t, newSuite(t, testenv.RealKafka(t), nil))
}

func previousOwnerInFlightAborts(t *testing.T, s *suite) {
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	a := s.start("a", fsA)
	s.send(20)
	s.caughtUp()

	before := sum(s.changelogEnd())
	landed := make(chan bool, 1)
	fault.SetHandler(func(point string) {
		ok := false
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if end, err := s.listChangelogEnd(); err == nil && sum(end) > before {
				ok = true
				break
			}
		}
		landed <- ok
		panic(fault.Crash{Point: point})
	})
	t.Cleanup(func() { fault.SetHandler(nil); _ = fault.Arm("") })
	if err := fault.Arm(fault.BeforeCommit); err != nil {
		t.Fatal(err)
	}
	s.send(20)
	a.crashed(fault.BeforeCommit)
	if !<-landed {
		t.Fatal("a's changelog records never reached the broker before its crash")
	}
	txnID := s.group + "-a"
	if st := s.txnState(txnID); st != "Ongoing" {
		t.Fatalf("a's transaction is %q after its crash, want Ongoing", st)
	}

	b := s.start("b", fsB)
	s.waitFor("b to restore up to a's open transaction", func() bool { return len(partitionsRestoring(b.rt)) > 0 })
	if st := s.txnState(txnID); st != "Ongoing" {
		t.Fatalf("a's transaction is %q, want Ongoing", st)
	}
	if err := b.rt.Ready(); err == nil {
		t.Fatal("b is ready while a's transaction is open")
	}

	// a's restart: initialising its transactional ID aborts what was open.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	again, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...), kgo.TransactionalID(txnID))
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if _, _, err := again.ProducerID(ctx); err != nil {
		t.Fatal(err)
	}
	s.waitFor("b's restore to end once a's transaction aborted", func() bool { return b.rt.Ready() == nil })
	s.finish(b, fsB)
}

// zombieAfterRebalance: "zombie instance after a rebalance — its next
// offset commit is fenced by the generation". a stalls in the middle of a
// transaction and its heartbeats stop, as a paused process's would; the
// group moves on to b, which processes the same input. When a wakes, its
// transaction must not commit; it rejoins, restores, and finally owns
// everything again.
func zombieAfterRebalance(t *testing.T, s *suite) {
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	stalled, wake := make(chan struct{}), make(chan struct{})
	var once sync.Once
	a := s.start("a", fsA, func(_ *Config, p *countProc) {
		p.hold = func(id string) {
			if id == "i0020" {
				once.Do(func() { close(stalled); <-wake })
			}
		}
	})
	s.send(20)
	s.caughtUp()
	committed := a.metric("meterline_stream_transactions_total", "outcome", "committed")
	s.send(20)
	<-stalled

	// Hold a's heartbeats until it wakes: it does not learn that the group
	// moved on.
	woken := s.holdHeartbeats(s.onlyMember(), wake)
	defer func() {
		if !woken() {
			close(wake)
		}
	}()

	b := s.start("b", fsB)
	s.waitFor("b to own both partitions", func() bool { return b.owned() == 2 })
	s.caughtUp() // b processed what a holds in its open transaction

	close(wake)
	s.waitFor("a's commit to be refused", func() bool {
		return a.metric("meterline_stream_commits_refused_total") >= 1
	})
	if n := a.metric("meterline_stream_transactions_total", "outcome", "committed"); n != committed {
		t.Errorf("a committed %v transactions, want only the %v before it stalled", n, committed)
	}
	s.send(20)
	s.caughtUp()
	s.finish(a, fsA, b)
}

// holdHeartbeats holds the heartbeats of group member at the broker until
// wake is closed, as a paused process's would stop: the member does not
// learn that the group moved on. It returns whether wake is closed.
func (s *suite) holdHeartbeats(member string, wake <-chan struct{}) (woken func() bool) {
	woken = closed(wake)
	s.cluster.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		s.cluster.KeepControl()
		if req.(*kmsg.HeartbeatRequest).MemberID == member && !woken() {
			s.cluster.SleepControl(func() { <-wake })
		}
		return nil, nil, false
	})
	return woken
}

// closed returns whether ch is closed.
func closed(ch <-chan struct{}) func() bool {
	return func() bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
}

// commitOutcomeUnknown: "commit outcome unknown — re-initialise, rejoin,
// restore". Ending a transaction fails on the connection (and on its
// retry), after the broker committed it (committed) or before it saw it.
// The instance rebuilds its session with the same transactional ID and
// restores; either way each input is counted once.
func commitOutcomeUnknown(committed bool) func(t *testing.T, s *suite) {
	return func(t *testing.T, s *suite) {
		fs := vfs.NewMem()
		txnID := s.group + "-a"
		side, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...))
		if err != nil {
			t.Fatal(err)
		}
		defer side.Close()

		var armed, sideEnd, hit atomic.Bool
		var ( // the control runs on kfake's goroutine, serially except while it sleeps
			pid   int64
			epoch int16
		)
		s.cluster.ControlKey(int16(kmsg.EndTxn), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
			s.cluster.KeepControl()
			req := kreq.(*kmsg.EndTxnRequest)
			if sideEnd.Load() || req.TransactionalID != txnID || !armed.Load() {
				return nil, nil, false
			}
			if !hit.Load() {
				if !req.Commit {
					return nil, nil, false
				}
				pid, epoch = req.ProducerID, req.ProducerEpoch
				hit.Store(true)
				if committed {
					s.cluster.SleepControl(func() {
						sideEnd.Store(true)
						defer sideEnd.Store(false)
						end := kmsg.NewPtrEndTxnRequest()
						end.TransactionalID, end.ProducerID, end.ProducerEpoch, end.Commit = txnID, pid, epoch, true
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						defer cancel()
						if resp, err := end.RequestWith(ctx, side); err != nil || resp.ErrorCode != 0 {
							t.Errorf("committing a's transaction on the side: %v (code %d)", err, resp.ErrorCode)
						}
					})
				}
				return nil, errors.New("connection lost"), true
			}
			if req.ProducerID == pid && req.ProducerEpoch == epoch { // kgo's retry
				return nil, errors.New("connection lost"), true
			}
			return nil, nil, false
		})

		a := s.start("a", fs, func(c *Config, _ *countProc) {
			// One retry, soon: the connection is lost again.
			c.ClientOptions = []kgo.Opt{kgo.RequestRetries(1), kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond })}
		})
		s.send(20)
		s.caughtUp()
		armed.Store(true)
		s.send(20)
		s.caughtUp()
		s.finish(a, fs)
		if !hit.Load() {
			t.Fatal("no transaction of a was ended while armed")
		}
		if n := a.metric("meterline_stream_transactions_total", "outcome", "unknown"); n < 1 {
			t.Error("a counted no transaction with an unknown outcome")
		}
		if n := a.metric("meterline_stream_session_restarts_total", "reason", "commit_unknown"); n < 1 {
			t.Error("a did not rebuild its session for commit_unknown after the unknown outcome")
		}
		if committed && a.metric("meterline_stream_restore_records_total") == 0 {
			t.Error("a replayed no changelog record after its transaction committed unbeknown to it")
		}
	}
}

// restoreHorizonCase: docs/design.md, Exactly-once, 4. a counts bucket b0
// of partition 0; the partition moves to b, which resets b0 (a tombstone)
// and goes on; the changelog is compacted and the tombstone, older than
// delete.retention.ms, removed. a comes back: a replay of the tail from its
// checkpoint would keep its stale b0, so it must restore in full, and count
// b0 from 1.
func restoreHorizonCase(t *testing.T, s *suite) {
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	a := s.start("a", fsA)
	s.send(20)
	s.caughtUp()
	a.shutdown()

	b := s.start("b", fsB)
	s.sendTo(0, "b0", "!reset")
	s.caughtUp()
	s.sendTo(0, "b1", "later") // a later transaction: compaction keeps the last batch
	s.caughtUp()
	b.shutdown()
	s.waitFor("compaction to remove bucket b0 from changelog partition 0", func() bool {
		s.cluster.Compact()
		for _, r := range s.readChangelog() {
			if r.Partition == 0 && string(r.Key) == "b0" {
				return false
			}
		}
		return true
	})

	a = s.start("a", fsA)
	s.sendTo(0, "b0", "after")
	s.finish(a, fsA)
	if pl, ok := a.rt.lastRestore(0); !ok || !pl.Full || pl.Reason != reasonHorizon {
		t.Errorf("a restored partition 0 as %+v, want in full past the horizon", pl)
	}
}
