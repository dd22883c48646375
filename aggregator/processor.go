package aggregator

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/prom"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// processor is the aggregator's stream.Processor; partition its
// stream.Partition: the in-memory view of one usage.deduped partition (its
// watermarks, final periods and a cache of OPEN aggregates) and the
// runtime's hooks. Events and watermarks are handled in events.go, final
// periods in finalize.go.
type processor struct {
	cfg             Config
	aggregatesTopic string // cfg.Topics.AggregatesTopic(), made once
	log             *zap.Logger
	counts          partitionCountsT
	m               *metrics
	now             func() time.Time
	owners          prom.Owners          // which open partition owns its gauges
	ledger          *entitlements.Ledger // nil: Config.Entitlements is off
	plans           planLabels
	tally           entTally // the committed decisions, for the status page
}

type partition struct {
	pr      *processor
	p       int32
	pl      string
	sources []int64 // latest watermark per usage.events partition; 0: none
	wm      int64   // partition watermark: min over sources
	// keys counts the partition's 'a' and 'f' state keys (the
	// meterline_aggregate_state_keys gauge), as the state and the open
	// transaction have them; keysSaved is the count keyKeyCount holds in
	// them. Flush writes keyKeyCount when they differ, so the count is
	// committed with the keys it counts and load reads it instead of
	// scanning them.
	keys, keysSaved int
	// finals holds the marker of every period final in this partition
	// (few: one per period until its end + W + B + S), as the state and the open
	// transaction have them; lastFinal is the latest of them, if hasFinal
	// (putFinal, dropFinal).
	finals    map[int64]*periodState
	lastFinal int64
	hasFinal  bool
	// open caches OPEN aggregates (keyed by their state key) across
	// transactions, so that an event of a busy key costs no Pebble read, no
	// decode and no key split. Each equals the state as this partition's
	// transactions left it, plus the changes of the open transaction to
	// dirty aggregates, which reach the transaction (tx.Put) only in Flush
	// or materialize. An aborted transaction clears it; deciding a period
	// final drops the period's aggregates; overflow (maxCachedOpen) drops
	// clean ones.
	open map[string]*openAgg
	// dirty lists the aggregates the open transaction changed, in the
	// order it first changed them; Flush emits their revisions in that
	// order.
	dirty []*openAgg
	nSeen int // values in the seen sets of open, at most maxCachedSeen
	// Scratch buffers: the aggregate key K of the event being handled, its
	// OPEN aggregate's state key (or K within it: openKey), a unique-value
	// key and an encoded state (tx.Put copies).
	akBuf, okBuf, uBuf, stBuf []byte
	// The period of the last Bounds call: events arrive in runs of one
	// period.
	bStart, bEnd int64
	bOK          bool
	ev           schemas.DedupedEvent // the event being handled, reused
	charge       charge               // the charge of the event being decided, reused (decideEvent)
	keysGauge    prometheus.Gauge
	pendingGauge prometheus.Gauge // periods whose FINALs or queued adjustments are still going out
	wmGauge      prometheus.Gauge // nil until the first watermark
	due          dueRefresh       // the final-due gauge's last refresh (due.go)
	// Ignored watermark records since the last log line, and its time.
	wmIgnored      int
	wmIgnoredLogAt time.Time
	// stale: a transaction this partition took part in was aborted, so
	// sources, wm and keys (in memory, advanced by its records) may be
	// ahead of the committed state. Process reloads them from the state
	// before the re-consumed records are handled.
	stale bool
	// decideDue: the state opened (or reloaded after an abort) may hold
	// OPEN aggregates or queued events of a period the watermark already
	// passed by end + the configured grace (undecidedDue); the next
	// transaction this partition takes part in decides it final
	// (decideLoaded).
	decideDue bool
	// writeScheme: the state is new; the next transaction records the key
	// scheme (keyKeyScheme) in it.
	writeScheme bool
	// writeEntMode: the state does not record entitlements on yet
	// (checkEntMode); the next transaction records it.
	writeEntMode bool
	// writePeriod: the state does not record its billing period yet
	// (checkPeriod); the next transaction records it.
	writePeriod bool
	// writeCounts: the state does not record the partition counts it is
	// built with yet (checkPartitionCounts); the next transaction records
	// them.
	writeCounts bool
	// defs holds the periods and meters whose definition the state and
	// the open transaction record ('M' P meter, meterdef.go);
	// defsPending those of state built before definitions were recorded,
	// and writeDefsMark that keyMeterDefs is not written yet: the next
	// transaction records them (writeMeterDefs).
	defs          map[defKey]struct{}
	defsPending   []defKey
	writeDefsMark bool
	// refused: reject was called; event reads it to keep the charge of
	// an event its aggregate refused out of the transaction, and
	// bookChunk to refund the charge of a queued event its booking
	// refused.
	refused bool
	// queued: the state key of the charge (pfxCharge) of the event place
	// queued last; nil when the last event was not queued.
	queued []byte
	// rejCounter counts the rejections of reason rejReason (reject): the
	// metric's child of the last reason, kept.
	rejReason  string
	rejCounter prometheus.Counter
	// txc: the open transaction's counts (rejections, late events,
	// revisions, balances, chunks, ignored watermarks), and finalDelays its
	// finalization delays: added to the metrics when it commits
	// (Committed), dropped when it aborts (docs/operations.md, Health,
	// metrics and logs: a record processed again after an abort is counted
	// once).
	txc         prom.TxCounts
	finalDelays []float64
	// rej is the Rejected record being encoded (rejectedRecord), reused;
	// recs the rest of the slab of records newRecord hands out; rejTopic
	// the full name of usage.rejected, made at the first rejection.
	rej      schemas.Rejected
	rejSums  [2 * sha256.Size]byte
	recs     []kgo.Record
	rejTopic string
	// ent is the entitlements view (entitlements.go); nil when they are
	// off.
	ent *entPart
}

