package aggregator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// awaitFinals waits until usage.aggregates holds n FINAL revisions (or d
// passes) and returns the revisions.
func awaitFinals(t testing.TB, h *aggHarness, n int, d time.Duration) []*schemas.Aggregate {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		aggs := readAggregates(t, h)
		finals := 0
		for _, a := range aggs {
			if a.Status == schemas.StatusFinal {
				finals++
			}
		}
		if finals >= n || time.Now().After(deadline) {
			return aggs
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// liveStateKeys folds the changelog (read_committed) into the live state
// keys of period start: what a restore from it would hold.
func liveStateKeys(t testing.TB, h *aggHarness, start int64) [][]byte {
	t.Helper()
	live := map[string]bool{}
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.AggregateChangelogTopic()) {
		live[string(r.Key)] = r.Value != nil
	}
	var p [8]byte
	binary.BigEndian.PutUint64(p[:], uint64(start))
	var out [][]byte
	for k, ok := range live {
		if ok && len(k) >= 9 && bytes.Equal([]byte(k[1:9]), p[:]) {
			out = append(out, []byte(k))
		}
	}
	return out
}

// TestFinalInChunks: a period of 50 aggregates, with a FINAL chunk of 7
// (docs/design.md, Exactly-once, 7).
//
//   - The transaction whose watermark passes end + grace decides; the FINAL
//     revisions go out 7 per transaction at most, over 8 transactions or
//     more, with no input after the watermark.
//   - An event of the period processed right after the decision (in the
//     same poll as the watermark, it arrived on time) is an adjustment: the
//     FINAL of its aggregate, emitted chunks later, does not count it.
//   - A crash between chunks (in-process, at the 3rd point between two
//     chunks): the restarted instance goes on from the cursor, and every
//     aggregate has exactly one FINAL, at the revision after its last OPEN.
//   - Expiry at end + W + B + S: the period's state is deleted by tombstones, 7 per
//     transaction at most, until the compacted changelog holds nothing of
//     it.
func TestFinalInChunks(t *testing.T) {
	const chunk = 7
	h := newAggHarnessSources(t, nil, 1, 1)
	fs := vfs.NewMem()
	meter := newTxnMeter(h.names)
	cat, err := ParseMeters([]byte("meters:\n  - {name: s, aggregation: SUM}\n  - {name: u, aggregation: UNIQUE_COUNT, property: user}\n"))
	if err != nil {
		t.Fatal(err)
	}
	config := func() (Config, *prometheus.Registry) {
		cfg := h.config("a", fs)
		cfg.Period, cfg.Grace, cfg.Window, cfg.Meters = Day, time.Hour, 3*24*time.Hour, cat
		setFinalChunk(&cfg, chunk)
		cfg.Stream.ClientOptions = []kgo.Opt{kgo.WithHooks(meter)}
		reg := prometheus.NewRegistry()
		cfg.Stream.Registerer = reg
		return cfg, reg
	}
	fault.SetHandler(fault.CrashHandler)
	t.Cleanup(func() { fault.SetHandler(nil); _ = fault.Arm("") })

	cfg, _ := config()
	run := h.start(cfg)
	day := ms(t, "2026-05-04")
	const dayMs, hourMs = 24 * 3600 * 1000, 3600 * 1000
	end := day + dayMs
	want := map[string]int64{} // customer/meter → FINAL value
	var recs []*kgo.Record
	for i := 0; i < 40; i++ {
		c := fmt.Sprintf("c%02d", i)
		for j := int64(1); j <= 2; j++ {
			recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprintf("%s-%d", c, j), CustomerID: c, Meter: "s",
				Quantity: int64(i) + j, EventTime: day + j*1000, IngestTime: day + j*2000}))
			want[c+"/s"] += int64(i) + j
		}
	}
	for i := 0; i < 10; i++ {
		c := fmt.Sprintf("u%02d", i)
		for j := 0; j < 3; j++ {
			recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprintf("%s-%d", c, j), CustomerID: c, Meter: "u",
				Quantity: 1, EventTime: day + 1000, IngestTime: day + 2000, Properties: []schemas.Property{{Name: "user", Value: fmt.Sprint(j)}}}))
		}
		want[c+"/u"] = 3
	}
	h.produce(recs...)
	h.caughtUp()
	meter.reset()

	if err := fault.Arm(fault.BetweenChunks + "@3"); err != nil {
		t.Fatal(err)
	}
	// One batch: the watermark that decides the day final, then an event
	// of the day that arrived on time, for the last SUM aggregate in key
	// order (its FINAL goes out in the 6th chunk).
	h.produce(h.watermark(0, 0, 1, end+hourMs+1),
		h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "between", CustomerID: "c39", Meter: "s", Quantity: 1000,
			EventTime: day + 5000, IngestTime: end + hourMs - 1}))
	select {
	case <-run.done:
	case <-time.After(30 * time.Second):
		t.Fatal("no crash between chunks: the FINAL revisions did not go out in several chunks")
	}
	if !errors.Is(run.err, stream.ErrCrashed) {
		t.Fatalf("the instance stopped with %v, want the crash between chunks", run.err)
	}
	meter.crashed()
	cfg, reg := config()
	h.start(cfg)

	aggs := awaitFinals(t, h, len(want), time.Minute)
	revs := map[string][]*schemas.Aggregate{}
	for _, a := range aggs {
		k := a.CustomerID + "/" + a.Meter
		revs[k] = append(revs[k], a)
	}
	for k, v := range want {
		rs := revs[k]
		finals := 0
		for i, a := range rs {
			if a.Revision != int64(i+1) {
				t.Errorf("%s: revision %d at position %d", k, a.Revision, i)
			}
			if a.Status == schemas.StatusFinal {
				finals++
				if i != len(rs)-1 {
					t.Errorf("%s: a revision follows the FINAL", k)
				}
				if a.Value != v {
					t.Errorf("%s: FINAL value %d, want %d", k, a.Value, v)
				}
				if a.UpdatedAt != end+hourMs+1 {
					t.Errorf("%s: FINAL updated_at %d, want the deciding watermark %d", k, a.UpdatedAt, end+hourMs+1)
				}
			}
		}
		if finals != 1 {
			t.Errorf("%s: %d FINAL revisions, want exactly 1", k, finals)
		}
	}
	adjs := testenv.ReadAll(t, h.brokers, h.names.AdjustmentsTopic())
	if len(adjs) != 1 {
		t.Fatalf("%d adjustments, want 1 (the event processed after the decision)", len(adjs))
	}
	var adj schemas.Adjustment
	if err := schemas.DecodeInto(adjs[0].Value, &adj); err != nil {
		t.Fatal(err)
	}
	if adj.EventID != "between" || adj.Delta != 1000 || adj.OriginalPeriodStart != day || adj.BookedPeriodStart != end {
		t.Errorf("adjustment %+v, want between: delta 1000, original %d, booked %d (the period of its arrival)", adj, day, end)
	}
	rep := meter.report()
	t.Logf("finalization: %d FINAL revisions in %d transactions (largest: %d FINAL, %d records), %d transactions in all, longest %s",
		rep.finals, rep.finalTxs, rep.max.finals, rep.max.records, rep.ends, rep.longest)
	if rep.max.finals > chunk {
		t.Errorf("a transaction carried %d FINAL revisions, more than the chunk of %d", rep.max.finals, chunk)
	}
	if min := (len(want) + chunk - 1) / chunk; rep.finalTxs < min {
		t.Errorf("the FINAL revisions went out in %d transactions, want at least %d", rep.finalTxs, min)
	}
	// A chunk: its FINALs, a tombstone and a state per aggregate, and the
	// marker; and what the input it was polled with made (here, at most
	// the two records of the deciding poll: a source watermark, a queued
	// event, the record it came from and its sequence number, the input
	// offset).
	if rep.max.records > 3*chunk+1+5 {
		t.Errorf("a transaction carried %d records, more than 3 per aggregate of a chunk of %d, the marker and the deciding input's 5", rep.max.records, chunk)
	}

	// Expiry at end + W + B + S (W 3 days, dedup's bucket B 1 day, skew S
	// 1 hour): 50 final states and 30 UNIQUE_COUNT values.
	meter.reset()
	h.produce(h.watermark(0, 0, 1, end+3*dayMs+dayMs+hourMs))
	deadline := time.Now().Add(time.Minute)
	for {
		left := liveStateKeys(t, h, day)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d state keys of the period still live in the changelog a minute after end + W + B + S (first %q)", len(left), left[0])
		}
		time.Sleep(50 * time.Millisecond)
	}
	rep = meter.report()
	t.Logf("expiry: largest transaction %d tombstones, %d transactions", rep.max.tombstones, rep.ends)
	if rep.max.tombstones > chunk+1 { // the chunk, and the marker's
		t.Errorf("a transaction carried %d tombstones, more than the chunk of %d and the marker", rep.max.tombstones, chunk)
	}
	if got := counterWith(reg, "meterline_aggregate_chunks_total", "work", "expire"); got < 80/chunk {
		t.Errorf("%v expiry chunks, want at least %d", got, 80/chunk)
	}
	if v, ok := gaugeOf(reg, "meterline_aggregate_state_keys", "partition", "0"); !ok || v != 0 {
		t.Errorf("state keys gauge %v (%v) after expiry, want 0", v, ok)
	}
}

