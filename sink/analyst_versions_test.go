package sink

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/meterline/meterline/internal/testenv"
)

// chdbRequest is what scripts/chdb-run.py reads.
type chdbRequest struct {
	Path       string   `json:"path"`
	Database   string   `json:"database"`
	Statements []string `json:"statements"`
	Queries    []string `json:"queries"`
}

type chdbResponse struct {
	Version string   `json:"version"`
	Results []string `json:"results"`
	Error   string   `json:"error"`
	SQL     string   `json:"sql"`
}

// runChdb runs req on chdb (ClickHouse 26.x in-process) with python.
func runChdb(ctx context.Context, python string, req chdbRequest) (chdbResponse, error) {
	in, err := json.Marshal(req)
	if err != nil {
		return chdbResponse{}, err
	}
	cmd := exec.CommandContext(ctx, python, filepath.Join("..", "scripts", "chdb-run.py"))
	cmd.Stdin = bytes.NewReader(in)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	runErr := cmd.Run()
	var resp chdbResponse
	if err := json.Unmarshal(out.Bytes(), &resp); err != nil {
		return resp, fmt.Errorf("chdb-run.py: %v (%v); stderr: %s", err, runErr, errb.String())
	}
	if resp.Error != "" {
		return resp, fmt.Errorf("chdb %s: %s\n%s", resp.Version, resp.Error, resp.SQL)
	}
	return resp, runErr
}

