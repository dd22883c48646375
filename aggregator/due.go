package aggregator

import (
	"time"

	"go.uber.org/zap"
)

// finalDueEvery bounds how often a partition recomputes its final-due
// gauge while records arrive and its watermark stays (two seeks in its
// state).
const finalDueEvery = time.Second

// dueRefresh is when, and at which watermark, a partition last refreshed
// its final-due gauge.
type dueRefresh struct {
	at time.Time
	wm int64
}

// refreshFinalDue sets meterline_aggregate_final_due_seconds{partition}:
// end + grace of the oldest period with OPEN aggregates or pending late
// events in st, or no series when there is none. It is a metric only: the
// FINAL decision is the watermark's (finalize), never this. now is the
// processor's wall clock, used only to bound the refresh rate; force
// refreshes regardless (a partition just opened).
//
// Process calls it after handling a batch, so it reflects the transactions
// before that batch's Flush plus this batch's finalizations: it refreshes
// at once when the watermark moved (a FINAL may have been decided), and
// otherwise at most every finalDueEvery, so a period opened by a batch
// shows within about a second while records arrive. While no record arrives
// the state does not change, and the gauge keeps its value: a watermark
// that stopped leaves the due time in place while wall time passes it,
// which is what the FINAL-overdue alert (deploy/prometheus/alerts.yml)
// watches.
func (pt *partition) refreshFinalDue(st stateReader, force bool) {
	now := pt.pr.now()
	if since := now.Sub(pt.due.at); !force && pt.wm == pt.due.wm && since >= 0 && since < finalDueEvery {
		return
	}
	pt.due = dueRefresh{at: now, wm: pt.wm}
	s1, ok1, err := firstPeriod(st, pfxOpen)
	if err != nil {
		pt.pr.log.Warn("final-due metric: read open periods", zap.Int32("partition", pt.p), zap.Error(err))
		return
	}
	s2, ok2, err := firstPeriod(st, pfxPending)
	if err != nil {
		pt.pr.log.Warn("final-due metric: read pending late events", zap.Int32("partition", pt.p), zap.Error(err))
		return
	}
	if !ok1 && !ok2 {
		pt.pr.m.finalDue.DeleteLabelValues(pt.pl)
		return
	}
	start := s1
	if !ok1 || (ok2 && s2 < s1) {
		start = s2
	}
	_, end := pt.pr.cfg.Period.Bounds(start)
	pt.pr.m.finalDue.WithLabelValues(pt.pl).Set(float64(end+pt.pr.cfg.Grace.Milliseconds()) / 1000)
}
