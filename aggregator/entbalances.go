package aggregator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/RaduBerinde/btreemap"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
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

// rollState is the work of a period start: the balance of every customer
// with usage in the periods that ended since the last roll, or in the new
// one already (an event that arrived before the period start with its
// event_time after it), goes out as of the new period, then the usage of periods no event can reach
// any more is deleted, each in chunks of Config.FinalChunk (docs/design.md,
// Exactly-once, 7).
type rollState struct {
	cur int64 // start of the watermark's period; 0: no watermark yet
	// prev: rollBalances: the start of the period whose customers' balances
	// go out now; those of every period before it are out, those of the
	// periods after it, up to cur and cur's own, go out next.
	prev  int64
	phase byte // rollIdle, rollBalances, rollPrune
	// cursor: rollBalances: the last customer of prev emitted; rollPrune:
	// the last period index key deleted (Ledger.PrunePeriodsAfter).
	cursor string
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

// entWatermark starts the work of a period start when the watermark
// entered a new period: the balances of the customers with usage in every
// period from the one it left up to the new one, and in the new one
// (periods the watermark
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

// entHasWork reports whether the entitlements have chunked work: held
// events being released (entorder.go), records of the gate that can go
// through, a period start's, a default-plan record's sweep (entsweep.go),
// or pending balances going out (Flush emits their next chunk in Work's
// transaction).
func (pt *partition) entHasWork() bool {
	e := pt.ent
	return e != nil && (e.releasePending() || e.more || e.roll.phase != rollIdle || e.sweep.active || e.bal.active)
}

// entWork does one chunk of that work in tx. A period start's balances go
// before a sweep's chunks (their customers' balances, as of the sweep's
// time or later once it has noted it, then satisfy the sweep:
// balanceOutSince), and a sweep's before the pruning, which only bounds
// the state.
func (pt *partition) entWork(tx *stream.Tx) error {
	e := pt.ent
	if e.releasePending() {
		_, err := pt.continueRelease(tx, pt.pr.cfg.FinalChunk)
		return err
	}
	if e.more {
		return pt.drain(tx)
	}
	if e.sweep.active && e.roll.phase != rollBalances {
		return pt.sweepChunk(tx)
	}
	if e.roll.phase == rollIdle {
		return nil // pending balances: Flush emits their next chunk
	}
	n := pt.pr.cfg.FinalChunk
	work := "prune"
	switch e.roll.phase {
	case rollBalances:
		work = "balances"
		// The periods from prev up to cur, and cur's own customers (an
		// event that arrived before cur with its event_time in it, dedup's
		// skew, gave its customer usage in cur and a balance of the period
		// before, without it), in order, at most n customers and
		// maxRollPeriods periods a chunk. A period found empty once n are
		// reached is passed over in the same chunk (with 0 left, the scan
		// only says whether the period has a customer).
		budget := pt.pr.cfg.FinalChunkBytes
		for left, periods := n, 0; periods < maxRollPeriods && e.roll.phase == rollBalances; periods++ {
			cs, more, err := pt.pr.ledger.CustomersWithUsage(pt.ledger(tx), e.roll.prev, e.roll.cursor, left)
			if err != nil {
				return err
			}
			for i, c := range cs {
				if out, err := pt.balanceOutSince(tx, c, e.roll.cur); err != nil {
					return err
				} else if out {
					continue
				}
				e.emitNow[c] = max(e.emitNow[c], pt.wm)
				size, err := pt.balanceBytes(tx, c)
				if err != nil {
					return err
				}
				if budget -= size; budget <= 0 && i < len(cs)-1 {
					// About FinalChunkBytes of balances: the rest of
					// the period's customers go in the next chunk.
					cs, more = cs[:i+1], true
					break
				}
			}
			left -= len(cs)
			if budget <= 0 && !more {
				left = 0
			}
			if more {
				if len(cs) > 0 {
					e.roll.cursor = cs[len(cs)-1]
				}
				break
			}
			e.roll.cursor = ""
			if _, end := pt.pr.cfg.Period.Bounds(e.roll.prev); end <= e.roll.cur {
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

// balanceBytes returns the size of customer c's balance as of the
// watermark, encoded: what a chunk of balances counts against
// Config.FinalChunkBytes (a plan of many caps and grants makes a balance
// of tens of kilobytes).
func (pt *partition) balanceBytes(tx *stream.Tx, c string) (int, error) {
	b, err := pt.pr.ledger.Balance(pt.ledger(tx), c, pt.wm, 0)
	if err != nil {
		return 0, fmt.Errorf("aggregator: partition %d: balance of %s: %w", pt.p, c, err)
	}
	v, err := encode(b)
	if err != nil {
		return 0, fmt.Errorf("aggregator: partition %d: encode the balance of %s: %w", pt.p, c, err)
	}
	return len(v), nil
}

// pruneChunk prunes at most n customers' periods of the Ledger below the
// partition's prune horizon, after the roll's cursor (the last period
// index key the chunk before deleted), and its shared versions; the roll
// is idle once no period is left to prune.
func (pt *partition) pruneChunk(tx *stream.Tx, n int) error {
	r := &pt.ent.roll
	var after []byte
	if r.cursor != "" {
		after = []byte(r.cursor)
	}
	last, more, err := pt.pr.ledger.PrunePeriodsAfter(pt.ledger(tx), pt.pruneHorizon(), after, n)
	if err != nil {
		return err
	}
	if r.cursor = string(last); !more {
		r.phase, r.cursor = rollIdle, ""
	}
	return pt.pr.ledger.PruneShared(pt.ledger(tx), pt.pruneHorizon())
}

// balanceOutSince reports whether customer c's balance as of start or later
// is out and nothing changed c since: c is not pending, and its account
// notes a change at or after start (makePending), whose balance, as of that
// change or later, went out when c stopped being pending, or a balance as
// of start or later that went out (Ledger.BalanceAsOf). A period start's
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
// involved, and never before the customer's balance before it (its
// account notes the time: Ledger.BalanceAsOf), with the partition's next
// revision.
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
	var round []string
	if fenced {
		round = pt.roundChunk(tx, out)
	}
	if len(out) == 0 {
		return nil
	}
	topic := pt.pr.cfg.Topics.BalancesTopic()
	rev, budget := e.bal.rev, pt.pr.cfg.FinalChunkBytes
	next, stopped, emitted := 0, false, 0
	for _, c := range slices.Sorted(maps.Keys(out)) {
		if next < len(round) && round[next] == c {
			next++
			if next > 1 && budget <= 0 {
				// The round's chunk stops once the transaction's
				// balances reach Config.FinalChunkBytes, after at
				// least one of its customers: the rest stay pending,
				// for the next chunk.
				if !stopped {
					e.bal.active, e.bal.cursor, stopped = true, round[next-2], true
				}
				continue
			}
		}
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
		at, err := pt.pr.ledger.BalanceAsOf(pt.ledger(tx), c, max(pt.wm, out[c]), pt.wm)
		if err != nil {
			return fmt.Errorf("aggregator: partition %d: account of %s: %w", pt.p, c, err)
		}
		b, err := pt.pr.ledger.Balance(pt.ledger(tx), c, at, rev)
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
		budget -= len(key) + len(val)
		emitted++
	}
	e.bal.rev = rev
	tx.Put(keyBalances, e.bal.encode())
	pt.txc.Add(pt.pr.m.balances, float64(emitted))
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
// the rest. It returns the chunk's customers that out did not hold, in
// key order, added to out: flushBalances emits them, and ends the chunk
// early (the cursor at its last customer that went out) once the
// transaction's balances reach Config.FinalChunkBytes (their encoded
// size, known only as they go out). A customer that becomes pending
// behind the cursor waits for the next emission. (An empty customer ID, which dedup refuses, would go out
// in the first chunk only.)
func (pt *partition) roundChunk(tx *stream.Tx, out map[string]int64) []string {
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
		// The interval is past by the partition's broker time, or by the
		// broker times read from its entitlements partition since the
		// last emission started: after a broker clock that jumped ahead
		// and stepped back, the partition's broker time stays where the
		// jump took it, while the ticks appended since move on from the
		// earlier time (TestBalancesAfterBrokerClockJumpedBack).
		now, iv := pt.brokerNow(), max(pt.pr.cfg.BalanceInterval.Milliseconds(), 0)
		if len(e.pendingAt) == 0 || now < b.roundAt+iv && e.lastRead < e.roundRead+iv {
			return nil
		}
		b.active, b.roundAt, b.cursor = true, now, ""
		e.roundRead = e.lastRead
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
	// flushBalances emits them, each with its latest change, and deletes
	// their pending keys; the ones out has already go out anyway.
	round := next[:0]
	for _, c := range next {
		if _, ok := out[c]; !ok {
			out[c] = 0
			round = append(round, c)
		}
	}
	tx.Put(keyBalances, b.encode())
	return round
}

// needsTick reports whether the partition's entitlements read time must
// move: records wait in the gate, or balances are pending. A partition
// catching up on records that arrived before its last tick read, or an
// idle one, appends none: those records pass the gate as they come, and
// a tick would let nothing through while it widens the transaction by the
// entitlements partition (TestBacklogAppendsNoTicks). A record that
// arrives after the read time waits in the gate until the next tick is
// appended and read back, and nothing else depends on the read time
// (docs/entitlements.md, The aggregator, 2: a tick decides only when, never
// how, an event is decided).
func (e *entPart) needsTick() bool { return e.gateN > 0 || len(e.pendingAt) > 0 }

// punctuateEnt appends a tick to the partition's entitlements partition
// when it needs one (needsTick; always when its in-memory view may be
// ahead of the state, after an abort): once read back, its broker time
// lets the gate through every record that arrived before it, and moves
// the partition's broker time for its pending balances.
func (pt *partition) punctuateEnt(tx *stream.Tx) error {
	if !pt.stale && !pt.ent.needsTick() {
		return nil
	}
	v, err := encode(&schemas.Tick{InstanceID: pt.pr.cfg.Stream.InstanceID})
	if err != nil {
		return fmt.Errorf("aggregator: encode tick: %w", err)
	}
	tx.Emit(&kgo.Record{Topic: pt.pr.cfg.Topics.EntitlementsTopic(), Partition: pt.p, Key: []byte(schemas.TickKey), Value: v,
		Timestamp: pt.pr.now()})
	return nil
}
