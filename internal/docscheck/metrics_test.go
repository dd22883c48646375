package docscheck

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/ingest"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/lag"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/sink"
)

// documentedMetric is a metric of the metrics table, with the label names
// the table gives it in braces (nil when it gives none).
type documentedMetric struct {
	name   string
	labels []string
}

// documentedMetrics returns the metrics of the metrics table
// (docs/operations.md, Health, metrics and logs). A cell's "..._x" is x with the prefix
// (meterline_<part>_) of the cell's first name.
func documentedMetrics(t *testing.T) []documentedMetric {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "\n| metric | meaning |\n")
	if i < 0 {
		t.Fatal("docs/operations.md has no metrics table")
	}
	name := regexp.MustCompile("`((?:meterline_|\\.\\.\\._)[a-z_]+)(?:\\{([a-z_,]*)\\})?")
	var out []documentedMetric
	for _, line := range strings.Split(text[i+1:], "\n")[2:] {
		if !strings.HasPrefix(line, "| ") {
			break
		}
		cell := strings.SplitN(line, " | ", 2)[0]
		prefix := ""
		for _, m := range name.FindAllStringSubmatch(cell, -1) {
			n := m[1]
			if rest, ok := strings.CutPrefix(n, "..._"); ok {
				n = prefix + rest
			} else if prefix == "" {
				parts := strings.SplitN(n, "_", 3)
				prefix = parts[0] + "_" + parts[1] + "_"
			}
			var labels []string
			if m[2] != "" {
				labels = strings.Split(m[2], ",")
			}
			out = append(out, documentedMetric{n, labels})
		}
	}
	if len(out) < 40 {
		t.Fatalf("read %d metrics from the table of docs/operations.md: %v", len(out), out)
	}
	return out
}

// notAtStart are the documented metrics that are absent from a stage
// that just started, by design, and why.
var notAtStart = map[string]string{
	"meterline_stream_horizon_attempts":                "absent once a copy fits (documented)",
	"meterline_stream_restore_out_of_range_replans":    "per restore that planned again after a fetch out of range; absent once it ends (documented)",
	"meterline_aggregate_final_due_seconds":            "absent while no period is due (documented)",
	"meterline_aggregate_held_oldest_arrival_seconds":  "absent while no event is held (documented)",
	"meterline_stream_standby_lag_records":             "per standby copy; the test runs no standby",
	"meterline_stream_restore_remaining_records":       "per partition being restored; none is once the stage is ready",
	"meterline_ingest_refused_events_total":            "labelled by tenant, known only from the keys topic",
	"meterline_dedup_watermark_seconds":                "per partition with a watermark (documented); none before its first record",
	"meterline_dedup_watermark_delay_seconds":          "per partition with a watermark (documented); none before its first record",
	"meterline_aggregate_watermark_seconds":            "per partition with a watermark (documented); none before its first watermark",
	"meterline_aggregate_entitlement_decisions_total":  "labelled by plan, known only from the entitlements topic (documented)",
	"meterline_aggregate_credits_consumed_micro_total": "labelled by plan, known only from the entitlements topic (documented)",
	"meterline_aggregate_entitlement_refunds_total":    "labelled by plan, known only from the entitlements topic (documented)",
	"meterline_aggregate_credits_refunded_micro_total": "labelled by plan, known only from the entitlements topic (documented)",
}

// stageOf says which of the test's registries exports a documented
// metric: the stages', or the process's (service.NewRegistry and the lag
// collector of internal/cli).
func stageOf(name string) []string {
	switch {
	case name == "meterline_rejected_total":
		return []string{"dedup", "aggregate", "sink"}
	case strings.HasPrefix(name, "meterline_stream_"):
		return []string{"dedup", "aggregate"}
	case strings.HasPrefix(name, "meterline_dedup_"):
		return []string{"dedup"}
	case strings.HasPrefix(name, "meterline_aggregate_"):
		return []string{"aggregate"}
	case strings.HasPrefix(name, "meterline_sink_"):
		return []string{"sink"}
	case strings.HasPrefix(name, "meterline_ingest_"):
		return []string{"ingest"}
	case name == "meterline_build_info", name == "meterline_log_entries_dropped_total", strings.HasPrefix(name, "meterline_consumer_lag_"):
		return []string{"process"}
	}
	return nil
}

