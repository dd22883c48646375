package cli

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/ingest"
	"github.com/meterline/meterline/internal/bench"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/sink"
)

// TestFlagDefaultsAreThePackages: every flag that sets a stage's config
// defaults to the Default* constant the stage applies itself (one
// definition, shown by --help as written: 840h, not 840h0m0s), and the
// topic layout's W and S are dedup's.
func TestFlagDefaultsAreThePackages(t *testing.T) {
	parse := func(args ...string) *CLI { return parseCLI(t, args...) }
	type check struct {
		name      string
		got, want any
	}
	stage := func(cmd string, f StageFlags) []check {
		return []check{
			{cmd + " --commit-interval", f.CommitInterval, stream.DefaultCommitInterval},
			{cmd + " --standby-replicas", f.StandbyReplicas, stream.DefaultStandbyReplicas},
			{cmd + " --state-cleanup-delay", f.StateCleanupDelay, stream.DefaultStateCleanupDelay},
			{cmd + " --changelog-check-interval", f.ChangelogCheckInterval, stream.DefaultChangelogCheckInterval},
			{cmd + " --session-timeout", f.SessionTimeout, session.DefaultSessionTimeout},
			{cmd + " --rebalance-timeout", f.RebalanceTimeout, session.DefaultRebalanceTimeout},
			{cmd + " --transaction-timeout", f.TransactionTimeout, session.DefaultTransactionTimeout},
		}
	}
	sinkFlags := func(cmd, prefix string, f SinkFlags) []check {
		flag := func(name string) string { return cmd + " --" + prefix + name }
		return []check{
			{flag("group"), f.Group, sink.DefaultGroup},
			{flag("database"), f.Database, sink.DefaultDatabase},
			{flag("max-batch-records"), f.MaxBatchRecords, sink.DefaultMaxBatchRecords},
			{flag("max-batch-bytes"), f.MaxBatchBytes, int64(sink.DefaultMaxBatchBytes)},
			{flag("max-batch-wait"), f.MaxBatchWait, sink.DefaultMaxBatchWait},
			{flag("commit-interval"), f.CommitInterval, sink.DefaultCommitInterval},
			{flag("insert-timeout"), f.InsertTimeout, sink.DefaultInsertTimeout},
			{flag("unknown-error-limit"), f.UnknownErrorLimit, sink.DefaultUnknownErrorLimit},
		}
	}
	s := parse("sink").Sink.Run
	d := parse("dedup").Dedup
	a := parse("aggregate").Aggregate
	r := parse("run").Run
	tc := parse("topics", "create").Topics.Create
	p := parse("produce").Produce
	checks := []check{
		{"dedup --group", d.Group, dedup.DefaultGroup},
		{"dedup --window", d.Window, dedup.DefaultWindow},
		{"dedup --skew", d.Skew, dedup.DefaultSkew},
		{"dedup --tick-interval", d.TickInterval, dedup.DefaultTickInterval},
		{"dedup --bucket", d.Bucket, dedup.DefaultBucket},
		{"aggregate --group", a.Group, aggregator.DefaultGroup},
		{"aggregate --period", aggregator.Period(a.Period), aggregator.DefaultPeriod},
		{"aggregate --grace", a.Grace, aggregator.DefaultGrace},
		{"aggregate --window", a.Window, dedup.DefaultWindow},
		{"aggregate --bucket", a.Bucket, dedup.DefaultBucket},
		{"aggregate --skew", a.Skew, dedup.DefaultSkew},
		{"aggregate --final-chunk", a.FinalChunk, aggregator.DefaultFinalChunk},
		{"dedup --max-batch-records", d.MaxBatchRecords, stream.DefaultMaxBatchRecords},
		{"aggregate --max-batch-records", a.MaxBatchRecords, aggregator.DefaultMaxBatchRecords},
		{"run --dedup-max-batch-records", r.Dedup.MaxBatchRecords, stream.DefaultMaxBatchRecords},
		{"run --aggregate-max-batch-records", r.Aggregate.MaxBatchRecords, aggregator.DefaultMaxBatchRecords},
		{"aggregate --balance-interval", a.BalanceInterval, aggregator.DefaultBalanceInterval},
		{"aggregate --entitlements-order", a.EntitlementsOrder, aggregator.DefaultEntitlementsOrder},
		{"run --dedup-group", r.Dedup.Group, dedup.DefaultGroup},
		{"run --aggregate-group", r.Aggregate.Group, aggregator.DefaultGroup},
		{"run --dedup-window", r.Dedup.Window, dedup.DefaultWindow},
		{"run --dedup-skew", r.Dedup.Skew, dedup.DefaultSkew},
		{"run --dedup-tick-interval", r.Dedup.TickInterval, dedup.DefaultTickInterval},
		{"run --aggregate-period", aggregator.Period(r.Aggregate.Period), aggregator.DefaultPeriod},
		{"run --aggregate-grace", r.Aggregate.Grace, aggregator.DefaultGrace},
		{"run --aggregate-final-chunk", r.Aggregate.FinalChunk, aggregator.DefaultFinalChunk},
		{"run --aggregate-balance-interval", r.Aggregate.BalanceInterval, aggregator.DefaultBalanceInterval},
		{"run --aggregate-entitlements-order", r.Aggregate.EntitlementsOrder, aggregator.DefaultEntitlementsOrder},
		{"topics create --window", tc.Window, dedup.DefaultWindow},
		{"topics create --skew", tc.Skew, dedup.DefaultSkew},
		{"topics.DefaultLayout().Window", topics.DefaultLayout().Window, dedup.DefaultWindow},
		{"topics.DefaultLayout().Skew", topics.DefaultLayout().Skew, dedup.DefaultSkew},
		{"topics create --bucket", tc.Bucket, dedup.DefaultBucket},
		{"topics.DefaultLayout().Bucket", topics.DefaultLayout().Bucket, dedup.DefaultBucket},
		{"produce --max-skew", p.MaxSkew, producer.DefaultMaxSkew},
		{"produce --linger", p.Linger, producer.DefaultLinger},
		{"entitlements.DefaultWindow", entitlements.DefaultWindow, dedup.DefaultWindow},
		{"entitlements set --transactional-id", parse("entitlements", "set").Entitlements.Set.TransactionalID, defaultEntitlementsTransactionalID},
		{"entitlements delete --transactional-id", parse("entitlements", "delete", "c").Entitlements.Delete.TransactionalID, defaultEntitlementsTransactionalID},
		{"entitlements set-rates --timeout", parse("entitlements", "set-rates").Entitlements.SetRates.Timeout, defaultEntitlementsTimeout},
		{"entitlements get --timeout", parse("entitlements", "get").Entitlements.Get.Timeout, defaultEntitlementsTimeout},
		{"dedup --metrics-addr", d.MetricsAddr, defaultMetricsAddr},
		{"run --metrics-addr", r.MetricsAddr, defaultMetricsAddr},
		{"ingest --metrics-addr", parse("ingest").Ingest.MetricsAddr, defaultMetricsAddr},
		{"demo --http", parse("demo").Demo.HTTP, defaultMetricsAddr},
		{"lag --group", strings.Join(parse("lag").Lag.Group, ","), dedup.DefaultGroup + "," + aggregator.DefaultGroup + "," + sink.DefaultGroup},
		{"sink --session-timeout", s.SessionTimeout, session.DefaultSessionTimeout},
		{"sink --rebalance-timeout", s.RebalanceTimeout, sink.DefaultRebalanceTimeout},
		{"sink --transaction-timeout", s.TransactionTimeout, session.DefaultTransactionTimeout},
		{"migrate --database", parse("migrate").Migrate.Database, sink.DefaultDatabase},
		{"verify --database", parse("verify").Verify.Database, sink.DefaultDatabase},
		{"verify --group", parse("verify").Verify.Group, sink.DefaultGroup},
		{"sink accept-offsets --group", parse("sink", "accept-offsets").Sink.AcceptOffsets.Group, sink.DefaultGroup},
		{"sink accept-offsets --database", parse("sink", "accept-offsets").Sink.AcceptOffsets.Database, sink.DefaultDatabase},
		{"bench sink --batch-rows", parse("bench", "sink").Bench.Sink.BatchRows, sink.DefaultMaxBatchRecords},
	}
	ingestFlags := func(cmd, prefix string, f IngestFlags) []check {
		flag := func(name string) string { return cmd + " --" + prefix + name }
		return []check{
			{flag("addr"), f.Addr, ingest.DefaultAddr},
			{flag("max-body-bytes"), f.MaxBodyBytes, int64(ingest.DefaultMaxBodyBytes)},
			{flag("max-events"), f.MaxEvents, ingest.DefaultMaxEvents},
			{flag("max-in-flight"), f.MaxInFlight, ingest.DefaultMaxInFlight},
			{flag("max-in-flight-per-client"), f.MaxInFlightPerTenant, ingest.DefaultMaxInFlightPerTenant},
			{flag("max-connections"), f.MaxConnections, ingest.DefaultMaxConnections()},
			{flag("produce-timeout"), f.ProduceTimeout, ingest.DefaultProduceTimeout},
			{flag("read-header-timeout"), f.ReadHeaderTimeout, ingest.DefaultReadHeaderTimeout},
			{flag("read-timeout"), f.ReadTimeout, ingest.DefaultReadTimeout},
			{flag("idle-timeout"), f.IdleTimeout, ingest.DefaultIdleTimeout},
			{flag("gate-max-age"), f.GateMaxAge, ingest.DefaultGateMaxAge},
			{flag("auth-max-age"), f.AuthMaxAge, ingest.DefaultAuthMaxAge},
			{flag("quota-gate"), f.QuotaGate, true},
			{flag("max-skew"), f.MaxSkew, producer.DefaultMaxSkew},
		}
	}
	checks = append(checks, ingestFlags("ingest", "", parse("ingest").Ingest.IngestFlags)...)
	checks = append(checks, ingestFlags("run", "ingest-", r.IngestFlags)...)
	checks = append(checks, stage("dedup", d.StageFlags)...)
	checks = append(checks, stage("aggregate", a.StageFlags)...)
	checks = append(checks, stage("run", r.StageFlags)...)
	checks = append(checks, sinkFlags("sink", "", s.SinkFlags)...)
	checks = append(checks, sinkFlags("run", "sink-", r.Sink)...)
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s defaults to %v, want %v", c.name, c.got, c.want)
		}
	}

	_, out, _ := run(t, "", "dedup", "--help")
	for _, want := range []string{`--window=840h`, `--skew=1h`, `--tick-interval=5s`, `--commit-interval=100ms`} {
		if !strings.Contains(out, want) {
			t.Errorf("dedup --help lacks %s", want)
		}
	}
	for d, want := range map[time.Duration]string{840 * time.Hour: "840h", 90 * time.Minute: "1h30m", 100 * time.Millisecond: "100ms",
		10 * time.Minute: "10m", 0: "0s", time.Hour + time.Second: "1h0m1s"} {
		if got := flagDuration(d); got != want {
			t.Errorf("flagDuration(%s) = %q, want %q", d, got, want)
		}
	}
}

