package stream

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/prom"
	"github.com/meterline/meterline/internal/session"
)

type metrics struct {
	// session: input records, transactions by outcome, commit time,
	// session restarts.
	session *session.Metrics
	// timeIn: the input records the partitions took as time records
	// (Tx.TimeRecord), a part of the session's records in.
	timeIn     *prometheus.CounterVec
	recordsOut *prometheus.CounterVec
	// outByTopic holds recordsOut's counter of each topic once looked up
	// (a stage emits to a handful of topics).
	outByTopic     sync.Map // topic → prometheus.Counter
	settleSeconds  prometheus.Observer
	settleWait     prometheus.Observer
	fenced         prometheus.Counter
	restoring      *prometheus.GaugeVec
	restoreRecords prometheus.Counter
	restoreSeconds prometheus.Observer
	// Restore horizon (docs/design.md, Exactly-once, 4; horizon.go).
	restores               *prometheus.CounterVec
	restoreHorizonExceeded prometheus.Counter
	horizonAttempts        *prometheus.GaugeVec
	restoreRate            prometheus.Gauge
	// outOfRangeReplans: a restore's plans in a row that ended with a
	// changelog fetch out of range (restore.go, replanOutOfRange).
	outOfRangeReplans *prometheus.GaugeVec
	// Warm state handed to Open (keep.go).
	opens      *prometheus.CounterVec
	keptWarm   prometheus.Gauge
	owned      prometheus.Gauge
	stateBytes prometheus.Gauge
	// State of partitions held elsewhere (cleanup.go).
	cleaned          *prometheus.CounterVec
	unheldPartitions prometheus.Gauge
	unheldBytes      prometheus.Gauge
	// changelogUnsafe: the changelog's cleanup policy deletes state
	// records a restore must read (changelogkeeps.go).
	changelogUnsafe *prometheus.GaugeVec
	// gapsChecked: gaps of the input checked against the log (gaps.go),
	// by result.
	gapsChecked *prometheus.CounterVec
	// offsetsWaiting and offsetsWaitSeconds: assigned partitions waiting
	// for the group's committed offsets (offsetwait.go).
	offsetsWaiting     *prometheus.GaugeVec
	offsetsWaitSeconds prometheus.Gauge
	// writeRefused: partitions the stage writes to that the brokers
	// refuse its writes on, as last diagnosed (unwritten.go).
	writeRefused *prometheus.GaugeVec
	// stateRebuilt: states found unusable as the store opened, moved
	// aside and rebuilt from the changelog (store.go, openStore).
	stateRebuilt *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, stage string) *metrics {
	reg = prometheus.WrapRegistererWith(prometheus.Labels{"stage": stage}, reg)
	f := prom.NewFactory(reg)
	m := &metrics{
		session: session.NewMetrics(reg, session.Names{
			RecordsIn:      "meterline_stream_records_in_total",
			Transactions:   "meterline_stream_transactions_total",
			CommitSeconds:  "meterline_stream_commit_seconds",
			Restarts:       "meterline_stream_session_restarts_total",
			Member:         "meterline_stream_group_member",
			RecordsInHelp:  "Input records consumed in committed transactions, by topic (input consumed again after an abort counts once).",
			RestartReasons: restartReasons,
		}, "outputs, changelog records and consumed offsets"),
		timeIn: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_stream_time_records_in_total",
			Help: "Input records that only move time (dedup's ticks, the watermark records of usage.deduped), consumed in committed transactions, by topic: the part of meterline_stream_records_in_total that is no event."}, []string{"topic"}),
		recordsOut: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_stream_records_out_total",
			Help: "Output records produced in committed transactions, by topic."}, []string{"topic"}),
		settleSeconds: f.NewHistogram(prometheus.HistogramOpts{Name: "meterline_stream_transaction_settle_seconds",
			Help: "Time from the end of a transaction until the coordinator reported it complete (its markers written); the next transaction produces only then.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		settleWait: f.NewHistogram(prometheus.HistogramOpts{Name: "meterline_stream_transaction_settle_wait_seconds",
			Help: "Time the end of a transaction waited for the coordinator to finish the one before it (0 when it had finished while this one processed): the part of meterline_stream_commit_seconds the broker decides.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		fenced: f.NewCounter(prometheus.CounterOpts{Name: "meterline_stream_commits_refused_total",
			Help: "Transactions aborted because the group rebalanced or the offset commit was fenced (a zombie's commits)."}),
		restoring: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_stream_restore_remaining_records",
			Help: "Changelog offsets left to replay, per partition being restored (0 when done)."}, []string{"partition"}),
		restoreRecords: f.NewCounter(prometheus.CounterOpts{Name: "meterline_stream_restore_records_total",
			Help: "Changelog records replayed into the local state."}),
		restoreSeconds: f.NewHistogram(prometheus.HistogramOpts{Name: "meterline_stream_restore_seconds",
			Help: "Duration of a partition restore.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
		restores: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_stream_restores_total",
			Help: "Partition restores, by kind (full: state wiped, changelog replayed from its start; tail: from the checkpoint) and reason (full: no_state, below_log_start, retention_unknown, undated_checkpoint, checkpoint_in_future, horizon; tail: current, within_horizon)."},
			[]string{"kind", "reason"}),
		restoreHorizonExceeded: f.NewCounter(prometheus.CounterOpts{Name: "meterline_stream_restore_horizon_exceeded_total",
			Help: "Restores that found a full restore of the partition expected to take more than half of the changelog's delete.retention.ms (compaction could drop tombstones during it), and copies (restores, standbys) given up after 3 attempts in a row outlasted the restore horizon. A full restore is then refused and the stage stops, a standby stops copying: raise delete.retention.ms (the log line names the value)."}),
		horizonAttempts: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_stream_horizon_attempts",
			Help: "Copies in a row of a partition's changelog (a restore's replays, a standby's copies) that outlasted the restore horizon, per partition; at 3 the copy is given up. Not exported once a copy fits, nor a restore's once its partition is revoked."}, []string{"partition"}),
		outOfRangeReplans: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_stream_restore_out_of_range_replans",
			Help: "Plans in a row of a partition's restore that ended with a changelog fetch out of range (retention deleted records the copy had not read, or a stale leader answered), per partition; the restore waits between them, from 0.5 s doubling to 30 s. Not exported once the restore ends."}, []string{"partition"}),
		restoreRate: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_stream_restore_rate_records_per_second",
			Help: "Restore throughput estimate (changelog records/s) used to plan restores: measured on replays of 10,000 records or more, lowered at once by a slower one."}),
		opens: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_stream_partition_opens_total",
			Help: "Partitions opened after their restore, by the warm state the processor was handed (warm): standby (a promoted standby's), kept (kept by the partition's revoked instance here, through a rebalance that gave it back), none (the processor builds its structures from the state: dedup reads every key)."},
			[]string{"warm"}),
		keptWarm: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_stream_kept_warm_partitions",
			Help: "Revoked partitions whose warm state this instance keeps for their restore, between a rebalance's revoke and the restore that takes it."}),
		owned: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_stream_owned_partitions",
			Help: "Input partitions restored and being processed by this instance."}),
		stateBytes: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_stream_state_bytes",
			Help: "Bytes on disk of the instance's local state (Pebble: sstables, WAL and other files, for every partition it holds), refreshed about every 10 s while it commits."}),
		cleaned: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_stream_state_cleaned_partitions_total",
			Help: "Partitions whose local state (rows and checkpoint) was deleted because this instance neither owns nor keeps them as a standby, by reason: delay (not held for --state-cleanup-delay), horizon (a restore from it would be a full one), no_checkpoint (rows without a checkpoint)."},
			[]string{"reason"}),
		unheldPartitions: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_stream_state_unheld_partitions",
			Help: "Partitions with local state this instance neither owns nor keeps as a standby, kept until --state-cleanup-delay passes (set by each sweep, every 30 s)."}),
		unheldBytes: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_stream_state_unheld_bytes",
			Help: "Estimated bytes on disk of the state counted by meterline_stream_state_unheld_partitions."}),
		changelogUnsafe: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_stream_changelog_unsafe",
			Help: "1 when the changelog's cleanup.policy deletes records (retention.ms) sooner than a restore may need them, as last read (every --changelog-check-interval and before restores), 0 when it keeps them; not exported before the first read answers. A restore is refused while it is 1 (docs/operations.md, MeterlineChangelogUnsafe)."}, []string{"topic"}),
		gapsChecked: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_stream_input_gaps_checked_total",
			Help: "Runs of input offsets the Kafka client returned no record of, checked against the log's batches (dedup: usage.events), by result: sound (commit markers, aborted transactions), deleted (by retention meanwhile), malformed (a batch the client reads at offsets not its own, rejected as undecodable and skipped, the records it hid read), error (the fetch failed: the transaction aborts and the gap is polled again)."},
			[]string{"result"}),
		offsetsWaiting: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_stream_offsets_waiting_partitions",
			Help: "Input partitions assigned to this instance that wait for the group's committed offsets before their restore, by cause: open_transaction (the coordinator answers UNSTABLE_OFFSET_COMMIT: a previous owner's open transaction commits offsets of them, until it commits, aborts or times out), fetch (the fetch has not returned, no cause named)."}, []string{"cause"}),
		offsetsWaitSeconds: f.NewGauge(prometheus.GaugeOpts{Name: "meterline_stream_offsets_wait_seconds",
			Help: "How long the partition waiting longest for the group's committed offsets has waited (refreshed every 0.25 s while one waits), 0 when none waits."}),
		writeRefused: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_stream_write_refused_partitions",
			Help: "Partitions of the topics the stage writes to on which the brokers refuse its writes, as found when a transaction's records waited unwritten (5 s, or half the transaction timeout) or it failed, by cause: below_min_insync (fewer in-sync replicas than min.insync.replicas: NOT_ENOUGH_REPLICAS), no_leader; 0 once a transaction commits."}, []string{"cause"}),
		stateRebuilt: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_stream_state_rebuilt_total",
			Help: "Times the instance's local state was found unusable as the stage started, moved aside (<state dir>.corrupt, replacing an older copy) and replaced by an empty state that the restores rebuild from the changelog in full, by reason: corrupt (Pebble reported a corrupt WAL, MANIFEST or other file), damaged (a file the state needs is missing, or a table is not the size its MANIFEST records), corrupt_read (the state carries the mark of a corrupt table found as the stage ran, which stopped it). More than one on a host points to its disk (docs/operations.md, Corrupt state)."},
			[]string{"reason"}),
	}
	for _, r := range rebuiltReasons {
		m.stateRebuilt.WithLabelValues(r)
	}
	for _, c := range []string{refusedBelowMinISR, refusedNoLeader} {
		m.writeRefused.WithLabelValues(c)
	}
	for _, c := range []string{waitOpenTxn, waitFetch} {
		m.offsetsWaiting.WithLabelValues(c)
	}
	for _, r := range gapResults {
		m.gapsChecked.WithLabelValues(r)
	}
	for _, r := range cleanReasons {
		m.cleaned.WithLabelValues(r)
	}
	// Every kind and reason is exported from the start, at 0: a series
	// born at its first increment hides that increment from increase(),
	// and the alert rules (deploy/prometheus/alerts.yml) watch increases.
	for _, w := range []string{warmStandby, warmKept, warmNone} {
		m.opens.WithLabelValues(w)
	}
	for kind, reasons := range restoreReasons {
		for _, r := range reasons {
			m.restores.WithLabelValues(kind, r)
		}
	}
	return m
}

// restoreReasons lists the reasons of each restore kind (horizon.go).
var restoreReasons = map[string][]string{
	"full": {reasonNoState, reasonBelowLogStart, reasonRetentionUnknown, reasonUndated, reasonFutureCheckpoint, reasonHorizon},
	"tail": {reasonCurrent, reasonWithinHorizon},
}

// out returns recordsOut's counter of topic.
func (m *metrics) out(topic string) prometheus.Counter {
	if c, ok := m.outByTopic.Load(topic); ok {
		return c.(prometheus.Counter)
	}
	c := m.recordsOut.WithLabelValues(topic)
	m.outByTopic.Store(topic, c)
	return c
}
