package sink

import (
	"context"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap/zaptest"
)

// TestConcurrentRepairsOfAMonth interleaves two verify repairs of the same
// months on ClickHouse 18.16: run A creates its staging table of
// usage_daily, run B then creates and fills its own, A fills and swaps
// its months in and finishes, and only then B swaps its months in. Each
// run swaps in months computed wholly from the ledger (neither touches
// the other's staging table), so both report every month rebuilt,
// whichever swapped last, and no staging table is left.
func TestConcurrentRepairsOfAMonth(t *testing.T) {
	conn, db, ctx := migratedDB(t, func(db string) []string {
		return append(emptyMonthInserts(db)[:1],
			"ALTER TABLE "+db+".usage_daily DROP PARTITION 202401",
			"ALTER TABLE "+db+".source_daily DROP PARTITION 202401")
	})
	tables := []string{TableUsageDaily, TableSourceDaily}
	cfg := func(name string, hook func(step, table string)) VerifyConfig {
		return VerifyConfig{Conn: conn, Database: db, Since: 202401, Repair: true, Tables: tables,
			Logger: zaptest.NewLogger(t).Named(name), stepHook: hook,
			SinkMembers: func(context.Context) ([]string, error) { return nil, nil }}
	}
	type result struct {
		rep *VerifyReport
		err error
	}
	bFilled, aDone, bRes := make(chan struct{}), make(chan struct{}), make(chan result, 1)
	var closeA sync.Once
	defer closeA.Do(func() { close(aDone) })
	a := cfg("a", func(step, table string) {
		if step != stepCreated || table != TableUsageDaily {
			return
		}
		go func() {
			rep, err := Verify(ctx, cfg("b", func(step, table string) {
				if step == stepFilled && table == TableUsageDaily {
					close(bFilled)
					<-aDone
				}
			}))
			bRes <- result{rep, err}
		}()
		select {
		case <-bFilled:
		case r := <-bRes:
			bRes <- r
		}
	})
	repA, errA := Verify(ctx, a)
	closeA.Do(func() { close(aDone) })
	b := <-bRes
	for name, r := range map[string]result{"A": {repA, errA}, "B": b} {
		if r.err != nil {
			t.Errorf("run %s: %v", name, r.err)
			continue
		}
		if st := statuses(r.rep); r.rep.Differs != 0 || st["usage_daily/202401"] != MonthRebuilt || st["source_daily/202401"] != MonthRebuilt {
			t.Errorf("run %s: statuses %v, %d differ: %+v", name, st, r.rep.Differs, r.rep.Months)
		}
	}
	for q, want := range map[string]string{
		"SELECT toUInt64(sum(events)) FROM " + db + ".usage_daily":                                                 "1\n",
		"SELECT toUInt64(sum(accepted)) FROM " + db + ".source_daily":                                              "1\n",
		"SELECT count() FROM system.tables WHERE database = '" + db + "' AND name LIKE 'rebuild\\_\\_%'":           "0\n",
		"SELECT count() FROM " + db + "." + RebuildsTable + " FINAL WHERE finished = 0 AND run_id LIKE 'verify %'": "0\n",
	} {
		if got, err := tsv(ctx, conn, q); err != nil || got != want {
			t.Errorf("%s = %q (%v), want %q", q, got, err, want)
		}
	}
	rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: 202401, Tables: tables, Logger: zaptest.NewLogger(t)})
	if err != nil || rep.Differs != 0 {
		t.Fatalf("after both runs: %v, %+v", err, rep)
	}
}

// TestBackfillDuringARepair: a backfill that starts while a repair is
// paused between its fill and its swap counts the repair among the
// unfinished rebuilds, rebuilds its tables, records it finished and drops
// its staging tables. The repair then fails its swap without swapping
// anything in, and the months equal the ledger.
func TestBackfillDuringARepair(t *testing.T) {
	conn, db, ctx := migratedDB(t, func(db string) []string {
		// A staging table of the name runs shared before, as a run killed
		// then left it: dropped with the run's own.
		return append(emptyMonthInserts(db)[:1], "ALTER TABLE "+db+".usage_daily DROP PARTITION 202401",
			"CREATE TABLE "+db+"."+legacyStagingTable(TableUsageDaily)+" AS "+db+".usage_daily")
	})
	none := func(context.Context) ([]string, error) { return nil, nil }
	var repB *VerifyReport
	var errB error
	repair := VerifyConfig{Conn: conn, Database: db, Since: 202401, Repair: true, Tables: []string{TableUsageDaily},
		Logger: zaptest.NewLogger(t).Named("repair"), SinkMembers: none,
		stepHook: func(step, table string) {
			if step == stepFilled {
				repB, errB = Verify(ctx, VerifyConfig{Conn: conn, Database: db, Backfill: true, Tables: []string{TableUsageDaily},
					Logger: zaptest.NewLogger(t).Named("backfill"), SinkMembers: none})
			}
		}}
	_, errA := Verify(ctx, repair)
	if errA == nil || !strings.Contains(errA.Error(), "swap") {
		t.Errorf("repair: %v, want its swap to fail", errA)
	}
	if errB != nil || repB == nil || repB.Differs != 0 || repB.Rebuilt != 1 {
		t.Fatalf("backfill: %v, %+v", errB, repB)
	}
	for q, want := range map[string]string{
		"SELECT toUInt64(sum(events)) FROM " + db + ".usage_daily":                                       "1\n",
		"SELECT count() FROM system.tables WHERE database = '" + db + "' AND name LIKE 'rebuild\\_\\_%'": "0\n",
		"SELECT count() FROM " + db + "." + RebuildsTable + " FINAL WHERE finished = 0":                  "0\n",
	} {
		if got, err := tsv(ctx, conn, q); err != nil || got != want {
			t.Errorf("%s = %q (%v), want %q", q, got, err, want)
		}
	}
}