// stateReader is what Open (restored state) and a transaction both offer.
type stateReader interface {
	Get(k []byte) ([]byte, bool, error)
	Scan(lo, hi []byte, fn func(k, v []byte) error) error
}

// Open loads the watermarks from the restored state.
func (pr *processor) Open(p int32, st *stream.PartitionState) (stream.Partition, error) {
	pt := &partition{pr: pr, p: p, pl: strconv.Itoa(int(p)), open: map[string]*openAgg{}}
	pr.owners.Own(p, pt)
	pt.keysGauge = pr.m.keys.WithLabelValues(pt.pl)
	pt.pendingGauge = pr.m.finalizing.WithLabelValues(pt.pl)
	if err := pt.load(st); err != nil {
		return nil, err
	}
	var err error
	if pt.decideDue, err = pt.undecidedDue(st); err != nil {
		return nil, err
	}
	pt.publish()
	pt.refreshFinalDue(st, true)
	return pt, nil
}

// load checks the key scheme and sets the in-memory watermarks and key
// count from the state.
func (pt *partition) load(st stateReader) error {
	if err := pt.checkKeyScheme(st); err != nil {
		return err
	}
	if err := pt.checkEntMode(st); err != nil {
		return err
	}
	if err := pt.checkPartitionCounts(st); err != nil {
		return err
	}
	if err := pt.checkPeriod(st); err != nil {
		return err
	}
	pt.keys, pt.finals, pt.hasFinal = 0, map[int64]*periodState{}, false
	if err := st.Scan([]byte{pfxMarker}, []byte{pfxMarker + 1}, func(k, v []byte) error {
		ps, err := decodePeriodState(v)
		if err != nil {
			return fmt.Errorf("%w (partition %d, key %q)", err, pt.p, k)
		}
		pt.putFinal(int64(binary.BigEndian.Uint64(k[1:9])), ps)
		return nil
	}); err != nil {
		return err
	}
	if err := pt.loadMeterDefs(st); err != nil {
		return err
	}
	// One slot per partition of usage.events, as the cluster's metadata
	// says (docs/design.md, Time). A source watermark of another count
	// (state written before the count came from metadata) is left out.
	pt.sources = make([]int64, pt.pr.counts.events)
	err := st.Scan([]byte{pfxSource}, []byte{pfxSource + 1}, func(k, v []byte) error {
		if len(k) != 5 || len(v) != 8 {
			return fmt.Errorf("aggregator: partition %d: corrupt source watermark %q", pt.p, k)
		}
		if s := int(binary.BigEndian.Uint32(k[1:])); s < len(pt.sources) {
			pt.sources[s] = int64(binary.BigEndian.Uint64(v))
		}
		return nil
	})
	if err != nil {
		return err
	}
	pt.wm = minWatermark(pt.sources)
	if pt.pr.ledger != nil {
		if err := pt.loadEnt(st); err != nil {
			return err
		}
	}
	return pt.loadKeyCount(st)
}

