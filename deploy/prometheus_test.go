package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
)

// EnvPrometheus names the prometheus binary of the dashboard test; `make
// test` sets it from deploy/local/prometheus.sh install.
const EnvPrometheus = "METERLINE_TEST_PROMETHEUS"

// TestMain removes the meterline binary testenv.Meterline built.
func TestMain(m *testing.M) { testenv.Main(m) }

// Test Prometheus scrape interval, and the $__rate_interval Grafana would
// use with it (4 × scrape interval), plus room for a late scrape.
const (
	testScrapeInterval = time.Second
	testRateInterval   = "6s"
)

// TestRealDashboardQueriesReturnData runs a real `meterline run` (dedup,
// aggregate and sink) against the real broker and ClickHouse, feeds it
// events with duplicates and bad input, lets Debian's prometheus scrape it,
// and evaluates every variable query and every PromQL expression of the
// Grafana dashboard with the variables filled in as Grafana would. Each
// must return data: a misspelt metric or label, or a selector on a label a
// metric does not have, returns nothing and fails the test.
func TestRealDashboardQueriesReturnData(t *testing.T) {
	promBin := realPrometheus(t, "dashboard")
	brokers := testenv.RealKafka(t)
	chAddr := testenv.RealClickHouse(t)
	_, db := testenv.ClickHouseDB(t) // dropped on success, after meterline stops
	dash := loadDashboard(t)

	work := testenv.LogDir(t, "meterline-prometheus-test-*") // "meterline" marks our prometheus for prometheus.sh
	bin := testenv.Meterline(t)

	prefix := testenv.Name(t, "dash") + "."
	group := strings.TrimSuffix(prefix, ".")
	deleteTopicsAfter(t, brokers, prefix)
	runCmd(t, bin, filepath.Join(work, "topics.log"), "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--partitions", "2", "--replication-factor", "1")

	// Entitlements for the entitlements panels: every customer on a
	// default plan whose cap on api_calls feed's events pass (over_limit)
	// and whose grant the live tokens spend (no_credit after it).
	plan := filepath.Join(work, "default.yaml")
	rates := filepath.Join(work, "rates.yaml")
	if err := os.WriteFile(plan, []byte("plan: dash\ncaps:\n  api_calls: {limit: 20}\ngrants:\n  dash: {amount: 500}\noverdraft: {policy: deny}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rates, []byte("versions:\n  - effective_from: \"2026-01-01T00:00:00Z\"\n    rates: {api_calls: 1, tokens: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, w := range [][]string{{"set-default", "-f", plan}, {"set-rates", "-f", rates}} {
		runCmd(t, bin, filepath.Join(work, "entitlements.log"), append(append([]string{"entitlements"}, w...),
			"--brokers", strings.Join(brokers, ","), "--topic-prefix", prefix)...)
	}

	// A key for the HTTP ingest's panels: the run serves it too.
	token := createKey(t, bin, filepath.Join(work, "keys.log"), "keys", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--tenant", "dash", "--allow-customers", "*")
	ingestAddr := testenv.FreeAddr(t)
	metricsAddr := testenv.FreeAddr(t)
	testenv.StartProcess(t, "meterline", filepath.Join(work, "meterline.log"), bin, "run",
		"--ingest", "--ingest-addr", ingestAddr,
		"--brokers", strings.Join(brokers, ","), "--clickhouse", chAddr, "--log-level", "warn",
		"--topic-prefix", prefix,
		"--instance-id", "dash-1", "--state-dir", filepath.Join(work, "state"),
		"--dedup-group", group+"-dedup", "--aggregate-group", group+"-aggregate", "--sink-group", group+"-sink", "--aggregate-entitlements",
		"--sink-database", db, "--sink-migrate",
		"--metrics-addr", metricsAddr, "--dedup-tick-interval", "1s",
		"--session-timeout", "6s", "--transaction-timeout", "10s",
		"--sink-max-batch-wait", "200ms", "--sink-commit-interval", "300ms",
		"--dedup-keys-file", testenv.DedupKeysFile(t))
	waitHTTP(t, "http://"+metricsAddr+"/readyz", 90*time.Second)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() }) // before meterline stops (cleanups run last-in, first-out)
	feed(t, brokers, prefix)
	live := newProducer(t, brokers, prefix)
	wg.Add(1)
	go func() { defer wg.Done(); defer live.Close(); feedContinuously(ctx, t, live) }()
	wg.Add(1)
	go func() { defer wg.Done(); postContinuously(ctx, t, "http://"+ingestAddr+"/v1/events", token) }()

	prom := startPrometheus(t, promBin, work, "", metricsAddr)

	// Every expression must return data; series appear as the pipeline
	// runs (lag once offsets are committed, watermarks after ticks, sink
	// rows after the first commit window), so retry until all do.
	deadline := time.Now().Add(2 * time.Minute)
	var failures []string
	var report []string
	for {
		failures, report = evaluateDashboard(prom, dash)
		if len(failures) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	for _, r := range report {
		t.Log(r)
	}
	for _, f := range failures {
		t.Error(f)
	}
	if len(failures) == 0 {
		t.Logf("all %d dashboard expressions and %d variables returned data", len(dash.targets()), len(dash.Templating.List)-1)
	}
}

// evaluateDashboard resolves the variables and runs every expression
// once. It returns what failed, and a line per expression.
func evaluateDashboard(prom promClient, d dashboard) (failures, report []string) {
	values := map[string]string{
		"__rate_interval": testRateInterval,
		"__interval":      "2s",
		"__interval_ms":   "2000",
		"__range":         "5m",
		"__range_s":       "300",
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := substitute(v.query(), values)
		m := labelValuesRe.FindStringSubmatch(q)
		if m == nil {
			failures = append(failures, fmt.Sprintf("variable %s: cannot read %q as label_values(selector, label)", v.Name, q))
			continue
		}
		vals, err := prom.labelValues(m[2], m[1])
		if err != nil || len(vals) == 0 {
			failures = append(failures, fmt.Sprintf("variable %s: %s: no values (err %v)", v.Name, q, err))
			continue
		}
		report = append(report, fmt.Sprintf("variable %s = %v", v.Name, vals))
		values[v.Name] = grafanaRegexFormat(vals)
	}
	if len(failures) > 0 {
		return failures, report
	}
	for _, tg := range d.targets() {
		q := substitute(tg.expr, values)
		if rest := varRef.FindString(q); rest != "" {
			failures = append(failures, fmt.Sprintf("%s: %s left unsubstituted in %s", tg.where, rest, q))
			continue
		}
		res, err := prom.query(q)
		if err != nil {
			failures = append(failures, fmt.Sprintf("%s: %s: %v", tg.where, q, err))
			continue
		}
		finite := 0
		for _, s := range res {
			if !math.IsNaN(s.value) {
				finite++
			}
		}
		report = append(report, fmt.Sprintf("%-60s %2d series, %2d not NaN: %s", tg.where, len(res), finite, q))
		if len(res) == 0 || finite == 0 {
			failures = append(failures, fmt.Sprintf("%s: no data (%d series, %d not NaN): %s", tg.where, len(res), finite, q))
			continue
		}
		// Every label the legend names is on every series: a wrong
		// label in `by (...)` would leave it out.
		for _, lm := range legendLabels.FindAllStringSubmatch(tg.legend, -1) {
			for _, s := range res {
				if _, ok := s.metric[lm[1]]; !ok {
					failures = append(failures, fmt.Sprintf("%s: legend names {{%s}}, missing from series %v: %s", tg.where, lm[1], s.metric, q))
					break
				}
			}
		}
	}
	return failures, report
}

var labelValuesRe = regexp.MustCompile(`^\s*label_values\(\s*(.+)\s*,\s*(\w+)\s*\)\s*$`)

// substitute replaces Grafana variable references as Grafana does for
// Prometheus (multi-value variables as a regex alternation).
func substitute(expr string, values map[string]string) string {
	return varRef.ReplaceAllStringFunc(expr, func(ref string) string {
		n := refName(varRef.FindStringSubmatch(ref))
		if v, ok := values[n]; ok {
			return v
		}
		return ref
	})
}

// grafanaRegexFormat formats the values of a multi-value variable with
// "All" selected as Grafana's Prometheus data source does: regex
// metacharacters escaped (doubled backslash, inside a PromQL string), and
// several values as (a|b).
func grafanaRegexFormat(vals []string) string {
	esc := make([]string, len(vals))
	for i, v := range vals {
		esc[i] = regexp.MustCompile(`[\\^$*+?.()|{}\[\]]`).ReplaceAllString(v, `\\$0`)
	}
	if len(esc) == 1 {
		return esc[0]
	}
	return "(" + strings.Join(esc, "|") + ")"
}

type promSample struct {
	metric map[string]string
	value  float64
}

type promClient struct{ base string }

func (p promClient) get(path string, params url.Values, into any) error {
	resp, err := http.Get(p.base + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	if env.Status != "success" {
		return fmt.Errorf("prometheus: %s", env.Error)
	}
	return json.Unmarshal(env.Data, into)
}

func (p promClient) labelValues(label, match string) ([]string, error) {
	var vals []string
	err := p.get("/api/v1/label/"+label+"/values", url.Values{"match[]": {match}}, &vals)
	return vals, err
}

// query runs an instant query; a scalar result counts as one sample.
func (p promClient) query(q string) ([]promSample, error) {
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.get("/api/v1/query", url.Values{"query": {q}}, &data); err != nil {
		return nil, err
	}
	parse := func(v [2]any) float64 {
		s, _ := v[1].(string)
		var f float64
		if _, err := fmt.Sscan(s, &f); err != nil {
			return math.NaN()
		}
		return f
	}
	switch data.ResultType {
	case "vector":
		var vec []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(data.Result, &vec); err != nil {
			return nil, err
		}
		out := make([]promSample, len(vec))
		for i, s := range vec {
			out[i] = promSample{metric: s.Metric, value: parse(s.Value)}
		}
		return out, nil
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(data.Result, &v); err != nil {
			return nil, err
		}
		return []promSample{{metric: map[string]string{}, value: parse(v)}}, nil
	}
	return nil, fmt.Errorf("result type %s; a dashboard expression must be a vector or a scalar", data.ResultType)
}

// realPrometheus returns the prometheus binary of EnvPrometheus, or skips
// the real test named by what (saying so) without it or with -short.
func realPrometheus(t *testing.T, what string) string {
	t.Helper()
	promBin := os.Getenv(EnvPrometheus)
	if promBin == "" || testing.Short() {
		t.Skipf("SKIP: real Prometheus %s test; set %s=/usr/bin/prometheus (deploy/local/prometheus.sh install prints it; make test does) and drop -short", what, EnvPrometheus)
	}
	if _, err := os.Stat(promBin); err != nil {
		t.Fatalf("%s=%s: %v", EnvPrometheus, promBin, err)
	}
	return promBin
}

// startPrometheus runs promBin on a free port with its config and data in
// work, scraping targets as job scrapeJob every testScrapeInterval and
// evaluating the rule file rules (none when empty) as often, and returns a
// client once it is ready. It stops when the test ends.
func startPrometheus(t *testing.T, promBin, work, rules string, targets ...string) promClient {
	t.Helper()
	cfg := fmt.Sprintf("global:\n  scrape_interval: %s\n  evaluation_interval: %s\n", testScrapeInterval, testScrapeInterval)
	if rules != "" {
		cfg += fmt.Sprintf("rule_files: [%q]\n", rules)
	}
	var ts []string
	for _, tg := range targets {
		ts = append(ts, fmt.Sprintf("%q", tg))
	}
	cfg += fmt.Sprintf("scrape_configs:\n  - job_name: %s\n    static_configs:\n      - targets: [%s]\n", scrapeJob, strings.Join(ts, ", "))
	cfgFile := filepath.Join(work, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	promAddr := testenv.FreeAddr(t)
	testenv.StartProcess(t, "prometheus", filepath.Join(work, "prometheus.log"), promBin,
		"--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(work, "tsdb"),
		"--web.listen-address="+promAddr, "--log.level=warn")
	waitHTTP(t, "http://"+promAddr+"/-/ready", 60*time.Second)
	return promClient{base: "http://" + promAddr}
}

func runCmd(t *testing.T, bin, logFile string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	_ = os.WriteFile(logFile, out, 0o644)
	if err != nil {
		t.Fatalf("meterline %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// createKey runs `meterline keys create` and returns the key it prints.
func createKey(t *testing.T, bin, logFile string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	_ = os.WriteFile(logFile, append(out, stderr.Bytes()...), 0o644)
	token := strings.TrimSpace(string(out))
	if err != nil || !strings.HasPrefix(token, "mlk_") {
		t.Fatalf("meterline %s: %v, stdout %q\n%s", strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return token
}

// postContinuously posts a small batch to the HTTP ingest every 300 ms
// (its requests, latency, events and records panels), and an event
// without a customer every few batches (a 400, refused events).
func postContinuously(ctx context.Context, t *testing.T, url, token string) {
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		customer := fmt.Sprintf("cust-%d", i%3)
		if i%5 == 4 {
			customer = ""
		}
		resp, answer, err := postEvent(ctx, url, token, fmt.Sprintf("http-%d", i), customer, int64(1+i%7))
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("ingest feed: %v", err)
			}
			return
		}
		if want := map[bool]int{true: http.StatusBadRequest, false: http.StatusAccepted}[customer == ""]; resp.StatusCode != want {
			t.Errorf("ingest feed: %d %s, want %d", resp.StatusCode, answer, want)
			return
		}
	}
}

// postEvent posts one event of meter tokens, now, to the HTTP ingest's
// /v1/events at url with token, and returns its answer (the body read and
// closed).
func postEvent(ctx context.Context, url, token, id, customer string, quantity int64) (*http.Response, []byte, error) {
	body := fmt.Sprintf(`[{"event_id":%q,"customer_id":%q,"meter":"tokens","quantity":%d,"event_time":%q,"source":"http"}]`,
		id, customer, quantity, time.Now().UTC().Format(time.RFC3339Nano))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	return resp, answer, err
}

func waitHTTP(t *testing.T, u string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(u)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		} else {
			last = err.Error()
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("%s not OK after %s: %s", u, d, last)
}

func deleteTopicsAfter(t *testing.T, brokers []string, prefix string) {
	t.Helper()
	adm := testenv.Admin(t, brokers)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		td, err := adm.ListTopics(ctx)
		if err != nil {
			t.Logf("list topics: %v", err)
			return
		}
		var names []string
		for _, n := range td.Names() {
			if strings.HasPrefix(n, prefix) {
				names = append(names, n)
			}
		}
		if len(names) > 0 {
			_, _ = adm.DeleteTopics(ctx, names...)
		}
	})
}

var sources = []string{"api-gateway", "batch-jobs"}

func newProducer(t *testing.T, brokers []string, prefix string) *producer.Producer {
	t.Helper()
	p, err := producer.New(producer.WithBrokers(brokers...), producer.WithTopic(prefix+"usage.events"),
		producer.WithMaxSkew(3*time.Hour), producer.WithLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// sendEvery sends event(0), event(1), ... through p, one every d, until
// ctx ends; a send that fails before then fails t and ends it.
func sendEvery(ctx context.Context, t *testing.T, p *producer.Producer, d time.Duration, event func(i int) producer.Event) {
	next := time.Now()
	for i := 0; ctx.Err() == nil; i++ {
		next = next.Add(d)
		time.Sleep(time.Until(next))
		e := event(i)
		if err := p.Send(ctx, e); err != nil && ctx.Err() == nil {
			t.Errorf("send %s: %v", e.EventID, err)
			return
		}
	}
}

// feed sends the events that make every series of the dashboard exist:
// first copies and duplicates (one conflicting) from two sources, events
// too old and in the future, undecodable bytes on usage.events (dedup
// rejects them) and on usage.deduped (the aggregator rejects them, the sink
// parks them).
func feed(t *testing.T, brokers []string, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := newProducer(t, brokers, prefix)
	defer p.Close()
	now := time.Now().UTC()
	send := func(e producer.Event) {
		t.Helper()
		if err := p.Send(ctx, e); err != nil {
			t.Fatalf("send %s: %v", e.EventID, err)
		}
	}
	for i := 0; i < 40; i++ {
		e := producer.Event{EventID: fmt.Sprintf("req-%d", i), CustomerID: fmt.Sprintf("cust-%d", i%3), Meter: "api_calls",
			Quantity: int64(1 + i%5), EventTime: now.Add(-time.Minute), Source: sources[i%2]}
		send(e)
		if i%4 == 0 {
			send(e) // an exact copy
		}
		if i%10 == 0 {
			e.Quantity += 100 // a conflicting copy
			send(e)
		}
	}
	send(producer.Event{EventID: "too-old", CustomerID: "cust-0", Meter: "api_calls", Quantity: 1, EventTime: now.Add(-40 * 24 * time.Hour), Source: sources[0]})
	send(producer.Event{EventID: "in-future", CustomerID: "cust-0", Meter: "api_calls", Quantity: 1, EventTime: now.Add(2 * time.Hour), Source: sources[1]})

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx,
		&kgo.Record{Topic: prefix + "usage.events", Key: []byte("garbage"), Value: []byte("not avro")},
		&kgo.Record{Topic: prefix + topics.DefaultNames().Deduped, Key: []byte("garbage"), Value: []byte("not avro either")},
		&kgo.Record{Topic: prefix + "usage.rejected", Key: []byte("garbage"), Value: []byte("not avro, and never parked again")},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// feedContinuously keeps every rate above zero while Prometheus scrapes: a
// first copy and a duplicate from each source every 300 ms.
func feedContinuously(ctx context.Context, t *testing.T, p *producer.Producer) {
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, src := range sources {
			e := producer.Event{EventID: fmt.Sprintf("live-%s-%d", src, i), CustomerID: fmt.Sprintf("cust-%d", i%3),
				Meter: "tokens", Quantity: int64(10 + i%7), EventTime: time.Now().UTC(), Source: src}
			for copies := 0; copies < 2; copies++ {
				if err := p.Send(ctx, e); err != nil {
					if ctx.Err() == nil {
						t.Errorf("live feed: %v", err)
					}
					return
				}
			}
		}
	}
}
