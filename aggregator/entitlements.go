package aggregator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/RaduBerinde/btreemap"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/stream"
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
//	'R'          the period roll (rollState): the current period of the
//	             watermark, and the chunked work of the last period start
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

// Headers of a record of usage.entitlements that the aggregator re-produced
// to its canonical partition (docs/entitlements.md, The aggregator, 1, as
// dedup's: docs/design.md, Event identity and keys).
const (
	// HeaderRerouted marks a re-produced record. Value:
	// "<partition>/<offset>" of the misrouted original.
	HeaderRerouted = "meterline-rerouted"
	// HeaderArrival carries the misrouted original's broker time (epoch
	// ms).
	HeaderArrival = "meterline-arrival"
	// HeaderMoved marks the delete (null value) the aggregator writes
	// after a misrouted customer's record, on the partition where it was
	// found, in the transaction that re-produces it: compaction then
	// removes the original there, and a delete of the customer on its
	// own partition is not undone, once compaction has removed that
	// delete too, by the original read again from the start. Value: the
	// original's offset. Found with a null value on another partition
	// than its customer's, it is skipped.
	HeaderMoved = "meterline-moved"
)

// pendingKey is the state key of a pending customer.
func pendingKey(customer string) []byte {
	return append([]byte{pfxBalancePending}, customer...)
}

// balanceState is the emission of balances of a partition (keyBalances).
type balanceState struct {
	rev     int64  // the revision of the last balance emitted
	roundAt int64  // broker time at which the last emission of the pending customers started; 0: none
	active  bool   // that emission is going out in chunks
	cursor  string // the last customer it emitted
}

func (b *balanceState) encode() []byte {
	v := binary.BigEndian.AppendUint64(nil, uint64(b.rev))
	v = binary.BigEndian.AppendUint64(v, uint64(b.roundAt))
	if b.active {
		v = append(v, 1)
	} else {
		v = append(v, 0)
	}
	return append(v, b.cursor...)
}

// decodeBalanceState reads keyBalances: 8 bytes (the revision alone, as
// versions before pending customers wrote it), or the whole state.
func decodeBalanceState(v []byte) (balanceState, error) {
	switch {
	case len(v) == 8:
		return balanceState{rev: int64(binary.BigEndian.Uint64(v))}, nil
	case len(v) < 17 || v[16] > 1:
		return balanceState{}, errors.New("aggregator: corrupt balances state")
	}
	return balanceState{rev: int64(binary.BigEndian.Uint64(v)), roundAt: int64(binary.BigEndian.Uint64(v[8:])), active: v[16] == 1,
		cursor: string(v[17:])}, nil
}

// gateTime returns the broker time a record of usage.deduped waits for
// in the gate: an event's ingest_time, a watermark's watermark; 0 for
// anything else (it is rejected or ignored when it leaves the gate), and
// for a time too far ahead of the record's own (tooFarAhead: rejected).
//
// decoded reports that r decoded as a DedupedEvent, now in pt.ev as
// handle would decode it (handleDecoded goes on from there).
func (pt *partition) gateTime(r *kgo.Record) (t int64, decoded bool) {
	t, decoded = gateTimeOf(r.Value, &pt.ev)
	if pt.tooFarAhead(r, t) {
		return 0, decoded
	}
	return t, decoded
}

// tooFarAhead reports whether t, a record's ingest_time or watermark, is
// more than Config.EntitlementsMaxAhead after the record's broker time:
// no entitlements record may ever be read that far, and it would hold the
// gate. Replay-stable: both times are the record's.
func (pt *partition) tooFarAhead(r *kgo.Record, t int64) bool {
	return pt.ent != nil && t > r.Timestamp.UnixMilli()+pt.pr.cfg.EntitlementsMaxAhead.Milliseconds()
}

// rejectTooFarAhead rejects a record tooFarAhead (invalid).
func (pt *partition) rejectTooFarAhead(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, what string, t int64) error {
	return pt.reject(tx, r, e, schemas.ReasonInvalid, fmt.Sprintf("%s %s is more than %s after the record's broker time %s in %s",
		what, msTime(t), pt.pr.cfg.EntitlementsMaxAhead, msTime(r.Timestamp.UnixMilli()), r.Topic))
}

// gateTimeOf returns an event's ingest_time, a watermark's watermark, 0
// for anything else; decoded reports that v decoded into scratch.
func gateTimeOf(v []byte, scratch *schemas.DedupedEvent) (t int64, decoded bool) {
	*scratch = schemas.DedupedEvent{}
	if schemas.DecodeInto(v, scratch) == nil {
		return scratch.IngestTime, true
	}
	if m, err := schemas.Decode(v); err == nil {
		switch m := m.(type) {
		case *schemas.Watermark:
			return m.Watermark, false
		case *schemas.DedupedEvent:
			return m.IngestTime, false
		}
	}
	return 0, false
}

// encodeGateRecord keeps what the aggregator reads of a record: its
// offset and timestamp (for usage.rejected), key and value.
func encodeGateRecord(r *kgo.Record) []byte {
	b := make([]byte, 0, 24+len(r.Key)+len(r.Value))
	b = binary.AppendUvarint(b, uint64(r.Offset))
	b = binary.AppendVarint(b, r.Timestamp.UnixMilli())
	b = binary.AppendUvarint(b, uint64(len(r.Key)))
	b = append(b, r.Key...)
	if r.Value == nil {
		return append(b, 0)
	}
	return append(append(b, 1), r.Value...)
}

func decodeGateRecord(b []byte, topic string, p int32) (*kgo.Record, error) {
	bad := fmt.Errorf("aggregator: partition %d: corrupt gate record", p)
	off, n := binary.Uvarint(b)
	if n <= 0 {
		return nil, bad
	}
	b = b[n:]
	ts, n := binary.Varint(b)
	if n <= 0 {
		return nil, bad
	}
	b = b[n:]
	kl, n := binary.Uvarint(b)
	if n <= 0 || uint64(len(b)-n) < kl+1 {
		return nil, bad
	}
	b = b[n:]
	r := &kgo.Record{Topic: topic, Partition: p, Offset: int64(off), Timestamp: time.UnixMilli(ts)}
	if kl > 0 {
		r.Key = bytes.Clone(b[:kl])
	}
	b = b[kl:]
	if b[0] == 1 {
		r.Value = bytes.Clone(b[1:])
	}
	return r, nil
}

// entPart is a partition's in-memory view of its entitlements state, as
// the committed state and the open transaction have it (reloaded by load
// after an abort).
type entPart struct {
	readTo   int64  // Ledger.ReadTo
	gateN    int    // records in the gate
	gateNext uint64 // seq of the next record to enter it
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
	freshHead  int
	gateKeyBuf []byte
	// warned holds the meters a misconfigured cap or rate was logged
	// for.
	warned map[string]bool
	// more: the last drain stopped at its chunk with ready records left;
	// Work drains on.
	more bool
	roll rollState
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
	// sawInput: records of usage.deduped were handled since the last
	// tick (needsTick).
	sawInput bool
	// cache holds the Ledger's state values as the open transaction sees
	// them (ledgerStore): read from the state once, then kept, written
	// through. It is dropped with an aborted transaction (Abort) and at
	// every load, so it never holds what the committed state and the open
	// transaction do not.
	cache map[string]cachedValue
	// decoded keeps the Ledger's decoded plans and rate cards by their
	// bytes (entitlements.DecodeCache): right whatever the state holds.
	decoded map[string]any
	// accounts keeps, per customer, its Account decoded
	// (entitlements.AccountCache) and what the Ledger resolves for its
	// decisions (entitlements.ResolveCache), in one entry, so that a
	// decision looks its customer up once (held). The Accounts are as the
	// committed state and the open transaction have them: the Ledger
	// changes them in place, so a decision costs no state write and no
	// encoding. dirtyAccounts lists the customers whose account the open
	// transaction changed, in the order of its first change: Flush writes
	// each once (flushAccounts), one changelog record per changed
	// customer. Both are dropped with an aborted transaction (Abort) and
	// at every load, so an aborted decision never survives in memory.
	// A Resolved is kept only while resolvedGen is the entry's: it is
	// dropped, for every customer at once (dropResolved), whenever a key
	// it comes from is written (ledgerStore), with the cache.
	accounts      map[string]*heldAccount
	dirtyAccounts []string
	resolvedGen   uint64
	// lastHeld is accounts' entry of customer lastCustomer, the last one
	// looked up (held), or nil.
	lastCustomer string
	lastHeld     *heldAccount
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
	if e == nil || e.flushed.decisions == nil && e.flushed.records == nil {
		return
	}
	e.flushed.fold()
	for k, v := range e.flushed.records {
		pt.pr.m.entRecords.WithLabelValues(k).Add(v)
	}
	for k, v := range e.flushed.decisions {
		pt.pr.m.decisions.WithLabelValues(k[0], k[1]).Add(v)
	}
	for k, v := range e.flushed.credits {
		pt.pr.m.credits.WithLabelValues(k).Add(v)
	}
	pt.pr.tally.add(&e.flushed)
	e.flushed.clear()
}

