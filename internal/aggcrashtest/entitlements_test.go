package aggcrashtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/entitlements/entref"
	"github.com/meterline/meterline/internal/cli"
	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/testenv/crash"
	"github.com/meterline/meterline/internal/testenv/oracle"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// entSuite is a suite whose aggregator decides entitlements: the test
// writes usage.entitlements (CreateTime, so that it chooses every broker
// time) and appends the ticks itself, each partition's times
// non-decreasing as a broker's would be, and the model decides every event
// with the entitlements package's reference model (oracle.Entitlements).
type entSuite struct {
	*suite
	ent    oracle.Entitlements
	ticked int64 // the last tick's time
}

func newEntSuite(t *testing.T) *entSuite {
	s := newSuiteWith(t, testenv.TopicsOpts{EventsTimestamp: "CreateTime"})
	return &entSuite{suite: s, ent: oracle.Entitlements{Partitions: partitions}}
}

// entArgs are the aggregator's flags: entitlements on, no ticks of its
// own (the test's carry the stream's broker times).
var entArgs = []string{"--entitlements", "--entitlements-tick=-1ms"}

// write produces records to usage.entitlements at broker time at: a
// customer's to its partition, a reserved key's to every partition.
func (s *entSuite) write(at int64, key string, m schemas.Message) {
	s.t.Helper()
	var recs []*kgo.Record
	ps := []int32{schemas.Partition([]byte(key), partitions)}
	if key[0] == '!' {
		ps = []int32{0, 1, 2, 3}[:partitions]
	}
	var v []byte
	if m != nil {
		v = schemas.MustEncode(m)
	}
	for _, p := range ps {
		recs = append(recs, &kgo.Record{Topic: s.Names.EntitlementsTopic(), Partition: p, Key: []byte(key), Value: v,
			Timestamp: time.UnixMilli(at)})
		r := entref.Record{Key: key, Written: at}
		switch m := m.(type) {
		case *schemas.Entitlements:
			r.Ent = m
		case *schemas.RateCard:
			r.Card = m
		}
		if key[0] != '!' {
			c, _ := schemas.ParseCustomerKey([]byte(key))
			r.Key = c
		}
		s.ent.Records = append(s.ent.Records, oracle.EntRecord{Partition: p, Record: r})
	}
	s.produceSync(recs...)
}

// tick appends a tick at broker time at to every entitlements partition.
func (s *entSuite) tick(at int64) {
	s.t.Helper()
	if at <= s.ticked {
		return
	}
	s.ticked = at
	v := schemas.MustEncode(&schemas.Tick{InstanceID: "test"})
	var recs []*kgo.Record
	for p := int32(0); p < partitions; p++ {
		recs = append(recs, &kgo.Record{Topic: s.Names.EntitlementsTopic(), Partition: p, Key: []byte(schemas.TickKey),
			Value: v, Timestamp: time.UnixMilli(at)})
	}
	s.produceSync(recs...)
}

func (s *entSuite) produceSync(recs ...*kgo.Record) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		s.t.Fatal(err)
	}
}

// entChange is an entitlements record of the schedule, written at At.
type entChange struct {
	At  int64
	Key string
	Msg schemas.Message // nil: a tombstone
}

