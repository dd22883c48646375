package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// envUpdateScreenshot, when set, makes TestRealStatusPageDemo store its
// screenshot as docs/status-page.png (docs/operations.md shows it).
const envUpdateScreenshot = "METERLINE_UPDATE_SCREENSHOT"

// TestRealStatusPageDemo runs the demo with its status page, and once the
// stages caught up with the generator (dedup killed and restarted on the
// way), loads the page in headless Chromium and checks it against the
// demo's real state: the partitions each stage owns are the group's
// assignment on the broker, every partition is processing, the changelog
// records replayed are what dedup's restore replayed, this hour's
// aggregates per customer are the latest revisions in usage.aggregates, and
// the totals counted per customer equal the generator's ground truth. It
// takes the screenshot of docs/operations.md.
func TestRealStatusPageDemo(t *testing.T) {
	chromium := testenv.Chromium(t)
	reg := prometheus.NewRegistry()
	var out bytes.Buffer
	checked := false
	cfg := Config{Dir: t.TempDir(), Duration: 12 * time.Second, Rate: 300, Seed: 11, Out: &out,
		HTTPAddr: "127.0.0.1:0", Registry: reg}
	cfg.onCaughtUp = func(s caughtUpState) {
		checked = true
		checkDemoPage(t, chromium, reg, s)
	}
	ok, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !checked {
		t.Fatalf("the demo never reached its caught-up hook:\n%s", out.String())
	}
	if !ok {
		t.Fatalf("the demo did not reconcile:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "status page: http://127.0.0.1:") {
		t.Errorf("the demo did not print its status page address:\n%s", out.String())
	}
}

func checkDemoPage(t *testing.T, chromium string, reg *prometheus.Registry, s caughtUpState) {
	t.Helper()
	if s.statusURL == "" {
		t.Fatal("the demo serves no status page")
	}
	// The page's followers of the output topics catch up with the
	// stages: wait until the counted totals reach the generated ones.
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := fetchStatus(s.statusURL)
		if err == nil && totalsConverged(st) && st.Ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the status page's totals never converged: %+v (%v)", st, err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	hourBefore, _ := aggregator.Hour.Bounds(time.Now().UnixMilli())
	dom := testenv.DumpDOM(t, chromium, s.statusURL)
	hourAfter, _ := aggregator.Hour.Bounds(time.Now().UnixMilli())
	v := testenv.PageValues(dom)
	t.Logf("page: %v", v)

	expect := func(key, want string) {
		t.Helper()
		testenv.ExpectPageValue(t, v, key, want)
	}

	expect("ready", "ready")
	adm := testenv.Admin(t, s.brokers)
	for _, sg := range []struct{ stage, group, input string }{
		{"dedup", dedupGroup, s.names.EventsTopic()},
		{"aggregate", aggGroup, s.names.DedupedTopic()},
	} {
		k := "stage/" + sg.stage + "/"
		expect(k+"state", "running")
		expect(k+"group", sg.group)
		expect(k+"input", sg.input)
		assigned := testenv.GroupAssignment(t, adm, sg.group, sg.input)
		if len(assigned) != partitions {
			t.Errorf("group %s owns %v of %s, want all %d partitions", sg.group, assigned, sg.input, partitions)
		}
		var ps []string
		for _, p := range assigned {
			ps = append(ps, strconv.Itoa(int(p)))
			expect(fmt.Sprintf("part/%s/%d/state", sg.stage, p), "processing")
			// Lag is live (ticks keep arriving): shown, as a number.
			if _, err := strconv.Atoi(v[fmt.Sprintf("part/%s/%d/lag_records", sg.stage, p)]); err != nil {
				t.Errorf("partition %d of %s shows no lag: %v", p, sg.stage, err)
			}
		}
		expect(k+"partitions", strings.Join(ps, ", "))
		expect(k+"owned", strconv.Itoa(len(assigned)))
		expect(k+"restoring", "0")
		expect(k+"replayed", strconv.FormatFloat(metricSum(reg, "meterline_stream_restore_records_total", map[string]string{"stage": sg.stage}), 'f', 0, 64))
	}

	// This hour's aggregates: the latest revision of each of this hour's
	// keys in usage.aggregates.
	if hourBefore != hourAfter {
		t.Log("the hour turned while the page loaded; not checking this hour's aggregates")
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		recs, err := topics.ReadCommitted(ctx, s.brokers, s.names.AggregatesTopic(), nil)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		want := thisHourFromTopic(recs, hourBefore)
		if len(want) == 0 {
			t.Fatal("usage.aggregates holds no aggregate of this hour")
		}
		for c, ms := range want {
			for _, m := range meters {
				expect(fmt.Sprintf("table/this-hour/%s/%s", c, m), strconv.FormatInt(ms[m], 10))
			}
		}
	}

	// Totals: what the generator sent, per customer and meter.
	s.truth.mu.Lock()
	for c, ms := range s.truth.totals {
		for _, m := range meters {
			expect(fmt.Sprintf("table/totals/%s/%s counted", c, m), strconv.FormatInt(ms[m], 10))
			expect(fmt.Sprintf("table/totals/%s/%s generated", c, m), strconv.FormatInt(ms[m], 10))
		}
	}
	s.truth.mu.Unlock()

	shot := filepath.Join(t.TempDir(), "status-page.png")
	testenv.Screenshot(t, chromium, s.statusURL, shot, 1360, 1280)
	if os.Getenv(envUpdateScreenshot) != "" {
		b, err := os.ReadFile(shot)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("..", "..", "docs", "status-page.png"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote docs/status-page.png (%d bytes)", len(b))
	}
}

func fetchStatus(url string) (service.Status, error) {
	var st service.Status
	resp, err := http.Get(url + "status.json")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// totalsConverged: every counted total of the totals table equals its
// generated one.
func totalsConverged(st service.Status) bool {
	for _, tb := range st.Tables {
		if tb.ID != "totals" {
			continue
		}
		if len(tb.Rows) == 0 {
			return false
		}
		for _, r := range tb.Rows {
			for i := 1; i+1 < len(r); i += 2 {
				if r[i] != r[i+1] {
					return false
				}
			}
		}
		return true
	}
	return false
}

func thisHourFromTopic(recs []*kgo.Record, start int64) map[string]map[string]int64 {
	latest := map[string]*schemas.Aggregate{}
	for _, r := range recs {
		var a schemas.Aggregate
		if schemas.DecodeInto(r.Value, &a) != nil {
			continue
		}
		if cur, ok := latest[string(r.Key)]; !ok || a.Revision > cur.Revision {
			latest[string(r.Key)] = &a
		}
	}
	out := map[string]map[string]int64{}
	for _, a := range latest {
		if a.PeriodStart != start {
			continue
		}
		if out[a.CustomerID] == nil {
			out[a.CustomerID] = map[string]int64{}
		}
		out[a.CustomerID][a.Meter] += a.Value
	}
	return out
}