// TestDocumentedMetricsAtStart: every metric of the metrics table
// (docs/operations.md, Health, metrics and logs) is exported by its stage
// right after the stage started, before it processed any record, with at
// least one series: a counter whose series are born at their first
// increment hides that increment from rate() and increase() and leaves
// absent() and ratio alerts undefined. Stages: dedup and the aggregator
// (with entitlements) on kfake, ready; the sink and the HTTP ingest as
// New leaves them (every series of theirs is made there; the sink's Run
// needs ClickHouse). So the table and the code cannot drift apart.
func TestDocumentedMetricsAtStart(t *testing.T) {
	regs, names := startedStages(t)
	exported := map[string][]string{}
	for s, reg := range regs {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		for _, mf := range mfs {
			exported[s] = append(exported[s], mf.GetName())
		}
	}
	for _, w := range wantSeries(names) {
		if !hasSeries(t, regs[w.reg].Registry, w.name, w.labels) {
			t.Errorf("%s: no series %s%v right after the start", w.reg, w.name, w.labels)
		}
	}
	for _, dm := range documentedMetrics(t) {
		n := dm.name
		for s, reg := range regs {
			if got, ok := reg.descs[n]; ok && dm.labels != nil && !sameSet(got, dm.labels) {
				t.Errorf("%s (docs/operations.md) has labels {%s}; %s exports it with {%s}", n,
					strings.Join(dm.labels, ","), s, strings.Join(got, ","))
			}
		}
		stages := stageOf(n)
		if len(stages) == 0 {
			t.Errorf("%s (docs/operations.md): no stage known to export it; add it to stageOf", n)
			continue
		}
		if _, ok := notAtStart[n]; ok {
			continue
		}
		for _, s := range stages {
			if !slices.Contains(exported[s], n) {
				t.Errorf("%s (docs/operations.md) is not exported by %s right after its start", n, s)
			}
		}
	}
}

