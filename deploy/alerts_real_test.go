package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// realScale is how TestRealAlertsFire shrinks the shipped rules so that
// each fires within seconds (scrapes and evaluations every second):
// thresholds that are durations and ranges become seconds; ratios and
// counts stay as shipped. The rules not named here run unchanged.
var realScale = map[string]ruleScale{
	"MeterlineStageDown":          {Expr: map[string]string{"10m": "10s"}, For: "2s"},
	"MeterlineConsumerLagGrowing": {Expr: map[string]string{"300": "5", "10m": "10s"}, For: "2s"},
	"MeterlineWatermarkStopped":   {Expr: map[string]string{"5m": "8s"}, For: "2s"},
	"MeterlineFinalOverdue":       {Expr: map[string]string{"1800": "1"}, For: "1s"},
	"MeterlineRejectionSpike":     {Expr: map[string]string{"10m": "30s"}, For: "2s"},
	"MeterlineDuplicateSpike":     {Expr: map[string]string{"10m": "30s"}, For: "2s"},
	"MeterlineRestoreTooLong":     {For: "3s"},
	"MeterlineChangelogUnsafe":    {For: "2s"},
	"MeterlineBrokerClockAhead":   {For: "2s"},
	// More than 5 s of input gated (rates over 20 s) while the lag is
	// under 5 s.
	"MeterlineEntitlementsStalled": {Expr: map[string]string{"60": "5", "5m": "20s"}, For: "2s"},
	// A minute to 4 s: above 4 s for 4 s, past the 8 s --auth-max-age of
	// TestRealIngestKeysStaleAlert's ingest (realKeysAuthMaxAge).
	"MeterlineIngestKeysStale": {Expr: map[string]string{"60": "4"}, For: "4s"},
	// Five minutes out of the group to 8 s: longer than a first join
	// (TestRealKafkaOutageAlert).
	"MeterlineStageNotInGroup": {For: "8s"},
	// More than 5 restarts in 45 s: two dedups with one instance ID
	// fence each other about every 3 s (TestRealDuplicateInstanceAlert).
	"MeterlineSessionRestarts": {Expr: map[string]string{"15m": "45s"}},
	// More than 5 % of the requests failing in every 4 s window, for 4 s
	// (TestRealIngestKafkaFailingAlert: 10 requests a second).
	"MeterlineIngestKafkaFailing": {Expr: map[string]string{"2m": "4s"}, For: "4s"},
	// Ten minutes of requests to 20 s, for 3 s
	// (TestRealIngestKafkaFailingAlert).
	"MeterlineIngestRequestsRefused": {Expr: map[string]string{"10m": "20s"}, For: "3s"},
	// 200 changelog offsets behind (a healthy copy: about 20, one commit
	// interval of writes) for 10 s, not getting closer, for 3 s
	// (TestRealStandbyFallingBehindAlert: 20 changelog records a second
	// per partition).
	"MeterlineStandbyFallingBehind": {Expr: map[string]string{"1000000": "200", "15m": "10s"}, For: "3s"},
	// Restarts in every 20 s window for 8 s: a tail whose reads are
	// refused fails at once, its waits doubling from 1 s, so its restarts
	// are less than 20 s apart for half a minute
	// (TestRealStandbyTailRestartsAlert).
	"MeterlineStandbyTailRestarts": {Expr: map[string]string{"5m": "20s"}, For: "8s"},
	// Five minutes without writing to 8 s; a ping answered within 3 s
	// for the blocked reason (the sink pings every 2 s)
	// (TestRealSinkClickHouseDownAlert).
	"MeterlineSinkClickHouseDown": {Expr: map[string]string{"2m": "3s"}, For: "8s"},
	// Held for 30 s, for 3 s: longer than a transaction of the tests'
	// stages (--transaction-timeout 10s) stays open before the broker
	// aborts it (its timeout, then up to 10 s until the broker looks)
	// (TestRealInputHeldByOpenTransactionAlert).
	"MeterlineInputHeldByOpenTransaction": {Expr: map[string]string{"1800": "30"}, For: "3s"},
	// The count of re-plans as shipped (6: 15.5 s of the restore's own
	// backoff), held for 3 s rather than 5 minutes
	// (TestRealRestoreStuckOutOfRangeAlert).
	"MeterlineRestoreStuckOutOfRange": {For: "3s"},
	// A wait for committed offsets longer than 8 s, for 2 s: the
	// transaction of TestRealOffsetsWaitTooLongAlert's previous owner
	// stays open until the test aborts it.
	"MeterlineOffsetsWaitTooLong": {Expr: map[string]string{"300": "8"}, For: "2s"},
	// Writes refused for 3 s: the gauge shows once a transaction has
	// waited 5 s unwritten (TestRealWritesRefusedAlert).
	"MeterlineWritesRefused": {For: "3s"},
	// Lag not computed for 5 s: a computation is cached for 5 s, so at
	// least one failed computation after another
	// (TestRealConsumerLagUnknownAlert).
	"MeterlineConsumerLagUnknown": {For: "5s"},
}

