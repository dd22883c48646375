package stream

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
)

// TestZombiePunctuationFenced: "zombie after a rebalance"
// (docs/design.md, Exactly-once, "Crash windows") for a transaction that
// consumed no input, only a punctuation's state writes and outputs
// (dedup's ticks and metadata, the shape of seqProc). docs/design.md, Exactly-once, 7: the
// group generation fences a zombie even on an idle partition. a stalls in a
// punctuation of partition 0 and its heartbeats stop, as a paused process's
// would; the group moves on to b, which restores and punctuates. When a's
// punctuation returns, its transaction must not commit (b took the same
// sequence numbers, from the changelog), however late a hears of the
// rebalance.
func TestZombiePunctuationFenced(t *testing.T) {
	t.Parallel()
	s, proc, a, fsA := startSeq(t)
	// Hold a's heartbeats until its transaction ended: it does not learn
	// that the group moved on.
	s.zombiePunctuates(proc, a, fsA, s.holdHeartbeats)
}

// zombiePunctuates stalls a, punctuating every 10 ms with proc and owning
// both partitions, in a punctuation of partition 0 while quiet keeps a
// from hearing of the group (holdHeartbeats, answerHeartbeats); the group
// moves on to b, which restores and punctuates. When a's punctuation
// returns, its transaction must not commit. Then a owns both partitions
// again and counts input, and no sequence number is committed twice.
func (s *suite) zombiePunctuates(proc *seqProc, a *instance, fsA vfs.FS, quiet func(member string, wake <-chan struct{}) func() bool) {
	s.t.Helper()
	release := proc.arm(proc.holdPunct, 0)
	proc.punctuating(s.t, 0)
	committed := a.metric("meterline_stream_transactions_total", "outcome", "committed")
	ended := func() float64 {
		return a.metric("meterline_stream_transactions_total", "outcome", "committed") +
			a.metric("meterline_stream_transactions_total", "outcome", "aborted") +
			a.metric("meterline_stream_transactions_total", "outcome", "unknown")
	}
	before := ended()

	wake := make(chan struct{})
	woken := quiet(s.onlyMember(), wake)
	defer func() {
		if !woken() {
			close(wake)
		}
	}()

	fsB := vfs.NewMem()
	b := s.startProc("b", fsB, newSeqProc(s.output), func(c *Config) { c.PunctuateInterval = 10 * time.Millisecond })
	s.waitFor("b to own both partitions", func() bool { return b.owned() == 2 })
	s.waitFor("b to commit its punctuations", func() bool {
		return b.metric("meterline_stream_transactions_total", "outcome", "committed") >= 3
	})

	close(release)
	s.waitFor("a's transaction to end", func() bool { return ended() > before })
	if n := a.metric("meterline_stream_transactions_total", "outcome", "committed"); n != committed {
		s.t.Errorf("a, no longer a member of the group, committed %v transactions after it stalled", n-committed)
	}
	close(wake)
	b.shutdown()
	s.waitFor("a to own both partitions again", func() bool { return a.owned() == 2 })
	s.send(10)
	s.caughtUp()
	a.shutdown()
	s.checkSeqOnce()
	s.checkStoreMatchesChangelog(a, fsA)
}

// TestZombiePunctuationFencedNoCommittedOffset: TestZombiePunctuationFenced
// for partitions that never had input committed (no committed offset of
// any input topic, the second co-partitioned one included): the runtime's
// first transaction for such a partition commits the offset its reading
// starts from, so a zombie's punctuation has an offset, and the group's
// generation, to be fenced with. a starts on empty inputs and punctuates;
// it stalls in a punctuation of partition 0 while b takes both partitions
// and punctuates; a's transaction must not commit. a's heartbeats are
// answered, not held: a's other requests then reach the broker at once
// (with holdHeartbeats they queue behind the held one on their
// connection, and the zombie's transaction may end only once the client
// gave up on it, which tests nothing).
func TestZombiePunctuationFencedNoCommittedOffset(t *testing.T) {
	t.Parallel()
	for _, twoTopics := range []bool{false, true} {
		name := "OneTopic"
		if twoTopics {
			name = "TwoTopics"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newSuite(t, nil, nil, twoTopics)
			proc := newSeqProc(s.output)
			fsA := vfs.NewMem()
			a := s.startProc("a", fsA, proc, func(c *Config) { c.PunctuateInterval = 10 * time.Millisecond })
			s.waitFor("a to own both partitions", func() bool { return a.owned() == 2 })
			s.waitFor("a to commit punctuations", func() bool {
				return a.metric("meterline_stream_transactions_total", "outcome", "committed") >= 3
			})
			s.zombiePunctuates(proc, a, fsA, s.answerHeartbeats)
		})
	}
}

