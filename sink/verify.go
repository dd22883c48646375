package sink

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"hash/fnv"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/fault"
)

// RebuildsTable records rebuilds of derived tables (the analyst tables' migration).
const RebuildsTable = "meterline_rebuilds"

// Fault points of a rebuild (package fault), for the crash tests.
const (
	// FaultRebuildFilled: a derived table's staging table is filled, no
	// month of it is swapped in yet.
	FaultRebuildFilled = "sink.rebuild-filled"
	// FaultRebuildSwapped: one month of a derived table is swapped in,
	// others may not be.
	FaultRebuildSwapped = "sink.rebuild-swapped"
)

// ErrRebuildUnfinished is returned (wrapped) by CheckRebuilds, and so by
// the sink at start, while a rebuild of a derived table has not finished:
// rows the sink wrote meanwhile could be lost by the rebuild's partition
// swap. Finish it with `meterline verify --backfill`.
var ErrRebuildUnfinished = errors.New("rebuild of derived tables unfinished")

// ErrSinkRunning is returned (wrapped) by Verify when it would rebuild a
// month while the sink's consumer group has members: the views would
// write rows into the month while it is rebuilt, and the swap would drop
// them. MigrateStopped returns it when it would migrate a database that a
// running sink writes.
var ErrSinkRunning = errors.New("the sink's consumer group has members")

// VerifyConfig configures Verify.
type VerifyConfig struct {
	// Conn is a connection whose calls Verify bounds with its own
	// deadlines.
	Conn driver.Conn
	// Database holds the ledger and derived tables.
	Database string
	// Tables names the derived tables to check or rebuild. Default: all;
	// with Backfill and an unfinished rebuild, that rebuild's tables.
	Tables []string
	// Since is the first month (YYYYMM) compared. Default: the month after
	// the oldest month the ledger tables hold (by Kafka timestamp), the
	// first month whose sources are all still in the ledger whatever was
	// dropped before it (docs/operations.md, retention). A month before it
	// is never rebuilt by a comparison.
	Since uint32
	// Repair rebuilds the months that differ. Without it Verify only
	// compares, which it may do while the sink runs.
	Repair bool
	// Backfill rebuilds every month the ledger holds of the tables,
	// without comparing first (a new derived table on a database with
	// data, or an unfinished rebuild).
	Backfill bool
	// SinkMembers returns the members of the sink's consumer group. A
	// rebuild runs only when it returns none, checked after the rebuild is
	// recorded (so a sink that starts later refuses) and again before each
	// partition swap. Required for Repair and Backfill.
	SinkMembers func(ctx context.Context) ([]string, error)
	// Logger logs each comparison and rebuild step. Default: none.
	Logger *zap.Logger
	// Now dates the rebuild records. Default: time.Now.
	Now func() time.Time
	// QueryTimeout bounds each query and each fill. Default: 1 hour.
	QueryTimeout time.Duration

	// stepHook, when set, is called at each step of a rebuild of a table
	// (stepCreated, stepFilled), for the tests that interleave two runs.
	stepHook func(step, table string)
}

// Steps of a rebuild that VerifyConfig.stepHook is called at.
const (
	// stepCreated: the staging table is created, not filled yet.
	stepCreated = "created"
	// stepFilled: the staging table is filled, no month is swapped in yet.
	stepFilled = "filled"
	// stepLedgerMeasured: a comparison read the ledger side of a table,
	// not its derived side yet.
	stepLedgerMeasured = "ledger-measured"
)

// Month statuses of a VerifyReport.
const (
	MonthEqual   = "equal"
	MonthDiffers = "differs"
	MonthRebuilt = "rebuilt"
	MonthSkipped = "skipped"
	// MonthInFlight: the month was written while it was compared (a sink
	// runs), in both of the comparisons made of it: not compared.
	MonthInFlight = "in-flight"
)

// MonthCheck is one month of one derived table.
type MonthCheck struct {
	Table  string
	Month  uint32
	Status string
	// Ledger and Derived are the measures (DerivedTable.Measures), nil
	// when that side has no row of the month. After a rebuild they are the
	// measures compared after the swap.
	Ledger, Derived []string
	Note            string
}

