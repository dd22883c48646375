package aggregator

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/RaduBerinde/btreemap"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/schemas"
)

// Entitlements (docs/entitlements.md, The aggregator), when
// Config.Entitlements is on: the partition of usage.entitlements with the
// number of its usage.deduped partition is consumed in the same
// transactions (stream.Config.CopartitionedTopics); its records feed the
// entitlements Ledger, kept in this partition's state under pfxLedger;
// every event is decided by the Ledger before it is aggregated, and a
// rejected one (over_limit, no_credit) goes to usage.rejected and into no
// aggregate.
//
// The gate. An event is decided by the entitlements in effect at its
// arrival, so only once the entitlements partition has been read up to a
// broker time after that arrival (Ledger.ReadTo; strictly after, since a
// record written in the arrival's millisecond applies to the event and
// may follow one of that millisecond already read): until then a
// record of usage.deduped waits in the gate, a queue in the state ('q'
// keys, in input order; the records that enter it in the open
// transaction are held in memory and written at its end if still there,
// flushGate). Records leave the gate in input order only: a
// record behind one that waits waits too, whatever its own time, so that
// events are decided, and watermarks move, in the same order whether the
// stage is caught up or hours behind. A watermark record waits for its
// watermark, an event for its ingest_time; a record that decodes as
// neither waits for nothing (but keeps its place). The stage appends a
// tick to each entitlements partition it owns every EntitlementsTick while
// it needs the partition's read time to move (needsTick), so that it
// keeps up with arrivals.
//
// Balances (docs/entitlements.md, The aggregator, 4: at most once per
// transaction that changed the customer). A customer whose balance a
// transaction changed is pending: its 'b' key is written in that
// transaction (once while it stays pending), and the pending customers go
// out together once the partition's broker time (brokerNow) is
// Config.BalanceInterval past the start of the last emission: in key order,
// at most Config.FinalChunk a transaction, each pending key deleted in the
// transaction that emits its customer's balance. A crash therefore neither
// loses a pending customer (its key is committed with the change) nor emits
// one twice (the key goes with the emission). Only transactions that
// consume the partition's input or carry its Work emit (fenced: a zombie's
// are fenced by the group generation), and the ticks go on while a customer
// is pending. While a period start's balances go out (rollState), the
// emission of the pending customers waits: those chunks reach the pending
// customers with usage in the periods that ended, and the rest go out after
// them.
//
// The code: the gate is in entgate.go, the Ledger's store and its caches
// in entstore.go, the records of usage.entitlements (re-routing, origins,
// restating) in entrecords.go, an event's decision in entdecide.go, and
// balances, the period roll, pruning and ticks in entbalances.go.
//
// State keys, besides the aggregator's (state.go):
//
//	'e' …        the Ledger's keys (entitlements.Ledger, prefix "e")
//	'q' seq      a record of usage.deduped waiting in the gate (gateRecord)
//	'Q'          the seq of the next record to enter the gate
//	'B'          the emission of balances (balanceState): the revision of
//	             the last balance emitted by the partition, and the
//	             emission of the pending customers (its start, cursor)
//	'b' customer a customer whose balance is pending: the broker time of
//	             the change that made it pending (varint)
//	'L'          the topics whose records had LogAppendTime timestamps
//	             (arrival.go keyLogAppend)
//	'R'          the period roll (rollState): the current period of the
//	             watermark, and the chunked work of the last period start
//	'D'          a default-plan record's balances sweep (sweepState):
//	             its read time, period and cursor; none when idle
//	'o' customer the origin and value of the last record of the
//	             customer's key applied (RecordOrigin.encodeWith,
//	             staleCopy)
//	'O' key      the same of a shared key (schemas.DefaultPlanKey,
//	             schemas.RateCardKey)
const (
	pfxGate           = 'q'
	pfxLedger         = 'e'
	pfxBalancePending = 'b'
	pfxOrigin         = 'o'
	pfxSharedOrigin   = 'O'
)

var (
	keyGateNext = []byte("Q")
	keyBalances = []byte("B")
	keyRoll     = []byte("R")
)

