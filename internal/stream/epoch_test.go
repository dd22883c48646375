package stream

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/testenv"
)

// kgo's GroupTransactSession passes on only the first revoke after a
// transaction ended, so an instance that goes through two rebalances
// within one transaction and keeps a partition is assigned it anew without
// hearing of its revoke: a new restore begins while the partition's old
// instance is still active. The tests below play that assignment by
// calling adjustOffsets as kgo does, with the group's committed offset.

// seqProc is countProc whose partitions, at every punctuation, take the
// next number of a sequence kept in their state and emit it: the shape of
// the aggregator's FINAL chunks, whose cursor is state. A number emitted
// twice is work done twice; each number also leaves a key of its own in
// the state, so that a committed write the local store dropped shows. Open and Punctuate of a partition can be held.
type seqProc struct {
	*countProc

	mu        sync.Mutex
	holdOpen  map[int32]chan struct{} // Open of the partition waits until it is closed
	holdPunct map[int32]chan struct{} // the next Punctuate of the partition waits until it is closed
	entered   chan int32              // told when Open of a partition starts (held or not)
}

func newSeqProc(output string) *seqProc {
	return &seqProc{countProc: &countProc{output: output}, holdOpen: map[int32]chan struct{}{},
		holdPunct: map[int32]chan struct{}{}, entered: make(chan int32, 16)}
}

// held takes the hold of partition p in m, if any.
func (sp *seqProc) held(m map[int32]chan struct{}, p int32) chan struct{} {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	h := m[p]
	delete(m, p)
	return h
}

// arm sets a hold of partition p in m and returns its release.
func (sp *seqProc) arm(m map[int32]chan struct{}, p int32) chan struct{} {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	h := make(chan struct{})
	m[p] = h
	return h
}

type seqPart struct {
	*countPart
	sp     *seqProc
	n      int64
	loaded bool
}

func (sp *seqProc) Open(p int32, st *PartitionState) (Partition, error) {
	sp.entered <- p
	if h := sp.held(sp.holdOpen, p); h != nil {
		<-h
	}
	part, err := sp.countProc.Open(p, st)
	if err != nil {
		return nil, err
	}
	return &seqPart{countPart: part.(*countPart), sp: sp}, nil
}

func (s *seqPart) Punctuate(tx *Tx) error {
	if h := s.sp.held(s.sp.holdPunct, s.p); h != nil {
		<-h
	}
	if !s.loaded {
		v, ok, err := tx.Get([]byte("seq"))
		if err != nil {
			return err
		}
		s.n = 0
		if ok {
			if s.n, err = strconv.ParseInt(string(v), 10, 64); err != nil {
				return err
			}
		}
		s.loaded = true
	}
	s.n++
	tx.Put([]byte("seq"), strconv.AppendInt(nil, s.n, 10))
	tx.Put(fmt.Appendf(nil, "n/%d", s.n), []byte("1")) // never written again: a write dropped from the store stays dropped
	tx.Emit(&kgo.Record{Topic: s.proc.output, Partition: s.p, Key: fmt.Appendf(nil, "seq/%d/%d", s.p, s.n)})
	return nil
}

func (s *seqPart) Abort() {
	s.countPart.Abort()
	s.loaded = false
}

// startSeq starts instance a with a seqProc punctuating every 10 ms, lets
// it own both partitions and count some input.
func startSeq(t *testing.T) (*suite, *seqProc, *instance, vfs.FS) {
	s := newSuite(t, nil, nil)
	proc := newSeqProc(s.output)
	fs := vfs.NewMem()
	a := s.startProc("a", fs, proc, func(c *Config) { c.PunctuateInterval = 10 * time.Millisecond })
	s.waitFor("a to own both partitions", func() bool { return a.owned() == 2 })
	for len(proc.entered) > 0 {
		<-proc.entered
	}
	s.send(20)
	s.caughtUp()
	time.Sleep(200 * time.Millisecond) // some sequence numbers committed
	return s, proc, a, fs
}