// startedStages starts dedup and the aggregator (with entitlements) on
// kfake until they are ready, and makes the sink and the HTTP ingest as
// New leaves them, each with a registry of its own; "process" holds what
// the command line adds (service.NewRegistry, the lag collector).
func startedStages(t *testing.T) (map[string]*recordingRegistry, topics.Names) {
	t.Helper()
	_, brokers := testenv.KFake(t)
	names := testenv.Topics(t, brokers, "", testenv.TopicsOpts{Partitions: 2})
	regs := map[string]*recordingRegistry{}
	for _, s := range []string{"dedup", "aggregate", "sink", "ingest", "process"} {
		regs[s] = newRecordingRegistry(t, service.NewRegistry())
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sc := func(stage string) stream.Config {
		return stream.Config{
			Config: session.Config{Kafka: kafka.Config{Brokers: brokers}, Group: names.Prefix + stage, InstanceID: "i1",
				SessionTimeout: 6 * time.Second, RestartBackoff: 100 * time.Millisecond},
			FS: vfs.NewMem(), StateDir: "state", CommitInterval: 20 * time.Millisecond,
			Logger: zaptest.NewLogger(t).Named(stage), Registerer: regs[stage],
		}
	}
	key, err := dedup.GenerateKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	ds, err := dedup.New(ctx, dedup.Config{Topics: names, Keys: []dedup.Key{key}, Stream: sc("dedup")})
	if err != nil {
		t.Fatal(err)
	}
	as, err := aggregator.New(ctx, aggregator.Config{Topics: names, Entitlements: true, Stream: sc("aggregate")})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []interface {
		Run(context.Context) error
		Ready() error
	}{ds, as} {
		done := make(chan struct{})
		go func() { defer close(done); _ = st.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		deadline := time.Now().Add(time.Minute)
		for st.Ready() != nil {
			if time.Now().After(deadline) {
				t.Fatalf("stage not ready within a minute: %v", st.Ready())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if _, err := sink.New(sink.Config{Config: session.Config{Kafka: kafka.Config{Brokers: brokers}, InstanceID: "i1"},
		Topics: names, ClickHouse: "127.0.0.1:1", Logger: zaptest.NewLogger(t), Registerer: regs["sink"]}); err != nil {
		t.Fatal(err)
	}
	if _, err := ingest.New(ingest.Config{Addr: "127.0.0.1:0", Kafka: kafka.Config{Brokers: brokers}, Topic: names.EventsTopic(),
		KeysTopic: names.KeysTopic(), BalancesTopic: names.BalancesTopic(), Registerer: regs["ingest"]}); err != nil {
		t.Fatal(err)
	}
	lc, err := lag.NewCollector(kafka.Config{Brokers: brokers}, []string{names.Prefix + "dedup", names.Prefix + "aggregate"},
		lag.WithInputTopics(names.Prefix+"dedup", names.EventsTopic()),
		lag.WithInputTopics(names.Prefix+"aggregate", names.DedupedTopic(), names.EntitlementsTopic()),
		lag.WithStage(names.Prefix+"dedup", "dedup"), lag.WithStage(names.Prefix+"aggregate", "aggregate"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lc.Close)
	regs["process"].MustRegister(lc)
	return regs, names
}

type series struct {
	reg, name string
	labels    map[string]string
}

// wantSeries are series of known labels that must exist from the start,
// at 0: every table, outcome, kind, aggregation, kind of work, result and
// topic (a family with one series passes the table's check).
func wantSeries(names topics.Names) []series {
	var out []series
	add := func(reg, name string, kv ...string) {
		l := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			l[kv[i]] = kv[i+1]
		}
		out = append(out, series{reg, name, l})
	}
	for _, tb := range []string{sink.TableEvents, sink.TableAggregates, sink.TableAdjustments, sink.TableDuplicates, sink.TableRejected} {
		for _, o := range []string{"inserted", "already_present"} {
			add("sink", "meterline_sink_rows_total", "table", tb, "outcome", o)
		}
	}
	for _, tb := range []string{sink.TableEvents, sink.TableRejected, sink.TableQuarantine} {
		for _, k := range []string{"unavailable", "refused", "unknown"} {
			add("sink", "meterline_sink_insert_errors_total", "table", tb, "kind", k)
		}
		for _, o := range []string{"ended", "still_running"} {
			add("sink", "meterline_sink_insert_waits_total", "table", tb, "outcome", o)
		}
		add("sink", "meterline_sink_insert_seconds", "table", tb)
		add("sink", "meterline_sink_resume_lookup_seconds", "table", tb)
	}
	add("sink", "meterline_sink_rows_total", "table", sink.TableAggregates, "outcome", "parked")
	add("sink", "meterline_sink_rows_total", "table", sink.TableAggregates, "outcome", "parked_before")
	add("sink", "meterline_sink_rows_total", "table", sink.TableRejected, "outcome", "quarantined")
	for _, o := range []string{"committed", "aborted", "unknown"} {
		add("sink", "meterline_sink_transactions_total", "outcome", o)
		add("dedup", "meterline_stream_transactions_total", "stage", "dedup", "outcome", o)
		add("aggregate", "meterline_stream_transactions_total", "stage", "aggregate", "outcome", o)
	}
	for _, a := range []string{"SUM", "COUNT", "MAX", "UNIQUE_COUNT", "LATEST"} {
		add("aggregate", "meterline_aggregate_late_events_total", "aggregation", a)
	}
	for _, w := range []string{"final", "book", "expire", "balances", "default_plan", "prune"} {
		add("aggregate", "meterline_aggregate_chunks_total", "work", w)
	}
	for _, r := range []string{"source_partitions", "source_partition"} {
		add("aggregate", "meterline_aggregate_watermarks_ignored_total", "reason", r)
	}
	for _, r := range []string{"applied", "tick", "rejected", "rerouted", "rerouted_repeat", "moved_mark"} {
		add("aggregate", "meterline_aggregate_entitlements_records_total", "result", r)
	}
	for _, tp := range []string{names.AggregatesTopic(), names.AdjustmentsTopic(), names.RejectedTopic(), names.EntitlementsTopic(), names.BalancesTopic()} {
		add("aggregate", "meterline_stream_records_out_total", "stage", "aggregate", "topic", tp)
	}
	for _, tp := range []string{names.DedupedTopic(), names.EntitlementsTopic()} {
		add("aggregate", "meterline_stream_records_in_total", "stage", "aggregate", "topic", tp)
	}
	for _, tp := range []string{names.DedupedTopic(), names.DuplicatesTopic(), names.RejectedTopic(), names.EventsTopic()} {
		add("dedup", "meterline_stream_records_out_total", "stage", "dedup", "topic", tp)
	}
	add("dedup", "meterline_stream_records_in_total", "stage", "dedup", "topic", names.EventsTopic())
	for _, e := range []string{"openmeter", "meterline"} {
		add("ingest", "meterline_ingest_request_duration_seconds", "endpoint", e)
	}
	return out
}

// hasSeries reports whether reg exports a series of name whose labels
// include labels.
func hasSeries(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			n := 0
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
					n++
				}
			}
			if n == len(labels) {
				return true
			}
		}
	}
	return false
}

// sameSet reports whether a and b hold the same strings.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestDocsMetricLabels: every metric that a document (the README, docs/)
// writes with its labels in braces, `meterline_x{a,b}`, is registered by a
// stage with exactly those label names. A query or an alert written from
// the docs with a label the metric lacks selects nothing.
func TestDocsMetricLabels(t *testing.T) {
	regs, _ := startedStages(t)
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	withLabels := regexp.MustCompile(`\b(meterline_[a-z_]+)\{([a-z_]+(?:,[a-z_]+)*)\}`)
	n := 0
	for _, path := range append(docs, filepath.Join(root, "README.md")) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, path)
		for _, m := range withLabels.FindAllStringSubmatch(string(b), -1) {
			n++
			name, labels := m[1], strings.Split(m[2], ",")
			found := false
			for s, reg := range regs {
				got, ok := reg.descs[name]
				if !ok {
					continue
				}
				found = true
				if !sameSet(got, labels) {
					t.Errorf("%s: %s{%s}; %s registers it with {%s}", rel, name, m[2], s, strings.Join(got, ","))
				}
			}
			if !found {
				t.Errorf("%s: %s{%s} is registered by no stage", rel, name, m[2])
			}
		}
	}
	if n < 40 {
		t.Fatalf("found %d metrics with labels in the docs", n)
	}
}

