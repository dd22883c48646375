package clustertest

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meterline/meterline/schemas"
)

// The entitlements of the load (docs/entitlements.md), written with
// `meterline entitlements` before any stage starts, so that every event
// arrives after them and is decided by them. They are chosen so that the
// outcome does not depend on the order in which the aggregator decides the
// events, only on how many identities each customer-meter has in each
// period:
//   - the default plan caps tokens far above any load and allows overdraft:
//     every other customer's events are decided (and priced) and all
//     accepted, so every exact check of the pipeline still holds for them;
//   - the capped customers send one quantity per meter, so that with a
//     reject cap of limit L, accepted = min(n, floor(L/q)) identities of
//     the n of each period (today, yesterday's P, its late events checked
//     against P's cap, and the days-old ones), and an allow cap accepts
//     them all;
//   - the credit customer sends one meter at one quantity with an event
//     time at its send (after the rate card's broker time: the card never
//     prices time before it was written), each event costing creditCost,
//     from one grant without overdraft: accepted = min(n, creditGrant /
//     creditCost), and the grant has exactly that drawn.
const (
	creditCustomer = "wonka"
	creditMeter    = "api_calls"
	creditQty      = 5
	creditRate     = 200                    // micro-credits per api_call
	creditCost     = creditQty * creditRate // per event
	creditEvents   = 300                    // events the grant pays for
	creditGrant    = creditEvents*creditCost + creditCost/2 + 200
)

// limit is one capped customer-meter: its uniform quantity and cap.
type limit struct {
	qty   int64
	cap   int64 // units per period
	allow bool  // on_limit: allow (counted, never refused)
}

// fits is how many events of the limit a period accepts.
func (l limit) fits() int64 { return l.cap / l.qty }

// capped are the capped customers' meters. initech/api_calls reaches its
// cap within seconds both today and in P (before P's cutoff);
// initech/tokens and umbrella/tokens reach today's under the faults, and P's
// only late, if at all, with today's already full: a late event checked
// against today's cap instead of its own period's would be refused.
var capped = map[string]map[string]limit{
	"initech":  {"api_calls": {qty: 3, cap: 3*20 + 2}, "tokens": {qty: 250, cap: 250*120 + 100}},
	"umbrella": {"api_calls": {qty: 2, cap: 50, allow: true}, "tokens": {qty: 40, cap: 40 * 60}},
}

// limited reports whether the customer's events are decided against a
// limit that may refuse some of them.
func limited(cust string) bool { return cust == creditCustomer || capped[cust] != nil }

// expectAccepted is how many of n identities of a customer-meter in one
// period the aggregator accepts, and the reason it refuses the others.
func expectAccepted(cust, meter string, n int64) (int64, string) {
	if cust == creditCustomer {
		return min(n, creditGrant/creditCost), "no_credit"
	}
	if l, ok := capped[cust][meter]; ok && !l.allow {
		return min(n, l.fits()), "over_limit"
	}
	return n, ""
}