// answerHeartbeats answers the heartbeats of group member at the broker
// as if all were well, without passing them on to the group, until wake is
// closed: the group drops the member once its session times out, and the
// member, like a paused process that resumed, has not heard of it. Its
// other requests go through at once (holdHeartbeats holds them behind the
// held heartbeat on their connection, so a zombie's transaction ends only
// once the client gave up on it).
func (s *suite) answerHeartbeats(member string, wake <-chan struct{}) (woken func() bool) {
	woken = closed(wake)
	s.cluster.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		s.cluster.KeepControl()
		if req.(*kmsg.HeartbeatRequest).MemberID != member || woken() {
			return nil, nil, false
		}
		return req.ResponseKind(), nil, true
	})
	return woken
}

// TestFirstTransactionCommitsStartOffset: a partition of an input topic
// the group has no committed offset of is read from the partition's start
// (docs/design.md, Exactly-once, 6), and the first transaction that writes
// for the partition (punctuations here, no input) commits that start offset
// for every input topic, with the state's offset: the start listed when the
// partition was assigned, not 0, where retention (DeleteRecords here) moved
// it. A restart then checks the state's offsets against the group's and
// reads on from there.
func TestFirstTransactionCommitsStartOffset(t *testing.T) {
	t.Parallel()
	firstTransactionCommitsStartOffset(t, nil)
}

// TestRealFirstTransactionCommitsStartOffset is
// TestFirstTransactionCommitsStartOffset on the real broker of
// METERLINE_TEST_KAFKA.
func TestRealFirstTransactionCommitsStartOffset(t *testing.T) {
	t.Parallel()
	firstTransactionCommitsStartOffset(t, testenv.RealKafka(t))
}

func firstTransactionCommitsStartOffset(t *testing.T, brokers []string) {
	s := newSuite(t, brokers, nil, true)
	// Partition 0 of the input and partition 1 of the extra topic start
	// past records retention deleted; the others at 0.
	want := map[string]map[int32]int64{s.input: {0: 5, 1: 0}, s.extra: {0: 0, 1: 3}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	del := kadm.Offsets{}
	for topic, ps := range want {
		for p, n := range ps {
			if n == 0 {
				continue
			}
			var recs []*kgo.Record
			for range n {
				recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Key: []byte("gone"), Value: []byte("gone")})
			}
			s.produce(recs...)
			del.Add(kadm.Offset{Topic: topic, Partition: p, At: n})
		}
	}
	deleted, err := s.adm.DeleteRecords(ctx, del)
	if err == nil {
		err = deleted.Error()
	}
	if err != nil {
		t.Fatal(err)
	}

	punct := func(c *Config) { c.PunctuateInterval = 10 * time.Millisecond }
	fs := vfs.NewMem()
	a := s.startProc("a", fs, newSeqProc(s.output), punct)
	s.waitFor("a to own both partitions", func() bool { return a.owned() == 2 })
	s.waitFor("a to commit punctuations", func() bool {
		return a.metric("meterline_stream_transactions_total", "outcome", "committed") >= 3
	})
	for topic, ps := range want {
		got, err := testenv.Committed(ctx, s.brokers, s.group, topic)
		if err != nil {
			t.Fatal(err)
		}
		for p, w := range ps {
			if o, ok := got[p]; !ok || o != w {
				t.Errorf("%s/%d: committed offset %d (committed: %v) after punctuations only, want its start %d", topic, p, o, ok, w)
			}
		}
	}
	a.shutdown()

	a = s.startProc("a", fs, newSeqProc(s.output), punct)
	s.waitFor("a to own both partitions again", func() bool { return a.owned() == 2 })
	s.send(12)
	s.caughtUp()
	a.shutdown()
	s.checkSeqOnce()
	s.checkStoreMatchesChangelog(a, fs)
}