// tsv runs q on the 18.16 server and renders the result as ClickHouse's
// TabSeparated output, so that it can be compared byte for byte with
// chdb's.
func tsv(ctx context.Context, conn driver.Conn, q string) (string, error) {
	rows, err := conn.Query(ctx, q)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	cts := rows.ColumnTypes()
	esc := strings.NewReplacer(`\`, `\\`, "\t", `\t`, "\n", `\n`, "'", `\'`)
	var b strings.Builder
	for rows.Next() {
		dst := make([]any, len(cts))
		for i, ct := range cts {
			dst[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(dst...); err != nil {
			return "", err
		}
		for i, d := range dst {
			if i > 0 {
				b.WriteByte('\t')
			}
			switch v := reflect.ValueOf(d).Elem().Interface().(type) {
			case time.Time:
				if cts[i].DatabaseTypeName() == "Date" {
					b.WriteString(v.UTC().Format("2006-01-02"))
				} else {
					b.WriteString(v.UTC().Format("2006-01-02 15:04:05"))
				}
			case float64:
				b.WriteString(strconv.FormatFloat(v, 'f', -1, 64))
			case string:
				b.WriteString(esc.Replace(v))
			default:
				b.WriteString(fmt.Sprint(v))
			}
		}
		b.WriteByte('\n')
	}
	return b.String(), rows.Err()
}

// versionTestData is the 1-million-event version of the benchmark's data.
var versionTestData = SyntheticData{Events: 1_000_000, Revisions: 100_000, Customers: 2000, Months: 3, Partitions: 16, Chunk: 250_000}

// TestClickHouseTwoVersions applies every migration and generates the same
// million events (and their duplicates, adjustments, rejections and
// aggregates) through the views on the test server, ClickHouse 18.16, and
// on chdb, ClickHouse 26.x, then runs every documented query for the
// largest customer and a small one on both and requires the same answer,
// byte for byte, and a non-empty one. The SQL is the same on both: no
// statement or query is rewritten for either version; the one setting the
// two need alike, the time zone (UTC), is set by scripts/chdb-run.py.
func TestClickHouseTwoVersions(t *testing.T) {
	keepsServerBusy(t)
	python := testenv.Chdb(t)
	conn, db := testenv.ClickHouseDB(t)
	// The balance queries compare with now() on both servers: the data,
	// of the month of now, and both runs stay in one month.
	now := testenv.InOneMonth(t, 10*time.Minute, 2*time.Minute)
	ctx := ctxT(t, 10*time.Minute)

	stmts := migrationStatements(t)
	data := versionTestData.Statements(db)
	params := []QueryParams{
		{Customer: "cust-0", Meter: "api_calls", Month: SyntheticStart},
		{Customer: "cust-188", Meter: "tokens", Month: SyntheticStart.AddDate(0, 1, 0)},
	}
	data = append(data, balanceTestData(db, now)...)
	data = append(data, adjustmentsProgress(db))
	var queries, names []string
	for _, q := range BalanceQueries {
		queries = append(queries, q.SQL)
		names = append(names, q.Name)
	}
	for _, p := range params {
		for _, q := range AnalystQueries {
			sql, err := q.For(p)
			if err != nil {
				t.Fatal(err)
			}
			queries = append(queries, sql)
			names = append(names, fmt.Sprintf("%s (%s, %s, %s)", q.Name, p.Customer, p.Meter, p.Month.Format("2006-01")))
		}
	}

	// chdb in the background, while the server does the same.
	start := time.Now()
	chdbDone := make(chan struct{})
	var chdb chdbResponse
	var chdbErr error
	var chdbTook time.Duration
	go func() {
		defer close(chdbDone)
		chdb, chdbErr = runChdb(ctx, python, chdbRequest{Path: t.TempDir(), Database: db,
			Statements: append(append([]string{}, stmts...), data...), Queries: queries})
		chdbTook = time.Since(start)
	}()

	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	for _, s := range data {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	var got []string
	for i, q := range queries {
		r, err := tsv(ctx, conn, q)
		if err != nil {
			t.Fatalf("%s on 18.16: %v\n%s", names[i], err, q)
		}
		got = append(got, r)
	}
	serverTook := time.Since(start)
	<-chdbDone
	if chdbErr != nil {
		t.Fatal(chdbErr)
	}
	t.Logf("ClickHouse 18.16 (server): %s; ClickHouse %s (chdb): %s", serverTook.Round(time.Millisecond), chdb.Version, chdbTook.Round(time.Millisecond))
	if len(chdb.Results) != len(queries) {
		t.Fatalf("chdb answered %d queries of %d", len(chdb.Results), len(queries))
	}
	for i := range queries {
		lines := strings.Count(got[i], "\n")
		if lines == 0 {
			t.Errorf("%s: no row on 18.16; the data set must exercise every query", names[i])
		}
		if got[i] != chdb.Results[i] {
			t.Errorf("%s: 18.16 and %s differ:\n18.16:\n%s\n%s:\n%s", names[i], chdb.Version, head(got[i], 10), chdb.Version, head(chdb.Results[i], 10))
			continue
		}
		t.Logf("%s: %d rows, equal", names[i], lines)
	}
}

func head(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = append(lines[:n], fmt.Sprintf("… %d more lines\n", len(lines)-n))
	}
	return strings.Join(lines, "")
}

// adjustmentsProgress records the sink's progress on the generated
// adjustments in sink_progress, as the sink that wrote them would: each
// partition's next offset (docs/analysts.md, Invoicing exactly once).
func adjustmentsProgress(db string) string {
	return fmt.Sprintf(`INSERT INTO %[1]s.sink_progress (consumer_group, kafka_topic, kafka_partition, next_offset, written_at)
SELECT 'meterline-sink', kafka_topic, kafka_partition, toUInt64(max(kafka_offset) + 1), max(kafka_timestamp)
FROM %[1]s.usage_adjustments
GROUP BY kafka_topic, kafka_partition`, db)
}

// balanceTestData inserts balances that every query of BalanceQueries
// answers with rows at now: two revisions of a customer near its caps
// with a grant expiring later this month and a change of its caps
// scheduled (caps_until), one overdrawn, one whose
// latest period ended last month, one whose grant ends with the month and
// one whose grant expired after its latest balance, and one whose grant
// expires past DateTime's range, and one near a cap that is no longer in
// effect (its caps_until past; INSERT ... SELECT: the native driver
// would wait for data blocks after INSERT ... VALUES). Times are Unix seconds, so that both
// servers read the same instants whatever their time zone.
func balanceTestData(db string, now time.Time) []string {
	cur := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	next, prev := cur.AddDate(0, 1, 0), cur.AddDate(0, -1, 0)
	soon := now.Add(next.Sub(now) / 2).Truncate(time.Second) // this month, after now
	type grant struct {
		id                string
		amount, remaining int64
		expires           time.Time
	}
	row := func(offset int64, cust string, rev int64, start, end time.Time, meters []string, usage, limits []int64, grants []grant, overdrawn, capsUntil int64) string {
		var ids, exp, expMs, amounts, consumed, remaining, prios, from []string
		for _, g := range grants {
			ids = append(ids, strconv.Quote(g.id)[1:len(strconv.Quote(g.id))-1])
			e := int64(0)
			if !g.expires.IsZero() {
				e = g.expires.Unix()
			}
			exp = append(exp, fmt.Sprintf("toDateTime(%d)", min(e, math.MaxUint32))) // as the sink writes it
			expMs = append(expMs, strconv.FormatInt(e*1000, 10))
			amounts = append(amounts, strconv.FormatInt(g.amount, 10))
			consumed = append(consumed, strconv.FormatInt(g.amount-g.remaining, 10))
			remaining = append(remaining, strconv.FormatInt(g.remaining, 10))
			prios = append(prios, "1")
			from = append(from, "0")
		}
		ints := func(v []int64) string {
			var out []string
			for _, x := range v {
				out = append(out, strconv.FormatInt(x, 10))
			}
			return "[" + strings.Join(out, ",") + "]"
		}
		strs := func(v []string) string {
			if len(v) == 0 {
				return "[]"
			}
			return "['" + strings.Join(v, "','") + "']"
		}
		onLimit := make([]string, len(meters))
		for i := range onLimit {
			onLimit[i] = "reject"
		}
		typed := func(v []string, typ string) string {
			if len(v) == 0 {
				return "CAST([] AS Array(" + typ + "))"
			}
			return "[" + strings.Join(v, ",") + "]"
		}
		updated := start.Unix() + rev
		return fmt.Sprintf("INSERT INTO %s.usage_balances SELECT 'usage.balances', 0, %d, toDateTime(%d), %d, '%s', 'free', 0, %d, toDateTime(%d), %d, "+
			"toDateTime(%d), toDateTime(%d), %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 'deny', 0, %d, toDateTime(%d), %d",
			db, offset, updated, updated*1000, cust, rev, updated, updated*1000, start.Unix(), end.Unix(),
			strs(meters), ints(usage), ints(limits), strs(onLimit), strs(ids), typed(prios, "Int32"), typed(from, "Int64"),
			typed(exp, "DateTime"), typed(expMs, "Int64"), typed(amounts, "Int64"), typed(consumed, "Int64"), typed(remaining, "Int64"), overdrawn,
			capsUntil, capsUntil*1000)
	}
	calls := []string{"api_calls", "tokens"}
	return []string{
		row(0, "acme", 1, cur, next, calls, []int64{500, 10}, []int64{1000, 5000}, []grant{{"annual", 10_000, 10_000, time.Time{}}, {"promo", 1000, 1000, soon}}, 0, soon.Unix()),
		row(1, "acme", 2, cur, next, calls, []int64{850, 4000}, []int64{1000, 5000}, []grant{{"annual", 10_000, 7500, time.Time{}}, {"promo", 1000, 300, soon}}, 0, soon.Unix()),
		row(2, "globex", 1, cur, next, calls[:1], []int64{100}, []int64{1000}, []grant{{"trial", 500, 0, soon}, {"next", 800, 800, next.Add(24 * time.Hour)}}, 1200, 0),
		row(3, "initech", 7, prev, cur, calls[:1], []int64{990}, []int64{1000}, nil, 0, 0),
		row(4, "hooli", 1, cur, next, calls[:1], []int64{10}, []int64{1000}, []grant{{"monthly", 1000, 400, next}}, 0, 0),
		row(5, "soylent", 1, cur, next, calls[:1], []int64{10}, []int64{1000}, []grant{{"spent", 900, 600, now.Add(-time.Minute)}}, 0, 0),
		// wayne's caps changed a minute ago, after its latest balance: near
		// no cap in effect.
		row(7, "wayne", 1, cur, next, calls[:1], []int64{950}, []int64{1000}, nil, 0, now.Add(-time.Minute).Unix()),
		// A grant of 2163, whose expiry in seconds wraps to this month in a
		// UInt32: in no month's expiring credits, on either version.
		row(6, "tyrell", 1, cur, next, nil, nil, nil, []grant{{"centennial", 700, 700, soon.Add(1 << 32 * time.Second)}}, 0, 0),
	}
}
