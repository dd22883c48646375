package aggregator

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// The state key count (keyKeyCount, the meterline_aggregate_state_keys
// gauge): persisted with the keys it counts, exact, and read when a
// partition opens instead of a scan of its 'a' and 'f' keys.

// memState is a stateReader over a map that counts the keys each Scan
// visits, by their first byte.
type memState struct {
	kv      map[string][]byte
	visited map[byte]int
}

func (m *memState) Get(k []byte) ([]byte, bool, error) {
	v, ok := m.kv[string(k)]
	return v, ok, nil
}

func (m *memState) Scan(lo, hi []byte, fn func(k, v []byte) error) error {
	keys := make([]string, 0, len(m.kv))
	for k := range m.kv {
		if k >= string(lo) && (hi == nil || k < string(hi)) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		m.visited[k[0]]++
		if err := fn([]byte(k), m.kv[k]); err != nil {
			return err
		}
	}
	return nil
}

func countValue(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

// TestLoadReadsKeyCount: opening a partition (load, also run after every
// aborted transaction) reads the persisted count and visits no 'a' or 'f'
// key; state without the count (built before it was kept) is counted once
// with a scan, and the next transaction records it.
func TestLoadReadsKeyCount(t *testing.T) {
	st := &memState{kv: map[string][]byte{string(keyKeyScheme): []byte(schemas.DedupedKeyScheme)}, visited: map[byte]int{}}
	day := ms(t, "2026-05-04")
	for i := 0; i < 50; i++ {
		k := periodKey(pfxOpen, day, appendFramed(nil, fmt.Sprint("c", i)))
		st.kv[string(k)] = (&aggState{Value: 1}).encode()
		if i%2 == 0 {
			k[0] = pfxFinal
			st.kv[string(k)] = (&aggState{Value: 1}).encode()
		}
		k[0] = pfxUnique // not counted
		st.kv[string(k)] = nil
	}
	const want = 75
	pr := &processor{counts: partitionCountsT{events: 1, deduped: 1, entitlements: 1}}

	// State from before the count was kept: one scan.
	pt := &partition{pr: pr, p: 0}
	if err := pt.load(st); err != nil {
		t.Fatal(err)
	}
	if pt.keys != want {
		t.Fatalf("legacy state: %d keys counted, want %d", pt.keys, want)
	}
	if pt.keysSaved == pt.keys {
		t.Fatal("legacy state: the count is taken as recorded; the next transaction would not write it")
	}

	// State with the count (and its meters' definitions, meterdef.go):
	// no 'a' or 'f' key visited.
	st.kv[string(keyKeyCount)] = countValue(want)
	st.kv[string(keyMeterDefs)] = []byte(meterDefsVersion)
	st.visited = map[byte]int{}
	pt = &partition{pr: pr, p: 0}
	if err := pt.load(st); err != nil {
		t.Fatal(err)
	}
	if pt.keys != want || pt.keysSaved != want {
		t.Fatalf("keys %d, recorded %d; want %d both", pt.keys, pt.keysSaved, want)
	}
	if n := st.visited[pfxOpen] + st.visited[pfxFinal]; n != 0 {
		t.Errorf("load visited %d 'a' and 'f' keys (%v), want 0: it scans the aggregates it has a count of", n, st.visited)
	}

	st.kv[string(keyKeyCount)] = []byte{1, 2}
	if err := (&partition{pr: pr, p: 0}).load(st); err == nil || !strings.Contains(err.Error(), "corrupt state key count") {
		t.Errorf("a corrupt count: %v, want an error", err)
	}
}

// changelogCheck reads partition 0 of the changelog (read_committed, with
// the transaction markers) and checks, at each commit marker, that
// keyKeyCount equals the number of live 'a' and 'f' keys (checkCommitted).
// It returns that number after the last committed transaction read,
// whether the count key is present then, and the transactions checked.
func changelogCheck(t testing.TB, h *aggHarness) (live int, recorded bool, txns int) {
	t.Helper()
	var recs []*kgo.Record
	for _, r := range testenv.ReadAllMarkers(t, h.brokers, h.names.AggregateChangelogTopic()) {
		if r.Partition == 0 {
			recs = append(recs, r)
		}
	}
	live, recorded, txns, err := checkCommitted(recs)
	if err != nil {
		t.Fatal(err)
	}
	return live, recorded, txns
}

// checkCommitted folds a changelog partition's records and markers, in
// offset order, and checks the count at each commit marker. The records
// after the last marker are left out: the read ends at the high watermark
// of when it started, which may fall inside a transaction that the stage
// went on writing (its count then lies past the end). An abort marker
// has no records before it: read_committed drops them, and the stage is
// the partition's one writer.
func checkCommitted(recs []*kgo.Record) (live int, recorded bool, txns int, err error) {
	state := map[string][]byte{}
	count := func() (n int, got uint64, ok bool, err error) {
		for k := range state {
			if k[0] == pfxOpen || k[0] == pfxFinal {
				n++
			}
		}
		v, ok := state[string(keyKeyCount)]
		if ok && len(v) != 8 {
			return 0, 0, ok, fmt.Errorf("count %x is not 8 bytes", v)
		}
		if ok {
			got = binary.BigEndian.Uint64(v)
		}
		return n, got, ok, nil
	}
	for _, r := range recs {
		if !r.Attrs.IsControl() {
			if r.Value == nil {
				delete(state, string(r.Key))
			} else {
				state[string(r.Key)] = r.Value
			}
			continue
		}
		var mk kmsg.ControlRecordKey
		if err := mk.ReadFrom(r.Key); err != nil {
			return 0, false, 0, fmt.Errorf("changelog offset %d: marker key %x: %w", r.Offset, r.Key, err)
		}
		if mk.Type != kmsg.ControlRecordKeyTypeCommit {
			continue
		}
		n, got, ok, err := count()
		if err == nil && got != uint64(n) {
			err = fmt.Errorf("count %d (recorded: %v), live 'a' and 'f' keys %d", got, ok, n)
		}
		if err != nil {
			return 0, false, 0, fmt.Errorf("after the transaction committed at changelog offset %d: %w", r.Offset, err)
		}
		live, recorded = n, ok
		txns++
	}
	return live, recorded, txns, nil
}

// awaitKeysGauge waits until the state keys gauge equals the live keys of
// the committed changelog (the gauge is set before the commit, and chunks
// of finalization and expiry go on after the input is caught up), and the
// changelog's count equals them after every transaction.
func awaitKeysGauge(t testing.TB, h *aggHarness, reg **prometheus.Registry, what string) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		live, _, _ := changelogCheck(t, h)
		g, ok := gaugeOf(*reg, "meterline_aggregate_state_keys", "partition", "0")
		if ok && int(g) == live {
			return live
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: state keys gauge %v (set: %v), the committed changelog has %d 'a' and 'f' keys", what, g, ok, live)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStateKeyCountExact: random on-time and late events (adjustments,
// queued ones), UNIQUE_COUNT values, periods decided final and expired in
// chunks of 3, aborted transactions and restarts on kept state. After every
// committed transaction the persisted count equals the live 'a' and 'f'
// keys of the changelog, and after every step and restart the gauge equals
// them too.
func TestStateKeyCountExact(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newAggHarnessSources(t, brokers, 1, 1)
	fs := vfs.NewMem()
	cat, err := ParseMeters([]byte("meters:\n  - {name: s, aggregation: SUM}\n  - {name: u, aggregation: UNIQUE_COUNT, property: user}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var reg *prometheus.Registry
	start := func() *aggRunning {
		cfg := h.config("a", fs)
		cfg.Period, cfg.Grace, cfg.Window, cfg.Meters = Day, time.Hour, 2*24*time.Hour, cat
		setFinalChunk(&cfg, 3)
		reg = prometheus.NewRegistry()
		cfg.Stream.Registerer = reg
		return h.start(cfg)
	}
	run := start()
	aborted := 0.0
	r := rand.New(rand.NewSource(16))
	day0 := ms(t, "2026-05-04")
	const hourMs = int64(3600 * 1000)
	id, restarts, maxLive := 0, 0, 0
	for step := 0; step < 28; step++ {
		now := day0 + int64(step)*6*hourMs
		if r.Intn(3) == 0 {
			testenv.FailNextTxnOffsetCommit(c)
		}
		var recs []*kgo.Record
		for i := 0; i < 4+r.Intn(10); i++ {
			id++
			e := &schemas.DedupedEvent{EventID: fmt.Sprint("e", id), CustomerID: fmt.Sprint("c", r.Intn(8)), Meter: "s",
				Quantity: int64(r.Intn(10)), EventTime: now - r.Int63n(47*hourMs), IngestTime: now}
			if r.Intn(2) == 0 {
				e.Meter, e.Properties = "u", []schemas.Property{{Name: "user", Value: fmt.Sprint(r.Intn(4))}}
			}
			recs = append(recs, h.dedupedEvent(0, e))
		}
		recs = append(recs, h.watermark(0, 0, 1, now-hourMs/2))
		h.produce(recs...)
		h.caughtUp()
		maxLive = max(maxLive, awaitKeysGauge(t, h, &reg, fmt.Sprint("step ", step)))
		if r.Intn(6) == 0 {
			aborted += transactionCounts(reg)["aborted"]
			if err := run.stop(); err != nil {
				t.Fatal(err)
			}
			run = start()
			restarts++
			awaitKeysGauge(t, h, &reg, fmt.Sprint("restart after step ", step))
		}
	}
	// Every period expires: the count goes back to 0, and says so.
	h.produce(h.watermark(0, 0, 1, day0+20*24*hourMs))
	h.caughtUp()
	// The expiry goes in chunks of 3 keys, in transactions after the
	// input is committed: the gauge matches the changelog between chunks
	// too, so wait for the last chunk. The 'a' and 'f' keys go first; a
	// period's UNIQUE_COUNT values, meter definitions and marker in the
	// chunks after them.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n := awaitKeysGauge(t, h, &reg, "after expiry")
		if n == 0 && len(periodKeysLeft(t, h)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			if n > 0 {
				t.Fatalf("%d 'a' and 'f' keys left after every period expired", n)
			}
			break // reported below, by prefix
		}
	}
	live, recorded, txns := changelogCheck(t, h)
	aborted += transactionCounts(reg)["aborted"]
	adjustments, finals := len(readAdjustments(t, h)), 0
	for _, a := range readAggregates(t, h) {
		if a.Status == schemas.StatusFinal {
			finals++
		}
	}
	t.Logf("%d transactions checked, %d aborted, %d restarts, at most %d keys, %d FINAL revisions, %d adjustments",
		txns, int(aborted), restarts, maxLive, finals, adjustments)
	if live != 0 || !recorded {
		t.Errorf("at the end: %d live keys, count recorded %v; want 0 and a recorded 0", live, recorded)
	}
	// Nor is any other key of a period left: the count covers the
	// aggregates, and the state a period keeps beside them (UNIQUE_COUNT
	// values, queued events, meter definitions, its marker) expires with
	// it.
	if left := periodKeysLeft(t, h); len(left) > 0 {
		t.Errorf("at the end, with every period expired, live keys of periods by prefix: %v", left)
	}
	if aborted < 3 || restarts < 2 || txns < 28 || maxLive < 10 || finals < 20 || adjustments < 20 {
		t.Errorf("the run exercised too little: %v aborted transactions, %d restarts, %d transactions checked, at most %d keys, "+
			"%d FINAL revisions, %d adjustments", aborted, restarts, txns, maxLive, finals, adjustments)
	}
}

// TestStateKeyCountLegacyState: state restored from a changelog without
// the count (written before it was kept) is counted once, and the next
// transaction records the count.
func TestStateKeyCountLegacyState(t *testing.T) {
	h := newAggHarnessSources(t, nil, 1, 1)
	var reg *prometheus.Registry
	start := func() *aggRunning {
		cfg := h.config("a", vfs.NewMem()) // a new store: restored from the changelog
		cfg.Period, cfg.Grace = Day, time.Hour
		reg = prometheus.NewRegistry()
		cfg.Stream.Registerer = reg
		return h.start(cfg)
	}
	run := start()
	day := ms(t, "2026-05-04")
	var recs []*kgo.Record
	for i := 0; i < 6; i++ {
		recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprint("e", i), CustomerID: fmt.Sprint("c", i),
			Meter: "m", Quantity: 1, EventTime: day + 1000, IngestTime: day + 2000}))
	}
	h.produce(recs...)
	h.caughtUp()
	if n := awaitKeysGauge(t, h, &reg, "before"); n != 6 {
		t.Fatalf("%d keys, want 6", n)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	// What older versions left: no count in the changelog.
	h.produce(&kgo.Record{Topic: h.names.AggregateChangelogTopic(), Partition: 0, Key: bytes.Clone(keyKeyCount)})
	if _, recorded, _ := foldChangelog(t, h); recorded {
		t.Fatal("the count is still in the changelog")
	}
	run = start()
	defer func() { _ = run.stop() }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if g, ok := gaugeOf(reg, "meterline_aggregate_state_keys", "partition", "0"); ok && g == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the restored partition does not count its 6 keys")
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "e6", CustomerID: "c6", Meter: "m", Quantity: 1,
		EventTime: day + 1000, IngestTime: day + 3000}))
	h.caughtUp()
	if n := awaitKeysGauge(t, h, &reg, "after"); n != 7 {
		t.Fatalf("%d keys, want 7", n)
	}
	if _, recorded, _ := changelogCheck(t, h); !recorded {
		t.Error("the next transaction did not record the count")
	}
}

