package sink

import (
	"fmt"
	"regexp"
	"strings"

	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

// The analyst tables (docs/design.md, The ClickHouse ledger), derived from
// the ledger tables by the materialized views of schemas/clickhouse. The
// sink never writes them: ClickHouse does, in the same INSERT as the ledger
// table, and `meterline verify` keeps them equal to the ledger (verify.go).
const (
	TableEventsByCustomer  = "events_by_customer"
	TableUsageDaily        = "usage_daily"
	TableAggregatesCurrent = "aggregates_current"
	TableInvoiceLines      = "invoice_lines"
	TableUnbilledEvents    = "unbilled_events"
	TableSourceDaily       = "source_daily"
	TableBalancesCurrent   = "balances_current"
)

// DerivedTable is an analyst table and how verify checks and rebuilds it.
//
// Verify compares, per month of the table's partition key, a few measures
// (counts, sums, and a sum of key hashes that catches rows moved between
// keys) computed twice. Sums of quantities, values and deltas are taken as
// Decimal128(0), exact: each is an untrusted Int64, and an Int64 sum
// wraps on both sides alike, hiding a difference of a multiple of 2^64.
// The measures are computed from the derived table as readers read it (FINAL
// for the ReplacingMergeTree tables), and from the ledger tables with the
// same collapsing the derived table applies (FINAL on the ledger, so that a
// zombie sink's duplicate row, which the ledger collapses, is counted once;
// argMax over revisions for the current value of an aggregate).
type DerivedTable struct {
	Name string
	// Sources are the ledger tables its views read.
	Sources []string
	// PartitionColumn is the column of its PARTITION BY toYYYYMM(...):
	// a month of the table is a partition, swapped whole by a rebuild.
	PartitionColumn string
	// Views are its materialized views, as the migrations define them.
	Views []View
	// Measures is the SELECT list of the comparison, after the month; the
	// Derived and Ledger queries return (month UInt32, measures...).
	Measures []string
	// Derived computes the measures per month from the table: %[1]s is the
	// database.
	Derived string
	// Ledger computes the same measures per month from the ledger tables:
	// %[1]s is the database.
	Ledger string
}

// View is a materialized view: INSERTs into Source are also written,
// through Select, into its target table.
type View struct {
	Name   string
	Target string
	Source string
	Select string
}

// Exactly these views and targets are expected in the migrations; a
// migration that adds a view without saying here how verify checks its
// target fails TestDerivedTablesCoverTheViews.
var derivedSpecs = []DerivedTable{
	{
		Name:            TableEventsByCustomer,
		PartitionColumn: "event_time",
		Sources:         []string{TableEvents},
		Measures:        []string{"rows", "quantity", "key_hash", "content_hash"},
		Derived: `SELECT toYYYYMM(event_time) AS month, count(), sum(toDecimal128(quantity, 0)), sum(cityHash64(customer_id, meter, event_id)),
       sum(` + eventContentHash + `)
FROM %[1]s.events_by_customer FINAL GROUP BY month`,
		Ledger: `SELECT toYYYYMM(event_time) AS month, count(), sum(toDecimal128(quantity, 0)), sum(cityHash64(customer_id, meter, event_id)),
       sum(` + eventContentHash + `)
FROM %[1]s.usage_events FINAL GROUP BY month`,
	},
	{
		Name:            TableUsageDaily,
		PartitionColumn: "day",
		Sources:         []string{TableEvents},
		Measures:        []string{"events", "quantity", "day_hash"},
		Derived: `SELECT toYYYYMM(day) AS month, sum(events), sum(quantity), sum(cityHash64(customer_id, meter, day) * events)
FROM %[1]s.usage_daily GROUP BY month`,
		Ledger: `SELECT toYYYYMM(event_time) AS month, count(), sum(toDecimal128(quantity, 0)), sum(cityHash64(customer_id, meter, toDate(event_time)))
FROM %[1]s.usage_events FINAL GROUP BY month`,
	},
	{
		Name:            TableAggregatesCurrent,
		PartitionColumn: "period_start",
		Sources:         []string{TableAggregates},
		Measures:        []string{"aggregates", "value", "revisions", "final", "key_hash", "content_hash"},
		Derived: `SELECT toYYYYMM(period_start) AS month, count(), sum(toDecimal128(value, 0)), sum(revision), countIf(status = 'FINAL'),
       sum(cityHash64(customer_id, meter, group_key, period_start)), sum(` + aggregateContentHash + `)
FROM %[1]s.aggregates_current FINAL GROUP BY month`,
		Ledger: `SELECT toYYYYMM(period_start) AS month, count(), sum(toDecimal128(v, 0)), sum(r), countIf(s = 'FINAL'),
       sum(cityHash64(customer_id, meter, group_key, period_start)), sum(h)
FROM (
    SELECT customer_id, meter, group_key, period_start,
           argMax(value, revision) AS v, toUInt64(max(revision)) AS r, argMax(status, revision) AS s,
           argMax(` + aggregateContentHash + `, revision) AS h
    FROM %[1]s.usage_aggregates
    GROUP BY customer_id, meter, group_key, period_start
) GROUP BY month`,
	},
	{
		Name:            TableInvoiceLines,
		PartitionColumn: "period_start",
		Sources:         []string{TableAggregates, TableAdjustments},
		Measures:        []string{"usage_lines", "usage_value", "final_lines", "final_value", "adjustments", "delta", "key_hash"},
		Derived: `SELECT toYYYYMM(period_start) AS month, countIf(line_kind = 'usage'), sumIf(toDecimal128(value, 0), line_kind = 'usage'),
       countIf(status = 'FINAL'), sumIf(toDecimal128(value, 0), status = 'FINAL'),
       countIf(line_kind = 'adjustment'), sumIf(toDecimal128(delta, 0), line_kind = 'adjustment'),
       sum(cityHash64(period_start, customer_id, meter, group_key, line_kind, event_id, original_period_start))
FROM %[1]s.invoice_lines FINAL GROUP BY month`,
		Ledger: `SELECT month, sum(ul), sum(uv), sum(fl), sum(fv), sum(al), sum(ad), sum(h)
FROM (
    SELECT toYYYYMM(period_start) AS month, count() AS ul, sum(toDecimal128(v, 0)) AS uv, countIf(s = 'FINAL') AS fl,
           sumIf(toDecimal128(v, 0), s = 'FINAL') AS fv, toUInt64(0) AS al, toDecimal128(0, 0) AS ad,
           sum(cityHash64(period_start, customer_id, meter, group_key, 'usage', '', period_start)) AS h
    FROM (
        SELECT customer_id, meter, group_key, period_start,
               argMax(value, revision) AS v, argMax(status, revision) AS s
        FROM %[1]s.usage_aggregates
        GROUP BY customer_id, meter, group_key, period_start
    ) GROUP BY month
    UNION ALL
    SELECT toYYYYMM(booked_period_start) AS month, toUInt64(0) AS ul, toDecimal128(0, 0) AS uv, toUInt64(0) AS fl,
           toDecimal128(0, 0) AS fv, count() AS al, sum(toDecimal128(delta, 0)) AS ad,
           sum(cityHash64(booked_period_start, customer_id, meter, group_key, 'adjustment', event_id, original_period_start)) AS h
    FROM %[1]s.usage_adjustments FINAL
    GROUP BY month
) GROUP BY month`,
	},
	{
		Name:            TableUnbilledEvents,
		PartitionColumn: "kafka_timestamp",
		Sources:         []string{TableRejected},
		Measures:        []string{"events", "key_hash", "content_hash"},
		Derived: `SELECT toYYYYMM(kafka_timestamp) AS month, count(), sum(cityHash64(customer_id, meter, event_id, source_partition, source_offset)),
       sum(` + unbilledContentHash + `)
FROM %[1]s.unbilled_events FINAL GROUP BY month`,
		Ledger: `SELECT toYYYYMM(kafka_timestamp) AS month, count(), sum(cityHash64(customer_id, meter, event_id, source_partition, source_offset)),
       sum(` + unbilledContentHash + `)
FROM %[1]s.usage_rejected FINAL WHERE stage = 'aggregator' AND event_id != '' GROUP BY month`,
	},
	{
		Name:            TableSourceDaily,
		PartitionColumn: "day",
		Sources:         []string{TableEvents, TableDuplicates},
		Measures:        []string{"accepted", "duplicates", "conflicts", "accepted_hash", "duplicates_hash"},
		Derived: `SELECT toYYYYMM(day) AS month, sum(accepted), sum(duplicates), sum(conflicts),
       sum(cityHash64(day, source) * accepted), sum(cityHash64(day, source) * duplicates)
FROM %[1]s.source_daily GROUP BY month`,
		Ledger: `SELECT month, sum(a), sum(d), sum(c), sum(ha), sum(hd)
FROM (
    SELECT toYYYYMM(ingest_time) AS month, count() AS a, toUInt64(0) AS d, toUInt64(0) AS c,
           sum(cityHash64(toDate(ingest_time), source)) AS ha, toUInt64(0) AS hd
    FROM %[1]s.usage_events FINAL GROUP BY month
    UNION ALL
    SELECT toYYYYMM(duplicate_arrival) AS month, toUInt64(0) AS a, count() AS d, countIf(conflict = 1) AS c,
           toUInt64(0) AS ha, sum(cityHash64(toDate(duplicate_arrival), source)) AS hd
    FROM %[1]s.usage_duplicates FINAL GROUP BY month
) GROUP BY month`,
	},
	{
		Name:            TableBalancesCurrent,
		PartitionColumn: "period_start",
		Sources:         []string{TableBalances},
		Measures:        []string{"customers", "revisions", "key_hash", "content_hash"},
		Derived: `SELECT toYYYYMM(period_start) AS month, count(), sum(revision), sum(cityHash64(customer_id, revision)),
       sum(` + balanceContentHash + `)
FROM %[1]s.balances_current FINAL GROUP BY month`,
		Ledger: `SELECT month, count(), sum(r), sum(cityHash64(customer_id, r)), sum(h)
FROM (
    SELECT customer_id, period_start, toYYYYMM(period_start) AS month, toUInt64(max(revision)) AS r, argMax(` + balanceContentHash + `, revision) AS h
    FROM %[1]s.usage_balances FINAL
    GROUP BY customer_id, period_start, month
) GROUP BY month`,
	},
}

// eventContentHash, aggregateContentHash and unbilledContentHash hash,
// with the row's key, every column that events_by_customer,
// aggregates_current and unbilled_events copy from the ledger but those
// the other measures add up (quantity; value, revision, status): what the
// queries of docs/analysts.md read besides, an event's time and Kafka
// coordinates (the day and the copy usage_by_day takes an unbilled event
// back from), an aggregate's group labels, aggregation and period end, a
// rejection's reason. Its key alone would let a row keep its place with
// another content.
const (
	eventContentHash = `cityHash64(customer_id, meter, event_id, event_time, event_time_ms, source, property_names, property_values,
           ingest_time, ingest_time_ms, kafka_partition, kafka_offset)`
	aggregateContentHash = `cityHash64(customer_id, meter, group_key, period_start, period_end, group_names, group_values, aggregation,
           event_count, first_event_time_ms, last_event_time_ms, updated_at_ms)`
	unbilledContentHash = `cityHash64(customer_id, meter, event_id, source_partition, source_offset, reason, detail,
           kafka_timestamp, kafka_partition, kafka_offset)`
)

// balanceContentHash hashes every column of a balance that
// balances_current copies from usage_balances but its Kafka coordinates:
// the usage, caps (and until when they hold), grants and overdraft the queries of
// docs/entitlements.md (Balances in ClickHouse) read.
const balanceContentHash = `cityHash64(customer_id, toUInt64(revision), plan, unmetered, updated_at, updated_at_ms, period_start, period_end,
           meter_names, meter_usage, meter_limits, meter_on_limit, grant_ids, grant_priorities, grant_effective_from_ms,
           grant_expires_at, grant_expires_at_ms, grant_amounts, grant_consumed, grant_remaining,
           overdraft_policy, overdraft_limit, overdrawn, caps_until, caps_until_ms)`

var createView = regexp.MustCompile(`(?s)^CREATE MATERIALIZED VIEW IF NOT EXISTS ([a-z0-9_]+) TO ([a-z0-9_]+) AS\s+(SELECT\s.*)$`)
var fromTable = regexp.MustCompile(`\bFROM ([a-z0-9_]+)\b`)

// DerivedTables returns the analyst tables with their views, read from the
// embedded migrations (a later migration's definition of a view replaces
// an earlier one's).
func DerivedTables() ([]DerivedTable, error) {
	ms, err := chschema.Migrations()
	if err != nil {
		return nil, err
	}
	views, err := parseViews(ms)
	if err != nil {
		return nil, err
	}
	return checkViews(views)
}

// checkViews assigns the views to the derived tables, and checks that
// each view writes a derived table verify knows, and each derived table's
// views read exactly its sources.
func checkViews(views []View) ([]DerivedTable, error) {
	out := make([]DerivedTable, len(derivedSpecs))
	copy(out, derivedSpecs)
	byName := map[string]int{}
	for i, d := range out {
		byName[d.Name] = i
		out[i].Views = nil
	}
	var errs []string
	for _, v := range views {
		i, ok := byName[v.Target]
		if !ok {
			errs = append(errs, fmt.Sprintf("view %s writes %s, which verify does not know", v.Name, v.Target))
			continue
		}
		out[i].Views = append(out[i].Views, v)
	}
	for _, d := range out {
		if len(d.Views) == 0 {
			errs = append(errs, fmt.Sprintf("derived table %s has no view in the migrations", d.Name))
		}
		srcs := map[string]bool{}
		for _, v := range d.Views {
			srcs[v.Source] = true
		}
		for _, s := range d.Sources {
			if !srcs[s] {
				errs = append(errs, fmt.Sprintf("derived table %s: no view reads its source %s", d.Name, s))
			}
			delete(srcs, s)
		}
		for s := range srcs {
			errs = append(errs, fmt.Sprintf("derived table %s: a view reads %s, which is not among its sources", d.Name, s))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("sink: derived tables: %s", strings.Join(errs, "; "))
	}
	return out, nil
}

func parseViews(ms []chschema.Migration) ([]View, error) {
	var order []string
	byName := map[string]View{}
	for _, m := range ms {
		for _, st := range m.Statements {
			if !strings.HasPrefix(st, "CREATE MATERIALIZED VIEW") {
				continue
			}
			sm := createView.FindStringSubmatch(st)
			if sm == nil {
				return nil, fmt.Errorf("sink: %s: a materialized view must read CREATE MATERIALIZED VIEW IF NOT EXISTS <name> TO <target> AS SELECT ...: %.80s", m.Name, st)
			}
			froms := fromTable.FindAllStringSubmatch(sm[3], -1)
			if len(froms) != 1 {
				return nil, fmt.Errorf("sink: %s: view %s must read exactly one table (FROM <table>), has %d FROM clauses", m.Name, sm[1], len(froms))
			}
			if _, ok := byName[sm[1]]; !ok {
				order = append(order, sm[1])
			}
			byName[sm[1]] = View{Name: sm[1], Target: sm[2], Source: froms[0][1], Select: sm[3]}
		}
	}
	out := make([]View, len(order))
	for i, n := range order {
		out[i] = byName[n]
	}
	return out, nil
}

// maxFillMonths is the most months one fill INSERT writes. Current
// ClickHouse refuses an INSERT block whose rows fall into more than
// max_partitions_per_insert_block partitions (100 by default; 18.16 has
// no such limit), and a view's SELECT over the whole ledger yields blocks
// that mix its months.
const maxFillMonths = 100

// fillSQLs are the INSERTs that write into staging what the view would
// have written for every row of its source in the given months: fillSQL
// for each run of at most maxFillMonths of them. Each one reads the
// whole ledger table.
func (v View) fillSQLs(db, staging, partCol string, months []uint32) []string {
	var out []string
	for i := 0; i < len(months); i += maxFillMonths {
		out = append(out, v.fillSQL(db, staging, partCol, months[i:min(i+maxFillMonths, len(months))]))
	}
	return out
}

// fillSQL is the INSERT that writes into staging what the view would have
// written for every row of its source (read with FINAL, so that a row the
// ledger collapses is counted once) in the given months of the target's
// partition key.
func (v View) fillSQL(db, staging, partCol string, months []uint32) string {
	sel := fromTable.ReplaceAllString(v.Select, "FROM "+db+".$1 FINAL")
	ms := make([]string, len(months))
	for i, m := range months {
		ms[i] = fmt.Sprint(m)
	}
	return fmt.Sprintf("INSERT INTO %s.%s SELECT * FROM (\n%s\n) WHERE toYYYYMM(%s) IN (%s)",
		db, staging, sel, partCol, strings.Join(ms, ", "))
}