// writeEntitlements starts writing the default plan, the rate card and
// the limited customers' records with `meterline entitlements`, each
// command with a transactional ID of its own, all at once, while the suite
// goes on setting up; the function it returns waits for them (before any
// stage starts) and fails the test if one failed.
func (s *suite) writeEntitlements() (wait func()) {
	s.t.Helper()
	start := time.Now()
	today := start.UnixMilli() - start.UnixMilli()%dayMs
	docs := map[string]string{
		"default.yaml": "plan: standard\ncaps:\n  tokens: {limit: 1000000000000000}\noverdraft: {policy: allow}\n",
		// Dated at P's start: it prices only from its broker time on
		// (docs/entitlements.md, The rate card), so no event of P.
		"rates.yaml": fmt.Sprintf("versions:\n  - effective_from: %q\n    rates: {%s: %d, tokens: 15/1000}\n",
			time.UnixMilli(today-dayMs).UTC().Format(time.RFC3339), creditMeter, creditRate),
		creditCustomer + ".yaml": fmt.Sprintf("customer: %s\nplan: prepaid\ngrants:\n  trial: {amount: %d}\noverdraft: {policy: deny}\n",
			creditCustomer, creditGrant),
	}
	for cust, meters := range capped {
		var b strings.Builder
		fmt.Fprintf(&b, "customer: %s\nplan: capped\ncaps:\n", cust)
		for _, m := range slices.Sorted(maps.Keys(meters)) {
			l := meters[m]
			fmt.Fprintf(&b, "  %s: {limit: %d, on_limit: %s}\n", m, l.cap, map[bool]string{true: "allow", false: "reject"}[l.allow])
		}
		docs[cust+".yaml"] = b.String()
	}
	var wg sync.WaitGroup
	errs := make([]string, len(docs))
	for i, name := range slices.Sorted(maps.Keys(docs)) {
		path := filepath.Join(s.dir, name)
		if err := os.WriteFile(path, []byte(docs[name]), 0o600); err != nil {
			s.t.Fatal(err)
		}
		cmd := "set"
		switch name {
		case "default.yaml":
			cmd = "set-default"
		case "rates.yaml":
			cmd = "set-rates"
		}
		args := []string{"entitlements", cmd, "-f", path, "--brokers", strings.Join(s.brokers, ","), "--topic-prefix", s.names.Prefix,
			"--transactional-id", s.names.Prefix + "entitlements-" + strings.TrimSuffix(name, ".yaml")}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := exec.Command(s.bin, args...)
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "METERLINE_") {
					c.Env = append(c.Env, kv)
				}
			}
			if out, err := c.CombinedOutput(); err != nil {
				errs[i] = fmt.Sprintf("meterline %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}()
	}
	return func() {
		s.t.Helper()
		wg.Wait()
		if msg := strings.Join(slices.DeleteFunc(errs, func(e string) bool { return e == "" }), "\n"); msg != "" {
			s.fatalf("writing the entitlements: %s", msg)
		}
		s.entWritten = time.Now().UnixMilli()
		s.note("entitlements written in %s: default plan, rate card, %s (credits for %d events), capped %v", time.Since(start).Round(time.Millisecond),
			creditCustomer, creditEvents, slices.Sorted(maps.Keys(capped)))
	}
}

// queryFunc runs a ClickHouse query, scanning each row into dest and
// calling scan (reconcile's query).
type queryFunc func(q string, scan func(...any) error, dest ...any)

// entKey is one limited customer-meter-period: for the credit customer
// the period is 0, its grant paying for every period alike.
func entKey(cust, meter string, period int64) aggKey {
	if cust == creditCustomer {
		period = 0
	}
	return aggKey{cust: cust, meter: meter, period: period}
}

