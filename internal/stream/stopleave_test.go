package stream

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

// TestStopBoundedWhenLeaveHangs: a stage told to stop while the group's
// coordinator does not answer (a hung broker, packets dropped on the way)
// returns within session.LeaveTimeout of its LeaveGroup, not after kgo's
// retries of it (over a minute on a stopped broker, beyond an
// orchestrator's grace period; docs/operations.md, Running the stages).
// The group drops the member at its session timeout anyway.
func TestStopBoundedWhenLeaveHangs(t *testing.T) {
	cluster, brokers := testenv.KFake(t)
	input, changelog := testenv.Name(t, "in"), testenv.Name(t, "changelog")
	testenv.CreateTopic(t, brokers, input, 2, nil)
	testenv.CreateTopic(t, brokers, changelog, 2, nil)
	hang := testenv.HangLeaveGroup(t, cluster)
	stop, done := runKeepReady(t, zaptest.NewLogger(t), brokers, input, changelog)
	hang()
	testenv.StopsWithin(t, stop, done, session.LeaveTimeout+5*time.Second)
}

// TestStopBoundedWhenCoordinatorHangs: a stage told to stop while the
// group's coordinator answers none of the group's requests (a broker
// paused with SIGSTOP: its port still takes connections) returns within
// session.LeaveTimeout + session.CloseTimeout. After the bounded
// LeaveGroup, kgo's Close waited for the heartbeat and the JoinGroup in
// flight to the coordinator, over 30 s; a session rebuilt after a failed
// commit (docs/operations.md, "One broker paused or killed") waited as
// long before its new client could start.
func TestStopBoundedWhenCoordinatorHangs(t *testing.T) {
	t.Parallel()
	cluster, brokers := testenv.KFake(t)
	input, changelog := testenv.Name(t, "in"), testenv.Name(t, "changelog")
	testenv.CreateTopic(t, brokers, input, 2, nil)
	testenv.CreateTopic(t, brokers, changelog, 2, nil)
	release, hanging := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) })
	cluster.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		switch req.(type) {
		case *kmsg.HeartbeatRequest, *kmsg.JoinGroupRequest, *kmsg.SyncGroupRequest, *kmsg.LeaveGroupRequest, *kmsg.FindCoordinatorRequest:
			select {
			case <-hanging:
				cluster.SleepControl(func() { <-release })
			default:
			}
		}
		return nil, nil, false
	})
	// The client abandoned by the stop logs on after the test: no test
	// logger.
	stop, done := runKeepReady(t, zap.NewNop(), brokers, input, changelog)
	close(hanging)
	time.Sleep(11 * time.Second) // the heartbeat timed out (10 s), a rejoin in flight, unanswered
	testenv.StopsWithin(t, stop, done, session.LeaveTimeout+session.CloseTimeout+2*time.Second)
}

// runKeepReady runs a stage of keepProc on brokers, logging to log, until
// the test ends or stop is called, and returns once it is ready; done
// receives Run's result.
func runKeepReady(t *testing.T, log *zap.Logger, brokers []string, input, changelog string) (stop func(), done chan error) {
	t.Helper()
	rt, err := New(Config{Stage: "keep",
		Config:     session.Config{Kafka: kafka.Config{Brokers: brokers}, Group: testenv.Name(t, "group"), InstanceID: "i1", SessionTimeout: 6 * time.Second},
		InputTopic: input, ChangelogTopic: changelog, FS: vfs.NewMem(),
		Logger: log, Registerer: prometheus.NewRegistry()}, keepProc{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	done = make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for rt.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("not ready within 30 s: %v", rt.Ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return stop, done
}