// entPart is a partition's in-memory view of its entitlements state, as
// the committed state and the open transaction have it (reloaded by load
// after an abort).
type entPart struct {
	readTo   int64  // Ledger.ReadTo
	gateN    int    // records in the gate
	gateNext uint64 // seq of the next record to enter it
	// logAppend: the topics that gave a LogAppendTime record
	// (keyLogAppend, arrival.go), as the state and the open transaction
	// have them.
	logAppend byte
	// txFirst is gateNext as the committed state has it (set at load and
	// by Flush): a record with a seq ≥ txFirst entered the gate in the
	// open transaction. Such records are held in fresh, in order from
	// seq freshFirst, not in the state; freshHead of them have left the
	// gate. Flush writes the others to the state (flushGate): a record
	// gated and let through in one transaction never reaches it, and
	// costs no changelog record at all. An aborted transaction drops
	// them with the partition's view (load).
	txFirst    uint64
	fresh      []kgo.Record
	freshFirst uint64
	// drainedBytes sums the keys and values of the gate's records of the
	// state that the open transaction let through (drainN): about
	// Config.FinalChunkBytes at most.
	drainedBytes int
	freshHead    int
	gateKeyBuf   []byte
	// arrHold is the events waiting for the watermark (entorder.go).
	arrHold arrivalHold
	// warned holds the meters a misconfigured cap or rate was logged
	// for.
	warned map[string]bool
	// more: the last drain stopped at its chunk with ready records left;
	// Work drains on.
	more bool
	roll rollState
	// sweep is a default-plan record's balances going out (entsweep.go).
	sweep sweepState
	// restates holds the restated records of the records being handled
	// (entRecords), one per key.
	restates restateQueue
	// changed holds the customers the open transaction decided an event
	// of, or applied a record of, each with the index in changedAt of the
	// latest arrival (or broker time) involved: Flush makes each one
	// pending (or, with BalanceEveryTransaction, emits its balance).
	// Written through change, cleared by clearChanged.
	changed   map[string]int
	changedAt []int64
	// changedGen changes whenever changed is cleared: a customer's entry
	// of accounts with chGen changedGen (never 0) knows that changed
	// holds it with its time at changedAt[chIdx] (charge.commit), so that
	// an accepted event's later arrival is noted with no map lookup.
	changedGen uint64
	// emitNow holds the customers whose balance the open transaction
	// emits whatever the interval (a period start's), with the time it is
	// as of.
	emitNow map[string]int64
	// bal is the emission of balances, as the committed state and the
	// open transaction have it.
	bal balanceState
	// lastRead is the broker time of the latest record read from the
	// entitlements partition, as stamped (a broker clock that stepped
	// back puts it behind readTo); roundRead is lastRead when the last
	// emission of the pending customers started, lowered to any earlier
	// one read since (roundChunk). Both only decide when an emission
	// starts; at load they are readTo and bal.roundAt.
	lastRead, roundRead int64
	// pendingAt holds the pending customers, as the committed state and
	// the open transaction have them (read at load: a scan of the pending
	// keys only), with the latest broker time of their changes (the state
	// keeps the first).
	pendingAt map[string]int64
	// pendingOrder holds the customers of pendingAt in key order
	// (setPending, dropPending), so that a chunk of an emission finds the
	// next ones after its cursor in O(log pending + chunk), never by
	// sorting every pending customer.
	pendingOrder *btreemap.BTreeMap[string, struct{}]
	// madePending holds the customers that makePending made pending in
	// the open transaction's flushBalances, whose pending key the
	// committed state does not hold: one whose balance goes out in the
	// same flushBalances leaves no trace of the key (unpend).
	madePending map[string]struct{}
	// visited counts the pending customers roundChunk looked at, in
	// all: a transaction's share is bounded by its chunk, whatever the
	// number pending (TestPendingEmissionBoundedByChunk).
	visited int
	// fenced: the open transaction consumes the partition's input or
	// carries its Work, and so is fenced by the group generation: it may
	// emit pending balances (Flush).
	fenced bool
	// cache holds the Ledger's state values as the open transaction sees
	// them (ledgerStore): read from the state once, then kept, written
	// through. It is dropped with an aborted transaction (Abort) and at
	// every load, so it never holds what the committed state and the open
	// transaction do not.
	cache map[string]cachedValue
	// decoded keeps the Ledger's decoded plans and rate cards by their
	// bytes (entitlements.DecodeCache): right whatever the state holds.
	decoded map[string]any
	// cacheBytes and decodedBytes are what cache and decoded hold
	// (ledgerStore.keep, KeepDecoded): bounded, as the values are a
	// producer's records (up to 768 KiB each).
	cacheBytes, decodedBytes int
	// accounts keeps, per customer, its Account decoded
	// (entitlements.AccountCache) and what the Ledger resolves for its
	// decisions (entitlements.ResolveCache), in one entry, so that a
	// decision looks its customer up once (held). The Accounts are as the
	// committed state and the open transaction have them: the Ledger
	// changes them in place, so a decision costs no state write and no
	// encoding. dirtyAccounts lists the customers whose account the open
	// transaction changed, with their entries (which stay in accounts
	// while changed), in the order of its first change: Flush writes
	// each once (flushAccounts), one changelog record per changed
	// customer. Both are dropped with an aborted transaction (Abort) and
	// at every load, so an aborted decision never survives in memory.
	// A Resolved is kept only while resolvedGen is the entry's: it is
	// dropped, for every customer at once (dropResolved), whenever a key
	// it comes from is written (ledgerStore), with the cache.
	accounts      map[string]*heldAccount
	dirtyAccounts []dirtyAccount
	// timelines keeps the customers' and the default plan's versions
	// decoded by their state key (entitlements.TimelineCache), as the
	// committed state and the open transaction have them: the Ledger
	// changes them in place, so a record of a key costs neither the
	// decoding nor the encoding of its versions (up to 768 KiB). Those
	// the open transaction changed are listed in dirtyTimelines, in the
	// order of their first change, and written once by Flush
	// (flushTimelines). timelineBytes is what they take (timelineSize),
	// bounded by maxTimelineBytes. Dropped with an aborted transaction
	// (Abort) and at every load, as accounts.
	timelines      map[string]*heldTimeline
	dirtyTimelines []string
	timelineBytes  int
	resolvedGen    uint64
	// lastHeld is accounts' entry of customer lastCustomer, the last one
	// looked up (held), or nil.
	lastCustomer string
	lastHeld     *heldAccount
	// heldGen is the generation of accounts' entries (newHeldGen): an
	// OPEN aggregate's link to its customer's entry (openAgg.held) holds
	// while its heldGen is this one.
	heldGen uint64
	// accountSweeps counts KeepAccount's sweeps of the unchanged accounts.
	accountSweeps int
	accountBuf    []byte // flushAccounts' encoding, reused
	pendingBuf    []byte // makePending's key and value, reused
	// store is the Ledger's store of the partition (ledger).
	store ledgerStore
	// labelPlan and label: the plan label (planLabels) of the last plan
	// a decision named, which never changes for a plan.
	labelPlan *entitlements.Plan
	label     string
	// The metrics of the open transaction's decisions and entitlements
	// records (pending), and of the transaction that flushed last
	// (flushed): counted once the next transaction begins without an
	// Abort, so that a re-decided event or a re-read record is counted
	// once.
	pending, flushed entMetrics
}