// TestEveryExportedMetricDocumented: every meterline_ metric a stage or
// the process registers is in the metrics table (docs/operations.md,
// Health, metrics and logs), the HTTP ingest's counters by tenant in its
// list of metrics in docs/ingest.md, to which the table points: an
// on-call engineer looks a series up there.
func TestEveryExportedMetricDocumented(t *testing.T) {
	regs, _ := startedStages(t)
	documented := map[string]bool{}
	for _, dm := range documentedMetrics(t) {
		documented[dm.name] = true
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ingestDoc, err := os.ReadFile(filepath.Join(root, "docs", "ingest.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for s, reg := range regs {
		for name := range reg.descs {
			if !strings.HasPrefix(name, "meterline_") {
				continue
			}
			n++
			if documented[name] || s == "ingest" && strings.Contains(string(ingestDoc), "`"+name) {
				continue
			}
			t.Errorf("%s (exported by %s) is not in the metrics table of docs/operations.md", name, s)
		}
	}
	if n < 40 {
		t.Fatalf("found %d meterline_ metrics registered", n)
	}
}

// docSelector is a metric with label matchers in a document:
// `meterline_x{outcome="parked"}`.
var docSelector = regexp.MustCompile(`\bmeterline_[a-z0-9_]+\{[^}]*[=~]"[^}]*\}`)

// TestDocsMetricSelectors: every metric a document writes with a label
// value, `meterline_sink_rows_total{outcome="already_present"}`, has that
// label, and the value is one of those the stages export from their start
// when the label's values are known then (outcomes, kinds, reasons,
// stages), as TestAlertRulesMatchTheStagesMetrics requires of the alert
// rules: an operator who pastes the selector into a query with a value
// that no series has sees nothing, and reads it as nothing happening.
func TestDocsMetricSelectors(t *testing.T) {
	regs, _ := startedStages(t)
	fams := exportedFamilies(t, regs)
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := docFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, rel := range files {
		if rel == "CHANGELOG.md" {
			continue
		}
		c, err := readDoc(root, rel)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(c, "\n") {
			for _, sel := range docSelector.FindAllString(line, -1) {
				n++
				for _, p := range ruleProblems(fams, sel) {
					t.Errorf("%s:%d: %s: %s", rel, i+1, sel, p)
				}
			}
		}
	}
	if n < 10 {
		t.Fatalf("found %d metrics with label values in the docs", n)
	}
}
