package crashtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/testenv"
)

// newRand returns a seeded generator and logs the seed.
func newRand(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// growingFeed returns a feeder function that, every round, sends `fresh`
// new identities starting at *next and `copies` copies of identities
// already sent; it stops introducing new ones at limit.
func growingFeed(r *rand.Rand, next *int, limit, fresh, copies int) func(int) []int {
	return func(int) []int {
		var ids []int
		for j := 0; j < fresh && *next < limit; j++ {
			ids = append(ids, *next)
			*next++
		}
		for j := 0; j < copies && *next > 0; j++ {
			ids = append(ids, r.IntN(*next))
		}
		return ids
	}
}

// TestRealDedupCrashWindows kills `meterline dedup` at each crash window
// (docs/design.md, Exactly-once, "Crash windows"; the fault point SIGKILLs
// the process on its 3rd hit, so earlier transactions committed) while
// events and copies flow; restarts it with the same instance ID and state;
// feeds more copies of the same events and new ones; and asserts
// exactly-once. Where the crash leaves the changelog ahead of Pebble
// (after-commit, during-apply), the restart must have replayed the
// changelog tail.
func TestRealDedupCrashWindows(t *testing.T) {
	cases := []struct {
		point string
		// tail: the crash leaves committed changelog records that Pebble
		// lacks, so the restart must replay at least one.
		tail bool
	}{
		{fault.BeforeCommit, false},
		{fault.AfterCommit, true},
		{fault.DuringApply, true},
		{fault.AfterApply, false},
	}
	for _, tc := range cases {
		t.Run(tc.point, func(t *testing.T) {
			s := newSuite(t)
			rng := newRand(t)
			stateDir := filepath.Join(s.Dir, "state")

			// A clean first run builds state and stops with SIGTERM, which
			// closes Pebble: all its checkpoints are on disk. (The store
			// syncs its WAL at most once a second, so a SIGKILL loses the
			// batches since the last sync; that is allowed — Pebble is a
			// cache of the changelog — but then a restart replays from
			// further back: TestKillRestoresTail.)
			a0 := s.start("a", stateDir, opts{})
			s.send(seq(0, 200))
			s.send(seq(0, 50))
			s.waitCaughtUp(a0)
			a0.Stop(t)

			// Input before the start, so the first transactions carry
			// events; then a steady flow of new events and copies.
			s.send(seq(200, 300))
			a := s.start("a", stateDir, opts{fault: tc.point + "@3"})
			next := 300
			f := s.feed(20*time.Millisecond, growingFeed(rng, &next, 1000, 8, 4))
			a.ExpectFaultKill(t, tc.point, exitTimeout)
			f.Stop()
			copies, ids := s.sentCounts()
			t.Logf("before the crash: %d copies of %d identities; changelog partitions with an open transaction: %v",
				copies, ids, s.inFlight(s.Names.DedupChangelogTopic()))

			// Restart: same instance ID (so the same transactional ID) and
			// state, no fault. Feed every identity again, new ones, and
			// copies of those.
			a2 := s.start("a", stateDir, opts{})
			s.send(seq(0, next))
			s.send(seq(next, next+200))
			s.send(seq(next, next+200))
			s.waitCaughtUp(a2)
			s.checkExactlyOnce()

			rec, restores := a2.Replayed()
			var slowest float64
			for _, l := range a2.Lines(msgRestored) {
				if took, _ := l.Fields["took"].(float64); took > slowest {
					slowest = took
				}
			}
			var assigned time.Duration
			if ls := a2.Lines(msgRestoring); len(ls) > 0 {
				assigned = ls[0].TS.Sub(a2.Started())
			}
			t.Logf("restart restored %d partitions %s after it started, replaying %d changelog records; slowest restore %.3fs",
				restores, assigned.Round(time.Millisecond), rec, slowest)
			if restores < partitions {
				t.Errorf("restart logged %d %q lines, want at least %d", restores, msgRestored, partitions)
			}
			hadState := 0
			for _, l := range a2.Lines(msgRestoring) {
				if b, _ := l.Fields["had_state"].(bool); b {
					hadState++
				}
			}
			if hadState == 0 {
				t.Errorf("restart found no local state; the first run stopped cleanly and left its checkpoints")
			}
			if tc.tail && rec == 0 {
				t.Errorf("crash at %s leaves the changelog ahead of Pebble, but the restart replayed no changelog record", tc.point)
			}
		})
	}
}

// TestRealDedupCrashDuringRestore builds state, stops cleanly, wipes the
// state, and restarts with stream.during-restore armed on its 3rd hit (a
// hit follows each Pebble batch of replayed changelog, so two partitions'
// batches are written): the process must die while replaying the
// changelog. A second restart must finish the restore — from the
// checkpoints the interrupted one left, where they survived the SIGKILL
// (the store syncs its WAL at most once a second) — and stay exactly-once.
func TestRealDedupCrashDuringRestore(t *testing.T) {
	s := newSuite(t)
	stateDir := filepath.Join(s.Dir, "state")
	const n = 20000 // about 5,000 identities per partition: at least one Pebble batch of replay per partition

	a := s.start("a", stateDir, opts{})
	s.send(seq(0, n))
	s.send(seq(0, n/10))
	s.waitCaughtUp(a)
	a.Stop(t)
	if err := os.RemoveAll(filepath.Join(stateDir, "dedup-a")); err != nil {
		t.Fatal(err)
	}

	a2 := s.start("a", stateDir, opts{fault: fault.DuringRestore + "@3"})
	a2.ExpectFaultKill(t, fault.DuringRestore, exitTimeout)
	if len(a2.Lines(msgRestoring)) == 0 {
		t.Fatalf("%s died at %s without logging %q", a2.Name(), fault.DuringRestore, msgRestoring)
	}
	if _, restored := a2.Replayed(); restored >= partitions {
		t.Fatalf("%s restored all %d partitions before dying; it must die while replaying", a2.Name(), restored)
	}

	a3 := s.start("a", stateDir, opts{})
	s.send(seq(0, n))
	s.send(seq(n, n+500))
	s.waitCaughtUp(a3)
	s.checkExactlyOnce()
	rec, restores := a3.Replayed()
	resumed := 0
	for _, l := range a3.Lines(msgRestoring) {
		if l.Int("from") > 0 {
			resumed++
		}
	}
	// Depending on which Pebble batches of the interrupted restore
	// survived the SIGKILL, the final restart replays all, part or none of
	// the changelog; the copies above tell whether the state is whole.
	t.Logf("final restart: %d partition restores, %d changelog records replayed, %d resumed from a checkpoint", restores, rec, resumed)
	if restores < partitions {
		t.Errorf("final restart logged %d %q lines, want %d", restores, msgRestored, partitions)
	}
}

// TestRealDedupRestoreWaitsForInFlightTransaction: instance a is killed at
// stream.before-commit, leaving its transaction open (never ended; a long
// transaction timeout keeps it open); instance b (another instance ID and
// state dir) takes over once a's session times out and restores while
// that transaction is still open, so its restore must wait until the
// broker aborts it at the transaction timeout (docs/design.md,
// Exactly-once, "Crash windows": "partition moved; previous owner's
// transaction in flight"). Copies fed meanwhile must stay exactly-once: no
// copy accepted twice, none lost.
//
// a's changelog records are produced asynchronously just before the fault
// point, so whether they reached the broker before the SIGKILL is left to
// chance (about 1 run in 8 here); usually only a's outputs are in flight.
// So that the changelog always holds an open transaction when b restores,
// the test opens one more, as a previous owner stuck between flushing its
// changelog and ending its transaction would leave it: tombstones for
// state keys a committed, on every changelog partition, never ended, with
// the same long timeout. Were b's restore to apply them, those identities
// would be forgotten and their next copies accepted a second time.
func TestRealDedupRestoreWaitsForInFlightTransaction(t *testing.T) {
	s := newSuite(t)
	rng := newRand(t)
	const txnTimeout = 12 * time.Second

	s.send(seq(0, 200))
	a := s.start("a", filepath.Join(s.Dir, "state-a"), opts{fault: fault.BeforeCommit + "@3", transactionTimeout: txnTimeout})
	next := 200
	f := s.feed(20*time.Millisecond, growingFeed(rng, &next, 1000, 8, 4))
	a.ExpectFaultKill(t, fault.BeforeCommit, exitTimeout)
	killed := time.Now()
	f.Stop()
	t.Logf("a's transaction left open: on the changelog %v, on usage.deduped %v",
		s.inFlight(s.Names.DedupChangelogTopic()), s.inFlight(s.Names.DedupedTopic()))

	tombstones := s.openPreviousOwnerTxn(txnTimeout)
	opened := time.Now()
	open := s.inFlight(s.Names.DedupChangelogTopic())
	if len(open) != partitions {
		t.Fatalf("changelog partitions with an open transaction: %v, want all %d", open, partitions)
	}
	t.Logf("open transaction with %d tombstones on the changelog: %v", tombstones, open)

	// Watch the broker abort the open transactions.
	resolved := make(chan time.Time, 1)
	go func() {
		for {
			now := time.Now()
			still := s.inFlight(s.Names.DedupChangelogTopic())
			done := true
			for p, o := range open {
				// Resolved when the last stable offset passes the high
				// watermark seen with everything open (a transaction of b
				// may be open past it).
				if st, ok := still[p]; ok && st.lso < o.hw {
					done = false
				}
			}
			if done || time.Since(opened) > 3*txnTimeout {
				resolved <- now
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()

	b := s.start("b", filepath.Join(s.Dir, "state-b"), opts{})
	f = s.feed(20*time.Millisecond, growingFeed(rng, &next, next+400, 4, 8))
	time.Sleep(2 * time.Second)
	f.Stop()
	s.send(seq(0, next))
	s.waitCaughtUp(b)
	s.checkExactlyOnce()

	aborted := <-resolved
	t.Logf("the broker aborted the open transactions %s after the kill", aborted.Sub(killed).Round(time.Millisecond))
	if aborted.Sub(opened) > 2*txnTimeout {
		t.Fatalf("transactions still open %s after the last was opened", aborted.Sub(opened))
	}
	starts := map[int32]testenv.LogLine{}
	for _, l := range b.Lines(msgRestoring) {
		if _, ok := starts[int32(l.Int("partition"))]; !ok {
			starts[int32(l.Int("partition"))] = l
		}
	}
	ends := map[int32]testenv.LogLine{}
	for _, l := range b.Lines(msgRestored) {
		if _, ok := ends[int32(l.Int("partition"))]; !ok {
			ends[int32(l.Int("partition"))] = l
		}
	}
	for p, o := range open {
		st, ok1 := starts[p]
		end, ok2 := ends[p]
		if !ok1 || !ok2 {
			t.Errorf("partition %d: b logged no complete restore", p)
			continue
		}
		t.Logf("b restored partition %d from %d to %d (open transaction: last stable offset %d, high watermark %d): started %s after the kill, ended %s after, %d changelog records",
			p, st.Int("from"), st.Int("to"), o.lso, o.hw, st.TS.Sub(killed).Round(time.Millisecond), end.TS.Sub(killed).Round(time.Millisecond), end.Int("changelog_records"))
		if !st.TS.Before(aborted) {
			t.Errorf("partition %d: b's restore started only after the transaction was aborted; the race was not exercised", p)
			continue
		}
		if st.Int("to") < o.hw {
			t.Errorf("partition %d: b restored up to %d, below the high watermark %d that included the open transaction", p, st.Int("to"), o.hw)
		}
		// The log's clock has millisecond resolution and the watcher
		// polls every 50 ms.
		if end.TS.Before(aborted.Add(-100 * time.Millisecond)) {
			t.Errorf("partition %d: b's restore ended %s before the transaction was aborted: it did not wait for the outcome",
				p, aborted.Sub(end.TS).Round(time.Millisecond))
		}
	}
}

// openPreviousOwnerTxn opens a transaction on the changelog that tombstones
// every state key committed exactly once (the identities, in dedup), on
// every partition, flushes it and leaves it open; the broker aborts it
// after timeout. It returns the number of tombstones.
func (s *suite) openPreviousOwnerTxn(timeout time.Duration) int {
	s.t.Helper()
	topic := s.Names.DedupChangelogTopic()
	seen := map[int32]map[string]int{}
	// read_uncommitted: a read_committed read would wait for a's
	// transaction, which may be open on the changelog too. A key of a's
	// aborted records counted here is harmless to tombstone.
	for _, r := range s.readUncommitted(topic) {
		if seen[r.Partition] == nil {
			seen[r.Partition] = map[string]int{}
		}
		seen[r.Partition][string(r.Key)]++
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Brokers...), kgo.TransactionalID(s.Names.Prefix+"previous-owner"),
		kgo.TransactionTimeout(timeout), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(cl.Close)
	if err := cl.BeginTransaction(); err != nil {
		s.t.Fatal(err)
	}
	var recs []*kgo.Record
	for p, keys := range seen {
		for k, n := range keys {
			if n == 1 {
				recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Key: []byte(k)})
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		s.t.Fatal(err)
	}
	return len(recs)
}

// readUncommitted reads every data record of the topic, read_uncommitted,
// up to the high watermarks read now.
func (s *suite) readUncommitted(topic string) []*kgo.Record {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acl, err := kgo.NewClient(kgo.SeedBrokers(s.Brokers...))
	if err != nil {
		s.t.Fatal(err)
	}
	defer acl.Close()
	ends, err := kadm.NewClient(acl).ListEndOffsets(ctx, topic)
	if err != nil {
		s.t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.KeepControlRecords()) // the last offset below the high watermark may be a marker
	if err != nil {
		s.t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			s.t.Fatalf("reading %s: %v (still waiting on partitions→end %v)", topic, ctx.Err(), want)
		}
		fs.EachRecord(func(r *kgo.Record) {
			end, ok := want[r.Partition]
			if !ok {
				return
			}
			if r.Offset < end && !r.Attrs.IsControl() {
				out = append(out, r)
			}
			if r.Offset+1 >= end {
				delete(want, r.Partition)
			}
		})
	}
	return out
}

// inFlight is a partition whose last stable offset is below its high
// watermark: a transaction is open on it.
type inFlight struct{ lso, hw int64 }

func (o inFlight) String() string { return fmt.Sprintf("{lso %d hw %d}", o.lso, o.hw) }

// inFlight returns the topic's partitions with an open transaction.
func (s *suite) inFlight(topic string) map[int32]inFlight {
	s.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Brokers...))
	if err != nil {
		s.t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lso, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		s.t.Fatal(err)
	}
	hw, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		s.t.Fatal(err)
	}
	out := map[int32]inFlight{}
	hw.Each(func(h kadm.ListedOffset) {
		if l, ok := lso.Lookup(topic, h.Partition); ok && l.Err == nil && h.Err == nil && l.Offset < h.Offset {
			out[h.Partition] = inFlight{lso: l.Offset, hw: h.Offset}
		}
	})
	return out
}

