package service

import (
	"cmp"
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
)

// Partition states on the status page.
const (
	// PartitionRestoring: assigned, its state is being rebuilt from the
	// changelog; none of its input is processed yet (docs/design.md,
	// Exactly-once, 3).
	PartitionRestoring = "restoring"
	// PartitionProcessing: restored, its input is being processed.
	PartitionProcessing = "processing"
	// PartitionWaiting: assigned, waiting for the group's committed
	// offsets before its restore (a previous owner's open transaction
	// holds them); none of its input is processed.
	PartitionWaiting = "waiting"
)

// PartitionStatus is one input partition assigned to a stage instance.
type PartitionStatus struct {
	Partition int32  `json:"partition"`
	State     string `json:"state"` // PartitionRestoring, PartitionProcessing or PartitionWaiting
	// WaitSeconds is how long a waiting partition has waited for the
	// group's committed offsets, and WaitReason why, when the coordinator
	// named it; nil and empty when not waiting.
	WaitSeconds *float64 `json:"wait_seconds,omitempty"`
	WaitReason  string   `json:"wait_reason,omitempty"`
	// RestoreRemaining is the number of changelog offsets left to replay
	// while restoring; nil when not known (not restoring, or the replay has
	// not started yet).
	RestoreRemaining *int64 `json:"restore_remaining_records,omitempty"`
	// RestoreKind and RestoreReason describe the partition's last restore
	// on this instance (docs/design.md, Exactly-once, 4): "full" (state
	// wiped, changelog replayed from its start) or "tail" (from the
	// checkpoint), and why, as the meterline_stream_restores_total metric
	// names them. Empty when the stage does not report them or no restore
	// has been planned yet.
	RestoreKind   string `json:"restore_kind,omitempty"`
	RestoreReason string `json:"restore_reason,omitempty"`
	// RestoreReplans is the number of plans in a row of the partition's
	// restore that ended with a changelog fetch out of range
	// (meterline_stream_restore_out_of_range_replans): a restore that does
	// not get through while it grows. 0 when none, or not restoring.
	RestoreReplans int `json:"restore_out_of_range_replans,omitempty"`
	// LagRecords and LagSeconds are the group's lag on this partition of
	// the input topic, from meterline_consumer_lag_records and
	// meterline_consumer_lag_seconds; nil when the process exports no lag.
	LagRecords *float64 `json:"lag_records"`
	LagSeconds *float64 `json:"lag_seconds"`
}

// StageStatus is one stage of the process as the status page shows it.
// A stage's own status function (Server.AddStatus) fills the identity,
// Joined, Error and Partitions; the server fills the rest from the metrics
// registry.
type StageStatus struct {
	Stage    string `json:"stage"` // "dedup", "aggregate", "sink"
	Group    string `json:"group,omitempty"`
	Instance string `json:"instance,omitempty"`
	Input    string `json:"input_topic,omitempty"`
	// Joined reports whether the stage runs a consumer-group session; nil
	// when the stage does not report it.
	Joined *bool `json:"joined,omitempty"`
	// Error is why the stage stopped (a fatal error); empty otherwise.
	Error string `json:"error,omitempty"`
	// ChangelogUnsafe says why the stage's changelog deletes state records
	// a restore must read (its cleanup.policy and retention.ms, as last
	// read: meterline_stream_changelog_unsafe); empty when it keeps them,
	// or the stage does not report it (ChangelogStage).
	ChangelogUnsafe string `json:"changelog_unsafe,omitempty"`
	// CannotWrite says why the brokers refuse the stage's writes (its
	// partitions below min.insync.replicas: NOT_ENOUGH_REPLICAS, or
	// without a leader: meterline_stream_write_refused_partitions); empty
	// when they take them, or the stage does not report it (WriteStage).
	CannotWrite string `json:"cannot_write,omitempty"`
	// Blocked says why the sink inserts nothing for now, from its
	// metrics: ClickHouse unreachable (meterline_sink_clickhouse_up 0; the
	// sink leaves its group meanwhile), or backing off because ClickHouse
	// cannot take a block (meterline_sink_blocked 1); empty otherwise, and
	// for the other stages.
	Blocked string `json:"blocked,omitempty"`
	// Partitions are the input partitions assigned to this instance,
	// sorted; nil when the stage does not list them (the server then counts
	// them from meterline_*_owned_partitions).
	Partitions []PartitionStatus `json:"partitions"`

	// Owned is the number of input partitions this instance owns
	// (processing, restoring or waiting); Restoring, those still
	// restoring; Waiting, those waiting for the group's committed offsets.
	Owned     int `json:"owned_partitions"`
	Restoring int `json:"restoring_partitions"`
	Waiting   int `json:"waiting_partitions"`
	// Standbys are the partitions this instance keeps warm as a standby
	// replica (docs/operations.md, Standby replicas), sorted; empty when it
	// keeps none or the stage does not report them (StandbyStage).
	Standbys []StandbyStatus `json:"standbys,omitempty"`
	// StandbyReplicas are the standby copies per partition this instance
	// asks for and those the group placed; nil when it asks for none or
	// the group's placement is not known (StandbyPlacementStage).
	StandbyReplicas *StandbyPlacement `json:"standby_replicas,omitempty"`
	// Replayed is the number of changelog records replayed by restores
	// since the process started (meterline_stream_restore_records_total).
	Replayed float64 `json:"restore_replayed_records"`
	// RecordsIn counts input records consumed; RecordsOut, records
	// produced (for the sink: rows inserted into ClickHouse).
	RecordsIn  float64 `json:"records_in"`
	RecordsOut float64 `json:"records_out"`
	// InPerSecond and OutPerSecond are rates over the last few seconds
	// (since the previous look at the page, at least 5 s back, or since
	// the server started); nil until a second has passed.
	InPerSecond  *float64 `json:"records_in_per_second"`
	OutPerSecond *float64 `json:"records_out_per_second"`
	// LagRecords sums the group's lag over its partitions; LagSeconds is
	// the largest. Nil when the process exports no lag for the group.
	LagRecords *float64 `json:"lag_records"`
	LagSeconds *float64 `json:"lag_seconds"`
	// FinalizingPeriods counts the aggregator's periods decided final
	// whose FINAL revisions (or the adjustments queued behind them) are
	// still going out in chunks: work that is no consumer lag, done while
	// the input's lag reads 0 (meterline_aggregate_finalizing_periods).
	// FinalDue is end + grace of the oldest period whose FINALs have not
	// all gone out (meterline_aggregate_final_due_seconds), and
	// FinalOverdueSeconds how long ago that was, when it was. Nil for a
	// stage that exports none of them.
	FinalizingPeriods   *float64   `json:"finalizing_periods,omitempty"`
	FinalDue            *time.Time `json:"final_due,omitempty"`
	FinalOverdueSeconds *float64   `json:"final_overdue_seconds,omitempty"`
}