// loadKeyCount sets the key count from keyKeyCount. State without it
// (built before the count was kept, or that never had an 'a' or 'f' key)
// is counted with a scan, once: absent reads as 0, so the next
// transaction records any other count (saveKeyCount).
func (pt *partition) loadKeyCount(st stateReader) error {
	v, ok, err := st.Get(keyKeyCount)
	switch {
	case err != nil:
		return err
	case ok && len(v) == 8 && int64(binary.BigEndian.Uint64(v)) >= 0:
		pt.keys = int(binary.BigEndian.Uint64(v))
		pt.keysSaved = pt.keys
		return nil
	case ok:
		return fmt.Errorf("aggregator: partition %d: corrupt state key count %x", pt.p, v)
	}
	pt.keys, pt.keysSaved = 0, 0
	for _, pfx := range []byte{pfxOpen, pfxFinal} {
		if err := st.Scan([]byte{pfx}, []byte{pfx + 1}, func(_, _ []byte) error { pt.keys++; return nil }); err != nil {
			return err
		}
	}
	return nil
}

// saveKeyCount writes the key count into the transaction if it changed
// since the state recorded it: once per transaction, from Flush, which
// runs in every transaction this partition takes part in. An aborted
// transaction drops the write with the keys it counted (Abort, then load).
func (pt *partition) saveKeyCount(tx *stream.Tx) {
	if pt.keys == pt.keysSaved {
		return
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(pt.keys))
	tx.Put(keyKeyCount, b[:])
	pt.keysSaved = pt.keys
}

// ErrPartitionCountChanged is returned (wrapped) when usage.deduped or
// usage.entitlements has another partition count than the one the state
// was built with: customers would be routed to other partitions than the
// one that holds their aggregates, caps and credits.
var ErrPartitionCountChanged = errors.New("partition count changed")

// encodeRecorded is keyPartitionCounts' value: the partition count of
// usage.deduped, then, with entitlements on, usage.entitlements' (4 bytes
// big-endian each).
func (c partitionCountsT) encodeRecorded(ent bool) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(c.deduped))
	if ent {
		b = binary.BigEndian.AppendUint32(b, uint32(c.entitlements))
	}
	return b
}

// checkPartitionCounts refuses state built with another partition count of
// usage.deduped or usage.entitlements than the cluster's (docs/design.md,
// Exactly-once, "Co-partitioned inputs"; dedup does so for usage.events,
// docs/design.md, Event identity and keys): a customer's records are in the
// partition of its framed ID modulo the count, so with another count its
// new events and entitlements go to another partition than its aggregates,
// cap usage and credits, which would start again from zero there. State
// that does not record the counts (new, or built before they were recorded)
// gets them in its next transaction; so does the count of
// usage.entitlements when entitlements are turned on for state that records
// only usage.deduped's.
//
// A partition past the counts the stage started with (partitions added
// while it runs, which the group assigns at its next rebalance) is
// refused too: the stage routes and checks by those counts until it
// restarts, and the new partition's state is empty.
func (pt *partition) checkPartitionCounts(st stateReader) error {
	ent := pt.pr.ledger != nil
	c := pt.pr.counts
	if pt.p >= c.deduped || ent && pt.p >= c.entitlements {
		return fmt.Errorf("aggregator: partition %d: %w: partitions were added to %s or %s while the stage ran (it started with %d and %d). "+
			"Customers would move to other partitions than their aggregates, caps and credits (docs/entitlements.md, Topics): "+
			"put the partition counts back, or run on new topic names and a new consumer group",
			pt.p, ErrPartitionCountChanged, pt.pr.cfg.Topics.DedupedTopic(), pt.pr.cfg.Topics.EntitlementsTopic(), c.deduped, c.entitlements)
	}
	v, ok, err := st.Get(keyPartitionCounts)
	switch {
	case err != nil:
		return err
	case !ok:
		pt.writeCounts = true
		return nil
	case len(v) != 4 && len(v) != 8:
		return fmt.Errorf("aggregator: partition %d: corrupt partition counts in the state (%d bytes)", pt.p, len(v))
	}
	deduped, entN := int32(binary.BigEndian.Uint32(v)), int32(-1)
	if len(v) == 8 {
		entN = int32(binary.BigEndian.Uint32(v[4:]))
	}
	if deduped != c.deduped || ent && entN >= 0 && entN != c.entitlements {
		was := fmt.Sprintf("%d partitions of %s", deduped, pt.pr.cfg.Topics.DedupedTopic())
		now := fmt.Sprintf("%d", c.deduped)
		if entN >= 0 {
			was += fmt.Sprintf(" and %d of %s", entN, pt.pr.cfg.Topics.EntitlementsTopic())
			if ent {
				now += fmt.Sprintf(" and %d", c.entitlements)
			}
		}
		return fmt.Errorf("aggregator: partition %d: %w: the state in %s was built with %s; they now have %s. "+
			"Customers would move to other partitions than their aggregates, caps and credits (docs/entitlements.md, Topics): "+
			"put the partition counts back, or run on new topic names and a new consumer group",
			pt.p, ErrPartitionCountChanged, pt.pr.cfg.Topics.AggregateChangelogTopic(), was, now)
	}
	pt.writeCounts = ent && entN < 0
	return nil
}

