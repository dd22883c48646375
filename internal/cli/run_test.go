package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/internal/lag"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/sink"
)

// TestRunValidate: `meterline run` checks the sink's flags too, naming the
// bad one, unless --no-sink leaves the sink out.
func TestRunValidate(t *testing.T) {
	keys := testenv.DedupKeysFile(t)
	code, out, errOut := run(t, "", "run", "--validate", "--instance-id", "a", "--dedup-keys-file", keys)
	if code != 0 || !strings.Contains(out, "configuration ok") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	bad := []string{"run", "--validate", "--instance-id", "a", "--sink-insert-timeout", "2m", "--sink-database", "bad-name", "--dedup-keys-file", keys}
	code, _, errOut = run(t, "", bad...)
	if code != 2 || !strings.Contains(errOut, "sink: insert-timeout: 2m0s") || !strings.Contains(errOut, "sink: database: \"bad-name\"") {
		t.Fatalf("exit %d, want 2 naming insert-timeout and database:\n%s", code, errOut)
	}
	code, out, errOut = run(t, "", append(bad, "--no-sink")...)
	if code != 0 || !strings.Contains(out, "configuration ok") {
		t.Fatalf("--no-sink still checks the sink's flags: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestRunRefusesSharedGroup: the stages of `meterline run` are each a
// member of their own consumer group; two given one group would join it
// as members reading different topics, with one transactional ID
// (<group>-<instance-id>). The broker or the group's leader then stops
// the process with an error about co-partitioning or incompatible
// protocols that names no flag, after --validate said the configuration
// was ok. Refused at the start instead, naming the flags; a sink left
// out by --no-sink shares nothing.
func TestRunRefusesSharedGroup(t *testing.T) {
	keys := testenv.DedupKeysFile(t)
	base := []string{"run", "--validate", "--instance-id", "a", "--dedup-keys-file", keys}
	for _, c := range []struct {
		flags []string
		names []string
	}{
		{[]string{"--dedup-group", "g", "--aggregate-group", "g"}, []string{"--dedup-group", "--aggregate-group", `"g"`}},
		{[]string{"--sink-group", "meterline-dedup"}, []string{"--dedup-group", "--sink-group", `"meterline-dedup"`}},
		{[]string{"--aggregate-group", "s", "--sink-group", "s"}, []string{"--aggregate-group", "--sink-group", `"s"`}},
	} {
		code, _, errOut := run(t, "", append(base, c.flags...)...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2:\n%s", c.flags, code, errOut)
			continue
		}
		for _, want := range c.names {
			if !strings.Contains(errOut, want) {
				t.Errorf("%v: the error does not name %s:\n%s", c.flags, want, errOut)
			}
		}
	}
	code, out, errOut := run(t, "", append(base, "--sink-group", "meterline-dedup", "--no-sink")...)
	if code != 0 || !strings.Contains(out, "configuration ok") {
		t.Errorf("--no-sink with the sink's group the dedup's: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestRunRefusesIngestFlagsWithoutIngest: the HTTP ingest of `meterline
// run` is off unless --ingest is given; --ingest-* flags without it, on
// the command line, in the environment or in --config, would be ignored
// (an --ingest-addr that serves nothing). Refused, naming each flag;
// with --ingest they are taken.
func TestRunRefusesIngestFlagsWithoutIngest(t *testing.T) {
	keys := testenv.DedupKeysFile(t)
	config := filepath.Join(t.TempDir(), "run.yaml")
	if err := os.WriteFile(config, []byte("ingest_read_timeout: 10s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"run", "--validate", "--instance-id", "a", "--dedup-keys-file", keys, "--no-sink"}
	for _, c := range []struct {
		flags []string
		env   string
		names []string
	}{
		{[]string{"--ingest-addr", "0.0.0.0:8888"}, "", []string{"--ingest-addr"}},
		{[]string{"--ingest-require-time", "--no-ingest-quota-gate"}, "", []string{"--ingest-require-time", "--ingest-quota-gate"}},
		{nil, "METERLINE_INGEST_MAX_EVENTS", []string{"--ingest-max-events"}},
		{[]string{"--config", config}, "", []string{"--ingest-read-timeout"}},
	} {
		if c.env != "" {
			t.Setenv(c.env, "7")
		}
		code, out, errOut := run(t, "", append(base, c.flags...)...)
		if code != 2 || strings.Contains(out, "configuration ok") || !strings.Contains(errOut, "without --ingest") {
			t.Errorf("%v %s: exit %d, want 2 (without --ingest):\n%s%s", c.flags, c.env, code, out, errOut)
		}
		for _, want := range c.names {
			if !strings.Contains(errOut, want) {
				t.Errorf("%v %s: the error does not name %s:\n%s", c.flags, c.env, want, errOut)
			}
		}
		if code, out, errOut := run(t, "", append(append(base, "--ingest"), c.flags...)...); code != 0 || !strings.Contains(out, "configuration ok") {
			t.Errorf("%v %s with --ingest: exit %d\n%s%s", c.flags, c.env, code, out, errOut)
		}
		if c.env != "" {
			os.Unsetenv(c.env)
		}
	}
	if code, out, errOut := run(t, "", base...); code != 0 || !strings.Contains(out, "configuration ok") {
		t.Errorf("run without --ingest nor its flags: exit %d\n%s%s", code, out, errOut)
	}
}

// TestRunStageFlagsPrefixed: `meterline run` takes each stage's own flags
// with the stage's prefix (--dedup-window, --aggregate-period, as
// --sink-database and --ingest-addr) and the flags the stages share once,
// unprefixed; the aggregator keeps dedup's window, bucket and skew. The
// names of `meterline dedup` and `meterline aggregate` stay unprefixed.
func TestRunStageFlagsPrefixed(t *testing.T) {
	dir := t.TempDir()
	meters := filepath.Join(dir, "meters.yaml")
	if err := os.WriteFile(meters, []byte("meters:\n  - name: tokens\n    aggregation: SUM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys := testenv.DedupKeysFile(t)
	t.Setenv("METERLINE_DEDUP_SKEW", "2h")
	c := parseCLI(t, "run", "--instance-id", "a", "--state-dir", dir, "--commit-interval", "200ms", "--dedup-keys-file", keys,
		"--meters", meters, "--strict-meters",
		"--dedup-group", "dg", "--dedup-window", "1000h", "--dedup-tick-interval", "3s", "--dedup-sources", "api,batch",
		"--aggregate-group", "ag", "--aggregate-period", "day", "--aggregate-grace", "90m", "--aggregate-final-chunk", "7").Run
	g := &Globals{Brokers: []string{"127.0.0.1:1"}}
	dcfg, acfg, err := c.stageConfigs(g, zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range []struct {
		name      string
		got, want any
	}{
		{"dedup group", dcfg.Stream.Group, "dg"},
		{"dedup window", dcfg.Window, 1000 * time.Hour},
		{"dedup skew (METERLINE_DEDUP_SKEW)", dcfg.Skew, 2 * time.Hour},
		{"dedup tick interval", dcfg.TickInterval, 3 * time.Second},
		{"dedup sources", strings.Join(dcfg.Sources, ","), "api,batch"},
		{"dedup commit interval", dcfg.Stream.CommitInterval, 200 * time.Millisecond},
		{"aggregate group", acfg.Stream.Group, "ag"},
		{"aggregate window (dedup's)", acfg.Window, 1000 * time.Hour},
		{"aggregate skew (dedup's)", acfg.Skew, 2 * time.Hour},
		{"aggregate bucket (dedup's)", acfg.Bucket, dedup.DefaultBucket},
		{"aggregate period", acfg.Period, aggregator.Period("day")},
		{"aggregate grace", acfg.Grace, 90 * time.Minute},
		{"aggregate final chunk", acfg.FinalChunk, 7},
		{"aggregate strict meters", acfg.StrictMeters, true},
		{"aggregate meters", acfg.Meters.Len(), 1},
		{"aggregate commit interval", acfg.Stream.CommitInterval, 200 * time.Millisecond},
	} {
		if ch.got != ch.want {
			t.Errorf("%s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}
	for _, old := range []string{"--window", "--skew", "--tick-interval", "--sources", "--period", "--grace", "--final-chunk"} {
		if code, _, errOut := run(t, "", "run", "--validate", "--instance-id", "a", "--dedup-keys-file", keys, old, "1"); code != 2 || !strings.Contains(errOut, "unknown flag "+old) {
			t.Errorf("run %s: exit %d, want 2 (unknown flag):\n%s", old, code, errOut)
		}
	}
	if d := parseCLI(t, "dedup", "--window", "1000h", "--sources", "api").Dedup; d.Window != 1000*time.Hour || len(d.Sources) != 1 {
		t.Errorf("dedup --window/--sources: %v %v", d.Window, d.Sources)
	}
	if a := parseCLI(t, "aggregate", "--period", "day", "--window", "1000h", "--bucket", "48h", "--skew", "3h").Aggregate; a.Period != "day" || a.Window != 1000*time.Hour || a.Bucket != 48*time.Hour || a.Skew != 3*time.Hour {
		t.Errorf("aggregate --period/--window/--bucket/--skew: %v %v %v %v", a.Period, a.Window, a.Bucket, a.Skew)
	} else if acfg, err := a.config(g, zap.NewNop(), prometheus.NewRegistry()); err != nil || acfg.Window != a.Window || acfg.Bucket != a.Bucket || acfg.Skew != a.Skew {
		t.Errorf("aggregate config: W %s, B %s, S %s (%v); want the flags' %s, %s, %s", acfg.Window, acfg.Bucket, acfg.Skew, err, a.Window, a.Bucket, a.Skew)
	}
}

// TestRealRunAllStages runs `meterline run` in-process against the real
// broker and the real ClickHouse: dedup, the aggregator and the sink, each
// in its own consumer group, behind one HTTP server. Unique events, exact
// copies, conflicting copies and undecodable records go in; ClickHouse's
// plain count() of every table (no FINAL) must be exact, /readyz ready, and
// /metrics must carry meterline_consumer_lag_records and _seconds for all
// three groups, at zero once they are caught up.
func TestRealRunAllStages(t *testing.T) {
	brokers := testenv.RealKafka(t)
	addr := testenv.RealClickHouse(t)
	conn, db := testenv.ClickHouseDB(t)
	names := topics.DefaultNames()
	names.Prefix = testenv.Name(t, "run") + "."
	const parts = 4
	createTopics(t, brokers, names, parts)
	groups := map[string]string{"dedup": testenv.Name(t, "dedup"), "aggregate": testenv.Name(t, "aggregate"), "sink": testenv.Name(t, "sink")}
	metrics := testenv.FreeAddr(t)
	// No ticks during the test: dedup reads its own ticks, so with them
	// every group is a few records behind for a moment each tick interval,
	// and "all lag is zero" would be a matter of timing.
	const tickInterval = "1h"

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs testenv.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"run",
			"--brokers", strings.Join(brokers, ","), "--clickhouse", addr, "--topic-prefix", names.Prefix,
			"--instance-id", "node-1", "--state-dir", t.TempDir(), "--metrics-addr", metrics,
			"--dedup-group", groups["dedup"], "--aggregate-group", groups["aggregate"], "--sink-group", groups["sink"],
			"--sink-database", db, "--sink-migrate", "--dedup-tick-interval", tickInterval, "--session-timeout", "6s",
			"--sink-max-batch-wait", "200ms", "--sink-commit-interval", "300ms", "--dedup-keys-file", testenv.DedupKeysFile(t),
		}, IO{Stdin: strings.NewReader(""), Stdout: &logs, Stderr: &logs})
	}()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("meterline run exited %d:\n%s", code, testenv.Tail(logs.String(), 40))
			}
		case <-time.After(90 * time.Second):
			t.Errorf("meterline run did not stop within 90 s of its context ending")
		}
	}
	defer stop()
	waitHTTP(t, "http://"+metrics+"/readyz", 200, 90*time.Second, done, &logs)

	// Input: 300 unique events, 20 exact copies, 6 conflicting copies, 3
	// undecodable records.
	p, err := producer.New(producer.WithBrokers(brokers...), producer.WithTopic(names.EventsTopic()), producer.WithSource("run-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	now := time.Now().Add(-time.Minute)
	var events []producer.Event
	var quantity int64
	for i := 0; i < 300; i++ {
		e := producer.Event{EventID: fmt.Sprintf("req-%d", i), CustomerID: []string{"acme", "globex", "initech"}[i%3],
			Meter: []string{"api_calls", "tokens"}[i%2], Quantity: int64(1 + i%7), EventTime: now.Add(time.Duration(i) * time.Millisecond)}
		events = append(events, e)
		quantity += e.Quantity
	}
	send := func(e producer.Event) {
		t.Helper()
		if err := p.Send(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range events {
		send(e)
	}
	for i := 0; i < 20; i++ {
		send(events[i*7])
	}
	for i := 0; i < 6; i++ {
		e := events[i*11+3]
		e.Quantity += 100
		send(e)
	}
	for i := 0; i < 3; i++ {
		r := &kgo.Record{Topic: names.EventsTopic(), Key: []byte(fmt.Sprintf("garbage-%d", i)), Value: []byte("not avro")}
		if err := p.Client().ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	// The aggregator emits one OPEN revision per aggregate per transaction;
	// once it is caught up, the topic holds every revision the sink must
	// write.
	testenv.WaitCaughtUp(t, brokers, groups["dedup"], names.EventsTopic(), 2*time.Minute)
	testenv.WaitCaughtUp(t, brokers, groups["aggregate"], names.DedupedTopic(), 2*time.Minute)
	revisions := int64(len(testenv.ReadAll(t, brokers, names.AggregatesTopic())))
	want := map[string]int64{"usage_events": 300, "usage_duplicates": 26, "usage_rejected": 3,
		"usage_adjustments": 0, "usage_aggregates": revisions}
	waitCounts(t, conn, want, 2*time.Minute)
	// Still exact a moment later: nothing is written twice.
	time.Sleep(2 * time.Second)
	if have := counts(t, conn); !equalMaps(have, want) {
		t.Fatalf("ClickHouse row counts changed after the sink caught up: %v, want %v", have, want)
	}
	var sum int64
	if err := conn.QueryRow(ctxT(t, 30*time.Second), "SELECT sum(quantity) FROM usage_events").Scan(&sum); err != nil {
		t.Fatal(err)
	}
	if sum != quantity {
		t.Fatalf("sum(quantity) of usage_events = %d, want %d (the first copy of each event)", sum, quantity)
	}
	var conflicts uint64
	if err := conn.QueryRow(ctxT(t, 30*time.Second), "SELECT countIf(conflict = 1) FROM usage_duplicates").Scan(&conflicts); err != nil {
		t.Fatal(err)
	}
	if conflicts != 6 {
		t.Fatalf("%d conflicting duplicates in ClickHouse, want 6", conflicts)
	}

	// Lag on /metrics for the three groups, on the real broker: present,
	// labelled with each group's stage, and zero once caught up (computed
	// at most a few seconds ago).
	wantZero := map[string][]string{
		"dedup":     {names.EventsTopic()},
		"aggregate": {names.DedupedTopic()},
		"sink":      {names.DedupedTopic(), names.DuplicatesTopic(), names.RejectedTopic(), names.AggregatesTopic(), names.AdjustmentsTopic()},
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		missing := lagNotZero(scrape(t, "http://"+metrics+"/metrics"), groups, wantZero, parts)
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lag metrics not at zero for every group and partition: %v", missing)
		}
		time.Sleep(time.Second)
	}
	m := scrape(t, "http://"+metrics+"/metrics")
	for _, name := range []string{"meterline_sink_rows_total", "meterline_dedup_accepted_total", "meterline_aggregate_revisions_total"} {
		if !strings.Contains(m, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	waitHTTP(t, "http://"+metrics+"/readyz", 200, 10*time.Second, done, &logs)
	stop()
	// The stop is logged when it is asked for, before the stages stop.
	if l := logs.String(); !strings.Contains(l, "stop requested") {
		t.Errorf("no line says the stop was requested:\n%s", testenv.Tail(l, 20))
	}
}

func createTopics(t *testing.T, brokers []string, names topics.Names, parts int) {
	t.Helper()
	t.Cleanup(func() {
		adm := testenv.Admin(t, brokers)
		var all []string
		for _, s := range topics.Specs(names, topics.DefaultLayout()) {
			all = append(all, s.Name)
		}
		_, _ = adm.DeleteTopics(context.Background(), all...)
	})
	code, out, errOut := run(t, "", "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", names.Prefix, "--partitions", strconv.Itoa(parts))
	if code != 0 {
		t.Fatalf("topics create: exit %d\n%s\n%s", code, out, errOut)
	}
}

// startSinkWithoutClickHouse runs `meterline sink` on brokers with its
// ClickHouse out of reach, serving metrics on metrics, with more args,
// until the test ends; it returns once /healthz answers.
func startSinkWithoutClickHouse(t *testing.T, brokers []string, metrics string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var logs testenv.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, append([]string{"sink", "--brokers", strings.Join(brokers, ","), "--clickhouse", "127.0.0.1:1",
			"--instance-id", "node-1", "--metrics-addr", metrics}, args...),
			IO{Stdin: strings.NewReader(""), Stdout: &logs, Stderr: &logs})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Errorf("meterline sink did not stop")
		}
	})
	waitHTTP(t, "http://"+metrics+"/healthz", 200, 30*time.Second, done, &logs)
}

// lagNotZero returns what of want (stage → topics, every partition) is
// missing from the scrape or not zero, in records or seconds; groups maps
// each stage to its group.
func lagNotZero(metrics string, groups map[string]string, want map[string][]string, parts int) []string {
	var bad []string
	for stage, tps := range want {
		for _, topic := range tps {
			for p := 0; p < parts; p++ {
				for _, name := range []string{lag.MetricRecords, lag.MetricSeconds} {
					series := fmt.Sprintf(`%s{group="%s",partition="%d",stage="%s",topic="%s"}`, name, groups[stage], p, stage, topic)
					v, ok := sample(metrics, series)
					if !ok || v != 0 {
						bad = append(bad, fmt.Sprintf("%s=%v(present %v)", series, v, ok))
					}
				}
			}
		}
	}
	return bad
}

func sample(metrics, series string) (float64, bool) {
	sc := bufio.NewScanner(strings.NewReader(metrics))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitHTTP waits until url answers status, failing early if the process
// (done) ended.
func waitHTTP(t *testing.T, url string, status int, d time.Duration, done chan int, logs *testenv.SyncBuffer) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for {
		select {
		case code := <-done:
			done <- code
			t.Fatalf("meterline ended with status %d:\n%s", code, testenv.Tail(logs.String(), 40))
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == status {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer %d within %s (last: %s)\n%s", url, status, d, last, testenv.Tail(logs.String(), 40))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func waitCounts(t *testing.T, conn driver.Conn, want map[string]int64, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		have := counts(t, conn)
		if equalMaps(have, want) {
			return
		}
		for k, v := range have {
			if v > want[k] {
				t.Fatalf("%s holds %d rows, more than the %d records of its topic: %v", k, v, want[k], have)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("ClickHouse row counts %v, want %v after %s", have, want, d)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// counts is count() of every sink table: plain count(), no FINAL.
func counts(t *testing.T, conn driver.Conn) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, tbl := range []string{"usage_events", "usage_duplicates", "usage_rejected", "usage_adjustments", "usage_aggregates"} {
		var n uint64
		if err := conn.QueryRow(ctxT(t, 30*time.Second), "SELECT count() FROM "+tbl).Scan(&n); err != nil {
			t.Fatalf("count %s: %v", tbl, err)
		}
		out[tbl] = int64(n)
	}
	return out
}

func equalMaps(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestRealSinkLagWhileClickHouseDown: a sink that cannot reach ClickHouse
// from its first start never commits, yet its lag on the real broker is on
// /metrics, counted from the start of its input partitions, in records and
// seconds; /readyz says why it is not ready.
func TestRealSinkLagWhileClickHouseDown(t *testing.T) {
	brokers := testenv.RealKafka(t)
	names := topics.DefaultNames()
	names.Prefix = testenv.Name(t, "sinklag") + "."
	const parts = 2
	createTopics(t, brokers, names, parts)
	group := testenv.Name(t, "sink")
	metrics := testenv.FreeAddr(t)

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := 0; i < 7; i++ {
		r := &kgo.Record{Topic: names.DuplicatesTopic(), Partition: int32(i % parts), Value: []byte("x")}
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produced := time.Now()

	startSinkWithoutClickHouse(t, brokers, metrics, "--topic-prefix", names.Prefix, "--group", group)
	time.Sleep(time.Second)
	m := scrape(t, "http://"+metrics+"/metrics")
	for p, want := range map[int]float64{0: 4, 1: 3} {
		series := fmt.Sprintf(`%s{group="%s",partition="%d",stage="sink",topic="%s"}`, lag.MetricRecords, group, p, names.DuplicatesTopic())
		if v, ok := sample(m, series); !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", series, v, ok, want)
		}
		series = fmt.Sprintf(`%s{group="%s",partition="%d",stage="sink",topic="%s"}`, lag.MetricSeconds, group, p, names.DuplicatesTopic())
		if v, ok := sample(m, series); !ok || v < 1 || v > time.Since(produced).Seconds()+1 {
			t.Errorf("%s = %v (present %v), want about %.1f", series, v, ok, time.Since(produced).Seconds())
		}
	}
	series := fmt.Sprintf(`%s{group="%s",partition="0",stage="sink",topic="%s"}`, lag.MetricRecords, group, names.AggregatesTopic())
	if v, ok := sample(m, series); !ok || v != 0 {
		t.Errorf("%s = %v (present %v), want 0 (an empty input)", series, v, ok)
	}
	resp, err := http.Get("http://" + metrics + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(b), "127.0.0.1:1") {
		t.Errorf("/readyz: %d %s, want 503 naming the unreachable ClickHouse", resp.StatusCode, b)
	}
	// The status page names the sink's group and instance, and shows its
	// lag (docs/operations.md, Status page): the 7 records it has not
	// written.
	var st service.Status
	if err := json.Unmarshal([]byte(scrape(t, "http://"+metrics+"/status.json")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Stages) != 1 || st.Stages[0].Stage != "sink" {
		t.Fatalf("status.json stages: %+v, want the sink alone", st.Stages)
	}
	sg := st.Stages[0]
	if sg.Group != group || sg.Instance != "node-1" {
		t.Errorf("status.json: the sink's group %q and instance %q, want %q and node-1", sg.Group, sg.Instance, group)
	}
	if sg.LagRecords == nil || *sg.LagRecords != 7 {
		t.Errorf("status.json: the sink's lag %v records, want 7", sg.LagRecords)
	}
}

// TestRunAllStageStoppedEarly: in `meterline run`, a stage that returns
// while the process runs, without an error (or with context.Canceled of
// its own), has failed: the others stop and the error names it. Stages
// stopped because the process was told to stop return no error.
func TestRunAllStageStoppedEarly(t *testing.T) {
	blocks := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	for name, run := range map[string]func(context.Context) error{
		"nil":      func(context.Context) error { return nil },
		"canceled": func(context.Context) error { return context.Canceled },
	} {
		done := make(chan error, 1)
		go func() {
			done <- runAll(context.Background(), zap.NewNop(), []namedStage{{name: "dedup", run: blocks}, {name: "sink", run: run}})
		}()
		select {
		case err := <-done:
			if !errors.Is(err, errStoppedEarly) || !strings.Contains(err.Error(), "sink") {
				t.Errorf("%s: runAll = %v, want the sink's early stop", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the other stages ran on after one stopped", name)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := runAll(ctx, zap.NewNop(), []namedStage{{name: "dedup", run: blocks}, {name: "sink", run: func(context.Context) error { return nil }}}); err != nil {
		t.Errorf("runAll told to stop = %v, want nil", err)
	}
}

// TestAllReadyNamesEveryStage: /readyz of `meterline run` names every
// stage that is not ready, not only the first.
func TestAllReadyNamesEveryStage(t *testing.T) {
	err := allReady([]namedStage{
		{name: "dedup", ready: func() error { return errors.New("restoring") }},
		{name: "aggregator", ready: func() error { return nil }},
		{name: "sink", ready: func() error { return errors.New("clickhouse down") }},
	})()
	if err == nil || !strings.Contains(err.Error(), "dedup: restoring") || !strings.Contains(err.Error(), "sink: clickhouse down") || strings.Contains(err.Error(), "aggregator") {
		t.Errorf("allReady = %v, want dedup's and the sink's reasons only", err)
	}
}

// TestStateCleanupDelayFlag: --state-cleanup-delay reaches the stream's
// config, and 0 keeps all state (the config's negative delay, which its
// defaults keep).
func TestStateCleanupDelayFlag(t *testing.T) {
	g := &Globals{Brokers: []string{"127.0.0.1:1"}}
	for _, c := range []struct {
		flag string
		want time.Duration
	}{{"30m", 30 * time.Minute}, {"0", -1}} {
		a := parseCLI(t, "aggregate", "--state-cleanup-delay", c.flag).Aggregate
		acfg, err := a.config(g, zap.NewNop(), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		acfg.Stream.EnsureDefaults()
		if got := acfg.Stream.StateCleanupDelay; got != c.want {
			t.Errorf("--state-cleanup-delay %s: the stream's delay %s, want %s", c.flag, got, c.want)
		}
	}
}

// TestRunAllNamesTheStageOnce: the error of a failed stage is named by
// the stage once: an error that already starts with its name (the sink's
// refused login, "sink: clickhouse authentication failed: …") keeps it
// as it is, and one that does not gets it.
func TestRunAllNamesTheStageOnce(t *testing.T) {
	blocks := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	refused := fmt.Errorf("%w: 127.0.0.1:9000 refused user %q while the sink runs", sink.ErrAuthentication, "meterline")
	err := runAll(context.Background(), zap.NewNop(), []namedStage{{name: "dedup", run: blocks},
		{name: "sink", run: func(context.Context) error { return refused }}})
	if !errors.Is(err, sink.ErrAuthentication) || err.Error() != refused.Error() {
		t.Errorf("runAll = %q, want %q", err, refused)
	}
	plain := errors.New("fetch usage.deduped.v2/0: OFFSET_OUT_OF_RANGE")
	err = runAll(context.Background(), zap.NewNop(), []namedStage{{name: "dedup", run: blocks},
		{name: "sink", run: func(context.Context) error { return plain }}})
	if want := "sink: " + plain.Error(); err == nil || err.Error() != want {
		t.Errorf("runAll = %v, want %q", err, want)
	}
}

// TestInstanceIDRefusedOutsideSafeCharset: the instance ID goes into the
// state directory <state-dir>/<stage>-<instance-id> and the transactional
// ID; one with a path separator, a space or any character outside
// [a-zA-Z0-9._-] (Kafka's rule for group instance IDs) would nest in or
// leave --state-dir. Every stateful command refuses it at the start
// (status 2), naming the flag; an ID within the rule is taken.
func TestInstanceIDRefusedOutsideSafeCharset(t *testing.T) {
	keys := testenv.DedupKeysFile(t)
	commands := [][]string{
		{"run", "--validate", "--dedup-keys-file", keys},
		{"dedup", "--validate", "--dedup-keys-file", keys},
		{"aggregate", "--validate"},
		{"sink", "--validate"},
	}
	for _, id := range []string{"a/b", "../../tmp/x", "..", ".", "a b", "node\\1", "nœud", "a:b", strings.Repeat("a", 250)} {
		for _, cmd := range commands {
			code, out, errOut := run(t, "", append(slices.Clone(cmd), "--instance-id", id)...)
			if code != 2 || strings.Contains(out, "configuration ok") || !strings.Contains(errOut, "--instance-id") || !strings.Contains(errOut, "letters a-z") {
				t.Errorf("%s --instance-id %.20q: exit %d, want 2 naming --instance-id:\n%s%s", cmd[0], id, code, out, errOut)
			}
		}
	}
	for _, id := range []string{"node-1", "host.example.com", "dedup_1", "A9", strings.Repeat("a", 249)} {
		for _, cmd := range commands {
			if code, out, errOut := run(t, "", append(slices.Clone(cmd), "--instance-id", id)...); code != 0 || !strings.Contains(out, "configuration ok") {
				t.Errorf("%s --instance-id %.20q: exit %d\n%s%s", cmd[0], id, code, out, errOut)
			}
		}
	}
}
