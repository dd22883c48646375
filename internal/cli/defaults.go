package cli

import (
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/ingest"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/sink"
)

// defaultVars are the kong variables the flags take their defaults from
// (`default:"${dedup_window}"`): each default is defined once, as a
// Default* constant of the package that applies it, and the flags show
// that value.
func defaultVars() kong.Vars {
	return kong.Vars{
		// flag_prefix is the prefix of an embedded flag group, for help
		// texts that name a flag of the group; none by default.
		"flag_prefix": "",

		"session_timeout":             flagDuration(session.DefaultSessionTimeout),
		"session_rebalance_timeout":   flagDuration(session.DefaultRebalanceTimeout),
		"session_transaction_timeout": flagDuration(session.DefaultTransactionTimeout),

		"stream_commit_interval":            flagDuration(stream.DefaultCommitInterval),
		"stream_max_batch_records":          strconv.Itoa(stream.DefaultMaxBatchRecords),
		"stream_standby_replicas":           strconv.Itoa(stream.DefaultStandbyReplicas),
		"stream_standby_max_warmups":        strconv.Itoa(stream.DefaultMaxWarmups),
		"stream_state_cleanup_delay":        flagDuration(stream.DefaultStateCleanupDelay),
		"stream_changelog_check_interval":   flagDuration(stream.DefaultChangelogCheckInterval),
		"stream_max_decompress_batch_bytes": strconv.Itoa(stream.DefaultMaxDecompressBatchBytes),

		"dedup_group":         dedup.DefaultGroup,
		"dedup_window":        flagDuration(dedup.DefaultWindow),
		"dedup_skew":          flagDuration(dedup.DefaultSkew),
		"dedup_tick_interval": flagDuration(dedup.DefaultTickInterval),
		"dedup_bucket":        flagDuration(dedup.DefaultBucket),

		"aggregate_group":              aggregator.DefaultGroup,
		"aggregate_period":             string(aggregator.DefaultPeriod),
		"aggregate_grace":              flagDuration(aggregator.DefaultGrace),
		"aggregate_final_chunk":        strconv.Itoa(aggregator.DefaultFinalChunk),
		"aggregate_max_batch_records":  strconv.Itoa(aggregator.DefaultMaxBatchRecords),
		"aggregate_entitlements_tick":  flagDuration(aggregator.DefaultEntitlementsTick),
		"aggregate_entitlements_order": aggregator.DefaultEntitlementsOrder,
		"aggregate_balance_interval":   flagDuration(aggregator.DefaultBalanceInterval),

		"sink_group":               sink.DefaultGroup,
		"sink_rebalance_timeout":   flagDuration(sink.DefaultRebalanceTimeout),
		"sink_database":            sink.DefaultDatabase,
		"sink_max_batch_records":   strconv.Itoa(sink.DefaultMaxBatchRecords),
		"sink_max_batch_bytes":     strconv.FormatInt(sink.DefaultMaxBatchBytes, 10),
		"sink_max_batch_wait":      flagDuration(sink.DefaultMaxBatchWait),
		"sink_commit_interval":     flagDuration(sink.DefaultCommitInterval),
		"sink_insert_timeout":      flagDuration(sink.DefaultInsertTimeout),
		"sink_unknown_error_limit": flagDuration(sink.DefaultUnknownErrorLimit),

		"producer_max_skew": flagDuration(producer.DefaultMaxSkew),
		"producer_linger":   flagDuration(producer.DefaultLinger),
		"produce_timeout":   flagDuration(defaultProduceTimeout),

		"ingest_addr":                     ingest.DefaultAddr,
		"ingest_max_body_bytes":           strconv.Itoa(ingest.DefaultMaxBodyBytes),
		"ingest_max_events":               strconv.Itoa(ingest.DefaultMaxEvents),
		"ingest_max_in_flight":            strconv.Itoa(ingest.DefaultMaxInFlight),
		"ingest_max_in_flight_per_client": strconv.Itoa(ingest.DefaultMaxInFlightPerTenant),
		"ingest_max_connections":          strconv.Itoa(ingest.DefaultMaxConnections()),
		"ingest_refusal_rate":             strconv.Itoa(ingest.DefaultRefusalRate),
		"ingest_produce_timeout":          flagDuration(ingest.DefaultProduceTimeout),
		"ingest_read_header_timeout":      flagDuration(ingest.DefaultReadHeaderTimeout),
		"ingest_read_timeout":             flagDuration(ingest.DefaultReadTimeout),
		"ingest_idle_timeout":             flagDuration(ingest.DefaultIdleTimeout),
		"ingest_gate_max_age":             flagDuration(ingest.DefaultGateMaxAge),
		"ingest_auth_max_age":             flagDuration(ingest.DefaultAuthMaxAge),
		"ingest_linger":                   flagDuration(ingest.DefaultLinger),

		"metrics_addr": defaultMetricsAddr,

		"entitlements_transactional_id": defaultEntitlementsTransactionalID,
		"entitlements_timeout":          flagDuration(defaultEntitlementsTimeout),
	}
}

// defaultMetricsAddr is where a stage's HTTP server (status page, metrics,
// health; the demo's too) listens unless told otherwise: loopback only.
// The sink's is its own (127.0.0.1:9466), so that it runs beside a stage.
const defaultMetricsAddr = "127.0.0.1:9464"

// flagDuration formats d as a flag value is written: "840h", "1h30m",
// "100ms", not time.Duration's "840h0m0s".
func flagDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
