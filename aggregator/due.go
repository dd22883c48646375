package aggregator

import (
	"time"

	"go.uber.org/zap"
)

// finalDueEvery bounds how often Process recomputes a partition's
// final-due gauge while its watermark stays (two seeks in its state).
const finalDueEvery = time.Second

// dueRefresh is when, and at which watermark, a partition last refreshed
// its final-due gauge.
type dueRefresh struct {
	at time.Time
	wm int64
}

// refreshFinalDue sets meterline_aggregate_final_due_seconds{partition}
// to end + grace of the oldest period whose FINAL revisions have not all
// gone out: one decided final whose chunks (FINALs, or the adjustments
// queued behind them) are still going out, or one not decided yet with
// OPEN aggregates, queued events or lines adjustments were booked into
// (undecidedPfx) in st. No series when there is none. It
// is a metric only: the FINAL decision is the watermark's (finalize). now
// (the processor's clock) only bounds the refresh rate; force refreshes
// regardless.
//
// Open refreshes it from the restored state, Work after each chunk, and
// Process after each batch: at once when the watermark moved (a period
// may have been decided), otherwise at most every finalDueEvery, so a
// period a batch opens shows within about a second while records arrive.
// While none arrives the state does not change and the gauge keeps its
// value: a watermark that stopped leaves the due time in place while wall
// time passes it, which the FINAL-overdue alert
// (deploy/prometheus/alerts.yml) watches.
func (pt *partition) refreshFinalDue(st stateReader, force bool) {
	now := pt.pr.now()
	if since := now.Sub(pt.due.at); !force && pt.wm == pt.due.wm && since >= 0 && since < finalDueEvery {
		return
	}
	pt.due = dueRefresh{at: now, wm: pt.wm}
	var oldest int64
	found := false
	consider := func(start int64) {
		if !found || start < oldest {
			oldest, found = start, true
		}
	}
	for s, ps := range pt.finals {
		if ps.phase == phaseEmit || ps.phase == phaseBook {
			consider(s)
		}
	}
	// Periods not final yet: none below the latest final one (finalLow).
	for _, pfx := range undecidedPfx {
		s, ok, err := firstPeriodFrom(st, pfx, pt.finalLow(pfx))
		if err != nil {
			pt.pr.log.Warn("final-due metric: read the oldest open period", zap.Int32("partition", pt.p), zap.Error(err))
			return
		}
		if ok {
			consider(s)
		}
	}
	if !found {
		pt.pr.m.finalDue.DeleteLabelValues(pt.pl)
		return
	}
	_, end := pt.pr.cfg.Period.Bounds(oldest)
	pt.pr.m.finalDue.WithLabelValues(pt.pl).Set(float64(end+pt.pr.cfg.Grace.Milliseconds()) / 1000)
}
