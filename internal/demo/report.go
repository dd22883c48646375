package demo

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
	"github.com/meterline/meterline/sink"
)

// report reads the committed output topics and checks them against the
// generator's ground truth. It returns false on any mismatch.
// With ch (the sink ran), it also checks the sink's ClickHouse tables.
func report(w io.Writer, brokers []string, names topics.Names, tr *truth, rec *recovery, ch *chResult, ent *entSetup) (bool, error) {
	out, err := readOutputs(brokers, names)
	if err != nil {
		return false, err
	}
	t := tallyOutputs(out)

	tr.mu.Lock()
	defer tr.mu.Unlock()
	r := &reconciler{w: w, ok: true}
	fmt.Fprintf(w, "\n== Reconciliation: committed output topics against the generator's ground truth\n")
	fmt.Fprintf(w, "   (%s)\n", rec.ended())
	r.checkTopics(tr, t)
	if ent != nil {
		r.checkEntitlements(tr, t, ent)
	}
	if t.httpEvents+t.httpDups > 0 {
		fmt.Fprintf(w, "   posted over HTTP (meter %s, not generated): %d events counted, %d duplicates dropped, total %d\n",
			httpMeter, t.httpEvents, t.httpDups, t.httpTotal)
	}
	if ch != nil {
		r.checkClickHouse(tr, t, ch)
	}
	r.verdict(rec.hadCrash())
	if ch != nil {
		fmt.Fprintf(w, "\nThe tables stay in ClickHouse after the demo. Try:\n  %s\n(more queries in docs/analysts.md)\n", tryCommand(ch.srv, ch.db))
	}
	return r.ok, nil
}

// outputs are the values of the committed records of the output topics.
type outputs struct {
	deduped, dups, rejected, aggs, adjs, balances [][]byte
}

// readOutputs reads the output topics, read_committed, from the start.
func readOutputs(brokers []string, names topics.Names) (outputs, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out outputs
	for _, t := range []struct {
		topic string
		into  *[][]byte
	}{
		{names.DedupedTopic(), &out.deduped},
		{names.DuplicatesTopic(), &out.dups},
		{names.RejectedTopic(), &out.rejected},
		{names.AggregatesTopic(), &out.aggs},
		{names.AdjustmentsTopic(), &out.adjs},
		{names.BalancesTopic(), &out.balances},
	} {
		recs, err := topics.ReadCommitted(ctx, brokers, t.topic, nil)
		if err != nil {
			return out, fmt.Errorf("demo: read %s: %w", t.topic, err)
		}
		*t.into = make([][]byte, len(recs))
		for i, r := range recs {
			(*t.into)[i] = r.Value
		}
	}
	return out, nil
}

// tally is what the output topics count. Events of httpMeter came over the
// HTTP ingest, not from the generator: they are counted apart.
type tally struct {
	counted, conflicts, duplicates int
	httpEvents, httpDups           int64
	byReason                       map[string]int64
	rejected                       int // by dedup: bad records
	// aggRejected counts the aggregator's rejections by reason; balances
	// is the latest balance of each customer, nBalances the records.
	aggRejected map[string]int64
	balances    map[string]*schemas.Balance
	nBalances   int
	// latest is the latest revision of every aggregate, finals how many of
	// them are FINAL.
	latest map[string]*schemas.Aggregate
	finals int
	// got is, per customer and meter, the latest revision of every
	// aggregate plus every adjustment (every demo meter is a SUM).
	got       map[string]map[string]int64
	adjs      int
	lateAdjs  int // adjustments not of httpMeter
	aggs      int // aggregate revisions on the topic
	httpTotal int64
}

// tallyOutputs counts the output topics' records.
func tallyOutputs(out outputs) tally {
	t := tally{byReason: map[string]int64{}, latest: map[string]*schemas.Aggregate{}, got: map[string]map[string]int64{},
		adjs: len(out.adjs), aggs: len(out.aggs), aggRejected: map[string]int64{}, balances: map[string]*schemas.Balance{},
		nBalances: len(out.balances)}
	for _, v := range out.deduped {
		if k, _ := schemas.PeekKind(v); k == schemas.KindDedupedEvent {
			var e schemas.DedupedEvent
			if schemas.DecodeInto(v, &e) == nil && e.Meter == httpMeter {
				t.httpEvents++
				continue
			}
			t.counted++
		}
	}
	for _, v := range out.dups {
		var d schemas.Duplicate
		err := schemas.DecodeInto(v, &d)
		if err == nil && d.Meter == httpMeter {
			t.httpDups++
			continue
		}
		t.duplicates++
		if err == nil && d.Conflict {
			t.conflicts++
		}
	}
	for _, v := range out.rejected {
		var r schemas.Rejected
		err := schemas.DecodeInto(v, &r)
		if err == nil && r.Stage == "aggregator" {
			t.aggRejected[r.Reason]++
			continue
		}
		t.rejected++
		if err == nil {
			t.byReason[r.Reason]++
		}
	}
	for _, v := range out.balances {
		var b schemas.Balance
		if schemas.DecodeInto(v, &b) == nil {
			if cur := t.balances[b.CustomerID]; cur == nil || b.Revision > cur.Revision {
				t.balances[b.CustomerID] = &b
			}
		}
	}
	t.tallyAggregates(out)
	for _, byMeter := range t.got {
		t.httpTotal += byMeter[httpMeter]
	}
	return t
}

