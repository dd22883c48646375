package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestSkewedAggregateInput: the skewed input gives customer 0 exactly half
// of the events over every meter, and, usage.deduped being keyed by
// customer, they all land in one partition.
func TestSkewedAggregateInput(t *testing.T) {
	const n, customers, partitions = 10_000, 50, 16
	perCustomer := map[string]int{}
	meters := map[string]bool{}
	hotPartitions := map[int32]bool{}
	hot := skewedAggregateEvent(0, customers, inputNow).CustomerID
	for i := range n {
		e := skewedAggregateEvent(i, customers, inputNow)
		perCustomer[e.CustomerID]++
		if e.CustomerID == hot {
			meters[e.Meter] = true
			r, err := dedupedRecord("usage.deduped.v2", partitions, e)
			if err != nil {
				t.Fatal(err)
			}
			hotPartitions[r.Partition] = true
		}
	}
	if perCustomer[hot] != n/2 {
		t.Errorf("customer %s has %d of %d events, want half", hot, perCustomer[hot], n)
	}
	if len(perCustomer) != customers {
		t.Errorf("%d customers, want %d", len(perCustomer), customers)
	}
	if len(meters) != len(aggregateMeterNames) {
		t.Errorf("the hot customer uses meters %v, want all %d", meters, len(aggregateMeterNames))
	}
	if len(hotPartitions) != 1 {
		t.Errorf("the hot customer's events are in partitions %v, want one", hotPartitions)
	}
	cfg := AggregateConfig{Customers: 1, Events: 10, Skewed: true, StageConfig: smallStage(t.TempDir())}
	cfg.Rounds = 1
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "at least 2 customers") {
		t.Errorf("Validate of a skewed input of one customer = %v", err)
	}
}

// TestAggregateSkewedRuns runs bench aggregate with the skewed input on
// kfake to the end: it reports the skew, and the busiest partition holds
// at least the hot customer's half of the events.
func TestAggregateSkewedRuns(t *testing.T) {
	_, brokers := testenv.KFake(t)
	env, out := testEnv(t, brokers, &watcher{})
	cfg := smallStage(filepath.Join(t.TempDir(), "state"))
	cfg.Rounds = 1
	const events = 600
	if err := Aggregate(context.Background(), env, AggregateConfig{Events: events, Customers: 20, Skewed: true, StageConfig: cfg}); err != nil {
		t.Fatalf("bench: %v\n%s", err, out.String())
	}
	t.Log(out.String())
	if !strings.Contains(out.String(), "events/s  (") {
		t.Errorf("no result table:\n%s", out.String())
	}
	m := regexp.MustCompile(`skewed: customer (\S+) has half of the events; the busiest partition holds (\d+) of (\d+) events`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no skew line:\n%s", out.String())
	}
	busiest, _ := strconv.Atoi(m[2])
	if m[1] != "cust-00000" || busiest < events/2 || m[3] != fmt.Sprint(events) {
		t.Errorf("skew line %q: want customer cust-00000 and at least %d of %d events in one partition", m[0], events/2, events)
	}
	if left := leftBehind(t, testenv.Admin(t, brokers), env.Topics.Prefix, cfg.StateDir); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestAggregateBenchPricesItsInput: bench aggregate's input is priced by
// its rate card and paid from the plan's grant (docs/entitlements.md, The
// rate card: a card prices only event times at or after its broker time),
// and the result says how many micro-credits the aggregator with
// entitlements drew, and the CPU per event of the aggregator without and
// with entitlements. The measured run decides exactly the pre-filled input:
// no latency phase ran before it.
func TestAggregateBenchPricesItsInput(t *testing.T) {
	_, brokers := testenv.KFake(t)
	w := &watcher{}
	env, out := testEnv(t, brokers, w)
	cfg := smallStage(filepath.Join(t.TempDir(), "state"))
	cfg.Rounds = 1
	if err := Aggregate(context.Background(), env, AggregateConfig{Events: 600, Customers: 20, StageConfig: cfg}); err != nil {
		t.Fatalf("bench: %v\n%s\nprogress:\n%s", err, out.String(), w.buf.String())
	}
	t.Log(out.String())
	m := regexp.MustCompile(`last round's decisions: accepted (\d+), over_limit (\d+), no_credit (\d+), invalid (\d+); credits consumed (\d+) micro-credits`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no decisions and credits line:\n%s", out.String())
	}
	decided := 0
	for _, v := range m[1:5] {
		n, _ := strconv.Atoi(v)
		decided += n
	}
	credits, _ := strconv.Atoi(m[5])
	// The measured run decides the 600 events of the input, and nothing
	// that the latency phase of the aggregator without entitlements
	// added: the latency phases come after every measured run.
	if decided != 600 || credits <= 0 || m[3] != "0" {
		t.Errorf("%q: want exactly the 600 events of the input decided, credits drawn and no no_credit", m[0])
	}
	// The CPU of each aggregator per event, beside the rates.
	c := regexp.MustCompile(`CPU per event \(this process\): +without entitlements ([0-9.]+) µs, with ([0-9.]+) µs \(medians; without ÷ with ([0-9.]+)\)`).FindStringSubmatch(out.String())
	if c == nil {
		t.Fatalf("no CPU per event line:\n%s", out.String())
	}
	for _, v := range c[1:] {
		if f, err := strconv.ParseFloat(v, 64); err != nil || f <= 0 {
			t.Errorf("%q: want positive CPU times and ratio", c[0])
		}
	}
}