// ErrPeriodChanged is returned (wrapped) when the configured billing
// period is not the one the state was built with (checkPeriod).
var ErrPeriodChanged = errors.New("the billing period is not the one the state was built with")

// checkPeriod refuses state built with another billing period than
// Config.Period: its keys hold period starts whose ends come from the
// configured period, so a month's aggregate would be finalized as the day
// it starts with, carrying the month's usage so far, and the rest of the
// month counted into other periods. State without a period (new, or
// built before the period was recorded) gets it in its next transaction
// (writePeriod).
func (pt *partition) checkPeriod(st stateReader) error {
	v, ok, err := st.Get(keyPeriod)
	switch {
	case err != nil:
		return err
	case !ok:
		pt.writePeriod = true
		return nil
	case string(v) != string(pt.pr.cfg.Period):
		if len(v) > 64 {
			v = v[:64]
		}
		return fmt.Errorf("aggregator: partition %d: %w: the state in %s was built with --period %q, this aggregator runs with %q; "+
			"run it with --period %q, or with the new period on new topic names and a new consumer group",
			pt.p, ErrPeriodChanged, pt.pr.cfg.Topics.AggregateChangelogTopic(), v, pt.pr.cfg.Period, v)
	}
	pt.writePeriod = false
	return nil
}

// errStateFound stops checkKeyScheme's scan at the first key.
var errStateFound = errors.New("state found")

// checkKeyScheme refuses state built from another key scheme of
// usage.deduped than schemas.DedupedKeyScheme (docs/design.md, Topics): a
// customer's aggregates would then sit in other partitions than its new
// events. State without a scheme and with any key of its own was built
// before schemes were recorded (keyed by customer and meter), and is
// refused too; new state gets the scheme in its first transaction
// (writeScheme).
func (pt *partition) checkKeyScheme(st stateReader) error {
	v, ok, err := st.Get(keyKeyScheme)
	if err != nil {
		return err
	}
	if ok {
		if string(v) == schemas.DedupedKeyScheme {
			pt.writeScheme = false
			return nil
		}
		if len(v) > 64 {
			v = v[:64]
		}
		return fmt.Errorf("aggregator: partition %d: %w: the state in %s records the key scheme %q, this version reads %s keyed by %q; "+
			"run it on new topic names and a new consumer group (docs/design.md, Topics)",
			pt.p, schemas.ErrKeyScheme, pt.pr.cfg.Topics.AggregateChangelogTopic(), v, pt.pr.cfg.Topics.DedupedTopic(), schemas.DedupedKeyScheme)
	}
	// The runtime's own keys start with 0xFF (stream.keyInputOffset).
	err = st.Scan(nil, []byte{0xff}, func(_, _ []byte) error { return errStateFound })
	switch {
	case errors.Is(err, errStateFound):
		return fmt.Errorf("aggregator: partition %d: %w: the state in %s was built from %s keyed by customer and meter, this version reads it keyed by %q; "+
			"run it on new topic names (the default names changed with the key) and a new consumer group (docs/design.md, Topics)",
			pt.p, schemas.ErrKeyScheme, pt.pr.cfg.Topics.AggregateChangelogTopic(), pt.pr.cfg.Topics.DedupedTopic(), schemas.DedupedKeyScheme)
	case err != nil:
		return err
	}
	pt.writeScheme = true
	return nil
}