// entTally sums the committed decisions of every partition by plan label,
// as the metrics count them, for the status page.
type entTally struct {
	mu        sync.Mutex
	decisions map[[2]string]float64 // outcome, plan
	credits   map[string]float64    // plan
}

func (t *entTally) add(m *entMetrics) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.decisions == nil {
		t.decisions, t.credits = map[[2]string]float64{}, map[string]float64{}
	}
	for k, v := range m.decisions {
		t.decisions[k] += v
	}
	for k, v := range m.credits {
		t.credits[k] += v
	}
}

// EntitlementsTable is the status page's table of the entitlements
// decisions this instance committed since it started, by plan (never by
// customer): events accepted and refused by reason, and credits consumed.
func (s *Stage) EntitlementsTable() service.Table {
	t := service.Table{ID: "entitlements", Title: "Entitlements decided by this instance, by plan",
		Columns: []string{"plan", "accepted", schemas.ReasonOverLimit, schemas.ReasonNoCredit, schemas.ReasonInvalid, "credits consumed"}}
	if s.pr.ledger == nil {
		t.Note = "off: this aggregator runs without --entitlements; no event is capped or charged"
		return t
	}
	t.Note = "since the instance started, committed transactions only; credits in micro-credits (drawn from grants or overdrawn)"
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
		t.Rows = append(t.Rows, append(row, strconv.FormatFloat(tl.credits[plan], 'f', 0, 64)))
	}
	return t
}

// rollState is the work of a period start: the balance of every customer
// with usage in the periods that ended since the last roll goes out (its
// usage in the new one is 0), then the usage of periods no event can reach
// any more is deleted, each in chunks of Config.FinalChunk (docs/design.md,
// Exactly-once, 7).
type rollState struct {
	cur int64 // start of the watermark's period; 0: no watermark yet
	// prev: rollBalances: the start of the period whose customers' balances
	// go out now; those of every period before it are out, those of the
	// periods after it, up to cur, go out next.
	prev   int64
	phase  byte   // rollIdle, rollBalances, rollPrune
	cursor string // balances: the last customer of prev emitted
}

const (
	rollIdle byte = iota
	rollBalances
	rollPrune
)

func (r *rollState) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(r.cur))
	b = binary.BigEndian.AppendUint64(b, uint64(r.prev))
	b = append(b, r.phase)
	return append(b, r.cursor...)
}

func decodeRoll(v []byte) (rollState, error) {
	if len(v) < 17 || v[16] > rollPrune {
		return rollState{}, errors.New("aggregator: corrupt period roll state")
	}
	return rollState{cur: int64(binary.BigEndian.Uint64(v)), prev: int64(binary.BigEndian.Uint64(v[8:])), phase: v[16],
		cursor: string(v[17:])}, nil
}

// loadEnt reads the entitlements view from the state.
func (pt *partition) loadEnt(st stateReader) error {
	e := &entPart{changed: map[string]int{}, changedGen: 1, emitNow: map[string]int64{}, pendingAt: map[string]int64{},
		cache: map[string]cachedValue{}, decoded: map[string]any{},
		accounts: map[string]*heldAccount{}, madePending: map[string]struct{}{}, pendingOrder: btreemap.New[string, struct{}](pendingDegree, strings.Compare)}
	pt.ent = e
	v, ok, err := st.Get(keyGateNext)
	if err != nil {
		return err
	}
	if ok && len(v) == 8 {
		e.gateNext = binary.BigEndian.Uint64(v)
	}
	e.txFirst = e.gateNext
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
	if v, ok, err = st.Get(keyBalances); err != nil {
		return err
	} else if ok {
		if e.bal, err = decodeBalanceState(v); err != nil {
			return fmt.Errorf("%w (partition %d)", err, pt.p)
		}
	}
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
	if e.more, err = pt.gateHeadPasses(st); err != nil {
		return err
	}
	pt.pr.m.gated.WithLabelValues(pt.pl).Set(float64(e.gateN))
	pt.pr.m.readTo.WithLabelValues(pt.pl).Set(float64(e.readTo) / 1000)
	return nil
}

// cachedValue is a state value of the Ledger's, or its absence (!ok).
type cachedValue struct {
	v  []byte
	ok bool
}

// maxLedgerCache bounds the values a partition's ledger cache keeps
// (customers' timelines and counters: a few hundred bytes each); past it
// the cache starts again empty.
const maxLedgerCache = 50_000

// ledgerStore is the entitlements.Store of the Ledger in tx: the state
// through the partition's cache, which spares the Ledger's reads of an
// event (plan, default plan, rate card) a Pebble lookup each, and its
// AccountCache (accounts), which holds the customers' usage, grants and
// overdraft decoded. Every write of the Ledger's keys goes through it,
// but the accounts' (flushAccounts).
type ledgerStore struct {
	tx *stream.Tx
	e  *entPart
	l  *entitlements.Ledger
}

// ledger returns the Ledger's store in tx: the partition's, so that
// passing it as an entitlements.Store allocates nothing.
func (pt *partition) ledger(tx *stream.Tx) *ledgerStore {
	s := &pt.ent.store
	if s.tx != tx || s.e != pt.ent || s.l != pt.pr.ledger {
		// Written only when it changes: twice an event otherwise.
		*s = ledgerStore{tx, pt.ent, pt.pr.ledger}
	}
	return s
}

func (s ledgerStore) Get(k []byte) ([]byte, bool, error) {
	if s.l.IsAccount(k) {
		// Read once into accounts, written by flushAccounts straight to
		// the transaction: never in the cache, which would keep them
		// stale.
		return s.tx.Get(k)
	}
	if c, ok := s.e.cache[string(k)]; ok {
		return c.v, c.ok, nil
	}
	v, ok, err := s.tx.Get(k)
	if err != nil {
		return nil, false, err
	}
	s.keep(k, cachedValue{bytes.Clone(v), ok})
	return v, ok, nil
}

func (s ledgerStore) Put(k, v []byte) {
	s.wrote(k)
	s.tx.Put(k, v)
	s.keep(k, cachedValue{bytes.Clone(v), true})
}

func (s ledgerStore) Delete(k []byte) {
	s.wrote(k)
	s.tx.Delete(k)
	s.keep(k, cachedValue{})
}

func (s ledgerStore) Scan(lo, hi []byte, fn func(k, v []byte) error) error {
	return s.tx.Scan(lo, hi, fn)
}

// Decoded implements entitlements.DecodeCache.
func (s ledgerStore) Decoded(v []byte) (any, bool) {
	x, ok := s.e.decoded[string(v)]
	return x, ok
}

// KeepDecoded implements entitlements.DecodeCache.
func (s ledgerStore) KeepDecoded(v []byte, x any) {
	if len(s.e.decoded) >= maxDecoded {
		clear(s.e.decoded)
	}
	s.e.decoded[string(v)] = x
}

// wrote drops every Resolved when k is a key they come from.
func (s ledgerStore) wrote(k []byte) {
	if s.l.Resolves(k) {
		s.e.dropResolved()
	}
}

// dropResolved drops every customer's Resolved.
func (e *entPart) dropResolved() { e.resolvedGen++ }

// held returns the customer's entry of accounts, or nil.
func (e *entPart) held(customer string) *heldAccount {
	if e.lastHeld != nil && customer == e.lastCustomer {
		return e.lastHeld
	}
	h := e.accounts[customer]
	if h != nil {
		e.lastCustomer, e.lastHeld = customer, h
	}
	return h
}