// tallyAggregates sums the latest revision of every aggregate and every
// adjustment per customer and meter.
func (t *tally) tallyAggregates(out outputs) {
	for _, v := range out.aggs {
		var a schemas.Aggregate
		if schemas.DecodeInto(v, &a) != nil {
			continue
		}
		k := fmt.Sprintf("%s|%s|%d|%v", a.CustomerID, a.Meter, a.PeriodStart, a.Group)
		if cur, ok := t.latest[k]; !ok || a.Revision > cur.Revision {
			t.latest[k] = &a
		}
	}
	for _, a := range t.latest {
		t.add(a.CustomerID, a.Meter, a.Value)
		if a.Status == schemas.StatusFinal {
			t.finals++
		}
	}
	for _, v := range out.adjs {
		var a schemas.Adjustment
		err := schemas.DecodeInto(v, &a)
		if err == nil {
			t.add(a.CustomerID, a.Meter, a.Delta)
		}
		if err != nil || a.Meter != httpMeter {
			t.lateAdjs++
		}
	}
}

func (t *tally) add(customer, meter string, v int64) {
	if t.got[customer] == nil {
		t.got[customer] = map[string]int64{}
	}
	t.got[customer][meter] += v
}

// reconciler prints one line a check; ok stays true while every check
// matched.
type reconciler struct {
	w  io.Writer
	ok bool
}

// verdict prints the outcome of every check, and what it has shown: a
// run that had dedup's crash (crashed) counted through it.
func (r *reconciler) verdict(crashed bool) {
	if r.ok {
		through := ""
		if crashed {
			through = ", through the crash"
		}
		fmt.Fprintf(r.w, "== RECONCILED: every event counted exactly once%s: no copy counted, "+
			"no event lost, every total, refusal and credit as generated\n", through)
	} else {
		fmt.Fprintf(r.w, "== MISMATCH: see the FAIL lines above\n")
	}
}

func (r *reconciler) check(what string, want, have int64) {
	mark := "ok  "
	if want != have {
		mark, r.ok = "FAIL", false
	}
	fmt.Fprintf(r.w, "  %s %-42s generated %9d   counted %9d\n", mark, what, want, have)
}

// checkTopics checks the output topics' tally against the truth tr (its
// lock held).
func (r *reconciler) checkTopics(tr *truth, t tally) {
	if f := tr.failed.Load(); f > 0 {
		fmt.Fprintf(r.w, "  FAIL %d sends were not acknowledged by the broker; the ground truth is unknown\n", f)
		r.ok = false
	}
	fmt.Fprintf(r.w, "   generated: what the generator sent (its ground truth); counted: what the committed output topics hold\n")
	r.check("unique events produced = events counted", tr.unique, int64(t.counted))
	r.check("copies sent = duplicates dropped", tr.copies, int64(t.duplicates))
	r.check("  of which conflicting", tr.conflict, int64(t.conflicts))
	r.check("bad events = rejected events", tr.badTotal(), int64(t.rejected))
	reasons := make([]string, 0, len(tr.bad))
	for reason := range tr.bad {
		reasons = append(reasons, reason)
	}
	sort.Strings(reasons)
	for _, reason := range reasons {
		r.check("  rejected "+reason, tr.bad[reason], t.byReason[reason])
	}
	r.check("late events = adjustments", tr.late, int64(t.lateAdjs))
	var refused int64
	for _, n := range tr.entRejected {
		refused += n
	}
	if refused > 0 {
		fmt.Fprintf(r.w, "   totals per customer and meter (aggregates + adjustments; the %d events refused by caps and credits passed dedup and are in none):\n", refused)
	} else {
		fmt.Fprintf(r.w, "   totals per customer and meter (aggregates + adjustments):\n")
	}
	for _, c := range tr.customers() {
		for _, m := range meters {
			if tr.totals[c][m] == 0 && t.got[c][m] == 0 {
				continue
			}
			r.check(fmt.Sprintf("  %s %s", c, m), tr.totals[c][m], t.got[c][m])
		}
	}
	fmt.Fprintf(r.w, "   %d aggregates (%d FINAL), %d adjustments\n", len(t.latest), t.finals, t.adjs)
	fmt.Fprintf(r.w, "   aggregates: one per customer, meter and hour, at its latest revision (FINAL: its hour is closed); "+
		"adjustments: one per late event, for an hour closed before it arrived\n")
}

