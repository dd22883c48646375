package clustertest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/meterline/meterline/schemas"
)

// aggKey is an aggregate (every meter is a SUM without groups) or, with
// booked set, the adjustments of one original period booked into another.
type aggKey struct {
	cust, meter string
	period      int64 // ms
	booked      int64 // ms; adjustments only
}

// String names the aggregate and the partition of usage.deduped (keyed by
// customer), and so of the aggregator, that holds it.
func (k aggKey) String() string {
	s := fmt.Sprintf("%s/%s", k.cust, k.meter)
	if k.period != 0 {
		s += "/" + time.UnixMilli(k.period).UTC().Format(time.DateOnly)
	}
	if k.booked != 0 {
		s += " booked " + time.UnixMilli(k.booked).UTC().Format(time.DateOnly)
	}
	return fmt.Sprintf("%s (aggregator partition %d)", s, customerPartition(k.cust))
}

// customerPartition is the partition of usage.deduped, and so of the
// aggregator, that carries a customer's events.
func customerPartition(cust string) int32 {
	return schemas.Partition(schemas.CustomerKey(cust), partitions)
}

// identityPartition is the partition of usage.events, and so of dedup,
// that decides an identity (its canonical partition).
func identityPartition(cust, meter, eventID string) int32 {
	return schemas.Partition(schemas.Identity{CustomerID: cust, Meter: meter, EventID: eventID}.Key(), partitions)
}

type sumCount struct{ n, sum int64 }

