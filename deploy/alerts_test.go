package deploy

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// The alert rules (docs/operations.md, Alerts):
// deploy/prometheus/alerts.yml, with its promtool unit tests in
// deploy/prometheus/alerts_test.yml. The real test, TestRealAlertsFire, is
// in alerts_real_test.go.
const (
	alertsFile     = "prometheus/alerts.yml"
	alertsTestFile = "prometheus/alerts_test.yml"
	operationsDoc  = "docs/operations.md"
)

type alertRuleFile struct {
	Groups []struct {
		Name  string      `json:"name"`
		Rules []alertRule `json:"rules"`
	} `json:"groups"`
}

type alertRule struct {
	Alert       string            `json:"alert"`
	Record      string            `json:"record"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func loadAlertRules(t *testing.T) []alertRule {
	t.Helper()
	var f alertRuleFile
	readYAML(t, alertsFile, &f)
	var out []alertRule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatalf("%s: no rules", alertsFile)
	}
	return out
}

// The promtool unit test file, as far as the coverage check needs it.
type promtoolTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestAlertRules holds the rule file to what the rest of deploy/ and the
// docs promise: both Prometheus configs load it and docker-compose.yml
// mounts it beside the config; every rule is an alert with a severity, a
// summary, a description and a runbook that is a section of
// docs/operations.md; every metric it reads is one the code registers;
// the promtool unit tests make every rule fire and not fire; and the real
// test fires every one.
func TestAlertRules(t *testing.T) {
	rules := loadAlertRules(t)

	for _, cfg := range []string{"prometheus/prometheus.yml", "prometheus/local.yml"} {
		var pc struct {
			RuleFiles []string `json:"rule_files"`
		}
		readYAML(t, cfg, &pc)
		if !slices.Contains(pc.RuleFiles, "alerts.yml") {
			t.Errorf("%s: rule_files %v; want alerts.yml (beside it)", cfg, pc.RuleFiles)
		}
	}
	c := loadCompose(t)
	if !slices.Contains(c.Services["prometheus"].Volumes, "./deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro") {
		t.Errorf("docker-compose.yml: prometheus does not mount deploy/prometheus/alerts.yml beside its config (volumes %v)", c.Services["prometheus"].Volumes)
	}

	doc, err := os.ReadFile(filepath.Join(repoRoot, operationsDoc))
	if err != nil {
		t.Fatal(err)
	}
	anchors := markdownAnchors(string(doc))
	known := codeMetrics(t)
	known["process_start_time_seconds"] = true // client_golang's process collector (service.NewRegistry)
	names := map[string]bool{}
	for _, r := range rules {
		where := "rule " + r.Alert
		if r.Alert == "" {
			t.Errorf("%s: a recording rule (%s); this file holds alerts only", alertsFile, r.Record)
			continue
		}
		if names[r.Alert] {
			t.Errorf("%s: two rules named %s", alertsFile, r.Alert)
		}
		names[r.Alert] = true
		if !strings.HasPrefix(r.Alert, "Meterline") {
			t.Errorf("%s: name should start with Meterline", where)
		}
		if s := r.Labels["severity"]; s != "warning" && s != "critical" {
			t.Errorf("%s: severity %q; want warning or critical", where, s)
		}
		for _, a := range []string{"summary", "description", "runbook"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", where, a)
			}
		}
		if !strings.Contains(r.Annotations["description"], "Check:") {
			t.Errorf("%s: the description has no runbook line (\"Check: ...\")", where)
		}
		want := operationsDoc + "#" + strings.ToLower(r.Alert)
		if rb := r.Annotations["runbook"]; rb != want {
			t.Errorf("%s: runbook %q; want %q", where, rb, want)
		} else if !anchors[strings.ToLower(r.Alert)] {
			t.Errorf("%s: %s has no section %q (a heading \"### %s\")", where, operationsDoc, strings.ToLower(r.Alert), r.Alert)
		}
		for _, u := range unknownMetrics(known, where, r.Expr) {
			t.Errorf("metric not registered anywhere in the code: %s", u)
		}
		if !strings.Contains(r.Expr, "process_start_time_seconds") && regexp.MustCompile(`\bprocess_`).MatchString(r.Expr) {
			t.Errorf("%s: reads a process_ metric other than process_start_time_seconds", where)
		}
	}

	var pt promtoolTests
	readYAML(t, alertsTestFile, &pt)
	if !slices.Equal(pt.RuleFiles, []string{"alerts.yml"}) {
		t.Errorf("%s: rule_files %v; want [alerts.yml]", alertsTestFile, pt.RuleFiles)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range pt.Tests {
		for _, at := range tc.AlertRuleTest {
			if !names[at.Alertname] {
				t.Errorf("%s: tests %s, which %s does not have", alertsTestFile, at.Alertname, alertsFile)
			}
			if len(at.ExpAlerts) > 0 {
				fires[at.Alertname] = true
			} else {
				quiet[at.Alertname] = true
			}
		}
	}
	for n := range names {
		if !fires[n] {
			t.Errorf("%s: no promtool test where %s fires", alertsTestFile, n)
		}
		if !quiet[n] {
			t.Errorf("%s: no promtool test where %s does not fire", alertsTestFile, n)
		}
		if !slices.Contains(realFired(), n) {
			t.Errorf("no real test fires %s: TestRealAlertsFire (realAlertsFired), TestRealEntitlementsStalledAlert (realEntAlertsFired), TestRealIngestKeysStaleAlert (realKeysAlertsFired), TestRealKafkaOutageAlert and TestRealDuplicateInstanceAlert (realOutageAlertsFired), TestRealIngestKafkaFailingAlert (realIngestKafkaAlertsFired), TestRealStandbyFallingBehindAlert (realStandbyAlertsFired), TestRealStandbyTailRestartsAlert (realStandbyTailAlertsFired), TestRealSinkClickHouseDownAlert (realSinkCHAlertsFired), TestRealInputHeldByOpenTransactionAlert (realHeldAlertsFired), TestRealRestoreStuckOutOfRangeAlert (realRestoreOORAlertsFired), TestRealChangelogUnsafeAlert (realChangelogAlertsFired), TestRealBrokerClockAheadAlert (realClockAlertsFired), TestRealWatermarksIgnoredAlert (realWMIgnoredAlertsFired), TestRealWritesRefusedAlert and TestRealOffsetsWaitTooLongAlert (realWaitAlertsFired), TestRealConsumerLagUnknownAlert (realLagUnknownAlertsFired)", n)
		}
	}
	for n := range realScale {
		if !names[n] {
			t.Errorf("realScale scales %s, which %s does not have", n, alertsFile)
		}
	}
}

// markdownAnchors returns the anchors GitHub makes of a document's
// headings: lowercase, spaces to hyphens, punctuation dropped.
func markdownAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	for _, line := range strings.Split(doc, "\n") {
		h := strings.TrimLeft(line, "#")
		if h == line || !strings.HasPrefix(h, " ") {
			continue
		}
		a := strings.ToLower(strings.TrimSpace(h))
		a = drop.ReplaceAllString(a, "")
		out[strings.ReplaceAll(a, " ", "-")] = true
	}
	return out
}

// promtool returns Debian's promtool: beside the prometheus binary of
// METERLINE_TEST_PROMETHEUS (deploy/local/prometheus.sh install checks it
// is there), or on PATH. Without either it skips, saying so.
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(EnvPrometheus); p != "" {
		bin := filepath.Join(filepath.Dir(p), "promtool")
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("%s=%s but no promtool beside it: %v", EnvPrometheus, p, err)
		}
		return bin
	}
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Skipf("SKIP: real promtool check of the alert rules; set %s=/usr/bin/prometheus (deploy/local/prometheus.sh install prints it; make test does) or put promtool on PATH", EnvPrometheus)
	}
	return bin
}

// TestAlertRulesPromtool: promtool accepts the rule file and both
// Prometheus configs (which load it), and the unit tests of
// alerts_test.yml pass: every rule fires on its input series and stays
// quiet on the others, with every label and annotation as expected.
func TestAlertRulesPromtool(t *testing.T) {
	bin := promtool(t)
	run := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			return
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), strings.TrimSpace(string(out)))
	}
	run("check", "rules", alertsFile)
	run("test", "rules", alertsTestFile)
	// check config resolves rule_files relative to the config: it fails
	// if alerts.yml is not where the config says.
	run("check", "config", "prometheus/prometheus.yml")
	run("check", "config", "prometheus/local.yml")
}

// ruleScale shrinks an alert's numbers for a test that cannot wait
// minutes: each number token of the expression in Expr (a threshold, or a
// range such as 10m) becomes its value, at every occurrence, and For
// replaces the rule's `for` when set. Nothing else of the rule changes.
type ruleScale struct {
	Expr map[string]string
	For  string
}

// numberToken matches a number or a duration in PromQL.
var numberToken = regexp.MustCompile(`\b\d+(?:\.\d+)?(?:ms|s|m|h|d|w|y)?\b`)

// scaledRules returns the shipped rule file with the numbers of the rules
// in scale replaced (scaleRules), failing the test on an error.
func scaledRules(t *testing.T, scale map[string]ruleScale) []byte {
	t.Helper()
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	out, err := scaleRules(b, scale)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// scaleRules returns the rule file b with the numbers of the rules in
// scale replaced. It fails if a token to replace is not in the expression,
// if a rule to scale is missing, or if anything but number tokens would
// change.
func scaleRules(b []byte, scale map[string]ruleScale) ([]byte, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	done := map[string]bool{}
	groups, _ := doc["groups"].([]any)
	for _, g := range groups {
		gm, _ := g.(map[string]any)
		rules, _ := gm["rules"].([]any)
		for _, r := range rules {
			rule, _ := r.(map[string]any)
			name, _ := rule["alert"].(string)
			sc, ok := scale[name]
			if !ok {
				continue
			}
			done[name] = true
			expr, _ := rule["expr"].(string)
			used := map[string]bool{}
			scaled := numberToken.ReplaceAllStringFunc(expr, func(tok string) string {
				if v, ok := sc.Expr[tok]; ok {
					used[tok] = true
					return v
				}
				return tok
			})
			for tok, v := range sc.Expr {
				if !used[tok] {
					return nil, fmt.Errorf("scaling %s: %q is not a number in its expression %q", name, tok, expr)
				}
				if !numberToken.MatchString(v) || numberToken.FindString(v) != v {
					return nil, fmt.Errorf("scaling %s: %q -> %q is not a number", name, tok, v)
				}
			}
			if numberToken.ReplaceAllString(scaled, "N") != numberToken.ReplaceAllString(expr, "N") {
				return nil, fmt.Errorf("scaling %s changed more than numbers:\n%s\n%s", name, expr, scaled)
			}
			rule["expr"] = scaled
			if sc.For != "" {
				if _, ok := rule["for"]; !ok {
					return nil, fmt.Errorf("scaling %s: the rule has no `for` to scale", name)
				}
				rule["for"] = sc.For
			}
		}
	}
	for name := range scale {
		if !done[name] {
			return nil, fmt.Errorf("scaling %s: no such alert", name)
		}
	}
	return yaml.Marshal(doc)
}

// TestScaledRulesChangeOnlyNumbers: the scaling the real test applies
// keeps every rule's expression but for its numbers, and refuses a
// scaling that names a number the expression does not have.
func TestScaledRulesChangeOnlyNumbers(t *testing.T) {
	var scaled alertRuleFile
	if err := yaml.Unmarshal(scaledRules(t, realScale), &scaled); err != nil {
		t.Fatal(err)
	}
	orig := loadAlertRules(t)
	var got []alertRule
	for _, g := range scaled.Groups {
		got = append(got, g.Rules...)
	}
	if len(got) != len(orig) {
		t.Fatalf("%d rules after scaling, %d before", len(got), len(orig))
	}
	for i, o := range orig {
		g := got[i]
		if g.Alert != o.Alert || fmt.Sprint(g.Labels) != fmt.Sprint(o.Labels) || fmt.Sprint(g.Annotations) != fmt.Sprint(o.Annotations) {
			t.Errorf("rule %d: %s changed beyond expr and for", i, o.Alert)
		}
		if numberToken.ReplaceAllString(g.Expr, "N") != numberToken.ReplaceAllString(o.Expr, "N") {
			t.Errorf("%s: expression changed beyond its numbers:\n%s\n%s", o.Alert, o.Expr, g.Expr)
		}
		sc, scaledRule := realScale[o.Alert]
		if !scaledRule && (g.Expr != o.Expr || g.For != o.For) {
			t.Errorf("%s is not scaled but changed", o.Alert)
		}
		if scaledRule && sc.For != "" && g.For != sc.For {
			t.Errorf("%s: for %q, want %q", o.Alert, g.For, sc.For)
		}
	}
	// A scaling that does not match must fail, not silently do nothing.
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []map[string]ruleScale{
		{"MeterlineFinalOverdue": {Expr: map[string]string{"1799": "1"}}},
		{"MeterlineFinalOverdue": {Expr: map[string]string{"1800": "x"}}},
		{"MeterlineNoSuchAlert": {For: "1s"}},
		{"MeterlineForgedHeaders": {For: "1s"}}, // has no for
	} {
		if _, err := scaleRules(b, bad); err == nil {
			t.Errorf("scaling %v did not fail", bad)
		}
	}
}

// activeAlert is an alert as /api/v1/alerts lists it.
type activeAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"` // pending or firing
	Value       string            `json:"value"`
}

func (a activeAlert) String() string {
	var ls []string
	for k, v := range a.Labels {
		if k != "alertname" && k != "severity" && k != "job" {
			ls = append(ls, k+"="+v)
		}
	}
	sort.Strings(ls)
	return fmt.Sprintf("%s{%s} %s (value %s)", a.Labels["alertname"], strings.Join(ls, ","), a.State, a.Value)
}

func (p promClient) alerts() ([]activeAlert, error) {
	var data struct {
		Alerts []activeAlert `json:"alerts"`
	}
	err := p.get("/api/v1/alerts", url.Values{}, &data)
	return data.Alerts, err
}
