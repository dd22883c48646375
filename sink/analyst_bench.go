package sink

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/topics"
)

// DropViews drops the analyst tables' materialized views from conn's
// default database, leaving the tables, except the views named in keep:
// the ledger is then written as if the other analyst tables did not
// exist. For `meterline bench sink` and `meterline bench queries`, which
// measure the sink with and without the views, or with some of them. A
// name in keep that is no analyst view is an error, and nothing is
// dropped.
func DropViews(ctx context.Context, conn driver.Conn, keep ...string) error {
	ds, err := DerivedTables()
	if err != nil {
		return err
	}
	names := map[string]bool{}
	for _, d := range ds {
		for _, v := range d.Views {
			names[v.Name] = true
		}
	}
	kept := map[string]bool{}
	var unknown []string
	for _, k := range keep {
		if !names[k] {
			unknown = append(unknown, k)
		}
		kept[k] = true
	}
	if len(unknown) > 0 {
		all := make([]string, 0, len(names))
		for n := range names {
			all = append(all, n)
		}
		sort.Strings(all)
		return fmt.Errorf("sink: drop views: %s: no such analyst view (there are %s)", strings.Join(unknown, ", "), strings.Join(all, ", "))
	}
	for _, d := range ds {
		for _, v := range d.Views {
			if kept[v.Name] {
				continue
			}
			dctx, cancel := context.WithTimeout(ctx, ddlTimeout)
			err := conn.Exec(dctx, "DROP TABLE IF EXISTS "+v.Name)
			cancel()
			if err != nil {
				return fmt.Errorf("sink: drop view %s: %w", v.Name, err)
			}
		}
	}
	return nil
}

// ResumeLookup is one measured resume lookup (ResumeLookupAt).
type ResumeLookup struct {
	// RowsRead is what the server read for the lookup's queries, from its
	// progress reports.
	RowsRead uint64
	// Queries is how many queries the lookup ran.
	Queries int
	// Present is how many of the batch's offsets were in the table.
	Present int
	Took    time.Duration
}

// ResumeLookupAt runs the sink's resume lookup, the code a sink runs after
// an assignment, on db's usage_events: a sink whose committed offset of
// partition is committed re-consumes the batch records from there. It is
// what `meterline bench queries` measures at 100 million rows.
func ResumeLookupAt(ctx context.Context, conn driver.Conn, db string, names topics.Names, partition int32, committed int64, batch int) (ResumeLookup, error) {
	reg := prometheus.NewRegistry()
	w, err := New(Config{Config: session.Config{Kafka: kafka.Config{Brokers: []string{"unused:9092"}}, InstanceID: "lookup"}, Topics: names, Conn: conn, Database: db, Registerer: reg})
	if err != nil {
		return ResumeLookup{}, err
	}
	t := w.byTopic[names.DedupedTopic()]
	w.parts[tp{t.topic, partition}] = &pstate{committed: committed, dirty: true}
	rows := make([]*row, batch)
	for i := range rows {
		rows[i] = &row{rec: &kgo.Record{Topic: t.topic, Partition: partition, Offset: committed + int64(i)}}
	}
	var read atomic.Uint64
	pctx := clickhouse.Context(ctx, clickhouse.WithProgress(func(p *clickhouse.Progress) { read.Add(p.Rows) }))
	start := time.Now()
	todo, err := w.filterPresent(pctx, t, rows)
	if err != nil {
		return ResumeLookup{}, err
	}
	out := ResumeLookup{RowsRead: read.Load(), Present: batch - len(todo), Took: time.Since(start)}
	mfs, err := reg.Gather()
	if err != nil {
		return out, err
	}
	for _, mf := range mfs {
		if mf.GetName() == "meterline_sink_resume_lookup_seconds" {
			for _, m := range mf.GetMetric() {
				out.Queries += int(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out, nil
}