type entMetrics struct {
	decisions map[[2]string]float64 // outcome, plan
	credits   map[string]float64    // plan
	records   map[string]float64    // result of an entitlements record
	// refunds and refunded: the charges of queued events taken back when
	// their booking refused them, and their micro-credits, by plan.
	refunds, refunded map[string]float64
	// Runs of decisions of one outcome and plan, counted here and folded
	// into decisions and credits when a run of another outcome and plan
	// needs the slot or before they are read (fold): no map update per
	// event, also when rejections come between accepted events.
	runs [maxEntRuns]entRun
}

// maxEntRuns is how many runs entMetrics counts at once: enough for every
// outcome of one plan.
const maxEntRuns = 4

// entRun is a run of decisions of one outcome and plan (n > 0: in use).
type entRun struct {
	outcome, plan string
	n, cost       float64
}

// record counts a record of usage.entitlements by its result.
func (m *entMetrics) record(result string) {
	if m.records == nil {
		m.records = map[string]float64{}
	}
	m.records[result]++
}

func (m *entMetrics) add(outcome, plan string, cost int64) {
	if m.decisions == nil {
		m.decisions, m.credits = map[[2]string]float64{}, map[string]float64{}
	}
	free := -1
	for i := range m.runs {
		r := &m.runs[i]
		switch {
		case r.n > 0 && r.outcome == outcome && r.plan == plan:
			r.n++
			r.cost += float64(cost)
			return
		case r.n == 0 && free < 0:
			free = i
		}
	}
	if free < 0 {
		m.fold()
		free = 0
	}
	m.runs[free] = entRun{outcome: outcome, plan: plan, n: 1, cost: float64(cost)}
}

