package sink

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Row outcomes of meterline_sink_rows_total.
const (
	outcomeInserted = "inserted"
	// outcomePresent: the row was already in the table (resume rule).
	outcomePresent = "already_present"
	// outcomeParked: refused by ClickHouse, parked in usage.rejected.
	outcomeParked = "parked"
	// outcomeUnparkable: refused, but read from usage.rejected, so not
	// parked again; logged at error level, left in Kafka for a redrive.
	outcomeUnparkable = "unparkable"
)

type metrics struct {
	recordsIn     *prometheus.CounterVec
	committed     prometheus.Counter
	rows          *prometheus.CounterVec
	insertSeconds *prometheus.HistogramVec
	insertRows    *prometheus.HistogramVec
	insertErrors  *prometheus.CounterVec
	rejected      *prometheus.CounterVec
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
			Help: "Rows by table and outcome: inserted, already_present (skipped by the resume rule), parked, unparkable."}, []string{"table", "outcome"}),
		insertSeconds: f.NewHistogramVec(prometheus.HistogramOpts{Name: "meterline_sink_insert_seconds",
			Help: "Latency of successful INSERTs, by table.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"table"}),
		insertRows: f.NewHistogramVec(prometheus.HistogramOpts{Name: "meterline_sink_insert_rows",
			Help: "Rows per successful INSERT, by table.", Buckets: prometheus.ExponentialBuckets(1, 4, 10)}, []string{"table"}),
		insertErrors: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_sink_insert_errors_total",
			Help: "Failed INSERT attempts, by table and kind: unavailable (retried) or refused (block split)."}, []string{"table", "kind"}),
		rejected: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_sink_rejected_total",
			Help: "Records the sink parked in usage.rejected, by reason (uninsertable, undecodable, unknown_schema)."}, []string{"reason"}),
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
