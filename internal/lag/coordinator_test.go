package lag

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestLagWaitsForCoordinator: a broker that has never served a consumer
// group answers COORDINATOR_NOT_AVAILABLE for a few seconds while it
// creates __consumer_offsets, so `meterline lag` run just after the
// broker started waits for the coordinator rather than fail; a group with
// no committed offsets then has no rows.
func TestLagWaitsForCoordinator(t *testing.T) {
	c, brokers := testenv.KFake(t)
	// The first `refusals` FindCoordinator requests are refused, however
	// long the client takes to send them: a count, not a time window, so
	// a slow start cannot let the first request through.
	const refusals = 4
	var refused atomic.Int32
	c.ControlKey(int16(kmsg.FindCoordinator), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if refused.Load() >= refusals {
			return nil, nil, false
		}
		refused.Add(1)
		return coordinatorNotAvailable(kr), nil, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rows, err := Compute(ctx, kafka.Config{Brokers: brokers}, []string{"meterline-dedup"}, time.Now())
	if err != nil {
		t.Fatalf("lag while the coordinator was coming up: %v", err)
	}
	if refused.Load() != refusals {
		t.Fatalf("%d FindCoordinator requests refused, want %d: the test did not exercise the wait", refused.Load(), refusals)
	}
	t.Logf("%d FindCoordinator requests refused", refused.Load())
	if len(rows) != 0 {
		t.Fatalf("rows of a group that never committed: %+v", rows)
	}
}

// TestLagNoCoordinatorSaysWhy: a coordinator that stays unavailable ends
// the wait with an error that gives the likely cause.
func TestLagNoCoordinatorSaysWhy(t *testing.T) {
	c, brokers := testenv.KFake(t)
	defer func(w time.Duration) { coordinatorWait = w }(coordinatorWait)
	coordinatorWait = 300 * time.Millisecond
	c.ControlKey(int16(kmsg.FindCoordinator), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return coordinatorNotAvailable(kr), nil, true
	})
	_, err := Compute(context.Background(), kafka.Config{Brokers: brokers}, []string{"meterline-dedup"}, time.Now())
	if err == nil || !errors.Is(err, kerr.CoordinatorNotAvailable) || !strings.Contains(err.Error(), "__consumer_offsets") {
		t.Fatalf("error %v, want COORDINATOR_NOT_AVAILABLE with its likely cause", err)
	}
}

// coordinatorNotAvailable answers a FindCoordinator request as a broker
// creating __consumer_offsets does.
func coordinatorNotAvailable(kr kmsg.Request) kmsg.Response {
	req := kr.(*kmsg.FindCoordinatorRequest)
	resp := req.ResponseKind().(*kmsg.FindCoordinatorResponse)
	resp.ErrorCode = kerr.CoordinatorNotAvailable.Code
	for _, k := range req.CoordinatorKeys {
		co := kmsg.NewFindCoordinatorResponseCoordinator()
		co.Key, co.ErrorCode = k, kerr.CoordinatorNotAvailable.Code
		resp.Coordinators = append(resp.Coordinators, co)
	}
	return resp
}

// TestLagRetriesRefusedCoordinator: right after the group coordinator's
// broker dies, the cluster still names it (until it is fenced), and a
// connection to it is refused. fetchOffsets then lists the brokers again
// and retries within coordinatorWait, finding the new coordinator, rather
// than fail at once with the dial error.
func TestLagRetriesRefusedCoordinator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, named, _ := deadCoordinator(t, ctx, 1)
	offs, err := fetchOffsets(ctx, cl, "meterline-dedup", true)
	// A group that never committed is not found: the coordinator answered.
	if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
		t.Fatalf("offsets with the coordinator's broker gone: %v", err)
	}
	if named.Load() < 2 {
		t.Fatalf("%d FindCoordinator requests, want the coordinator found again", named.Load())
	}
	if len(offs) != 0 {
		t.Fatalf("offsets of a group that never committed: %+v", offs)
	}
}

// TestCollectorRefusedCoordinatorFailsAtOnce: the stages' lag series are
// computed during a scrape, which must answer within Prometheus's scrape
// timeout; a coordinator out of reach fails that computation at once (no
// lag series, the stage's other metrics scraped), rather than wait for
// it until the computation's timeout, past the scrape's (the stage then
// reads as down, and its group membership metric as absent).
func TestCollectorRefusedCoordinatorFailsAtOnce(t *testing.T) {
	_, named, brokers := deadCoordinator(t, context.Background(), 1<<30)
	c, err := NewCollector(kafka.Config{Brokers: brokers[:1]}, []string{"meterline-dedup"}, WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_, err = c.Rows()
	took := time.Since(start)
	if err == nil {
		t.Fatalf("lag computed with the coordinator out of reach")
	}
	if named.Load() == 0 {
		t.Fatalf("no FindCoordinator request: the test did not reach the coordinator (%v)", err)
	}
	if took > 2*time.Second {
		t.Fatalf("the computation took %s with the coordinator out of reach (%v); want it to fail at once, well within a scrape's timeout", took, err)
	}
	t.Logf("failed in %s: %v", took.Round(time.Millisecond), err)
}

// deadCoordinator makes a 2-broker kfake whose FindCoordinator names node
// 1 for its first `dead` answers, then removes node 1 (its connections
// refused, as a broker's just killed, which the cluster names until it is
// fenced); it returns a client of node 0 that knows both brokers, and the
// count of FindCoordinator requests.
func deadCoordinator(t *testing.T, ctx context.Context, dead int32) (*kgo.Client, *atomic.Int32, []string) {
	t.Helper()
	c, brokers := testenv.KFake(t, kfake.NumBrokers(2))
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers[0]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	// The client knows both brokers, as one does that lists them just
	// before the coordinator dies.
	if _, err := adm.BrokerMetadata(ctx); err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(brokers[1])
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	named := new(atomic.Int32)
	c.ControlKey(int16(kmsg.FindCoordinator), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if named.Add(1) > dead {
			return nil, nil, false
		}
		req := kr.(*kmsg.FindCoordinatorRequest)
		resp := req.ResponseKind().(*kmsg.FindCoordinatorResponse)
		resp.NodeID, resp.Host, resp.Port = 1, host, int32(p)
		for _, k := range req.CoordinatorKeys {
			co := kmsg.NewFindCoordinatorResponseCoordinator()
			co.Key, co.NodeID, co.Host, co.Port = k, 1, host, int32(p)
			resp.Coordinators = append(resp.Coordinators, co)
		}
		return resp, nil, true
	})
	if err := c.RemoveNode(1); err != nil {
		t.Fatal(err)
	}
	return cl, named, brokers
}
