package sink

import (
	"testing"
	"time"
)

// TestSettleWaitWithinRebalance: an INSERT that outlives its deadline is
// waited for on the server holding insertMu, which a revoke waits for. The
// whole hold, the attempt and its wait, must end before the rebalance
// timeout, with room for the revoke to rejoin the group; an insert timeout
// of half the rebalance timeout or more (the config allows any shorter)
// must not stretch it to the rebalance timeout.
func TestSettleWaitWithinRebalance(t *testing.T) {
	w, conn, db, ctx := offlineWriter(t, "i1")
	if err := conn.Exec(ctx, "ALTER TABLE "+db+"."+TableEvents+" ADD COLUMN slow UInt8 MATERIALIZED sleepEachRow(0.1)"); err != nil {
		t.Fatal(err)
	}
	w.cfg.InsertTimeout, w.cfg.RebalanceTimeout = time.Second, 1500*time.Millisecond
	et := w.byTopic[testTopics().DedupedTopic()]
	var rows []*row
	for i := 0; i < 30; i++ { // 3 s on the server
		r, err := et.buildRow(deduped(testTopics().DedupedTopic(), 0, i, base.Add(time.Duration(i)*time.Second)))
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	start := time.Now()
	err := w.insert(ctx, et, rows)
	held := time.Since(start)
	if err == nil {
		t.Fatal("the INSERT finished within its timeout: the test did not test anything")
	}
	if limit := w.cfg.RebalanceTimeout - w.cfg.RebalanceTimeout/20; held > limit {
		t.Errorf("insert held insertMu for %s (insert timeout %s, rebalance timeout %s): a revoke waiting for it ends past %s", held.Round(time.Millisecond), w.cfg.InsertTimeout, w.cfg.RebalanceTimeout, limit)
	}
	// Let the INSERT end on the server before the database is dropped.
	time.Sleep(3 * time.Second)
}