// VerifyReport is what Verify found and did.
type VerifyReport struct {
	Months []MonthCheck
	// Differs counts the months that still differ.
	Differs int
	// Rebuilt counts the months rebuilt.
	Rebuilt int
	// InFlight counts the months written while they were compared
	// (MonthInFlight).
	InFlight int
	// RunID names the rebuild, if one ran.
	RunID string
	// DoubleFinals are the aggregate keys with more than one FINAL
	// revision in usage_aggregates (doubleFinalsSQL): the invoice query
	// reads one of them, whichever ClickHouse read last. No rebuild
	// mends it: the ledger itself holds both.
	DoubleFinals []DoubleFinal
	// DoubleFinalKeys counts every such key; DoubleFinals lists the first
	// maxDoubleFinals of them (by month, customer, meter, group, period).
	DoubleFinalKeys int
}

// maxDoubleFinals bounds the keys a report lists, and maxFinalsListed the
// FINAL rows it lists of one key: a ledger broken at scale is reported
// with its counts, not in full.
const (
	maxDoubleFinals = 100
	maxFinalsListed = 10
)

// DoubleFinal is an aggregate key with more than one FINAL revision.
type DoubleFinal struct {
	// Month is that of PeriodStart, the month of its invoice line.
	Month                    uint32
	CustomerID, Meter, Group string
	PeriodStart              string
	// Finals are its FINAL rows, each "revision R value V at
	// partition/offset" (the record of usage.aggregates it came from),
	// sorted, the first maxFinalsListed of them; Count counts them all.
	Finals []string
	Count  uint64
}

// doubleFinalsSQL lists the aggregate keys with FINAL rows of more than
// one record of usage.aggregates (a zombie sink's copy of a row has the
// record's partition and offset, and is not counted twice): the
// aggregator emits one FINAL revision per key, and the analyst tables
// keep one of two, silently. Only FINAL rows are grouped, one per key; it
// runs on ClickHouse 18.16 and current releases alike
// (TestVerifyDoubleFinalsOnChdb). %[1]s is the database, %[2]d the most
// keys listed (doubleFinalsCountSQL counts them all), %[3]d the most FINAL
// rows listed of one key.
const doubleFinalsSQL = `SELECT toYYYYMM(period_start) AS month, customer_id, meter, group_key, period_start,
       arraySlice(arraySort(groupArray(concat('revision ', toString(revision), ' value ', toString(value),
                                   ' at ', toString(kafka_partition), '/', toString(kafka_offset)))), 1, %[3]d) AS finals,
       count() AS n
` + doubleFinalsFrom + `
ORDER BY month, customer_id, meter, group_key, period_start
LIMIT %[2]d`

// doubleFinalsCountSQL counts the keys doubleFinalsSQL lists.
const doubleFinalsCountSQL = `SELECT count() FROM (SELECT 1 ` + doubleFinalsFrom + `)`

// doubleFinalsFrom is the FROM, GROUP BY and HAVING of doubleFinalsSQL.
const doubleFinalsFrom = `FROM (
    SELECT DISTINCT customer_id, meter, group_key, period_start, revision, value, kafka_partition, kafka_offset
    FROM %[1]s.usage_aggregates
    WHERE status = 'FINAL'
)
GROUP BY toYYYYMM(period_start), customer_id, meter, group_key, period_start
HAVING count() > 1`