// checkEntMode refuses to open, with entitlements off, a partition whose
// state was built with them on (docs/entitlements.md, The aggregator): its
// gated records would stay in the state forever with their input offsets
// committed (their usage lost), and its cap and credit usage would miss
// every event counted meanwhile if they were turned on again. State with
// entitlements on records the mode (keyEntMode, written in the partition's
// first transaction); state from before the mode was recorded is recognised
// by its gate and ledger keys.
//
// With entitlements on, it refuses state whose Ledger keeps another
// layout than this version's (ErrLedgerLayout): a mode other than
// entModeOn, or no mode and gate or ledger keys (state from before the
// mode was recorded). Read as this layout, its usage and grants would
// read as zero: caps and credits would start again.
func (pt *partition) checkEntMode(st stateReader) error {
	v, ok, err := st.Get(keyEntMode)
	if err != nil {
		return err
	}
	found := ok
	for _, pfx := range []byte{pfxGate, pfxLedger} {
		if found {
			break
		}
		err := st.Scan([]byte{pfx}, []byte{pfx + 1}, func(_, _ []byte) error { return errStateFound })
		switch {
		case errors.Is(err, errStateFound):
			found = true
		case err != nil:
			return err
		}
	}
	if pt.pr.ledger != nil {
		switch {
		case ok && string(v) == entModeOn:
			pt.writeEntMode = false
			return nil
		case found:
			mode := "none recorded"
			if ok {
				if len(v) > 64 {
					v = v[:64]
				}
				mode = strconv.Quote(string(v))
			}
			return fmt.Errorf("aggregator: partition %d: %w: the state in %s was built by an earlier version (entitlements mode %s), "+
				"which kept a state key per grant state, meter and period; this version keeps one account per customer (%q) and "+
				"cannot read it; run it on new topic names and a new consumer group (docs/entitlements.md, The aggregator)",
				pt.p, ErrLedgerLayout, pt.pr.cfg.Topics.AggregateChangelogTopic(), mode, entModeOn)
		}
		pt.writeEntMode = true
		return nil
	}
	if !found {
		return nil
	}
	gated := 0
	if err := st.Scan([]byte{pfxGate}, []byte{pfxGate + 1}, func(_, _ []byte) error { gated++; return nil }); err != nil {
		return err
	}
	return fmt.Errorf("aggregator: partition %d: %w: the state in %s was built with --entitlements and holds %d records of %s "+
		"waiting for their decision and the entitlements usage of the period; run the aggregator with --entitlements "+
		"(turning entitlements off needs a new consumer group and topic names: docs/entitlements.md, The aggregator)",
		pt.p, ErrEntitlementsOff, pt.pr.cfg.Topics.AggregateChangelogTopic(), gated, pt.pr.cfg.Topics.DedupedTopic())
}

// ErrEntitlementsOff is returned (wrapped) by an aggregator run without
// entitlements on state built with them (checkEntMode).
var ErrEntitlementsOff = errors.New("entitlements are off but the state was built with them on")

// ErrLedgerLayout is returned (wrapped) by an aggregator run with
// entitlements on state whose entitlements Ledger keeps an earlier layout
// (checkEntMode).
var ErrLedgerLayout = errors.New("the state keeps the entitlements ledger in a layout this version does not read")

func minWatermark(s []int64) int64 {
	if len(s) == 0 {
		return 0
	}
	m := s[0]
	for _, v := range s[1:] {
		if v < m {
			m = v
		}
	}
	return m
}