// refund counts the refund of an accepted event's charge of cost
// micro-credits under plan.
func (m *entMetrics) refund(plan string, cost int64) {
	if m.refunds == nil {
		m.refunds, m.refunded = map[string]float64{}, map[string]float64{}
	}
	m.refunds[plan]++
	m.refunded[plan] += float64(cost)
}

// fold adds the runs to decisions and credits.
func (m *entMetrics) fold() {
	for i := range m.runs {
		r := &m.runs[i]
		if r.n == 0 {
			continue
		}
		m.decisions[[2]string{r.outcome, r.plan}] += r.n
		if r.cost > 0 {
			m.credits[r.plan] += r.cost
		}
		*r = entRun{}
	}
}

func (m *entMetrics) clear() { *m = entMetrics{} }

// publishEnt counts the decisions of the last flushed transaction, which
// committed: no Abort came since.
func (pt *partition) publishEnt() {
	e := pt.ent
	if e == nil || e.flushed.decisions == nil && e.flushed.records == nil && e.flushed.refunds == nil {
		return
	}
	e.flushed.fold()
	m := pt.pr.m
	for k, v := range e.flushed.records {
		m.entRecords.WithLabelValues(k).Add(v)
	}
	for k, v := range e.flushed.decisions {
		m.decisions.WithLabelValues(k[0], k[1]).Add(v)
	}
	for k, v := range e.flushed.credits {
		m.credits.WithLabelValues(k).Add(v)
		// The plan's refund series from its first credits, at 0, so
		// that consumed less refunded is defined (the dashboard's).
		m.refunds.WithLabelValues(k)
		m.refunded.WithLabelValues(k)
	}
	for k, v := range e.flushed.refunds {
		m.refunds.WithLabelValues(k).Add(v)
		m.refunded.WithLabelValues(k).Add(e.flushed.refunded[k])
	}
	pt.pr.tally.add(&e.flushed)
	e.flushed.clear()
}

// entTally sums the committed decisions of every partition by plan label,
// as the metrics count them, for the status page.
type entTally struct {
	mu                sync.Mutex
	decisions         map[[2]string]float64 // outcome, plan
	credits           map[string]float64    // plan
	refunds, refunded map[string]float64    // plan
}

func (t *entTally) add(m *entMetrics) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.decisions == nil {
		t.decisions, t.credits = map[[2]string]float64{}, map[string]float64{}
		t.refunds, t.refunded = map[string]float64{}, map[string]float64{}
	}
	for k, v := range m.decisions {
		t.decisions[k] += v
	}
	for k, v := range m.credits {
		t.credits[k] += v
	}
	for k, v := range m.refunds {
		t.refunds[k] += v
		t.refunded[k] += m.refunded[k]
	}
}

// EntitlementsTable is the status page's table of the entitlements
// decisions this instance committed since it started, by plan (never by
// customer): events accepted and refused by reason, accepted events
// refunded when their booking refused them, and credits consumed net of
// the refunds.
func (s *Stage) EntitlementsTable() service.Table {
	t := service.Table{ID: "entitlements", Title: "Entitlements decided by this instance, by plan",
		Columns: []string{"plan", "accepted", schemas.ReasonOverLimit, schemas.ReasonNoCredit, schemas.ReasonInvalid, "refunded", "credits consumed"}}
	if s.pr.ledger == nil {
		t.Note = "off: this aggregator runs without --entitlements; no event is capped or charged"
		return t
	}
	t.Note = "since the instance started, committed transactions only; refunded: accepted, then refused when booked behind their period's FINAL revisions; credits in micro-credits (drawn from grants or overdrawn), less those refunded"
	tl := &s.pr.tally
	tl.mu.Lock()
	defer tl.mu.Unlock()
	plans := map[string]bool{}
	for k := range tl.decisions {
		plans[k[1]] = true
	}
	for _, plan := range slices.Sorted(maps.Keys(plans)) {
		row := []string{plan}
		for _, o := range []string{entitlements.Accepted.String(), schemas.ReasonOverLimit, schemas.ReasonNoCredit, schemas.ReasonInvalid} {
			row = append(row, strconv.FormatFloat(tl.decisions[[2]string{o, plan}], 'f', 0, 64))
		}
		t.Rows = append(t.Rows, append(row, strconv.FormatFloat(tl.refunds[plan], 'f', 0, 64),
			strconv.FormatFloat(tl.credits[plan]-tl.refunded[plan], 'f', 0, 64)))
	}
	return t
}