// LagRow is one group's lag on one partition. HeldRecords and
// HeldSeconds are the records past the partition's last stable offset
// and how long that offset has held them (meterline_consumer_lag_held_*:
// a transaction left open there); nil when not exported.
type LagRow struct {
	Group       string   `json:"group"`
	Topic       string   `json:"topic"`
	Partition   int32    `json:"partition"`
	Records     float64  `json:"records"`
	Seconds     *float64 `json:"seconds"`
	HeldRecords *float64 `json:"held_records"`
	HeldSeconds *float64 `json:"held_seconds"`
}

// Table is an extra section of the status page, added by a process
// (the demo's aggregates per customer). The first cell of each row is its
// key.
type Table struct {
	ID      string     `json:"id"` // stable, used in element attributes
	Title   string     `json:"title"`
	Note    string     `json:"note,omitempty"`
	Columns []string   `json:"columns"`
	Rows    [][]string `json:"rows"`
	// RowsTotal is how many rows the table has: /status.json gives its
	// first statusJSONRowsMax rows.
	RowsTotal int `json:"rows_total"`
}

// Status is everything the status page shows; /status.json serves it.
type Status struct {
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	Now     time.Time `json:"now"`
	Ready   bool      `json:"ready"`
	// NotReady is why /readyz fails; empty when ready.
	NotReady string        `json:"not_ready,omitempty"`
	Stages   []StageStatus `json:"stages"`
	// LagExported reports whether the process exports consumer lag
	// (meterline_consumer_lag_records); Lag is then every row of it.
	LagExported bool     `json:"lag_exported"`
	Lag         []LagRow `json:"lag"`
	// LagError is why the process's last consumer lag computation failed
	// (its scrapes then carry no lag series, and LagExported is false);
	// empty when it succeeded, or the process computes no lag.
	LagError string  `json:"lag_error,omitempty"`
	Tables   []Table `json:"tables,omitempty"`
}

// Uptime is Now − Started, rounded to the second.
func (s Status) Uptime() time.Duration { return s.Now.Sub(s.Started).Round(time.Second) }

// statusPage holds what the status handlers need besides the Server's
// readiness checks.
type statusPage struct {
	reg     prometheus.Gatherer
	started time.Time
	now     func() time.Time

	mu     sync.Mutex
	lagErr func() error
	stages []func() StageStatus
	tables []func() Table
	rates  rateSamples
}

func newStatusPage(reg prometheus.Gatherer, now func() time.Time) *statusPage {
	p := &statusPage{reg: reg, now: now, started: now()}
	// The counters are at (or very near) zero when the server starts, so a
	// first look at the page shows the average rate since the start.
	p.rates.add(p.started, map[string]float64{})
	return p
}