// foldChangelog is changelogCheck without the per-transaction check
// (the count is tombstoned on purpose): the live keys and whether the
// count is present at the end.
func foldChangelog(t testing.TB, h *aggHarness) (live int, recorded bool, n int) {
	t.Helper()
	state := map[string]bool{}
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.AggregateChangelogTopic()) {
		state[string(r.Key)] = r.Value != nil
	}
	for k, ok := range state {
		if ok && (k[0] == pfxOpen || k[0] == pfxFinal) {
			live++
		}
	}
	return live, state[string(keyKeyCount)], len(state)
}

// periodKeysLeft folds the changelog of partition 0 and counts its live
// keys of a period (every prefix that a period start follows), by prefix.
func periodKeysLeft(t testing.TB, h *aggHarness) map[string]int {
	t.Helper()
	left := map[string]int{}
	for k, ok := range changelogKeys(t, h) {
		if !ok {
			continue
		}
		switch k[0] {
		case pfxOpen, pfxFinal, pfxUnique, pfxPending, pfxCharge, pfxQueuedSource, pfxMarker, pfxMeterDef:
			left[string(k[0])]++
		}
	}
	return left
}

// TestStateKeysGaugeLeavesOutLines: the state keys gauge counts
// aggregates (the 'a' and 'f' keys), as its help says, and not the line
// an adjustment was booked into that has no aggregate of its own ('l'
// key): a late event of day 1 booked into day 2 leaves day 1's final
// aggregate, counted, and day 2's line, not counted.
func TestStateKeysGaugeLeavesOutLines(t *testing.T) {
	h := newAggHarnessSources(t, nil, 1, 1)
	cfg := h.config("a", vfs.NewMem())
	cfg.Period, cfg.Grace = Day, time.Hour
	reg := prometheus.NewRegistry()
	cfg.Stream.Registerer = reg
	run := h.start(cfg)
	defer func() { _ = run.stop() }()
	const dayMs, hourMs = 24 * 3600 * 1000, 3600 * 1000
	d1 := ms(t, "2026-05-04")
	h.produce(
		h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "e1", CustomerID: "c", Meter: "m", Quantity: 5,
			EventTime: d1 + 1000, IngestTime: d1 + 2000}),
		h.watermark(0, 0, 1, d1+dayMs+hourMs+1),
		h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "e2", CustomerID: "c", Meter: "m", Quantity: 7,
			EventTime: d1 + 3000, IngestTime: d1 + dayMs + 2*hourMs}),
	)
	h.caughtUp()
	if n := awaitKeysGauge(t, h, &reg, "after the adjustment"); n != 1 {
		t.Fatalf("%d 'a' and 'f' keys, want 1 (day 1's aggregate)", n)
	}
	lines := 0
	for k, live := range changelogKeys(t, h) {
		if live && k[0] == pfxLine {
			lines++
		}
	}
	if lines != 1 {
		t.Fatalf("%d line keys, want 1 (day 2's line of adjustments only)", lines)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "meterline_aggregate_state_keys" && !strings.Contains(mf.GetHelp(), "adjustments only are not counted") {
			t.Errorf("the gauge counts no line of adjustments only; its help does not say so: %q", mf.GetHelp())
		}
	}
}

