package docscheck

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"
)

// recordingRegistry is a registry that also keeps the name and label
// names of every metric registered on it, whether or not it has series
// yet: a vector labelled by a tenant or a partition exports nothing
// before its first series, yet a rule may name it.
type recordingRegistry struct {
	*prometheus.Registry
	descs map[string][]string // metric name -> its label names
}

var (
	descName   = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)
	descConst  = regexp.MustCompile(`constLabels: \{(.*)\}, variableLabels: \{([^}]*)\}\}$`)
	constLabel = regexp.MustCompile(`(\w+)="`)
)

// newRecordingRegistry wraps reg, recording what reg already exports.
func newRecordingRegistry(t *testing.T, reg *prometheus.Registry) *recordingRegistry {
	t.Helper()
	r := &recordingRegistry{Registry: reg, descs: map[string][]string{}}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		var labels []string
		if ms := mf.GetMetric(); len(ms) > 0 {
			for _, lp := range ms[0].GetLabel() {
				labels = append(labels, lp.GetName())
			}
		}
		r.descs[mf.GetName()] = labels
	}
	return r
}

// Register registers c and records its metrics' names and label names.
func (r *recordingRegistry) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		s := d.String()
		n, l := descName.FindStringSubmatch(s), descConst.FindStringSubmatch(s)
		if n == nil || l == nil {
			continue
		}
		var labels []string
		for _, m := range constLabel.FindAllStringSubmatch(l[1], -1) {
			labels = append(labels, m[1])
		}
		for _, v := range strings.Split(l[2], ",") {
			if v = strings.TrimSuffix(strings.TrimPrefix(v, "c("), ")"); v != "" {
				labels = append(labels, v)
			}
		}
		r.descs[n[1]] = labels
	}
	return nil
}

// MustRegister registers cs, panicking on an error.
func (r *recordingRegistry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// family is what the stages export of one metric: its label names, and
// the values each label has in the series present at start.
type family struct {
	labels []string
	values map[string][]string
}

// exportedFamilies merges every registry's metrics, with the collectors
// registered before the test's recording (service.NewRegistry's) read
// from their series, and up and job/instance, which Prometheus adds.
func exportedFamilies(t *testing.T, regs map[string]*recordingRegistry) map[string]*family {
	t.Helper()
	out := map[string]*family{"up": {values: map[string][]string{}}}
	for _, reg := range regs {
		for n, l := range reg.descs {
			f := out[n]
			if f == nil {
				f = &family{values: map[string][]string{}}
				out[n] = f
			}
			for _, x := range l {
				if !slices.Contains(f.labels, x) {
					f.labels = append(f.labels, x)
				}
			}
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			f := out[mf.GetName()]
			if f == nil {
				f = &family{values: map[string][]string{}}
				out[mf.GetName()] = f
			}
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if !slices.Contains(f.labels, lp.GetName()) {
						f.labels = append(f.labels, lp.GetName())
					}
					if !slices.Contains(f.values[lp.GetName()], lp.GetValue()) {
						f.values[lp.GetName()] = append(f.values[lp.GetName()], lp.GetValue())
					}
				}
			}
		}
	}
	return out
}

// targetLabels are the labels Prometheus gives every series of a target.
var targetLabels = []string{"job", "instance"}

var (
	selectorRef = regexp.MustCompile(`\b((?:meterline|process)_[a-z0-9_]+|up)\b(\{[^}]*\})?`)
	matcherRef  = regexp.MustCompile(`(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	groupingRef = regexp.MustCompile(`\b(?:by|on|without|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	replaceRef  = regexp.MustCompile(`label_replace\(`)
)

// ruleProblems returns what in expr names a metric, a label or a label
// value the stages do not export: such a rule never fires. A value is
// checked when the stages export the label's values from their start
// (the reasons, stages, topics, kinds, outcomes); a label whose values come
// from the data (a partition, a tenant) is checked by name only.
func ruleProblems(fams map[string]*family, expr string) []string {
	var out []string
	labelsInExpr := slices.Clone(targetLabels)
	valuesInExpr := map[string][]string{}
	for _, m := range selectorRef.FindAllStringSubmatch(expr, -1) {
		name, sel := m[1], m[2]
		base := name
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suf); ok && fams[b] != nil {
				base = b
			}
		}
		f := fams[base]
		if f == nil {
			out = append(out, "metric "+name+" is exported by no stage")
			continue
		}
		labelsInExpr = append(labelsInExpr, f.labels...)
		for l, v := range f.values {
			valuesInExpr[l] = append(valuesInExpr[l], v...)
		}
		for _, mm := range matcherRef.FindAllStringSubmatch(sel, -1) {
			label, op, val := mm[1], mm[2], mm[3]
			if slices.Contains(targetLabels, label) {
				continue
			}
			if !slices.Contains(f.labels, label) {
				out = append(out, name+" has no label "+label+" (it has "+strings.Join(f.labels, ", ")+")")
				continue
			}
			if p := valueProblem(f.values[label], op, val); p != "" {
				out = append(out, name+"{"+label+op+`"`+val+`"}: `+p)
			}
		}
	}
	for _, m := range replaceRef.FindAllStringIndex(expr, -1) {
		args := callArgs(expr[m[1]:])
		if len(args) != 5 {
			out = append(out, "label_replace without its five arguments")
			continue
		}
		dst, src, re := unquote(args[1]), unquote(args[3]), unquote(args[4])
		labelsInExpr = append(labelsInExpr, dst)
		if src == "" {
			continue
		}
		if !slices.Contains(labelsInExpr, src) {
			out = append(out, "label_replace reads label "+src+", which no metric of the rule has")
		} else if p := valueProblem(valuesInExpr[src], "=~", re); p != "" {
			out = append(out, `label_replace's source `+src+`=~"`+re+`": `+p)
		}
	}
	for _, m := range groupingRef.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !slices.Contains(labelsInExpr, l) {
				out = append(out, "groups or matches by "+l+", which no metric of the rule has")
			}
		}
	}
	return out
}