// TestRealDedupRebalance runs three instances with separate state dirs and
// starts and stops them (SIGTERM and SIGKILL, with restarts) for about 20 s
// while a producer keeps sending copies of a fixed set of identities (new
// ones of the set keep coming until the end); then lets the survivors
// finish. Exactly-once must hold, and instances that
// took partitions over must have restored them from the changelog.
func TestRealDedupRebalance(t *testing.T) {
	s := newSuite(t)
	rng := newRand(t)
	// A fixed set of identities, introduced a few at a time over the whole
	// run, so that the transactions every rebalance aborts hold first
	// copies too, not only copies of identities already committed.
	const ids = 4000
	dirs := map[string]string{}
	for _, id := range []string{"a", "b", "c"} {
		dirs[id] = filepath.Join(s.Dir, "state-"+id)
	}
	next := 0
	f := s.feed(20*time.Millisecond, growingFeed(rng, &next, ids, 4, 8))
	a := s.start("a", dirs["a"], opts{})
	first := a
	step := func(d time.Duration) { time.Sleep(d) }
	step(2 * time.Second)
	b := s.start("b", dirs["b"], opts{})
	step(2 * time.Second)
	c := s.start("c", dirs["c"], opts{})
	step(3 * time.Second)
	b.Kill(t)
	step(2 * time.Second)
	a.Stop(t)
	step(2 * time.Second)
	b = s.start("b", dirs["b"], opts{})
	step(2 * time.Second)
	a = s.start("a", dirs["a"], opts{})
	step(2 * time.Second)
	c.Kill(t)
	step(2 * time.Second)
	c = s.start("c", dirs["c"], opts{})
	step(2 * time.Second)
	b.Stop(t)
	step(1 * time.Second)
	f.Stop()
	s.waitCaughtUp(a, c)
	s.checkExactlyOnce()

	var took int64
	for _, p := range s.Procs() {
		if p == first {
			continue
		}
		rec, restores := p.Replayed()
		t.Logf("%s: %d partition restores, %d changelog records replayed", p.Name(), restores, rec)
		took += rec
	}
	if took == 0 {
		t.Errorf("no instance that took partitions over replayed any changelog record")
	}
}

