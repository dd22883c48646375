package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/meterline/meterline/internal/lag"
)

// LagCmd is `meterline lag`.
type LagCmd struct {
	Group []string      `help:"Consumer groups to show." default:"${dedup_group},${aggregate_group},${sink_group}"`
	Watch time.Duration `help:"Refresh every this long (0: print once)." default:"0s"`
	All   bool          `help:"Show partitions neither behind nor holding records too."`
}

// Run prints the lag table.
func (c *LagCmd) Run(ctx context.Context, g *Globals, stdio IO) error {
	kc, err := g.connectKafka(ctx)
	if err != nil {
		return err
	}
	for {
		rows, err := lag.Compute(ctx, kc, c.Group, time.Now())
		if err != nil {
			return err
		}
		if c.Watch > 0 {
			fmt.Fprint(stdio.Stdout, "\033[H\033[2J")
		}
		printLag(stdio.Stdout, rows, c.All, time.Now())
		if c.Watch <= 0 {
			noteGroupsWithoutRows(stdio.Stderr, c.Group, rows)
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.Watch):
		}
	}
}

// printLag prints rows as a table, with a total line, and a note when a
// partition holds records past its last stable offset: a transaction
// open there stops the group's reads while its lag reads 0. Without all,
// a partition neither behind nor holding records has no row.
func printLag(w io.Writer, rows []lag.Row, all bool, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "GROUP\tTOPIC\tPARTITION\tCOMMITTED\tEND\tRECORDS BEHIND\tSECONDS BEHIND\tRECORDS HELD\t")
	shown, behind, holding := 0, 0, 0
	var total, held int64
	for _, r := range rows {
		if r.Records > 0 {
			behind++
			total += r.Records
		}
		if h := r.Held(); h > 0 {
			holding++
			held += h
		}
		if r.Records == 0 && r.Held() == 0 && !all {
			continue
		}
		shown++
		committed := fmt.Sprint(r.Committed)
		if r.Committed < 0 {
			committed = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\t%.1f\t%d\t\n", r.Group, r.Topic, r.Partition, committed, r.End, r.Records, r.Behind.Seconds(), r.Held())
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "%d partitions, %d behind, %d records behind in total (%s)\n", len(rows), behind, total, now.UTC().Format(time.RFC3339))
	if holding > 0 {
		which := "1 partition holds %d records past its last stable offset"
		if holding > 1 {
			which = fmt.Sprint(holding) + " partitions hold %d records past their last stable offsets"
		}
		fmt.Fprintf(w, "note: "+which+": a transaction open there stops the group's reads while its lag reads 0 "+
			"(see docs/operations.md, MeterlineInputHeldByOpenTransaction)\n", held)
	}
}

// noteGroupsWithoutRows names on w each of groups that has no row: a
// misspelt --group, or a group that has committed no offset yet, would
// otherwise be missing from the table without a word.
func noteGroupsWithoutRows(w io.Writer, groups []string, rows []lag.Row) {
	seen := map[string]bool{}
	for _, r := range rows {
		seen[r.Group] = true
	}
	for _, g := range groups {
		if !seen[g] {
			fmt.Fprintf(w, "note: group %q has no committed offsets: no such group, or it has committed none yet\n", g)
		}
	}
}
