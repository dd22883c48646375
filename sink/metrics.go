package sink

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/meterline/meterline/internal/prom"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/schemas"
)

// Row outcomes of meterline_sink_rows_total.
const (
	outcomeInserted = "inserted"
	// outcomePresent: the row was already in the table (resume rule).
	outcomePresent = "already_present"
	// outcomeParked: refused by ClickHouse, parked in usage.rejected.
	outcomeParked = "parked"
	// outcomeParkedBefore: refused by ClickHouse on a re-read below the
	// recorded progress, and parked already (reread.go): not parked again.
	outcomeParkedBefore = "parked_before"
	// outcomeQuarantined: a record of usage.rejected that does not decode
	// or that ClickHouse refused: never parked again (docs/design.md, The
	// ClickHouse ledger), it is written to usage_quarantine with its raw
	// bytes instead.
	outcomeQuarantined = "quarantined"
)

// Outcomes of meterline_sink_insert_waits_total.
const (
	// waitEnded: the INSERTs the resume lookup waited for ended.
	waitEnded = "ended"
	// waitStillRunning: one still ran at the bound; the lookup backs off
	// and waits again.
	waitStillRunning = "still_running"
)

// stage is the stage label of meterline_rejected_total.
const stage = "sink"

type metrics struct {
	committed     prometheus.Counter
	rows          *prometheus.CounterVec
	insertSeconds *prometheus.HistogramVec
	insertRows    *prometheus.HistogramVec
	insertErrors  *prometheus.CounterVec
	rejected      *prometheus.CounterVec // meterline_rejected_total{stage,reason}, shared by the stages
	quarantined   *prometheus.CounterVec
	lookupSeconds *prometheus.HistogramVec
	insertWaits   *prometheus.CounterVec
	// session: records polled, transactions (commit windows) by outcome,
	// commit time, session restarts.
	session *session.Metrics
	// timeIn: the polled records that are no row (watermark records), a
	// part of the session's records in, counted as they are.
	timeIn  *prometheus.CounterVec
	up      prometheus.Gauge
	blocked prometheus.Gauge
	owned   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		session: session.NewMetrics(reg, session.Names{
			RecordsIn:     "meterline_sink_records_in_total",
			Transactions:  "meterline_sink_transactions_total",
			CommitSeconds: "meterline_sink_commit_seconds",
			Restarts:      "meterline_sink_session_restarts_total",
			Member:        "meterline_sink_group_member",
		}, "one commit window: the offsets of every batch inserted since the last one, and the rows parked"),
		timeIn: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_sink_time_records_in_total",
			Help: "Input records polled that only move time (the watermark records of usage.deduped; counted again when re-consumed after an aborted transaction), by topic: the part of meterline_sink_records_in_total that is no row."}, []string{"topic"}),
		committed: f.NewCounter(prometheus.CounterOpts{Name: "meterline_sink_records_committed_total",
			Help: "Kafka records whose offsets a committed transaction moved past (rows, watermarks, parked records)."}),
		rows: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_sink_rows_total",
			Help: "Rows by table and outcome: inserted, already_present (skipped by the resume rule), parked, parked_before (refused again on a re-read, parked already), quarantined."}, []string{"table", "outcome"}),
		insertSeconds: f.NewHistogramVec(prometheus.HistogramOpts{Name: "meterline_sink_insert_seconds",
			Help: "Latency of successful INSERTs, by table.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"table"}),
		insertRows: f.NewHistogramVec(prometheus.HistogramOpts{Name: "meterline_sink_insert_rows",
			Help: "Rows per successful INSERT, by table.", Buckets: prometheus.ExponentialBuckets(1, 4, 10)}, []string{"table"}),
		insertErrors: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_sink_insert_errors_total",
			Help: "Failed INSERT attempts, by table and kind: unavailable (retried), refused (block split) or unknown (an error code the sink does not know: retried for at most the unknown-error limit, then the sink stops)."}, []string{"table", "kind"}),
		rejected: prom.RejectedCounter(reg, stage, schemas.ReasonUndecodable, schemas.ReasonUnknownSchema, schemas.ReasonUninsertable),
		quarantined: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_sink_quarantined_total",
			Help: "Records of usage.rejected written to usage_quarantine with their raw bytes, because they cannot be rows of usage_rejected, by reason: undecodable, unknown_schema (the value does not decode), uninsertable (ClickHouse refused the row)."}, []string{"reason"}),
		lookupSeconds: f.NewHistogramVec(prometheus.HistogramOpts{Name: "meterline_sink_resume_lookup_seconds",
			Help:    "Latency of resume lookups (rows already in the table at or after the committed offset), by table.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}, []string{"table"}),
		insertWaits: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_sink_insert_waits_total",
			Help: "Resume lookups that found INSERTs of their partitions still running on the server (an instance's that lost the partitions, or this one's of unknown outcome), by table and outcome: ended (waited until they ended), still_running (one still ran at the bound: the lookup backs off and waits again, writing nothing of those partitions)."}, []string{"table", "outcome"}),
		up: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_sink_clickhouse_up",
			Help: "1 when the last ping of ClickHouse answered."}),
		blocked: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_sink_blocked",
			Help: "1 while the sink backs off because ClickHouse cannot take a block (fetching paused, nothing committed)."}),
		owned: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_sink_owned_partitions",
			Help: "Topic partitions assigned to this instance."}),
	}
	// At 0 from the start, as the rejections (prom.RejectedCounter): the
	// first records quarantined must count in increase().
	for _, r := range []string{schemas.ReasonUndecodable, schemas.ReasonUnknownSchema, schemas.ReasonUninsertable} {
		m.quarantined.WithLabelValues(r)
	}
	return m
}

// Kinds of meterline_sink_insert_errors_total.
const (
	// errUnavailable: ClickHouse unreachable or unable to take a block
	// (retried).
	errUnavailable = "unavailable"
	// errRefused: the block's data refused (the block is split).
	errRefused = "refused"
	// errUnknown: an error code the sink does not know.
	errUnknown = "unknown"
)

var insertErrorKinds = []string{errUnavailable, errRefused, errUnknown}

// initSeries exports at 0, from the start, every series of the tables'
// metrics whose labels are known then (tables, outcomes, kinds), as the
// rejections (prom.RejectedCounter): a series born at its first
// increment hides that increment from rate() and increase(), and an
// alert on a ratio or on absent() misreads a series that is not there.
// Rows from usage.rejected are never parked (they are quarantined
// instead); the other tables' rows are never quarantined.
func (m *metrics) initSeries(tables []*table, quarantine *table) {
	for _, t := range append(slices.Clone(tables), quarantine) {
		m.insertSeconds.WithLabelValues(t.name)
		m.insertRows.WithLabelValues(t.name)
		m.lookupSeconds.WithLabelValues(t.name)
		m.rows.WithLabelValues(t.name, outcomeInserted)
		for _, k := range insertErrorKinds {
			m.insertErrors.WithLabelValues(t.name, k)
		}
		for _, o := range []string{waitEnded, waitStillRunning} {
			m.insertWaits.WithLabelValues(t.name, o)
		}
		switch t.name {
		case TableQuarantine:
		case TableRejected:
			m.rows.WithLabelValues(t.name, outcomePresent)
			m.rows.WithLabelValues(t.name, outcomeQuarantined)
		default:
			m.rows.WithLabelValues(t.name, outcomePresent)
			m.rows.WithLabelValues(t.name, outcomeParked)
			m.rows.WithLabelValues(t.name, outcomeParkedBefore)
		}
	}
}