// TestRealDedupZombie freezes an instance with SIGSTOP while input flows,
// for longer than the session and transaction timeouts, so another
// instance takes its partitions over; then thaws it. The zombie's
// commits must be refused, it must keep running (waitCaughtUp fails if
// it exits), and exactly-once must hold.
func TestRealDedupZombie(t *testing.T) {
	s := newSuite(t)
	rng := newRand(t)
	s.send(seq(0, 200))
	next := 200
	f := s.feed(20*time.Millisecond, growingFeed(rng, &next, 10000, 4, 6))
	z := s.start("z", filepath.Join(s.Dir, "state-z"), opts{})
	time.Sleep(4 * time.Second)
	if _, restores := z.Replayed(); restores < partitions {
		t.Fatalf("%s owns %d partitions after 4s, want %d", z.Name(), restores, partitions)
	}
	z.Signal(t, syscall.SIGSTOP)
	frozen := time.Now()
	y := s.start("y", filepath.Join(s.Dir, "state-y"), opts{})
	time.Sleep(sessionTimeout + transactionTimeout + 3*time.Second)
	z.Signal(t, syscall.SIGCONT)
	thawed := time.Now()
	t.Logf("%s was frozen for %s", z.Name(), thawed.Sub(frozen).Round(time.Millisecond))
	time.Sleep(6 * time.Second)
	f.Stop()
	s.waitCaughtUp(y, z)
	s.checkExactlyOnce()

	// After the thaw, the zombie's first commit must fail: its group
	// generation is gone (the offset commit is fenced) or its producer
	// epoch was bumped when the broker aborted its open transaction. The
	// runtime then aborts (and re-consumes from the committed offsets) or,
	// for an unknown outcome or a failed record, rebuilds the session and
	// restores.
	var refusals []string
	dropped := 0
	for _, l := range z.LogLines() {
		if l.TS.Before(thawed.Add(-time.Second)) {
			continue
		}
		switch l.Msg {
		case msgFenced, msgUnknown, msgRecordFailed:
			e, _ := l.Fields["error"].(string)
			refusals = append(refusals, l.Msg+" "+e)
		case msgDropped:
			// Not a refusal: kgo telling the run loop the member was
			// dropped; the stage must rejoin (and restore), not stop.
			dropped++
		}
	}
	m, err := z.Metrics()
	if err != nil {
		t.Fatalf("scraping %s: %v", z.Name(), err)
	}
	t.Logf("%s after the thaw: %d refused commits %q, %d %q; commits_refused_total %v, session_restarts_total %v, restore_records_total %v",
		z.Name(), len(refusals), refusals, dropped, msgDropped, m.Sum("meterline_stream_commits_refused_total"), m.Sum("meterline_stream_session_restarts_total"), m.Sum("meterline_stream_restore_records_total"))
	if len(refusals) == 0 && m.Sum("meterline_stream_commits_refused_total") == 0 {
		t.Errorf("the zombie %s logged no refused commit after the thaw and its meterline_stream_commits_refused_total is 0", z.Name())
	}
}