// TestChunkTransactionsAreFenced: a transaction that carries a chunk and no
// input still commits the partition's offset (unchanged), so the group
// generation fences a zombie's chunk as it fences its input
// (docs/design.md, Exactly-once, 7: every transaction commits its
// partition's offset). On kfake, every committed transaction after the
// deciding watermark sends a TxnOffsetCommit for the input partition before
// its EndTxn; and when the broker refuses one of them as a zombie's
// (ILLEGAL_GENERATION), that chunk commits nothing and is done again:
// exactly one FINAL per aggregate.
func TestChunkTransactionsAreFenced(t *testing.T) {
	const chunk = 5
	c, brokers := testenv.KFake(t)
	h := newAggHarnessSources(t, brokers, 1, 1)
	cfg := h.config("a", vfs.NewMem())
	cfg.Period, cfg.Grace = Day, time.Hour
	setFinalChunk(&cfg, chunk)
	reg := prometheus.NewRegistry()
	cfg.Stream.Registerer = reg
	h.start(cfg)
	day := ms(t, "2026-05-04")
	const dayMs, hourMs = 24 * 3600 * 1000, 3600 * 1000
	var recs []*kgo.Record
	for i := 0; i < 30; i++ {
		recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "e", CustomerID: fmt.Sprintf("c%02d", i), Meter: "m",
			Quantity: 1, EventTime: day + 1000, IngestTime: day + 2000}))
	}
	h.produce(recs...)
	h.caughtUp()

	var (
		mu      sync.Mutex
		seq     []string // "O": a TxnOffsetCommit with the input partition; "E": an EndTxn that commits
		refused bool
	)
	input := h.names.DedupedTopic()
	c.ControlKey(int16(kmsg.TxnOffsetCommit), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		req := kr.(*kmsg.TxnOffsetCommitRequest)
		has := false
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				// v6 names the topic by ID only; the group reads one.
				has = has || ((rt.Topic == input || rt.Topic == "") && rp.Partition == 0)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if has {
			seq = append(seq, "O")
		}
		if !has || refused || len(seq) < 4 {
			return nil, nil, false
		}
		// The 3rd chunk's offset commit is a zombie's.
		refused = true
		c.KeepControl() // and go on observing
		return testenv.RefuseTxnOffsetCommit(req, kerr.IllegalGeneration.Code), nil, true
	})
	c.ControlKey(int16(kmsg.EndTxn), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		if kr.(*kmsg.EndTxnRequest).Commit {
			mu.Lock()
			seq = append(seq, "E")
			mu.Unlock()
		}
		return nil, nil, false
	})
	h.produce(h.watermark(0, 0, 1, day+dayMs+hourMs+1))

	aggs := awaitFinals(t, h, 30, time.Minute)
	finals := map[string]int{}
	for _, a := range aggs {
		if a.Status == schemas.StatusFinal {
			finals[a.CustomerID]++
		}
	}
	for i := 0; i < 30; i++ {
		if c := fmt.Sprintf("c%02d", i); finals[c] != 1 {
			t.Errorf("%s: %d FINAL revisions, want 1", c, finals[c])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("after the watermark: %v", seq)
	if !refused {
		t.Fatal("no transaction after the deciding one committed an offset of the input partition: chunks are not fenced")
	}
	if v := counterOf(reg, "meterline_stream_commits_refused_total"); v < 1 {
		t.Errorf("the refused offset commit did not abort its transaction (commits refused: %v)", v)
	}
	offsets := 0
	for _, s := range seq {
		switch s {
		case "O":
			offsets++
		case "E":
			if offsets == 0 {
				t.Fatalf("a transaction committed without an offset commit of the input partition: %v", seq)
			}
			offsets = 0
		}
	}
}
