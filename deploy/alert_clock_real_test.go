package deploy

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// realClockAlertsFired lists the alerts TestRealBrokerClockAheadAlert
// fires.
var realClockAlertsFired = []string{"MeterlineBrokerClockAhead"}

// TestRealBrokerClockAheadAlert runs the shipped alert rules (scaled as
// TestRealAlertsFire's, realScale) in a real Prometheus scraping a real
// `meterline dedup` on an in-process Kafka (kfake). usage.events uses
// CreateTime (dedup started with --allow-create-time), so the test
// chooses a record's broker time, as a broker whose clock ran ahead does:
//
//  1. Healthy: both partitions' watermarks follow dedup's ticks; no alert.
//  2. One event on partition 0 stamped 2 hours ahead: dedup's watermark of
//     partition 0 moves there, and MeterlineBrokerClockAhead fires for
//     partition 0 only; partition 1's watermark still follows the ticks.
func TestRealBrokerClockAheadAlert(t *testing.T) {
	promBin := realPrometheus(t, "alert rules")
	parallelAlertTest(t)
	work := testenv.LogDir(t, "meterline-alerts-clock-test-*")
	bin := testenv.Meterline(t)
	keys := testenv.DedupKeysFile(t)
	_, brokers := testenv.KFake(t)
	names := testenv.Topics(t, brokers, "", testenv.TopicsOpts{Partitions: 2, EventsTimestamp: "CreateTime"})

	addr := testenv.FreeAddr(t)
	dedup := testenv.StartProcess(t, "dedup", filepath.Join(work, "dedup.log"), bin, "dedup",
		"--brokers", strings.Join(brokers, ","), "--topic-prefix", names.Prefix, "--log-level", "info",
		"--state-dir", filepath.Join(work, "state"), "--session-timeout", "6s", "--transaction-timeout", "10s",
		"--instance-id", "d1", "--metrics-addr", addr, "--allow-create-time",
		"--tick-interval", "1s", "--dedup-keys-file", keys, "--sources", "api-gateway")

	t.Log("---- 1. healthy: both watermarks follow the ticks")
	waitHTTP(t, "http://"+addr+"/readyz", 90*time.Second)
	w := watchScaledRules(t, promBin, work, addr)
	w.waitValue(`count(meterline_dedup_watermark_delay_seconds > -5 < 5)`, 2, 30*time.Second)
	w.expectQuiet("dedup healthy")

	t.Log("---- 2. an event on partition 0 stamped 2 hours ahead")
	ahead := time.Now().Add(2 * time.Hour)
	produceAhead(t, brokers, names.EventsTopic(), 0, ahead)
	w.waitFiring("MeterlineBrokerClockAhead", map[string]string{"instance": addr, "partition": "0", "clock": "dedup_watermark"})
	w.expectOnly("a broker clock ahead", "MeterlineBrokerClockAhead")
	if a := w.find("MeterlineBrokerClockAhead", map[string]string{"partition": "1"}); a != nil {
		t.Errorf("partition 1, whose broker time follows the wall clock, alerts: %v", a)
	}
	w.waitValue(`count(meterline_dedup_watermark_delay_seconds{partition="1"} > -5 < 5)`, 1, 5*time.Second)
	w.expectRulesHealthy()
	w.expectFired(realClockAlertsFired)
	dedup.Stop(t)
}

// produceAhead produces to partition p of topic (CreateTime) one valid
// usage event of a customer keyed to p, stamped at, its event time now.
func produceAhead(t *testing.T, brokers []string, topic string, p int32, at time.Time) {
	t.Helper()
	var e *schemas.UsageEvent
	var key []byte
	for i := 0; ; i++ {
		e = &schemas.UsageEvent{EventID: fmt.Sprintf("ahead-%d", i), CustomerID: fmt.Sprintf("cust-%d", i), Meter: "api_calls",
			Quantity: 1, EventTime: time.Now().UnixMilli(), Source: "api-gateway"}
		if key = e.Identity().Key(); schemas.Partition(key, 2) == p {
			break
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := &kgo.Record{Topic: topic, Partition: p, Key: key, Value: schemas.MustEncode(e), Timestamp: at}
	if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		t.Fatal(err)
	}
}
