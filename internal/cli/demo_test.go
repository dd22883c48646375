package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/demo"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/sink"
)

// TestRealDemoSink runs `meterline demo --sink` (embedded broker, real
// ClickHouse): the report must reconcile the sink's tables too (plain
// count() of usage_events = unique events, and the others), and the query
// it prints must run against the demo's database and answer, per customer
// and meter, the billed totals the report reconciled (aggregates plus
// adjustments; the events the caps and credits refused left out). A second
// run on the same database starts it afresh; a database the demo did not
// make is refused.
func TestRealDemoSink(t *testing.T) {
	addr := testenv.RealClickHouse(t)
	parallelWaitingTest(t, &otherLane)
	db := fmt.Sprintf("t%d_demo_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("clickhouse: kept database %s for inspection", db)
			return
		}
		conn, err := sink.Dial(context.Background(), addr, "default", false)
		if err == nil {
			_ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db)
			_ = conn.Close()
		}
	})
	demo := func(seed int) string {
		t.Helper()
		code, out, errOut := run(t, "", "demo", "--dir", filepath.Join(t.TempDir(), "demo"), "--duration", "8s", "--rate", "300",
			"--seed", strconv.Itoa(seed), "--sink", "--clickhouse", addr, "--sink-database", db)
		if code != 0 || !strings.Contains(out, "== RECONCILED") {
			t.Fatalf("demo --sink: exit %d\n%s\n%s", code, out, errOut)
		}
		return out
	}
	out := demo(11)
	unique := reportLine(t, out, `unique events produced = events counted`)
	for what, want := range map[string]int64{
		"usage_events rows = unique events":   unique,
		"usage_duplicates rows = copies sent": reportLine(t, out, `copies sent = duplicates dropped`),
		"usage_rejected rows = bad events + refused": reportLine(t, out, `bad events = rejected events`) +
			reportLine(t, out, `refused by a cap \(over_limit, aggregator\)`) +
			reportLine(t, out, `refused for want of credit \(no_credit\)`) +
			reportLine(t, out, `other refusals by the aggregator`),
		"usage_adjustments rows = late events": reportLine(t, out, `late events = adjustments`),
	} {
		if got := reportLine(t, out, regexp.QuoteMeta(what)); got != want {
			t.Errorf("report: %s counted %d, want %d", what, got, want)
		}
	}
	if !strings.Contains(out, "== ClickHouse: the sink's tables in database "+db) {
		t.Fatalf("the report has no ClickHouse section:\n%s", out)
	}

	// The printed query, run as printed when clickhouse-client is
	// installed, else its SQL through the driver.
	m := regexp.MustCompile(`(?m)^\s*(clickhouse-client --host (\S+) --port (\d+) --database (\S+) --query "(.*)")$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the report prints no clickhouse-client command:\n%s", out)
	}
	if m[2]+":"+m[3] != addr || m[4] != db {
		t.Fatalf("the printed command names %s:%s database %s, want %s database %s", m[2], m[3], m[4], addr, db)
	}
	var tsv string
	if _, err := exec.LookPath("clickhouse-client"); err == nil {
		b, err := exec.CommandContext(ctx, "sh", "-c", m[1]).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", m[1], err, b)
		}
		tsv = string(b)
	} else {
		tsv = queryTSV(t, ctx, addr, db, m[5])
	}
	// Each row ends with a customer's quantity of a meter, which must be
	// the total the report reconciled for them.
	// Those totals are the lines under the heading "totals per customer
	// and meter", up to the line that counts the aggregates.
	section := regexp.MustCompile(`(?s)totals per customer and meter \(aggregates \+ adjustments[^)]*\):\n(.*?)\n\s+\d+ aggregates`).FindStringSubmatch(out)
	if section == nil {
		t.Fatalf("the report has no totals per customer and meter:\n%s", out)
	}
	billed := regexp.MustCompile(`(?m)^\s+ok\s+(\S+) (\S+)\s+generated\s+\d+\s+counted\s+(\d+)\s*$`).FindAllStringSubmatch(section[1], -1)
	want := map[string]string{}
	for _, b := range billed {
		want[b[1]+" "+b[2]] = b[3]
	}
	lines := strings.Split(strings.TrimSpace(tsv), "\n")
	if len(want) < 8 || len(lines) != len(want) {
		t.Fatalf("the printed query answers %d rows, the report reconciles %d totals per customer and meter:\n%s\n%s", len(lines), len(want), tsv, out)
	}
	for _, l := range lines {
		f := strings.Split(l, "\t")
		if len(f) < 3 {
			t.Fatalf("printed query: row %q, want customer, meter, ..., quantity", l)
		}
		if got, w := f[len(f)-1], want[f[0]+" "+f[1]]; got != w {
			t.Errorf("printed query: %s %s quantity %s, the report reconciled %q", f[0], f[1], got, w)
		}
	}

	// Again on the same database: it is emptied first, so the counts
	// match this run, not the sum of both.
	out = demo(12)
	if got, want := reportLine(t, out, `usage_events rows = unique events`), reportLine(t, out, `unique events produced = events counted`); got != want {
		t.Fatalf("second run: usage_events %d rows, want %d", got, want)
	}

	// A database with tables the demo did not make is refused, untouched.
	conn, err := sink.Dial(ctx, addr, "default", false)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	other := db + "_other"
	for _, q := range []string{"CREATE DATABASE " + other, "CREATE TABLE " + other + ".precious (x UInt8) ENGINE = TinyLog"} {
		if err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	defer func() { _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+other) }()
	code, _, errOut := run(t, "", "demo", "--dir", filepath.Join(t.TempDir(), "demo"), "--duration", "1s",
		"--sink", "--clickhouse", addr, "--sink-database", other)
	if code == 0 || !strings.Contains(errOut, "was not made by the demo") {
		t.Fatalf("demo on a foreign database: exit %d, want an error naming it:\n%s", code, errOut)
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = '"+other+"' AND name = 'precious'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the foreign database was touched: %d tables named precious, %v", n, err)
	}
}

// reportLine returns the "counted" number of the report line matching what.
func reportLine(t *testing.T, out, what string) int64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s+ok\s+` + what + `\s+generated\s+(\d+)\s+counted\s+(\d+)\s*$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the report has no ok line for %q:\n%s", what, out)
	}
	n, _ := strconv.ParseInt(m[2], 10, 64)
	return n
}

func queryTSV(t *testing.T, ctx context.Context, addr, db, sql string) string {
	t.Helper()
	conn, err := sink.Dial(ctx, addr, db, false)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		t.Fatalf("printed query: %v", err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var c, m string
		var n uint64
		var q int64
		if err := rows.Scan(&c, &m, &n, &q); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s\t%s\t%d\t%d\n", c, m, n, q)
	}
	return b.String()
}

// TestDemoHelpSaysWhatFlagsApply: `meterline demo --help` says that the
// demo's embedded broker takes none of the Kafka flags, which it leaves
// out (kafkaFlags), and that --clickhouse serves only --sink.
func TestDemoHelpSaysWhatFlagsApply(t *testing.T) {
	code, out, _ := run(t, "", "demo", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	if strings.Contains(out, "--brokers=") {
		t.Errorf("demo --help lists --brokers:\n%s", out)
	}
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"it takes none of the Kafka flags (--brokers, the topic names, the Kafka SASL and TLS flags)", "--clickhouse and its login and TLS flags apply only with --sink"} {
		if !strings.Contains(flat, want) {
			t.Errorf("demo --help lacks %q:\n%s", want, out)
		}
	}
}

// TestDemoLeavesADirInUseAlone: `meterline demo` on the directory of a
// demo that runs exits 1 and says so, and leaves that demo's log as it is.
func TestDemoLeavesADirInUseAlone(t *testing.T) {
	dir := t.TempDir()
	lock, err := demo.LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	logPath := filepath.Join(dir, "demo.log")
	if err := os.WriteFile(logPath, []byte("the running demo's log\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(t, "", "demo", "--dir", dir, "--duration", "1s", "--http", "", "--ingest-addr", "")
	if code != 1 || !strings.Contains(errOut, "is in use by another meterline demo; give this one its own --dir") {
		t.Errorf("exit %d, stderr:\n%s", code, errOut)
	}
	if b, err := os.ReadFile(logPath); err != nil || string(b) != "the running demo's log\n" {
		t.Errorf("the running demo's log is now %.80q... (%v)", b, err)
	}
}