// reconcile checks every ClickHouse table the sink wrote, with plain
// count() and sums (no FINAL: the sink's resume rule keeps them exact),
// against the truth:
//   - usage_events: each identity exactly once, with its quantity;
//   - usage_duplicates: every other copy, conflicts flagged;
//   - usage_rejected: every bad record, by reason;
//   - usage_adjustments: one per late identity, its quantity as delta,
//     booked into the period of its arrival;
//   - usage_aggregates: exactly one FINAL per aggregate of P, of the on-time
//     events; the latest revision of every aggregate equal to its on-time
//     events; FINAL + adjustments equal to every event of the period; and as
//     many rows as usage.aggregates has records.
//
// The limited customers' aggregates and adjustments hold only the events
// their entitlements accepted: reconcileEntitlements checks them, and the
// aggregator's refusals.
func (s *suite) reconcile(tr *truth) {
	s.t.Helper()
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}

	wantEvents := map[aggKey]sumCount{}
	wantLatest := map[aggKey]int64{}
	wantFinal := map[aggKey]int64{}
	wantAdj := map[aggKey]sumCount{}
	allOfP := map[aggKey]int64{}
	late := 0
	var qty int64
	for _, id := range tr.idents {
		qty += id.qty
		period := id.et - id.et%dayMs
		k := aggKey{cust: id.cust, meter: id.meter, period: period}
		e := wantEvents[aggKey{cust: id.cust, meter: id.meter}]
		wantEvents[aggKey{cust: id.cust, meter: id.meter}] = sumCount{e.n + 1, e.sum + id.qty}
		if limited(id.cust) {
			continue // reconcileEntitlements: the accepted ones
		}
		if period == s.periodP {
			allOfP[k] += id.qty
		}
		if s.onTime(id) {
			wantLatest[k] += id.qty
			if period == s.periodP {
				wantFinal[k] += id.qty
			}
			continue
		}
		late++
		ak := k
		ak.booked = id.arrival - id.arrival%dayMs
		a := wantAdj[ak]
		wantAdj[ak] = sumCount{a.n + 1, a.sum + id.qty}
	}
	s.t.Logf("truth: %d records in usage.events from the generator; %d identities (%d late: adjustments), %d copies (%d conflicting), rejected %v; quantity %d; %d aggregates of P final",
		tr.sent, len(tr.idents), late, tr.copies, tr.conflicts, tr.rejected, qty, len(wantFinal))
	if len(wantFinal) == 0 || late == 0 || tr.copies == 0 {
		add("the generator made no on-time events of P, no late event or no copy: the test proves nothing")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var query queryFunc = func(q string, scan func(...any) error, dest ...any) {
		rows, err := s.ch.Query(ctx, q)
		if err != nil {
			s.fatalf("clickhouse: %s: %v", q, err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := rows.Scan(dest...); err != nil {
				s.fatalf("clickhouse: scan %s: %v", q, err)
			}
			if err := scan(dest...); err != nil {
				s.fatalf("%v", err)
			}
		}
		if err := rows.Err(); err != nil {
			s.fatalf("clickhouse: %s: %v", q, err)
		}
	}
	var (
		cust, meter    string
		n              uint64
		sum, v         int64
		period, booked uint32
	)
	ms := func(secs uint32) int64 { return int64(secs) * 1000 }

	// usage_events: plain count() and sum(quantity) per customer and meter.
	haveEvents := map[aggKey]sumCount{}
	query("SELECT customer_id, meter, count(), sum(quantity) FROM usage_events GROUP BY customer_id, meter", func(...any) error {
		haveEvents[aggKey{cust: cust, meter: meter}] = sumCount{int64(n), sum}
		return nil
	}, &cust, &meter, &n, &sum)
	compareSums("usage_events count() and sum(quantity)", wantEvents, haveEvents, add)
	var rows, distinct uint64
	query("SELECT count(), uniqExact(customer_id, meter, event_id) FROM usage_events", func(...any) error { return nil }, &rows, &distinct)
	if rows != distinct {
		var twice []string
		var eventID string
		query("SELECT customer_id, meter, event_id, count() FROM usage_events GROUP BY customer_id, meter, event_id HAVING count() > 1 ORDER BY customer_id, meter, event_id LIMIT 20",
			func(...any) error {
				twice = append(twice, fmt.Sprintf("%s/%s/%s %d times (dedup partition %d, aggregator partition %d)",
					cust, meter, eventID, n, identityPartition(cust, meter, eventID), customerPartition(cust)))
				return nil
			}, &cust, &meter, &eventID, &n)
		add("exactly once in usage_events: %d rows for %d identities, an event counted twice: %s", rows, distinct, strings.Join(twice, "; "))
	}

	// usage_duplicates and usage_rejected.
	var conflicts uint64
	query("SELECT count(), countIf(conflict = 1) FROM usage_duplicates", func(...any) error { return nil }, &rows, &conflicts)
	if int(rows) != tr.copies || int(conflicts) != tr.conflicts {
		add("usage_duplicates: %d rows (%d conflicting), want %d copies (%d conflicting)", rows, conflicts, tr.copies, tr.conflicts)
	}
	haveRej := map[string]int{}
	var reason string
	query("SELECT reason, count() FROM usage_rejected WHERE stage = 'dedup' GROUP BY reason", func(...any) error {
		haveRej[reason] += int(n)
		return nil
	}, &reason, &n)
	for _, r := range unionKeys(tr.rejected, haveRej) {
		if tr.rejected[r] != haveRej[r] {
			add("usage_rejected %s: %d rows, want %d", r, haveRej[r], tr.rejected[r])
		}
	}

	// usage_adjustments: per customer, meter, original and booked period.
	haveAdj := map[aggKey]sumCount{}
	adjOfP := map[aggKey]int64{}
	query("SELECT customer_id, meter, toUInt32(original_period_start), toUInt32(booked_period_start), count(), sum(delta) FROM usage_adjustments GROUP BY customer_id, meter, original_period_start, booked_period_start",
		func(...any) error {
			k := aggKey{cust: cust, meter: meter, period: ms(period), booked: ms(booked)}
			if limited(cust) {
				return nil
			}
			haveAdj[k] = sumCount{int64(n), sum}
			if k.period == s.periodP {
				adjOfP[aggKey{cust: cust, meter: meter, period: k.period}] += sum
			}
			return nil
		}, &cust, &meter, &period, &booked, &n, &sum)
	compareSums("usage_adjustments count() and sum(delta)", wantAdj, haveAdj, add)

	// usage_aggregates: FINAL rows, latest revisions, and FINAL + adjustments.
	haveFinal := map[aggKey]int64{}
	query("SELECT customer_id, meter, toUInt32(period_start), count(), sum(value) FROM usage_aggregates WHERE status = 'FINAL' GROUP BY customer_id, meter, period_start",
		func(...any) error {
			k := aggKey{cust: cust, meter: meter, period: ms(period)}
			if n != 1 {
				add("usage_aggregates: %d FINAL rows for %s, want exactly one", n, k)
			}
			if limited(cust) {
				return nil
			}
			haveFinal[k] = sum
			return nil
		}, &cust, &meter, &period, &n, &sum)
	compareValues("usage_aggregates FINAL value", wantFinal, haveFinal, add)
	haveLatest := map[aggKey]int64{}
	query("SELECT customer_id, meter, toUInt32(period_start), argMax(value, revision) FROM usage_aggregates GROUP BY customer_id, meter, period_start",
		func(...any) error {
			if !limited(cust) {
				haveLatest[aggKey{cust: cust, meter: meter, period: ms(period)}] = v
			}
			return nil
		}, &cust, &meter, &period, &v)
	compareValues("usage_aggregates latest revision", wantLatest, haveLatest, add)
	invoice := map[aggKey]int64{}
	for k, f := range haveFinal {
		invoice[k] += f
	}
	for k, a := range adjOfP {
		invoice[k] += a
	}
	compareValues("P: FINAL + adjustments", allOfP, invoice, add)
	var aggRows uint64
	query("SELECT count() FROM usage_aggregates", func(...any) error { return nil }, &aggRows)
	if topicRows := len(s.readAll(s.names.AggregatesTopic())); int(aggRows) != topicRows {
		add("usage_aggregates: %d rows, usage.aggregates has %d records", aggRows, topicRows)
	}

	// The topics agree with the tables: usage.deduped holds each identity
	// once.
	s.checkDeduped(tr, add)
	s.reconcileEntitlements(tr, query, add)

	if len(problems) > 0 {
		if len(problems) > 40 {
			problems = append(problems[:40], fmt.Sprintf("... %d more", len(problems)-40))
		}
		s.fatalf("the outputs do not reconcile with the generator's truth:\n  %s", strings.Join(problems, "\n  "))
	}
	s.t.Logf("reconciled: %d events, %d duplicates, %d rejected, %d adjustments, %d FINAL aggregates of P, %d aggregate revisions",
		len(tr.idents), tr.copies, sumInts(tr.rejected), late, len(haveFinal), aggRows)
}

// checkDeduped checks that usage.deduped holds every identity of the
// truth exactly once, naming each identity that is missing or there more
// than once with its partition and offsets.
func (s *suite) checkDeduped(tr *truth, add func(string, ...any)) {
	at := map[string][]string{} // identity → "partition/offset" of each copy
	deduped := 0
	for _, r := range s.readAll(s.names.DedupedTopic()) {
		if k, _ := schemas.PeekKind(r.Value); k != schemas.KindDedupedEvent {
			continue
		}
		deduped++
		var e schemas.DedupedEvent
		if err := schemas.DecodeInto(r.Value, &e); err != nil {
			add("usage.deduped partition %d offset %d: undecodable event: %v", r.Partition, r.Offset, err)
			continue
		}
		id := string(schemas.Identity{CustomerID: e.CustomerID, Meter: e.Meter, EventID: e.EventID}.Key())
		at[id] = append(at[id], fmt.Sprintf("%d/%d", r.Partition, r.Offset))
	}
	if deduped != len(tr.idents) {
		add("usage.deduped: %d events, want %d identities", deduped, len(tr.idents))
	}
	var twice, missing []string
	for _, id := range slices.Sorted(maps.Keys(at)) {
		if len(at[id]) > 1 {
			twice = append(twice, fmt.Sprintf("%q at partition/offset %v (dedup partition %d)", id, at[id], schemas.Partition([]byte(id), partitions)))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(tr.idents)) {
		if _, ok := at[id]; !ok {
			in := tr.idents[id]
			missing = append(missing, fmt.Sprintf("%q (dedup partition %d, aggregator partition %d)", id, schemas.Partition([]byte(id), partitions), customerPartition(in.cust)))
		}
	}
	for _, list := range []*[]string{&twice, &missing} {
		if len(*list) > 10 {
			*list = append((*list)[:10], fmt.Sprintf("... %d more", len(*list)-10))
		}
	}
	if len(twice) > 0 {
		add("exactly once in usage.deduped: identities there more than once: %s", strings.Join(twice, "; "))
	}
	if len(missing) > 0 {
		add("no event lost in usage.deduped: identities missing: %s", strings.Join(missing, "; "))
	}
}

func compareSums(what string, want, have map[aggKey]sumCount, add func(string, ...any)) {
	for _, k := range unionKeys(want, have) {
		if want[k] != have[k] {
			add("%s %s: have %d rows summing to %d, want %d summing to %d", what, k, have[k].n, have[k].sum, want[k].n, want[k].sum)
		}
	}
}

func compareValues(what string, want, have map[aggKey]int64, add func(string, ...any)) {
	for _, k := range unionKeys(want, have) {
		w, wok := want[k]
		h, hok := have[k]
		if w != h || wok != hok {
			add("%s %s: have %d (present %v), want %d (present %v)", what, k, h, hok, w, wok)
		}
	}
}

func unionKeys[K comparable, V any](a, b map[K]V) []K {
	seen := map[K]bool{}
	var out []K
	for _, m := range []map[K]V{a, b} {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return fmt.Sprint(out[i]) < fmt.Sprint(out[j]) })
	return out
}

func sumInts(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
