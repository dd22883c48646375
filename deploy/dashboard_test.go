package deploy

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const dashboardFile = "grafana/dashboards/meterline.json"

type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []dashVar `json:"list"`
	} `json:"templating"`
	Panels []dashPanel `json:"panels"`
}

type dashVar struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Query      any    `json:"query"` // a string, or {"query": "..."}
	Multi      bool   `json:"multi"`
	IncludeAll bool   `json:"includeAll"`
	Current    struct {
		Value any `json:"value"`
	} `json:"current"`
}

type dashDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type dashPanel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource *dashDatasource `json:"datasource"`
	Targets    []dashTarget    `json:"targets"`
	Panels     []dashPanel     `json:"panels"` // a collapsed row's panels
}

type dashTarget struct {
	RefID        string          `json:"refId"`
	Expr         string          `json:"expr"`
	LegendFormat string          `json:"legendFormat"`
	Datasource   *dashDatasource `json:"datasource"`
	Hide         bool            `json:"hide"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// query returns a query variable's PromQL (label_values(...)).
func (v dashVar) query() string {
	switch q := v.Query.(type) {
	case string:
		return q
	case map[string]any:
		s, _ := q["query"].(string)
		return s
	}
	return ""
}

func (d dashboard) datasourceDefault() string {
	for _, v := range d.Templating.List {
		if v.Type == "datasource" {
			s, _ := v.Current.Value.(string)
			return s
		}
	}
	return ""
}

// panels returns every panel that shows data (rows left out, collapsed
// rows' panels included).
func (d dashboard) panels() []dashPanel {
	var out []dashPanel
	for _, p := range d.Panels {
		if p.Type == "row" {
			out = append(out, p.Panels...)
			continue
		}
		out = append(out, p)
	}
	return out
}

// exprTarget is one PromQL expression of the dashboard and where it is.
type exprTarget struct {
	where  string // panel title / refId
	expr   string
	legend string
}

func (d dashboard) targets() []exprTarget {
	var out []exprTarget
	for _, p := range d.panels() {
		for _, t := range p.Targets {
			if t.Hide {
				continue
			}
			out = append(out, exprTarget{where: fmt.Sprintf("%q/%s", p.Title, t.RefID), expr: t.Expr, legend: t.LegendFormat})
		}
	}
	return out
}

var (
	// $name, ${name}, ${name:format}, [[name]]
	varRef       = regexp.MustCompile(`\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)\]\]`)
	grafanaVars  = map[string]bool{"__rate_interval": true, "__interval": true, "__interval_ms": true, "__range": true, "__range_s": true}
	metricRef    = regexp.MustCompile(`\b(meterline_[a-z0-9_]+|up)\b`)
	codeMetric   = regexp.MustCompile(`"(meterline_[a-z0-9_]+)"`)
	legendLabels = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)
)

func refName(m []string) string {
	for _, s := range m[1:] {
		if s != "" {
			return s
		}
	}
	return ""
}

func TestDashboardIsValid(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard needs a uid and a title (uid %q, title %q)", d.UID, d.Title)
	}
	vars := map[string]dashVar{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
		if v.Type == "query" && !strings.HasPrefix(v.query(), "label_values(") {
			t.Errorf("variable %s: query %q; want label_values(...)", v.Name, v.query())
		}
	}
	if _, ok := vars["datasource"]; !ok {
		t.Error("no datasource variable")
	}
	ids := map[int]string{}
	for _, p := range d.Panels {
		if prev, ok := ids[p.ID]; ok {
			t.Errorf("panel id %d used by %q and %q", p.ID, prev, p.Title)
		}
		ids[p.ID] = p.Title
	}
	panels := d.panels()
	if len(panels) < 8 {
		t.Errorf("%d panels; the issue asks for at least lag, throughput, duplicate rate, rejections, transaction latency, restore, state size and sink latency", len(panels))
	}
	for _, p := range panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no targets", p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v; want the ${datasource} variable", p.Title, p.Datasource)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q/%s: empty expression", p.Title, tg.RefID)
			}
			if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q/%s: datasource %+v; want the ${datasource} variable", p.Title, tg.RefID, tg.Datasource)
			}
		}
	}
	// The titles the issue names.
	titles := ""
	for _, p := range panels {
		titles += strings.ToLower(p.Title) + "\n"
	}
	for _, want := range []string{"lag", "records in", "duplicate rate", "rejections", "transaction latency", "restore", "state size", "insert latency",
		"ingest requests by status", "ingest request latency", "ingest events"} {
		if !strings.Contains(titles, want) {
			t.Errorf("no panel about %q", want)
		}
	}
	// The HTTP ingest's panels are under a row of their own.
	row := ""
	for _, p := range d.Panels {
		switch {
		case p.Type == "row":
			row = p.Title
		case strings.HasPrefix(strings.ToLower(p.Title), "ingest ") && row != "HTTP ingest":
			t.Errorf("panel %q is under row %q; want HTTP ingest", p.Title, row)
		}
	}
	// Every variable an expression uses is defined.
	check := func(where, expr string) {
		for _, m := range varRef.FindAllStringSubmatch(expr, -1) {
			n := refName(m)
			if _, ok := vars[n]; !ok && !grafanaVars[n] {
				t.Errorf("%s: uses $%s, which the dashboard does not define", where, n)
			}
		}
	}
	for _, tg := range d.targets() {
		check(tg.where, tg.expr)
	}
	for _, v := range d.Templating.List {
		check("variable "+v.Name, v.query())
	}
}

// TestDashboardMetricsExist is the fast half of the Prometheus test: every
// metric name in the dashboard is one the code registers. The real test
// (TestRealDashboardQueriesReturnData) also catches wrong labels.
func TestDashboardMetricsExist(t *testing.T) {
	known := codeMetrics(t)
	d := loadDashboard(t)
	exprs := d.targets()
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			exprs = append(exprs, exprTarget{where: "variable " + v.Name, expr: v.query()})
		}
	}
	var unknown []string
	for _, tg := range exprs {
		unknown = append(unknown, unknownMetrics(known, tg.where, tg.expr)...)
	}
	sort.Strings(unknown)
	for _, u := range unknown {
		t.Errorf("metric not registered anywhere in the code: %s", u)
	}
}

// codeMetrics returns the meterline_ metric names the code (not its tests)
// spells out, and up.
func codeMetrics(t *testing.T) map[string]bool {
	t.Helper()
	known := map[string]bool{"up": true}
	err := filepath.WalkDir(repoRoot, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && (strings.HasPrefix(e.Name(), ".") && path != repoRoot || e.Name() == "testdata") {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range codeMetric.FindAllStringSubmatch(string(b), -1) {
			known[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return known
}

// unknownMetrics returns "where: name" for each metric expr names that is
// not in known (a histogram's _bucket, _sum and _count count as its name).
func unknownMetrics(known map[string]bool, where, expr string) []string {
	var unknown []string
	for _, m := range metricRef.FindAllString(expr, -1) {
		base := m
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(m, suf); ok && known[b] {
				base = b
			}
		}
		if !known[base] {
			unknown = append(unknown, fmt.Sprintf("%s: %s", where, m))
		}
	}
	return unknown
}