// hold returns the customer's entry of accounts, added if need be: past
// maxAccounts entries, the ones whose account the open transaction did
// not change are dropped first.
func (e *entPart) hold(customer string) *heldAccount {
	if h := e.held(customer); h != nil {
		return h
	}
	if n := len(e.accounts); n >= maxAccounts && n-len(e.dirtyAccounts) >= maxAccounts/4 {
		e.accountSweeps++
		for c, h := range e.accounts {
			if !h.dirty {
				delete(e.accounts, c)
			}
		}
		e.lastHeld = nil
	}
	h := &heldAccount{}
	e.accounts[customer] = h
	e.lastCustomer, e.lastHeld = customer, h
	return h
}

// dropHeld drops every entry of accounts.
func (e *entPart) dropHeld() {
	clear(e.accounts)
	clear(e.dirtyAccounts)
	e.dirtyAccounts = e.dirtyAccounts[:0]
	e.lastCustomer, e.lastHeld = "", nil
}

// Resolved implements entitlements.ResolveCache.
func (s ledgerStore) Resolved(customer string) (*entitlements.Resolved, bool) {
	if h := s.e.held(customer); h != nil && h.res != nil && h.resGen == s.e.resolvedGen {
		return h.res, true
	}
	return nil, false
}

// KeepResolved implements entitlements.ResolveCache.
func (s ledgerStore) KeepResolved(customer string, r *entitlements.Resolved) {
	h := s.e.hold(customer)
	h.res, h.resGen = r, s.e.resolvedGen
}

// heldAccount is a customer's entry of entPart.accounts: its Account
// kept decoded (nil: not kept); dirty: the open transaction changed it,
// and it is listed in entPart.dirtyAccounts; res: what the Ledger
// resolved for it, if resGen is entPart.resolvedGen.
type heldAccount struct {
	a      *entitlements.Account
	dirty  bool
	res    *entitlements.Resolved
	resGen uint64
	chIdx  int
	chGen  uint64
}

// maxAccounts bounds the customers a partition keeps (accounts) with no
// account changed across transactions (a few hundred bytes each); past
// it the unchanged ones are dropped. Changed ones stay until Flush writes
// them, so a transaction that changes more than maxAccounts holds them
// all; the sweep waits until at least maxAccounts/4 of those kept are
// unchanged, and its cost is spread over the accounts kept since.
const maxAccounts = 50_000

// Account implements entitlements.AccountCache.
func (s ledgerStore) Account(customer string) (*entitlements.Account, bool) {
	if h := s.e.held(customer); h != nil && h.a != nil {
		return h.a, true
	}
	return nil, false
}

// KeepAccount implements entitlements.AccountCache.
func (s ledgerStore) KeepAccount(customer string, a *entitlements.Account) {
	s.e.hold(customer).a = a
}

// ChangedAccount implements entitlements.AccountCache.
func (s ledgerStore) ChangedAccount(customer string, a *entitlements.Account) {
	h := s.e.hold(customer)
	h.a = a
	if !h.dirty {
		h.dirty = true
		s.e.dirtyAccounts = append(s.e.dirtyAccounts, customer)
	}
}

// flushAccounts writes each account the open transaction changed to it,
// once, before its changelog is written (Flush).
func (pt *partition) flushAccounts(tx *stream.Tx) {
	e := pt.ent
	for _, c := range e.dirtyAccounts {
		h := e.accounts[c]
		e.accountBuf = pt.pr.ledger.WriteAccount(tx, c, h.a, e.accountBuf)
		h.dirty = false
	}
	clear(e.dirtyAccounts)
	e.dirtyAccounts = e.dirtyAccounts[:0]
}

// maxDecoded bounds the decoded values a partition keeps: the plans of
// the customers it sees most, the default plan, the rate card.
const maxDecoded = 10_000

func (s ledgerStore) keep(k []byte, c cachedValue) {
	if len(s.e.cache) >= maxLedgerCache {
		clear(s.e.cache)
		s.e.dropResolved()
	}
	s.e.cache[string(k)] = c
}

// ledgerReader lets the Ledger read restored state (Open) through a
// stateReader; it never writes there.
type ledgerReader struct{ stateReader }

func (ledgerReader) Put(_, _ []byte) {}
func (ledgerReader) Delete(_ []byte) {}

// gateIn puts r in the gate when it must wait: the gate is not empty, or
// r's time is past what the entitlements partition has been read up to.
// It reports whether it did, and, when it did not, whether r is decoded
// in pt.ev (gateTime): handleDecoded then spares decoding it again.
func (pt *partition) gateIn(tx *stream.Tx, r *kgo.Record) (gated, decoded bool) {
	e := pt.ent
	if e.gateN == 0 {
		t, dec := pt.gateTime(r)
		if e.passes(t) {
			return false, dec
		}
	}
	// It enters the gate in memory (fresh), as the state would give it
	// back (decodeGateRecord): the state gets it only if it is still in
	// the gate when the transaction ends (flushGate).
	if len(e.fresh) == 0 {
		e.freshFirst = e.gateNext
	}
	var key []byte
	if len(r.Key) > 0 {
		key = r.Key
	}
	e.fresh = append(e.fresh, kgo.Record{Topic: pt.pr.cfg.Topics.DedupedTopic(), Partition: pt.p, Offset: r.Offset,
		Timestamp: time.UnixMilli(r.Timestamp.UnixMilli()), Key: key, Value: r.Value})
	e.gateNext++
	e.gateN++
	return true, false
}

// flushGate writes to the transaction the records that entered the gate
// in it and are still there, under the keys and with the values they
// would have had written at once ('q' seq: encodeGateRecord), and the seq
// of the next record to enter (keyGateNext): the committed state holds
// the gate whole, and a record gated and let through in one transaction
// never touches the state (Flush).
func (pt *partition) flushGate(tx *stream.Tx) {
	e := pt.ent
	for i := e.freshHead; i < len(e.fresh); i++ {
		k := binary.BigEndian.AppendUint64(append(e.gateKeyBuf[:0], pfxGate), e.freshFirst+uint64(i))
		e.gateKeyBuf = k
		tx.Put(k, encodeGateRecord(&e.fresh[i]))
	}
	if e.gateNext != e.txFirst {
		tx.Put(keyGateNext, binary.BigEndian.AppendUint64(nil, e.gateNext))
	}
	clear(e.fresh)
	e.fresh, e.freshHead = e.fresh[:0], 0
	e.txFirst = e.gateNext
}

// passes reports whether a record waiting for broker time t can leave the
// gate: the entitlements partition has been read past t (strictly: a
// record written in t's millisecond may still be unread, and would apply
// to an event that arrived at t, Timeline.At), or t is 0 (it waits for
// nothing).
func (e *entPart) passes(t int64) bool { return t <= 0 || t < e.readTo }

// drain lets the records at the head of the gate through, in order, while
// their time is before Ledger.ReadTo (passes), at most Config.FinalChunk of
// them (the rest go in Work's transactions).
func (pt *partition) drain(tx *stream.Tx) error {
	_, err := pt.drainN(tx, pt.pr.cfg.FinalChunk)
	return err
}

// drainAhead lets through, before n new records of usage.deduped are
// handled, the gated records ahead of them that can go, at most 2n of
// them (a transaction then handles at most three times the records it
// read; Work's transactions drain the rest, Config.FinalChunk at a time).
// A gate with a backlog of ready records (a stage catching up, whose
// first records waited for its entitlements partition to be read) thus
// shrinks by at least n a call, and once it is empty the new records whose
// time the entitlements partition has been read past skip it (gateIn):
// they are not written to the state and deleted again. In steady state
// only the records that arrived after the partition's last tick wait.
func (pt *partition) drainAhead(tx *stream.Tx, n int) error {
	for budget := 2 * n; pt.ent.gateN > 0 && budget > 0; {
		done, err := pt.drainN(tx, min(budget, pt.pr.cfg.FinalChunk))
		if err != nil || done == 0 {
			return err
		}
		budget -= done
	}
	return nil
}

