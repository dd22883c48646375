package cli

import (
	"bytes"
	"strings"
	"testing"

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

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}
