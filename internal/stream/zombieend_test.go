package stream

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestZombiePausedBeforeEndTxnCommits: "zombie instance after a
// rebalance", the zombie paused in the one window the group generation
// cannot fence: after its TxnOffsetCommit (and the heartbeat kgo forces
// after it) were accepted, before its EndTxn. a's EndTxn is held at the
// broker and its heartbeats are answered without reaching the group, as a
// paused process's would stop: the group drops a and hands both partitions
// to b. Its transaction holds offsets of the group that are not yet
// stable, so b must not restore or process the partitions until it ends
// (KIP-447: its offset fetch requires stable offsets). When a resumes its
// EndTxn commits, and b must then take a's commit, offsets and changelog
// together: each input counted once, b's state equal to the changelog.
func TestZombiePausedBeforeEndTxnCommits(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	a := s.start("a", fsA, func(c *Config, _ *countProc) { c.TransactionTimeout = time.Minute })
	s.send(20)
	s.caughtUp()
	committed := a.metric("meterline_stream_transactions_total", "outcome", "committed")
	member := s.onlyMember()

	txnID := s.group + "-a"
	var armed atomic.Bool
	held, wake := make(chan struct{}), make(chan struct{})
	var hold, woken sync.Once
	release := func() { woken.Do(func() { close(wake) }) }
	t.Cleanup(release)
	s.cluster.ControlKey(int16(kmsg.EndTxn), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		s.cluster.KeepControl()
		req := kreq.(*kmsg.EndTxnRequest)
		if req.TransactionalID != txnID || !req.Commit || !armed.Load() {
			return nil, nil, false
		}
		hit := false
		hold.Do(func() { hit = true })
		if hit {
			close(held)
			s.cluster.SleepControl(func() { <-wake })
		}
		return nil, nil, false
	})
	armed.Store(true)
	s.send(20)
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("a never ended a transaction with new input")
	}
	s.answerHeartbeats(member, wake)

	b := s.start("b", fsB)
	s.waitFor("the group to drop a and assign both partitions to b", func() bool {
		dg, err := s.adm.DescribeGroups(t.Context(), s.group)
		if err != nil {
			return false
		}
		ms := dg[s.group].Members
		return len(ms) == 1 && ms[0].MemberID != member && dg[s.group].State == "Stable"
	})
	time.Sleep(2 * time.Second) // b's offset fetch, retried while a's offsets are unstable
	if n := b.metric("meterline_stream_restores_total"); n != 0 {
		t.Errorf("b began %v restores while a's transaction, with the group's offsets, was open; want 0", n)
	}
	if n := b.metric("meterline_stream_transactions_total", "outcome", "committed"); n != 0 {
		t.Errorf("b committed %v transactions while a's offsets were unstable, want 0", n)
	}

	release()
	s.waitFor("a's held transaction to commit", func() bool {
		return a.metric("meterline_stream_transactions_total", "outcome", "committed") > committed
	})
	s.caughtUp()
	s.finish(b, fsB, a)
}