// checkEntitlements checks the aggregator's rejections and the credits its
// balances say were drawn against the truth tr (its lock held).
func (r *reconciler) checkEntitlements(tr *truth, t tally, ent *entSetup) {
	r.check("refused by a cap (over_limit, aggregator)", tr.entRejected[schemas.ReasonOverLimit], t.aggRejected[schemas.ReasonOverLimit])
	r.check("refused for want of credit (no_credit)", tr.entRejected[schemas.ReasonNoCredit], t.aggRejected[schemas.ReasonNoCredit])
	var other int64
	for reason, n := range t.aggRejected {
		if reason != schemas.ReasonOverLimit && reason != schemas.ReasonNoCredit {
			other += n
		}
	}
	r.check("other refusals by the aggregator", 0, other)
	r.check("micro-credits drawn (usage.balances)", tr.drawn, grantsConsumed(t.balances))
	if b := t.balances[freeCustomer]; b != nil {
		for _, m := range b.Meters {
			fmt.Fprintf(r.w, "   %s (%s) used %d of its cap of %d %s this hour; %s (%s) has %d micro-credits left of %d\n",
				freeCustomer, b.Plan, m.Usage, m.Limit, m.Meter, prepaidCustomer, prepaidPlan, grantsLeft(t.balances[prepaidCustomer]), ent.grantCalls*apiCallRate)
		}
	}
	fmt.Fprintf(r.w, "   %d balances in %s\n", t.nBalances, "usage.balances")
	fmt.Fprintf(r.w, "   balances: a customer's usage against its caps and the credits left, written by the aggregator as they change "+
		"(at most one a second per customer); the checks above read each customer's latest\n")
}

// grantsConsumed sums what every grant of the balances has paid.
func grantsConsumed(bs map[string]*schemas.Balance) int64 {
	var n int64
	for _, b := range bs {
		for _, g := range b.Grants {
			n += g.Consumed
		}
	}
	return n
}

// grantsLeft sums what the grants of b have left (0 for nil).
func grantsLeft(b *schemas.Balance) int64 {
	if b == nil {
		return 0
	}
	var n int64
	for _, g := range b.Grants {
		n += g.Remaining
	}
	return n
}

// checkClickHouse checks the sink's tables ch against the truth tr (its
// lock held) and the topics' tally t.
func (r *reconciler) checkClickHouse(tr *truth, t tally, ch *chResult) {
	fmt.Fprintf(r.w, "== ClickHouse: the sink's tables in database %s on %s (plain count(), no FINAL)\n", ch.db, ch.addr)
	if ch.err != nil {
		fmt.Fprintf(r.w, "  FAIL reading the tables: %v\n", ch.err)
		r.ok = false
		return
	}
	r.check(sink.TableEvents+" rows = unique events", tr.unique, ch.counts[sink.TableEvents]-t.httpEvents)
	r.check(sink.TableDuplicates+" rows = copies sent", tr.copies, ch.counts[sink.TableDuplicates]-t.httpDups)
	var refused int64
	for _, n := range tr.entRejected {
		refused += n
	}
	r.check(sink.TableRejected+" rows = bad events + refused", tr.badTotal()+refused, ch.counts[sink.TableRejected])
	r.check("  stage aggregator, over_limit", tr.entRejected[schemas.ReasonOverLimit], ch.aggRejected[schemas.ReasonOverLimit])
	r.check("  stage aggregator, no_credit", tr.entRejected[schemas.ReasonNoCredit], ch.aggRejected[schemas.ReasonNoCredit])
	r.check(sink.TableBalances+" rows = balance records", int64(t.nBalances), ch.counts[sink.TableBalances])
	r.check("micro-credits drawn ("+sink.TableBalances+")", tr.drawn, ch.drawn)
	r.check(sink.TableAdjustments+" rows = late events", tr.late, ch.counts[sink.TableAdjustments]-int64(t.adjs-t.lateAdjs))
	r.check(sink.TableAggregates+" rows = topic revisions", int64(t.aggs), ch.counts[sink.TableAggregates])
	fmt.Fprintf(r.w, "   totals per meter (aggregates + adjustments):\n")
	for _, m := range meters {
		var want int64
		for _, c := range tr.customers() {
			want += tr.totals[c][m]
		}
		r.check("  "+m, want, ch.meterTotal[m])
	}
}
