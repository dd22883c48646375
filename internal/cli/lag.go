package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"text/tabwriter"
	"time"

	"github.com/meterline/meterline/internal/lag"
)

// LagCmd is `meterline lag`.
type LagCmd struct {
	Group  []string      `help:"Consumer groups to show." default:"${dedup_group},${aggregate_group},${sink_group}"`
	Watch  time.Duration `help:"Refresh every this long (0: print once)." default:"0s"`
	All    bool          `help:"Show partitions neither behind nor holding records too."`
	Output string        `short:"o" help:"Output format: table, or json (one document a refresh, for scripts; docs/operations.md, Lag)." default:"table" enum:"table,json"`
}

// Run prints the lag table, or its JSON document.
func (c *LagCmd) Run(ctx context.Context, g *Globals, stdio IO) error {
	kc, err := g.connectKafka(ctx)
	if err != nil {
		return err
	}
	// A group named twice is computed once: its rows, and its records
	// behind in the totals, would show twice.
	c.Group = distinctGroups(c.Group)
	for {
		rows, err := lag.Compute(ctx, kc, c.Group, time.Now())
		switch {
		case err != nil && (c.Watch <= 0 || ctx.Err() != nil):
			return err
		case err != nil:
			// A watch is kept open through an incident, when a broker
			// that coordinates a group or leads a partition is down
			// until the cluster moves them: it says so and tries again.
			fmt.Fprintf(stdio.Stderr, "%s lag not computed: %v; computing again in %s\n", time.Now().UTC().Format(time.RFC3339), err, c.Watch)
		default:
			if err := c.print(stdio, rows); err != nil {
				return err
			}
		}
		if c.Watch <= 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.Watch):
		}
	}
}

// print prints one computation's rows: the table, or the JSON document,
// then names on stderr each group without a row, at every refresh of a
// watch too.
func (c *LagCmd) print(stdio IO, rows []lag.Row) error {
	r := newLagReport(rows, c.All, time.Now())
	if c.Output == "json" {
		r.GroupsWithoutOffsets = groupsWithoutRows(c.Group, rows)
		if err := printLagJSON(stdio.Stdout, r); err != nil {
			return err
		}
	} else {
		if c.Watch > 0 {
			fmt.Fprint(stdio.Stdout, "\033[H\033[2J")
		}
		printLag(stdio.Stdout, r)
	}
	noteGroupsWithoutRows(stdio.Stderr, c.Group, rows)
	return nil
}

// lagReport is what `meterline lag` prints, in a table or as JSON (-o
// json). Its JSON field names are stable: scripts read them
// (docs/operations.md, Lag).
type lagReport struct {
	Time       time.Time      `json:"time"`
	Partitions []lagPartition `json:"partitions"`
	Totals     lagTotals      `json:"totals"`
	// GroupsWithoutOffsets are the groups asked for that have no row
	// (no such group, or it has committed nothing yet); JSON only, the
	// table names them on stderr.
	GroupsWithoutOffsets []string `json:"groups_without_offsets"`
}

// LagReport is what `meterline lag -o json` prints (lagReport), for the
// docs' check of their example.
type LagReport = lagReport

// lagPartition is a row of the table: one group on one partition.
type lagPartition struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Committed is nil when the group has no committed offset there
	// (the table's "-").
	Committed     *int64  `json:"committed_offset"`
	End           int64   `json:"end_offset"` // last stable offset
	High          int64   `json:"high_watermark"`
	RecordsBehind int64   `json:"records_behind"`
	SecondsBehind float64 `json:"seconds_behind"`
	RecordsHeld   int64   `json:"records_held"`
}

// lagTotals is the table's total line and note: over every partition,
// the rows not shown without --all included.
type lagTotals struct {
	Partitions        int   `json:"partitions"`
	PartitionsBehind  int   `json:"partitions_behind"`
	RecordsBehind     int64 `json:"records_behind"`
	PartitionsHolding int   `json:"partitions_holding"`
	RecordsHeld       int64 `json:"records_held"`
}