// assignAnew assigns partition p of a anew, as kgo does after a rebalance
// whose revoke the session did not pass on: the group's committed offset,
// then adjustOffsets, which starts a new restore.
func (s *suite) assignAnew(a *instance, p int32) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	offs, err := s.adm.FetchOffsets(ctx, s.group)
	if err != nil {
		s.t.Fatal(err)
	}
	committed, ok := offs.Lookup(s.input, p)
	if !ok || committed.Err != nil || committed.At < 0 {
		s.t.Fatalf("committed offset of %s/%d: %+v", s.input, p, committed)
	}
	if _, err := a.rt.adjustOffsets(ctx, map[string]map[int32]kgo.Offset{s.input: {p: kgo.NewOffset().At(committed.At)}}); err != nil {
		s.t.Fatal(err)
	}
}

// opened waits until Open of partition p starts.
func (sp *seqProc) opened(t *testing.T, p int32) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case q := <-sp.entered:
			if q == p {
				return
			}
		case <-deadline:
			t.Fatalf("the new restore of partition %d did not reach Open", p)
		}
	}
}

// punctuating waits until the hold of partition p's Punctuate armed last
// is taken: the run loop waits in that Punctuate.
func (sp *seqProc) punctuating(t *testing.T, p int32) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sp.mu.Lock()
		_, waiting := sp.holdPunct[p]
		sp.mu.Unlock()
		if !waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition %d was not punctuated", p)
		}
		time.Sleep(time.Millisecond)
	}
}

// seqCommitted returns the committed sequence numbers: how often each was
// emitted, and how many partition p has.
func (s *suite) seqCommitted(p int32) (times map[string]int, ofP int) {
	s.t.Helper()
	times = map[string]int{}
	for _, r := range testenv.ReadAll(s.t, s.brokers, s.output) {
		if k := string(r.Key); strings.HasPrefix(k, "seq/") {
			times[k]++
			if strings.HasPrefix(k, fmt.Sprintf("seq/%d/", p)) {
				ofP++
			}
		}
	}
	return times, ofP
}

// checkSeqOnce fails the test if a sequence number was committed twice.
func (s *suite) checkSeqOnce() {
	s.t.Helper()
	times, _ := s.seqCommitted(0)
	var twice []string
	for k, n := range times {
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%s ×%d", k, n))
		}
	}
	if len(times) == 0 {
		s.t.Fatal("no sequence number was committed: the case tested nothing")
	}
	if len(twice) > 0 {
		s.t.Fatalf("%d sequence numbers committed more than once (work redone after the partition was assigned anew): %v", len(twice), twice)
	}
}

// checkStoreMatchesChangelog fails the test if the stopped instance's
// local state differs from the changelog (the latest record of each key)
// in any partition: the store is a cache of the changelog.
func (s *suite) checkStoreMatchesChangelog(in *instance, fs vfs.FS) {
	s.t.Helper()
	log := s.changelogState()
	st, err := OpenStore("state-"+in.id, fs, zap.NewNop())
	if err != nil {
		s.t.Fatal(err)
	}
	defer st.Close()
	for p := range s.parts {
		local := s.storeState(st, p)
		var diff []string
		for k, v := range log[p] {
			if local[k] != v {
				diff = append(diff, fmt.Sprintf("%s: changelog %q, store %q", k, v, local[k]))
			}
		}
		for k, v := range local {
			if _, ok := log[p][k]; !ok {
				diff = append(diff, fmt.Sprintf("%s: store %q, not in the changelog", k, v))
			}
		}
		if len(diff) > 0 {
			slices.Sort(diff)
			s.t.Errorf("partition %d: the local store differs from the changelog in %d keys: %v", p, len(diff), diff)
		}
	}
}

// finishSeq lets a own both partitions again after partition 0 was
// assigned anew, punctuate and count more input, stops it and checks that
// no sequence number was committed twice and that its store equals the
// changelog.
func (s *suite) finishSeq(a *instance, fs vfs.FS) {
	s.t.Helper()
	s.waitFor("a to own both partitions again", func() bool { return a.owned() == 2 })
	time.Sleep(300 * time.Millisecond) // the new instance punctuates
	s.send(10)
	s.caughtUp()
	a.shutdown()
	s.checkSeqOnce()
	s.checkStoreMatchesChangelog(a, fs)
}