func (pt *partition) publish() {
	pt.keysGauge.Set(float64(pt.keys))
	n := 0
	for _, ps := range pt.finals {
		if ps.phase == phaseEmit || ps.phase == phaseBook {
			n++
		}
	}
	pt.pendingGauge.Set(float64(n))
	// Once any source has forwarded a watermark, the gauge is there: at 0
	// while another source never has (no period can be final), so that
	// MeterlineWatermarkStopped sees that source stuck.
	if pt.wm > 0 || slices.ContainsFunc(pt.sources, func(w int64) bool { return w > 0 }) {
		if pt.wmGauge == nil {
			pt.wmGauge = pt.pr.m.watermark.WithLabelValues(pt.pl)
		}
		pt.wmGauge.Set(float64(pt.wm) / 1000)
	}
	pt.publishHold()
}

// bounds is cfg.Period.Bounds, remembering the last period.
func (pt *partition) bounds(ms int64) (start, end int64) {
	if pt.bOK && ms >= pt.bStart && ms < pt.bEnd {
		return pt.bStart, pt.bEnd
	}
	pt.bStart, pt.bEnd = pt.pr.cfg.Period.Bounds(ms)
	pt.bOK = true
	return pt.bStart, pt.bEnd
}

// Close implements stream.Partition.
func (pt *partition) Close() {
	if !pt.pr.owners.Release(pt.p, pt) {
		return // a newer instance of the partition owns the gauges
	}
	pt.pr.m.keys.DeleteLabelValues(pt.pl)
	pt.pr.m.finalizing.DeleteLabelValues(pt.pl)
	pt.pr.m.watermark.DeleteLabelValues(pt.pl)
	pt.pr.m.finalDue.DeleteLabelValues(pt.pl)
	pt.pr.m.readTo.DeleteLabelValues(pt.pl)
	pt.pr.m.pendingBalances.DeleteLabelValues(pt.pl)
	pt.pr.m.gated.DeleteLabelValues(pt.pl)
	pt.pr.m.held.DeleteLabelValues(pt.pl)
	pt.pr.m.heldOldest.DeleteLabelValues(pt.pl)
}

// Punctuate implements stream.Partition: with entitlements, it appends a
// tick to the partition's entitlements partition when the partition needs
// its read time to move (needsTick, entbalances.go). The aggregation is
// driven by the watermark records in its input, never by a timer.
func (pt *partition) Punctuate(tx *stream.Tx) error {
	if pt.ent == nil {
		return nil
	}
	pt.publishEnt()
	return pt.punctuateEnt(tx)
}

// Process implements stream.Partition.
func (pt *partition) Process(tx *stream.Tx, recs []*kgo.Record) error {
	pt.publishEnt()
	if pt.stale {
		// After an aborted transaction the input is re-consumed from the
		// committed offset. Without this reload, a re-consumed watermark
		// record would compare against the aborted transaction's in-memory
		// watermark, look old, and never decide the FINAL it decided
		// before (nor persist the source watermark).
		if err := pt.load(tx); err != nil {
			return err
		}
		// The aborted transaction may have been the one that decided
		// what the loaded state left due (decideLoaded).
		pt.stale, pt.decideDue = false, true
	}
	pt.writeFirst(tx)
	if err := pt.decideLoaded(tx); err != nil {
		return err
	}
	if len(pt.open) > maxCachedOpen+len(pt.dirty) {
		pt.evictClean()
	}
	if err := pt.checkArrival(tx, recs); err != nil {
		return err
	}
	if pt.ent != nil && len(recs) > 0 {
		// The transaction commits this partition's input offset: the
		// group generation fences it (flushBalances).
		pt.ent.fenced = true
	}
	if pt.ent != nil && len(recs) > 0 && recs[0].Topic != pt.pr.cfg.Topics.DedupedTopic() {
		if err := pt.entRecords(tx, recs); err != nil {
			return err
		}
		recs = nil
	}
	if pt.ent != nil && len(recs) > 0 {
		if err := pt.drainAhead(tx, len(recs)); err != nil {
			return err
		}
	}
	for _, r := range recs {
		decoded := false
		if pt.ent != nil {
			var gated bool
			if gated, decoded = pt.gateIn(tx, r); gated {
				continue
			}
		}
		if err := pt.dispatch(tx, r, decoded); err != nil {
			return err
		}
	}
	if pt.ent != nil {
		pt.pr.m.gated.WithLabelValues(pt.pl).Set(float64(pt.ent.gateN))
	}
	pt.publish()
	pt.refreshFinalDue(tx, false)
	return nil
}