// changelogKeys folds the changelog of partition 0: each key, and whether
// it is live.
func changelogKeys(t testing.TB, h *aggHarness) map[string]bool {
	t.Helper()
	state := map[string]bool{}
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.AggregateChangelogTopic()) {
		if r.Partition == 0 {
			state[string(r.Key)] = r.Value != nil
		}
	}
	return state
}

// TestChangelogCheckSeesWholeTransactions: changelogCheck checks the
// count at the end of each committed transaction, and only there. Its
// read ends at the high watermark of when it starts, which can fall
// inside a transaction (one the stage goes on writing): here the
// transaction's first record, an aggregate, is below it and the count
// written with it above. The check must take the state of the last
// committed transaction whole, not that part of the next. It must still
// find a committed count that disagrees with the keys.
func TestChangelogCheckSeesWholeTransactions(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newAggHarnessSources(t, brokers, 1, 1)
	topic := h.names.AggregateChangelogTopic()
	ctx := context.Background()
	p := testenv.ManualProducer(t, brokers, topic, kgo.TransactionalID(testenv.Name(t, "changelog")))
	day := ms(t, "2026-05-04")
	agg := func(c string) *kgo.Record {
		return &kgo.Record{Key: periodKey(pfxOpen, day, appendFramed(nil, c)), Value: (&aggState{Value: 1}).encode()}
	}
	count := func(n uint64) *kgo.Record { return &kgo.Record{Key: bytes.Clone(keyKeyCount), Value: countValue(n)} }
	txn := func(end kgo.TransactionEndTry, recs ...*kgo.Record) {
		t.Helper()
		if err := p.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := p.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := p.EndTransaction(ctx, end); err != nil {
			t.Fatal(err)
		}
	}
	txn(kgo.TryCommit, agg("c1"), count(1))      // offsets 0-1, its marker 2
	txn(kgo.TryAbort, agg("c9"), count(2))       // 3-4 aborted, 5
	txn(kgo.TryCommit, agg("c2"), count(2))      // 6-7, 8
	if err := p.BeginTransaction(); err != nil { // 9: c3, below the read's end
		t.Fatal(err)
	}
	if err := p.ProduceSync(ctx, agg("c3")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// The rest of the transaction (10: its count, 11: its marker) once
	// the check has read the high watermark (10): kfake answers the
	// ListOffsets before it takes the next request.
	listed := make(chan struct{})
	c.ControlKey(int16(kmsg.ListOffsets), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.DropControl()
		close(listed)
		return nil, nil, false
	})
	done := make(chan error, 1)
	go func() {
		<-listed
		err := p.ProduceSync(ctx, count(3)).FirstErr()
		if err == nil {
			err = p.EndTransaction(ctx, kgo.TryCommit)
		}
		done <- err
	}()
	live, recorded, txns := changelogCheck(t, h)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if live != 2 || !recorded || txns != 2 {
		t.Errorf("read up to offset 9: %d live keys (recorded %v) in %d committed transactions; want 2, true, 2", live, recorded, txns)
	}
	if live, _, txns := changelogCheck(t, h); live != 3 || txns != 3 {
		t.Errorf("read to the end: %d live keys in %d committed transactions; want 3 and 3", live, txns)
	}
	txn(kgo.TryCommit, agg("c4"), count(3)) // 12-13, 14: 4 keys counted 3
	_, _, _, err := checkCommitted(testenv.ReadAllMarkers(t, brokers, topic))
	if want := "committed at changelog offset 14: count 3 (recorded: true), live 'a' and 'f' keys 4"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a committed count that disagrees: %v, want an error with %q", err, want)
	}
}