// drainN is drain with at most limit records, and reports how many went
// through.
func (pt *partition) drainN(tx *stream.Tx, limit int) (int, error) {
	e := pt.ent
	if e.gateN == 0 {
		e.more = false
		return 0, nil
	}
	// The gate is the records the committed state holds ('q' keys), then
	// those that entered it in this transaction (fresh).
	done, blocked := 0, false
	if inState := e.gateN - (len(e.fresh) - e.freshHead); inState > 0 {
		kvs, err := scanChunk(tx, []byte{pfxGate}, []byte{pfxGate + 1}, nil, min(limit, inState))
		if err != nil {
			return 0, err
		}
		topic := pt.pr.cfg.Topics.DedupedTopic()
		for _, kv := range kvs {
			r, err := decodeGateRecord(kv.v, topic, pt.p)
			if err != nil {
				return done, err
			}
			went, err := pt.leave(tx, r, func() { tx.Delete(kv.k) })
			if !went {
				blocked = true
				break
			}
			done++
			if err != nil {
				return done, err
			}
		}
	}
	// Past the state's records only when every one of them went through
	// (done < limit then means none is left there).
	for !blocked && done < limit && e.freshHead < len(e.fresh) {
		went, err := pt.leave(tx, &e.fresh[e.freshHead], func() { e.freshHead++ })
		if !went {
			blocked = true
			break
		}
		done++
		if err != nil {
			return done, err
		}
	}
	e.more = false
	if !blocked && done == limit {
		var err error
		if e.more, err = pt.gateHeadPasses(tx); err != nil {
			return done, err
		}
	}
	pt.pr.m.gated.WithLabelValues(pt.pl).Set(float64(e.gateN))
	return done, nil
}

// gateHeadPasses reports whether the record at the head of the gate (the
// first the state holds, else the first that entered it in this
// transaction) can leave it now (passes): whether Work has records to
// drain. It is the same whether the partition kept its memory or loaded
// its state (a restart, an aborted transaction): a gate whose head waits
// for the entitlements partition gives Work nothing to do either way, and
// the chunks of a period's roll and FINALs go in the same transactions.
func (pt *partition) gateHeadPasses(st stateReader) (bool, error) {
	e := pt.ent
	if e.gateN <= 0 {
		return false, nil
	}
	var head *kgo.Record
	if e.gateN > len(e.fresh)-e.freshHead {
		var v []byte
		err := st.Scan([]byte{pfxGate}, []byte{pfxGate + 1}, func(_, val []byte) error {
			v = bytes.Clone(val)
			return errStop
		})
		if err != nil && !errors.Is(err, errStop) {
			return false, err
		}
		if v == nil {
			return false, fmt.Errorf("aggregator: partition %d: %d gated records, none in the state", pt.p, e.gateN)
		}
		if head, err = decodeGateRecord(v, pt.pr.cfg.Topics.DedupedTopic(), pt.p); err != nil {
			return false, err
		}
	} else {
		head = &e.fresh[e.freshHead]
	}
	t, _ := pt.gateTime(head)
	return e.passes(t), nil
}

// leave lets r, the record at the head of the gate, through when the
// entitlements partition has been read past its time (passes): out takes
// it out of the gate, then it is handled. It reports whether r went.
func (pt *partition) leave(tx *stream.Tx, r *kgo.Record, out func()) (bool, error) {
	t, decoded := pt.gateTime(r)
	if !pt.ent.passes(t) {
		return false, nil
	}
	out()
	pt.ent.gateN--
	return true, pt.dispatch(tx, r, decoded)
}

// entRecords handles records of usage.entitlements: each is applied to the
// Ledger (a tick only moves its read time), or rejected, or re-produced to
// its canonical partition; then the gate lets through what can now be
// decided.
func (pt *partition) entRecords(tx *stream.Tx, recs []*kgo.Record) error {
	l := pt.pr.ledger
	for _, r := range recs {
		written := r.Timestamp.UnixMilli()
		rec, err := entitlements.ParseRecord(r.Key, r.Value, written)
		switch {
		case err != nil:
			pt.ent.pending.record("rejected")
			if err := pt.reject(tx, r, nil, entitlements.Reason(err), err.Error()); err != nil {
				return err
			}
			if err := pt.restateRejected(tx, r); err != nil {
				return err
			}
		case rec.Key.Reserved == "" && schemas.Partition(r.Key, pt.pr.counts.entitlements) != pt.p:
			canon := schemas.Partition(r.Key, pt.pr.counts.entitlements)
			if IsMovedMark(r) {
				// The aggregator's own delete after a record it moved
				// (HeaderMoved): nothing to move.
				pt.ent.pending.record("moved_mark")
				break
			}
			if _, ok := headerValue(r, HeaderRerouted); ok {
				// Never re-routed twice (docs/entitlements.md, The
				// aggregator, 1): a copy is written to its canonical
				// partition, and the partition count never changes under a
				// state (checkPartitionCounts).
				pt.ent.pending.record("rejected")
				if err := pt.reject(tx, r, nil, schemas.ReasonInvalid, fmt.Sprintf("a record marked %s on partition %d of %s, not its customer's %d: never re-routed twice",
					HeaderRerouted, pt.p, r.Topic, canon)); err != nil {
					return err
				}
				break
			}
			// A client with another partitioner (docs/entitlements.md, The
			// aggregator, 1). It is re-produced now, with the original's
			// coordinates and broker time, and the canonical partition's
			// owner applies it from its new broker time (an effective_from
			// before that is raised to it): events decided there before it
			// was read are never reconsidered. How soon depends on how far
			// behind this partition is read. Read again from the start (a
			// new group, state rebuilt), it is re-produced again; that copy
			// changes nothing (staleCopy).
			tx.Emit(&kgo.Record{Topic: r.Topic, Partition: canon, Key: r.Key, Value: r.Value, Timestamp: pt.pr.now(),
				Headers: []kgo.RecordHeader{
					{Key: HeaderRerouted, Value: fmt.Appendf(nil, "%d/%d", r.Partition, r.Offset)},
					{Key: HeaderArrival, Value: strconv.AppendInt(nil, written, 10)},
				}})
			if r.Value != nil {
				// The original's key is deleted where it was found, so
				// that compaction removes the original there: only its
				// copy stays, on the customer's partition, where a
				// later record or delete of the customer supersedes it
				// for good (HeaderMoved).
				tx.Emit(&kgo.Record{Topic: r.Topic, Partition: pt.p, Key: r.Key, Timestamp: pt.pr.now(),
					Headers: []kgo.RecordHeader{{Key: HeaderMoved, Value: strconv.AppendInt(nil, r.Offset, 10)}}})
			}
			pt.ent.pending.record("rerouted")
			pt.pr.log.Info("entitlements record re-produced to its canonical partition", zap.Int32("partition", pt.p),
				zap.Int32("canonical_partition", canon), zap.Int64("offset", r.Offset))
		case rec.IsTick():
			pt.ent.pending.record("tick")
		default:
			if err := pt.applyEntRecord(tx, r, rec, written); err != nil {
				return err
			}
		}
		if err := l.Advance(pt.ledger(tx), written); err != nil {
			return err
		}
	}
	rt, err := l.ReadTo(pt.ledger(tx))
	if err != nil {
		return err
	}
	pt.ent.readTo = rt
	pt.pr.m.readTo.WithLabelValues(pt.pl).Set(float64(rt) / 1000)
	return pt.drain(tx)
}

// applyEntRecord applies a record of a customer, or a shared record
// (the default plan, the rate card), read from the partition's
// usage.entitlements, or rejects it when it is invalid: r is the record
// read, rec its parse and written its broker time.
func (pt *partition) applyEntRecord(tx *stream.Tx, r *kgo.Record, rec *entitlements.Record, written int64) (err error) {
	l := pt.pr.ledger
	okey := originKeyOf(rec.Key)
	from, stale, restate, err := pt.staleCopy(tx, r, okey)
	if err != nil {
		return err
	} else if stale {
		pt.ent.pending.record("rerouted_repeat")
		pt.pr.log.Info("re-produced entitlements record not applied: a record of its key that arrived after its original was read",
			zap.Int32("partition", pt.p), zap.Int64("offset", r.Offset), zap.String("key", string(okey[1:])),
			zap.Bool("restated", restate != nil))
		if restate != nil {
			tx.Emit(restate)
		}
		return nil
	}
	// A record refused for too many versions of its key is refused alike
	// however far the partition has pruned (entitlements.Config.Span):
	// only the versions within W + B + S of its broker time count.
	if err = l.Apply(pt.ledger(tx), rec); err != nil {
		if !errors.Is(err, entitlements.ErrInvalid) {
			return fmt.Errorf("aggregator: partition %d: entitlements offset %d: %w", pt.p, r.Offset, err)
		}
		pt.ent.pending.record("rejected")
		if err := pt.reject(tx, r, nil, schemas.ReasonInvalid, err.Error()); err != nil {
			return err
		}
		return pt.restateRejected(tx, r)
	}
	pt.ent.pending.record("applied")
	tx.Put(okey, from.encodeWith(r.Value))
	if rec.Key.Reserved == "" {
		pt.ent.change(rec.Key.Customer, written)
		if err := l.PruneCustomer(pt.ledger(tx), rec.Key.Customer, pt.pruneHorizon()); err != nil {
			return err
		}
	} else if err := l.PruneShared(pt.ledger(tx), pt.pruneHorizon()); err != nil {
		return err
	}
	return nil
}

