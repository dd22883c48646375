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
	var down atomic.Bool
	// The group's coordinator is not available while down: kgo loses the
	// group (its heartbeat fails) and cannot join it again.
	s.cluster.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
		s.cluster.KeepControl()
		if !down.Load() {
			return nil, nil, false
		}
		code := kerr.CoordinatorNotAvailable.Code
		switch r := req.ResponseKind().(type) {
		case *kmsg.HeartbeatResponse:
			r.ErrorCode = code
			return r, nil, true
		case *kmsg.JoinGroupResponse:
			r.ErrorCode = code
			return r, nil, true
		case *kmsg.SyncGroupResponse:
			r.ErrorCode = code
			return r, nil, true
		}
		return nil, nil, false
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
