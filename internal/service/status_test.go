package service

import (
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/prom"
	"github.com/meterline/meterline/internal/testenv"
)

// fakeStages registers the metrics the status page reads, as the stream
// runtime, the sink and the lag collector name them.
type fakeStages struct {
	in, out, replayed  *prometheus.CounterVec
	owned, restoring   *prometheus.GaugeVec
	sinkIn, sinkRows   *prometheus.CounterVec
	sinkOwned          prometheus.Gauge
	lagRecs, lagSecs   *prometheus.GaugeVec
	heldRecs, heldSecs *prometheus.GaugeVec
	replans            *prometheus.GaugeVec
}

func newFakeStages(reg *prometheus.Registry, withLag bool) *fakeStages {
	f := prom.NewFactory(reg)
	s := &fakeStages{
		in:        f.NewCounterVec(prometheus.CounterOpts{Name: metricStreamIn}, []string{"stage", "topic"}),
		out:       f.NewCounterVec(prometheus.CounterOpts{Name: metricStreamOut}, []string{"stage", "topic"}),
		replayed:  f.NewCounterVec(prometheus.CounterOpts{Name: metricStreamReplayed}, []string{"stage"}),
		owned:     f.NewGaugeVec(prometheus.GaugeOpts{Name: metricStreamOwned}, []string{"stage"}),
		restoring: f.NewGaugeVec(prometheus.GaugeOpts{Name: metricStreamRestoring}, []string{"stage", "partition"}),
		sinkIn:    f.NewCounterVec(prometheus.CounterOpts{Name: metricSinkIn}, []string{"topic"}),
		sinkRows:  f.NewCounterVec(prometheus.CounterOpts{Name: metricSinkRows}, []string{"table", "outcome"}),
		sinkOwned: f.NewGauge(prometheus.GaugeOpts{Name: metricSinkOwned}),
		replans:   f.NewGaugeVec(prometheus.GaugeOpts{Name: metricStreamReplans}, []string{"stage", "partition"}),
	}
	if withLag {
		s.lagRecs = f.NewGaugeVec(prometheus.GaugeOpts{Name: metricLagRecords}, []string{"group", "topic", "partition"})
		s.lagSecs = f.NewGaugeVec(prometheus.GaugeOpts{Name: metricLagSeconds}, []string{"group", "topic", "partition"})
		s.heldRecs = f.NewGaugeVec(prometheus.GaugeOpts{Name: metricLagHeldRecords}, []string{"group", "topic", "partition"})
		s.heldSecs = f.NewGaugeVec(prometheus.GaugeOpts{Name: metricLagHeldSeconds}, []string{"group", "topic", "partition"})
	}
	return s
}

// fakeStage is a running stage as the status page reads it (Stage).
type fakeStage struct {
	stage, group, instance, input string
	joined                        bool
	err                           error
	parts                         []fakePartition
}

type fakePartition struct {
	p            int32
	restoring    bool
	remaining    int64
	kind, reason string
}

func (f *fakeStage) StatusIdentity() (string, string, string, string) {
	return f.stage, f.group, f.instance, f.input
}
func (f *fakeStage) Joined() bool { return f.joined }
func (f *fakeStage) Fatal() error { return f.err }
func (f *fakeStage) EachPartitionStatus(fn func(p int32, restoring bool, remaining int64, kind, reason string)) {
	for _, p := range f.parts {
		fn(p.p, p.restoring, p.remaining, p.kind, p.reason)
	}
}

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newTestServer(t *testing.T, reg *prometheus.Registry, ready ...Check) (*Server, *fakeClock) {
	t.Helper()
	s, err := Listen("127.0.0.1:0", reg, zap.NewNop(), ready...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.ln.Close() })
	clk := &fakeClock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	s.status = newStatusPage(reg, clk.now)
	return s, clk
}

