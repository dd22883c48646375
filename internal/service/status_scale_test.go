package service

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/testenv"
)

// TestStatusPageAtScale: a stage owning 10,000 partitions, each with its
// lag and a standby copy, gives a page of bounded size that a browser
// opens at once, during an incident too: a summary of the stage's
// partitions, then the ones most in trouble, worst first (restoring, a
// restore planning again after changelog fetches out of range first, then
// most seconds behind), and the same for standbys and the consumer lag
// (a partition held by an open transaction counts its held seconds).
// /status.json still lists every partition.
func TestStatusPageAtScale(t *testing.T) {
	const n, maxPage = 10000, 512 << 10
	reg := prometheus.NewRegistry()
	m := newFakeStages(reg, true)
	s, _ := newTestServer(t, reg)
	st := &standbyStage{fakeStage: fakeStage{stage: "dedup", group: "g", instance: "n1", input: "usage.events", joined: true}}
	for p := range n {
		fp := fakePartition{p: int32(p), remaining: -1, kind: "tail", reason: "within_horizon"}
		switch p {
		case 4242:
			fp.restoring, fp.remaining = true, 100
		case 9001:
			fp.restoring, fp.remaining = true, 5000
		}
		st.parts = append(st.parts, fp)
		st.standbys = append(st.standbys, [3]int64{int64(p), 1000, int64(p % 7)})
		recs, secs := float64(p%10), float64(p%10)/10
		switch p {
		case 7777:
			recs, secs = 50, 600
		case 1234:
			recs, secs = 20, 300
		}
		m.lagRecs.WithLabelValues("g", "usage.events", itoa(p)).Set(recs)
		m.lagSecs.WithLabelValues("g", "usage.events", itoa(p)).Set(secs)
	}
	// Partition 4242's restore keeps planning again, its changelog
	// fetches out of range: stuck, it comes before one with more left to
	// replay.
	m.replans.WithLabelValues("dedup", "4242").Set(12)
	// Partition 5555: not behind, held by a transaction open for 900 s.
	m.heldRecs.WithLabelValues("g", "usage.events", "5555").Set(40)
	m.heldSecs.WithLabelValues("g", "usage.events", "5555").Set(900)
	st.standbys[3333][2] = 1e6
	s.AddStatus(func() StageStatus { return StageStatusOf(st) })

	body := boundedPage(t, s, fmt.Sprintf("at %d partitions", n), maxPage)
	v := testenv.PageValues(body)
	testenv.ExpectPageValue(t, v, "stage/dedup/owned", "10000")
	testenv.ExpectPageValue(t, v, "stage/dedup/restoring", "2")
	testenv.ExpectPageValue(t, v, "parts/dedup/processing", "9998")
	testenv.ExpectPageValue(t, v, "parts/dedup/behind", fmt.Sprint(n-n/10)) // every partition but those with p%10 == 0
	testenv.ExpectPageValue(t, v, "parts/dedup/shown", fmt.Sprintf("%d of %d", statusRowsMax, n))
	testenv.ExpectPageValue(t, v, "standbys/dedup/shown", fmt.Sprintf("%d of %d", statusRowsMax, n))
	testenv.ExpectPageValue(t, v, "lag/shown", fmt.Sprintf("%d of %d", statusRowsMax, n))
	testenv.ExpectPageValue(t, v, "part/dedup/9001/restore_remaining", "5000")
	testenv.ExpectPageValue(t, v, "part/dedup/4242/replans", "out of range ×12")
	testenv.ExpectPageValue(t, v, "part/dedup/7777/lag_seconds", "600.0")
	testenv.ExpectPageValue(t, v, "standby/dedup/3333/lag", "1000000")
	testenv.ExpectPageValue(t, v, "lag/g/usage.events/7777/seconds", "600.0")
	testenv.ExpectPageValue(t, v, "lag/g/usage.events/5555/held_seconds", "900.0")

	// Worst first: the restoring partitions (those planning again first,
	// then most left to replay), then the most seconds behind.
	order := func(prefix string, keys ...string) {
		t.Helper()
		last := -1
		for _, k := range keys {
			i := strings.Index(body, `data-k="`+prefix+k)
			if i < 0 || i < last {
				t.Errorf("%s%s at %d, after the one before it (%d); want %v in that order", prefix, k, i, last, keys)
			}
			last = i
		}
	}
	order("part/dedup/", "4242/", "9001/", "7777/", "1234/")
	order("lag/g/usage.events/", "5555/", "7777/", "1234/")
	order("standby/dedup/", "3333/")

	// The full list, on request.
	_, js := get(t, s, "/status.json")
	t.Logf("status.json at %d partitions: %d bytes", n, len(js))
	var full Status
	if err := json.Unmarshal([]byte(js), &full); err != nil {
		t.Fatal(err)
	}
	if len(full.Stages) == 0 || len(full.Stages[0].Partitions) != n || len(full.Stages[0].Standbys) != n || len(full.Lag) != n {
		t.Errorf("status.json: not every partition, standby and lag row")
	}
}

