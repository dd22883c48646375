package aggregator

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsCPUKFake measures what entitlements cost in CPU: the
// aggregator with and without them over one input, bench aggregate's
// (internal/bench: every customer on a capped plan paying from a grant,
// about 6% of the events over the cap), each from the start of the input
// to caught up, on kfake in this process (which shares the CPU, as the
// broker does in bench aggregate). It reports the process's CPU time per
// event of each run and their ratio; CPU time, unlike wall-clock time,
// barely depends on what else the machine runs. It runs only with
// METERLINE_ENT_CPU set (to the number of events; 1: 200,000).
func TestEntitlementsCPUKFake(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("METERLINE_ENT_CPU"))
	if n == 0 {
		t.Skip("set METERLINE_ENT_CPU to run (the number of events; 1 for 200,000)")
	}
	if n == 1 {
		n = 200_000
	}
	const partitions, customers = 4, 1000
	// Each run has its own topics (its changelog's name is the stage's),
	// with the same input.
	_, brokers := testenv.KFake(t)
	now := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	input := func() *aggHarness {
		h := newEntHarness(t, brokers, partitions)
		written := now.Add(-2 * time.Second).UnixMilli()
		plan := &schemas.Entitlements{Plan: "bench",
			Caps: []schemas.Cap{{Meter: "api_calls", Limit: 1900, OnLimit: schemas.OnLimitReject},
				{Meter: "tokens", Limit: 1900, OnLimit: schemas.OnLimitReject}},
			Grants:    []schemas.Grant{{ID: "bench", Amount: 1_000_000}},
			Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
		rates := &schemas.RateCard{Versions: []schemas.RateVersion{{Rates: []schemas.Rate{
			{Meter: "api_calls", MicroCredits: 1, PerUnits: 1}, {Meter: "tokens", MicroCredits: 15, PerUnits: 1000}}}}}
		h.produce(append(h.shared(partitions, schemas.DefaultPlanKey, plan, written), h.shared(partitions, schemas.RateCardKey, rates, written)...)...)
		meterNames := []string{"api_calls", "tokens", "storage_bytes", "active_users", "seats"}
		var recs []*kgo.Record
		for i := range n {
			c := i % customers
			e := &schemas.DedupedEvent{EventID: fmt.Sprintf("bench-%d", i), CustomerID: fmt.Sprintf("cust-%05d", c),
				Meter: meterNames[(i/customers)%len(meterNames)], Quantity: int64(1 + i%100),
				EventTime: now.Add(-time.Second).Add(time.Duration(i%1000) * time.Millisecond).UnixMilli(), IngestTime: now.UnixMilli(),
				Source: "bench", Properties: []schemas.Property{{Name: "region", Value: []string{"eu-west-1", "us-east-1"}[i%2]},
					{Name: "user", Value: fmt.Sprintf("user-%d", i%50)}}}
			key := schemas.CustomerKey(e.CustomerID)
			recs = append(recs, &kgo.Record{Topic: h.names.DedupedTopic(), Partition: schemas.Partition(key, partitions), Key: key,
				Value: schemas.MustEncode(e)})
			if len(recs) == 10_000 {
				h.produce(recs...)
				recs = recs[:0]
			}
		}
		h.produce(recs...)
		t.Logf("%d events produced", n)
		return h
	}
	meters, err := ParseMeters([]byte(`meters:
  - {name: api_calls, aggregation: SUM, group_by: [region]}
  - {name: tokens, aggregation: SUM}
  - {name: storage_bytes, aggregation: MAX}
  - {name: active_users, aggregation: UNIQUE_COUNT, property: user}
  - {name: seats, aggregation: LATEST}
`))
	if err != nil {
		t.Fatal(err)
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	var perEvent [2]float64
	for i, ent := range []bool{false, true} {
		name := map[bool]string{false: "plain", true: "ent"}[ent]
		if only := os.Getenv("METERLINE_ENT_CPU_ONLY"); only != "" && only != name {
			continue // for a profile of one run
		}
		h := input()
		h.group = h.names.Prefix + "aggregate-" + name
		cfg := h.config(name, vfs.NewMem())
		if ent {
			cfg = h.entConfig(name, vfs.NewMem())
			cfg.EntitlementsTick = 0 // the default, as bench aggregate runs it
		}
		cfg.Meters = meters
		cfg.Stream.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
		cfg.Stream.CommitInterval = 0
		c0, w0 := cpu(), time.Now()
		r := h.start(cfg)
		for {
			if ok, err := testenv.CaughtUp(h.brokers, h.group, h.names.DedupedTopic()); err == nil && ok {
				break
			}
			select {
			case <-r.done:
				t.Fatalf("%s: the aggregator stopped: %v", name, r.err)
			case <-time.After(20 * time.Millisecond):
			}
		}
		c1, w1 := cpu(), time.Now()
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		perEvent[i] = float64(c1-c0) / float64(n)
		t.Logf("%s: %.0f ns CPU a event, %.2f s CPU over %.2f s wall", name, perEvent[i], (c1 - c0).Seconds(), w1.Sub(w0).Seconds())
	}
	t.Logf("CPU a event with entitlements / without: %.2f (its inverse, %.2f, bounds bench aggregate's ratio when CPU is the limit)",
		perEvent[1]/perEvent[0], perEvent[0]/perEvent[1])
}