// maxPlanLabels bounds the plan label of the entitlements metrics: plans
// come from the billing system, not from producers, but a runaway script
// must not make the metrics unbounded.
const maxPlanLabels = 64

// planLabels hands out the plan label of the metrics: the plan's name for
// the first maxPlanLabels names seen, "other" after; "none" for no plan
// and "unnamed" for a plan without a name. A name's label never changes.
type planLabels struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (p *planLabels) label(plan *entitlements.Plan) string {
	switch {
	case plan == nil:
		return "none"
	case plan.Name == "":
		return "unnamed"
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seen == nil {
		p.seen = map[string]bool{}
	}
	if p.seen[plan.Name] {
		return plan.Name
	}
	if len(p.seen) >= maxPlanLabels {
		return "other"
	}
	p.seen[plan.Name] = true
	return plan.Name
}

// loadEnt reads the entitlements view from the state.
func (pt *partition) loadEnt(st stateReader) error {
	e := &entPart{changed: map[string]int{}, changedGen: 1, emitNow: map[string]int64{}, pendingAt: map[string]int64{},
		cache: map[string]cachedValue{}, decoded: map[string]any{}, timelines: map[string]*heldTimeline{},
		accounts: map[string]*heldAccount{}, madePending: map[string]struct{}{}, pendingOrder: btreemap.New[string, struct{}](pendingDegree, strings.Compare)}
	e.newHeldGen()
	pt.ent = e
	v, ok, err := st.Get(keyGateNext)
	if err != nil {
		return err
	}
	if ok && len(v) == 8 {
		e.gateNext = binary.BigEndian.Uint64(v)
	}
	e.txFirst = e.gateNext
	if err := e.loadLogAppend(st); err != nil {
		return err
	}
	if err := st.Scan([]byte{pfxGate}, []byte{pfxGate + 1}, func(_, _ []byte) error { e.gateN++; return nil }); err != nil {
		return err
	}
	if e.readTo, err = pt.pr.ledger.ReadTo(ledgerReader{st}); err != nil {
		return err
	}
	if v, ok, err = st.Get(keyRoll); err != nil {
		return err
	} else if ok {
		if e.roll, err = decodeRoll(v); err != nil {
			return fmt.Errorf("%w (partition %d)", err, pt.p)
		}
	}
	if v, ok, err = st.Get(keyDefSweep); err != nil {
		return err
	} else if ok {
		if e.sweep, err = decodeSweep(v); err != nil {
			return fmt.Errorf("%w (partition %d)", err, pt.p)
		}
	}
	if v, ok, err = st.Get(keyBalances); err != nil {
		return err
	} else if ok {
		if e.bal, err = decodeBalanceState(v); err != nil {
			return fmt.Errorf("%w (partition %d)", err, pt.p)
		}
	}
	e.lastRead, e.roundRead = e.readTo, e.bal.roundAt
	// The pending customers: at most those changed in the last
	// BalanceInterval, and those an emission in chunks has not reached.
	if err := st.Scan([]byte{pfxBalancePending}, []byte{pfxBalancePending + 1}, func(k, v []byte) error {
		t, n := binary.Varint(v)
		if n <= 0 {
			return fmt.Errorf("aggregator: partition %d: corrupt pending balance %q", pt.p, k)
		}
		e.setPending(string(k[1:]), t)
		return nil
	}); err != nil {
		return err
	}
	pt.pr.m.pendingBalances.WithLabelValues(pt.pl).Set(float64(len(e.pendingAt)))
	if err := pt.loadHold(st); err != nil {
		return err
	}
	if e.more, err = pt.gateHeadPasses(st); err != nil {
		return err
	}
	pt.pr.m.gated.WithLabelValues(pt.pl).Set(float64(e.gateN))
	pt.publishHold() // as committed: a restore, or the reload after an abort
	pt.pr.m.readTo.WithLabelValues(pt.pl).Set(float64(e.readTo) / 1000)
	return nil
}