// RecordOrigin orders the records of one customer's key by when they
// reached usage.entitlements: the broker time of the original (a copy's
// HeaderArrival, else its own), then the partition and offset of the
// original (ties: the order is arbitrary but the same for every reader).
type RecordOrigin struct {
	Arrival   int64
	Partition int32
	Offset    int64
}

// encodeWith is the value of an originKey: the origin (20 bytes), then
// the value of the record applied (1, then the value; 0: a tombstone).
func (o RecordOrigin) encodeWith(value []byte) []byte {
	b := make([]byte, 0, 21+len(value))
	b = binary.BigEndian.AppendUint64(b, uint64(o.Arrival))
	b = binary.BigEndian.AppendUint32(b, uint32(o.Partition))
	b = binary.BigEndian.AppendUint64(b, uint64(o.Offset))
	if value == nil {
		return append(b, 0)
	}
	return append(append(b, 1), value...)
}

// After reports whether o is later than p.
func (o RecordOrigin) After(p RecordOrigin) bool {
	switch {
	case o.Arrival != p.Arrival:
		return o.Arrival > p.Arrival
	case o.Partition != p.Partition:
		return o.Partition > p.Partition
	}
	return o.Offset > p.Offset
}

// OriginOf returns the origin of r, a record of usage.entitlements, and
// reports whether r is a copy the aggregator re-produced: its headers
// HeaderRerouted and HeaderArrival (each once, well formed) give the
// original's coordinates and broker time (at most maxArrival). Anything
// else is an ordinary record of its own origin.
//
// A copy's origin is its headers' alone, never capped at r's own broker
// time: every copy of one original (each group that reads it re-produces
// it, at its own time) and every restated record of an origin must order
// alike, and a copy is written after its original by a clock that may be
// behind the original's (another leader, a clock stepped back). Capped, a
// copy made early was older than the last record where a later group's
// was not: the running aggregator changed its decision when a new group
// started (TestDecideRecordModel). So a client that writes the
// headers can claim a later arrival: misrouted records of its customer
// that reached the topic before it are then skipped, nothing else.
func OriginOf(r *kgo.Record) (o RecordOrigin, copied bool) {
	own := RecordOrigin{Arrival: r.Timestamp.UnixMilli(), Partition: r.Partition, Offset: r.Offset}
	rv, ok1 := headerValue(r, HeaderRerouted)
	av, ok2 := headerValue(r, HeaderArrival)
	if !ok1 || !ok2 {
		return own, false
	}
	ps, os, cut := strings.Cut(string(rv), "/")
	p, err1 := strconv.ParseInt(ps, 10, 32)
	off, err2 := strconv.ParseInt(os, 10, 64)
	a, err3 := strconv.ParseInt(string(av), 10, 64)
	if !cut || err1 != nil || err2 != nil || err3 != nil || p < 0 || off < 0 || a < 0 || a > maxArrival {
		return own, false
	}
	return RecordOrigin{Arrival: a, Partition: int32(p), Offset: off}, true
}

// maxArrival is the latest arrival a copy can claim (9999-12-31, epoch
// ms): a record ordered after an origin (DecideRecord) is a millisecond
// later, which must not overflow.
const maxArrival = 253402300799999

// originKey is the state key of the origin and value of the last record
// of a customer's key applied ('o' customer; RecordOrigin.encodeWith).
func originKey(customer string) []byte { return append([]byte{pfxOrigin}, customer...) }

// originKeyOf is the state key of the origin and value of the last record
// of k applied: originKey of a customer's key, 'O' and the key of a shared
// one (written to every partition: each keeps its own).
func originKeyOf(k schemas.EntitlementsKey) []byte {
	if k.Reserved == "" {
		return originKey(k.Customer)
	}
	return append([]byte{pfxSharedOrigin}, k.Reserved...)
}

// IsMovedMark reports whether r is a delete the aggregator wrote after
// moving a misrouted record of r's key (HeaderMoved, a null value). On
// another partition than its customer's it is skipped, by the aggregator
// and `meterline entitlements get`; on the customer's own partition (a
// client wrote it there) it is a delete like any other.
func IsMovedMark(r *kgo.Record) bool {
	_, ok := headerValue(r, HeaderMoved)
	return ok && r.Value == nil
}

// headerValue returns the value of r's header k; a header given twice
// counts as absent (it proves nothing).
func headerValue(r *kgo.Record, k string) (v []byte, ok bool) {
	for _, h := range r.Headers {
		if h.Key == k {
			if ok {
				return nil, false
			}
			v, ok = h.Value, true
		}
	}
	return v, ok
}

// staleCopy returns the origin of r, a customer's record on its canonical
// partition or a shared one (OriginOf), and reports whether r is a stale
// copy: a record the stage re-produced or restated whose original reached
// usage.entitlements no later than the last record of its key applied
// here (okey: originKeyOf). Such a copy is a
// repeat (its misrouted original read again from the start by a new group
// or state rebuilt from scratch, or by a second aggregator), or an older
// version than one already in effect: applied, it would put an old
// version back in effect from its new broker time. It changes nothing but
// the read time. A record without the headers is always applied
// (DecideRecord has the rules).
//
// When the stale copy is older than the last record applied, or claims
// its origin with a lesser value, restate is that record again, to go to
// this partition in the same transaction, marked with its own origin: the last record of the key on the
// partition, which compaction keeps, is then the one in effect, not the
// stale copy (a stage that reads the partition from the start after
// compaction applies it; any other finds its origin equal to the last
// one applied, and skips it without restating it).
//
// The last origin and value of each customer key are kept in the state
// for good, for a misrouted original stays on its compacted partition,
// and can be read again, for as long as it is not replaced there.
func (pt *partition) staleCopy(st stateReader, r *kgo.Record, okey []byte) (o RecordOrigin, stale bool, restate *kgo.Record, err error) {
	last, lastValue, ok, err := pt.lastOrigin(st, okey)
	if err != nil {
		return RecordOrigin{}, false, nil, err
	}
	o, apply, again := DecideRecord(r, last, lastValue, ok)
	if apply || !again {
		return o, !apply, nil, nil
	}
	return last, true, pt.restated(r, last, lastValue), nil
}

// lastOrigin returns the origin and value of the last record of a key
// applied (okey: originKeyOf); ok is false when there is none.
func (pt *partition) lastOrigin(st stateReader, okey []byte) (last RecordOrigin, lastValue []byte, ok bool, err error) {
	v, ok, err := st.Get(okey)
	switch {
	case err != nil || !ok:
		return RecordOrigin{}, nil, false, err
	case len(v) < 21 || v[20] > 1 || v[20] == 0 && len(v) > 21:
		return RecordOrigin{}, nil, false, fmt.Errorf("aggregator: partition %d: corrupt record origin of %q (%d bytes)", pt.p, okey[1:], len(v))
	}
	last = RecordOrigin{Arrival: int64(binary.BigEndian.Uint64(v)), Partition: int32(binary.BigEndian.Uint32(v[8:])),
		Offset: int64(binary.BigEndian.Uint64(v[12:]))}
	if v[20] == 1 {
		lastValue = v[21:]
	}
	return last, lastValue, true, nil
}

// restated is the record of r's key in effect, last and lastValue, written
// again to the partition marked with its origin.
func (pt *partition) restated(r *kgo.Record, last RecordOrigin, lastValue []byte) *kgo.Record {
	restate := &kgo.Record{Topic: r.Topic, Partition: pt.p, Key: r.Key, Timestamp: pt.pr.now(), Headers: []kgo.RecordHeader{
		{Key: HeaderRerouted, Value: fmt.Appendf(nil, "%d/%d", last.Partition, last.Offset)},
		{Key: HeaderArrival, Value: strconv.AppendInt(nil, last.Arrival, 10)},
	}}
	if lastValue != nil {
		restate.Value = bytes.Clone(lastValue)
	}
	return restate
}