// TestValidateNamesFlags: every problem a stage's or a benchmark's
// Validate reports starts with its package and names the field as its flag
// is named (kebab case: --instance-id, --final-chunk; a field without a
// flag, such as stream's input-topic, the same way), followed by what is
// wrong. The group and transaction settings every stage shares are
// session's (session: instance-id: ...).
func TestValidateNamesFlags(t *testing.T) {
	line := regexp.MustCompile(`^(session|stream|dedup|aggregator|sink|kafka|bench|ingest|entitlements): ([a-z][a-z0-9]*(-[a-z0-9]+)*)(:| is required| must| is not| -?[0-9"\[(])`)
	errs := map[string]error{
		"stream":    (&stream.Config{PunctuateInterval: -1, MaxBatchRecords: -1, CommitInterval: -1, StandbyReplicas: -1}).Validate(),
		"dedup":     (&dedup.Config{Skew: -1, Sources: []string{""}, WatermarkEvery: -1, Keys: []dedup.Key{{ID: "a"}, {ID: "a"}}}).Validate(),
		"aggregate": (&aggregator.Config{Period: "week", Grace: -1, FinalChunk: -1, FinalChunkBytes: -1}).Validate(),
		"ingest": (&ingest.Config{TLSCertFile: "cert.pem", MaxBodyBytes: 10, MaxEvents: -1, ProduceTimeout: time.Millisecond,
			ReadTimeout: -1, ShutdownTimeout: time.Nanosecond}).Validate(),
		"entitlements": (&entitlements.Config{Window: -1}).Validate(),
		"sink": (&sink.Config{ClickHouse: "x:9000", Database: "bad-name", Topics: topics.Names{Prefix: "p."}, MaxBatchRecords: -1,
			MaxBatchBytes: -1, MaxBatchWait: -1, CommitInterval: -1, InsertBlockRows: -1, InsertTimeout: -1, QueryTimeout: -1, BackoffMin: -1,
			MaxRefusedInARow: -1, UnknownErrorLimit: -1}).Validate(),
		"bench produce": (&bench.ProduceConfig{}).Validate(),
		"bench dedup":   (&bench.DedupConfig{DuplicateRate: 2}).Validate(),
		"bench agg":     (&bench.AggregateConfig{}).Validate(),
		"bench sink":    (&bench.SinkConfig{}).Validate(),
	}
	for name, err := range errs {
		if err == nil {
			t.Errorf("%s: no error from an invalid config", name)
			continue
		}
		for _, l := range strings.Split(err.Error(), "\n") {
			if !line.MatchString(l) {
				t.Errorf("%s: %q does not name its field as the flag is named", name, l)
			}
		}
	}
}
