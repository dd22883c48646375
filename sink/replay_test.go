package sink

import (
	"testing"
	"time"
)

// TestReplayRestoresDeletedLedgerRows: verify takes the ledger as right
// (docs/operations.md, Verify and backfill). Rows deleted by hand from
// usage_events are not rows verify can bring back; replaying the sink's
// group from the earliest offsets writes exactly the rows the table lacks
// (and their views with them), and verify then mends the rollups that
// counted them twice.
func TestReplayRestoresDeletedLedgerRows(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	recs, rows := e.events(40, base.Add(2*time.Hour)) // February 2026
	e.produce(recs...)
	e.runOnce(topic)
	e.exact(TableEvents, uint64(rows))

	ctx := ctxT(t, 2*time.Minute)
	if err := e.conn.Exec(ctx, "ALTER TABLE "+e.db+".usage_events DELETE WHERE kafka_offset < 12"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for e.scalar("SELECT count() FROM system.mutations WHERE database = '"+e.db+"' AND is_done = 0") > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the DELETE mutation did not finish in a minute")
		}
		time.Sleep(100 * time.Millisecond)
	}
	gone := uint64(rows) - e.scalar("SELECT count() FROM "+e.db+".usage_events")
	if gone == 0 {
		t.Fatal("the DELETE removed no row")
	}

	e.resetToEarliest(topic)
	e.runOnce(topic)
	e.exact(TableEvents, uint64(rows))
	if got := e.scalar("SELECT count() FROM " + e.db + ".events_by_customer FINAL"); got != uint64(rows) {
		t.Errorf("events_by_customer after the replay: %d rows, want %d", got, rows)
	}
	// The rollups counted the replayed rows again.
	if got := e.scalar("SELECT toUInt64(sum(events)) FROM " + e.db + ".usage_daily"); got != uint64(rows)+gone {
		t.Errorf("usage_daily after the replay: %d events, want %d (%d twice)", got, uint64(rows)+gone, gone)
	}
	cfg := e.verifyConfig(true)
	cfg.Since = 202602
	rep, err := Verify(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := statuses(rep)
	for _, key := range []string{"usage_daily/202602", "source_daily/202602"} {
		if st[key] != MonthRebuilt {
			t.Errorf("%s: %s, want %s", key, st[key], MonthRebuilt)
		}
	}
	if got := e.derivedCounts(); got != [3]uint64{uint64(rows), uint64(rows), uint64(rows)} {
		t.Errorf("derived event counts after verify: %v, want %d each", got, rows)
	}
}