// reconcileEntitlements checks the decisions of the limited customers
// (capped and credit-limited, whose events the other checks of reconcile
// leave out) to the unit:
//   - per customer-meter-period, the accepted identities (the latest
//     revision's events plus the adjustments) are expectAccepted of the
//     truth's, in count and in units, and usage_rejected has the others,
//     from stage aggregator with the limit's reason;
//   - a refused identity is an identity of the truth, refused once, and in
//     no adjustment; an adjustment is of a late identity, with its
//     quantity, booked into the period of its arrival;
//   - the latest balance of the credit customer has exactly the accepted
//     events' cost drawn from its grant, and no overdraft; that of each
//     capped customer is of the period its outputs end in (balancePeriod)
//     and has that period's accepted units as its usage.
//
// Copies of refused identities reach no decision (dedup drops them): the
// exact counts show they consume nothing.
func (s *suite) reconcileEntitlements(tr *truth, query queryFunc, add func(string, ...any)) {
	n := map[aggKey]int64{}
	onTime := map[aggKey]int64{}
	for _, id := range tr.idents {
		if !limited(id.cust) {
			continue
		}
		k := entKey(id.cust, id.meter, id.et-id.et%dayMs)
		n[k]++
		if s.onTime(id) {
			onTime[k]++
		}
	}
	var (
		cust, meter, eventID, reason, stage string
		cnt                                 uint64
		value, events, delta                int64
		period, booked                      uint32
	)
	ms := func(secs uint32) int64 { return int64(secs) * 1000 }
	in := func(col string) string {
		return fmt.Sprintf("%s IN ('%s')", col, strings.Join(append(slices.Sorted(maps.Keys(capped)), creditCustomer), "', '"))
	}

	// What was accepted: the latest revision of each aggregate, and each
	// adjustment, by identity.
	accepted := map[aggKey]sumCount{}
	query("SELECT customer_id, meter, toUInt32(period_start), argMax(value, revision), argMax(event_count, revision) FROM usage_aggregates WHERE "+
		in("customer_id")+" GROUP BY customer_id, meter, period_start", func(...any) error {
		k := entKey(cust, meter, ms(period))
		if events > onTime[k] {
			add("entitlements: %s: the latest revision counts %d events, but only %d arrived on time", aggKey{cust, meter, ms(period), 0}, events, onTime[k])
		}
		a := accepted[k]
		accepted[k] = sumCount{a.n + events, a.sum + value}
		return nil
	}, &cust, &meter, &period, &value, &events)
	adjusted := map[string]bool{}
	query("SELECT customer_id, meter, event_id, toUInt32(original_period_start), toUInt32(booked_period_start), delta FROM usage_adjustments WHERE "+
		in("customer_id"), func(...any) error {
		idKey := identityKey(cust, meter, eventID)
		id := tr.idents[idKey]
		switch {
		case id == nil:
			add("entitlements: usage_adjustments has %s/%s/%s, which is no identity of the truth", cust, meter, eventID)
			return nil
		case adjusted[idKey]:
			add("entitlements: %s/%s/%s adjusted twice", cust, meter, eventID)
		case s.onTime(id):
			add("entitlements: %s/%s/%s adjusted, but it arrived on time", cust, meter, eventID)
		case ms(period) != id.et-id.et%dayMs || ms(booked) != id.arrival-id.arrival%dayMs || delta != id.qty:
			add("entitlements: adjustment of %s/%s/%s: period %d booked %d delta %d, want %d booked %d delta %d", cust, meter, eventID,
				ms(period), ms(booked), delta, id.et-id.et%dayMs, id.arrival-id.arrival%dayMs, id.qty)
		}
		adjusted[idKey] = true
		k := entKey(cust, meter, ms(period))
		a := accepted[k]
		accepted[k] = sumCount{a.n + 1, a.sum + delta}
		return nil
	}, &cust, &meter, &eventID, &period, &booked, &delta)

	// What was refused: each identity once, by the limit's reason, never
	// adjusted.
	refused := map[aggKey]int64{}
	rejectedIDs := map[string]bool{}
	query("SELECT customer_id, meter, event_id, reason, stage, count() FROM usage_rejected WHERE stage != 'dedup' GROUP BY customer_id, meter, event_id, reason, stage",
		func(...any) error {
			idKey := identityKey(cust, meter, eventID)
			id := tr.idents[idKey]
			if id == nil {
				add("entitlements: usage_rejected has %s/%s/%s (%s, stage %s), which is no identity of the truth", cust, meter, eventID, reason, stage)
				return nil
			}
			k := entKey(cust, meter, id.et-id.et%dayMs)
			_, want := expectAccepted(cust, meter, 0)
			if stage != "aggregator" || reason != want || cnt != 1 {
				add("entitlements: %s refused %s/%s/%s %d times with reason %s, want once with %q from the aggregator", stage, cust, meter, eventID, cnt, reason, want)
			}
			if adjusted[idKey] {
				add("entitlements: %s/%s/%s was refused (%s) and is counted in an adjustment", cust, meter, eventID, reason)
			}
			rejectedIDs[idKey] = true
			refused[k]++
			return nil
		}, &cust, &meter, &eventID, &reason, &stage, &cnt)

	byReason := map[string]int64{}
	pRefused := false
	keys := maps.Clone(n)
	for k := range accepted {
		keys[k] += 0
	}
	for _, k := range unionKeys(keys, nil) {
		want, reason := expectAccepted(k.cust, k.meter, n[k])
		q := int64(creditQty)
		if k.cust != creditCustomer {
			q = capped[k.cust][k.meter].qty
		}
		if a := accepted[k]; a.n != want || a.sum != want*q {
			add("entitlements: %s: accepted %d events of %d units (%d identities), want %d of %d units", k, a.n, a.sum, n[k], want, want*q)
		}
		if refused[k] != n[k]-want {
			add("entitlements: %s: usage_rejected has %d %s of %d identities, want %d", k, refused[k], reason, n[k], n[k]-want)
		}
		if reason != "" {
			byReason[reason] += n[k] - want
		}
		pRefused = pRefused || (k.period == s.periodP && n[k] > want)
	}
	copied := 0
	for idKey := range rejectedIDs {
		copied += tr.copiesOf[idKey]
	}
	s.t.Logf("entitlements: refused %v; %d copies of refused identities; limited customer-meter-periods: %d", byReason, copied, len(n))
	if byReason["over_limit"] == 0 || byReason["no_credit"] == 0 || !pRefused || copied == 0 {
		add("entitlements: no over_limit, no no_credit refusal, none in P or no copy of a refused event: the test proves nothing (refused %v, in P %v, copies %d)",
			byReason, pRefused, copied)
	}
	s.reconcileBalances(tr, rejectedIDs, accepted, query, add)
}

