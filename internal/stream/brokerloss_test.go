package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// dialRefused is what a client gets from a broker that was killed.
var dialRefused = fmt.Errorf("unable to dial: %w",
	&net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}})

// TestFetchErrorRejoinsOnBrokerLoss: the losses of the group or of its
// coordinator that kgo repairs by rejoining never stop dedup or the
// aggregator (on the three-broker cluster, killing the broker that
// coordinated the aggregator's group stopped both instances with "unable
// to join group session: unable to dial"); other errors still do.
func TestFetchErrorRejoinsOnBrokerLoss(t *testing.T) {
	session := func(err error) error { return &kgo.ErrGroupSession{Err: err} }
	fetches := func(err error) kgo.Fetches {
		return kgo.Fetches{{Topics: []kgo.FetchTopic{{Partitions: []kgo.FetchPartition{{Partition: 0, Err: err}}}}}}
	}
	rt := &Runtime{log: zap.NewNop()}
	for name, err := range map[string]error{
		"unknown member":     session(kerr.UnknownMemberID),
		"fenced epoch":       session(kerr.FencedMemberEpoch),
		"not coordinator":    session(kerr.NotCoordinator),
		"coordinator gone":   session(kerr.CoordinatorNotAvailable),
		"coordinator moving": session(kerr.CoordinatorLoadInProgress),
		"dial refused":       session(dialRefused),
		"connection reset":   session(&net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}),
		"eof":                session(io.EOF),
	} {
		if got := rt.handleFetches(context.Background(), fetches(err)); got != nil {
			t.Errorf("%s: the stage stops with %v; it must rejoin", name, got)
		}
	}
	for name, err := range map[string]error{
		"group not authorized": session(kerr.GroupAuthorizationFailed),
		"topic not authorized": kerr.TopicAuthorizationFailed,
		"offset out of range":  kerr.OffsetOutOfRange,
	} {
		got := rt.handleFetches(context.Background(), fetches(err))
		if got == nil || !errors.Is(got, errors.Unwrap(err)) && !errors.Is(got, err) {
			t.Errorf("%s: handleFetches = %v, want the stage to stop with it", name, got)
		}
	}
}

// TestChangelogOffsetWaitsForALeader: while the leader of a changelog
// partition is a broker that died, listing its offsets fails for that
// partition with a shard error (the dial is refused) until the controller
// moves the leadership; a restore waits for that rather than stopping the
// stage (on the cluster it stopped an aggregator with "changelog has no
// partition 5"). A listing without the partition, an authorization failure
// and a non-retriable partition error still fail at once.
func TestChangelogOffsetWaitsForALeader(t *testing.T) {
	const topic = "cl"
	rt := &Runtime{cfg: Config{ChangelogTopic: topic, InputTopic: "in"}}
	listed := func(p int32, off int64, err error) kadm.ListedOffsets {
		return kadm.ListedOffsets{topic: {p: {Topic: topic, Partition: p, Offset: off, Err: err}}}
	}
	shardErr := &kadm.ShardErrors{Name: "ListOffsets", AllFailed: true, Errs: []kadm.ShardError{{Err: dialRefused}}}
	// answers returns a list function that answers with each step in
	// turn, then with the last one forever.
	type answer struct {
		offs kadm.ListedOffsets
		err  error
	}
	answers := func(steps ...answer) (func(context.Context) (kadm.ListedOffsets, error), *int) {
		calls := 0
		return func(context.Context) (kadm.ListedOffsets, error) {
			a := steps[min(calls, len(steps)-1)]
			calls++
			return a.offs, a.err
		}, &calls
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Partition 5's leader is down for two listings (other partitions
	// answer), then it has a new leader.
	list, calls := answers(
		answer{listed(4, 7, nil), shardErr},
		answer{listed(5, -1, kerr.NotLeaderForPartition), nil},
		answer{listed(5, 42, nil), nil},
	)
	if off, err := rt.changelogOffset(ctx, list, 5, "end"); err != nil || off != 42 || *calls != 3 {
		t.Errorf("leader down, then back: offset %d, err %v after %d listings; want 42 after 3", off, err, *calls)
	}

	// A broker that lost the leadership, or is behind the epoch the
	// listing carries (listoffsets.go), then the leader.
	list, calls = answers(
		answer{listed(5, -1, kerr.NotLeaderForPartition), nil},
		answer{listed(5, -1, kerr.UnknownLeaderEpoch), nil},
		answer{listed(5, -1, kerr.FencedLeaderEpoch), nil},
		answer{listed(5, 42, nil), nil},
	)
	if off, err := rt.changelogOffset(ctx, list, 5, "end"); err != nil || off != 42 || *calls != 4 {
		t.Errorf("fenced listings, then the leader: offset %d, err %v after %d listings; want 42 after 4", off, err, *calls)
	}

	// A partition just created, missing from the first listings.
	list, calls = answers(
		answer{listed(4, 7, nil), nil},
		answer{listed(4, 7, nil), nil},
		answer{listed(5, 0, nil), nil},
	)
	if off, err := rt.changelogOffset(ctx, list, 5, "end"); err != nil || off != 0 || *calls != 3 {
		t.Errorf("partition missing, then listed: offset %d, err %v after %d listings; want 0 after 3", off, err, *calls)
	}

	for _, c := range []struct {
		name  string
		a     answer
		want  string
		calls int
	}{
		{"no such partition", answer{listed(4, 7, nil), nil}, "has no partition 5", missingAttempts},
		{"not authorized", answer{nil, &kadm.AuthError{Err: kerr.TopicAuthorizationFailed}}, "TOPIC_AUTHORIZATION_FAILED", 1},
		{"partition error", answer{listed(5, -1, kerr.UnsupportedVersion), nil}, "UNSUPPORTED_VERSION", 1},
	} {
		list, calls := answers(c.a)
		if _, err := rt.changelogOffset(ctx, list, 5, "end"); err == nil || !strings.Contains(err.Error(), c.want) || *calls != c.calls {
			t.Errorf("%s: err %v after %d listings; want %q after %d", c.name, err, *calls, c.want, c.calls)
		}
	}

	// A stage that stops while waiting returns at once.
	stopped, stop := context.WithCancel(ctx)
	list, _ = answers(answer{nil, shardErr})
	time.AfterFunc(100*time.Millisecond, stop)
	if _, err := rt.changelogOffset(stopped, list, 5, "start"); !errors.Is(err, context.Canceled) {
		t.Errorf("stopped while waiting: err %v, want context.Canceled", err)
	}
}
