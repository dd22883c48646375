package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestPendingBalancesInChunks: the emission of pending balances is chunked
// (docs/design.md, Exactly-once, 7: emitting balances is work that scales
// with state): seven customers changed in one transaction go out at most
// Config.FinalChunk (2) a transaction, each once. Transactions are told
// apart by the commit marker each leaves between its records and the next
// transaction's on the one partition of usage.balances (the aggregator is
// its only writer).
func TestPendingBalancesInChunks(t *testing.T) {
	const n = 1
	h := newEntHarness(t, nil, n)
	t0 := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	var recs []*kgo.Record
	recs = append(recs, h.shared(n, schemas.DefaultPlanKey, &schemas.Entitlements{Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps: []schemas.Cap{{Meter: "api_calls", Limit: 100, OnLimit: schemas.OnLimitReject}}}, t0)...)
	custs := []string{"c1", "c2", "c3", "c4", "c5", "c6", "c7"}
	for i, c := range custs {
		at := t0 + 1000 + int64(i)
		recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: c, CustomerID: c,
			Meter: "api_calls", Quantity: 3, EventTime: at, IngestTime: at}))
	}
	// A tick after every event: a stage that starts on this backlog
	// decides them all in its first transaction.
	recs = append(recs, h.shared(n, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, t0+5000)...)
	h.produce(recs...)
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.FinalChunk = 2
	run := h.start(cfg)
	awaitBalances(t, h, "every customer's", func(bs map[string]*schemas.Balance) bool {
		for _, c := range custs {
			if b := bs[c]; b == nil || len(b.Meters) != 1 || b.Meters[0].Usage != 3 {
				return false
			}
		}
		return true
	})
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	var chunks [][]string
	last := int64(-2)
	seen := map[string]int{}
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.BalancesTopic()) {
		c, err := schemas.ParseCustomerKey(r.Key)
		if err != nil {
			t.Fatal(err)
		}
		if r.Offset != last+1 || len(chunks) == 0 {
			chunks = append(chunks, nil)
		}
		last = r.Offset
		chunks[len(chunks)-1] = append(chunks[len(chunks)-1], c)
		seen[c]++
	}
	for _, ch := range chunks {
		if len(ch) > cfg.FinalChunk {
			t.Errorf("one transaction emitted %d balances %v, want at most --final-chunk %d (balances by transaction: %v)", len(ch), ch, cfg.FinalChunk, chunks)
		}
	}
	for _, c := range custs {
		if seen[c] != 1 {
			t.Errorf("%s's balance went out %d times, want once (balances by transaction: %v)", c, seen[c], chunks)
		}
	}
	t.Logf("balances by transaction: %s", fmt.Sprint(chunks))
}
