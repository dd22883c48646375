package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
)

// produceDuringOutage runs `meterline produce` of two events while the
// leaders of usage.events are gone (produce requests answered
// NOT_LEADER_FOR_PARTITION, metadata LEADER_NOT_AVAILABLE, as on a broker
// that stopped), with ctx; it fails the test when the command has not
// returned within limit. stop, when not nil, is called a second after the
// outage first answered the command (not a second after its start, which
// under -race may not yet have read its input).
func produceDuringOutage(t *testing.T, ctx context.Context, stop context.CancelFunc, limit time.Duration, args ...string) (int, string, string) {
	t.Helper()
	c, brokers := testenv.KFake(t, kfake.SeedTopics(4, "usage.events"))
	outage := c.Fault(
		kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "usage.events", Err: kerr.NotLeaderForPartition, Count: -1},
		kfake.Fault{Keys: []kmsg.Key{kmsg.Metadata}, Topic: "usage.events", Err: kerr.LeaderNotAvailable, Count: -1},
	)
	ts := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	in := `{"event_id":"a","customer_id":"acme","meter":"api_calls","quantity":1,"event_time":"` + ts + `"}` + "\n" +
		`{"event_id":"b","customer_id":"acme","meter":"api_calls","quantity":1,"event_time":"` + ts + `"}` + "\n"
	type result struct {
		code        int
		out, errOut string
	}
	if stop != nil {
		go func() {
			if outage.Wait(ctx, 1) == nil {
				time.AfterFunc(time.Second, stop)
			}
		}()
	}
	done := make(chan result, 1)
	go func() {
		var out, errb bytes.Buffer
		code := Main(ctx, append([]string{"produce", "--brokers", brokers[0]}, args...),
			IO{Stdin: strings.NewReader(in), Stdout: &out, Stderr: &errb})
		done <- result{code, out.String(), errb.String()}
	}()
	select {
	case r := <-done:
		return r.code, r.out, r.errOut
	case <-time.After(limit):
		t.Fatalf("meterline produce has not returned %s into the outage", limit)
		return 0, "", ""
	}
}

// TestProduceStopsOnSignalDuringOutage: `meterline produce` told to stop
// (SIGINT, SIGTERM: its context ends) while Kafka does not answer stops
// within its grace period, exit 1, saying how many events were not
// acknowledged and that sending them again is safe, instead of waiting
// for the brokers for ever.
func TestProduceStopsOnSignalDuringOutage(t *testing.T) {
	parallelWaitingTest(t, &idleLane)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	code, out, errOut := produceDuringOutage(t, ctx, cancel, 20*time.Second)
	if code != 1 || !strings.Contains(out, "2 not acknowledged") || !strings.Contains(out, "again") {
		t.Fatalf("exit %d; want 1 and the unacknowledged events counted\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if testing.Verbose() {
		t.Logf("stdout: %s\nstderr: %s", out, errOut)
	}
}

// TestProduceOutageTimesOut: with no signal, an event Kafka does not
// acknowledge within --timeout is reported failed, with its line, and
// the command exits 1.
func TestProduceOutageTimesOut(t *testing.T) {
	parallelWaitingTest(t, &idleLane)
	code, out, errOut := produceDuringOutage(t, context.Background(), nil, 30*time.Second, "--timeout", "2s")
	if code != 1 || !strings.Contains(out, "2 failed") || !strings.Contains(errOut, "line 1:") || !strings.Contains(errOut, "line 2:") {
		t.Fatalf("exit %d; want 1 with both events failed\nstdout: %s\nstderr: %s", code, out, errOut)
	}
}