// restateRejected restates the record in effect of the key of r, a
// record of usage.entitlements just rejected, when r is a customer's on
// its canonical partition, or a shared one (the default plan, the rate
// card, on any partition), and a record of its key was applied: the
// rejected record leaves it in effect, but would otherwise be the key's
// last record, which compaction keeps and a stage reading the compacted
// topic from the start rejects (applying the default plan instead, or no
// default plan, no rate card). Every other stage skips the restated
// record (the origin and value in effect). A rejected record whose key is
// a tick's or not an entitlements key, or a customer's on another
// partition, or whose value is the one in effect, changes nothing.
func (pt *partition) restateRejected(tx *stream.Tx, r *kgo.Record) error {
	k, err := schemas.ParseEntitlementsKey(r.Key)
	if err != nil || k.Reserved == schemas.TickKey || k.Reserved == "" && schemas.Partition(r.Key, pt.pr.counts.entitlements) != pt.p {
		return nil
	}
	okey := originKeyOf(k)
	last, lastValue, ok, err := pt.lastOrigin(tx, okey)
	if err != nil || !ok || compareValues(r.Value, lastValue) == 0 {
		// The value in effect rejected (a state applied under other
		// rules): restated, it would be rejected again, for ever.
		return err
	}
	tx.Emit(pt.restated(r, last, lastValue))
	pt.pr.log.Info("rejected entitlements record followed by the record in effect, restated", zap.Int32("partition", pt.p),
		zap.Int64("offset", r.Offset), zap.String("key", string(okey[1:])))
	return nil
}

// DecideRecord decides r, a record of a key on its partition, against the
// last record of the key applied there: its origin last and value
// lastValue (nil: a delete); have is false when there is none yet. It
// returns the origin of the key once r is read, and reports whether r is
// applied and, when it is not, whether the last record is to be written
// again (restate) so that r is not what compaction keeps. The aggregator
// (staleCopy) and `meterline entitlements get` decide by it.
//
//   - r is later than last (OriginOf): applied.
//   - r is not a copy (no headers), but earlier (a broker clock that
//     stepped back): applied, ordered a millisecond after last (the
//     Ledger reads it at the latest broker time read, at least), so that
//     a copy or restated record of last read after it is older.
//   - r is a copy from before last: skipped, last restated.
//   - r is a copy claiming last's origin (its coordinates; its arrival may
//     be earlier, stamped after a broker clock stepped back): the same value (another copy of
//     it: a second aggregator's, a restated one read back) is skipped;
//     otherwise (headers a client wrote or copied, or a stage that
//     applied such a record where another did not: the compacted topic
//     read from the start) the greater value (bytes; a delete least)
//     wins, so that every reader ends with the same one and two stages
//     never restate each other's records for ever. A client gains
//     nothing it could not by writing the record without the headers.
func DecideRecord(r *kgo.Record, last RecordOrigin, lastValue []byte, have bool) (o RecordOrigin, apply, restate bool) {
	o, copied := OriginOf(r)
	switch {
	case !have || o.After(last):
		return o, true, false
	case !copied:
		return RecordOrigin{Arrival: last.Arrival + 1, Partition: o.Partition, Offset: o.Offset}, true, false
	case last.After(o) && (o.Partition != last.Partition || o.Offset != last.Offset):
		return last, false, true
	}
	// A copy claiming last's coordinates, at its time or earlier: a copy
	// stamped after a broker clock stepped back behind last's time has
	// an earlier arrival (OriginOf), and is still a copy of last (restated,
	// it would be restated for as long as the clock is behind).
	switch c := compareValues(r.Value, lastValue); {
	case c == 0:
		return last, false, false
	case c > 0:
		return last, true, false
	}
	return last, false, true
}

// compareValues orders record values: a delete (nil) first, then by bytes.
func compareValues(a, b []byte) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return -1
	case b == nil:
		return 1
	}
	return bytes.Compare(a, b)
}

// pruneHorizon is the earliest arrival a future event of the partition can
// have: wm − (W + B + S). A re-routed event keeps its original arrival
// (docs/design.md, Event identity and keys, "Misrouted records"), and dedup
// accepts it as long as its event_time − S is not before the keys it has
// expired, ⌊(wm' − W − S)/B⌋·B at its own watermark wm' (never behind this
// partition's wm): so its event_time can be as early as just after
// wm − W − B, and its arrival, at most S before its event_time, just after
// wm − W − B − S.
func (pt *partition) pruneHorizon() int64 {
	c := pt.pr.cfg
	return pt.wm - c.Window.Milliseconds() - c.Bucket.Milliseconds() - c.Skew.Milliseconds()
}

// decideEvent decides an event's entitlements (docs/entitlements.md, The
// aggregator, 3); it reports whether the event goes on to be counted. A
// rejected event goes to usage.rejected and changes nothing else. An
// accepted event's charge is returned, not yet recorded: the caller commits
// it once the event's aggregate has taken the event.
func (pt *partition) decideEvent(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, m *Meter) (*charge, bool, error) {
	l := pt.pr.ledger
	// The partition's charge, reused: an event's charge is committed or
	// dropped before the next event is decided. Its decision is written
	// whole by EvaluateInto, which reuses its Draws; the other fields are
	// set here, field by field, the decision left alone.
	ch := &pt.charge
	ch.pt, ch.tx, ch.customer, ch.label = pt, tx, e.CustomerID, ""
	// Its event too, every field of it: a composite literal would be
	// built in a temporary and copied.
	ev := &ch.ev
	ev.Meter, ev.Aggregation, ev.Quantity = e.Meter, string(m.Aggregation), e.Quantity
	ev.EventTime, ev.Arrival, ev.Undeclared = e.EventTime, e.IngestTime, m == undeclared
	if err := l.EvaluateInto(pt.ledger(tx), e.CustomerID, &ch.ev, &ch.d); err != nil {
		return nil, false, fmt.Errorf("aggregator: partition %d: entitlements of %s: %w", pt.p, e.CustomerID, err)
	}
	d := &ch.d
	if e := pt.ent; e.label == "" || e.labelPlan != d.Plan {
		e.labelPlan, e.label = d.Plan, pt.pr.plans.label(d.Plan)
	}
	ch.label = pt.ent.label
	// Guarantee: the decision and its charge are in the open transaction
	// only; a crash here aborts both, and the event is decided again from
	// the committed balance.
	fault.Hit(fault.ChargeDecided)
	if d.Outcome != entitlements.Accepted {
		pt.ent.pending.add(d.Outcome.String(), ch.label, 0)
		return nil, false, pt.reject(tx, r, e, d.Outcome.Reason(), d.Detail)
	}
	if d.Misconfigured != "" && !pt.ent.warned[e.Meter] {
		// Once per meter and partition: the same cap or rate would
		// otherwise log with each of the meter's events.
		if pt.ent.warned == nil {
			pt.ent.warned = map[string]bool{}
		}
		pt.ent.warned[e.Meter] = true
		pt.pr.log.Warn("entitlements misconfigured for a meter (said once per meter and partition)", zap.String("meter", e.Meter),
			zap.Int32("partition", pt.p), zap.String("detail", d.Misconfigured))
	}
	return ch, true, nil
}

// charge is an accepted event's charge (Ledger.Evaluate's decision), held
// until its aggregate takes the event.
type charge struct {
	pt       *partition
	tx       *stream.Tx
	customer string
	ev       entitlements.Event
	d        entitlements.Decision
	label    string
}

// commit records the charge in the customer's account (Ledger.Record: in
// the partition's accounts, written to the transaction by Flush), and
// counts it.
func (ch *charge) commit() error {
	pt := ch.pt
	if err := pt.pr.ledger.RecordDecided(pt.ledger(ch.tx), ch.customer, &ch.ev, &ch.d); err != nil {
		return fmt.Errorf("aggregator: partition %d: entitlements of %s: %w", pt.p, ch.customer, err)
	}
	e := pt.ent
	e.pending.add(entitlements.Accepted.String(), ch.label, ch.d.Cost)
	// changed[customer] = max(changed[customer], arrival), looked up
	// only when the customer's entry does not know where changed keeps
	// its time.
	h := e.held(ch.customer)
	if h != nil && e.changedGen != 0 && h.chGen == e.changedGen {
		if at := &e.changedAt[h.chIdx]; ch.ev.Arrival > *at {
			*at = ch.ev.Arrival
		}
		return nil
	}
	i := e.change(ch.customer, ch.ev.Arrival)
	if h != nil {
		h.chIdx, h.chGen = i, e.changedGen
	}
	return nil
}

