package sink

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

// scalar runs a query of one UInt64.
func (e *env) scalar(q string) uint64 {
	e.t.Helper()
	var n uint64
	if err := e.conn.QueryRow(ctxT(e.t, time.Minute), q).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
	return n
}

// derivedCounts are the event counts of the tables fed by usage_events,
// as analysts read them.
func (e *env) derivedCounts() [3]uint64 {
	return [3]uint64{
		e.scalar("SELECT count() FROM " + e.db + ".events_by_customer FINAL"),
		e.scalar("SELECT toUInt64(sum(events)) FROM " + e.db + ".usage_daily"),
		e.scalar("SELECT toUInt64(sum(accepted)) FROM " + e.db + ".source_daily"),
	}
}

func (e *env) verifyConfig(repair bool) VerifyConfig {
	return VerifyConfig{Conn: e.conn, Database: e.db, Repair: repair, Logger: zaptest.NewLogger(e.t),
		SinkMembers: GroupMembers(testenv.Admin(e.t, e.brokers), "", e.group)}
}

func statuses(rep *VerifyReport) map[string]string {
	out := map[string]string{}
	for _, m := range rep.Months {
		out[fmt.Sprintf("%s/%d", m.Table, m.Month)] = m.Status
	}
	return out
}

// TestVerifyRepairsAFailedView makes a view throw (throwIf) on a crafted
// value while the real sink writes: ClickHouse writes the ledger table,
// then fails in the view; the sink splits the refused block, finds every
// row in the ledger and skips them, so the derived table stays short. verify
// finds the month, refuses to rebuild while the sink runs, and rebuilds it
// once the sink stopped; afterwards every derived table equals the ledger.
// A zombie's duplicate ledger row (summed twice by the rollups) is found
// and repaired the same way.
func TestVerifyRepairsAFailedView(t *testing.T) {
	e := newEnv(t, 2)
	jan := time.Date(2024, 1, 10, 0, 0, 0, 0, time.UTC)
	feb := time.Date(2024, 2, 10, 0, 0, 0, 0, time.UTC)
	batch := func(n int, start time.Time, offset int) []*kgo.Record {
		var recs []*kgo.Record
		for p := int32(0); p < e.parts; p++ {
			for i := 0; i < n; i++ {
				recs = append(recs, deduped(e.names.DedupedTopic(), p, offset+i, start.Add(time.Duration(i)*time.Minute)))
			}
		}
		return recs
	}
	r := e.start(nil)
	e.produce(batch(50, jan, 0)...)
	e.waitCaughtUp(time.Minute, e.names.DedupedTopic())
	if got := e.derivedCounts(); got != [3]uint64{100, 100, 100} {
		t.Fatalf("derived counts after January: %v, want 100 each", got)
	}

	// The view of events_by_customer, made to throw on a crafted value: a
	// February block that holds it is written to usage_events, then the
	// view fails. The sink sees a refused block, splits it, finds every
	// row in the ledger and skips them all.
	ctx := ctxT(t, 5*time.Minute)
	view := derivedView(t, TableEventsByCustomer)
	poisoned := strings.Replace(view.Select, "quantity,", "quantity + throwIf(customer_id = 'poison') AS quantity,", 1)
	if poisoned == view.Select {
		t.Fatal("the view's SELECT has no 'quantity,' to poison")
	}
	for _, q := range []string{"DROP TABLE " + e.db + "." + view.Name,
		"CREATE MATERIALIZED VIEW " + view.Name + " TO " + view.Target + " AS " + poisoned} {
		if err := e.conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	refusedBefore := metric(t, r.reg, "meterline_sink_insert_errors_total", "table", TableEvents, "kind", "refused")
	recs := batch(30, feb, 50)
	poison := &schemas.DedupedEvent{EventID: "poison-1", CustomerID: "poison", Meter: "api_calls", Quantity: 1,
		EventTime: feb.UnixMilli(), Source: "gw", IngestTime: feb.UnixMilli()}
	recs = append(recs, &kgo.Record{Topic: e.names.DedupedTopic(), Partition: 0, Key: []byte("poison/api_calls"), Value: schemas.MustEncode(poison), Timestamp: feb})
	e.produce(recs...)
	deadline := time.Now().Add(time.Minute)
	for metric(t, r.reg, "meterline_sink_insert_errors_total", "table", TableEvents, "kind", "refused") == refusedBefore {
		if time.Now().After(deadline) {
			t.Fatal("the poisoned view never failed an INSERT into usage_events")
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.waitCaughtUp(time.Minute, e.names.DedupedTopic())
	// The view as the migration defines it, again.
	for _, q := range []string{"DROP TABLE " + e.db + "." + view.Name,
		"CREATE MATERIALIZED VIEW " + view.Name + " TO " + view.Target + " AS " + view.Select} {
		if err := e.conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	e.exact(TableEvents, 161)
	if n := metric(t, r.reg, "meterline_sink_rows_total", "outcome", "parked"); n != 0 {
		t.Fatalf("%v rows parked: the ledger took every row", n)
	}
	short := e.derivedCounts()
	if short[0] >= 161 {
		t.Fatalf("events_by_customer has %d rows: the failed view lost nothing, so the test proves nothing", short[0])
	}
	t.Logf("after the failed view: ledger 161 events, derived (events_by_customer, usage_daily, source_daily) %v", short)

	// A compare is allowed while the sink runs; a rebuild is not.
	rep, err := Verify(ctx, e.verifyConfig(false))
	if err != nil {
		t.Fatal(err)
	}
	st := statuses(rep)
	if st["events_by_customer/202402"] != MonthDiffers || rep.Differs == 0 {
		t.Fatalf("dry run: %v", st)
	}
	if st["events_by_customer/202401"] != MonthSkipped {
		t.Fatalf("January is the ledger's oldest month: want it skipped by default, got %q", st["events_by_customer/202401"])
	}
	refused, err := Verify(ctx, e.verifyConfig(true))
	if !errors.Is(err, ErrSinkRunning) {
		t.Fatalf("repair while the sink runs: %v, want ErrSinkRunning", err)
	}
	// What meterline verify prints then: the months that differ, counted.
	if refused == nil || refused.Differs != rep.Differs || refused.Rebuilt != 0 {
		t.Fatalf("the refused repair's report: %+v, want %d month(s) differing and none rebuilt", refused, rep.Differs)
	}
	if err := CheckRebuilds(ctx, e.conn); err != nil {
		t.Fatalf("a refused rebuild must not block the sink: %v", err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	waitMembers(t, e.brokers, e.group, 0)

	rep, err = Verify(ctx, e.verifyConfig(true))
	if err != nil {
		t.Fatal(err)
	}
	st = statuses(rep)
	for _, tbl := range []string{TableEventsByCustomer, TableUsageDaily, TableSourceDaily} {
		k := tbl + "/202402"
		if tbl == TableEventsByCustomer && st[k] != MonthRebuilt {
			t.Errorf("%s: %q, want rebuilt", k, st[k])
		}
		if st[k] != MonthRebuilt && st[k] != MonthEqual {
			t.Errorf("%s: %q after the repair", k, st[k])
		}
	}
	if rep.Differs != 0 || rep.Rebuilt == 0 {
		t.Fatalf("repair: %d differ, %d rebuilt: %v", rep.Differs, rep.Rebuilt, st)
	}
	if got := e.derivedCounts(); got != [3]uint64{161, 161, 161} {
		t.Fatalf("derived counts after the repair: %v, want 160 each", got)
	}
	if n := e.scalar("SELECT count() FROM system.tables WHERE database = '" + e.db + "' AND name LIKE 'rebuild\\_\\_%'"); n != 0 {
		t.Errorf("%d staging tables left behind", n)
	}

	// A zombie sink's duplicate of a February row: the ledger collapses it,
	// the rollups summed it.
	if err := e.conn.Exec(ctx, "INSERT INTO "+e.db+".usage_events SELECT * FROM "+e.db+".usage_events WHERE kafka_partition = 1 AND kafka_offset = 60"); err != nil {
		t.Fatal(err)
	}
	if got := e.scalar("SELECT toUInt64(sum(events)) FROM " + e.db + ".usage_daily"); got != 162 {
		t.Fatalf("usage_daily after the zombie's row: %d, want 162 (the rollup sums it)", got)
	}
	rep, err = Verify(ctx, e.verifyConfig(true))
	if err != nil {
		t.Fatal(err)
	}
	st = statuses(rep)
	if st["usage_daily/202402"] != MonthRebuilt || st["events_by_customer/202402"] != MonthEqual || rep.Differs != 0 {
		t.Fatalf("after the zombie's row: %v (%d differ)", st, rep.Differs)
	}
	if got := e.derivedCounts(); got != [3]uint64{161, 161, 161} {
		t.Fatalf("derived counts after the second repair: %v, want 160 each", got)
	}
	if err := CheckRebuilds(ctx, e.conn); err != nil {
		t.Fatal(err)
	}
}

// derivedView returns the (first) view of a derived table, as the
// migrations define it.
func derivedView(t *testing.T, table string) View {
	t.Helper()
	ds, err := DerivedTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Name == table {
			return d.Views[0]
		}
	}
	t.Fatalf("no derived table %s", table)
	return View{}
}

// TestRetentionDropsMonths drops the oldest month of the raw-event tables
// with the statements of docs/operations.md (Retention), and checks what
// verify then does: the month after the ledger's new oldest month is
// still compared and equal, the months before are skipped, and nothing is
// rebuilt (so an analyst month whose ledger rows are gone, as January of
// unbilled_events, kept a month longer, is never emptied).
func TestRetentionDropsMonths(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 5*time.Minute)
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	data := SyntheticData{Events: 30_000, Revisions: 3_000, Customers: 50, Months: 4, Partitions: 4}
	for _, s := range data.Statements(db) {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range documentedRetention(t) {
		if err := conn.Exec(ctx, d); err != nil {
			t.Fatalf("%v\n%s", err, d)
		}
	}
	cfg := VerifyConfig{Conn: conn, Database: db, Repair: true, Logger: zaptest.NewLogger(t),
		SinkMembers: func(context.Context) ([]string, error) { return nil, nil }}
	rep, err := Verify(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := statuses(rep)
	// The ledger's events now start in February (by Kafka timestamp):
	// March on is checked, February (its oldest month) is not, and
	// January of the analyst tables is gone as it should be.
	for k, want := range map[string]string{
		"events_by_customer/202402": MonthSkipped, "events_by_customer/202403": MonthEqual, "events_by_customer/202404": MonthEqual,
		"usage_daily/202403": MonthEqual, "source_daily/202403": MonthEqual, "unbilled_events/202403": MonthEqual,
		"invoice_lines/202402": MonthEqual, "aggregates_current/202402": MonthEqual,
	} {
		if st[k] != want {
			t.Errorf("%s: %q, want %q", k, st[k], want)
		}
	}
	// January's analyst rows are gone; a few ledger rows of January
	// events written in February remain: skipped, never rebuilt.
	if s, ok := st["events_by_customer/202401"]; ok && s != MonthSkipped {
		t.Errorf("events_by_customer/202401: %q, want skipped or absent", s)
	}
	if s := st["unbilled_events/202401"]; s != MonthSkipped {
		t.Errorf("unbilled_events/202401 (kept a month longer): %q, want skipped", s)
	}
	if rep.Rebuilt != 0 || rep.Differs != 0 || rep.RunID != "" {
		t.Fatalf("retention made verify rebuild or report differences: %+v", st)
	}
	// The billing tables were not dropped: their months are all checked.
	var months []string
	for k, v := range st {
		if strings.HasPrefix(k, TableInvoiceLines+"/") && v == MonthEqual {
			months = append(months, k)
		}
	}
	if len(months) < 3 {
		t.Errorf("invoice_lines months compared: %v", months)
	}
}

// TestBackfillKilledAndRerun migrates a database that already holds data
// (the ledger tables only) to the analyst tables, and backfills them with
// the real binary, `meterline verify --backfill`, killed twice half-way
// (by SIGKILL at a fault point after a month was swapped in, and by the
// test's own SIGKILL while a staging table fills), then run to the end.
// Meanwhile the sink refuses to start, and the backfill refuses to run
// while the sink's group has a member. At the end every analyst table
// equals the ledger in every month, no staging table is left, and the
// sink may start.
func TestBackfillKilledAndRerun(t *testing.T) {
	brokers := testenv.RealKafka(t)
	addr := testenv.RealClickHouse(t)
	conn, db := testenv.ClickHouseDB(t)
	bin := testenv.Meterline(t)
	ctx := ctxT(t, 10*time.Minute)
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrate(ctx, conn, ms[:1]); err != nil {
		t.Fatal(err)
	}
	data := SyntheticData{Events: 100_000, Revisions: 10_000, Customers: 500, Months: 3, Partitions: 8}
	for _, s := range data.Statements(db) {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	res, err := Migrate(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if !res[len(res)-1].Applied {
		t.Fatal("the analyst tables' migration was not applied")
	}
	if n := e2count(t, conn, "SELECT count() FROM "+db+".events_by_customer"); n != 0 {
		t.Fatalf("events_by_customer has %d rows before the backfill", n)
	}
	if err := CheckRebuilds(ctx, conn); !errors.Is(err, ErrRebuildUnfinished) {
		t.Fatalf("after migrating a database with data: %v, want ErrRebuildUnfinished", err)
	}
	group := testenv.Name(t, "backfill-sink")
	sinkRefuses := func() {
		t.Helper()
		w, err := New(Config{Config: session.Config{Kafka: kafka.Config{Brokers: brokers}, Group: group, InstanceID: "i1"}, Topics: testTopics(), Conn: conn, Database: db,
			Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := w.Run(rctx); !errors.Is(err, ErrRebuildUnfinished) {
			t.Fatalf("sink during an unfinished backfill: %v, want ErrRebuildUnfinished", err)
		}
	}
	sinkRefuses()

	args := []string{"verify", "--backfill", "--database", db, "--clickhouse", addr, "--brokers", strings.Join(brokers, ","), "--group", group}
	logs := testenv.LogDir(t, "backfill")
	run := func(name, fault string) *testenv.Process {
		return testenv.StartProcessOpts(t, testenv.ProcessOpts{Fault: fault, MayDie: true}, name, logs+"/"+name+".log", bin, args...)
	}

	// A member in the sink's group: the backfill refuses, and its record
	// of the attempt does not linger.
	topic := testenv.Name(t, "backfill-topic")
	testenv.CreateTopic(t, brokers, topic, 1, nil)
	member, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic))
	if err != nil {
		t.Fatal(err)
	}
	pollCtx, stopPoll := context.WithCancel(ctx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for pollCtx.Err() == nil {
			member.PollFetches(pollCtx)
		}
	}()
	waitMembers(t, brokers, group, 1)
	p := run("backfill-0", "")
	if !p.Wait(2*time.Minute) || p.ExitString() == "exit status 0" || !strings.Contains(p.LogText(), "group has members") {
		t.Fatalf("backfill with a member in the sink's group: %s\n%s", p.ExitString(), p.Tail(20))
	}
	stopPoll()
	<-polled
	member.Close()
	waitMembers(t, brokers, group, 0)
	// The migrations that create or replace analyst views on a database
	// with data each record one (004_analyst_tables.sql, 006_compact_views.sql,
	// 012_usage_daily_wide_quantity.sql).
	if runs, err := unfinishedRebuilds(ctx, conn, db); err != nil || len(runs) != 3 {
		t.Fatalf("unfinished rebuilds after the refused backfill: %v, %v; want only the migrations' three", runs, err)
	}

	// 1. Killed at a fault point: after the second month swapped in.
	p = run("backfill-1", FaultRebuildSwapped+"@2")
	p.ExpectFaultKill(t, FaultRebuildSwapped, 3*time.Minute)
	sinkRefuses()
	// 2. Killed by the test while a later table's staging table fills.
	p = run("backfill-2", "")
	p.WaitLog(t, regexp.MustCompile(`rebuild: filling staging table.*`+TableAggregatesCurrent), 3*time.Minute)
	p.Kill(t)
	sinkRefuses()
	if n := e2count(t, conn, "SELECT count() FROM system.tables WHERE database = '"+db+"' AND name LIKE 'rebuild\\_\\_%'"); n == 0 {
		t.Log("no staging table was left by the kill (it fell between steps)")
	}
	// 3. To the end.
	p = run("backfill-3", "")
	if !p.Wait(5*time.Minute) || p.ExitString() != "exit status 0" {
		t.Fatalf("third backfill: %s\n%s", p.ExitString(), p.Tail(30))
	}
	t.Logf("backfill output:\n%s", p.Tail(40))

	if err := CheckRebuilds(ctx, conn); err != nil {
		t.Fatalf("after the backfill: %v", err)
	}
	if n := e2count(t, conn, "SELECT count() FROM system.tables WHERE database = '"+db+"' AND name LIKE 'rebuild\\_\\_%'"); n != 0 {
		t.Errorf("%d staging tables left", n)
	}
	for _, q := range [][2]string{
		{"SELECT count() FROM " + db + ".usage_events", "SELECT count() FROM " + db + ".events_by_customer FINAL"},
		{"SELECT count() FROM " + db + ".usage_events", "SELECT toUInt64(sum(events)) FROM " + db + ".usage_daily"},
		{"SELECT count() FROM " + db + ".usage_events", "SELECT toUInt64(sum(accepted)) FROM " + db + ".source_daily"},
		{"SELECT count() FROM " + db + ".usage_duplicates", "SELECT toUInt64(sum(duplicates)) FROM " + db + ".source_daily"},
		{"SELECT uniqExact(customer_id, meter, group_key, period_start) FROM " + db + ".usage_aggregates", "SELECT count() FROM " + db + ".aggregates_current FINAL"},
		{"SELECT count() FROM " + db + ".usage_adjustments", "SELECT count() FROM " + db + ".invoice_lines FINAL WHERE line_kind = 'adjustment'"},
		{"SELECT count() FROM " + db + ".usage_rejected WHERE stage = 'aggregator' AND event_id != ''", "SELECT count() FROM " + db + ".unbilled_events FINAL"},
	} {
		led, der := e2count(t, conn, q[0]), e2count(t, conn, q[1])
		if led != der || led == 0 {
			t.Errorf("%s = %d, %s = %d", q[0], led, q[1], der)
		}
	}
	rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: 202401, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range rep.Months {
		if m.Status != MonthEqual {
			t.Errorf("after the backfill: %s %d %s: ledger %v, derived %v", m.Table, m.Month, m.Status, m.Ledger, m.Derived)
		}
	}
}

func e2count(t *testing.T, conn driver.Conn, q string) uint64 {
	t.Helper()
	var n uint64
	if err := conn.QueryRow(ctxT(t, time.Minute), q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// waitMembers waits until the group has n members.
func waitMembers(t *testing.T, brokers []string, group string, n int) {
	t.Helper()
	members := GroupMembers(testenv.Admin(t, brokers), "", group)
	deadline := time.Now().Add(time.Minute)
	for {
		m, err := members(context.Background())
		if err == nil && len(m) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s: members %v (%v), want %d", group, m, err, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
