package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"go.uber.org/zap"

	"github.com/meterline/meterline/sink"
)

// VerifyCmd is `meterline verify`.
type VerifyCmd struct {
	Database string        `help:"ClickHouse database of the sink's tables." default:"${sink_database}"`
	Group    string        `help:"Consumer group of the sink: a rebuild refuses to run while it has members." default:"${sink_group}"`
	Tables   []string      `help:"Derived tables to check or rebuild, comma-separated. Default: all (with --backfill and an unfinished rebuild: its tables)."`
	Since    string        `help:"First month compared, YYYYMM. Default: the month after the oldest month the ledger tables hold." placeholder:"YYYYMM"`
	DryRun   bool          `help:"Compare only, rebuild nothing (safe while the sink runs: a month written while compared is reported in-flight). Exits 1 when a month differs."`
	Backfill bool          `help:"Rebuild every month the ledger holds of the tables, without comparing first: a new derived table on a database with data, or an unfinished rebuild."`
	Timeout  time.Duration `help:"Deadline of each query, and of each staging fill." default:"1h"`
	JSON     bool          `help:"Print the report as JSON."`
}

// Run compares the derived tables with the ledger and rebuilds what differs.
func (c *VerifyCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	var since uint32
	if c.Since != "" {
		v, err := strconv.ParseUint(c.Since, 10, 32)
		if err != nil || len(c.Since) != 6 || v%100 < 1 || v%100 > 12 {
			return &ExitError{Code: 2, Err: fmt.Errorf("verify: --since %q: want YYYYMM", c.Since)}
		}
		since = uint32(v)
	}
	if c.DryRun && c.Backfill {
		return &ExitError{Code: 2, Err: fmt.Errorf("verify: --dry-run and --backfill exclude each other")}
	}
	conn, err := g.dialDatabase(ctx, c.Database)
	if err != nil {
		return err
	}
	defer conn.Close()
	cfg := sink.VerifyConfig{Conn: conn, Database: c.Database, Tables: c.Tables, Since: since,
		Repair: !c.DryRun, Backfill: c.Backfill, Logger: log, QueryTimeout: c.Timeout}
	if !c.DryRun {
		adm, closeAdm, err := adminClient(ctx, g)
		if err != nil {
			return err
		}
		defer closeAdm()
		cfg.SinkMembers = sink.GroupMembers(adm, g.principal(), c.Group)
	}
	rep, err := sink.Verify(ctx, cfg)
	if rep != nil {
		if c.JSON {
			if jerr := json.NewEncoder(stdio.Stdout).Encode(rep); jerr != nil {
				return jerr
			}
		} else {
			printVerify(stdio, rep)
		}
	}
	if err != nil {
		return err
	}
	return verifyFailure(rep)
}

// verifyFailure is the exit status of a report: 1 when a month still
// differs or an aggregate key has more than one FINAL revision.
func verifyFailure(rep *sink.VerifyReport) error {
	var why []string
	if rep.Differs > 0 {
		why = append(why, fmt.Sprintf("%d month(s) differ from the ledger", rep.Differs))
	}
	if n := rep.DoubleFinalKeys; n > 0 {
		why = append(why, fmt.Sprintf("%d aggregate key(s) have more than one FINAL revision in %s", n, sink.TableAggregates))
	}
	if len(why) > 0 {
		return &ExitError{Code: 1, Err: fmt.Errorf("verify: %s", strings.Join(why, "; "))}
	}
	return nil
}

func printVerify(stdio IO, rep *sink.VerifyReport) {
	tw := tabwriter.NewWriter(stdio.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tMONTH\tSTATUS\tLEDGER\tDERIVED\tNOTE")
	for _, m := range rep.Months {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", m.Table, m.Month, m.Status,
			strings.Join(m.Ledger, " "), strings.Join(m.Derived, " "), m.Note)
	}
	_ = tw.Flush()
	if rep.RunID != "" {
		fmt.Fprintf(stdio.Stdout, "rebuild %q: %d month(s) rebuilt\n", rep.RunID, rep.Rebuilt)
	}
	// A skipped month was not compared: counting it would report a
	// database whose months are all skipped as verified.
	skipped := 0
	for _, m := range rep.Months {
		if m.Status == sink.MonthSkipped {
			skipped++
		}
	}
	fmt.Fprintf(stdio.Stdout, "%d month(s) compared, %d differ", len(rep.Months)-skipped-rep.InFlight, rep.Differs)
	if skipped > 0 {
		fmt.Fprintf(stdio.Stdout, "; %d skipped (not compared: --since to include them)", skipped)
	}
	if rep.InFlight > 0 {
		fmt.Fprintf(stdio.Stdout, "; %d in flight (written by a sink while compared: not compared)", rep.InFlight)
	}
	fmt.Fprintln(stdio.Stdout)
	for _, d := range rep.DoubleFinals {
		more := ""
		if n := int(d.Count) - len(d.Finals); n > 0 {
			more = fmt.Sprintf("; %d more", n)
		}
		fmt.Fprintf(stdio.Stdout, "%s: customer %q meter %q group %q period %s: %d FINAL revisions (%s%s), one per key expected\n",
			sink.TableAggregates, d.CustomerID, d.Meter, d.Group, d.PeriodStart, d.Count, strings.Join(d.Finals, "; "), more)
	}
	if n := rep.DoubleFinalKeys - len(rep.DoubleFinals); n > 0 {
		fmt.Fprintf(stdio.Stdout, "%s: %d more aggregate keys have more than one FINAL revision (the first %d listed)\n",
			sink.TableAggregates, n, len(rep.DoubleFinals))
	}
}

// dialDatabase connects to an existing ClickHouse database of the sink.
func (g *Globals) dialDatabase(ctx context.Context, db string) (driver.Conn, error) {
	srv, err := g.clickHouse()
	if err != nil {
		return nil, err
	}
	return srv.Dial(ctx, db, false)
}