// realAlertsFired lists the alerts TestRealAlertsFire fires (TestAlertRules
// requires every rule of alerts.yml to be here).
var realAlertsFired = []string{
	"MeterlineStageDown", "MeterlineConsumerLagGrowing", "MeterlineWatermarkStopped", "MeterlineFinalOverdue",
	"MeterlineRejectionSpike", "MeterlineDuplicateSpike", "MeterlineForgedHeaders", "MeterlineUnauthenticatedTicks",
	"MeterlineRestoreTooLong", "MeterlineFullRestoreBeyondHorizon", "MeterlineRestoreHorizonExceeded",
}

// realEntAlertsFired lists the alerts TestRealEntitlementsStalledAlert
// fires (alert_ent_real_test.go).
var realEntAlertsFired = []string{"MeterlineEntitlementsStalled"}

// realKeysAlertsFired lists the alerts TestRealIngestKeysStaleAlert fires
// (alert_keys_real_test.go).
var realKeysAlertsFired = []string{"MeterlineIngestKeysStale"}

// realOutageAlertsFired lists the alerts TestRealKafkaOutageAlert and
// TestRealDuplicateInstanceAlert fire (alert_outage_real_test.go).
var realOutageAlertsFired = []string{"MeterlineStageNotInGroup", "MeterlineSessionRestarts"}

// realIngestKafkaAlertsFired lists the alerts TestRealIngestKafkaFailingAlert
// fires (alert_ingkafka_real_test.go).
var realIngestKafkaAlertsFired = []string{"MeterlineIngestKafkaFailing", "MeterlineIngestRequestsRefused"}

// realAlertSlots holds one token per real alert test running: at most two
// run at once, whatever -parallel is (docs/testing.md, Time by part).
var realAlertSlots = make(chan struct{}, 2)

// parallelAlertTest runs the real alert test t beside at most one other:
// each runs its own Prometheus, processes, groups and topics (its own
// broker, when it stops one), and spends most of its time waiting for a
// rule's scaled window or for:. Its slot is freed once everything it
// started has stopped.
func parallelAlertTest(t *testing.T) {
	t.Helper()
	testenv.Beside(t, realAlertSlots)
}

// realFired lists the alerts the real tests fire, all together.
func realFired() []string {
	return slices.Concat(realAlertsFired, realEntAlertsFired, realKeysAlertsFired, realOutageAlertsFired, realIngestKafkaAlertsFired,
		realStandbyAlertsFired, realStandbyTailAlertsFired, realSinkCHAlertsFired, realHeldAlertsFired, realRestoreOORAlertsFired,
		realChangelogAlertsFired, realClockAlertsFired, realWMIgnoredAlertsFired, realWaitAlertsFired, realLagUnknownAlertsFired)
}

