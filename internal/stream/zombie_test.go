package stream

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestZombiePunctuationFenced: "zombie instance after a rebalance" (DESIGN
// §6) for a transaction that consumed no input, only a punctuation's state
// writes and outputs (dedup's ticks and metadata, the shape of seqProc).
// DESIGN §3: the group generation fences a zombie even on an idle
// partition. a stalls in a punctuation of partition 0 and its heartbeats
// stop, as a paused process's would; the group moves on to b, which
// restores and punctuates. When a's punctuation returns, its transaction
// must not commit (b took the same sequence numbers, from the changelog),
// however late a hears of the rebalance.
func TestZombiePunctuationFenced(t *testing.T) {
	t.Parallel()
	s, proc, a, fsA := startSeq(t)
	release := proc.arm(proc.holdPunct, 0)
	proc.punctuating(t, 0)
	committed := a.metric("meterline_stream_transactions_total", "outcome", "committed")
	ended := func() float64 {
		return a.metric("meterline_stream_transactions_total", "outcome", "committed") +
			a.metric("meterline_stream_transactions_total", "outcome", "aborted") +
			a.metric("meterline_stream_transactions_total", "outcome", "unknown")
	}
	before := ended()

	// Hold a's heartbeats until its transaction ended: it does not learn
	// that the group moved on.
	wake := make(chan struct{})
	woken := s.holdHeartbeats(s.onlyMember(), wake)
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
		t.Errorf("a, no longer a member of the group, committed %v transactions after it stalled", n-committed)
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