func get(t *testing.T, s *Server, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

func page(t *testing.T, s *Server) map[string]string {
	t.Helper()
	code, body := get(t, s, "/")
	if code != http.StatusOK {
		t.Fatalf("GET / = %d\n%s", code, body)
	}
	return testenv.PageValues(body)
}

// TestStatusPage renders a process with a reported stage (dedup: its own
// partitions), a stage known only from its metrics (aggregate, one
// partition restoring) and the sink, and checks every value the page shows
// against what the stages and the registry hold.
func TestStatusPage(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newFakeStages(reg, true)
	notReady := errors.New("1 partitions restoring")
	var ready error
	s, clk := newTestServer(t, reg, func() error { return ready })

	dedup := &fakeStage{stage: "dedup", group: "g-dedup", instance: "node-1", input: "usage.events", joined: true,
		parts: []fakePartition{
			{p: 0, remaining: -1, kind: "tail", reason: "within_horizon"},
			{p: 1, remaining: -1},
			{p: 2, restoring: true, remaining: 1234, kind: "full", reason: "horizon"},
		}}
	s.AddStatus(func() StageStatus { return StageStatusOf(dedup) })
	s.AddTable(func() Table {
		return Table{ID: "aggregates", Title: "This hour", Columns: []string{"customer", "api_calls", "tokens"},
			Rows: [][]string{{"acme", "12", "3400"}, {"globex", "1", "0"}}}
	})

	// The stages ran for 10 s before anyone looked.
	clk.advance(10 * time.Second)
	m.in.WithLabelValues("dedup", "usage.events").Add(1000)
	m.out.WithLabelValues("dedup", "usage.deduped").Add(900)
	m.out.WithLabelValues("dedup", "usage.duplicates").Add(50)
	m.replayed.WithLabelValues("dedup").Add(77)
	m.owned.WithLabelValues("dedup").Set(2)
	m.in.WithLabelValues("aggregate", "usage.deduped").Add(400)
	m.owned.WithLabelValues("aggregate").Set(1)
	m.restoring.WithLabelValues("aggregate", "0").Set(0)
	m.restoring.WithLabelValues("aggregate", "1").Set(40)
	m.sinkOwned.Set(3)
	m.sinkIn.WithLabelValues("usage.aggregates").Add(30)
	m.sinkRows.WithLabelValues("aggregates", "inserted").Add(25)
	m.sinkRows.WithLabelValues("aggregates", "already_present").Add(5)
	for p, recs := range []float64{0, 7, 3} {
		m.lagRecs.WithLabelValues("g-dedup", "usage.events", itoa(p)).Set(recs)
		m.lagSecs.WithLabelValues("g-dedup", "usage.events", itoa(p)).Set(recs / 2)
	}
	m.lagRecs.WithLabelValues("other", "usage.deduped", "0").Set(9)
	// Partition 0: caught up to a transaction left open there for 1900 s,
	// 12 records past it.
	m.heldRecs.WithLabelValues("g-dedup", "usage.events", "0").Set(12)
	m.heldSecs.WithLabelValues("g-dedup", "usage.events", "0").Set(1900)
	// Partition 2's restore has planned again 7 times in a row, its
	// changelog fetches out of range; the aggregator's partition 2 is not
	// dedup's.
	m.replans.WithLabelValues("dedup", "2").Set(7)
	m.replans.WithLabelValues("aggregate", "1").Set(3)
	ready = notReady

	v := page(t, s)
	testenv.ExpectPageValue(t, v, "ready", "not ready: 1 partitions restoring")
	testenv.ExpectPageValue(t, v, "uptime", "10s")

	// dedup: what it reports through Stage, completed from the metrics.
	testenv.ExpectPageValue(t, v, "stage/dedup/state", "restoring")
	testenv.ExpectPageValue(t, v, "stage/dedup/group", "g-dedup")
	testenv.ExpectPageValue(t, v, "stage/dedup/instance", "node-1")
	testenv.ExpectPageValue(t, v, "stage/dedup/input", "usage.events")
	testenv.ExpectPageValue(t, v, "stage/dedup/owned", "3")
	testenv.ExpectPageValue(t, v, "stage/dedup/partitions", "0, 1, 2")
	testenv.ExpectPageValue(t, v, "stage/dedup/restoring", "1")
	testenv.ExpectPageValue(t, v, "stage/dedup/in", "1000")
	testenv.ExpectPageValue(t, v, "stage/dedup/out", "950")
	testenv.ExpectPageValue(t, v, "stage/dedup/in_rate", "100.0") // since the server started
	testenv.ExpectPageValue(t, v, "stage/dedup/out_rate", "95.0")
	testenv.ExpectPageValue(t, v, "stage/dedup/replayed", "77")
	testenv.ExpectPageValue(t, v, "stage/dedup/lag_records", "10")
	testenv.ExpectPageValue(t, v, "stage/dedup/lag_seconds", "3.5")
	testenv.ExpectPageValue(t, v, "part/dedup/0/state", "processing")
	testenv.ExpectPageValue(t, v, "part/dedup/2/state", "restoring")
	testenv.ExpectPageValue(t, v, "part/dedup/2/restore_remaining", "1234")
	testenv.ExpectPageValue(t, v, "part/dedup/0/restore_remaining", "n/a")
	testenv.ExpectPageValue(t, v, "part/dedup/0/restore", "tail (within_horizon)")
	testenv.ExpectPageValue(t, v, "part/dedup/1/restore", "n/a")
	testenv.ExpectPageValue(t, v, "part/dedup/2/restore", "full (horizon)")
	testenv.ExpectPageValue(t, v, "part/dedup/2/replans", "out of range ×7")
	for _, k := range []string{"part/dedup/0/replans", "part/dedup/1/replans"} {
		if got, ok := v[k]; ok {
			t.Errorf("%s = %q; want no re-plans shown for a partition whose restore has none", k, got)
		}
	}
	testenv.ExpectPageValue(t, v, "part/dedup/1/lag_records", "7")
	testenv.ExpectPageValue(t, v, "part/dedup/1/lag_seconds", "3.5")

	// aggregate: from its metrics only. One partition restored, one with
	// changelog left to replay.
	testenv.ExpectPageValue(t, v, "stage/aggregate/state", "restoring")
	testenv.ExpectPageValue(t, v, "stage/aggregate/owned", "2")
	testenv.ExpectPageValue(t, v, "stage/aggregate/restoring", "1")
	testenv.ExpectPageValue(t, v, "stage/aggregate/partitions", "n/a")
	testenv.ExpectPageValue(t, v, "stage/aggregate/group", "n/a")
	testenv.ExpectPageValue(t, v, "stage/aggregate/in", "400")
	testenv.ExpectPageValue(t, v, "stage/aggregate/lag_records", "n/a")

	// sink: rows inserted are its output; rows already present are not.
	testenv.ExpectPageValue(t, v, "stage/sink/state", "running")
	testenv.ExpectPageValue(t, v, "stage/sink/owned", "3")
	testenv.ExpectPageValue(t, v, "stage/sink/in", "30")
	testenv.ExpectPageValue(t, v, "stage/sink/out", "25")

	// Every lag series, the other group's too.
	testenv.ExpectPageValue(t, v, "lag/g-dedup/usage.events/1/records", "7")
	testenv.ExpectPageValue(t, v, "lag/g-dedup/usage.events/2/seconds", "1.5")
	testenv.ExpectPageValue(t, v, "lag/other/usage.deduped/0/records", "9")
	testenv.ExpectPageValue(t, v, "lag/other/usage.deduped/0/seconds", "n/a")
	testenv.ExpectPageValue(t, v, "lag/g-dedup/usage.events/0/held_records", "12")
	testenv.ExpectPageValue(t, v, "lag/g-dedup/usage.events/0/held_seconds", "1900.0")
	testenv.ExpectPageValue(t, v, "lag/other/usage.deduped/0/held_records", "n/a")

	testenv.ExpectPageValue(t, v, "table/aggregates/acme/tokens", "3400")
	testenv.ExpectPageValue(t, v, "table/aggregates/globex/api_calls", "1")

	// Stages in pipeline order.
	_, body := get(t, s, "/")
	if i, j, k := strings.Index(body, `data-stage="dedup"`), strings.Index(body, `data-stage="aggregate"`), strings.Index(body, `data-stage="sink"`); !(i >= 0 && i < j && j < k) {
		t.Errorf("stages not in pipeline order: dedup at %d, aggregate at %d, sink at %d", i, j, k)
	}

	// Rates: over the last 5 s or more, not since the start.
	clk.advance(5 * time.Second)
	m.in.WithLabelValues("dedup", "usage.events").Add(50)
	ready = nil
	v = page(t, s)
	testenv.ExpectPageValue(t, v, "stage/dedup/in_rate", "10.0")
	testenv.ExpectPageValue(t, v, "stage/dedup/out_rate", "0.0")
	testenv.ExpectPageValue(t, v, "ready", "ready")
	// A look less than a second later shows rates over the same base.
	clk.advance(500 * time.Millisecond)
	v = page(t, s)
	testenv.ExpectPageValue(t, v, "stage/dedup/in_rate", "9.1") // 50 records over 5.5 s

	// The same snapshot as JSON.
	code, body := get(t, s, "/status.json")
	if code != http.StatusOK {
		t.Fatalf("GET /status.json = %d", code)
	}
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("status.json: %v\n%s", err, body)
	}
	if len(st.Stages) != 3 || st.Stages[0].Stage != "dedup" || st.Stages[0].RecordsIn != 1050 || len(st.Stages[0].Partitions) != 3 ||
		*st.Stages[0].Partitions[2].RestoreRemaining != 1234 || st.Stages[0].Partitions[2].RestoreKind != "full" ||
		st.Stages[0].Partitions[2].RestoreReason != "horizon" || st.Stages[0].Partitions[2].RestoreReplans != 7 ||
		st.Stages[0].Partitions[1].RestoreReplans != 0 || !st.LagExported || len(st.Lag) != 4 || !st.Ready {
		t.Errorf("status.json does not match the page:\n%s", body)
	}

	if code, _ := get(t, s, "/no-such-page"); code != http.StatusNotFound {
		t.Errorf("GET /no-such-page = %d, want 404", code)
	}
}

