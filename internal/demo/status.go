package demo

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/lag"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// caughtUpState is what Config.onCaughtUp sees: the demo's stages have
// processed everything the generator sent, and still run.
type caughtUpState struct {
	statusURL string
	brokers   []string
	names     topics.Names
	truth     *truth
}

// statusPage serves the demo's status page (service.Server): both stages
// (dedup as restarted after its kill), their lag, this hour's aggregates
// per customer as in the live view, and per customer the totals counted
// so far next to the generator's ground truth.
type statusPage struct {
	cfg    Config
	srv    *service.Server
	addr   string // bound address; empty when not serving
	lag    *lag.Collector
	stop   context.CancelFunc
	done   chan error
	caught caughtUpState
}

// serveStatus starts the status page on cfg.HTTPAddr. A failure to listen
// (the port is taken) does not stop the demo: it is reported on cfg.Out and
// the demo runs without the page.
func serveStatus(cfg Config, brokers []string, names topics.Names, tr *truth, view *aggView,
	as *aggregator.Stage, current *atomic.Pointer[dedup.Stage]) *statusPage {
	p := &statusPage{cfg: cfg, caught: caughtUpState{brokers: brokers, names: names, truth: tr}}
	if cfg.HTTPAddr == "" {
		return p
	}
	groups := []string{dedupGroup, aggGroup}
	if cfg.ClickHouse != "" {
		groups = append(groups, sinkGroup)
	}
	lc, err := lag.NewCollector(kafka.Config{Brokers: brokers}, groups, lag.WithLogger(cfg.Logger),
		lag.WithStage(dedupGroup, "dedup"), lag.WithStage(aggGroup, "aggregate"), lag.WithStage(sinkGroup, "sink"))
	if err == nil {
		if err = cfg.Registry.Register(lc); err != nil {
			lc.Close()
		} else {
			p.lag = lc
		}
	}
	if err != nil {
		cfg.Logger.Warn("demo status page: no consumer lag metrics", zap.Error(err))
	}
	dedupReady := func() error {
		if ds := current.Load(); ds != nil {
			return ds.Ready()
		}
		return fmt.Errorf("dedup not started")
	}
	srv, err := service.Listen(cfg.HTTPAddr, cfg.Registry, cfg.Logger, dedupReady, as.Ready)
	if err != nil {
		fmt.Fprintf(cfg.Out, "status page not served: %v (choose another address with --http)\n", err)
		cfg.Logger.Warn("demo status page not served", zap.Error(err))
		p.close()
		return p
	}
	srv.AddStatus(func() service.StageStatus {
		if ds := current.Load(); ds != nil {
			return ds.Status()
		}
		return service.StageStatus{Stage: "dedup", Group: dedupGroup}
	})
	srv.AddStatus(as.Status)
	adj := &adjView{sum: map[string]map[string]int64{}}
	ctx, cancel := context.WithCancel(context.Background())
	go follow(ctx, brokers, names.AdjustmentsTopic(), adj.add)
	srv.AddTable(func() service.Table { return thisHourTable(view, time.Now()) })
	srv.AddTable(func() service.Table { return totalsTable(view, adj, tr) })
	srv.AddTable(as.EntitlementsTable)
	p.srv, p.addr, p.stop, p.done = srv, srv.Addr(), cancel, make(chan error, 1)
	p.caught.statusURL = "http://" + p.addr + "/"
	go func() { p.done <- srv.Run(ctx) }()
	fmt.Fprintf(cfg.Out, "status page: %s\n", p.caught.statusURL)
	return p
}

// caughtUp runs the test hook, if any, while the stages still run.
func (p *statusPage) caughtUp() {
	if p.cfg.onCaughtUp != nil {
		p.cfg.onCaughtUp(p.caught)
	}
}

// close stops the page and releases the lag collector; idempotent.
func (p *statusPage) close() {
	if p.stop != nil {
		p.stop()
		<-p.done
		p.stop = nil
	}
	if p.lag != nil {
		p.cfg.Registry.Unregister(p.lag)
		p.lag.Close()
		p.lag = nil
	}
}

func meterColumns(first string) []string { return append([]string{first}, meters...) }

// thisHourTable is the live view's "this hour, per customer".
func thisHourTable(view *aggView, now time.Time) service.Table {
	start, _ := aggregator.Hour.Bounds(now.UnixMilli())
	t := service.Table{ID: "this-hour", Columns: meterColumns("customer"),
		Title: "This hour's aggregates per customer (" + time.UnixMilli(start).UTC().Format("15:04") + " UTC, latest revision)"}
	cur := view.currentPeriod(now)
	for _, c := range sortedKeys(cur) {
		row := []string{c}
		for _, m := range meters {
			row = append(row, strconv.FormatInt(cur[c][m], 10))
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

// totalsTable sets, per customer and meter, what the pipeline counted so
// far (the latest revision of every period's aggregate, plus every
// adjustment) against what the generator sent: the reconciliation of the
// final report, live.
func totalsTable(view *aggView, adj *adjView, tr *truth) service.Table {
	counted := map[string]map[string]int64{}
	add := func(c, m string, v int64) {
		if counted[c] == nil {
			counted[c] = map[string]int64{}
		}
		counted[c][m] += v
	}
	view.mu.Lock()
	for _, a := range view.latest {
		add(a.CustomerID, a.Meter, a.Value)
	}
	view.mu.Unlock()
	adj.mu.Lock()
	for c, ms := range adj.sum {
		for m, v := range ms {
			add(c, m, v)
		}
	}
	adj.mu.Unlock()
	tr.mu.Lock()
	generated := map[string]map[string]int64{}
	for c, ms := range tr.totals {
		generated[c] = map[string]int64{}
		for m, v := range ms {
			generated[c][m] = v
		}
	}
	tr.mu.Unlock()

	cols := []string{"customer"}
	for _, m := range meters {
		cols = append(cols, m+" counted", m+" generated")
	}
	t := service.Table{ID: "totals", Title: "Totals per customer, all periods: counted against generated", Columns: cols,
		Note: "Counted: aggregates (latest revision) plus adjustments, from the committed topics. Generated: the generator's ground truth. Counted trails generated by the pipeline's lag; they are equal once it caught up."}
	all := map[string]bool{}
	for c := range counted {
		all[c] = true
	}
	for c := range generated {
		all[c] = true
	}
	for _, c := range sortedKeys(all) {
		row := []string{c}
		for _, m := range meters {
			row = append(row, strconv.FormatInt(counted[c][m], 10), strconv.FormatInt(generated[c][m], 10))
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// adjView sums the deltas of usage.adjustments (read_committed, fed by
// follow) per customer and meter.
type adjView struct {
	mu  sync.Mutex
	sum map[string]map[string]int64
}

// add adds the record's adjustment delta to its customer and meter.
func (v *adjView) add(r *kgo.Record) {
	var a schemas.Adjustment
	if schemas.DecodeInto(r.Value, &a) != nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.sum[a.CustomerID] == nil {
		v.sum[a.CustomerID] = map[string]int64{}
	}
	v.sum[a.CustomerID][a.Meter] += a.Delta
}