// TestRealDedupWipedState runs an instance, stops it, deletes its Pebble
// directory and restarts it: it must restore everything from the
// changelog and stay exactly-once.
func TestRealDedupWipedState(t *testing.T) {
	s := newSuite(t)
	stateDir := filepath.Join(s.Dir, "state")
	const n = 3000
	a := s.start("a", stateDir, opts{})
	s.send(seq(0, n))
	s.send(seq(0, n/3))
	s.waitCaughtUp(a)
	a.Stop(t)
	if err := os.RemoveAll(filepath.Join(stateDir, "dedup-a")); err != nil {
		t.Fatal(err)
	}

	a2 := s.start("a", stateDir, opts{})
	s.send(seq(0, n))
	s.send(seq(n, n+300))
	s.waitCaughtUp(a2)
	s.checkExactlyOnce()
	for _, l := range a2.Lines(msgRestoring) {
		if b, _ := l.Fields["had_state"].(bool); b {
			t.Errorf("partition %d: restore found local state after the wipe", l.Int("partition"))
		}
	}
	m, err := a2.Metrics()
	if err != nil {
		t.Fatalf("scraping %s: %v", a2.Name(), err)
	}
	rec, _ := a2.Replayed()
	t.Logf("restored %d changelog records (metric %v)", rec, m.Sum("meterline_stream_restore_records_total"))
	// Every identity accepted before the wipe is one changelog record.
	if got := m.Sum("meterline_stream_restore_records_total"); got < n {
		t.Errorf("meterline_stream_restore_records_total = %v, want ≥ %d (one per identity stored before the wipe)", got, n)
	}
}