// TestStatusPageWithoutLag: a process that exports no consumer lag shows
// n/a, not zero; a failed stage shows its error, escaped.
func TestStatusPageWithoutLag(t *testing.T) {
	reg := prometheus.NewRegistry()
	newFakeStages(reg, false)
	s, _ := newTestServer(t, reg)
	failed := &fakeStage{stage: "dedup", group: "g", input: "usage.events", err: errors.New("stream: <script>alert(1)</script>")}
	s.AddStatus(func() StageStatus { return StageStatusOf(failed) })
	v := page(t, s)
	testenv.ExpectPageValue(t, v, "lag", "n/a: this process exports no consumer lag (meterline_consumer_lag_records)")
	testenv.ExpectPageValue(t, v, "stage/dedup/lag_records", "n/a")
	testenv.ExpectPageValue(t, v, "stage/dedup/lag_seconds", "n/a")
	testenv.ExpectPageValue(t, v, "stage/dedup/state", "failed: stream: <script>alert(1)</script>")
	testenv.ExpectPageValue(t, v, "stage/dedup/partitions", "none")
	testenv.ExpectPageValue(t, v, "stage/dedup/owned", "0")
	testenv.ExpectPageValue(t, v, "stage/dedup/in_rate", "n/a") // less than a second since the start
	_, body := get(t, s, "/")
	if strings.Contains(body, "<script>alert") {
		t.Error("a stage error reached the page unescaped")
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// unsafeStage is a fakeStage whose changelog deletes state records
// (ChangelogStage).
type unsafeStage struct {
	fakeStage
	unsafe error
}

func (u *unsafeStage) ChangelogUnsafe() error { return u.unsafe }

// TestStatusPageChangelogUnsafe: a stage whose changelog's cleanup policy
// deletes state records a restore must read says why, on the page and in
// status.json; one whose changelog keeps them says nothing.
func TestStatusPageChangelogUnsafe(t *testing.T) {
	reg := prometheus.NewRegistry()
	newFakeStages(reg, false)
	s, _ := newTestServer(t, reg)
	bad := &unsafeStage{fakeStage: fakeStage{stage: "dedup", group: "g", input: "usage.events", joined: true},
		unsafe: errors.New("dedup: changelog c has cleanup.policy=delete")}
	good := &unsafeStage{fakeStage: fakeStage{stage: "aggregate", group: "a", input: "usage.deduped.v2", joined: true}}
	s.AddStatus(func() StageStatus { return StageStatusOf(bad) })
	s.AddStatus(func() StageStatus { return StageStatusOf(good) })
	v := page(t, s)
	testenv.ExpectPageValue(t, v, "changelog_unsafe/dedup", "changelog deletes state records")
	if _, ok := v["changelog_unsafe/aggregate"]; ok {
		t.Error("the page says the aggregate changelog deletes state records; it keeps them")
	}
	_, body := get(t, s, "/")
	if !strings.Contains(body, "cleanup.policy=delete") {
		t.Error("the page does not say why the dedup changelog is unsafe")
	}
	_, js := get(t, s, "/status.json")
	var st Status
	if err := json.Unmarshal([]byte(js), &st); err != nil {
		t.Fatal(err)
	}
	if st.Stages[0].ChangelogUnsafe != bad.unsafe.Error() || st.Stages[1].ChangelogUnsafe != "" {
		t.Errorf("status.json: changelog_unsafe %q and %q, want the dedup error and none", st.Stages[0].ChangelogUnsafe, st.Stages[1].ChangelogUnsafe)
	}
}

// stuckStage is a fakeStage whose partitions may wait for their committed
// offsets (OffsetWaitStage) and whose writes the brokers may refuse
// (WriteStage).
type stuckStage struct {
	fakeStage
	waits   map[int32]time.Time
	why     string
	refused error
}

func (u *stuckStage) EachOffsetWait(fn func(p int32, since time.Time, why string)) {
	for _, p := range slices.Sorted(maps.Keys(u.waits)) {
		fn(p, u.waits[p], u.why)
	}
}

func (u *stuckStage) WriteRefused() error { return u.refused }

// TestStatusPageWaitingAndCannotWrite: a stage with a partition waiting
// for its committed offsets (one it has not listed, being neither
// restoring nor processing) and whose writes the brokers refuse shows the
// partition waiting, for how long and why, and that it cannot write, on
// the page and in status.json; its state says it cannot write.
func TestStatusPageWaitingAndCannotWrite(t *testing.T) {
	reg := prometheus.NewRegistry()
	newFakeStages(reg, false)
	s, _ := newTestServer(t, reg)
	st := &stuckStage{fakeStage: fakeStage{stage: "dedup", group: "g", input: "usage.events", joined: true,
		parts: []fakePartition{{p: 0}, {p: 2}}},
		waits:   map[int32]time.Time{1: time.Now().Add(-90 * time.Second)},
		why:     "a previous owner's open transaction (UNSTABLE_OFFSET_COMMIT)",
		refused: errors.New("cannot write for 12s; the brokers refuse its writes with NOT_ENOUGH_REPLICAS")}
	s.AddStatus(func() StageStatus { return StageStatusOf(st) })
	v := page(t, s)
	testenv.ExpectPageValue(t, v, "cannot_write/dedup", "cannot write")
	if got := v["part/dedup/1/state"]; !strings.HasPrefix(got, "waiting 9") {
		t.Errorf("partition 1's state on the page: %q, want waiting for about 90 s", got)
	}
	_, body := get(t, s, "/")
	for _, want := range []string{"NOT_ENOUGH_REPLICAS", "UNSTABLE_OFFSET_COMMIT"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page does not say %q", want)
		}
	}
	_, js := get(t, s, "/status.json")
	var got Status
	if err := json.Unmarshal([]byte(js), &got); err != nil {
		t.Fatal(err)
	}
	sg := got.Stages[0]
	if sg.CannotWrite != st.refused.Error() || sg.Waiting != 1 || sg.Owned != 3 || len(sg.Partitions) != 3 {
		t.Fatalf("status.json: cannot_write %q, %d waiting of %d owned, partitions %+v; want the refusal, 1 of 3", sg.CannotWrite, sg.Waiting, sg.Owned, sg.Partitions)
	}
	p := sg.Partitions[1]
	if p.Partition != 1 || p.State != PartitionWaiting || p.WaitSeconds == nil || *p.WaitSeconds < 89 || p.WaitReason != st.why {
		t.Errorf("status.json partition %+v, want 1 waiting for 90 s, and why", p)
	}
}