// change notes that customer c changed at time t: changed[c] =
// max(changed[c], t), a customer not in changed counting as 0. It
// returns the index of c's time in changedAt.
func (e *entPart) change(c string, t int64) int {
	i, ok := e.changed[c]
	if !ok {
		i = len(e.changedAt)
		e.changed[c] = i
		e.changedAt = append(e.changedAt, max(0, t))
		return i
	}
	e.changedAt[i] = max(e.changedAt[i], t)
	return i
}

// clearChanged empties changed, and so forgets every entry's index into
// it (changedGen).
func (e *entPart) clearChanged() {
	clear(e.changed)
	e.changedAt = e.changedAt[:0]
	e.changedGen++
}

// refund takes back the charge of a queued event that its booking
// refused (bookChunk): its decision charged it when it was queued, in an
// earlier transaction. The customer's balance goes out as for any change.
func (pt *partition) refund(tx *stream.Tx, e *schemas.DedupedEvent, charge []byte) error {
	ev := entitlements.Event{Meter: e.Meter, Quantity: e.Quantity, EventTime: e.EventTime, Arrival: e.IngestTime}
	if err := pt.pr.ledger.Refund(pt.ledger(tx), e.CustomerID, ev, charge); err != nil {
		return fmt.Errorf("aggregator: partition %d: refund the charge of %s's queued event %s: %w", pt.p, e.CustomerID, e.EventID, err)
	}
	pt.ent.change(e.CustomerID, e.IngestTime)
	pt.pr.log.Info("charge of a queued event refunded: its booking rejected it", zap.Int32("partition", pt.p),
		zap.String("customer", e.CustomerID), zap.String("event_id", e.EventID))
	return nil
}

// entWatermark starts the work of a period start when the watermark
// entered a new period: the balances of the customers with usage in every
// period from the one it left up to the new one (periods the watermark
// skipped included) go out. A roll whose balances are still going out
// when the watermark enters yet another period goes on from its cursor,
// now up to the newer period: no customer it had not reached is dropped.
//
// The partition's first period (no roll recorded: a new partition, or
// state from before rolls were recorded) has no balances to send, only
// periods to prune; its first chunk of pruning goes in this transaction,
// and Work's transactions take the rest. A new partition then has none:
// Work would commit a transaction of its own for it, at once, and a new
// aggregator's partitions each would (a transaction's chunk is bounded
// either way, and when the pruning runs does not change a decision:
// Work runs between any two transactions).
func (pt *partition) entWatermark(tx *stream.Tx) error {
	e := pt.ent
	start, _ := pt.bounds(pt.wm)
	if start <= e.roll.cur {
		return nil
	}
	switch prev := e.roll.cur; {
	case prev == 0:
		e.roll = rollState{cur: start, phase: rollPrune}
		if err := pt.pruneChunk(tx, pt.pr.cfg.FinalChunk); err != nil {
			return err
		}
		pt.txc.Inc(pt.pr.m.chunks.WithLabelValues("prune"))
	case e.roll.phase == rollBalances:
		e.roll.cur = start
	default:
		e.roll = rollState{cur: start, prev: prev, phase: rollBalances}
	}
	tx.Put(keyRoll, e.roll.encode())
	return nil
}

// maxRollPeriods bounds the periods one chunk of a roll's balances looks
// at (a watermark that skipped many short periods): each costs a scan of
// the Ledger's period index, empty for a period without usage.
const maxRollPeriods = 64

// entHasWork reports whether the entitlements have chunked work: records
// of the gate that can go through, a period start's, or pending balances
// going out (Flush emits their next chunk in Work's transaction).
func (pt *partition) entHasWork() bool {
	return pt.ent != nil && (pt.ent.more || pt.ent.roll.phase != rollIdle || pt.ent.bal.active)
}

// entWork does one chunk of that work in tx.
func (pt *partition) entWork(tx *stream.Tx) error {
	e := pt.ent
	if e.more {
		return pt.drain(tx)
	}
	if e.roll.phase == rollIdle {
		return nil // pending balances: Flush emits their next chunk
	}
	n := pt.pr.cfg.FinalChunk
	work := "prune"
	switch e.roll.phase {
	case rollBalances:
		work = "balances"
		// The periods from prev up to cur, in order, at most n customers
		// and maxRollPeriods periods a chunk.
		for left, periods := n, 0; left > 0 && periods < maxRollPeriods && e.roll.phase == rollBalances; periods++ {
			cs, more, err := pt.pr.ledger.CustomersWithUsage(pt.ledger(tx), e.roll.prev, e.roll.cursor, left)
			if err != nil {
				return err
			}
			for _, c := range cs {
				if out, err := pt.balanceOutSince(tx, c, e.roll.cur); err != nil {
					return err
				} else if out {
					continue
				}
				e.emitNow[c] = max(e.emitNow[c], pt.wm)
			}
			left -= len(cs)
			if more && len(cs) > 0 {
				e.roll.cursor = cs[len(cs)-1]
				continue
			}
			e.roll.cursor = ""
			if _, end := pt.pr.cfg.Period.Bounds(e.roll.prev); end < e.roll.cur {
				e.roll.prev = end
			} else {
				e.roll.phase = rollPrune
			}
		}
	case rollPrune:
		if err := pt.pruneChunk(tx, n); err != nil {
			return err
		}
	}
	tx.Put(keyRoll, e.roll.encode())
	pt.txc.Inc(pt.pr.m.chunks.WithLabelValues(work))
	return nil
}

// pruneChunk prunes at most n periods of the Ledger below the partition's
// prune horizon, and its shared versions; the roll is idle once no period
// is left to prune.
func (pt *partition) pruneChunk(tx *stream.Tx, n int) error {
	more, err := pt.pr.ledger.PrunePeriods(pt.ledger(tx), pt.pruneHorizon(), n)
	if err != nil {
		return err
	}
	if !more {
		pt.ent.roll.phase = rollIdle
	}
	return pt.pr.ledger.PruneShared(pt.ledger(tx), pt.pruneHorizon())
}

// balanceOutSince reports whether customer c's balance as of start or later
// is out and nothing changed c since: c is not pending, and its account
// notes a change at or after start (makePending), whose balance, as of that
// change or later, went out when c stopped being pending. A period start's
// chunks skip such a customer: its balance of the new period (start: the
// period's) is out, and another would be one more balance than transactions
// that changed it (docs/entitlements.md, The aggregator, 4). A change noted
// only in the pending key (its account unchanged) is not seen: such a
// customer gets the period start's balance all the same.
func (pt *partition) balanceOutSince(tx *stream.Tx, c string, start int64) (bool, error) {
	if _, pending := pt.ent.pendingAt[c]; pending {
		return false, nil
	}
	at, err := pt.pr.ledger.ChangedAt(pt.ledger(tx), c)
	if err != nil {
		return false, fmt.Errorf("aggregator: partition %d: account of %s: %w", pt.p, c, err)
	}
	return at >= start, nil
}

// flushBalances ends the open transaction's part in balances
// (docs/entitlements.md, The aggregator, 4): the customers it changed
// become pending (BalanceEveryTransaction: go out now); in a transaction
// fenced by the partition's input or Work, the next chunk of the pending
// customers goes out (roundChunk); and the balance of each customer going
// out is emitted once, as of the later of the watermark and the latest time
// involved, with the partition's next revision.
func (pt *partition) flushBalances(tx *stream.Tx) error {
	e := pt.ent
	e.flushed, e.pending = e.pending, entMetrics{}
	defer pt.publishPending()
	defer clear(e.madePending)
	fenced := e.fenced
	e.fenced = false
	out := e.emitNow
	every := pt.pr.cfg.BalanceInterval < 0
	for c, i := range e.changed {
		t := e.changedAt[i]
		if _, now := out[c]; now || every {
			out[c] = max(out[c], t)
			continue
		}
		pt.makePending(tx, c, t)
	}
	e.clearChanged()
	if fenced {
		if err := pt.roundChunk(tx, out); err != nil {
			return err
		}
	}
	if len(out) == 0 {
		return nil
	}
	topic := pt.pr.cfg.Topics.BalancesTopic()
	rev := e.bal.rev
	for _, c := range slices.Sorted(maps.Keys(out)) {
		if _, pending := e.pendingAt[c]; pending {
			// Its latest change goes out now: it is no longer pending.
			t, err := pt.changeTime(tx, c)
			if err != nil {
				return err
			}
			out[c] = max(out[c], t)
			pt.unpend(tx, c)
		}
		rev++
		b, err := pt.pr.ledger.Balance(pt.ledger(tx), c, max(pt.wm, out[c]), rev)
		if err != nil {
			return fmt.Errorf("aggregator: partition %d: balance of %s: %w", pt.p, c, err)
		}
		val, err := encode(b)
		if err != nil {
			return fmt.Errorf("aggregator: partition %d: encode the balance of %s: %w", pt.p, c, err)
		}
		key := schemas.CustomerKey(c)
		rec := pt.newRecord(key, val)
		rec.Topic, rec.Partition = topic, schemas.Partition(key, pt.pr.counts.balances)
		tx.Emit(rec)
	}
	e.bal.rev = rev
	tx.Put(keyBalances, e.bal.encode())
	pt.txc.Add(pt.pr.m.balances, float64(len(out)))
	clear(out)
	return nil
}