// Verify compares each derived table with the ledger per month, and with
// Repair (or Backfill) rebuilds the months that differ: each table's
// months are computed into a staging table of the run's own
// (stagingTable) from the ledger through the views' own SELECTs, then
// swapped in one partition at a time with ALTER
// TABLE ... REPLACE PARTITION ... FROM, which replaces a partition's parts
// atomically (readers see the old month or the new one, never a mix), or
// emptied with DROP PARTITION when the staging table has no row of it.
// A rebuild killed half-way leaves its record unfinished: the sink
// refuses to start, and running Verify with Backfill again redoes it (every
// step is idempotent) and drops its staging tables. Runs at the same time
// each swap in months computed wholly from the ledger. On a database with
// a migration pending (or changed) it compares nothing and returns
// CheckMigrations' error, wrapping ErrMigrationsPending
// (ErrMigrationChanged).
func Verify(ctx context.Context, cfg VerifyConfig) (*VerifyReport, error) {
	cfg.ensureDefaults()
	if cfg.Conn == nil || !databaseName.MatchString(cfg.Database) {
		return nil, fmt.Errorf("sink: verify: need a connection and a database name, got %q", cfg.Database)
	}
	if (cfg.Repair || cfg.Backfill) && cfg.SinkMembers == nil {
		return nil, errors.New("sink: verify: a rebuild needs SinkMembers, to check that no sink is running")
	}
	all, err := DerivedTables()
	if err != nil {
		return nil, err
	}
	// Months are the server's: compared and swapped in UTC only.
	if err := CheckTimeZone(ctx, cfg.Conn); err != nil {
		return nil, err
	}
	// The measures read the columns of every migration: on a database
	// mid-upgrade, the sink's refusal rather than ClickHouse's unknown
	// column, before anything is compared or rebuilt.
	if err := checkMigrationsIn(ctx, cfg.Conn, cfg.Database+"."+MigrationsTable); err != nil {
		return nil, err
	}
	v := &verifier{cfg: cfg, log: cfg.Logger}
	names := cfg.Tables
	var unfinished []rebuildRun
	if cfg.Backfill {
		if unfinished, err = v.unfinished(ctx); err != nil {
			return nil, err
		}
		if len(names) == 0 {
			for _, r := range unfinished {
				names = append(names, r.tables...)
			}
		}
	}
	tables, err := pickTables(all, names)
	if err != nil {
		return nil, err
	}
	rep := &VerifyReport{}
	if rep.DoubleFinals, rep.DoubleFinalKeys, err = v.doubleFinals(ctx, tables); err != nil {
		return nil, err
	}
	plan := map[string][]uint32{}
	var planned []DerivedTable
	for _, d := range tables {
		checks, months, err := v.checkTable(ctx, d)
		if err != nil {
			return nil, err
		}
		if len(months) > 0 {
			plan[d.Name] = months
			planned = append(planned, d)
		}
		rep.Months = append(rep.Months, checks...)
	}
	// The report counts what the months' statuses say even when a
	// rebuild stopped (a sink joined, a query failed): a refused rebuild
	// leaves the months that differ counted as differing.
	err = v.repair(ctx, rep, planned, plan, unfinished, tables)
	for _, c := range rep.Months {
		switch c.Status {
		case MonthDiffers:
			rep.Differs++
		case MonthRebuilt:
			rep.Rebuilt++
		case MonthInFlight:
			rep.InFlight++
		}
	}
	return rep, err
}

// repair rebuilds the planned months (with Repair or Backfill) and
// compares them again into rep, or, with nothing to rebuild, finishes the
// unfinished backfills.
func (v *verifier) repair(ctx context.Context, rep *VerifyReport, planned []DerivedTable, plan map[string][]uint32, unfinished []rebuildRun, tables []DerivedTable) error {
	cfg := v.cfg
	if len(planned) > 0 && (cfg.Repair || cfg.Backfill) {
		kind, reason := "verify", "months differ from the ledger"
		if cfg.Backfill {
			kind, reason = "backfill", "backfill of every month the ledger holds"
		}
		run, err := v.rebuild(ctx, planned, plan, kind, reason, unfinished)
		rep.RunID = run
		if err != nil {
			return err
		}
		// Compare the rebuilt months again: the report says what is there now.
		return v.recheck(ctx, planned, rep)
	}
	if len(unfinished) > 0 && cfg.Backfill {
		// Nothing to rebuild (an empty ledger): the unfinished runs are done.
		return v.finishRuns(ctx, unfinished, tables)
	}
	return nil
}

// doubleFinals returns the first maxDoubleFinals aggregate keys with more
// than one FINAL revision in usage_aggregates, and how many there are,
// when tables include one derived from it.
func (v *verifier) doubleFinals(ctx context.Context, tables []DerivedTable) ([]DoubleFinal, int, error) {
	reads := false
	for _, d := range tables {
		for _, s := range d.Sources {
			reads = reads || s == TableAggregates
		}
	}
	if !reads {
		return nil, 0, nil
	}
	fail := func(err error) ([]DoubleFinal, int, error) {
		return nil, 0, fmt.Errorf("sink: verify: FINAL revisions of %s: %w", TableAggregates, err)
	}
	qctx, cancel := context.WithTimeout(ctx, v.cfg.QueryTimeout)
	defer cancel()
	rows, err := v.cfg.Conn.Query(qctx, fmt.Sprintf(doubleFinalsSQL, v.cfg.Database, maxDoubleFinals, maxFinalsListed))
	if err != nil {
		return fail(err)
	}
	defer rows.Close()
	var out []DoubleFinal
	for rows.Next() {
		var d DoubleFinal
		var start time.Time
		if err := rows.Scan(&d.Month, &d.CustomerID, &d.Meter, &d.Group, &start, &d.Finals, &d.Count); err != nil {
			return fail(err)
		}
		d.PeriodStart = start.UTC().Format("2006-01-02 15:04:05")
		out = append(out, d)
		v.log.Error("verify: an aggregate key has more than one FINAL revision", zap.Uint32("month", d.Month),
			zap.String("customer", d.CustomerID), zap.String("meter", d.Meter), zap.String("group", d.Group),
			zap.String("period_start", d.PeriodStart), zap.Uint64("finals", d.Count), zap.Strings("first_finals", d.Finals))
	}
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	if len(out) < maxDoubleFinals {
		return out, len(out), nil
	}
	var n uint64
	if err := v.cfg.Conn.QueryRow(qctx, fmt.Sprintf(doubleFinalsCountSQL, v.cfg.Database)).Scan(&n); err != nil {
		return fail(err)
	}
	return out, int(n), nil
}

