package session

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/prom"
)

// Outcomes of a transaction, the outcome label of Names.Transactions.
const (
	Committed = "committed"
	Aborted   = "aborted"
	// Unknown: ending the transaction failed; the session is rebuilt
	// (ErrRestart).
	Unknown = "unknown"
)

// Names are the full names of a stage's session metrics, spelled out by
// the stage so that a search for a metric's name finds where it is
// registered.
type Names struct {
	RecordsIn, Transactions, CommitSeconds, Restarts string
	// Member is the gauge of group membership (Metrics.Member).
	Member string
	// RecordsInHelp is RecordsIn's help text; "": input records polled,
	// counted again when re-consumed after an aborted transaction.
	RecordsInHelp string
	// RestartReasons are the reasons the stage's sessions are rebuilt
	// for, besides those of every stage (commit_unknown, fenced,
	// init_producer_id): each is exported at 0 from the start and named
	// in Restarts' help text.
	RestartReasons []RestartReason
}

// Metrics are a stage's session metrics. The stage counts its input and
// its transactions; Loop.Run counts the restarts.
type Metrics struct {
	// RecordsIn is Names.RecordsIn{topic}: input records, by topic, as
	// the stage counts them (Names.RecordsInHelp).
	RecordsIn *prometheus.CounterVec
	// Transactions is Names.Transactions{outcome}: transactions ended, by
	// outcome (Committed, Aborted, Unknown).
	Transactions *prometheus.CounterVec
	// CommitSeconds is Names.CommitSeconds: the time to write what is
	// left of a transaction and end it.
	CommitSeconds prometheus.Histogram
	// Restarts is Names.Restarts{reason}: sessions rebuilt after
	// ErrRestart, by RestartReason.
	Restarts *prometheus.CounterVec
	// Member is Names.Member: 1 while the open session is a member of
	// its consumer group (Loop.InGroup), 0 from the start until it first
	// joins and whenever it has lost the group (the brokers or the
	// group's coordinator unreachable) until it has joined again.
	Member prometheus.Gauge
}

// NewMetrics gets or registers the session metrics of a stage, named n.
// carries says what one of its transactions carries, for the help text.
func NewMetrics(reg prometheus.Registerer, n Names, carries string) *Metrics {
	f := prom.NewFactory(reg)
	if n.RecordsInHelp == "" {
		n.RecordsInHelp = "Input records polled, by topic (counted again when re-consumed after an aborted transaction)."
	}
	reasons := append([]RestartReason{RestartCommitUnknown, RestartFenced, RestartInitProducerID}, n.RestartReasons...)
	names := make([]string, len(reasons))
	for i, r := range reasons {
		names[i] = string(r)
	}
	m := &Metrics{
		RecordsIn: f.NewCounterVec(prometheus.CounterOpts{Name: n.RecordsIn, Help: n.RecordsInHelp}, []string{"topic"}),
		Transactions: f.NewCounterVec(prometheus.CounterOpts{Name: n.Transactions,
			Help: "Transactions ended (" + carries + "), by outcome: committed, aborted, unknown."}, []string{"outcome"}),
		CommitSeconds: f.NewHistogram(prometheus.HistogramOpts{Name: n.CommitSeconds,
			Help: "Time to write what is left of a transaction (" + carries + ") and end it.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		Restarts: f.NewCounterVec(prometheus.CounterOpts{Name: n.Restarts,
			Help: "Kafka sessions rebuilt, with the same transactional ID, after a commit with an unknown outcome or a producer state that only a new session repairs, by reason: " +
				strings.Join(names, ", ") + " (docs/operations.md, Health, metrics and logs)."}, []string{"reason"}),
		Member: f.NewGauge(prometheus.GaugeOpts{Name: n.Member,
			Help: "1 while the instance is a member of its consumer group (assigned its partitions, or none with more members than partitions); 0 until it first joins and while it has lost the group (brokers or coordinator unreachable), as /readyz says."}),
	}
	// Every outcome at 0 from the start: a series born at its first
	// increment hides that increment from rate() and increase(). The
	// stage exports RecordsIn of each of its input topics.
	for _, o := range []string{Committed, Aborted, Unknown} {
		m.Transactions.WithLabelValues(o)
	}
	for _, r := range names {
		m.Restarts.WithLabelValues(r)
	}
	return m
}