// publishPending sets the pending balances gauge.
func (pt *partition) publishPending() {
	pt.pr.m.pendingBalances.WithLabelValues(pt.pl).Set(float64(len(pt.ent.pendingAt)))
}

// makePending records that customer c's balance changed at broker time t
// and has not gone out. The balance goes out as of the latest time of its
// changes (or the watermark; changeTime), so that after a restart it is
// the same balance as without one: the plan, period and grants of its
// latest change, not of the change that made it pending. Its pending key
// is written when it becomes pending, with that change's time; a later
// change's time goes with its account when the transaction writes the
// account anyway (Account.NoteChange: the Ledger changed it, and
// flushAccounts writes it after this), else in the pending key again. So
// a customer whose usage changes in every transaction writes one record
// a transaction, its account, not two.
func (pt *partition) makePending(tx *stream.Tx, c string, t int64) {
	e := pt.ent
	cur, pending := e.pendingAt[c]
	if pending && cur >= t {
		return
	}
	if h, ok := e.accounts[c]; ok && h.dirty && !h.a.Empty() {
		h.a.NoteChange(t)
		if pending {
			e.pendingAt[c] = t
			return
		}
	}
	// One scratch buffer for the key and the value: Put copies both.
	b := append(append(e.pendingBuf[:0], pfxBalancePending), c...)
	b = binary.AppendVarint(b, t)
	e.pendingBuf = b
	tx.Put(b[:1+len(c)], b[1+len(c):])
	if !pending {
		// Every pending key the transaction deletes, it deletes after
		// this (flushBalances, once a transaction): the committed state
		// does not hold c's.
		e.madePending[c] = struct{}{}
	}
	e.setPending(c, t)
}

// unpend makes pending customer c no longer pending, its balance going out
// in the open transaction: its pending key is deleted, or, when this
// flushBalances wrote it and the committed state does not hold it
// (madePending), forgotten: the key then costs no changelog record at all,
// neither its value nor a tombstone, and the state after the transaction
// is the same. A crash before the commit loses neither the change (its
// account and its balance are in the transaction, or neither is) nor the
// pending customer (the committed state holds it as it did).
func (pt *partition) unpend(tx *stream.Tx, c string) {
	e := pt.ent
	if _, made := e.madePending[c]; made {
		tx.Forget(pendingKey(c))
	} else {
		tx.Delete(pendingKey(c))
	}
	e.dropPending(c)
}

// pendingDegree is the degree of entPart.pendingOrder's B-tree.
const pendingDegree = 32

// setPending makes c pending with time t, or sets the time of pending c.
func (e *entPart) setPending(c string, t int64) {
	if _, ok := e.pendingAt[c]; !ok {
		e.pendingOrder.ReplaceOrInsert(c, struct{}{})
	}
	e.pendingAt[c] = t
}

// dropPending makes c no longer pending.
func (e *entPart) dropPending(c string) {
	if _, ok := e.pendingAt[c]; ok {
		delete(e.pendingAt, c)
		e.pendingOrder.Delete(c)
	}
}

// changeTime returns the time of pending customer c's latest change: the
// later of its pending time and the time its account holds
// (makePending). After a restart, the pending time is the committed
// key's, which the account's completes.
func (pt *partition) changeTime(tx *stream.Tx, c string) (int64, error) {
	noted, err := pt.pr.ledger.ChangedAt(pt.ledger(tx), c)
	if err != nil {
		return 0, fmt.Errorf("aggregator: partition %d: account of %s: %w", pt.p, c, err)
	}
	return max(pt.ent.pendingAt[c], noted), nil
}

// brokerNow is the partition's broker time: the later of its watermark
// and the time up to which its entitlements partition has been read
// (every event decided arrived before it). It never goes back.
func (pt *partition) brokerNow() int64 { return max(pt.wm, pt.ent.readTo) }

// roundChunk adds to out the next chunk of the pending customers, and
// deletes their pending keys: an emission of the pending customers starts
// when the broker time is Config.BalanceInterval past the start of the last
// one (at once with BalanceEveryTransaction), and goes through them in key
// order, at most Config.FinalChunk a transaction (docs/design.md,
// Exactly-once, 7), with a cursor in the state; Work's transactions carry
// the rest. A customer that becomes pending behind the cursor waits for the
// next emission. (An empty customer ID, which dedup refuses, would go out
// in the first chunk only.)
func (pt *partition) roundChunk(tx *stream.Tx, out map[string]int64) error {
	e := pt.ent
	if e.roll.phase == rollBalances {
		// A period start's balances go out first (entWork, from the
		// transaction whose watermark entered the period): they reach
		// every customer with usage in the periods that ended, pending
		// ones included, each with its latest change and its pending key
		// deleted. Emitted here too, such a customer would get a second
		// balance of the new period, and a transaction a chunk of each.
		// The others wait for the end of those chunks.
		return nil
	}
	b := &e.bal
	if !b.active {
		now := pt.brokerNow()
		if len(e.pendingAt) == 0 || now < b.roundAt+max(pt.pr.cfg.BalanceInterval.Milliseconds(), 0) {
			return nil
		}
		b.active, b.roundAt, b.cursor = true, now, ""
	}
	// The next customers after the cursor, in key order (pendingOrder:
	// the pending set, loaded with the partition, kept with its keys),
	// and whether one is left after them.
	n := pt.pr.cfg.FinalChunk
	from := btreemap.Min[string]()
	if b.cursor != "" {
		from = btreemap.GT(b.cursor)
	}
	next, more := make([]string, 0, min(n, len(e.pendingAt))), false
	for c := range e.pendingOrder.Ascend(from, btreemap.Max[string]()) {
		e.visited++
		if len(next) == n {
			more = true
			break
		}
		next = append(next, c)
	}
	if more {
		b.cursor = next[n-1]
	} else {
		// Left pending: the customers that became pending behind the
		// cursor, for the next emission.
		b.active, b.cursor = false, ""
	}
	for _, c := range next {
		// Its latest change goes out now: it is no longer pending.
		t, err := pt.changeTime(tx, c)
		if err != nil {
			return err
		}
		out[c] = max(out[c], t)
		pt.unpend(tx, c)
	}
	tx.Put(keyBalances, b.encode())
	return nil
}

// needsTick reports whether the partition's entitlements read time must
// move: records wait in the gate, balances are pending, or records of
// usage.deduped came since the last tick (more are likely, and a tick
// already read lets them through at once). An idle partition appends none:
// a record that arrives waits in the gate until the next tick is appended
// and read back, and nothing else depends on the read time
// (docs/entitlements.md, The aggregator, 2: a tick decides only when, never
// how, an event is decided).
func (e *entPart) needsTick() bool { return e.gateN > 0 || len(e.pendingAt) > 0 || e.sawInput }

// punctuateEnt appends a tick to the partition's entitlements partition
// when it needs one (needsTick; always when its in-memory view may be
// ahead of the state, after an abort): once read back, its broker time
// lets the gate through every record that arrived before it, and moves
// the partition's broker time for its pending balances.
func (pt *partition) punctuateEnt(tx *stream.Tx) error {
	if !pt.stale && !pt.ent.needsTick() {
		return nil
	}
	pt.ent.sawInput = false
	v, err := encode(&schemas.Tick{InstanceID: pt.pr.cfg.Stream.InstanceID})
	if err != nil {
		return fmt.Errorf("aggregator: encode tick: %w", err)
	}
	tx.Emit(&kgo.Record{Topic: pt.pr.cfg.Topics.EntitlementsTopic(), Partition: pt.p, Key: []byte(schemas.TickKey), Value: v,
		Timestamp: pt.pr.now()})
	return nil
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
