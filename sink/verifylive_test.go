package sink

import (
	"context"
	"fmt"
	"testing"

	"go.uber.org/zap/zaptest"
)

// liveEventInsert is an event of January 2024 written into usage_events
// (and through the views into the analyst tables), at offset off, as a
// running sink writes it.
func liveEventInsert(db string, off int) string {
	return fmt.Sprintf("INSERT INTO %s.usage_events (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, "+
		"customer_id, meter, quantity, event_time, ingest_time, record_offset) "+
		"SELECT 'usage.deduped', toInt32(0), toInt64(%d), toDateTime('2024-01-11 09:01:00'), 'live-%d', 'acme', 'api_calls', "+
		"toInt64(2), toDateTime('2024-01-11 09:00:00'), toDateTime('2024-01-11 09:01:00'), toInt64(%d)", db, off, off, off)
}

// TestVerifyWhileTheSinkWrites: on ClickHouse 18.16, a sink writes a
// month between verify's reads of the ledger side and of the derived side
// of each table. A month written once meanwhile is compared again and
// found equal; a month written during every comparison is reported
// in-flight, not differing; a month that really differs (a derived
// partition dropped) still differs. Neither rebuilds nor refuses beside
// the running sink for the months in flight.
func TestVerifyWhileTheSinkWrites(t *testing.T) {
	conn, db, ctx := migratedDB(t, func(db string) []string {
		return []string{liveEventInsert(db, 1)}
	})
	tables := []string{TableEventsByCustomer, TableUsageDaily}
	off := 100
	writes := func(every bool) func(step, table string) {
		done := map[string]bool{}
		return func(step, table string) {
			if step != stepLedgerMeasured || (done[table] && !every) {
				return
			}
			done[table] = true
			off++
			if err := conn.Exec(ctx, liveEventInsert(db, off)); err != nil {
				t.Error(err)
			}
		}
	}
	rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: 202401, Tables: tables,
		Logger: zaptest.NewLogger(t), stepHook: writes(false)})
	if err != nil {
		t.Fatal(err)
	}
	if st := statuses(rep); rep.Differs != 0 || st["events_by_customer/202401"] != MonthEqual || st["usage_daily/202401"] != MonthEqual {
		t.Errorf("written once while compared: statuses %v, %d differ: %+v", st, rep.Differs, rep.Months)
	}
	// Without --dry-run, beside a running sink: nothing to rebuild, no refusal.
	members := func(context.Context) ([]string, error) { return []string{"sink-1 (/127.0.0.1)"}, nil }
	rep, err = Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: 202401, Tables: tables, Repair: true,
		SinkMembers: members, Logger: zaptest.NewLogger(t), stepHook: writes(true)})
	if err != nil {
		t.Fatalf("repair beside a running sink: %v", err)
	}
	if st := statuses(rep); rep.Differs != 0 || rep.InFlight != 2 || rep.RunID != "" ||
		st["events_by_customer/202401"] != MonthInFlight || st["usage_daily/202401"] != MonthInFlight {
		t.Errorf("written during every comparison: statuses %v, %d differ, %d in flight, run %q: %+v", st, rep.Differs, rep.InFlight, rep.RunID, rep.Months)
	}
	if err := conn.Exec(ctx, "ALTER TABLE "+db+".usage_daily DROP PARTITION 202401"); err != nil {
		t.Fatal(err)
	}
	rep, err = Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: 202401, Tables: tables, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if st := statuses(rep); rep.Differs != 1 || st["usage_daily/202401"] != MonthDiffers || st["events_by_customer/202401"] != MonthEqual {
		t.Errorf("a dropped derived month: statuses %v, %d differ: %+v", st, rep.Differs, rep.Months)
	}
}
