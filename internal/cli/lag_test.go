package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
)

// TestLagNamesAGroupWithoutOffsets: a group that `meterline lag` shows no
// partition of (a misspelt --group, or a group that never committed) is
// named on stderr, rather than left out of the table without a word.
func TestLagNamesAGroupWithoutOffsets(t *testing.T) {
	_, brokers := testenv.KFake(t)
	code, stdout, stderr := run(t, "", "lag", "--brokers", strings.Join(brokers, ","), "--group", "meterline-dedp")
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "0 partitions") {
		t.Errorf("stdout %q: want the empty table", stdout)
	}
	if !strings.Contains(stderr, `group "meterline-dedp" has no committed offsets`) {
		t.Errorf("stderr %q does not name the group without offsets", stderr)
	}
}

// TestLagSeedBrokerSilent: `meterline lag` whose --brokers name a broker
// that accepts connections and never answers (paused, its host cut off,
// while the cluster runs on without it), first or last, prints the
// group's lag as quickly as the stages' lag gauges do (docs/operations.md,
// Lag): its credentials check and its lag computation ask every seed at
// once and read from the brokers the cluster lists. Asked one after the
// other, each request that picked the silent seed waited for the
// client's request timeout (10 s), and the command took 20 to 35 s, or
// failed.
func TestLagSeedBrokerSilent(t *testing.T) {
	_, brokers := testenv.KFake(t)
	group := groupTwoBehind(t, brokers)
	ctx := context.Background()
	silent := testenv.SilentBroker(t)
	for _, seeds := range [][]string{{silent, brokers[0]}, {brokers[0], silent}} {
		// Well under the request timeout a silent seed costs each
		// request that picks it.
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var stdout, stderr bytes.Buffer
		code := Main(rctx, []string{"lag", "--brokers", strings.Join(seeds, ","), "--group", group},
			IO{Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr})
		late := rctx.Err()
		cancel()
		if late != nil || code != 0 {
			t.Fatalf("--brokers %s: exit %d, context %v\nstdout: %s\nstderr: %s", strings.Join(seeds, ","), code, late, stdout.String(), stderr.String())
		}
		if !strings.Contains(stdout.String(), "1 behind, 2 records behind") {
			t.Errorf("--brokers %s: stdout %q; want partition 0 two records behind", strings.Join(seeds, ","), stdout.String())
		}
	}
}

// TestLagWatchRidesOutAFailedComputation: `meterline lag --watch` is what
// an SRE keeps open during an incident, and a computation fails then (the
// group's coordinator on a broker just killed, refusing connections, until
// the cluster moves it): the watch says so on stderr and computes again
// at the next refresh, rather than exit at the first failure.
func TestLagWatchRidesOutAFailedComputation(t *testing.T) {
	c, brokers := testenv.KFake(t)
	group := groupTwoBehind(t, brokers)
	ctx := context.Background()
	// The first computations fail with an error no retry of kgo's hides.
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetFetch}, Err: kerr.GroupAuthorizationFailed, Count: 2})
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := Main(rctx, []string{"lag", "--brokers", strings.Join(brokers, ","), "--group", group, "--watch", "200ms"},
		IO{Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr})
	if rctx.Err() == nil || code != 0 {
		t.Fatalf("lag --watch ended before it was stopped: exit %d\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
	}
	if !strings.Contains(stderr.String(), "lag not computed") || !strings.Contains(stderr.String(), "GROUP_AUTHORIZATION_FAILED") {
		t.Errorf("stderr %q: want each failed computation named", stderr.String())
	}
	if !strings.Contains(stdout.String(), "1 behind, 2 records behind") {
		t.Errorf("stdout %q: want the table once the computation succeeds", stdout.String())
	}
}

// groupTwoBehind makes a topic of one partition holding 3 records and a
// group that committed offset 1 of it (2 records behind), and returns the
// group.
func groupTwoBehind(t *testing.T, brokers []string) string {
	t.Helper()
	topic, group := testenv.Name(t, "lag"), testenv.Name(t, "group")
	testenv.CreateTopic(t, brokers, topic, 1, nil)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	for range 3 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var offs kadm.Offsets
	offs.AddOffset(topic, 0, 1, -1)
	if _, err := kadm.NewClient(cl).CommitOffsets(ctx, group, offs); err != nil {
		t.Fatal(err)
	}
	return group
}

// TestLagWatchNamesAGroupWithoutOffsets: `meterline lag --watch` with a
// group that has no row (misspelt, or it has committed nothing yet)
// names it at each refresh, under the table, as the one-shot table does:
// a watch showing the other groups' rows would otherwise leave it out
// without a word for as long as it runs.
func TestLagWatchNamesAGroupWithoutOffsets(t *testing.T) {
	_, brokers := testenv.KFake(t)
	group := groupTwoBehind(t, brokers)
	rctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := Main(rctx, []string{"lag", "--brokers", strings.Join(brokers, ","), "--group", group, "--group", "meterline-dedp", "--watch", "200ms"},
		IO{Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr})
	if rctx.Err() == nil || code != 0 {
		t.Fatalf("lag --watch ended before it was stopped: exit %d\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
	}
	refreshes := strings.Count(stdout.String(), "records behind in total")
	note := `group "meterline-dedp" has no committed offsets`
	if refreshes < 2 || strings.Count(stdout.String()+stderr.String(), note) != refreshes {
		t.Errorf("%d refreshes, %d notes of the group without offsets; want one a refresh\nstdout: %s\nstderr: %s",
			refreshes, strings.Count(stdout.String()+stderr.String(), note), stdout.String(), stderr.String())
	}
}

// TestLagGroupNamedTwice: a group named twice (`--group g --group g`, or
// a default group named again) has its rows once, and the totals count
// its records behind once.
func TestLagGroupNamedTwice(t *testing.T) {
	_, brokers := testenv.KFake(t)
	group := groupTwoBehind(t, brokers)
	code, stdout, stderr := run(t, "", "lag", "--brokers", strings.Join(brokers, ","), "--group", group, "--group", group)
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "1 partitions, 1 behind, 2 records behind in total") || strings.Count(stdout, group) != 1 {
		t.Errorf("stdout %q: want the group's one row, 2 records behind", stdout)
	}
}