// identityKey is the canonical key of an identity (the truth's key).
func identityKey(cust, meter, eventID string) string {
	return string(schemas.Identity{CustomerID: cust, Meter: meter, EventID: eventID}.Key())
}

// balancePeriod is the period (ms) of a customer's last balance once the
// aggregator has emitted everything due (docs/entitlements.md, The
// aggregator, 4): each balance is as of the later of its partition's
// watermark and the latest broker time involved, so the last one is of
// the period of the later of the final watermark of its usage.deduped
// partition and the latest arrival of its accepted events (refused are
// the identities usage_rejected holds). Broker time, never the
// wall clock at the check: a load that ended before midnight UTC and is
// checked after it still ends in the day before, and one that ran across
// midnight ends in the new day.
func (s *suite) balancePeriod(tr *truth, refused map[string]bool, cust string) int64 {
	at := s.watermarks[customerPartition(cust)]
	for k, id := range tr.idents {
		if id.cust == cust && !refused[k] {
			at = max(at, id.arrival)
		}
	}
	return at - at%dayMs
}

// reconcileBalances checks the latest balance of each limited customer in
// usage_balances: the credit customer's grant has paid exactly its
// accepted events, without overdraft, and each capped customer's balance
// is of its balancePeriod, with that period's accepted units as its usage.
func (s *suite) reconcileBalances(tr *truth, refused map[string]bool, accepted map[aggKey]sumCount, query queryFunc, add func(string, ...any)) {
	var (
		cust, policy            string
		periodStart             uint32
		names, grants           []string
		usage, consumed, remain []int64
		overdrawn               int64
	)
	seen := map[string]bool{}
	query("SELECT customer_id, argMax(toUInt32(period_start), revision), argMax(meter_names, revision), argMax(meter_usage, revision), "+
		"argMax(grant_ids, revision), argMax(grant_consumed, revision), argMax(grant_remaining, revision), argMax(overdraft_policy, revision), "+
		"argMax(overdrawn, revision) FROM usage_balances GROUP BY customer_id", func(...any) error {
		if !limited(cust) {
			return nil
		}
		seen[cust] = true
		if cust == creditCustomer {
			drawn := accepted[entKey(cust, creditMeter, 0)].n * creditCost
			if !slices.Equal(grants, []string{"trial"}) || consumed[0] != drawn || remain[0] != creditGrant-drawn || policy != "deny" || overdrawn != 0 {
				add("entitlements: the latest balance of %s (%s): grants %v consumed %v remaining %v, overdraft %s %d; want trial consumed %d remaining %d, overdraft deny 0",
					cust, creditMeter, grants, consumed, remain, policy, overdrawn, drawn, creditGrant-drawn)
			}
			return nil
		}
		period := s.balancePeriod(tr, refused, cust)
		if ms := int64(periodStart) * 1000; ms != period {
			add("entitlements: the latest balance of %s is of the period %s, want %s (the period of its partition's final watermark or its latest accepted arrival)", cust,
				time.UnixMilli(ms).UTC().Format(time.DateOnly), time.UnixMilli(period).UTC().Format(time.DateOnly))
			return nil
		}
		for i, m := range names {
			want := accepted[entKey(cust, m, period)].sum
			if usage[i] != want {
				add("entitlements: the latest balance of %s: %s used %d units on %s, want %d accepted", cust, m, usage[i],
					time.UnixMilli(period).UTC().Format(time.DateOnly), want)
			}
		}
		if len(names) != len(capped[cust]) {
			add("entitlements: the latest balance of %s has caps %v, want %v", cust, names, slices.Sorted(maps.Keys(capped[cust])))
		}
		return nil
	}, &cust, &periodStart, &names, &usage, &grants, &consumed, &remain, &policy, &overdrawn)
	for _, c := range append(slices.Sorted(maps.Keys(capped)), creditCustomer) {
		if !seen[c] {
			add("entitlements: usage_balances has no balance of %s", c)
		}
	}
}