// writeFirst records in tx what the state does not record yet (load's
// checks set the flags): the key scheme, the entitlements mode, the
// partition counts, the period and the meter definitions. Every
// transaction that may write state (Process, Work) calls it before its
// own writes: state committed without them would be refused when the
// partition opens again (checkKeyScheme reads keys without a scheme as
// state of the old scheme), as after a first transaction that aborted
// and a Work transaction that committed.
func (pt *partition) writeFirst(tx *stream.Tx) {
	if pt.writeScheme {
		tx.Put(keyKeyScheme, []byte(schemas.DedupedKeyScheme))
		pt.writeScheme = false
	}
	if pt.writeEntMode {
		tx.Put(keyEntMode, []byte(entModeOn))
		pt.writeEntMode = false
	}
	if pt.writeCounts {
		tx.Put(keyPartitionCounts, pt.pr.counts.encodeRecorded(pt.pr.ledger != nil))
		pt.writeCounts = false
	}
	if pt.writePeriod {
		tx.Put(keyPeriod, []byte(pt.pr.cfg.Period))
		pt.writePeriod = false
	}
	pt.writeMeterDefs(tx)
}

// Committed implements stream.Committer: the committed transaction's
// counts go to the metrics.
func (pt *partition) Committed() {
	pt.txc.Commit()
	for _, d := range pt.finalDelays {
		pt.pr.m.finalDelay.Observe(d)
	}
	pt.finalDelays = pt.finalDelays[:0]
	pt.publishEnt()
}

// Abort forgets the aggregates an aborted transaction changed and its
// counts, and marks the in-memory watermarks for a reload from the
// committed state.
func (pt *partition) Abort() {
	pt.txc.Drop()
	pt.finalDelays = pt.finalDelays[:0]
	if pt.ent != nil {
		pt.ent.clearChanged()
		clear(pt.ent.emitNow)
		pt.ent.fenced = false
		pt.ent.clearCache()
		pt.ent.dropHeld()
		pt.ent.dropTimelines()
		pt.ent.pending.clear()
		pt.ent.flushed.clear()
		pt.endHold()
		// The records the aborted transaction put in the gate are read
		// again with its input.
		clear(pt.ent.fresh)
		pt.ent.fresh, pt.ent.freshHead = pt.ent.fresh[:0], 0
	}
	clear(pt.dirty)
	pt.dirty = pt.dirty[:0]
	clear(pt.open)
	pt.nSeen = 0
	pt.stale = true
}

// maxCachedOpen bounds the clean OPEN aggregates kept per partition (about
// 300 bytes each); maxCachedSeen the UNIQUE_COUNT values they remember.
const (
	maxCachedOpen = 1 << 15
	maxCachedSeen = 1 << 16
)

// openAgg is a cached OPEN aggregate: its state key, period and decoded
// state, what its revisions share (out), made once when it is loaded, and
// the UNIQUE_COUNT values it is known to have seen. The fields an event
// reads come first, its key's bytes among them (keyBuf), so that a
// lookup and the event read a few adjacent cache lines of one object.
type openAgg struct {
	// held is its customer's entry of the partition's accounts while
	// heldGen is the partition's (entPart.seedHeld, linkHeld).
	held    *heldAccount
	heldGen uint64
	// dirty: changed by the open transaction and listed in
	// partition.dirty; Flush writes the state and emits the revision.
	dirty bool
	st    aggState
	// keyBuf holds key when it fits: key and the aggregate's key in
	// partition.open are then its bytes, which are never written after
	// newOpenAgg.
	keyBuf [openKeyInline]byte
	key    []byte // 'a' P K
	start  int64
	out    aggOut
	// seen holds values of the meter's UNIQUE_COUNT property whose 'u' key
	// exists in the committed state or the open transaction: facts that
	// only an abort (which drops the cache) or the period's expiry (long
	// after its aggregates left the cache at FINAL) undo.
	seen map[string]struct{}
}

// openKeyInline is the longest state key an openAgg holds in itself
// (keyBuf); a longer one has memory of its own.
const openKeyInline = 64