// callArgs splits the arguments of a call whose opening parenthesis
// precedes s at the commas outside parentheses, brackets, braces and
// strings, up to its closing parenthesis.
func callArgs(s string) []string {
	var args []string
	depth, start, quoted := 0, 0, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ',' && depth == 0:
			args, start = append(args, strings.TrimSpace(s[start:i])), i+1
		case c == ')' && depth == 0:
			return append(args, strings.TrimSpace(s[start:i]))
		case c == ')' || c == ']' || c == '}':
			depth--
		}
	}
	return nil
}

// unquote returns a string literal's content.
func unquote(s string) string { return strings.TrimSuffix(strings.TrimPrefix(s, `"`), `"`) }

// valueProblem says why a matcher `label op val` cannot select what it
// means among the label's values exported at start, or "" when it can or
// when no value is known from the start. A negative matcher must name
// values that exist too: one misspelled would let through what it is
// meant to leave out.
func valueProblem(values []string, op, val string) string {
	if len(values) == 0 {
		return ""
	}
	values = slices.Compact(slices.Sorted(slices.Values(values)))
	known := " (exported: " + strings.Join(values, ", ") + ")"
	switch op {
	case "=", "!=":
		if !slices.Contains(values, val) {
			return "no series has this value" + known
		}
	case "=~", "!~":
		for _, alt := range strings.Split(val, "|") {
			re, err := regexp.Compile("^(?:" + alt + ")$")
			if err != nil {
				return err.Error()
			}
			if !slices.ContainsFunc(values, re.MatchString) {
				return `"` + alt + `" matches no value` + known
			}
		}
	}
	return ""
}

// TestAlertRulesMatchTheStagesMetrics: every metric, label and label value
// that an alert rule of deploy/prometheus/alerts.yml selects, groups by or
// relabels is one the stages export from their start (docs/operations.md,
// Alerts): a rule on a misspelled metric, label or value selects nothing
// and never fires, and promtool, whose tests give the series by hand,
// cannot tell.
func TestAlertRulesMatchTheStagesMetrics(t *testing.T) {
	regs, _ := startedStages(t)
	fams := exportedFamilies(t, regs)
	for _, r := range alertRules(t) {
		for _, p := range ruleProblems(fams, r.Expr) {
			t.Errorf("%s: %s", r.Alert, p)
		}
	}
}

// alertRule is a rule of deploy/prometheus/alerts.yml.
type alertRule struct {
	Alert  string            `json:"alert"`
	Expr   string            `json:"expr"`
	Labels map[string]string `json:"labels"`
}

// alertRules reads the rules of deploy/prometheus/alerts.yml.
func alertRules(t *testing.T) []alertRule {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var rf struct {
		Groups []struct {
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatal(err)
	}
	var out []alertRule
	for _, g := range rf.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) < 10 {
		t.Fatalf("read %d rules from deploy/prometheus/alerts.yml", len(out))
	}
	return out
}

// alertRow is a row of the table of docs/operations.md, Alerts:
// "| `MeterlineStageDown` | fires when ... | critical |".
var alertRow = regexp.MustCompile("^\\| `(Meterline[A-Za-z]+)` \\| .* \\| ([a-z]+) \\|$")

// TestAlertsTableMatchesRules: the table of docs/operations.md, Alerts,
// has a row for every rule of deploy/prometheus/alerts.yml, with its
// severity label, and none for an alert no rule defines: an on-call
// engineer decides from it whether to page.
func TestAlertsTableMatchesRules(t *testing.T) {
	_, files, _ := docs(t)
	severity := map[string]string{}
	for _, r := range alertRules(t) {
		severity[r.Alert] = r.Labels["severity"]
	}
	rows := map[string]string{}
	for _, l := range section(t, files, "docs/operations.md", "Alerts") {
		if m := alertRow.FindStringSubmatch(l); m != nil {
			rows[m[1]] = m[2]
		}
	}
	for alert, sev := range severity {
		switch got, ok := rows[alert]; {
		case !ok:
			t.Errorf("docs/operations.md, Alerts: no row of %s", alert)
		case got != sev:
			t.Errorf("docs/operations.md, Alerts: %s is %s in the table, %s in alerts.yml", alert, got, sev)
		}
	}
	for alert := range rows {
		if _, ok := severity[alert]; !ok {
			t.Errorf("docs/operations.md, Alerts: a row of %s, which no rule of alerts.yml defines", alert)
		}
	}
}