// ensureDefaults fills in the defaults of the fields left zero.
func (cfg *VerifyConfig) ensureDefaults() {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.QueryTimeout <= 0 {
		cfg.QueryTimeout = time.Hour
	}
}

// checkTable compares the derived table d with the ledger per month and
// returns every month's check and the months to rebuild (with Repair or
// Backfill).
func (v *verifier) checkTable(ctx context.Context, d DerivedTable) ([]MonthCheck, []uint32, error) {
	cfg := v.cfg
	checks, err := v.compare(ctx, d)
	if err == nil && !cfg.Backfill {
		checks, err = v.settle(ctx, d, checks)
	}
	if err != nil {
		return nil, nil, err
	}
	since := cfg.Since
	if since == 0 {
		if since, err = v.floor(ctx, d); err != nil {
			return nil, nil, err
		}
	}
	var months []uint32
	for i := range checks {
		c := &checks[i]
		switch {
		case c.Ledger == nil && c.Derived != nil && (cfg.Backfill || c.Month < since):
			c.Status, c.Note = MonthSkipped, "not in the ledger (dropped by retention?): left as is"
		case !cfg.Backfill && c.Month < since:
			c.Status, c.Note = MonthSkipped, fmt.Sprintf("before %d, the first month whose sources the ledger holds in full (--since to check it)", since)
			if !equal(c.Ledger, c.Derived) {
				c.Note += "; differs"
			}
		case c.Status == MonthInFlight:
		case cfg.Backfill:
			c.Status = MonthDiffers
			months = append(months, c.Month)
		case equal(c.Ledger, c.Derived):
			c.Status = MonthEqual
		default:
			c.Status = MonthDiffers
			months = append(months, c.Month)
		}
		// Debug: the command prints each check (its report) already.
		v.log.Debug("verify", zap.String("table", d.Name), zap.Uint32("month", c.Month), zap.String("status", c.Status),
			zap.Strings("ledger", c.Ledger), zap.Strings("derived", c.Derived), zap.String("note", c.Note))
	}
	return checks, months, nil
}

// settle compares d again when a month of checks differs: a running
// sink writes between the reads of the ledger side and of the derived
// side (ClickHouse writes a ledger table, then its views), so a month it
// writes meanwhile differs without anything being wrong. The second
// comparison is what the report says; a month that differs in it is
// MonthInFlight unless both its sides measured the same both times (no
// row was written to it in between: it really differs).
func (v *verifier) settle(ctx context.Context, d DerivedTable, checks []MonthCheck) ([]MonthCheck, error) {
	first := map[uint32]MonthCheck{}
	moving := false
	for _, c := range checks {
		first[c.Month] = c
		moving = moving || !equal(c.Ledger, c.Derived)
	}
	if !moving {
		return checks, nil
	}
	again, err := v.compare(ctx, d)
	if err != nil {
		return nil, err
	}
	for i := range again {
		c := &again[i]
		f, ok := first[c.Month]
		if equal(c.Ledger, c.Derived) || (ok && equal(f.Ledger, c.Ledger) && equal(f.Derived, c.Derived)) {
			continue
		}
		c.Status = MonthInFlight
		c.Note = "written while compared, twice (a sink is running?): not compared; run verify again when no sink writes the month"
	}
	return again, nil
}

// recheck compares the rebuilt tables with the ledger again and updates
// the months of rep that differed: rebuilt, or still differing.
func (v *verifier) recheck(ctx context.Context, planned []DerivedTable, rep *VerifyReport) error {
	for _, d := range planned {
		checks, err := v.compare(ctx, d)
		if err != nil {
			return err
		}
		now := map[uint32]MonthCheck{}
		for _, c := range checks {
			now[c.Month] = c
		}
		for i := range rep.Months {
			c := &rep.Months[i]
			if c.Table != d.Name || c.Status != MonthDiffers {
				continue
			}
			n := now[c.Month]
			c.Ledger, c.Derived = n.Ledger, n.Derived
			if equal(c.Ledger, c.Derived) {
				c.Status = MonthRebuilt
			} else {
				c.Note = "still differs after the rebuild (did a sink write meanwhile?)"
			}
		}
	}
	return nil
}