// newOpenAgg returns the OPEN aggregate of state key k (copied) and the
// key partition.open keeps it under: its key's bytes, shared.
func newOpenAgg(k []byte, start int64, st *aggState, out aggOut) (*openAgg, string) {
	a := &openAgg{start: start, st: *st, out: out}
	if len(k) <= openKeyInline {
		a.key = append(a.keyBuf[:0:len(k)], k...)
	} else {
		a.key = bytes.Clone(k)
	}
	return a, unsafe.String(unsafe.SliceData(a.key), len(a.key))
}

// evictClean drops the aggregates the open transaction did not change.
func (pt *partition) evictClean() {
	for k, a := range pt.open {
		if !a.dirty {
			pt.drop(k, a)
		}
	}
}

func (pt *partition) drop(k string, a *openAgg) {
	delete(pt.open, k)
	pt.nSeen -= len(a.seen)
}

// openAggregate returns the OPEN aggregate with state key k (a scratch
// buffer, copied if kept) through the cache, loading it from the state or
// making a fresh one (fresh) on a miss.
func (pt *partition) openAggregate(tx *stream.Tx, k []byte, start int64) (a *openAgg, fresh bool, err error) {
	if a, ok := pt.open[string(k)]; ok {
		return a, false, nil
	}
	st, ok, err := pt.loadState(tx, k)
	if err != nil {
		return nil, false, err
	}
	if !ok {
		st = &aggState{}
		pt.keys++
	}
	out, err := pt.aggOutput(k)
	if err != nil {
		return nil, false, err
	}
	a, ak := newOpenAgg(k, start, st, out)
	pt.open[ak] = a
	return a, !ok, nil
}

// materialize writes the cached state of every aggregate this transaction
// changed into the transaction, for a reader of the state itself (the
// scans of finalize, and the FINAL chunks, which read a decided period's
// values from it). The aggregates stay dirty: Flush still emits their OPEN
// revisions, unless their period is decided final.
func (pt *partition) materialize(tx *stream.Tx) {
	for _, a := range pt.dirty {
		if a.dirty {
			pt.stBuf = a.st.appendTo(pt.stBuf[:0])
			tx.Put(a.key, pt.stBuf)
		}
	}
}

// Flush emits one OPEN revision per aggregate this transaction changed, and
// writes its state. The revisions' values share one buffer, and their
// records one slice.
func (pt *partition) Flush(tx *stream.Tx) error {
	if pt.stale {
		// An aborted transaction's memory, not reloaded yet: the open
		// transaction neither processed nor worked this partition (both
		// reload it first), only punctuated it, which changes nothing
		// here. Its memory (the gate's records held since, the key
		// count) must not reach the state: the aborted transaction's
		// input is re-read.
		return nil
	}
	pt.saveKeyCount(tx)
	if pt.ent != nil {
		if err := pt.flushBalances(tx); err != nil {
			return err
		}
		// Last: whatever changed an account or versions in this
		// transaction has.
		pt.flushAccounts(tx)
		pt.flushTimelines(tx)
		// The records still in the gate that entered it in this
		// transaction; the records gated from now on enter it in the
		// next one.
		pt.flushGate(tx)
		pt.endHold()
	}
	n, size := 0, 0
	for _, a := range pt.dirty {
		if a.dirty {
			n++
			size += len(a.out.head) + schemas.AggregateTailMax
		}
	}
	if n == 0 {
		pt.dirty = pt.dirty[:0]
		return nil
	}
	recs := make([]kgo.Record, n)
	buf := make([]byte, 0, size)
	i := 0
	for _, a := range pt.dirty {
		if !a.dirty {
			continue // its period was decided final in this transaction
		}
		a.dirty = false
		a.st.Revision++
		pt.stBuf = a.st.appendTo(pt.stBuf[:0])
		tx.Put(a.key, pt.stBuf)
		var err error
		if buf, err = pt.emitRevision(tx, &recs[i], buf, &a.out, pt.wm, &a.st, schemas.StatusOpen); err != nil {
			return err
		}
		i++
	}
	pt.txc.Add(pt.pr.m.emittedOpen, float64(n))
	clear(pt.dirty)
	pt.dirty = pt.dirty[:0]
	return nil
}
