package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
	"github.com/meterline/meterline/sink"
)

// TestVerifySummaryCountsSkippedApart: months that verify skipped (before
// the first month the ledger holds in full) were not compared, so the
// summary does not count them as compared; on a database whose data is
// all of one month, it says that nothing was checked and how to check it.
func TestVerifySummaryCountsSkippedApart(t *testing.T) {
	var out bytes.Buffer
	printVerify(IO{Stdout: &out}, &sink.VerifyReport{Months: []sink.MonthCheck{
		{Table: "usage_daily", Month: 202611, Status: sink.MonthSkipped},
		{Table: "invoice_lines", Month: 202611, Status: sink.MonthSkipped},
		{Table: "usage_daily", Month: 202612, Status: sink.MonthEqual},
		{Table: "invoice_lines", Month: 202612, Status: sink.MonthDiffers},
	}, Differs: 1})
	last := lastLine(out.String())
	if last != "2 month(s) compared, 1 differ; 2 skipped (not compared: --since to include them)" {
		t.Errorf("summary %q", last)
	}

	out.Reset()
	printVerify(IO{Stdout: &out}, &sink.VerifyReport{Months: []sink.MonthCheck{
		{Table: "usage_daily", Month: 202612, Status: sink.MonthSkipped},
	}})
	if last := lastLine(out.String()); last != "0 month(s) compared, 0 differ; 1 skipped (not compared: --since to include them)" {
		t.Errorf("summary %q", last)
	}
}

// TestVerifySummaryCountsInFlightApart: a month a sink wrote while it
// was compared is counted apart from the compared months, and verify
// exits 0 for it.
func TestVerifySummaryCountsInFlightApart(t *testing.T) {
	var out bytes.Buffer
	rep := &sink.VerifyReport{Months: []sink.MonthCheck{
		{Table: "usage_daily", Month: 202611, Status: sink.MonthEqual},
		{Table: "usage_daily", Month: 202612, Status: sink.MonthInFlight},
	}, InFlight: 1}
	printVerify(IO{Stdout: &out}, rep)
	if last := lastLine(out.String()); last != "1 month(s) compared, 0 differ; 1 in flight (written by a sink while compared: not compared)" {
		t.Errorf("summary %q", last)
	}
	if err := verifyFailure(rep); err != nil {
		t.Errorf("exit: %v", err)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

// TestVerifyDoubleFinalFails: an aggregate key with two FINAL revisions is
// printed, named with both rows, and verify exits 1, as for a month that
// differs; a report without one exits 0.
func TestVerifyDoubleFinalFails(t *testing.T) {
	rep := &sink.VerifyReport{Months: []sink.MonthCheck{{Table: "invoice_lines", Month: 202401, Status: sink.MonthEqual}},
		DoubleFinals: []sink.DoubleFinal{{Month: 202401, CustomerID: "acme", Meter: "api_calls", Group: "{}", PeriodStart: "2024-01-01 00:00:00",
			Finals: []string{"revision 1 value 0 at 0/70000", "revision 1 value 10 at 0/5"}, Count: 2}}, DoubleFinalKeys: 1}
	var out bytes.Buffer
	printVerify(IO{Stdout: &out}, rep)
	want := `usage_aggregates: customer "acme" meter "api_calls" group "{}" period 2024-01-01 00:00:00: 2 FINAL revisions ` +
		`(revision 1 value 0 at 0/70000; revision 1 value 10 at 0/5), one per key expected`
	if last := lastLine(out.String()); last != want {
		t.Errorf("printed %q, want %q", last, want)
	}
	var ee *ExitError
	if err := verifyFailure(rep); !errors.As(err, &ee) || ee.Code != 1 || !strings.Contains(err.Error(), "1 aggregate key(s) have more than one FINAL revision") {
		t.Errorf("exit: %v, want code 1 naming the key count", err)
	}
	// A report bounded at scale: the key's rows and the keys not listed
	// are counted.
	rep.DoubleFinals[0].Count, rep.DoubleFinalKeys = 12, 250
	out.Reset()
	printVerify(IO{Stdout: &out}, rep)
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if got := lines[len(lines)-2]; !strings.Contains(got, ": 12 FINAL revisions (revision 1 value 0 at 0/70000; revision 1 value 10 at 0/5; 10 more)") {
		t.Errorf("bounded key printed %q", got)
	}
	if last := lastLine(out.String()); last != "usage_aggregates: 249 more aggregate keys have more than one FINAL revision (the first 1 listed)" {
		t.Errorf("bounded report ends %q", last)
	}
	if err := verifyFailure(rep); err == nil || !strings.Contains(err.Error(), "250 aggregate key(s)") {
		t.Errorf("bounded exit: %v, want the 250 keys counted", err)
	}
	rep.DoubleFinals, rep.DoubleFinalKeys = nil, 0
	if err := verifyFailure(rep); err != nil {
		t.Errorf("exit without a double FINAL: %v", err)
	}
}

// TestVerifyCommandRefusedWithMigrationsPending: `meterline verify` and
// `meterline sink accept-offsets` on a database whose newest migration is
// not applied (an operator mid-upgrade) exit 1 with the sink's own
// refusal, naming the migration and `meterline migrate`, before they
// compare anything or ask Kafka (the brokers here do not answer); once
// migrated, `verify --dry-run` passes.
func TestVerifyCommandRefusedWithMigrationsPending(t *testing.T) {
	addr := testenv.RealClickHouse(t)
	conn, db := testenv.ClickHouseDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	// The database as the previous build's migrate left it.
	recordMigrations(ctx, t, conn, ms[:len(ms)-1], true)
	pending := ms[len(ms)-1].Name
	want := "sink: " + pending + " not applied (run `meterline migrate`): migrations pending"
	common := []string{"--clickhouse", addr, "--database", db, "--brokers", "127.0.0.1:1"}
	for _, c := range []struct{ name, flag string }{
		{"verify", "--dry-run"},
		{"verify", "--backfill"},
		{"verify", "--timeout=1h"},
		{"sink accept-offsets", "--timeout=30s"},
	} {
		args := append(append(strings.Fields(c.name), c.flag), common...)
		code, out, errOut := run(t, "", args...)
		if code != 1 || !strings.Contains(errOut, "meterline "+c.name+": "+want) || out != "" {
			t.Errorf("%s %s with %s pending: exit %d, want 1 and %q on stderr, nothing on stdout\nstdout:\n%s\nstderr:\n%s",
				c.name, c.flag, pending, code, want, out, errOut)
		}
	}
	if _, err := sink.Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := run(t, "", append([]string{"verify", "--dry-run"}, common...)...); code != 0 || !strings.Contains(out, " 0 differ") {
		t.Errorf("verify --dry-run once migrated: exit %d, want 0\n%s\n%s", code, out, errOut)
	}
}