// entSchedule is the entitlements of the stream that genStream makes with
// seed (its broker times start at start): capped customers (a SUM and a
// COUNT cap, one raised mid-stream), customers on credits (grants of two
// priorities, one expiring mid-stream; overdraft denied, or allowed up to
// a limit), an unmetered one, a default plan for the rest, and a rate card
// whose rates change on the second day.
func entSchedule(start int64) []entChange {
	key := func(c string) string { return string(schemas.CustomerKey(c)) }
	deny := schemas.Overdraft{Policy: schemas.OverdraftDeny}
	capped := func(c string, s int64) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: c, Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
			Caps: []schemas.Cap{{Meter: "s", Limit: s, OnLimit: schemas.OnLimitReject}, {Meter: "c", Limit: 2, OnLimit: schemas.OnLimitReject}}}
	}
	credits := func(c string, od schemas.Overdraft) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: c, Plan: "prepaid", Overdraft: od, Grants: []schemas.Grant{
			{ID: "welcome", Amount: 1_000, Priority: 0, ExpiresAt: start + dayMs + 6*hourMs},
			{ID: "topup", Amount: 1_500, Priority: 1}}}
	}
	sched := append([]entChange{
		{start - hourMs, schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{
			{EffectiveFrom: 0, Rates: []schemas.Rate{{Meter: "s", MicroCredits: 10, PerUnits: 1}, {Meter: "c", MicroCredits: 150, PerUnits: 1}}},
			{EffectiveFrom: start + dayMs, Rates: []schemas.Rate{{Meter: "s", MicroCredits: 25, PerUnits: 2}, {Meter: "c", MicroCredits: 150, PerUnits: 1}}}}}},
		{start - hourMs, schemas.DefaultPlanKey, &schemas.Entitlements{Plan: "default", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
			Caps: []schemas.Cap{{Meter: "c", Limit: 2, OnLimit: schemas.OnLimitReject}, {Meter: "s", Limit: 100, OnLimit: schemas.OnLimitAllow}}}},
		{start - hourMs, key("cust-00"), capped("cust-00", 80)},
		{start - hourMs, key("cust-01"), capped("cust-01", 120)},
		{start - hourMs, key("cust-02"), credits("cust-02", deny)},
		{start - hourMs, key("cust-03"), credits("cust-03", schemas.Overdraft{Policy: schemas.OverdraftAllow, Limit: 500})},
		{start - hourMs, key("cust-04"), &schemas.Entitlements{CustomerID: "cust-04", Plan: "internal", Unmetered: true,
			Overdraft: deny, Caps: []schemas.Cap{{Meter: "s", Limit: 1, OnLimit: schemas.OnLimitReject}}}},
		// Mid-stream: cust-00's cap raised; cust-02 gets a top-up.
		{start + dayMs + 3*hourMs, key("cust-00"), capped("cust-00", 200)},
		{start + 2*dayMs, key("cust-02"), func() *schemas.Entitlements {
			e := credits("cust-02", deny)
			e.Grants = append(e.Grants, schemas.Grant{ID: "more", Amount: 2_000, Priority: 2, EffectiveFrom: start + dayMs})
			return e
		}()},
		// cust-05's record is deleted: the default plan applies again.
		{start - hourMs, key("cust-05"), capped("cust-05", 100)},
		{start + dayMs + 12*hourMs, key("cust-05"), nil},
	}, append(drip(start, dripCustomers[0]), drip(start, dripCustomers[1])...)...)
	// sendEnt writes them in this order.
	sort.SliceStable(sched, func(i, j int) bool { return sched[i].At < sched[j].At })
	return sched
}

// The dripCustomers' credits come 150 micro-credits at a time, a new
// grant every 6 hours of broker time, which never expire; overdraft is
// denied. Their events cost more than that on average, so from the first
// hours on they have events paid from their grants and events refused as
// no_credit all along the stream, on both sides of any crash point.
var dripCustomers = []string{"cust-06", "cust-07"}

