package deploy

import (
	"context"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// realWMIgnoredAlertsFired lists the alerts TestRealWatermarksIgnoredAlert
// fires.
var realWMIgnoredAlertsFired = []string{"MeterlineWatermarksIgnored"}

// TestRealWatermarksIgnoredAlert runs the shipped alert rules (scaled as
// TestRealAlertsFire's, realScale) in a real Prometheus scraping a real
// `meterline dedup` and `meterline aggregate` on the real broker, topics
// of two partitions:
//
//  1. Healthy: dedup's watermark records reach both aggregator
//     partitions; none is ignored and no alert is active.
//  2. A producer other than dedup writes two watermark records to
//     usage.deduped, two hours ahead: on partition 0 one that claims a
//     single source partition, on partition 1 one from source partition 2
//     (of 2). The aggregator ignores both, counts one per reason and logs
//     one line per partition; its watermark stays with dedup's, and
//     MeterlineWatermarksIgnored fires for each reason, alone.
//  3. The runbook (docs/operations.md, MeterlineWatermarksIgnored), with
//     Kafka's own kafka-transactions.sh: of the producers
//     describe-producers lists for usage.deduped[0], the one `list` does
//     not show under dedup's transactional ID is the test's, its
//     LastTimestamp that of its write.
func TestRealWatermarksIgnoredAlert(t *testing.T) {
	e := newAlertEnv(t, "wmignored", 2)
	brokers, work, bin, prefix, base := e.brokers, e.work, e.bin, e.prefix, e.base

	dedupAddr, aggAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	common := []string{"--brokers", strings.Join(brokers, ","), "--topic-prefix", prefix, "--log-level", "info",
		"--state-dir", filepath.Join(work, "state"), "--session-timeout", "6s", "--transaction-timeout", "10s"}
	dedup := testenv.StartProcess(t, "dedup", filepath.Join(work, "dedup.log"), bin, append(append([]string{"dedup"}, common...),
		"--group", base+"-dedup", "--instance-id", "d1", "--metrics-addr", dedupAddr, "--tick-interval", "1s",
		"--dedup-keys-file", testenv.DedupKeysFile(t), "--sources", "api-gateway")...)
	agg := testenv.StartProcess(t, "aggregate", filepath.Join(work, "aggregate.log"), bin, append(append([]string{"aggregate"}, common...),
		"--group", base+"-aggregate", "--instance-id", "a1", "--metrics-addr", aggAddr, "--period", "hour", "--grace", "2h")...)
	waitHTTP(t, "http://"+dedupAddr+"/readyz", 90*time.Second)
	waitHTTP(t, "http://"+aggAddr+"/readyz", 90*time.Second)
	w := watchScaledRules(t, e.promBin, work, dedupAddr, aggAddr)
	promReady := time.Now()

	t.Log("---- 1. healthy: dedup's watermark records only")
	w.waitValue(`count(meterline_aggregate_watermark_seconds > time() - 10 < time() + 10)`, 2, 60*time.Second)
	w.waitValue(`count(meterline_aggregate_watermarks_ignored_total == 0)`, 2, 10*time.Second)
	// Every scaled window that sees the stages' start (the longest: 10 s)
	// sees the healthy pipeline only: a watermark Prometheus has scraped
	// for less than 8 s has not changed yet (MeterlineWatermarkStopped).
	if d := time.Since(promReady); d < 11*time.Second {
		time.Sleep(11*time.Second - d)
	}
	w.expectQuiet("dedup's watermark records only")

	t.Log("---- 2. a foreign producer writes watermark records to usage.deduped")
	ahead := time.Now().Add(2 * time.Hour).UnixMilli()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic := e.names.DedupedTopic()
	if err := cl.ProduceSync(ctx,
		&kgo.Record{Topic: topic, Partition: 0, Value: schemas.MustEncode(&schemas.Watermark{SourcePartition: 0, SourcePartitions: 1, Watermark: ahead})},
		&kgo.Record{Topic: topic, Partition: 1, Value: schemas.MustEncode(&schemas.Watermark{SourcePartition: 2, SourcePartitions: 2, Watermark: ahead})},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	wrote := time.Now()
	w.waitValue(`meterline_aggregate_watermarks_ignored_total{reason="source_partitions"}`, 1, 30*time.Second)
	w.waitValue(`meterline_aggregate_watermarks_ignored_total{reason="source_partition"}`, 1, 10*time.Second)
	for _, reason := range []string{"source_partitions", "source_partition"} {
		w.waitFiring("MeterlineWatermarksIgnored", map[string]string{"instance": aggAddr, "reason": reason})
	}
	w.expectOnly("foreign watermark records", "MeterlineWatermarksIgnored")
	w.waitValue(`count(meterline_aggregate_watermark_seconds > time() - 10 < time() + 10)`, 2, 10*time.Second)
	if n := len(agg.Lines("watermark record ignored: it disagrees with the partition count of usage.events in the cluster's metadata")); n != 2 {
		t.Errorf("%d log lines of ignored watermark records, want 2 (one per partition; the runbook names them)", n)
	}

	t.Log("---- 3. the runbook finds the writer")
	foreign, _, err := cl.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := foreignWriters(t, brokers, topic, base+"-dedup-d1", wrote); !slices.Equal(got, []int64{foreign}) {
		t.Errorf("the runbook finds producers %v writing usage.deduped[0] besides dedup, want %d (the test's)", got, foreign)
	}
	w.expectRulesHealthy()
	w.expectFired(realWMIgnoredAlertsFired)
	agg.Stop(t)
	dedup.Stop(t)
}

// foreignWriters returns the producer IDs that wrote topic[0], as
// kafka-transactions.sh describe-producers lists them, other than the one
// `list` shows for dedup's transactional ID dedupTx, as the runbook finds
// them. Each one's LastTimestamp must be within a minute of wrote; dedup's
// producer must be among the partition's.
func foreignWriters(t *testing.T, brokers []string, topic, dedupTx string, wrote time.Time) []int64 {
	t.Helper()
	var dedupID string
	for _, r := range toolTable(transactionsCommand(t, brokers, "list"), "TransactionalId") {
		if r["TransactionalId"] == dedupTx {
			dedupID = r["ProducerId"]
		}
	}
	if dedupID == "" {
		t.Fatalf("kafka-transactions.sh list shows no transactional ID %s", dedupTx)
	}
	var out []int64
	sawDedup := false
	for _, r := range toolTable(transactionsCommand(t, brokers, "describe-producers", "--topic", topic, "--partition", "0"), "ProducerId") {
		if r["ProducerId"] == dedupID {
			sawDedup = true
			continue
		}
		id, err := strconv.ParseInt(r["ProducerId"], 10, 64)
		if err != nil {
			t.Fatalf("describe-producers: ProducerId %q", r["ProducerId"])
		}
		last, err := strconv.ParseInt(r["LastTimestamp"], 10, 64)
		if err != nil {
			t.Fatalf("describe-producers: LastTimestamp %q", r["LastTimestamp"])
		}
		if d := time.UnixMilli(last).Sub(wrote); d < -time.Minute || d > time.Minute {
			t.Errorf("producer %d: LastTimestamp %s, %s from its write", id, time.UnixMilli(last).UTC(), d)
		}
		out = append(out, id)
	}
	if !sawDedup {
		t.Errorf("describe-producers does not list dedup's producer %s", dedupID)
	}
	return out
}

// toolTable reads the table a Kafka command-line tool prints (a header
// line of column names, the first line with column col, then a line per
// row, fields separated by whitespace) as one map of column to value per
// row. Lines before the header (the JVM's warnings) are skipped.
func toolTable(out, col string) []map[string]string {
	var head []string
	var rows []map[string]string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case head == nil:
			if slices.Contains(f, col) {
				head = f
			}
		case len(f) == len(head):
			r := map[string]string{}
			for i, h := range head {
				r[h] = f[i]
			}
			rows = append(rows, r)
		}
	}
	return rows
}
