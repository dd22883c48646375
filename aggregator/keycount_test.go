package aggregator

import (
	"bytes"
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

// changelogCheck folds the changelog of partition 0 (read_committed) and
// checks, at the end of every committed transaction (a gap in the offsets:
// its commit marker, or an aborted transaction's records), that keyKeyCount
// equals the number of live 'a' and 'f' keys. It returns that number at
// the end, whether the count key is present, and the transactions checked.
func changelogCheck(t testing.TB, h *aggHarness) (live int, recorded bool, txns int) {
	t.Helper()
	var recs []*kgo.Record
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.AggregateChangelogTopic()) {
		if r.Partition == 0 {
			recs = append(recs, r)
		}
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Offset < recs[j].Offset })
	state := map[string][]byte{}
	check := func(at int64) {
		n := 0
		for k := range state {
			if k[0] == pfxOpen || k[0] == pfxFinal {
				n++
			}
		}
		got := uint64(0)
		v, ok := state[string(keyKeyCount)]
		if ok {
			if len(v) != 8 {
				t.Fatalf("changelog offset %d: count %x is not 8 bytes", at, v)
			}
			got = binary.BigEndian.Uint64(v)
		}
		if got != uint64(n) {
			t.Fatalf("after the transaction ending at changelog offset %d: count %d (recorded: %v), live 'a' and 'f' keys %d", at, got, ok, n)
		}
		live, recorded = n, ok
		txns++
	}
	for i, r := range recs {
		if i > 0 && r.Offset != recs[i-1].Offset+1 {
			check(recs[i-1].Offset)
		}
		if r.Value == nil {
			delete(state, string(r.Key))
		} else {
			state[string(r.Key)] = r.Value
		}
	}
	if len(recs) > 0 {
		check(recs[len(recs)-1].Offset)
	}
	return live, recorded, txns
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
	// too, so wait for the last chunk.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n := awaitKeysGauge(t, h, &reg, "after expiry")
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d 'a' and 'f' keys left after every period expired", n)
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
