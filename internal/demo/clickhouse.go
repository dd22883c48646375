package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"

	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
	"github.com/meterline/meterline/sink"
)

// demoMarker is a table the demo creates in its database, so that a later
// run may drop the database: a database that has tables but not this one
// was not made by the demo, and is never dropped.
const demoMarker = "meterline_demo_marker"

const sinkGroup = "meterline-sink"

var databaseName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// sinkTables are the sink's tables, in report order.
var sinkTables = []string{sink.TableEvents, sink.TableDuplicates, sink.TableRejected, sink.TableAdjustments, sink.TableAggregates, sink.TableBalances}

// prepareDatabase drops the demo's database and creates it again, migrated.
// It must be empty at the start of a run: the embedded broker starts
// afresh, its offsets start at 0 again, and the sink's resume rule would
// take the rows of an earlier run, at the same (partition, offset), for rows
// it has already written.
func prepareDatabase(ctx context.Context, srv sink.Server, db string) (driver.Conn, error) {
	if !databaseName.MatchString(db) {
		return nil, fmt.Errorf("demo: --sink-database %q: want letters, digits and underscores", db)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	admin, err := srv.Dial(ctx, "default", false)
	if err != nil {
		return nil, fmt.Errorf("demo: --sink: %w%s", err, dialHint(ctx, srv.Addr))
	}
	defer admin.Close()
	tables, marked, err := demoTables(ctx, admin, db)
	if err != nil {
		return nil, fmt.Errorf("demo: --sink: list tables of %s: %w", db, err)
	}
	if len(tables) > 0 && !marked {
		return nil, fmt.Errorf("demo: --sink: database %s on %s has tables (%s) and was not made by the demo; it is emptied at the start of every demo run, so choose another --sink-database",
			db, srv.Addr, strings.Join(tables, ", "))
	}
	for _, q := range []string{
		"DROP DATABASE IF EXISTS " + db,
		"CREATE DATABASE " + db,
		"CREATE TABLE " + db + "." + demoMarker + " (created DateTime) ENGINE = TinyLog",
	} {
		if err := admin.Exec(ctx, q); err != nil {
			return nil, fmt.Errorf("demo: --sink: %s: %w", q, err)
		}
	}
	conn, err := srv.Dial(ctx, db, false)
	if err != nil {
		return nil, fmt.Errorf("demo: --sink: %w", err)
	}
	if _, err := sink.Migrate(ctx, conn); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("demo: --sink: migrate %s: %w", db, err)
	}
	return conn, nil
}

// tableReads bounds the reads of system.tables that listTables makes
// while other tables of the database are dropped.
const tableReads = 10

// demoTables returns the tables of db (none: it is the demo's, or empty)
// and whether the demo made it. A database the demo made is told by its
// marker, read with EXISTS, which reads that one table: another demo run
// with the same database may be migrating it, dropping analyst views, and
// ClickHouse 18.16 fails a read of system.tables that meets a table being
// dropped (and may then abort). Only a database without the marker is
// listed (listTables).
func demoTables(ctx context.Context, admin driver.Conn, db string) ([]string, bool, error) {
	var marked uint8
	if err := admin.QueryRow(ctx, "EXISTS TABLE "+db+"."+demoMarker).Scan(&marked); err != nil {
		return nil, false, err
	}
	if marked > 0 {
		return nil, true, nil
	}
	tables, err := listTables(ctx, admin, db)
	return tables, false, err
}

// listTables returns the names of db's tables from system.tables, read
// again when the read fails on a table of db that is gone (code 60: a
// table dropped while it read), up to tableReads times.
func listTables(ctx context.Context, admin driver.Conn, db string) ([]string, error) {
	for i := 1; ; i++ {
		tables, err := readTables(ctx, admin, db)
		var ex *proto.Exception
		if err == nil || i == tableReads || !errors.As(err, &ex) || ex.Code != 60 {
			return tables, err
		}
	}
}