// Stage is a running stage instance as the status page reads it, besides
// its metrics (StageStatusOf). stream.Runtime implements it: the runtime
// does not import this package, and this package does not import the
// runtime. The methods are called on every page view and must not block.
type Stage interface {
	// StatusIdentity returns the stage's name ("dedup", "aggregate"), its
	// consumer group, instance ID and input topic.
	StatusIdentity() (stage, group, instance, input string)
	// Joined reports whether the stage runs a consumer-group session.
	Joined() bool
	// Fatal returns the error the stage stopped with; nil while it runs.
	Fatal() error
	// EachPartitionStatus calls fn for every input partition assigned to
	// the instance, in partition order. restoring is true until the
	// partition's state is rebuilt and checked against the committed
	// offset (docs/design.md, Exactly-once, 3); remaining is the number of
	// changelog offsets left to replay, negative when not known; kind
	// ("full" or "tail") and reason describe the partition's last restore
	// on this instance (the labels of meterline_stream_restores_total),
	// empty when none was planned yet.
	EachPartitionStatus(fn func(p int32, restoring bool, remaining int64, kind, reason string))
}

// StandbyStatus is one partition a stage instance keeps warm as a standby.
type StandbyStatus struct {
	Partition int32 `json:"partition"`
	// Offset is the changelog offset the standby copy reflects; LagRecords,
	// how far it is behind the changelog's end. Nil when not known yet.
	Offset     *int64 `json:"changelog_offset"`
	LagRecords *int64 `json:"lag_records"`
}

// StandbyStage is implemented by a Stage that keeps standby replicas
// (stream.Runtime). EachStandbyStatus calls fn for every partition the
// instance keeps warm, in partition order; offset and lag are negative
// when not known yet.
type StandbyStage interface {
	EachStandbyStatus(fn func(p int32, offset, lag int64))
}

// StandbyPlacement is how many standby copies per partition a stage
// instance asks for (--standby-replicas) and how many the group's last
// rebalance placed, among how many members (docs/operations.md, Standby
// replicas).
type StandbyPlacement struct {
	Asked   int `json:"asked"`
	Placed  int `json:"placed"`
	Members int `json:"members"`
}

// Short reports whether the group placed fewer copies than asked for.
func (p StandbyPlacement) Short() bool { return p.Placed < p.Asked }

// StandbyPlacementStage is implemented by a Stage that keeps standby
// replicas (stream.Runtime): StandbyPlacement returns the copies per
// partition asked for and placed, and the group's member count; placed is
// negative while not known.
type StandbyPlacementStage interface {
	StandbyPlacement() (asked, placed, members int)
}

// OffsetWaitStage is a Stage whose newly assigned partitions may wait for
// the group's committed offsets (stream.Runtime): EachOffsetWait calls fn
// for every such partition, in partition order, with when its wait began
// and why (empty while not known).
type OffsetWaitStage interface {
	EachOffsetWait(fn func(p int32, since time.Time, why string))
}

// WriteStage is a Stage that says why the brokers refuse its writes
// (stream.Runtime): WriteRefused returns nil while they do not.
type WriteStage interface {
	WriteRefused() error
}

// ChangelogStage is a Stage that checks its changelog's cleanup policy
// while it runs (stream.Runtime): ChangelogUnsafe returns why it deletes
// state records a restore must read, nil when it keeps them.
type ChangelogStage interface {
	ChangelogUnsafe() error
}

// StageStatusOf returns what st reports of itself: its identity, session
// and partitions. The page completes it from the metrics.
func StageStatusOf(st Stage) StageStatus {
	var out StageStatus
	out.Stage, out.Group, out.Instance, out.Input = st.StatusIdentity()
	joined := st.Joined()
	out.Joined = &joined
	if err := st.Fatal(); err != nil {
		out.Error = err.Error()
	}
	out.Partitions = []PartitionStatus{}
	st.EachPartitionStatus(func(p int32, restoring bool, remaining int64, kind, reason string) {
		ps := PartitionStatus{Partition: p, State: PartitionProcessing, RestoreKind: kind, RestoreReason: reason}
		if restoring {
			ps.State = PartitionRestoring
			if remaining >= 0 {
				ps.RestoreRemaining = &remaining
			}
		}
		out.Partitions = append(out.Partitions, ps)
	})
	if ow, ok := st.(OffsetWaitStage); ok {
		out.Partitions = withOffsetWaits(out.Partitions, ow)
	}
	if sp, ok := st.(StandbyPlacementStage); ok {
		if asked, placed, members := sp.StandbyPlacement(); asked > 0 && placed >= 0 {
			out.StandbyReplicas = &StandbyPlacement{Asked: asked, Placed: placed, Members: members}
		}
	}
	if cs, ok := st.(ChangelogStage); ok {
		if err := cs.ChangelogUnsafe(); err != nil {
			out.ChangelogUnsafe = err.Error()
		}
	}
	if ws, ok := st.(WriteStage); ok {
		if err := ws.WriteRefused(); err != nil {
			out.CannotWrite = err.Error()
		}
	}
	if sb, ok := st.(StandbyStage); ok {
		sb.EachStandbyStatus(func(p int32, offset, lag int64) {
			ss := StandbyStatus{Partition: p}
			if offset >= 0 {
				ss.Offset = &offset
			}
			if lag >= 0 {
				ss.LagRecords = &lag
			}
			out.Standbys = append(out.Standbys, ss)
		})
	}
	return out
}