// TestRealAlertsFire runs the shipped alert rules (their numbers scaled
// down, realScale) in Debian's Prometheus against a real `meterline dedup`
// and `meterline aggregate` on the real broker, and makes each alert fire
// by the condition it names:
//
//  1. Healthy pipeline (events, ticks, watermarks): no alert is pending or
//     firing.
//  2. A broken producer for a few seconds: undecodable records and events
//     40 days old (MeterlineRejectionSpike, per reason), one source sending
//     every event three times (MeterlineDuplicateSpike for it, not for the
//     clean source), records with forged re-route headers
//     (MeterlineForgedHeaders) and unsigned ticks
//     (MeterlineUnauthenticatedTicks). No other alert.
//  3. Dedup stopped: MeterlineStageDown, and the aggregator's watermark
//     stops (MeterlineWatermarkStopped).
//  4. The aggregator restarted with a grace that puts the period of events
//     it holds open 6 s ahead: the watermark cannot pass it
//     (MeterlineFinalOverdue). Restarted again with its changelog's
//     delete.retention.ms at 1 ms: its warm state is current, so it
//     restores the tail, but a full restore would not fit
//     (MeterlineRestoreHorizonExceeded).
//  5. Dedup restarted after longer than its changelog's delete.retention.ms
//     (set to 4 s): a full restore for the horizon
//     (MeterlineFullRestoreBeyondHorizon); a previous owner's transaction
//     left open on changelog partition 1 holds that partition's restore
//     (MeterlineRestoreTooLong) while events keep arriving on it
//     (MeterlineConsumerLagGrowing).
//  6. The transaction aborted: the restore ends, the partition catches up,
//     the watermark passes the period's end + grace and its FINAL goes out
//     (read from usage.aggregates): the lag, restore, watermark and FINAL
//     alerts resolve.
//
// At the end every rule evaluated without error.
func TestRealAlertsFire(t *testing.T) {
	promBin := realPrometheus(t, "alert rules")
	parallelAlertTest(t)
	brokers := testenv.RealKafka(t)
	testStart := time.Now()
	work := testenv.LogDir(t, "meterline-alerts-test-*") // "meterline" marks our prometheus for prometheus.sh
	bin := testenv.Meterline(t)
	t.Logf("meterline binary ready after %s", time.Since(testStart).Round(100*time.Millisecond))
	keys := testenv.DedupKeysFile(t)

	prefix := testenv.Name(t, "alerts") + "."
	group := strings.TrimSuffix(prefix, ".")
	dedupGroup, aggGroup := group+"-dedup", group+"-aggregate"
	names := topics.DefaultNames()
	names.Prefix = prefix
	deleteTopicsAfter(t, brokers, prefix)
	runCmd(t, bin, filepath.Join(work, "topics.log"), "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--partitions", "2", "--replication-factor", "1")
	adm := testenv.Admin(t, brokers)

	dedupAddr, aggAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	common := []string{"--brokers", strings.Join(brokers, ","), "--topic-prefix", prefix, "--log-level", "info",
		"--state-dir", filepath.Join(work, "state"), "--session-timeout", "6s", "--transaction-timeout", "10s"}
	startDedup := func(n int) *testenv.Process {
		args := append([]string{"dedup"}, common...)
		args = append(args, "--group", dedupGroup, "--instance-id", "d1", "--metrics-addr", dedupAddr,
			"--tick-interval", "1s", "--dedup-keys-file", keys, "--sources", "api-gateway,batch-jobs")
		return testenv.StartProcessOpts(t, testenv.ProcessOpts{MayDie: true}, fmt.Sprintf("dedup-%d", n),
			filepath.Join(work, fmt.Sprintf("dedup-%d.log", n)), bin, args...)
	}
	// The period of the test's period events: the hour before the one the
	// test starts in. It ends at periodEnd, which is in the past.
	periodEnd := time.Now().UTC().Truncate(time.Hour)
	startAgg := func(n int, grace time.Duration) *testenv.Process {
		args := append([]string{"aggregate"}, common...)
		args = append(args, "--group", aggGroup, "--instance-id", "a1", "--metrics-addr", aggAddr,
			"--period", "hour", "--grace", grace.Round(time.Millisecond).String())
		return testenv.StartProcess(t, fmt.Sprintf("aggregate-%d", n), filepath.Join(work, fmt.Sprintf("aggregate-%d.log", n)), bin, args...)
	}

	phase := func(name string) {
		t.Logf("---- %s (at %s)", name, time.Since(testStart).Round(100*time.Millisecond))
	}
	phase("0. start (topics created)")
	dedup1 := startDedup(1)
	agg := startAgg(1, 2*time.Hour) // the period's end + grace is an hour or more ahead
	waitHTTP(t, "http://"+dedupAddr+"/readyz", 90*time.Second)
	waitHTTP(t, "http://"+aggAddr+"/readyz", 90*time.Second)

	// Prometheus once both targets answer, so that a target that is not
	// up yet is no alert.
	rulesFile := filepath.Join(work, "alerts.yml")
	if err := os.WriteFile(rulesFile, scaledRules(t, realScale), 0o644); err != nil {
		t.Fatal(err)
	}
	// Scrapes and evaluations every second (testScrapeInterval).
	prom := startPrometheus(t, promBin, work, rulesFile, dedupAddr, aggAddr)
	w := &alertWatch{t: t, prom: prom, fired: map[string]bool{}}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	p := newProducer(t, brokers, prefix)
	t.Cleanup(p.Close)
	send := func(e producer.Event) {
		t.Helper()
		if err := p.Send(ctx, e); err != nil {
			t.Fatalf("send %s: %v", e.EventID, err)
		}
	}
	raw, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(raw.Close)

	// Events keep arriving on both partitions from a clean source, all
	// test long (the input that piles up behind a stuck partition).
	sendLive(ctx, t, &wg, p, 250*time.Millisecond)
	// Events of the period that ended at periodEnd, for every customer
	// (both partitions of usage.deduped).
	for i := 0; i < 8; i++ {
		send(producer.Event{EventID: fmt.Sprintf("period-%d", i), CustomerID: fmt.Sprintf("cust-%d", i), Meter: "api_calls",
			Quantity: 10, EventTime: periodEnd.Add(-30 * time.Minute), Source: "api-gateway"})
	}

	promReady := time.Now()
	phase("1. healthy")
	// The aggregator holds the period open: its FINAL is due at its end
	// + grace, two hours after periodEnd.
	w.waitValue(`min(meterline_aggregate_final_due_seconds)`, float64(periodEnd.Add(2*time.Hour).Unix()), 60*time.Second)
	// Every scaled window (the longest: 10 s) sees only the healthy
	// pipeline.
	if d := time.Since(promReady); d < 11*time.Second {
		time.Sleep(11*time.Second - d)
	}
	w.expectQuiet("a healthy pipeline")

	phase("2. a broken producer")
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := brokenProducer(ctx, p, raw, names.EventsTopic()); err != nil && ctx.Err() == nil {
			t.Errorf("broken producer: %v", err)
		}
	}()
	w.waitFiring("MeterlineRejectionSpike", map[string]string{"stage": "dedup", "reason": "undecodable"})
	w.waitFiring("MeterlineRejectionSpike", map[string]string{"stage": "dedup", "reason": "too_old"})
	w.waitFiring("MeterlineDuplicateSpike", map[string]string{"source": "batch-jobs"})
	w.waitFiring("MeterlineForgedHeaders", map[string]string{"instance": dedupAddr})
	w.waitFiring("MeterlineUnauthenticatedTicks", map[string]string{"instance": dedupAddr})
	w.expectOnly("a broken producer", "MeterlineRejectionSpike", "MeterlineDuplicateSpike", "MeterlineForgedHeaders", "MeterlineUnauthenticatedTicks")
	if a := w.find("MeterlineDuplicateSpike", map[string]string{"source": "api-gateway"}); a != nil {
		t.Errorf("the clean source has a duplicate spike: %v", a)
	}

	// Stopped, not killed: a SIGKILL loses Pebble's unsynced WAL tail, and
	// the restart would be a full restore for no_state, not for the
	// horizon (phase 5).
	phase("3. dedup stopped")
	dedup1.Stop(t)
	killed := time.Now()
	w.waitFiring("MeterlineStageDown", map[string]string{"instance": dedupAddr})
	w.waitFiring("MeterlineWatermarkStopped", map[string]string{"instance": aggAddr, "partition": "0"})
	w.waitFiring("MeterlineWatermarkStopped", map[string]string{"instance": aggAddr, "partition": "1"})

	phase("4. the aggregator restarted: the period's end + grace 6 s ahead, then its changelog's delete.retention.ms at 1 ms")
	agg.Stop(t)
	grace := time.Since(periodEnd) + 6*time.Second // periodEnd + grace = now + 6 s
	agg = startAgg(2, grace)
	waitHTTP(t, "http://"+aggAddr+"/readyz", 60*time.Second)
	setTopicConfig(t, adm, names.AggregateChangelogTopic(), "delete.retention.ms", "1")
	agg.Stop(t)
	agg = startAgg(3, grace)
	waitHTTP(t, "http://"+aggAddr+"/readyz", 60*time.Second)
	setTopicConfig(t, adm, names.AggregateChangelogTopic(), "delete.retention.ms", "")
	w.waitFiring("MeterlineRestoreHorizonExceeded", map[string]string{"instance": aggAddr, "stage": "aggregate"})
	w.waitFiring("MeterlineFinalOverdue", map[string]string{"instance": aggAddr})

	phase("5. dedup restarted: a full restore for the horizon; partition 1 held by an open transaction")
	setTopicConfig(t, adm, names.DedupChangelogTopic(), "delete.retention.ms", "4000")
	if d := time.Since(killed); d < 5*time.Second {
		time.Sleep(5*time.Second - d) // the state is older than the horizon
	}
	prev := openTransaction(ctx, t, brokers, prefix+"previous-owner", time.Minute, names.DedupChangelogTopic(), 1)
	dedup2 := startDedup(2)
	w.waitFiring("MeterlineFullRestoreBeyondHorizon", map[string]string{"instance": dedupAddr, "stage": "dedup"})
	w.waitFiring("MeterlineRestoreTooLong", map[string]string{"instance": dedupAddr, "stage": "dedup", "partition": "1"})
	w.waitFiring("MeterlineConsumerLagGrowing", map[string]string{"group": dedupGroup, "topic": names.EventsTopic(), "partition": "1"})
	if w.find("MeterlineFinalOverdue", map[string]string{"instance": aggAddr}) == nil {
		t.Error("MeterlineFinalOverdue resolved while dedup partition 1 was still restoring")
	}

	phase("6. the transaction aborted: everything catches up")
	actx, acancel := context.WithTimeout(ctx, 30*time.Second)
	if err := prev.EndTransaction(actx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	acancel()
	waitHTTP(t, "http://"+dedupAddr+"/readyz", 60*time.Second)
	for _, a := range []struct {
		name  string
		match map[string]string
	}{
		{"MeterlineRestoreTooLong", map[string]string{"instance": dedupAddr}},
		{"MeterlineConsumerLagGrowing", map[string]string{"group": dedupGroup}},
		{"MeterlineWatermarkStopped", map[string]string{"instance": aggAddr}},
		{"MeterlineFinalOverdue", map[string]string{"instance": aggAddr}},
		{"MeterlineStageDown", map[string]string{"instance": dedupAddr}},
	} {
		w.waitResolved(a.name, a.match)
	}
	finals := 0
	for _, r := range testenv.ReadAll(t, brokers, names.AggregatesTopic()) {
		var a schemas.Aggregate
		if err := schemas.DecodeInto(r.Value, &a); err != nil {
			t.Fatal(err)
		}
		if a.Status == schemas.StatusFinal && a.PeriodEnd == periodEnd.UnixMilli() {
			finals++
		}
	}
	if finals != 8 {
		t.Errorf("%d FINAL revisions of the period ending %s, want 8 (one per customer)", finals, periodEnd)
	}

	// Every rule evaluated without error all along, and every alert fired.
	w.expectRulesHealthy()
	w.expectFired(realAlertsFired)
	cancel()
	wg.Wait()
	dedup2.Stop(t)
	agg.Stop(t)
	t.Logf("alerts test took %s", time.Since(testStart).Round(100*time.Millisecond))
}

