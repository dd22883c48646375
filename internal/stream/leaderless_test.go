package stream

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestRestoreWaitsOutALeaderlessChangelog: a restore whose changelog
// partition has no leader (its only replica on a broker that is down)
// waits for one for as long as it takes, as a running stage waits for the
// leaders of its outputs, rather than stop the stage after its listings
// ran out; once the leader is back, every input is counted once. Not
// parallel: it shortens listRetry, so that the wait outlasts what were a
// minute of listings in a few seconds.
func TestRestoreWaitsOutALeaderlessChangelog(t *testing.T) {
	defer func(d time.Duration) { listRetry = d }(listRetry)
	listRetry = 5 * time.Millisecond
	s := newSuite(t, nil, nil)
	a := s.start("a", vfs.NewMem())
	s.send(20)
	s.caughtUp()
	a.shutdown()
	s.send(20)
	gone := s.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.ListOffsets}, Topic: s.changelog, Err: kerr.LeaderNotAvailable, Count: -1})
	fs := vfs.NewMem()
	b := s.start("b", fs)
	// Longer than 240 listings (both partitions' restores list), each
	// answered at once.
	until := time.Now().Add(240*listRetry + 3*time.Second)
	s.waitFor("the changelog's leader to be gone for a while", func() bool { return gone.Hits() > 240 && time.Now().After(until) })
	gone.Remove()
	s.caughtUp()
	s.finish(b, fs)
}