// withOffsetWaits marks the partitions of ps that ow says wait for their
// committed offsets, adding those not listed, in partition order.
func withOffsetWaits(ps []PartitionStatus, ow OffsetWaitStage) []PartitionStatus {
	now := time.Now()
	added := false
	ow.EachOffsetWait(func(p int32, since time.Time, why string) {
		secs := now.Sub(since).Seconds()
		w := PartitionStatus{Partition: p, State: PartitionWaiting, WaitSeconds: &secs, WaitReason: why}
		i, found := slices.BinarySearchFunc(ps, p, func(x PartitionStatus, p int32) int { return cmp.Compare(x.Partition, p) })
		if found {
			ps[i].State, ps[i].WaitSeconds, ps[i].WaitReason = w.State, w.WaitSeconds, w.WaitReason
			ps[i].RestoreRemaining = nil
			return
		}
		ps = append(ps, w)
		added = true
	})
	if added {
		slices.SortFunc(ps, func(a, b PartitionStatus) int { return cmp.Compare(a.Partition, b.Partition) })
	}
	return ps
}

// AddStatus adds a stage to the status page: f reports its identity,
// session and partitions, as StageStatusOf does for a Stage. Stages that
// export Meterline's stage metrics but add no status function still
// appear, from their metrics alone. f is called on every page view and
// must not block.
func (s *Server) AddStatus(f func() StageStatus) {
	s.status.mu.Lock()
	defer s.status.mu.Unlock()
	s.status.stages = append(s.status.stages, f)
}

// SetLagError gives the status page the error of the process's last
// consumer lag computation (nil when it succeeded): a scrape carries no
// lag series when it failed, and the page says why rather than that the
// process exports none. f is called on every page view, after the
// metrics are gathered, and must not block for long.
func (s *Server) SetLagError(f func() error) {
	s.status.mu.Lock()
	defer s.status.mu.Unlock()
	s.status.lagErr = f
}

// AddTable adds a section to the status page. f is called on every page
// view and must not block.
func (s *Server) AddTable(f func() Table) {
	s.status.mu.Lock()
	defer s.status.mu.Unlock()
	s.status.tables = append(s.status.tables, f)
}

// Status returns what the status page shows now.
func (s *Server) Status() Status {
	p := s.status
	st := Status{PID: os.Getpid(), Started: p.started, Now: p.now(), Ready: true}
	st.Host, _ = os.Hostname()
	if err := s.readiness(); err != nil {
		st.Ready, st.NotReady = false, err.Error()
	}
	p.mu.Lock()
	stageFns := slices.Clone(p.stages)
	tableFns := slices.Clone(p.tables)
	lagErr := p.lagErr
	p.mu.Unlock()

	mfs, err := p.reg.Gather()
	if err != nil {
		// Gather returns what it could collect along with the error.
		s.log.Warn("status page: gathering metrics", zap.Error(err))
	}
	m := indexMetrics(mfs)
	st.Stages = m.stages(stageFns)
	st.Lag, st.LagExported = m.lag()
	if lagErr != nil && !st.LagExported {
		if err := lagErr(); err != nil {
			st.LagError = err.Error()
		}
	}
	m.joinLag(st.Stages, st.Lag, st.LagExported)
	for i := range st.Stages {
		if d := st.Stages[i].FinalDue; d != nil && st.Now.After(*d) {
			st.Stages[i].FinalOverdueSeconds = ptr(st.Now.Sub(*d).Seconds())
		}
	}

	// Rates: counters now against a sample taken a few seconds ago.
	cur := map[string]float64{}
	for _, sg := range st.Stages {
		cur[sg.Stage+"/in"], cur[sg.Stage+"/out"] = sg.RecordsIn, sg.RecordsOut
	}
	p.mu.Lock()
	for i := range st.Stages {
		sg := &st.Stages[i]
		sg.InPerSecond = p.rates.rate(sg.Stage+"/in", st.Now, sg.RecordsIn)
		sg.OutPerSecond = p.rates.rate(sg.Stage+"/out", st.Now, sg.RecordsOut)
	}
	p.rates.add(st.Now, cur)
	p.mu.Unlock()

	for _, f := range tableFns {
		t := f()
		t.RowsTotal = len(t.Rows)
		st.Tables = append(st.Tables, t)
	}
	return st
}