// TestKeptPartitionAssignedAnewClosesItsOldInstance: while the new restore
// of a partition assigned anew runs (held at Open here), its old instance
// is closed: it does no work that would commit past the end the restore
// replays to (the new instance would redo it from the older state), and
// the other partitions go on committing meanwhile.
func TestKeptPartitionAssignedAnewClosesItsOldInstance(t *testing.T) {
	t.Parallel()
	s, proc, a, fs := startSeq(t)
	release := proc.arm(proc.holdOpen, 0)
	s.assignAnew(a, 0)
	proc.opened(t, 0)
	_, before := s.seqCommitted(1)
	time.Sleep(500 * time.Millisecond)
	_, after := s.seqCommitted(1)
	close(release)
	s.finishSeq(a, fs)
	if after <= before {
		t.Fatalf("partition 1 committed no work while partition 0 was restored anew (%d sequence numbers before, %d after): its transactions aborted", before, after)
	}
}

// TestKeptPartitionAssignedAnewOpenTransaction: a transaction that wrote
// to the partition's old instance before it was assigned anew, still open
// when the new restore listed the changelog's end and finished, aborts:
// committed, its writes would be past that end and the new instance would
// redo its work.
func TestKeptPartitionAssignedAnewOpenTransaction(t *testing.T) {
	t.Parallel()
	s, proc, a, fs := startSeq(t)
	// Partitions punctuate in order: once partition 1's punctuation is
	// held, partition 0's is in the open transaction.
	release := proc.arm(proc.holdPunct, 1)
	proc.punctuating(t, 1)
	s.assignAnew(a, 0)
	proc.opened(t, 0) // the restore listed the end and replayed to it
	close(release)
	s.finishSeq(a, fs)
}

// TestAssignedAnewAsRestoreEndsStaysPaused: a partition assigned anew just
// as its previous restore ends (that restore has queued its install, and
// is about to resume the partition's fetching) stays paused until its new
// restore ends. Resumed by the previous restore, its records would be
// polled before its new instance is installed, and every transaction,
// those of the other partitions included, would abort to rewind them
// until the new restore ends (a full one can take minutes).
func TestAssignedAnewAsRestoreEndsStaysPaused(t *testing.T) {
	t.Parallel()
	s, proc, a, fs := startSeq(t)
	var release chan struct{}
	reassigned := make(chan error, 1)
	var once sync.Once
	hook := func(p int32) {
		if p != 0 {
			return
		}
		once.Do(func() {
			// The partition is assigned anew while this restore is about
			// to resume it: on kgo's group goroutine, as a rebalance's
			// adjustOffsets, given time to run.
			release = proc.arm(proc.holdOpen, 0)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				offs, err := s.adm.FetchOffsets(ctx, s.group)
				if err == nil {
					o, _ := offs.Lookup(s.input, 0)
					_, err = a.rt.adjustOffsets(ctx, map[string]map[int32]kgo.Offset{s.input: {0: kgo.NewOffset().At(o.At)}})
				}
				reassigned <- err
			}()
			time.Sleep(100 * time.Millisecond)
		})
	}
	a.rt.restoredHook.Store(&hook)
	s.assignAnew(a, 0)
	if err := <-reassigned; err != nil {
		t.Fatal(err)
	}
	proc.opened(t, 0) // the first restore's Open
	proc.opened(t, 0) // the new restore's, held
	aborted := a.metric("meterline_stream_transactions_total", "outcome", "aborted")
	_, before := s.seqCommitted(1)
	s.send(20) // input for partition 0 too
	time.Sleep(1500 * time.Millisecond)
	_, after := s.seqCommitted(1)
	abortedAfter := a.metric("meterline_stream_transactions_total", "outcome", "aborted")
	close(release)
	s.finishSeq(a, fs)
	if after <= before || abortedAfter > aborted+1 {
		t.Fatalf("while partition 0's new restore ran, %v transactions aborted (partition 0's records were polled before its restore ended, each aborted to rewind) and partition 1 committed %d sequence numbers",
			abortedAfter-aborted, after-before)
	}
}
