package stream

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestReadyFollowsGroupMembership: a stage that loses its group (its
// heartbeat fails: the brokers or the group's coordinator unavailable)
// and cannot join it again is not ready until it is a member again, as
// docs/operations.md's /readyz says ("ready once it has joined its
// group"); through a real broker's 20 s outage it was ready, owning
// nothing. meterline_stream_group_member says the same (1 while a
// member, 0 while not), for the alert MeterlineStageNotInGroup.
func TestReadyFollowsGroupMembership(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	// The group's coordinator is not available while down: kgo loses the
	// group (its heartbeat fails) and cannot join it again.
	down := answerWhile(s, func(resp kmsg.Response) bool {
		code := kerr.CoordinatorNotAvailable.Code
		switch r := resp.(type) {
		case *kmsg.HeartbeatResponse:
			r.ErrorCode = code
		case *kmsg.JoinGroupResponse:
			r.ErrorCode = code
		case *kmsg.SyncGroupResponse:
			r.ErrorCode = code
		default:
			return false
		}
		return true
	})
	in := s.start("a", vfs.NewMem(), func(c *Config, _ *countProc) { c.SessionTimeout = time.Second })
	waitReady := func(what string, want bool) error {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := in.rt.Ready()
			if (err == nil) == want {
				return err
			}
			select {
			case <-in.done:
				t.Fatalf("%s: the stage stopped: %v", what, in.err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: Ready() = %v after 30 s", what, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	member := func(what string, want float64) {
		t.Helper()
		if got := testutil.ToFloat64(in.rt.m.session.Member); got != want {
			t.Errorf("%s: meterline_stream_group_member = %v, want %v", what, got, want)
		}
	}
	waitReady("started", true)
	member("started", 1)
	down.Store(true)
	err := waitReady("brokers down", false)
	if !strings.Contains(err.Error(), "not in consumer group "+s.group) {
		t.Errorf("Ready() = %v, want it to say the stage is not in its group", err)
	}
	member("brokers down", 0)
	down.Store(false)
	waitReady("brokers back", true)
	member("brokers back", 1)
}

// answerWhile makes the suite's cluster answer, while the returned flag is
// set, every request whose response answer fills in (it returns true)
// with that response; the others are handled as usual.
func answerWhile(s *suite, answer func(kmsg.Response) bool) *atomic.Bool {
	var on atomic.Bool
	s.cluster.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
		s.cluster.KeepControl()
		if !on.Load() {
			return nil, nil, false
		}
		resp := req.ResponseKind()
		if !answer(resp) {
			return nil, nil, false
		}
		return resp, nil, true
	})
	return &on
}

// TestReadyWaitsForTransactionalID: a stage whose transaction coordinator
// does not answer its InitProducerID (the coordinator's broker paused,
// docs/operations.md, "One broker paused or killed") is not ready, even
// once it is a member of its group and has restored every partition it
// owns: no transaction can start. It was ready meanwhile: kgo joins the
// group and the partitions restore while InitProducerID waits.
func TestReadyWaitsForTransactionalID(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	// A coordinator that is loading answers every InitProducerID with a
	// retriable error: kgo retries it until the session's bound.
	refuse := answerWhile(s, func(resp kmsg.Response) bool {
		r, ok := resp.(*kmsg.InitProducerIDResponse)
		if ok {
			r.ErrorCode = kerr.CoordinatorLoadInProgress.Code
		}
		return ok
	})
	refuse.Store(true)
	in := s.start("a", vfs.NewMem())
	// Member of the group, every assigned partition restored.
	deadline := time.Now().Add(15 * time.Second)
	for {
		parts, restoring := 0, 0
		in.rt.EachPartitionStatus(func(_ int32, r bool, _ int64, _, _ string) {
			parts++
			if r {
				restoring++
			}
		})
		if testutil.ToFloat64(in.rt.m.session.Member) == 1 && parts > 0 && restoring == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not a member with its partitions restored after 15 s: member %v, %d partitions, %d restoring",
				testutil.ToFloat64(in.rt.m.session.Member), parts, restoring)
		}
		time.Sleep(50 * time.Millisecond)
	}
	err := in.rt.Ready()
	if err == nil || !strings.Contains(err.Error(), "initialising transactional ID "+in.rt.cfg.TransactionalID()) {
		t.Fatalf("Ready() = %v while InitProducerID is refused, want not ready naming the transactional ID", err)
	}
	refuse.Store(false)
	deadline = time.Now().Add(30 * time.Second)
	for in.rt.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("Ready() = %v 30 s after the coordinator answers", in.rt.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