// TestStatusPageBoundsTables: a table a process adds (the HTTP ingest's
// tenants, the demo's customers, whom any producer with its key makes)
// keeps the page bounded however many rows it has: its first
// statusRowsMax rows in its order, and how many there are. /status.json
// is bounded too: its first statusJSONRowsMax rows in its order, and
// rows_total, how many there are, so that a script sees what it was not
// given (100,000 rows of 200 bytes were 24 MB of JSON, built on every
// request).
func TestStatusPageBoundsTables(t *testing.T) {
	const n, maxPage = 100_000, 512 << 10
	reg := prometheus.NewRegistry()
	s, _ := newTestServer(t, reg)
	rows := make([][]string, n)
	for i := range rows {
		rows[i] = []string{fmt.Sprintf("customer-%06d-%s", i, strings.Repeat("x", 200)), itoa(i), itoa(2 * i)}
	}
	s.AddTable(func() Table {
		return Table{ID: "this-hour", Title: "This hour", Columns: []string{"customer", "api_calls", "tokens"}, Rows: rows}
	})
	body := boundedPage(t, s, fmt.Sprintf("with a table of %d rows", n), maxPage)
	v := testenv.PageValues(body)
	testenv.ExpectPageValue(t, v, "table/this-hour/shown", fmt.Sprintf("%d of %d", statusRowsMax, n))
	testenv.ExpectPageValue(t, v, "table/this-hour/"+rows[0][0]+"/tokens", "0")
	testenv.ExpectPageValue(t, v, "table/this-hour/"+rows[statusRowsMax-1][0]+"/tokens", itoa(2*(statusRowsMax-1)))
	if _, ok := v["table/this-hour/"+rows[statusRowsMax][0]+"/tokens"]; ok {
		t.Errorf("row %d of the table shown, want the first %d", statusRowsMax+1, statusRowsMax)
	}

	_, js := get(t, s, "/status.json")
	var full Status
	if err := json.Unmarshal([]byte(js), &full); err != nil {
		t.Fatal(err)
	}
	t.Logf("status.json with a table of %d rows: %d bytes", n, len(js))
	if len(full.Tables) != 1 || len(full.Tables[0].Rows) != statusJSONRowsMax || full.Tables[0].RowsTotal != n ||
		full.Tables[0].Rows[statusJSONRowsMax-1][0] != rows[statusJSONRowsMax-1][0] {
		t.Errorf("status.json: %d tables; want one of its first %d rows in order, and rows_total %d", len(full.Tables), statusJSONRowsMax, n)
	}
	if !strings.Contains(js, fmt.Sprintf(`"rows_total": %d`, n)) || len(js) > 2*statusJSONRowsMax*len(rows[0][0]) {
		t.Errorf("status.json: %d bytes, want at most %d, naming rows_total %d", len(js), 2*statusJSONRowsMax*len(rows[0][0]), n)
	}
}

// boundedPage gets the page of s and checks that it holds at most max
// bytes; what says what it shows.
func boundedPage(t *testing.T, s *Server, what string, max int) string {
	t.Helper()
	code, body := get(t, s, "/")
	if code != 200 {
		t.Fatalf("GET / = %d", code)
	}
	t.Logf("page %s: %d bytes", what, len(body))
	if len(body) > max {
		t.Errorf("page %s: %d bytes, want at most %d", what, len(body), max)
	}
	return body
}