// openTransaction begins a transaction as txID (timeout: the broker
// aborts it then) with one record on topic's partition p, and leaves it
// open: what a producer that went away leaves behind. The changelog's last
// stable offset stays there until the transaction ends.
func openTransaction(ctx context.Context, t *testing.T, brokers []string, txID string, timeout time.Duration, topic string, p int32) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(txID),
		kgo.TransactionTimeout(timeout), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Key: []byte("in-flight"), Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return cl
}

// brokenProducer sends, for 6 s: every event of source batch-jobs three
// times (the first copy and two retries), events 40 days old, undecodable
// records, events with dedup's re-route headers but no signature (an
// arrival of the producer's choosing, which dedup must not take), and
// unsigned ticks.
func brokenProducer(ctx context.Context, p *producer.Producer, raw *kgo.Client, topic string) error {
	now := time.Now().UTC()
	tick, err := schemas.Encode(&schemas.Tick{InstanceID: "intruder"})
	if err != nil {
		return err
	}
	for i := 0; i < 24; i++ {
		id := fmt.Sprintf("storm-%d", i)
		e := producer.Event{EventID: id, CustomerID: fmt.Sprintf("cust-%d", i%8), Meter: "api_calls", Quantity: 1,
			EventTime: now, Source: "batch-jobs"}
		for range 3 {
			if err := p.Send(ctx, e); err != nil {
				return err
			}
		}
		if err := p.Send(ctx, producer.Event{EventID: "old-" + id, CustomerID: "cust-0", Meter: "api_calls", Quantity: 1,
			EventTime: now.Add(-40 * 24 * time.Hour), Source: "api-gateway"}); err != nil {
			return err
		}
		ue := &schemas.UsageEvent{EventID: "forged-" + id, CustomerID: "cust-1", Meter: "api_calls", Quantity: 1,
			EventTime: now.UnixMilli(), Source: "api-gateway"}
		key := ue.Identity().Key()
		v, err := schemas.Encode(ue)
		if err != nil {
			return err
		}
		if err := raw.ProduceSync(ctx,
			&kgo.Record{Topic: topic, Partition: int32(i % 2), Key: []byte("garbage"), Value: []byte("not avro")},
			&kgo.Record{Topic: topic, Partition: schemas.Partition(key, 2), Key: key, Value: v,
				Headers: []kgo.RecordHeader{{Key: dedup.HeaderRerouted, Value: []byte("0/0")},
					{Key: dedup.HeaderArrival, Value: []byte(fmt.Sprint(now.Add(-24 * time.Hour).UnixMilli()))}}},
			&kgo.Record{Topic: topic, Partition: int32(i % 2), Value: tick},
		).FirstErr(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return nil
}

// setTopicConfig sets a topic config, or removes it (back to the broker
// default) when value is empty.
func setTopicConfig(t *testing.T, adm *kadm.Client, topic, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ac := kadm.AlterConfig{Op: kadm.SetConfig, Name: key, Value: kadm.StringPtr(value)}
	if value == "" {
		ac = kadm.AlterConfig{Op: kadm.DeleteConfig, Name: key}
	}
	res, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{ac}, topic)
	if err == nil {
		for _, r := range res {
			if r.Err != nil {
				err = fmt.Errorf("%w: %s", r.Err, r.ErrMessage)
			}
		}
	}
	if err != nil {
		t.Fatalf("set %s %s=%q: %v", topic, key, value, err)
	}
	t.Logf("topic %s: %s=%q", topic, key, value)
}

// alertWatch follows a Prometheus's alerts.
type alertWatch struct {
	t     *testing.T
	prom  promClient
	fired map[string]bool // alert names seen firing
}

const alertWait = 60 * time.Second

// watchScaledRules writes the shipped rules, scaled (realScale), to work,
// starts promBin on them scraping targets (startPrometheus), and returns
// a watch of its alerts.
func watchScaledRules(t *testing.T, promBin, work string, targets ...string) *alertWatch {
	t.Helper()
	rulesFile := filepath.Join(work, "alerts.yml")
	if err := os.WriteFile(rulesFile, scaledRules(t, realScale), 0o644); err != nil {
		t.Fatal(err)
	}
	return &alertWatch{t: t, prom: startPrometheus(t, promBin, work, rulesFile, targets...), fired: map[string]bool{}}
}

func (w *alertWatch) active() []activeAlert {
	w.t.Helper()
	as, err := w.prom.alerts()
	if err != nil {
		w.t.Fatalf("prometheus alerts: %v", err)
	}
	for _, a := range as {
		if a.State == "firing" {
			w.fired[a.Labels["alertname"]] = true
		}
	}
	return as
}

func matches(a activeAlert, name string, match map[string]string) bool {
	if a.Labels["alertname"] != name {
		return false
	}
	for k, v := range match {
		if a.Labels[k] != v {
			return false
		}
	}
	return true
}

// find returns the active (pending or firing) alert name with the labels
// of match, or nil.
func (w *alertWatch) find(name string, match map[string]string) *activeAlert {
	w.t.Helper()
	for _, a := range w.active() {
		if matches(a, name, match) {
			return &a
		}
	}
	return nil
}

func (w *alertWatch) describe() string {
	var b strings.Builder
	for _, a := range w.active() {
		fmt.Fprintf(&b, "\n  %v", a)
	}
	if b.Len() == 0 {
		return " none"
	}
	return b.String()
}

// waitFiring waits until alert name fires with the labels of match.
func (w *alertWatch) waitFiring(name string, match map[string]string) {
	w.t.Helper()
	start := time.Now()
	for {
		for _, a := range w.active() {
			if matches(a, name, match) && a.State == "firing" {
				w.t.Logf("fired after %s: %v: %s", time.Since(start).Round(100*time.Millisecond), a, a.Annotations["summary"])
				return
			}
		}
		if time.Since(start) > alertWait {
			w.t.Fatalf("%s%v not firing after %s; active alerts:%s\nrule: %s", name, match, alertWait, w.describe(), w.ruleState(name))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitResolved waits until no alert name with the labels of match is
// pending or firing.
func (w *alertWatch) waitResolved(name string, match map[string]string) {
	w.t.Helper()
	start := time.Now()
	for w.find(name, match) != nil {
		if time.Since(start) > alertWait {
			w.t.Fatalf("%s%v still active after %s; active alerts:%s", name, match, alertWait, w.describe())
		}
		time.Sleep(250 * time.Millisecond)
	}
	w.t.Logf("resolved after %s: %s%v", time.Since(start).Round(100*time.Millisecond), name, match)
}

// expectQuiet fails the test if any alert is pending or firing.
func (w *alertWatch) expectQuiet(what string) {
	w.t.Helper()
	if as := w.active(); len(as) > 0 {
		w.t.Fatalf("%s: alerts active:%s", what, w.describe())
	}
	w.t.Logf("%s: no alert pending or firing", what)
}

// expectOnly fails the test if an alert not named is pending or firing.
func (w *alertWatch) expectOnly(what string, names ...string) {
	w.t.Helper()
	for _, a := range w.active() {
		if !slices.Contains(names, a.Labels["alertname"]) {
			w.t.Fatalf("%s: %v is active; only %v should be. Active:%s", what, a, names, w.describe())
		}
	}
}

// waitValue waits until the instant query q returns one sample equal to
// want.
func (w *alertWatch) waitValue(q string, want float64, d time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(d)
	var last []promSample
	for {
		res, err := w.prom.query(q)
		if err == nil && len(res) == 1 && res[0].value == want {
			return
		}
		last = res
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: %v (err %v) after %s, want %v", q, last, err, d, want)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

type ruleStatus struct {
	Name      string `json:"name"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
	State     string `json:"state"`
	Query     string `json:"query"`
}

func (w *alertWatch) rules() []ruleStatus {
	w.t.Helper()
	var data struct {
		Groups []struct {
			Rules []ruleStatus `json:"rules"`
		} `json:"groups"`
	}
	if err := w.prom.get("/api/v1/rules", nil, &data); err != nil {
		w.t.Fatalf("prometheus rules: %v", err)
	}
	var out []ruleStatus
	for _, g := range data.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

func (w *alertWatch) ruleState(name string) string {
	for _, r := range w.rules() {
		if r.Name == name {
			return fmt.Sprintf("%s health %s %s state %s: %s", r.Name, r.Health, r.LastError, r.State, r.Query)
		}
	}
	return name + ": not loaded"
}

// expectRulesHealthy fails the test if a rule is not loaded or its last
// evaluation failed (an expression that errors never fires).
// expectFired fails the test for every alert of names that never fired
// while w watched.
func (w *alertWatch) expectFired(names []string) {
	w.t.Helper()
	for _, n := range names {
		if !w.fired[n] {
			w.t.Errorf("%s never fired", n)
		}
	}
}

func (w *alertWatch) expectRulesHealthy() {
	w.t.Helper()
	rs := w.rules()
	if want := len(realFired()); len(rs) != want {
		w.t.Errorf("%d rules loaded, want %d", len(rs), want)
	}
	for _, r := range rs {
		if r.Health != "ok" || r.LastError != "" {
			w.t.Errorf("rule %s: health %q, last error %q", r.Name, r.Health, r.LastError)
		}
	}
}
