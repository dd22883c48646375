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
func report(w io.Writer, brokers []string, names topics.Names, tr *truth, rec *recovery, ch *chResult) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	read := func(topic string) ([][]byte, error) {
		recs, err := topics.ReadCommitted(ctx, brokers, topic, nil)
		if err != nil {
			return nil, fmt.Errorf("demo: read %s: %w", topic, err)
		}
		out := make([][]byte, len(recs))
		for i, r := range recs {
			out[i] = r.Value
		}
		return out, nil
	}
	deduped, err := read(names.DedupedTopic())
	if err != nil {
		return false, err
	}
	dups, err := read(names.DuplicatesTopic())
	if err != nil {
		return false, err
	}
	rejected, err := read(names.RejectedTopic())
	if err != nil {
		return false, err
	}
	aggs, err := read(names.AggregatesTopic())
	if err != nil {
		return false, err
	}
	adjs, err := read(names.AdjustmentsTopic())
	if err != nil {
		return false, err
	}

	// Events of httpMeter came over the HTTP ingest, not from the
	// generator: they are counted on their own line.
	counted, conflicts, duplicates := 0, 0, 0
	var httpEvents, httpDups int64
	for _, v := range deduped {
		if k, _ := schemas.PeekKind(v); k == schemas.KindDedupedEvent {
			var e schemas.DedupedEvent
			if schemas.DecodeInto(v, &e) == nil && e.Meter == httpMeter {
				httpEvents++
				continue
			}
			counted++
		}
	}
	for _, v := range dups {
		var d schemas.Duplicate
		err := schemas.DecodeInto(v, &d)
		if err == nil && d.Meter == httpMeter {
			httpDups++
			continue
		}
		duplicates++
		if err == nil && d.Conflict {
			conflicts++
		}
	}
	byReason := map[string]int64{}
	for _, v := range rejected {
		var r schemas.Rejected
		if err := schemas.DecodeInto(v, &r); err == nil {
			byReason[r.Reason]++
		}
	}
	// Per customer and meter: the latest revision of every aggregate, plus
	// every adjustment (every demo meter is a SUM).
	latest := map[string]*schemas.Aggregate{}
	for _, v := range aggs {
		var a schemas.Aggregate
		if schemas.DecodeInto(v, &a) != nil {
			continue
		}
		k := fmt.Sprintf("%s|%s|%d|%v", a.CustomerID, a.Meter, a.PeriodStart, a.Group)
		if cur, ok := latest[k]; !ok || a.Revision > cur.Revision {
			latest[k] = &a
		}
	}
	got := map[string]map[string]int64{}
	add := func(c, m string, v int64) {
		if got[c] == nil {
			got[c] = map[string]int64{}
		}
		got[c][m] += v
	}
	finals := 0
	for _, a := range latest {
		add(a.CustomerID, a.Meter, a.Value)
		if a.Status == schemas.StatusFinal {
			finals++
		}
	}
	lateAdjs := 0
	for _, v := range adjs {
		var a schemas.Adjustment
		err := schemas.DecodeInto(v, &a)
		if err == nil {
			add(a.CustomerID, a.Meter, a.Delta)
		}
		if err != nil || a.Meter != httpMeter {
			lateAdjs++
		}
	}
	var httpTotal int64
	for _, byMeter := range got {
		httpTotal += byMeter[httpMeter]
	}

	tr.mu.Lock()
	defer tr.mu.Unlock()
	ok := true
	check := func(what string, want, have int64) {
		mark := "ok  "
		if want != have {
			mark, ok = "FAIL", false
		}
		fmt.Fprintf(w, "  %s %-42s generated %9d   counted %9d\n", mark, what, want, have)
	}
	fmt.Fprintf(w, "\n== Reconciliation: committed output topics against the generator's ground truth\n")
	fmt.Fprintf(w, "   (%s)\n", rec)
	if f := tr.failed.Load(); f > 0 {
		fmt.Fprintf(w, "  FAIL %d sends were not acknowledged by the broker; the ground truth is unknown\n", f)
		ok = false
	}
	check("unique events produced = events counted", tr.unique, int64(counted))
	check("copies sent = duplicates dropped", tr.copies, int64(duplicates))
	check("  of which conflicting", tr.conflict, int64(conflicts))
	var badTotal int64
	for _, n := range tr.bad {
		badTotal += n
	}
	check("bad events = rejected events", badTotal, int64(len(rejected)))
	reasons := make([]string, 0, len(tr.bad))
	for r := range tr.bad {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		check("  rejected "+r, tr.bad[r], byReason[r])
	}
	check("late events = adjustments", tr.late, int64(lateAdjs))
	customersSorted := make([]string, 0, len(tr.totals))
	for c := range tr.totals {
		customersSorted = append(customersSorted, c)
	}
	sort.Strings(customersSorted)
	for _, c := range customersSorted {
		for _, m := range meters {
			if tr.totals[c][m] == 0 && got[c][m] == 0 {
				continue
			}
			check(fmt.Sprintf("total %s %s (aggregates + adjustments)", c, m), tr.totals[c][m], got[c][m])
		}
	}
	fmt.Fprintf(w, "   %d aggregates (%d FINAL), %d adjustments\n", len(latest), finals, len(adjs))
	if httpEvents+httpDups > 0 {
		fmt.Fprintf(w, "   posted over HTTP (meter %s, not generated): %d events counted, %d duplicates dropped, total %d\n",
			httpMeter, httpEvents, httpDups, httpTotal)
	}
	if ch != nil {
		fmt.Fprintf(w, "== ClickHouse: the sink's tables in database %s on %s (plain count(), no FINAL)\n", ch.db, ch.addr)
		if ch.err != nil {
			fmt.Fprintf(w, "  FAIL reading the tables: %v\n", ch.err)
			ok = false
		} else {
			check(sink.TableEvents+" rows = unique events", tr.unique, ch.counts[sink.TableEvents]-httpEvents)
			check(sink.TableDuplicates+" rows = copies sent", tr.copies, ch.counts[sink.TableDuplicates]-httpDups)
			check(sink.TableRejected+" rows = bad events", badTotal, ch.counts[sink.TableRejected])
			check(sink.TableAdjustments+" rows = late events", tr.late, ch.counts[sink.TableAdjustments]-int64(len(adjs)-lateAdjs))
			check(sink.TableAggregates+" rows = topic revisions", int64(len(aggs)), ch.counts[sink.TableAggregates])
			for _, m := range meters {
				var want int64
				for _, c := range customersSorted {
					want += tr.totals[c][m]
				}
				check("total "+m+" (aggregates + adjustments)", want, ch.meterTotal[m])
			}
		}
	}
	if ok {
		fmt.Fprintf(w, "== RECONCILED: every event counted exactly once\n")
	} else {
		fmt.Fprintf(w, "== MISMATCH: see the FAIL lines above\n")
	}
	if ch != nil {
		fmt.Fprintf(w, "\nThe tables stay in ClickHouse after the demo. Try:\n  %s\n(more queries in docs/analysts.md)\n", tryCommand(ch.addr, ch.db))
	}
	return ok, nil
}