// newLagReport returns the report of rows at now. Without all, a
// partition neither behind nor holding records has no row; the totals
// count every partition. Records held are a partition's, whatever group
// reads it (the aggregator and the sink both read usage.deduped.v2): the
// totals count a partition holding records once, with the most any of
// its rows saw.
func newLagReport(rows []lag.Row, all bool, now time.Time) lagReport {
	r := lagReport{Time: now.UTC().Truncate(time.Second), Partitions: []lagPartition{}, GroupsWithoutOffsets: []string{}}
	r.Totals.Partitions = len(rows)
	type topicPartition struct {
		topic string
		p     int32
	}
	held := map[topicPartition]int64{}
	for _, row := range rows {
		if row.Records > 0 {
			r.Totals.PartitionsBehind++
			r.Totals.RecordsBehind += row.Records
		}
		if h, k := row.Held(), (topicPartition{row.Topic, row.Partition}); h > 0 {
			if _, seen := held[k]; !seen {
				r.Totals.PartitionsHolding++
			}
			r.Totals.RecordsHeld += max(h-held[k], 0)
			held[k] = max(h, held[k])
		}
		if row.Records == 0 && row.Held() == 0 && !all {
			continue
		}
		p := lagPartition{Group: row.Group, Topic: row.Topic, Partition: row.Partition, End: row.End, High: max(row.High, row.End),
			RecordsBehind: row.Records, SecondsBehind: math.Round(row.Behind.Seconds()*1000) / 1000, RecordsHeld: row.Held()}
		if row.Committed >= 0 {
			p.Committed = &row.Committed
		}
		r.Partitions = append(r.Partitions, p)
	}
	return r
}

// printLagJSON writes r as one indented JSON document.
func printLagJSON(w io.Writer, r lagReport) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// printLag prints r as a table, with a total line, and a note when a
// partition holds records past its last stable offset: a transaction
// open there stops the group's reads while its lag reads 0.
func printLag(w io.Writer, r lagReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "GROUP\tTOPIC\tPARTITION\tCOMMITTED\tEND\tRECORDS BEHIND\tSECONDS BEHIND\tRECORDS HELD\t")
	for _, p := range r.Partitions {
		committed := "-"
		if p.Committed != nil {
			committed = fmt.Sprint(*p.Committed)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\t%.1f\t%d\t\n", p.Group, p.Topic, p.Partition, committed, p.End, p.RecordsBehind, p.SecondsBehind, p.RecordsHeld)
	}
	_ = tw.Flush()
	t := r.Totals
	fmt.Fprintf(w, "%d partitions, %d behind, %d records behind in total (%s)\n", t.Partitions, t.PartitionsBehind, t.RecordsBehind, r.Time.Format(time.RFC3339))
	if t.PartitionsHolding > 0 {
		which := "1 partition holds %d records past its last stable offset"
		if t.PartitionsHolding > 1 {
			which = fmt.Sprint(t.PartitionsHolding) + " partitions hold %d records past their last stable offsets"
		}
		fmt.Fprintf(w, "note: "+which+": a transaction open there stops the group's reads while its lag reads 0 "+
			"(see docs/operations.md, MeterlineInputHeldByOpenTransaction)\n", t.RecordsHeld)
	}
}

// noteGroupsWithoutRows names on w each of groups that has no row: a
// misspelt --group, or a group that has committed no offset yet, would
// otherwise be missing from the table without a word.
func noteGroupsWithoutRows(w io.Writer, groups []string, rows []lag.Row) {
	for _, g := range groupsWithoutRows(groups, rows) {
		fmt.Fprintf(w, "note: group %q has no committed offsets: no such group, or it has committed none yet\n", g)
	}
}

// distinctGroups returns groups without repeats, in order.
func distinctGroups(groups []string) []string {
	seen := map[string]bool{}
	out := make([]string, 0, len(groups))
	for _, g := range groups {
		if !seen[g] {
			seen[g] = true
			out = append(out, g)
		}
	}
	return out
}

// groupsWithoutRows returns each of groups that has no row, in order.
func groupsWithoutRows(groups []string, rows []lag.Row) []string {
	seen := map[string]bool{}
	for _, r := range rows {
		seen[r.Group] = true
	}
	out := []string{}
	for _, g := range groups {
		if !seen[g] {
			out = append(out, g)
			seen[g] = true
		}
	}
	return out
}