func readTables(ctx context.Context, admin driver.Conn, db string) ([]string, error) {
	rows, err := admin.Query(ctx, "SELECT name FROM system.tables WHERE database = '"+db+"'")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var tables []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		tables = append(tables, name)
	}
	return tables, rows.Err()
}

// sinkCounts returns count() of every sink table: plain count(), no FINAL,
// which the sink's resume rule keeps exact.
func sinkCounts(ctx context.Context, conn driver.Conn) (map[string]int64, error) {
	out := map[string]int64{}
	for _, t := range sinkTables {
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM "+t).Scan(&n); err != nil {
			return nil, fmt.Errorf("demo: count %s: %w", t, err)
		}
		out[t] = int64(n)
	}
	return out, nil
}

// expectedRows counts the committed records of the sink's topics that are
// rows of its tables (usage.deduped's watermarks are not).
func expectedRows(ctx context.Context, brokers []string, names topics.Names) (map[string]int64, error) {
	out := map[string]int64{}
	for table, topic := range map[string]string{
		sink.TableEvents: names.DedupedTopic(), sink.TableDuplicates: names.DuplicatesTopic(),
		sink.TableRejected: names.RejectedTopic(), sink.TableAdjustments: names.AdjustmentsTopic(),
		sink.TableAggregates: names.AggregatesTopic(), sink.TableBalances: names.BalancesTopic(),
	} {
		recs, err := topics.ReadCommitted(ctx, brokers, topic, nil)
		if err != nil {
			return nil, fmt.Errorf("demo: read %s: %w", topic, err)
		}
		for _, r := range recs {
			if k, _ := schemas.PeekKind(r.Value); table == sink.TableEvents && k == schemas.KindWatermark {
				continue
			}
			out[table]++
		}
	}
	return out, nil
}

// dialHint is what the demo adds to an error dialling ClickHouse at addr:
// how to start one when nothing answers there. When something does (a
// TLS session that failed, a refused login), the error says why, and a
// hint to start a server would mislead.
func dialHint(ctx context.Context, addr string) string {
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		_ = c.Close()
		return ""
	}
	return " (start one with deploy/local/clickhouse.sh start, or name it with --clickhouse)"
}

// chResult is what the sink wrote into ClickHouse, for the report.
type chResult struct {
	addr, db string
	// srv is how the sink reached ClickHouse: the login and TLS of the
	// command the report suggests (tryCommand).
	srv        sink.Server
	counts     map[string]int64
	meterTotal map[string]int64 // latest revision of every aggregate + adjustments, per meter
	// aggRejected counts usage_rejected's rows of stage aggregator by
	// reason; drawn sums what the grants of each customer's latest
	// balance in usage_balances have paid.
	aggRejected map[string]int64
	drawn       int64
	err         error // the tables could not be read
}