func (s *Server) readiness() error {
	for _, c := range s.ready {
		if err := c(); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) serveStatusHTML(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := statusTemplate.Execute(w, s.Status()); err != nil {
		s.log.Warn("status page: rendering", zap.Error(err))
	}
}

func (s *Server) serveStatusJSON(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	st := s.Status()
	for i := range st.Tables {
		// RowsTotal says how many rows there are.
		st.Tables[i].Rows = st.Tables[i].Rows[:min(len(st.Tables[i].Rows), statusJSONRowsMax)]
	}
	_ = enc.Encode(st)
}

// ---------------------------------------------------------------- rates

// rateSamples keeps a few recent samples of counters, to compute rates
// over the last few seconds without a background goroutine: every page
// view adds a sample (at most one a second).
type rateSamples struct {
	samples []rateSample // oldest first
}

type rateSample struct {
	at time.Time
	v  map[string]float64
}

const (
	rateWindow = 5 * time.Second // rates cover at least this much, when possible
	rateMin    = time.Second     // no rate over less than this
)

// base is the newest sample at least rateWindow old, or the oldest one.
func (r *rateSamples) base(now time.Time) (rateSample, bool) {
	if len(r.samples) == 0 {
		return rateSample{}, false
	}
	b := r.samples[0]
	for _, s := range r.samples[1:] {
		if now.Sub(s.at) < rateWindow {
			break
		}
		b = s
	}
	return b, true
}

func (r *rateSamples) rate(key string, now time.Time, cur float64) *float64 {
	b, ok := r.base(now)
	if !ok {
		return nil
	}
	dt := now.Sub(b.at)
	if dt < rateMin {
		return nil
	}
	prev := b.v[key] // a counter that did not exist yet was zero
	if cur < prev {
		return nil // a reset (a stage restarted with new counters)
	}
	v := (cur - prev) / dt.Seconds()
	return &v
}

func (r *rateSamples) add(now time.Time, v map[string]float64) {
	if n := len(r.samples); n > 0 && now.Sub(r.samples[n-1].at) < rateMin {
		return
	}
	// Drop samples older than the base of the next rate: keep the newest
	// one at least rateWindow old, and everything after it.
	keep := 0
	for i, s := range r.samples {
		if now.Sub(s.at) >= rateWindow {
			keep = i
		}
	}
	r.samples = append(r.samples[keep:], rateSample{at: now, v: v})
}

// ---------------------------------------------------------------- metrics

// Metric names the status page reads. Stages export them (internal/stream,
// sink, internal/lag); a missing one shows as zero or n/a.
const (
	metricStreamIn        = "meterline_stream_records_in_total"
	metricStreamOut       = "meterline_stream_records_out_total"
	metricStreamOwned     = "meterline_stream_owned_partitions"
	metricStreamRestoring = "meterline_stream_restore_remaining_records"
	metricStreamReplayed  = "meterline_stream_restore_records_total"
	metricStreamReplans   = "meterline_stream_restore_out_of_range_replans"
	metricSinkIn          = "meterline_sink_records_in_total"
	metricSinkRows        = "meterline_sink_rows_total"
	metricSinkOwned       = "meterline_sink_owned_partitions"
	metricSinkUp          = "meterline_sink_clickhouse_up"
	metricSinkBlocked     = "meterline_sink_blocked"
	metricSinkMember      = "meterline_sink_group_member"
	metricLagRecords      = "meterline_consumer_lag_records"
	metricLagSeconds      = "meterline_consumer_lag_seconds"
	metricLagHeldRecords  = "meterline_consumer_lag_held_records"
	metricLagHeldSeconds  = "meterline_consumer_lag_held_seconds"
	metricAggFinalizing   = "meterline_aggregate_finalizing_periods"
	metricAggFinalDue     = "meterline_aggregate_final_due_seconds"
)

// finalOverdueBad is how long past its due time a FINAL shows bad on the
// status page: the threshold of the FINAL-overdue alert
// (deploy/prometheus/alerts.yml, MeterlineFinalOverdue).
const finalOverdueBad = 30 * time.Minute

type metricIndex map[string][]*dto.Metric

func indexMetrics(mfs []*dto.MetricFamily) metricIndex {
	m := metricIndex{}
	for _, mf := range mfs {
		m[mf.GetName()] = mf.GetMetric()
	}
	return m
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// sum adds up the series of name whose labels match (label → value).
func (m metricIndex) sum(name string, match ...string) float64 {
	s := 0.0
next:
	for _, x := range m[name] {
		for i := 0; i+1 < len(match); i += 2 {
			if label(x, match[i]) != match[i+1] {
				continue next
			}
		}
		s += value(x)
	}
	return s
}

// pipelineOrder sorts stages the way data flows.
func pipelineOrder(stage string) int {
	switch stage {
	case "dedup":
		return 0
	case "aggregate":
		return 1
	case "sink":
		return 2
	}
	return 3
}

// stages returns the reported stages, in the order they were added, then
// those found only in the metrics, in pipeline order; each completed from
// the metrics.
func (m metricIndex) stages(fns []func() StageStatus) []StageStatus {
	var out []StageStatus
	seen := map[string]bool{}
	for _, f := range fns {
		sg := f()
		seen[sg.Stage] = true
		out = append(out, sg)
	}
	var extra []string
	for _, name := range []string{metricStreamOwned, metricStreamIn} {
		for _, x := range m[name] {
			if s := label(x, "stage"); s != "" && !seen[s] {
				seen[s] = true
				extra = append(extra, s)
			}
		}
	}
	if _, ok := m[metricSinkOwned]; ok && !seen["sink"] {
		extra = append(extra, "sink")
	}
	slices.SortFunc(extra, func(a, b string) int {
		return cmp.Or(cmp.Compare(pipelineOrder(a), pipelineOrder(b)), cmp.Compare(a, b))
	})
	for _, s := range extra {
		out = append(out, StageStatus{Stage: s})
	}
	for i := range out {
		m.complete(&out[i])
	}
	return out
}

// complete fills the counters, and the partition counts of a stage that
// does not list its partitions, from the metrics.
func (m metricIndex) complete(sg *StageStatus) {
	if sg.Stage == "sink" && m[metricSinkOwned] != nil {
		sg.RecordsIn = m.sum(metricSinkIn)
		sg.RecordsOut = m.sum(metricSinkRows, "outcome", "inserted")
		if sg.Partitions == nil {
			sg.Owned = int(m.sum(metricSinkOwned))
		}
		m.completeSink(sg)
	} else {
		sg.RecordsIn = m.sum(metricStreamIn, "stage", sg.Stage)
		sg.RecordsOut = m.sum(metricStreamOut, "stage", sg.Stage)
		sg.Replayed = m.sum(metricStreamReplayed, "stage", sg.Stage)
		if sg.Partitions == nil {
			// The owned gauge counts restored partitions; a partition
			// with changelog left to replay is restoring.
			sg.Owned = int(m.sum(metricStreamOwned, "stage", sg.Stage))
			for _, x := range m[metricStreamRestoring] {
				if label(x, "stage") == sg.Stage && value(x) > 0 {
					sg.Restoring++
					sg.Owned++
				}
			}
		}
	}
	if sg.Stage == "aggregate" {
		m.completeFinals(sg)
	}
	if sg.Partitions != nil {
		sg.Owned, sg.Restoring, sg.Waiting = len(sg.Partitions), 0, 0
		for _, p := range sg.Partitions {
			switch p.State {
			case PartitionRestoring:
				sg.Restoring++
			case PartitionWaiting:
				sg.Waiting++
			}
		}
		m.joinReplans(sg)
	}
}

// completeSink fills the sink's membership of its group and why it
// inserts nothing for now, when its status function does not say, from
// its metrics.
func (m metricIndex) completeSink(sg *StageStatus) {
	if _, ok := m[metricSinkMember]; ok && sg.Joined == nil {
		sg.Joined = ptr(m.sum(metricSinkMember) == 1)
	}
	switch {
	case sg.Blocked != "":
	case m[metricSinkUp] != nil && m.sum(metricSinkUp) == 0:
		sg.Blocked = "ClickHouse unreachable"
	case m.sum(metricSinkBlocked) == 1:
		sg.Blocked = "backing off: ClickHouse cannot take a block"
	}
}

// completeFinals fills the aggregator's end-of-period work from its
// metrics: the periods whose FINALs are going out, summed over the
// partitions, and the oldest due time. Only the aggregator exports them
// (one per process, under `meterline run` too).
func (m metricIndex) completeFinals(sg *StageStatus) {
	if series, ok := m[metricAggFinalizing]; ok {
		sg.FinalizingPeriods = ptr(0.0)
		for _, x := range series {
			*sg.FinalizingPeriods += value(x)
		}
	}
	for _, x := range m[metricAggFinalDue] {
		due := time.UnixMilli(int64(value(x) * 1000)).UTC()
		if sg.FinalDue == nil || due.Before(*sg.FinalDue) {
			sg.FinalDue = &due
		}
	}
}

// joinReplans puts on each restoring partition of sg its restore's
// re-plans in a row after changelog fetches out of range, from the
// stage's series of them (one per partition whose restore re-planned,
// gone once it ends).
func (m metricIndex) joinReplans(sg *StageStatus) {
	series := m[metricStreamReplans]
	if len(series) == 0 {
		return
	}
	byPartition := make(map[string]int, len(series))
	for _, x := range series {
		if label(x, "stage") == sg.Stage {
			byPartition[label(x, "partition")] = int(value(x))
		}
	}
	for i := range sg.Partitions {
		p := &sg.Partitions[i]
		if p.State == PartitionRestoring {
			p.RestoreReplans = byPartition[strconv.Itoa(int(p.Partition))]
		}
	}
}

// lag returns every lag series, sorted, and whether there are any.
func (m metricIndex) lag() ([]LagRow, bool) {
	recs, ok := m[metricLagRecords]
	if !ok {
		return nil, false
	}
	type key struct {
		g, t string
		p    int32
	}
	byKey := func(name string) map[key]float64 {
		out := map[key]float64{}
		for _, x := range m[name] {
			p, _ := strconv.ParseInt(label(x, "partition"), 10, 32)
			out[key{label(x, "group"), label(x, "topic"), int32(p)}] = value(x)
		}
		return out
	}
	secs, heldRecs, heldSecs := byKey(metricLagSeconds), byKey(metricLagHeldRecords), byKey(metricLagHeldSeconds)
	rows := make([]LagRow, 0, len(recs))
	for _, x := range recs {
		p, err := strconv.ParseInt(label(x, "partition"), 10, 32)
		if err != nil {
			continue
		}
		r := LagRow{Group: label(x, "group"), Topic: label(x, "topic"), Partition: int32(p), Records: value(x)}
		k := key{r.Group, r.Topic, r.Partition}
		if s, ok := secs[k]; ok {
			r.Seconds = &s
		}
		if h, ok := heldRecs[k]; ok {
			r.HeldRecords = &h
		}
		if h, ok := heldSecs[k]; ok {
			r.HeldSeconds = &h
		}
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b LagRow) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return rows, true
}

// joinLag puts each stage's group lag on the stage and on its partitions
// of the input topic.
func (m metricIndex) joinLag(stages []StageStatus, rows []LagRow, exported bool) {
	if !exported {
		return
	}
	for i := range stages {
		sg := &stages[i]
		if sg.Group == "" {
			continue
		}
		byPartition := make(map[int32]*PartitionStatus, len(sg.Partitions))
		for j := range sg.Partitions {
			byPartition[sg.Partitions[j].Partition] = &sg.Partitions[j]
		}
		var recs, secs float64
		found := false
		for _, r := range rows {
			if r.Group != sg.Group {
				continue
			}
			found = true
			recs += r.Records
			if r.Seconds != nil && *r.Seconds > secs {
				secs = *r.Seconds
			}
			if r.Topic != sg.Input {
				continue
			}
			if p := byPartition[r.Partition]; p != nil {
				p.LagRecords = ptr(r.Records)
				p.LagSeconds = r.Seconds
			}
		}
		if found {
			sg.LagRecords, sg.LagSeconds = ptr(recs), ptr(secs)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// ---------------------------------------------------------------- formatting

// Formatting helpers of the template; "n/a" stands for a value the
// process does not know or does not export.

func fmtCount(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }

func fmtOptCount(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmtCount(*v)
}

func fmtRate(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return strconv.FormatFloat(*v, 'f', 1, 64)
}

func fmtSeconds(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return strconv.FormatFloat(*v, 'f', 1, 64)
}

func fmtRemaining(v *int64) string {
	if v == nil {
		return "n/a"
	}
	return strconv.FormatInt(*v, 10)
}

func fmtStageState(sg StageStatus) string {
	switch {
	case sg.Error != "":
		return "failed: " + sg.Error
	case sg.Blocked != "":
		return sg.Blocked
	case sg.Joined != nil && !*sg.Joined:
		return "not in the group"
	case sg.CannotWrite != "":
		return "cannot write"
	case sg.Restoring > 0:
		return "restoring"
	case sg.Waiting > 0:
		return "waiting for committed offsets"
	case sg.FinalizingPeriods != nil && *sg.FinalizingPeriods == 1:
		return "finalizing 1 period"
	case sg.FinalizingPeriods != nil && *sg.FinalizingPeriods > 1:
		return "finalizing " + fmtCount(*sg.FinalizingPeriods) + " periods"
	}
	return "running"
}

// fmtFinalDue says when the oldest FINAL of sg was due, and by how much
// it is overdue.
func fmtFinalDue(sg StageStatus) string {
	s := "oldest FINAL due " + sg.FinalDue.Format(time.RFC3339)
	if o := sg.FinalOverdueSeconds; o != nil {
		s += ", overdue by " + fmtCount(*o) + " s"
	}
	return s
}

// finalDueClass is the pill of fmtFinalDue: bad once the FINAL-overdue
// alert's threshold has passed, warn when overdue at all.
func finalDueClass(sg StageStatus) string {
	switch o := sg.FinalOverdueSeconds; {
	case o == nil:
		return "ok"
	case *o > finalOverdueBad.Seconds():
		return "bad"
	}
	return "warn"
}

// fmtPartitions lists the partitions a stage owns, the first
// statusListMax of them when it owns more.
func fmtPartitions(sg StageStatus) string {
	if sg.Partitions == nil {
		return "n/a"
	}
	if len(sg.Partitions) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, p := range sg.Partitions {
		if i == statusListMax {
			fmt.Fprintf(&b, ", … %d more", len(sg.Partitions)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(int(p.Partition)))
	}
	return b.String()
}

func stateClass(sg StageStatus) string {
	switch {
	case sg.Error != "" || sg.Blocked != "" || (sg.Joined != nil && !*sg.Joined) || sg.CannotWrite != "":
		return "bad"
	case sg.Restoring > 0 || sg.Waiting > 0:
		return "warn"
	}
	return "ok"
}

// ---------------------------------------------------------------- bounds

// The page stays small however many partitions a process has: a browser
// opens it at once on a deployment of thousands of partitions too, during
// an incident as well. Each list of partitions (a stage's partitions, its
// standbys, the consumer lag) shows every row up to statusRowsMax rows;
// beyond, a summary and the statusRowsMax rows most in trouble, worst
// first. A table a process adds (Server.AddTable: the HTTP ingest's
// tenants, the demo's customers) shows its first statusRowsMax rows, in
// its order. /status.json lists every partition, standby copy and lag
// row (as many as the partitions the process owns), and of a table a
// process adds its first statusJSONRowsMax rows, in its order, with
// rows_total, how many it has: such a table grows with what clients
// make.
const (
	statusRowsMax     = 50
	statusListMax     = 64 // partition numbers in a stage's row
	statusJSONRowsMax = 1000
)

// shown is the part of a list the page shows: Rows, of Total.
type shown[T any] struct {
	Rows  []T
	Total int
}

// Cut reports whether the page shows fewer rows than there are.
func (s shown[T]) Cut() bool { return len(s.Rows) < s.Total }

// worstFirst returns all when it has at most statusRowsMax rows, in its
// order; otherwise the statusRowsMax first rows by worse.
func worstFirst[T any](all []T, worse func(a, b T) int) shown[T] {
	if len(all) <= statusRowsMax {
		return shown[T]{Rows: all, Total: len(all)}
	}
	rows := slices.Clone(all)
	slices.SortStableFunc(rows, worse)
	return shown[T]{Rows: rows[:statusRowsMax], Total: len(all)}
}

// desc orders optional values largest first, unknown (nil) last.
func desc[T cmp.Ordered](a, b *T) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return 1
	case b == nil:
		return -1
	}
	return cmp.Compare(*b, *a)
}

// partitionView is a stage's partitions as the page shows them, with
// their counts by state.
type partitionView struct {
	shown[PartitionStatus]
	Processing, Restoring, Waiting int
	// Behind counts the partitions with records left to consume.
	Behind int
}

// worsePartition orders partitions most in trouble first: waiting for
// their committed offsets (longest first), restoring (those whose restore plans again after changelog fetches out of range
// first, most re-plans first, then most changelog left to replay), then
// most seconds behind, then most records behind.
func worsePartition(a, b PartitionStatus) int {
	aw, bw := a.State == PartitionWaiting, b.State == PartitionWaiting
	switch {
	case aw && !bw:
		return -1
	case bw && !aw:
		return 1
	case aw && bw:
		return cmp.Or(desc(a.WaitSeconds, b.WaitSeconds), cmp.Compare(a.Partition, b.Partition))
	}
	ar, br := a.State == PartitionRestoring, b.State == PartitionRestoring
	switch {
	case ar && !br:
		return -1
	case br && !ar:
		return 1
	}
	return cmp.Or(cmp.Compare(b.RestoreReplans, a.RestoreReplans),
		desc(a.RestoreRemaining, b.RestoreRemaining), desc(a.LagSeconds, b.LagSeconds),
		desc(a.LagRecords, b.LagRecords), cmp.Compare(a.Partition, b.Partition))
}

func viewPartitions(sg StageStatus) partitionView {
	v := partitionView{shown: worstFirst(sg.Partitions, worsePartition)}
	for _, p := range sg.Partitions {
		switch p.State {
		case PartitionRestoring:
			v.Restoring++
		case PartitionWaiting:
			v.Waiting++
		default:
			v.Processing++
		}
		if p.LagRecords != nil && *p.LagRecords > 0 {
			v.Behind++
		}
	}
	return v
}

// viewStandbys: the standby copies most behind first, those whose lag is
// not known (not started, or the tail failing) before all.
func viewStandbys(sbs []StandbyStatus) shown[StandbyStatus] {
	return worstFirst(sbs, func(a, b StandbyStatus) int {
		if (a.LagRecords == nil) != (b.LagRecords == nil) {
			if a.LagRecords == nil {
				return -1
			}
			return 1
		}
		return cmp.Or(desc(a.LagRecords, b.LagRecords), cmp.Compare(a.Partition, b.Partition))
	})
}

// viewLag: the rows most seconds behind or held first (a partition held
// by an open transaction is 0 seconds behind: its input stands still),
// then most records behind.
func viewLag(rows []LagRow) shown[LagRow] {
	worst := func(r LagRow) *float64 {
		if r.HeldSeconds != nil && (r.Seconds == nil || *r.HeldSeconds > *r.Seconds) {
			return r.HeldSeconds
		}
		return r.Seconds
	}
	return worstFirst(rows, func(a, b LagRow) int {
		return cmp.Or(desc(worst(a), worst(b)), cmp.Compare(b.Records, a.Records))
	})
}

// viewTable: a table's first statusRowsMax rows, in its order. Its rows
// may be keyed by what producers send (the demo's customers).
func viewTable(t Table) shown[[]string] {
	return shown[[]string]{Rows: t.Rows[:min(len(t.Rows), statusRowsMax)], Total: len(t.Rows)}
}

//go:embed status.html
var statusHTML string

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"count":         fmtCount,
	"optCount":      fmtOptCount,
	"rate":          fmtRate,
	"seconds":       fmtSeconds,
	"remaining":     fmtRemaining,
	"stageState":    fmtStageState,
	"stateClass":    stateClass,
	"finalDue":      fmtFinalDue,
	"finalDueClass": finalDueClass,
	"partitions":    fmtPartitions,
	"listed":        func(sg StageStatus) bool { return sg.Partitions != nil },
	"partView":      viewPartitions,
	"standbyView":   viewStandbys,
	"lagView":       viewLag,
	"tableView":     viewTable,
	"rowsMax":       func() int { return statusRowsMax },
}).Parse(statusHTML))