func drip(start int64, c string) []entChange {
	var out []entChange
	e := &schemas.Entitlements{CustomerID: c, Plan: "drip", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
	for k := range 14 {
		g := *e
		g.Grants = append(append([]schemas.Grant(nil), e.Grants...), schemas.Grant{ID: fmt.Sprintf("drip-%02d", k), Amount: 150})
		e = &g
		out = append(out, entChange{start - hourMs + int64(k)*6*hourMs, string(schemas.CustomerKey(c)), e})
	}
	return out
}

// sendEnt sends a batch of steps with the schedule's records up to its
// last time first, and a tick just past that time after it (the gate
// lets through the records of times before the last tick read).
func (s *entSuite) sendEnt(steps []step, sched *[]entChange) {
	s.t.Helper()
	var last int64
	for _, st := range steps {
		if st.ev != nil {
			last = max(last, st.ev.Arrival)
		} else {
			last = max(last, st.wm.Watermark)
		}
	}
	for len(*sched) > 0 && (*sched)[0].At <= last {
		c := (*sched)[0]
		*sched = (*sched)[1:]
		s.write(max(c.At, s.ticked), c.Key, c.Msg)
	}
	s.send(steps)
	s.tick(last + 1)
}

// keepUp waits until a has committed every event sent (crash.CaughtUp)
// and has read usage.entitlements up to its end when keepUp was called
// (the test's last tick: what the gate lets through), or has exited.
func (s *entSuite) keepUp(a *testenv.Process) {
	s.t.Helper()
	ents := s.Names.EntitlementsTopic()
	ctx, cancel := context.WithTimeout(context.Background(), crash.CaughtUpTimeout)
	defer cancel()
	ends, err := kadm.NewClient(s.cl).ListEndOffsets(ctx, ents)
	if err != nil {
		s.t.Fatal(err)
	}
	read := func() bool {
		got, err := testenv.Committed(ctx, s.Brokers, s.group, ents)
		if err != nil {
			return false
		}
		ok := true
		ends.Each(func(o kadm.ListedOffset) { ok = ok && got[o.Partition] >= o.Offset })
		return ok
	}
	start := time.Now()
	for !a.Exited() {
		if ok, err := crash.CaughtUp(s.Brokers, s.group, s.Names.DedupedTopic()); err == nil && ok && read() {
			return
		}
		if time.Since(start) > crash.CaughtUpTimeout {
			s.t.Fatalf("%s not caught up on %s and %s after %s\n%s", a.Name(), s.Names.DedupedTopic(), ents, crash.CaughtUpTimeout,
				crash.LagReport(s.Brokers, s.group, s.Names.DedupedTopic()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *entSuite) checkEnt() oracle.EntReport {
	s.t.Helper()
	s.mu.Lock()
	events := append([]*oracle.Event(nil), s.events...)
	s.mu.Unlock()
	// The balances still pending when the input ends go out once the
	// broker time has moved a --balance-interval on: the test's ticks
	// move it.
	s.ent.Nudge = func() { s.tick(s.ticked + 2000) }
	return oracle.VerifyEntitlements(s.t, s.Brokers, s.Names, &oracle.Model{Meters: meters, Period: oracle.Day, Grace: graceMs}, &s.ent, events)
}

// TestEntitlementsCrashWindows is the test to steal from billing
// post-mortems (issue 14): `meterline aggregate --entitlements` is killed
// (SIGKILL, via METERLINE_FAULT) after an event's charge is decided and
// before its transaction commits, and in every other crash window
// (docs/design.md, Exactly-once, "Crash windows"), restarted, and then
// every cap counter and credit balance (the last balance of each customer)
// equals the reference's, which moved once per accepted event and never for
// a rejected one; every rejected event is in usage.rejected exactly once
// with its reason; and the bill of the accepted events is exact
// (oracle.VerifyEntitlements). On top of that, each window's run checks
// (entCrashRun):
//   - that it exercised what a crash can break, on both sides of the
//     kill: among the events decided and committed before it (by the
//     group's committed offsets at the kill) and among those the
//     restart decided, events paid from credits, over_limit and
//     no_credit rejections (it logs how many events sent before the kill
//     the restart read again from usage.deduped; those the gate held in
//     the committed state are decided from there, so that number can be
//     0 even after aggregate.charge-decided);
//   - per customer, exactly the reference's number of accepted, over_limit
//     and no_credit events, counted in the outputs (aggregates and
//     adjustments, usage.rejected);
//   - for the customers on dripped grants (dripCustomers, overdraft
//     denied), that what each grant paid is exactly the reference's, and
//     that the grants paid, in all, exactly the price of the events the
//     outputs accepted, priced by the rate card alone: each accepted
//     event was charged once, no rejected one was.
func TestEntitlementsCrashWindows(t *testing.T) {
	for _, c := range []struct {
		point string
		hit   int
		extra []string
	}{
		// The 100th decision of the armed run; the stream windows at its
		// 6th transaction: several batches after the armed run starts,
		// and well before the end of the stream.
		{fault.ChargeDecided, 100, nil},
		{fault.BeforeCommit, 6, nil},
		{fault.AfterCommit, 6, nil},
		{fault.DuringApply, 6, nil},
		{fault.AfterApply, 6, nil},
		{fault.FinalDecided, 2, nil},
		{fault.BetweenChunks, 3, []string{"--final-chunk", "2"}},
		{fault.DuringRestore, 1, nil},
		// --entitlements-order arrival (docs/entitlements.md, Decision
		// order) on the same streams: their events come in order of
		// arrival (genStream; ties in usage.deduped order, the hold's
		// last key), and each is decided while the partition watermark is
		// not past its arrival, as in input order, so the reference model
		// applies unchanged. The watermarks lag the events (genStream's
		// sources forward at most the time of the last event), so events
		// are held at the kill (entCrashRun checks it). Two windows only
		// (each run takes as long as one above): a kill among the
		// decisions of a release, in chunks of 2 (keyRelease pending
		// across commits), and one after a commit, whose restart
		// restores the held events from the changelog.
		{fault.ChargeDecided, 100, []string{arrivalOrder, "--final-chunk", "2"}},
		{fault.AfterCommit, 6, []string{arrivalOrder}},
	} {
		name := c.point
		if slices.Contains(c.extra, arrivalOrder) {
			name += "-arrival"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			entCrashRun(t, c.point, c.hit, c.extra)
		})
	}
}

// arrivalOrder is the flag of --entitlements-order arrival.
const arrivalOrder = "--entitlements-order=arrival"

func entCrashRun(t *testing.T, point string, hit int, more []string) {
	s := newEntSuite(t)
	seed := int64(len(point)) + 100
	st := genStream(seed, 3, 8, 12, partitions)
	start := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC).UnixMilli() + seed*hourMs // genStream's
	sched := entSchedule(start)
	extra := append(append([]string(nil), entArgs...), more...)
	stateDir := filepath.Join(s.Dir, "state")
	spec := point + "@" + strconv.Itoa(hit)
	a := s.startAgg("a", stateDir, aggOpts{extra: extra})
	next := 0
	for ; next < len(st.batches)/3; next++ {
		s.sendEnt(st.batches[next], &sched)
	}
	s.waitCaughtUp(a)
	a.Stop(t)
	// The input decided and committed before the kill: offsets below
	// the group's committed offsets at the kill (killed), by the clean
	// run and the armed run; the restart decides the rest, again those
	// the killed instance had read and not committed.
	var killed map[int32]int64
	sentAtKill := 0 // events sent when the kill was seen
	crashed := func() {
		a.ExpectFaultKill(t, point, 0)
		killed = s.committed()
		s.mu.Lock()
		sentAtKill = len(s.events)
		s.mu.Unlock()
		arrival := slices.Contains(extra, arrivalOrder)
		var ends map[int32]int64
		if arrival {
			ends = s.changelogEnds()
		}
		a = s.startAgg("a", stateDir, aggOpts{extra: extra})
		if arrival {
			// Read once the restart has ended the killed transaction.
			n := heldCommitted(t, s, ends)
			t.Logf("%d events held in the committed state at the kill", n)
			if n == 0 {
				t.Errorf("no event held in the committed state at the kill at %s: the run exercised no restart with held events", spec)
			}
		}
	}
	if point == fault.DuringRestore {
		stateDir = filepath.Join(s.Dir, "state-wiped")
		a = s.startAgg("a", stateDir, aggOpts{fault: spec, extra: extra})
		a.ExpectFaultKill(t, point, exitTimeout)
		a = s.startAgg("a", stateDir, aggOpts{extra: extra})
		// Killed restoring what the clean run decided, before the rest
		// of the stream.
		killed = s.committed()
		sentAtKill = len(s.events)
	} else {
		a = s.startAgg("a", stateDir, aggOpts{fault: spec, extra: extra})
	}
	for ; next < len(st.batches); next++ {
		s.sendEnt(st.batches[next], &sched)
		if killed == nil {
			// Until the kill the armed instance keeps up batch by batch,
			// so the hit falls at one place in the stream however busy
			// the machine is: an instance that lags reads many batches
			// per transaction, and the chunked work of a period (where
			// aggregate.between-chunks is hit) waits for them, so the
			// kill came with nearly the whole stream committed.
			s.keepUp(a)
		} else {
			time.Sleep(30 * time.Millisecond)
		}
		if killed == nil && a.Exited() {
			crashed()
		}
	}
	if killed == nil {
		if !a.Wait(30 * time.Second) {
			t.Fatalf("%s: %s not hit with the whole stream sent\n%s", a.Name(), spec, a.Tail(30))
		}
		crashed()
	}
	s.sendEnt(st.final, &sched)
	s.waitCaughtUp(a)
	if point == fault.AfterCommit || point == fault.DuringApply {
		if n, _ := a.Replayed(); n == 0 {
			t.Errorf("%s restored no changelog record after a crash at %s", a.Name(), point)
		}
	}
	// The checks of this test run once the reference's (checkEnt) has
	// waited for the outputs, and even when it failed.
	defer func() { checkEntExact(t, s, spec, start, sentAtKill, killed) }()
	rep := s.checkEnt()
	if rep.Finals == 0 {
		t.Errorf("the stream decided no FINAL; it must exercise FINAL")
	}

}

// heldCommitted counts the events held for the watermark
// (--entitlements-order arrival) in the committed changelog: the keys
// under the hold's prefix 'h' (aggregator/entorder.go) whose last record
// is not a tombstone.
func heldCommitted(t *testing.T, s *entSuite, ends map[int32]int64) int {
	live := map[string]bool{}
	for _, r := range testenv.ReadAll(t, s.Brokers, s.Names.AggregateChangelogTopic()) {
		if r.Offset < ends[r.Partition] && len(r.Key) > 0 && r.Key[0] == 'h' {
			live[string(r.Key)] = r.Value != nil
		}
	}
	n := 0
	for _, ok := range live {
		if ok {
			n++
		}
	}
	return n
}

// changelogEnds lists the end offsets of the aggregator's changelog.
func (s *entSuite) changelogEnds() map[int32]int64 {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ends, err := kadm.NewClient(s.cl).ListEndOffsets(ctx, s.Names.AggregateChangelogTopic())
	if err != nil {
		s.t.Fatal(err)
	}
	out := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

// checkEntExact is entCrashRun's checks against the reference after a
// kill at spec: killed are the group's committed offsets at the kill
// (nil: no kill to check around, only the exact counts), sentAtKill the
// number of events sent when the kill was seen.
func checkEntExact(t *testing.T, s *entSuite, spec string, start int64, sentAtKill int, killed map[int32]int64) {
	s.mu.Lock()
	events := append([]*oracle.Event(nil), s.events...)
	s.mu.Unlock()
	model := &oracle.Model{Meters: meters, Period: oracle.Day, Grace: graceMs}
	outcome, models := s.ent.Decide(model, events)
	card := sched0(start)
	if killed != nil {
		checkAroundKill(t, s, spec, events, outcome, card, start, sentAtKill, killed)
	}

	// Per customer: accepted, over_limit and no_credit, counted in the
	// outputs, against the reference.
	want, got := map[string]map[string]int{}, map[string]map[string]int{}
	add := func(m map[string]map[string]int, c, o string) {
		if m[c] == nil {
			m[c] = map[string]int{}
		}
		m[c][o]++
	}
	for _, e := range events {
		add(want, e.Customer, outcome[e.ID])
	}
	rejected := map[string]bool{}
	for _, r := range testenv.ReadAll(t, s.Brokers, s.Names.RejectedTopic()) {
		var rj schemas.Rejected
		if err := schemas.DecodeInto(r.Value, &rj); err != nil {
			t.Fatal(err)
		}
		add(got, rj.CustomerID, rj.Reason)
		rejected[rj.EventID] = true
	}
	latest := map[string]*schemas.Aggregate{}
	for _, r := range testenv.ReadAll(t, s.Brokers, s.Names.AggregatesTopic()) {
		var ag schemas.Aggregate
		if err := schemas.DecodeInto(r.Value, &ag); err != nil {
			t.Fatal(err)
		}
		k := fmt.Sprint(ag.CustomerID, ag.Meter, ag.Group, ag.PeriodStart)
		if cur := latest[k]; cur == nil || ag.Revision > cur.Revision {
			latest[k] = &ag
		}
	}
	for _, ag := range latest {
		for range ag.EventCount {
			add(got, ag.CustomerID, entref.Accepted)
		}
	}
	for _, r := range testenv.ReadAll(t, s.Brokers, s.Names.AdjustmentsTopic()) {
		var adj schemas.Adjustment
		if err := schemas.DecodeInto(r.Value, &adj); err != nil {
			t.Fatal(err)
		}
		add(got, adj.CustomerID, entref.Accepted)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("decisions per customer in the outputs:\n  got  %v\n  want %v", got, want)
	}

	// The dripped customers' grants: what each paid in the reference,
	// what the outputs' last balance says, and the price of the events
	// the outputs accepted.
	last := map[string]*schemas.Balance{}
	for _, r := range testenv.ReadAll(t, s.Brokers, s.Names.BalancesTopic()) {
		var b schemas.Balance
		if err := schemas.DecodeInto(r.Value, &b); err != nil {
			t.Fatal(err)
		}
		if cur := last[b.CustomerID]; cur == nil || b.Revision > cur.Revision {
			last[b.CustomerID] = &b
		}
	}
	for _, c := range dripCustomers {
		checkDrip(t, c, last[c], s.ent.Records, models, events, rejected, func(e *oracle.Event) int64 { return cost(card, start-hourMs, e) })
		t.Logf("%s: %d accepted, %d no_credit", c, want[c][entref.Accepted], want[c][schemas.ReasonNoCredit])
	}
}

// checkAroundKill checks that a run exercised, on each side of the kill
// (the input committed before it; the input the restart decided), events
// paid from credits, over_limit and no_credit rejections, by the
// reference's outcomes.
func checkAroundKill(t *testing.T, s *entSuite, spec string, events []*oracle.Event, outcome map[string]string, card *schemas.RateCard,
	start int64, sentAtKill int, killed map[int32]int64) {
	t.Helper()
	seen := map[string]map[string]int{"before": {}, "after": {}}
	again := 0 // sent before the kill was seen, decided after the restart
	s.mu.Lock()
	for i, e := range events {
		o := outcome[e.ID]
		if o == entref.Accepted && cost(card, start-hourMs, e) > 0 && isCreditCustomer(e.Customer) {
			o = "paid from credits"
		}
		p := schemas.Partition(schemas.CustomerKey(e.Customer), partitions)
		switch off := s.offsets[e.ID]; {
		case off >= killed[p]:
			seen["after"][o]++
			if i < sentAtKill {
				again++
			}
		default:
			seen["before"][o]++
		}
	}
	s.mu.Unlock()
	t.Logf("killed at %s: the input committed before the kill %v; decided after the restart %v, %d of them sent before the kill was seen",
		spec, seen["before"], seen["after"], again)
	for _, sd := range []string{"before", "after"} {
		for _, o := range []string{"paid from credits", schemas.ReasonOverLimit, schemas.ReasonNoCredit} {
			if seen[sd][o] == 0 {
				t.Errorf("no event %s the kill was %s: the run must exercise it on both sides of the kill", sd, o)
			}
		}
	}

}

// checkDrip checks a dripped customer's last balance: each grant paid
// exactly what the reference's paid (models: the reference of each
// partition after every event), and the grants paid, in all, exactly the
// price of the customer's events that the outputs did not reject.
func checkDrip(t *testing.T, c string, last *schemas.Balance, recs []oracle.EntRecord, models []*entref.Model, events []*oracle.Event,
	rejected map[string]bool, price func(*oracle.Event) int64) {
	t.Helper()
	if last == nil {
		t.Errorf("no balance of %s", c)
		return
	}
	dp := schemas.Partition(schemas.CustomerKey(c), partitions)
	ref := models[dp]
	nRecs, lastWritten := 0, int64(0)
	for _, r := range recs {
		if r.Partition == dp {
			nRecs++
			lastWritten = r.Written
		}
	}
	var want, paid int64
	for _, e := range events {
		if e.Customer == c && !rejected[e.ID] {
			want += price(e)
		}
	}
	var drawn []string
	for _, g := range last.Grants {
		// Its generation: the grant is offered by every record since its
		// first, so the one a record read after the last would continue.
		refPaid := ref.Paid(c, g.ID, ref.GenAfter(nRecs, c, g.ID, lastWritten))
		if g.Consumed != refPaid {
			t.Errorf("%s's grant %s paid %d micro-credits, the reference's %d", c, g.ID, g.Consumed, refPaid)
		}
		paid += g.Consumed
		drawn = append(drawn, fmt.Sprintf("%s:%d", g.ID, g.Consumed))
	}
	if paid != want || last.Overdrawn != 0 {
		t.Errorf("%s's grants paid %d micro-credits (%v), overdrawn %d; the events the outputs accepted cost %d",
			c, paid, drawn, last.Overdrawn, want)
	}
	t.Logf("%s's grants paid %v = %d micro-credits", c, drawn, paid)
}

// committed returns the aggregator group's committed offset of each
// usage.deduped partition (0 for none).
func (s *entSuite) committed() map[int32]int64 {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	offs, err := testenv.Admin(s.t, s.Brokers).FetchOffsets(ctx, s.group)
	if err != nil {
		s.t.Fatal(err)
	}
	out := map[int32]int64{}
	for p := int32(0); p < partitions; p++ {
		if o, ok := offs.Lookup(s.Names.DedupedTopic(), p); ok {
			out[p] = o.At
		}
	}
	return out
}

// sched0 is the rate card of entSchedule, written at start − 1h.
func sched0(start int64) *schemas.RateCard {
	for _, c := range entSchedule(start) {
		if c.Key == schemas.RateCardKey {
			return c.Msg.(*schemas.RateCard)
		}
	}
	return nil
}

// cost is the price of e by the rate card alone (written at cardWritten;
// an event with min(arrival, event_time) before it has no rate): the rate
// in effect at its event_time, quantity × rate, rounded half up; SUM and
// COUNT meters only.
func cost(card *schemas.RateCard, cardWritten int64, e *oracle.Event) int64 {
	m := (&oracle.Model{Meters: meters}).Meter(e.Meter)
	if !entitlements.Charged(m.Aggregation) {
		return 0
	}
	if min(e.Arrival, e.EventTime) < cardWritten {
		return 0 // no card yet
	}
	var rate *schemas.Rate
	for _, v := range card.Versions {
		if v.EffectiveFrom > e.EventTime {
			break
		}
		rate = nil
		for i := range v.Rates {
			if v.Rates[i].Meter == e.Meter {
				rate = &v.Rates[i]
			}
		}
	}
	if rate == nil {
		return 0
	}
	units := entitlements.Event{Meter: e.Meter, Aggregation: m.Aggregation, Quantity: e.Quantity}.Units()
	c, _ := entitlements.Cost(units, *rate)
	return c
}

func isCreditCustomer(c string) bool {
	return c == "cust-02" || c == "cust-03" || c == dripCustomers[0] || c == dripCustomers[1]
}

// TestEntitlementsCapBoundary: a free tier of 1,000 units a month, 1,200
// one-unit events of one customer and meter (over two groups) through the
// real `meterline dedup` and `meterline aggregate --entitlements`, with 5%
// duplicate copies interleaved and the aggregator killed (SIGKILL) at
// its 600th decision, before that decision's transaction commits: exactly
// the first 1,000 in usage.deduped's order are counted, the last 200 are rejected as over_limit once each, no copy is
// charged, and the customer's last balance says 1,000 of 1,000.
func TestEntitlementsCapBoundary(t *testing.T) {
	s := newSuite(t) // LogAppendTime: arrivals are the broker's clock
	// One month's cap: the events' times (up to n ms before they are
	// sent) and the whole run, whose last balance is of the month the
	// broker's clock reaches, stay in the month the test starts in.
	testenv.InOneMonth(t, 10*time.Minute, time.Minute)
	const cust, limit, n = "free-tier", 1000, 1200
	key := schemas.CustomerKey(cust)
	rec := &kgo.Record{Topic: s.Names.EntitlementsTopic(), Partition: schemas.Partition(key, partitions), Key: key,
		Value: schemas.MustEncode(&schemas.Entitlements{CustomerID: cust, Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
			Caps: []schemas.Cap{{Meter: "s", Limit: limit, OnLimit: schemas.OnLimitReject}}})}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	d := s.Stage("dedup", "d", filepath.Join(s.Dir, "dedup-state"), crash.StageOpts{})
	aggState := filepath.Join(s.Dir, "agg-state")
	// Killed (SIGKILL, via METERLINE_FAULT) at its n/2-th decision: after
	// decisions committed, with the one just decided in the open
	// transaction.
	spec := fault.ChargeDecided + "@" + strconv.Itoa(n/2)
	a := s.startAgg("a", aggState, aggOpts{period: "month", extra: []string{"--entitlements"}, fault: spec})
	crashed := false
	p, err := producer.New(producer.WithBrokers(s.Brokers...), producer.WithTopic(s.Names.EventsTopic()), producer.WithLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	now := time.Now().UTC()
	ev := func(i int) producer.Event {
		return producer.Event{EventID: fmt.Sprintf("cap-%04d", i), CustomerID: cust, Meter: "s", Quantity: 1,
			EventTime: now.Add(-time.Duration(i) * time.Millisecond), Properties: map[string]string{"region": []string{"eu", "us"}[i%2]}}
	}
	copies := 0
	for i := 0; i < n; i++ {
		if err := p.Send(ctx, ev(i)); err != nil {
			t.Fatal(err)
		}
		if i%20 == 19 { // 5%: a copy of an earlier event
			if err := p.Send(ctx, ev(i-7)); err != nil {
				t.Fatal(err)
			}
			copies++
		}
		if !crashed && a.Exited() {
			a.ExpectFaultKill(t, fault.ChargeDecided, 0)
			crashed = true
			a = s.startAgg("a", aggState, aggOpts{period: "month", extra: []string{"--entitlements"}})
		}
	}
	if !crashed {
		if !a.Wait(time.Minute) {
			t.Fatalf("%s: %s not hit with every event sent\n%s", a.Name(), spec, a.Tail(30))
		}
		a.ExpectFaultKill(t, fault.ChargeDecided, 0)
		a = s.startAgg("a", aggState, aggOpts{period: "month", extra: []string{"--entitlements"}})
	}
	s.WaitCaughtUp(s.Group("dedup"), s.Names.EventsTopic(), d)
	s.waitCaughtUp(a)
	// The order that decides: usage.deduped's.
	var order []string
	for _, r := range testenv.ReadAll(t, s.Brokers, s.Names.DedupedTopic()) {
		var e schemas.DedupedEvent
		if schemas.DecodeInto(r.Value, &e) == nil {
			order = append(order, e.EventID)
		}
	}
	if len(order) != n {
		t.Fatalf("usage.deduped holds %d events, want %d (dedup dropped %d copies)", len(order), n, copies)
	}
	wantRejected := map[string]bool{}
	for _, id := range order[limit:] {
		wantRejected[id] = true
	}
	deadline := time.Now().Add(time.Minute)
	var rejected []*schemas.Rejected
	var total int64
	for {
		rejected = rejected[:0]
		for _, r := range testenv.ReadAll(t, s.Brokers, s.Names.RejectedTopic()) {
			var rj schemas.Rejected
			if err := schemas.DecodeInto(r.Value, &rj); err != nil {
				t.Fatal(err)
			}
			rejected = append(rejected, &rj)
		}
		latest := map[string]*schemas.Aggregate{}
		for _, r := range testenv.ReadAll(t, s.Brokers, s.Names.AggregatesTopic()) {
			var ag schemas.Aggregate
			if err := schemas.DecodeInto(r.Value, &ag); err != nil {
				t.Fatal(err)
			}
			k := fmt.Sprint(ag.Group)
			if cur := latest[k]; cur == nil || ag.Revision > cur.Revision {
				latest[k] = &ag
			}
		}
		total = 0
		for _, ag := range latest {
			total += ag.Value
		}
		if len(rejected) >= n-limit && total >= limit || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if total != limit {
		t.Errorf("the customer's aggregates add up to %d, want %d", total, limit)
	}
	seen := map[string]int{}
	for _, rj := range rejected {
		seen[rj.EventID]++
		if rj.Reason != schemas.ReasonOverLimit || rj.Stage != "aggregator" || !wantRejected[rj.EventID] {
			t.Errorf("rejected %s as %s by %s; want over_limit by aggregator for the last %d events only", rj.EventID, rj.Reason, rj.Stage, n-limit)
		}
	}
	for id := range wantRejected {
		if seen[id] != 1 {
			t.Errorf("event %s rejected %d times, want once", id, seen[id])
		}
	}
	// The customer's last change goes out within a --balance-interval of
	// broker time, which the aggregator's ticks move.
	var last *schemas.Balance
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		last = nil
		for _, r := range testenv.ReadAll(t, s.Brokers, s.Names.BalancesTopic()) {
			var b schemas.Balance
			if err := schemas.DecodeInto(r.Value, &b); err != nil {
				t.Fatal(err)
			}
			if last == nil || b.Revision > last.Revision {
				last = &b
			}
		}
		if last != nil && len(last.Meters) == 1 && last.Meters[0].Usage == limit || time.Now().After(deadline) {
			break
		}
	}
	if last == nil || len(last.Meters) != 1 || last.Meters[0].Usage != limit || last.Meters[0].Limit != limit {
		t.Errorf("last balance %+v, want usage %d of %d", last, limit, limit)
	}
	// What support reads of it: `meterline entitlements balance`.
	var out, errOut bytes.Buffer
	code := cli.Main(ctx, []string{"entitlements", "balance", cust, "-o", "json", "--brokers", strings.Join(s.Brokers, ","),
		"--topic-prefix", s.Names.Prefix}, cli.IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut})
	var doc entitlements.BalanceDocument
	if err := json.Unmarshal(out.Bytes(), &doc); code != 0 || err != nil {
		t.Fatalf("meterline entitlements balance %s: exit %d (%v)\n%s%s", cust, code, err, out.String(), errOut.String())
	}
	if last != nil && (doc.Revision != last.Revision || len(doc.Meters) != 1 ||
		doc.Meters[0] != (entitlements.MeterBalanceDoc{Meter: "s", Usage: limit, Limit: limit, OnLimit: "reject", UsedPercent: 100})) {
		t.Errorf("meterline entitlements balance %s printed revision %d, meters %+v; want revision %d, 1000 of 1000 (100%%)", cust, doc.Revision, doc.Meters, last.Revision)
	}
	t.Logf("%d events and %d copies: %d counted, %d rejected over_limit, across a SIGKILL of the aggregator at %s", n, copies, total, len(rejected), spec)
}