// waitSink waits until every sink table holds as many rows as its topic
// has records (or one holds more, which can only get worse, or d passes),
// then reads the tables for the report.
func waitSink(conn driver.Conn, srv sink.Server, db string, want map[string]int64, d time.Duration) *chResult {
	res := &chResult{addr: srv.Addr, db: db, srv: srv}
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		res.counts, res.err = sinkCounts(ctx, conn)
		cancel()
		if res.err == nil && (equalCounts(res.counts, want) || overCount(res.counts, want)) {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if res.err != nil {
		return res
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if res.meterTotal, res.err = meterTotals(ctx, conn); res.err != nil {
		return res
	}
	res.aggRejected, res.drawn, res.err = entitlementRows(ctx, conn)
	return res
}

// entitlementRows reads the aggregator's rejections by reason from
// usage_rejected, and the micro-credits drawn from grants as the latest
// balance of each customer in usage_balances has them.
func entitlementRows(ctx context.Context, conn driver.Conn) (map[string]int64, int64, error) {
	rows, err := conn.Query(ctx, "SELECT reason, count() FROM "+sink.TableRejected+" WHERE stage = 'aggregator' GROUP BY reason")
	if err != nil {
		return nil, 0, fmt.Errorf("demo: rejections by the aggregator: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var reason string
		var n uint64
		if err := rows.Scan(&reason, &n); err != nil {
			return nil, 0, err
		}
		out[reason] = int64(n)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	var drawn int64
	err = conn.QueryRow(ctx, `SELECT toInt64(sum(c)) FROM (SELECT customer_id, argMax(arraySum(grant_consumed), revision) AS c FROM `+
		sink.TableBalances+` GROUP BY customer_id)`).Scan(&drawn)
	if err != nil {
		return nil, 0, fmt.Errorf("demo: credits drawn: %w", err)
	}
	return out, drawn, nil
}

func equalCounts(have, want map[string]int64) bool {
	for _, t := range sinkTables {
		if have[t] != want[t] {
			return false
		}
	}
	return true
}

func overCount(have, want map[string]int64) bool {
	for _, t := range sinkTables {
		if have[t] > want[t] {
			return true
		}
	}
	return false
}

// meterTotals: per meter, the latest revision of every aggregate plus
// every adjustment (every demo meter is a SUM), read from ClickHouse.
func meterTotals(ctx context.Context, conn driver.Conn) (map[string]int64, error) {
	rows, err := conn.Query(ctx, `
SELECT meter, sum(v) FROM
(
    SELECT meter, argMax(value, revision) AS v FROM usage_aggregates
    GROUP BY customer_id, meter, group_key, period_start
    UNION ALL
    SELECT meter, sum(delta) AS v FROM usage_adjustments GROUP BY meter
)
GROUP BY meter`)
	if err != nil {
		return nil, fmt.Errorf("demo: totals per meter: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var m string
		var v int64
		if err := rows.Scan(&m, &v); err != nil {
			return nil, err
		}
		out[m] = v
	}
	return out, rows.Err()
}

// TryQuery is the query the report suggests running against the demo's
// database: each customer's billed quantity per meter, over the run's
// periods, from the invoice lines (FINAL values or latest revisions, plus
// the adjustments), as docs/analysts.md reads billable usage. These are
// the totals the report reconciles; usage_events would count the events
// the aggregator refused too.
const TryQuery = "SELECT customer_id, meter, sum(toDecimal128(value, 0)) + sum(toDecimal128(delta, 0)) AS invoice_quantity FROM invoice_lines FINAL GROUP BY customer_id, meter ORDER BY customer_id, meter"

// tryCommand is a clickhouse-client command line that runs TryQuery
// against srv: over TLS (--secure) when the sink's connection is, as its
// user. clickhouse-client takes no certificate file on its command line:
// with a CA or client certificate, a second line says which files to set
// in its configuration file (openSSL.client).
func tryCommand(srv sink.Server, db string) string {
	host, port, err := net.SplitHostPort(srv.Addr)
	if err != nil {
		host, port = srv.Addr, "9000"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "clickhouse-client --host %s --port %s", host, port)
	if srv.TLS.On() {
		b.WriteString(" --secure")
	}
	if srv.User != "" && srv.User != "default" {
		fmt.Fprintf(&b, " --user %s --password", srv.User)
	} else if !srv.Password.IsZero() {
		b.WriteString(" --password")
	}
	fmt.Fprintf(&b, " --database %s --query %q", db, TryQuery)
	var files []string
	if srv.TLS.CAFile != "" {
		files = append(files, "<caConfig>"+srv.TLS.CAFile+"</caConfig>")
	}
	if srv.TLS.CertFile != "" {
		files = append(files, "<certificateFile>"+srv.TLS.CertFile+"</certificateFile>", "<privateKeyFile>"+srv.TLS.KeyFile+"</privateKeyFile>")
	}
	if len(files) > 0 {
		fmt.Fprintf(&b, "\n  with, in clickhouse-client's configuration file (--config-file), <openSSL><client>%s</client></openSSL>", strings.Join(files, ""))
	}
	return b.String()
}
