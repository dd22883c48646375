package sink

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/meterline/meterline/internal/service"
)

// Row outcomes of meterline_sink_rows_total.
const (
	outcomeInserted = "inserted"
	// outcomePresent: the row was already in the table (resume rule).
	outcomePresent = "already_present"
	// outcomeParked: refused by ClickHouse, parked in usage.rejected.
	outcomeParked = "parked"
	// outcomeQuarantined: a record of usage.rejected that does not decode
	// or that ClickHouse refused: never parked again (DESIGN §7), it is
	// written to usage_quarantine with its raw bytes instead.
	outcomeQuarantined = "quarantined"
)

// stage is the stage label of meterline_rejected_total.
const stage = "sink"

type metrics struct {
	recordsIn     *prometheus.CounterVec
	committed     prometheus.Counter
	rows          *prometheus.CounterVec
	insertSeconds *prometheus.HistogramVec
	insertRows    *prometheus.HistogramVec
	insertErrors  *prometheus.CounterVec
	rejected      *prometheus.CounterVec // meterline_rejected_total{stage,reason}, shared by the stages
	quarantined   *prometheus.CounterVec
	lookupSeconds *prometheus.HistogramVec
	flushes       *prometheus.CounterVec
	commitSeconds prometheus.Histogram
	up            prometheus.Gauge
	blocked       prometheus.Gauge
	restarts      prometheus.Counter
	owned         prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		recordsIn: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_sink_records_in_total",
			Help: "Kafka records polled, by topic (counted again when re-consumed after an aborted transaction)."}, []string{"topic"}),
		committed: f.NewCounter(prometheus.CounterOpts{Name: "meterline_sink_records_committed_total",
			Help: "Kafka records whose offsets a committed transaction moved past (rows, watermarks, parked records)."}),
		rows: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_sink_rows_total",
			Help: "Rows by table and outcome: inserted, already_present (skipped by the resume rule), parked, quarantined."}, []string{"table", "outcome"}),
		insertSeconds: f.NewHistogramVec(prometheus.HistogramOpts{Name: "meterline_sink_insert_seconds",
			Help: "Latency of successful INSERTs, by table.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"table"}),
		insertRows: f.NewHistogramVec(prometheus.HistogramOpts{Name: "meterline_sink_insert_rows",
			Help: "Rows per successful INSERT, by table.", Buckets: prometheus.ExponentialBuckets(1, 4, 10)}, []string{"table"}),
		insertErrors: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_sink_insert_errors_total",
			Help: "Failed INSERT attempts, by table and kind: unavailable (retried), refused (block split) or unknown (an error code the sink does not know: retried for at most the unknown-error limit, then the sink stops)."}, []string{"table", "kind"}),
		rejected: service.RejectedCounter(reg),
		quarantined: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_sink_quarantined_total",
			Help: "Records of usage.rejected written to usage_quarantine with their raw bytes, because they cannot be rows of usage_rejected, by reason: undecodable, unknown_schema (the value does not decode), uninsertable (ClickHouse refused the row)."}, []string{"reason"}),
		lookupSeconds: f.NewHistogramVec(prometheus.HistogramOpts{Name: "meterline_sink_resume_lookup_seconds",
			Help:    "Latency of resume lookups (rows already in the table at or after the committed offset), by table.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}, []string{"table"}),
		flushes: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_sink_transactions_total",
			Help: "Commit windows ended (the offsets of every batch inserted since the last one, and the rows parked), by outcome: committed, aborted, unknown."}, []string{"outcome"}),
		commitSeconds: f.NewHistogram(prometheus.HistogramOpts{Name: "meterline_sink_commit_seconds",
			Help: "Time to end a commit window's transaction.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		up: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_sink_clickhouse_up",
			Help: "1 when the last ping of ClickHouse answered."}),
		blocked: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_sink_blocked",
			Help: "1 while the sink backs off because ClickHouse cannot take a block (fetching paused, nothing committed)."}),
		restarts: f.NewCounter(prometheus.CounterOpts{Name: "meterline_sink_session_restarts_total",
			Help: "Kafka sessions rebuilt after a commit with an unknown outcome."}),
		owned: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_sink_owned_partitions",
			Help: "Topic partitions assigned to this instance."}),
	}
}