func pickTables(all []DerivedTable, names []string) ([]DerivedTable, error) {
	if len(names) == 0 {
		return all, nil
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var out []DerivedTable
	for _, d := range all {
		if want[d.Name] {
			out = append(out, d)
			delete(want, d.Name)
		}
	}
	if len(want) > 0 {
		var unknown, known []string
		for n := range want {
			unknown = append(unknown, n)
		}
		for _, d := range all {
			known = append(known, d.Name)
		}
		sort.Strings(unknown)
		return nil, fmt.Errorf("sink: verify: unknown derived table %s (known: %s)", strings.Join(unknown, ", "), strings.Join(known, ", "))
	}
	return out, nil
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

type verifier struct {
	cfg VerifyConfig
	log *zap.Logger
}

func (v *verifier) step(step, table string) {
	if v.cfg.stepHook != nil {
		v.cfg.stepHook(step, table)
	}
}

func (v *verifier) exec(ctx context.Context, q string) error {
	qctx, cancel := context.WithTimeout(ctx, v.cfg.QueryTimeout)
	defer cancel()
	return v.cfg.Conn.Exec(qctx, q)
}

// compare returns the month checks of d, by month, both sides measured.
func (v *verifier) compare(ctx context.Context, d DerivedTable) ([]MonthCheck, error) {
	led, err := v.measure(ctx, fmt.Sprintf(d.Ledger, v.cfg.Database), len(d.Measures))
	if err != nil {
		return nil, fmt.Errorf("sink: verify %s: ledger side: %w", d.Name, err)
	}
	v.step(stepLedgerMeasured, d.Name)
	der, err := v.measure(ctx, fmt.Sprintf(d.Derived, v.cfg.Database), len(d.Measures))
	if err != nil {
		return nil, fmt.Errorf("sink: verify %s: derived side: %w", d.Name, err)
	}
	months := map[uint32]bool{}
	for m := range led {
		months[m] = true
	}
	for m := range der {
		months[m] = true
	}
	var out []MonthCheck
	for m := range months {
		out = append(out, MonthCheck{Table: d.Name, Month: m, Ledger: led[m], Derived: der[m]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Month < out[j].Month })
	return out, nil
}

// measure runs a (month, n measures...) query.
func (v *verifier) measure(ctx context.Context, q string, n int) (map[uint32][]string, error) {
	rows, err := queryText(ctx, v.cfg.Conn, v.cfg.QueryTimeout, q)
	if err != nil {
		return nil, err
	}
	out := map[uint32][]string{}
	for _, r := range rows {
		if len(r) != n+1 {
			return nil, fmt.Errorf("%d columns, want the month and %d measures", len(r), n)
		}
		m, err := strconv.ParseUint(r[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("month %q: %w", r[0], err)
		}
		out[uint32(m)] = r[1:]
	}
	return out, nil
}

// queryText runs q and renders every value with fmt.Sprint, times as UTC
// "2006-01-02 15:04:05" and floats with 4 decimals.
func queryText(ctx context.Context, conn driver.Conn, timeout time.Duration, q string) ([][]string, error) {
	qctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rows, err := conn.Query(qctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cts := rows.ColumnTypes()
	var out [][]string
	for rows.Next() {
		dst := make([]any, len(cts))
		for i, ct := range cts {
			dst[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(dst...); err != nil {
			return nil, err
		}
		row := make([]string, len(dst))
		for i, d := range dst {
			switch x := reflect.ValueOf(d).Elem().Interface().(type) {
			case time.Time:
				row[i] = x.UTC().Format("2006-01-02 15:04:05")
			case float64:
				row[i] = fmt.Sprintf("%.4f", x)
			default:
				row[i] = fmt.Sprint(x)
			}
		}
		out = append(out, row)
	}
	return out, rows.Err()
}

// floor is the default first month compared for d: the month after the
// oldest month (by Kafka timestamp, the ledger's partition key) any of its
// source tables holds. Every source row of a derived month from the floor
// on is still in the ledger whatever older months were dropped: a derived
// row's month (event time, period, arrival) is never more than the
// producer clock skew (docs/design.md, Time: S ≤ 1 hour) after the Kafka
// timestamp of the ledger row it comes from. With no ledger data at all,
// nothing is compared.
func (v *verifier) floor(ctx context.Context, d DerivedTable) (uint32, error) {
	q := fmt.Sprintf("SELECT min(toUInt32(partition)), count() FROM system.parts WHERE database = %s AND table IN ('%s') AND active",
		quote(v.cfg.Database), strings.Join(d.Sources, "', '"))
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var oldest uint32
	var parts uint64
	if err := v.cfg.Conn.QueryRow(qctx, q).Scan(&oldest, &parts); err != nil {
		return 0, fmt.Errorf("sink: verify %s: oldest ledger month: %w", d.Name, err)
	}
	if parts == 0 {
		return 999912, nil
	}
	return nextMonth(oldest), nil
}

func nextMonth(m uint32) uint32 {
	if m%100 >= 12 {
		return (m/100+1)*100 + 1
	}
	return m + 1
}

// stagingTable is where the rebuild run names computes the derived
// table's months: rebuild__<table>__<16 hex digits of a hash of the run
// ID>, a table of that run's own, so runs at the same time never read,
// fill or drop each other's (docs/operations.md, verify and backfill).
func stagingTable(table, run string) string {
	h := fnv.New64a()
	h.Write([]byte(run))
	return fmt.Sprintf("%s__%016x", legacyStagingTable(table), h.Sum64())
}

// legacyStagingTable is the staging table of the table that releases
// before per-run staging tables shared between runs; a run killed by one
// of them may have left it.
func legacyStagingTable(table string) string { return "rebuild__" + table }

// newRunID names a rebuild run: its kind, its start, and 32 random bits,
// so two runs started in the same instant have IDs (and staging tables)
// of their own.
func newRunID(kind string, now time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s %s %x", kind, now.UTC().Format(time.RFC3339Nano), b)
}

type rebuildRun struct {
	id     string
	tables []string
	reason string
	// version is the run's latest record's (unfinishedRebuilds).
	version uint64
}

func (v *verifier) unfinished(ctx context.Context) ([]rebuildRun, error) {
	return unfinishedRebuilds(ctx, v.cfg.Conn, v.cfg.Database)
}

func unfinishedRebuilds(ctx context.Context, conn driver.Conn, db string) ([]rebuildRun, error) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rows, err := conn.Query(qctx, "SELECT run_id, tables, reason, version FROM "+db+"."+RebuildsTable+" FINAL WHERE finished = 0 ORDER BY run_id")
	if err != nil {
		return nil, fmt.Errorf("sink: read %s: %w", RebuildsTable, err)
	}
	defer rows.Close()
	var out []rebuildRun
	for rows.Next() {
		var r rebuildRun
		if err := rows.Scan(&r.id, &r.tables, &r.reason, &r.version); err != nil {
			return nil, fmt.Errorf("sink: read %s: %w", RebuildsTable, err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// CheckRebuilds returns an error wrapping ErrRebuildUnfinished while a
// rebuild of derived tables in conn's default database has not finished.
// The sink calls it before it joins its group.
func CheckRebuilds(ctx context.Context, conn driver.Conn) error {
	var db string
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := conn.QueryRow(qctx, "SELECT currentDatabase()").Scan(&db)
	cancel()
	if err != nil {
		return fmt.Errorf("sink: check rebuilds: %w", err)
	}
	runs, err := unfinishedRebuilds(ctx, conn, db)
	if err != nil {
		return err
	}
	if len(runs) == 0 {
		return nil
	}
	var ds []string
	for _, r := range runs {
		ds = append(ds, fmt.Sprintf("%q (%s; tables %s)", r.id, r.reason, strings.Join(r.tables, ", ")))
	}
	return fmt.Errorf("sink: database %s: %s: run `meterline verify --backfill --database %s` with no sink running: %w",
		db, strings.Join(ds, ", "), db, ErrRebuildUnfinished)
}

func (v *verifier) record(ctx context.Context, r rebuildRun, finished bool, version uint64) error {
	ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	b, err := v.cfg.Conn.PrepareBatch(ictx, "INSERT INTO "+v.cfg.Database+"."+RebuildsTable+" (run_id, recorded_at, tables, reason, finished, version)")
	if err != nil {
		return fmt.Errorf("sink: record rebuild %s: %w", r.id, err)
	}
	var f uint8
	if finished {
		f = 1
	}
	if err := b.Append(r.id, v.cfg.Now().UTC(), r.tables, r.reason, f, version); err != nil {
		_ = b.Abort()
		return fmt.Errorf("sink: record rebuild %s: %w", r.id, err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("sink: record rebuild %s: %w", r.id, err)
	}
	return nil
}

// The version of a finished record beats every unfinished one of the run
// before it: a run left unfinished is finished one version above its
// latest record (finishRuns), since a migration run again after that
// record finished it records the run again one version above
// (schemas/clickhouse/015_balances_current_by_month.sql).
const (
	versionStarted  = 1
	versionFinished = 2
)

// checkNoSink returns an error wrapping ErrSinkRunning while the sink's
// group has members.
func (v *verifier) checkNoSink(ctx context.Context) error {
	members, err := v.cfg.SinkMembers(ctx)
	if err != nil {
		return fmt.Errorf("sink: verify: cannot tell whether a sink is running, not rebuilding: %w", err)
	}
	if len(members) > 0 {
		return fmt.Errorf("sink: verify: not rebuilding while the sink's group has members (%s); stop the sinks first: %w",
			strings.Join(members, ", "), ErrSinkRunning)
	}
	return nil
}

func (v *verifier) rebuild(ctx context.Context, tables []DerivedTable, months map[string][]uint32, kind, reason string, unfinished []rebuildRun) (string, error) {
	run := rebuildRun{id: newRunID(kind, v.cfg.Now()), reason: reason}
	for _, d := range tables {
		run.tables = append(run.tables, d.Name)
	}
	// 1. Recorded before the group is checked: a sink starting from now on
	// refuses, and one that started before is seen in the group.
	if err := v.record(ctx, run, false, versionStarted); err != nil {
		return run.id, err
	}
	if err := v.checkNoSink(ctx); err != nil {
		if ferr := v.record(ctx, run, true, versionFinished); ferr != nil {
			err = errors.Join(err, ferr)
		}
		return run.id, err
	}
	for _, d := range tables {
		if err := v.rebuildTable(ctx, d, stagingTable(d.Name, run.id), months[d.Name]); err != nil {
			return run.id, err
		}
	}
	// 4. Done: this run, and the unfinished runs it covered.
	if err := v.record(ctx, run, true, versionFinished); err != nil {
		return run.id, err
	}
	return run.id, v.finishRuns(ctx, unfinished, tables)
}

// rebuildTable rebuilds months ms of d through staging, this run's own
// staging table of d, and drops staging. A run that fails drops its
// staging table on the way out; one that is killed leaves it to the run
// that finishes its record (finishRuns).
func (v *verifier) rebuildTable(ctx context.Context, d DerivedTable, staging string, ms []uint32) error {
	if err := v.fillAndSwap(ctx, d, staging, ms); err != nil {
		if derr := v.dropStaging(context.WithoutCancel(ctx), staging); derr != nil {
			v.log.Warn("rebuild: staging table not dropped", zap.String("staging", staging), zap.Error(derr))
		}
		return err
	}
	if err := v.dropStaging(ctx, staging); err != nil {
		return fmt.Errorf("sink: rebuild %s: %w", d.Name, err)
	}
	return nil
}

func (v *verifier) dropStaging(ctx context.Context, staging string) error {
	return v.exec(ctx, "DROP TABLE IF EXISTS "+v.cfg.Database+"."+staging)
}

// fillAndSwap fills staging with months ms of d and swaps them in.
func (v *verifier) fillAndSwap(ctx context.Context, d DerivedTable, staging string, ms []uint32) error {
	db := v.cfg.Database
	v.log.Info("rebuild: filling staging table", zap.String("table", d.Name), zap.String("staging", staging), zap.Any("months", ms))
	// 2. A fresh staging table of this run's own (no other run reads,
	// fills or drops it), filled from the ledger by the views' SELECTs.
	if err := v.exec(ctx, "CREATE TABLE "+db+"."+staging+" AS "+db+"."+d.Name); err != nil {
		return fmt.Errorf("sink: rebuild %s: %w", d.Name, err)
	}
	v.step(stepCreated, d.Name)
	for _, view := range d.Views {
		for _, q := range view.fillSQLs(db, staging, d.PartitionColumn, ms) {
			if err := v.exec(fillContext(ctx), q); err != nil {
				return fmt.Errorf("sink: rebuild %s: fill from view %s: %w", d.Name, view.Name, err)
			}
		}
	}
	fault.Hit(FaultRebuildFilled)
	v.step(stepFilled, d.Name)
	// 3. One atomic swap per month. A month not in the staging table
	// (the ledger has none of it any more) is replaced by nothing.
	for _, m := range ms {
		if err := v.checkNoSink(ctx); err != nil {
			return err
		}
		if err := v.swap(ctx, d, staging, m); err != nil {
			return fmt.Errorf("sink: rebuild %s month %d: swap: %w", d.Name, m, err)
		}
		v.log.Info("rebuild: month swapped in", zap.String("table", d.Name), zap.Uint32("month", m))
		fault.Hit(FaultRebuildSwapped)
	}
	return nil
}

// swap puts month m of staging in place of d's month m: REPLACE
// PARTITION, or DROP PARTITION when staging holds no row of m (the ledger
// has none of it any more). Both are atomic. Current ClickHouse (26.x)
// refuses REPLACE PARTITION from a source without parts in the partition,
// where 18.16 replaced the month by nothing.
func (v *verifier) swap(ctx context.Context, d DerivedTable, staging string, m uint32) error {
	db := v.cfg.Database
	qctx, cancel := context.WithTimeout(ctx, v.cfg.QueryTimeout)
	var n uint64
	err := v.cfg.Conn.QueryRow(qctx, stagedSQL(db, staging, d.PartitionColumn, m)).Scan(&n)
	cancel()
	if err != nil {
		return err
	}
	return v.exec(ctx, swapSQL(db, d.Name, staging, m, n > 0))
}

// stagedSQL counts the rows of month m in staging.
func stagedSQL(db, staging, partCol string, m uint32) string {
	return fmt.Sprintf("SELECT count() FROM %s.%s WHERE toYYYYMM(%s) = %d", db, staging, partCol, m)
}

// swapSQL is the statement that puts month m of staging in place of
// table's: staged says whether staging holds rows of m.
func swapSQL(db, table, staging string, m uint32, staged bool) string {
	if !staged {
		return fmt.Sprintf("ALTER TABLE %s.%s DROP PARTITION %d", db, table, m)
	}
	return fmt.Sprintf("ALTER TABLE %s.%s REPLACE PARTITION %d FROM %s.%s", db, table, m, db, staging)
}

// fillMemory is the memory a fill's sort or GROUP BY may take before it
// spills to disk. A view's SELECT run over a whole ledger table sorts or
// groups every row of it (a view that keeps the latest revision per key
// sorts by revision), which would exceed the server's per-query memory
// limit (10 M revisions: more than 3.7 GiB) without spilling.
const fillMemory = 1 << 30

// fillContext lets a fill's sort and GROUP BY spill to disk past
// fillMemory (ClickHouse 18.16 and current releases have both settings).
func fillContext(ctx context.Context) context.Context {
	return clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{
		"max_bytes_before_external_sort": fillMemory, "max_bytes_before_external_group_by": fillMemory}))
}

// finishRuns records as finished each unfinished run whose tables were all
// rebuilt.
func (v *verifier) finishRuns(ctx context.Context, runs []rebuildRun, done []DerivedTable) error {
	did := map[string]bool{}
	for _, d := range done {
		did[d.Name] = true
	}
	for _, r := range runs {
		covered := true
		for _, t := range r.tables {
			covered = covered && did[t]
		}
		if !covered {
			continue
		}
		if err := v.record(ctx, r, true, max(versionFinished, r.version+1)); err != nil {
			return err
		}
		// Its staging tables, if it was killed with them (this run
		// rebuilt its tables from the ledger meanwhile).
		for _, t := range r.tables {
			for _, staging := range []string{stagingTable(t, r.id), legacyStagingTable(t)} {
				if err := v.dropStaging(ctx, staging); err != nil {
					return fmt.Errorf("sink: rebuild %s: staging table of run %q: %w", t, r.id, err)
				}
			}
		}
		v.log.Info("rebuild: unfinished run finished", zap.String("run", r.id))
	}
	return nil
}

// GroupMembers returns a VerifyConfig.SinkMembers that describes group
// with adm: the client ID and host of each member. A group the broker does
// not know has no members. principal (kafka.Config.Principal) names who
// the brokers refused, when they refuse Describe on the group.
func GroupMembers(adm *kadm.Client, principal, group string) func(ctx context.Context) ([]string, error) {
	return func(ctx context.Context) ([]string, error) {
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		dg, err := adm.DescribeGroups(dctx, group)
		if err == nil {
			err = dg.Error()
		}
		if errors.Is(err, kerr.GroupAuthorizationFailed) {
			return nil, fmt.Errorf("describe group %s: %w (%s needs Describe on group %s: docs/operations.md, Security and ACLs)", group, err, principal, group)
		}
		if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
			return nil, fmt.Errorf("describe group %s: %w", group, err)
		}
		g, ok := dg[group]
		if !ok {
			return nil, fmt.Errorf("describe group %s: not in the response", group)
		}
		if g.Err != nil && !errors.Is(g.Err, kerr.GroupIDNotFound) {
			return nil, fmt.Errorf("describe group %s: %w", group, g.Err)
		}
		var out []string
		for _, m := range g.Members {
			out = append(out, fmt.Sprintf("%s (%s)", m.ClientID, m.ClientHost))
		}
		return out, nil
	}
}
