package sink

import (
	"context"
	"fmt"
	"testing"

	"go.uber.org/zap/zaptest"
)

// zombieUnbilledInserts writes, on partition 0 of usage.deduped, a block
// of two events of acme, "billed" (offset 10, quantity 3) and "refused"
// (offset 11, quantity 5, rejected by the aggregator), and the same block
// again, byte for byte: a zombie sink's INSERT that finished after the
// partition's new owner had written it (docs/analysts.md, Ledger tables).
// Merges of events_by_customer are stopped, so its two copies of each row
// stay in two parts, as they do until ClickHouse merges them.
func zombieUnbilledInserts(db string) []string {
	block := fmt.Sprintf("INSERT INTO %s.usage_events (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, "+
		"customer_id, meter, quantity, event_time, ingest_time, record_offset) "+
		"SELECT 'usage.deduped', toInt32(0), toInt64(10 + number), toDateTime('2024-01-10 09:01:00'), if(number = 0, 'billed', 'refused'), "+
		"'acme', 'api_calls', toInt64(3 + 2 * number), toDateTime('2024-01-10 09:00:00'), toDateTime('2024-01-10 09:01:00'), toInt64(10 + number) "+
		"FROM system.numbers LIMIT 2", db)
	return []string{
		"SYSTEM STOP MERGES " + db + ".events_by_customer",
		block,
		fmt.Sprintf("INSERT INTO %s.usage_rejected (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, reason, stage, "+
			"source_topic, source_partition, source_offset, customer_id, meter, event_id, record_offset) SELECT 'usage.rejected', toInt32(0), "+
			"toInt64(1), toDateTime('2024-01-10 09:02:00'), 'over_limit', 'aggregator', 'usage.deduped', toInt32(0), toInt64(11), 'acme', 'api_calls', 'refused', toInt64(1)", db),
		block, // the zombie's copy
	}
}

// zombieUnbilledWant: acme billed one event of quantity 3 on Jan 10.
const zombieUnbilledWant = "2024-01-10\tapi_calls\t1\t3\n"

// TestUsageByDayAfterZombieRepaired: once `meterline verify` has rebuilt
// usage_daily after a zombie sink's duplicate block (its rollup counted
// the block twice), usage_by_day takes the unbilled event back once,
// though events_by_customer holds both copies of it until a merge, on
// ClickHouse 18.16.
func TestUsageByDayAfterZombieRepaired(t *testing.T) {
	conn, db, ctx := migratedDB(t, zombieUnbilledInserts)
	rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: 202401, Repair: true, Logger: zaptest.NewLogger(t),
		SinkMembers: func(context.Context) ([]string, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	rebuilt := false
	for _, m := range rep.Months {
		if m.Table == TableUsageDaily && m.Month == 202401 && m.Status != MonthEqual {
			rebuilt = true
		}
	}
	if !rebuilt {
		t.Fatalf("verify found usage_daily of 202401 equal to the ledger: %+v", rep.Months)
	}
	if n := e2count(t, conn, "SELECT count() FROM "+db+".events_by_customer WHERE event_id = 'refused'"); n != 2 {
		t.Fatalf("events_by_customer holds %d rows of the refused event, want its two copies unmerged", n)
	}
	got, err := tsv(ctx, conn, usageByDay(t))
	if err != nil {
		t.Fatal(err)
	}
	if got != zombieUnbilledWant {
		t.Errorf("on 18.16:\n%q\nwant\n%q", got, zombieUnbilledWant)
	}
}

// TestUsageByDayAfterZombieRepairedOnChdb is
// TestUsageByDayAfterZombieRepaired on current ClickHouse (chdb, 26.x),
// where verify's rebuild of usage_daily's month is done by its statements:
// the month's rows written again from the ledger, read with FINAL.
func TestUsageByDayAfterZombieRepairedOnChdb(t *testing.T) {
	tables, err := DerivedTables()
	if err != nil {
		t.Fatal(err)
	}
	rebuild := func(db string) []string {
		out := append(zombieUnbilledInserts(db), "ALTER TABLE "+db+".usage_daily DROP PARTITION 202401")
		for _, d := range tables {
			if d.Name == TableUsageDaily {
				for _, v := range d.Views {
					out = append(out, v.fillSQL(db, TableUsageDaily, d.PartitionColumn, []uint32{202401}))
				}
			}
		}
		return out
	}
	checkQueryChdb(t, "zombieunbilled", rebuild, usageByDay(t), zombieUnbilledWant)
}
