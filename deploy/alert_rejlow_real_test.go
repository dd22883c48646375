package deploy

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/producer"
)

// TestRealRejectionSpikeLowTraffic runs MeterlineRejectionSpike (scaled as
// TestRealAlertsFire's, realScale) in a real Prometheus scraping a real
// `meterline dedup` and `meterline aggregate --strict-meters`, on topics of
// 16 partitions, dedup ticking every 5 s (the defaults): each tick sends
// 16 watermark records from each dedup partition, about 51 a second into
// the aggregator, whatever the traffic (docs/operations.md,
// MeterlineRejectionSpike).
//
//  1. Idle (ticks and watermark records only): the rule is never active.
//  2. 5 events a second, every 20th of a meter the meters file does not
//     declare (unknown_meter): 5 % of the aggregator's events, under 0.5 %
//     of its records in. The rule fires for the aggregator, unknown_meter.
func TestRealRejectionSpikeLowTraffic(t *testing.T) {
	e := newAlertEnv(t, "rejlow", 16)
	brokers, work, bin, prefix, base := e.brokers, e.work, e.bin, e.prefix, e.base
	meters := filepath.Join(work, "meters.yaml")
	if err := os.WriteFile(meters, []byte("meters:\n  - name: api_calls\n    aggregation: SUM\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	dedupAddr, aggAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	common := []string{"--brokers", strings.Join(brokers, ","), "--topic-prefix", prefix, "--log-level", "info",
		"--state-dir", filepath.Join(work, "state"), "--session-timeout", "6s", "--transaction-timeout", "10s"}
	dedup := testenv.StartProcess(t, "dedup", filepath.Join(work, "dedup.log"), bin, append(append([]string{"dedup"}, common...),
		"--group", base+"-dedup", "--instance-id", "d1", "--metrics-addr", dedupAddr,
		"--dedup-keys-file", testenv.DedupKeysFile(t), "--sources", "api-gateway")...)
	agg := testenv.StartProcess(t, "aggregate", filepath.Join(work, "aggregate.log"), bin, append(append([]string{"aggregate"}, common...),
		"--group", base+"-aggregate", "--instance-id", "a1", "--metrics-addr", aggAddr,
		"--meters", meters, "--strict-meters", "--period", "hour", "--grace", "2h")...)
	waitHTTP(t, "http://"+dedupAddr+"/readyz", 90*time.Second)
	waitHTTP(t, "http://"+aggAddr+"/readyz", 90*time.Second)
	w := watchScaledRules(t, e.promBin, work, dedupAddr, aggAddr)

	spike := map[string]string{}
	t.Log("---- 1. idle: ticks and watermark records only")
	// The watermark records reach the aggregator (16 x 16 every 5 s),
	// then every scaled window (30 s) sees them and nothing else.
	w.waitValue(`count(sum(rate(meterline_stream_records_in_total{stage="aggregate"}[30s])) > 40)`, 1, 90*time.Second)
	for deadline := time.Now().Add(35 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if a := w.find("MeterlineRejectionSpike", spike); a != nil {
			t.Fatalf("MeterlineRejectionSpike active on an idle pipeline: %v", a)
		}
	}

	t.Log("---- 2. 5 events a second, 5 % of an undeclared meter")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	p := newProducer(t, brokers, prefix)
	t.Cleanup(p.Close)
	go func() {
		defer close(done)
		sendEvery(ctx, t, p, 200*time.Millisecond, func(i int) producer.Event {
			meter := "api_calls"
			if i%20 == 19 {
				meter = "not_declared"
			}
			return producer.Event{EventID: "ev-" + strconv.Itoa(i), CustomerID: "cust-" + strconv.Itoa(i%8), Meter: meter,
				Quantity: 1, EventTime: time.Now().UTC(), Source: "api-gateway"}
		})
	}()
	w.waitFiring("MeterlineRejectionSpike", map[string]string{"stage": "aggregator", "reason": "unknown_meter"})
	if a := w.find("MeterlineRejectionSpike", map[string]string{"stage": "dedup"}); a != nil {
		t.Errorf("dedup rejects nothing, yet: %v", a)
	}
	w.expectRulesHealthy()
	cancel()
	<-done
	dedup.Stop(t)
	agg.Stop(t)
}
