package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/meterline/meterline/internal/cli"
	"github.com/meterline/meterline/internal/testenv"
)

// There is no Docker engine on the machines that run the tests, so these
// tests read docker-compose.yml, the Dockerfile and the Prometheus and
// Grafana files as data and hold them to the code: every meterline command
// line goes through the real flag parser.

const repoRoot = ".."

type composeFile struct {
	Services map[string]composeService `json:"services"`
	Volumes  map[string]any            `json:"volumes"`
}

type composeService struct {
	Image       string                       `json:"image"`
	Build       *composeBuild                `json:"build"`
	Entrypoint  any                          `json:"entrypoint"`
	Command     any                          `json:"command"`
	Environment map[string]any               `json:"environment"`
	Ports       []string                     `json:"ports"`
	Volumes     []string                     `json:"volumes"`
	Healthcheck *composeHealthcheck          `json:"healthcheck"`
	DependsOn   map[string]composeDependency `json:"depends_on"`
	Restart     string                       `json:"restart"`
}

type composeBuild struct {
	Context    string `json:"context"`
	Dockerfile string `json:"dockerfile"`
}

type composeHealthcheck struct {
	Test     []string `json:"test"`
	Interval string   `json:"interval"`
	Timeout  string   `json:"timeout"`
	Retries  int      `json:"retries"`
}

type composeDependency struct {
	Condition string `json:"condition"`
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	var c composeFile
	readYAML(t, filepath.Join(repoRoot, "docker-compose.yml"), &c)
	if len(c.Services) == 0 {
		t.Fatal("docker-compose.yml: no services")
	}
	return c
}

// The meterline services and what each must be.
var meterlineServices = map[string]struct {
	command string // first word of the meterline command line
	oneShot bool
	deps    []string // services it must wait for
}{
	"topics":    {command: "topics", oneShot: true, deps: []string{"kafka"}},
	"migrate":   {command: "migrate", oneShot: true, deps: []string{"clickhouse"}},
	"dedup-key": {command: "dedup-key", oneShot: true},
	"dedup":     {command: "dedup", deps: []string{"kafka", "topics", "dedup-key"}},
	"aggregate": {command: "aggregate", deps: []string{"kafka", "topics"}},
	"sink":      {command: "sink", deps: []string{"kafka", "clickhouse", "topics", "migrate"}},
}

// Images of the other services: repository, and a pinned tag.
var thirdPartyImages = map[string]string{
	"kafka":      "apache/kafka",
	"clickhouse": "clickhouse/clickhouse-server",
	"prometheus": "prom/prometheus",
	"grafana":    "grafana/grafana",
}

func TestComposeServices(t *testing.T) {
	c := loadCompose(t)
	var want []string
	for s := range meterlineServices {
		want = append(want, s)
	}
	for s := range thirdPartyImages {
		want = append(want, s)
	}
	for _, s := range want {
		if _, ok := c.Services[s]; !ok {
			t.Errorf("service %q missing", s)
		}
	}
	for name, svc := range c.Services {
		if _, ok := meterlineServices[name]; ok {
			continue
		}
		repo, ok := thirdPartyImages[name]
		if !ok {
			t.Errorf("service %q is not one the test knows; add it to the test", name)
			continue
		}
		r, tag, _ := strings.Cut(svc.Image, ":")
		if r != repo || tag == "" || tag == "latest" {
			t.Errorf("%s: image %q; want %s:<pinned version>", name, svc.Image, repo)
		}
		if svc.Build != nil {
			t.Errorf("%s: an official image is not built here", name)
		}
	}
	// The compose broker is the version the tests run against.
	if k, ok := c.Services["kafka"]; ok {
		pom, err := os.ReadFile(filepath.Join(repoRoot, "deploy/local/kafka/pom.xml"))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`<kafka.version>([^<]+)</kafka.version>`).FindSubmatch(pom)
		if m == nil {
			t.Fatal("deploy/local/kafka/pom.xml: no <kafka.version>")
		}
		if want := "apache/kafka:" + string(m[1]); k.Image != want {
			t.Errorf("kafka image %q; the tests run Kafka %s (deploy/local/kafka/pom.xml): want %s", k.Image, m[1], want)
		}
		env := stringEnv(k.Environment)
		if !strings.Contains(env["KAFKA_PROCESS_ROLES"], "controller") || env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "" {
			t.Errorf("kafka: not a KRaft combined broker/controller: roles %q voters %q",
				env["KAFKA_PROCESS_ROLES"], env["KAFKA_CONTROLLER_QUORUM_VOTERS"])
		}
		// Exactly-once needs the transaction log on a single broker.
		for _, k := range []string{"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"} {
			if env[k] != "1" {
				t.Errorf("kafka: %s = %q; a single broker needs 1", k, env[k])
			}
		}
	}
}

func stringEnv(m map[string]any) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		switch v := v.(type) {
		case string:
			out[k] = v
		case nil:
			out[k] = ""
		default:
			out[k] = fmt.Sprint(v)
		}
	}
	return out
}

func commandList(t *testing.T, name string, v any) []string {
	t.Helper()
	list, ok := v.([]any)
	if !ok {
		t.Fatalf("%s: command %v must be a list (exec form), so that no shell splits it", name, v)
	}
	var out []string
	for _, a := range list {
		s, ok := a.(string)
		if !ok {
			t.Fatalf("%s: command element %v is not a string", name, a)
		}
		out = append(out, s)
	}
	return out
}

func TestComposeHealthAndDependencies(t *testing.T) {
	c := loadCompose(t)
	conditions := []string{"service_started", "service_healthy", "service_completed_successfully"}
	for name, svc := range c.Services {
		one := meterlineServices[name].oneShot
		switch {
		case one && svc.Restart != "no":
			t.Errorf("%s: a one-shot init service needs restart: \"no\", has %q", name, svc.Restart)
		case !one && svc.Healthcheck == nil:
			t.Errorf("%s: no healthcheck", name)
		case !one && (len(svc.Healthcheck.Test) < 2 || (svc.Healthcheck.Test[0] != "CMD" && svc.Healthcheck.Test[0] != "CMD-SHELL")):
			t.Errorf("%s: healthcheck test %q; want [CMD ...] or [CMD-SHELL ...]", name, svc.Healthcheck.Test)
		}
		for dep, d := range svc.DependsOn {
			target, ok := c.Services[dep]
			if !ok {
				t.Errorf("%s: depends_on %q, which is not a service", name, dep)
				continue
			}
			if !slices.Contains(conditions, d.Condition) {
				t.Errorf("%s: depends_on %s: condition %q; want one of %v", name, dep, d.Condition, conditions)
			}
			if d.Condition == "service_healthy" && target.Healthcheck == nil {
				t.Errorf("%s: waits for %s to be healthy, but %s has no healthcheck", name, dep, dep)
			}
			if d.Condition == "service_completed_successfully" && target.Restart != "no" {
				t.Errorf("%s: waits for %s to complete, but %s is not a one-shot (restart %q)", name, dep, dep, target.Restart)
			}
		}
		for _, dep := range meterlineServices[name].deps {
			d, ok := svc.DependsOn[dep]
			want := "service_healthy"
			if meterlineServices[dep].oneShot {
				want = "service_completed_successfully"
			}
			if !ok || d.Condition != want {
				t.Errorf("%s: must depend on %s with condition %s (has %+v)", name, dep, want, svc.DependsOn)
			}
		}
	}
	if _, ok := c.Services["grafana"].DependsOn["prometheus"]; !ok {
		t.Error("grafana: must depend on prometheus")
	}
	for _, s := range []string{"dedup", "aggregate", "sink"} {
		if _, ok := c.Services["prometheus"].DependsOn[s]; !ok {
			t.Errorf("prometheus: must depend on %s, which it scrapes", s)
		}
	}
	// No cycles: compose refuses them.
	var visit func(string, []string)
	visit = func(n string, path []string) {
		if slices.Contains(path, n) {
			t.Errorf("depends_on cycle: %s", strings.Join(append(path, n), " → "))
			return
		}
		for dep := range c.Services[n].DependsOn {
			visit(dep, append(path, n))
		}
	}
	for n := range c.Services {
		visit(n, nil)
	}
}

func TestComposePortsAndVolumes(t *testing.T) {
	c := loadCompose(t)
	hostPorts := map[string]string{}
	for name, svc := range c.Services {
		for _, p := range svc.Ports {
			parts := strings.Split(p, ":")
			if len(parts) < 2 {
				t.Errorf("%s: port %q: publish as host:container", name, p)
				continue
			}
			host := parts[len(parts)-2]
			if other, ok := hostPorts[host]; ok {
				t.Errorf("host port %s published by both %s and %s", host, other, name)
			}
			hostPorts[host] = name
		}
		for _, v := range svc.Volumes {
			src, _, ok := strings.Cut(v, ":")
			if !ok {
				t.Errorf("%s: volume %q: want source:target", name, v)
				continue
			}
			if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
				if _, err := os.Stat(filepath.Join(repoRoot, src)); err != nil {
					t.Errorf("%s: bind mount source %s: %v", name, src, err)
				}
				continue
			}
			if _, ok := c.Volumes[src]; !ok {
				t.Errorf("%s: named volume %q is not declared under volumes:", name, src)
			}
		}
	}
	for svc, port := range map[string]string{"kafka": "9092", "clickhouse": "9000", "prometheus": "9090", "grafana": "3000"} {
		if hostPorts[port] != svc {
			t.Errorf("%s: want host port %s published (have %v)", svc, port, c.Services[svc].Ports)
		}
	}
	// Pebble state survives a container's re-creation.
	for _, s := range []string{"dedup", "aggregate"} {
		env := stringEnv(c.Services[s].Environment)
		dir := env["METERLINE_STATE_DIR"]
		found := false
		for _, v := range c.Services[s].Volumes {
			parts := strings.Split(v, ":")
			if len(parts) >= 2 && parts[1] == dir && !strings.HasPrefix(parts[0], ".") {
				found = true
			}
		}
		if dir == "" || !found {
			t.Errorf("%s: the Pebble state dir (METERLINE_STATE_DIR %q) must be a named volume (volumes %v)", s, dir, c.Services[s].Volumes)
		}
	}
}

// dockerfile is what the test needs of the Dockerfile.
type dockerfile struct {
	goImage    string // FROM of the build stage
	buildOut   string // -o of the go build of ./cmd/meterline
	copiedTo   string // where the runtime stage puts it
	entrypoint []string
}

func parseDockerfile(t *testing.T) dockerfile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	var d dockerfile
	stage := 0
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, rest, _ := strings.Cut(line, " ")
		switch strings.ToUpper(instr) {
		case "FROM":
			stage++
			if stage == 1 {
				d.goImage = strings.Fields(rest)[0]
			}
		case "RUN":
			if m := regexp.MustCompile(`go build .*-o (\S+) \./cmd/meterline\b`).FindStringSubmatch(rest); m != nil {
				d.buildOut = m[1]
			}
		case "COPY":
			f := strings.Fields(rest)
			if len(f) == 3 && strings.HasPrefix(f[0], "--from=") && f[1] == d.buildOut {
				d.copiedTo = f[2]
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &d.entrypoint); err != nil {
				t.Fatalf("Dockerfile: ENTRYPOINT %s: want exec form: %v", rest, err)
			}
		}
	}
	if stage < 2 {
		t.Errorf("Dockerfile: %d stages; want a Go build stage and a small runtime stage", stage)
	}
	return d
}

func TestDockerfileBuildsTheBinary(t *testing.T) {
	d := parseDockerfile(t)
	if d.buildOut == "" {
		t.Fatal("Dockerfile: no `go build ... -o <path> ./cmd/meterline`")
	}
	if d.copiedTo == "" {
		t.Fatalf("Dockerfile: the runtime stage does not COPY --from the build stage's %s", d.buildOut)
	}
	if len(d.entrypoint) == 0 || d.entrypoint[0] != d.copiedTo {
		t.Errorf("Dockerfile: ENTRYPOINT %q; want the binary %s", d.entrypoint, d.copiedTo)
	}
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod: no go directive")
	}
	if !strings.HasPrefix(d.goImage, "golang:"+string(m[1])) {
		t.Errorf("Dockerfile: build stage FROM %s; go.mod needs Go %s", d.goImage, m[1])
	}
	c := loadCompose(t)
	for name := range meterlineServices {
		svc := c.Services[name]
		if svc.Build == nil || filepath.Clean(svc.Build.Context) != "." || (svc.Build.Dockerfile != "" && svc.Build.Dockerfile != "Dockerfile") {
			t.Errorf("%s: must be built from the repository's Dockerfile (build %+v)", name, svc.Build)
		}
		if svc.Image != c.Services["dedup"].Image {
			t.Errorf("%s: image %q; every meterline service shares one image (%q)", name, svc.Image, c.Services["dedup"].Image)
		}
		if svc.Entrypoint != nil {
			t.Errorf("%s: overrides the entrypoint (%v); the command must go to the meterline binary", name, svc.Entrypoint)
		}
	}
	ignore, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(ignore), "\n") {
		l = strings.TrimSpace(l)
		for _, needed := range []string{"go.mod", "go.sum", "cmd", "internal", "schemas", "."} {
			if l == needed || l == "/"+needed || l == "*" {
				t.Errorf(".dockerignore: %q excludes %s, which the build needs", l, needed)
			}
		}
	}
}

// parsedCommand is a meterline command line as the real parser read it.
type parsedCommand struct {
	command string            // "dedup", "topics create"
	flags   map[string]string // every flag's effective value, by name
	envs    map[string]bool   // every METERLINE_* variable a flag of it reads
}

// parseMeterline parses args with env set as the process environment (and
// no other METERLINE_* variable), with the real meterline flag parser.
func parseMeterline(t *testing.T, args []string, env map[string]string) (parsedCommand, error) {
	t.Helper()
	testenv.ClearMeterlineEnv(t)
	for k, v := range env {
		t.Setenv(k, v)
	}
	var root cli.CLI
	var out bytes.Buffer
	exited := false
	parser, err := cli.Parser(&root, cli.IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out}, func(int) { exited = true })
	if err != nil {
		t.Fatal(err)
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		return parsedCommand{}, err
	}
	if exited {
		return parsedCommand{}, fmt.Errorf("parser exited: %s", out.String())
	}
	pc := parsedCommand{command: kctx.Command(), flags: map[string]string{}, envs: map[string]bool{}}
	for _, f := range kctx.Flags() {
		pc.flags[f.Name] = fmt.Sprint(kctx.FlagValue(f))
		for _, e := range f.Envs {
			pc.envs[e] = true
		}
	}
	return pc, nil
}

// composeCommands parses every meterline service's command line and
// environment.
func composeCommands(t *testing.T, c composeFile) map[string]parsedCommand {
	t.Helper()
	out := map[string]parsedCommand{}
	names := make([]string, 0, len(meterlineServices))
	for n := range meterlineServices {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		svc := c.Services[name]
		args := commandList(t, name, svc.Command)
		env := stringEnv(svc.Environment)
		pc, err := parseMeterline(t, args, env)
		if err != nil {
			t.Errorf("%s: meterline %s: %v", name, strings.Join(args, " "), err)
			continue
		}
		if first, _, _ := strings.Cut(pc.command, " "); first != meterlineServices[name].command {
			t.Errorf("%s: runs `meterline %s`; want `meterline %s`", name, pc.command, meterlineServices[name].command)
		}
		for k := range env {
			if strings.HasPrefix(k, "METERLINE_") && !pc.envs[k] {
				t.Errorf("%s: environment %s is read by no flag of `meterline %s` (misspelt, or a flag of another command)", name, k, pc.command)
			}
		}
		out[name] = pc
	}
	return out
}

func TestComposeCommandsParse(t *testing.T) {
	c := loadCompose(t)
	cmds := composeCommands(t, c)
	for name, pc := range cmds {
		if name == "topics" || name == "migrate" || name == "dedup-key" {
			continue
		}
		if pc.flags["instance-id"] == "" {
			t.Errorf("%s: no --instance-id: the container's host name changes when it is re-created, and the transactional ID with it", name)
		}
		if b := pc.flags["brokers"]; !strings.Contains(b, "kafka:") {
			t.Errorf("%s: brokers %q; want the kafka service", name, b)
		}
	}
	if pc, ok := cmds["dedup"]; ok && pc.flags["dedup-keys-file"] != cmds["dedup-key"].flags["out"] {
		t.Errorf("dedup reads its keys from %q, dedup-key writes them to %q", pc.flags["dedup-keys-file"], cmds["dedup-key"].flags["out"])
	}
	if pc, ok := cmds["topics"]; ok && pc.command != "topics create" {
		t.Errorf("topics: runs `meterline %s`; want `meterline topics create`", pc.command)
	}
	if pc, ok := cmds["sink"]; ok {
		if !strings.HasPrefix(pc.flags["clickhouse"], "clickhouse:") {
			t.Errorf("sink: --clickhouse %q; want the clickhouse service", pc.flags["clickhouse"])
		}
		if m := cmds["migrate"]; m.flags["database"] != pc.flags["database"] {
			t.Errorf("migrate creates database %q, the sink writes to %q", m.flags["database"], pc.flags["database"])
		}
	}
	// Each stage's effective metrics port is published and health-checked.
	for _, s := range []string{"dedup", "aggregate", "sink"} {
		pc, ok := cmds[s]
		if !ok {
			continue
		}
		_, port, err := net.SplitHostPort(pc.flags["metrics-addr"])
		if err != nil {
			t.Errorf("%s: --metrics-addr %q: %v", s, pc.flags["metrics-addr"], err)
			continue
		}
		if host, _, _ := net.SplitHostPort(pc.flags["metrics-addr"]); host != "" && host != "0.0.0.0" {
			t.Errorf("%s: --metrics-addr %q listens on %s only: Prometheus cannot scrape it over the compose network; set %q",
				s, pc.flags["metrics-addr"], host, ":"+port)
		}
		if !slices.Contains(c.Services[s].Ports, "127.0.0.1:"+port+":"+port) {
			t.Errorf("%s: listens on %s (metrics-addr %q) but publishes %v", s, port, pc.flags["metrics-addr"], c.Services[s].Ports)
		}
		hc := strings.Join(c.Services[s].Healthcheck.Test, " ")
		if !strings.Contains(hc, "127.0.0.1:"+port+"/healthz") && !strings.Contains(hc, "127.0.0.1:"+port+"/readyz") {
			t.Errorf("%s: healthcheck %q does not probe /healthz or /readyz on port %s", s, hc, port)
		}
	}
}

// TestComposeCommandsValidate runs each stage's command line, with
// --validate, through meterline's own main: the stage builds and validates
// its whole configuration and exits without connecting anywhere.
func TestComposeCommandsValidate(t *testing.T) {
	c := loadCompose(t)
	for _, name := range []string{"dedup", "aggregate", "sink"} {
		svc := c.Services[name]
		args := append(commandList(t, name, svc.Command), "--validate")
		t.Run(name, func(t *testing.T) {
			env := stringEnv(svc.Environment)
			if name == "dedup" {
				// The dedup-key service makes the file when the stack starts.
				env["METERLINE_DEDUP_KEYS_FILE"] = testenv.DedupKeysFile(t)
			}
			if _, err := parseMeterline(t, args, env); err != nil { // sets the environment
				t.Fatal(err)
			}
			var out, errb bytes.Buffer
			code := cli.Main(context.Background(), args, cli.IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
			if code != 0 || !strings.Contains(out.String(), "configuration ok") {
				t.Errorf("meterline %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out.String(), errb.String())
			}
		})
	}
}

func TestComposeCommandParserCatchesMistakes(t *testing.T) {
	// The checks above are only worth something if the parser refuses what
	// meterline would refuse.
	if _, err := parseMeterline(t, []string{"dedup", "--instance-idd", "x"}, nil); err == nil {
		t.Error("a misspelt flag parsed")
	}
	if _, err := parseMeterline(t, []string{"aggregate", "--period", "week"}, nil); err == nil {
		t.Error("an invalid enum value parsed")
	}
	if _, err := parseMeterline(t, []string{"dedup"}, map[string]string{"METERLINE_COMMIT_INTERVAL": "soon"}); err == nil {
		t.Error("an invalid METERLINE_ value parsed")
	}
	pc, err := parseMeterline(t, []string{"sink"}, map[string]string{"METERLINE_BROKERS": "k:1"})
	if err != nil {
		t.Fatal(err)
	}
	if pc.flags["brokers"] != "[k:1]" {
		t.Errorf("METERLINE_BROKERS not applied: brokers %q", pc.flags["brokers"])
	}
	if pc.envs["METERLINE_TICK_INTERVAL"] {
		t.Error("the sink claims a dedup flag's variable")
	}
}

type promConfig struct {
	Global struct {
		ScrapeInterval string `json:"scrape_interval"`
	} `json:"global"`
	ScrapeConfigs []struct {
		JobName       string `json:"job_name"`
		MetricsPath   string `json:"metrics_path"`
		StaticConfigs []struct {
			Targets []string `json:"targets"`
		} `json:"static_configs"`
	} `json:"scrape_configs"`
}

// The dashboard selects its instances with up{job="meterline"}.
const scrapeJob = "meterline"

func TestPrometheusScrapesTheStages(t *testing.T) {
	c := loadCompose(t)
	cmds := composeCommands(t, c)
	var pc promConfig
	readYAML(t, filepath.Join(repoRoot, "deploy/prometheus/prometheus.yml"), &pc)
	scraped := map[string]bool{}
	for _, sc := range pc.ScrapeConfigs {
		if sc.JobName != scrapeJob {
			t.Errorf("scrape job %q; the dashboard reads job %q", sc.JobName, scrapeJob)
		}
		if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
			t.Errorf("metrics_path %q; meterline serves /metrics", sc.MetricsPath)
		}
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				host, port, err := net.SplitHostPort(target)
				if err != nil {
					t.Errorf("target %q: %v", target, err)
					continue
				}
				cmd, ok := cmds[host]
				if !ok {
					t.Errorf("target %s: %q is not a meterline service of docker-compose.yml", target, host)
					continue
				}
				if _, p, _ := net.SplitHostPort(cmd.flags["metrics-addr"]); p != port {
					t.Errorf("target %s: %s serves metrics on %q", target, host, cmd.flags["metrics-addr"])
				}
				// It listens on every interface of its container, published
				// on the host's loopback: it must name the hosts it answers
				// (docs/operations.md, HTTP servers), and Prometheus's among
				// them, or every scrape is refused.
				if ah := cmd.flags["metrics-allowed-hosts"]; !slices.Contains(strings.Fields(strings.Trim(ah, "[]")), host) {
					t.Errorf("target %s: %s answers the hosts %q (--metrics-allowed-hosts), not %s", target, host, ah, host)
				}
				scraped[host] = true
			}
		}
	}
	for _, s := range []string{"dedup", "aggregate", "sink"} {
		if !scraped[s] {
			t.Errorf("prometheus.yml does not scrape %s", s)
		}
	}
	if !slices.Contains(c.Services["prometheus"].Volumes, "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro") {
		t.Errorf("prometheus: does not mount deploy/prometheus/prometheus.yml as its config (volumes %v)", c.Services["prometheus"].Volumes)
	}

	var local promConfig
	readYAML(t, filepath.Join(repoRoot, "deploy/prometheus/local.yml"), &local)
	if len(local.ScrapeConfigs) != 1 || local.ScrapeConfigs[0].JobName != scrapeJob {
		t.Errorf("deploy/prometheus/local.yml: want one scrape job %q", scrapeJob)
	}
}

type grafanaDatasources struct {
	Datasources []struct {
		Name     string `json:"name"`
		UID      string `json:"uid"`
		Type     string `json:"type"`
		URL      string `json:"url"`
		JSONData struct {
			TimeInterval string `json:"timeInterval"`
		} `json:"jsonData"`
	} `json:"datasources"`
}

type grafanaProviders struct {
	Providers []struct {
		Type    string `json:"type"`
		Options struct {
			Path string `json:"path"`
		} `json:"options"`
	} `json:"providers"`
}

func TestGrafanaProvisioning(t *testing.T) {
	c := loadCompose(t)
	mounts := map[string]string{} // container path -> repo path
	for _, v := range c.Services["grafana"].Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && strings.HasPrefix(parts[0], "./") {
			mounts[parts[1]] = parts[0]
		}
	}
	if mounts["/etc/grafana/provisioning"] != "./deploy/grafana/provisioning" {
		t.Errorf("grafana: deploy/grafana/provisioning is not mounted on /etc/grafana/provisioning (%v)", mounts)
	}

	var ds grafanaDatasources
	readYAML(t, filepath.Join(repoRoot, "deploy/grafana/provisioning/datasources/prometheus.yml"), &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" {
		t.Fatalf("want one prometheus data source: %+v", ds)
	}
	u, err := url.Parse(ds.Datasources[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	if u.Hostname() != "prometheus" || !slices.Contains(c.Services["prometheus"].Ports, "127.0.0.1:9090:9090") || u.Port() != "9090" {
		t.Errorf("data source URL %s is not the prometheus service", u)
	}
	var pc promConfig
	readYAML(t, filepath.Join(repoRoot, "deploy/prometheus/prometheus.yml"), &pc)
	if ds.Datasources[0].JSONData.TimeInterval != pc.Global.ScrapeInterval {
		t.Errorf("data source timeInterval %q differs from the scrape interval %q ($__rate_interval depends on it)",
			ds.Datasources[0].JSONData.TimeInterval, pc.Global.ScrapeInterval)
	}

	var pv grafanaProviders
	readYAML(t, filepath.Join(repoRoot, "deploy/grafana/provisioning/dashboards/meterline.yml"), &pv)
	if len(pv.Providers) != 1 || pv.Providers[0].Type != "file" {
		t.Fatalf("want one file dashboard provider: %+v", pv)
	}
	src, ok := mounts[pv.Providers[0].Options.Path]
	if !ok {
		t.Fatalf("provider path %s is not a mount of the grafana service (%v)", pv.Providers[0].Options.Path, mounts)
	}
	if filepath.Clean(src) != "deploy/grafana/dashboards" {
		t.Errorf("provider path %s holds %s, not deploy/grafana/dashboards", pv.Providers[0].Options.Path, src)
	}
	home := stringEnv(c.Services["grafana"].Environment)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
	if home != "" {
		rel, err := filepath.Rel(pv.Providers[0].Options.Path, home)
		if err != nil || strings.HasPrefix(rel, "..") {
			t.Errorf("home dashboard %s is outside the provisioned dashboards", home)
		} else if _, err := os.Stat(filepath.Join(repoRoot, src, rel)); err != nil {
			t.Errorf("home dashboard: %v", err)
		}
	}

	d := loadDashboard(t)
	if cur := d.datasourceDefault(); cur != ds.Datasources[0].UID {
		t.Errorf("the dashboard's default data source is %q; the provisioned one has uid %q", cur, ds.Datasources[0].UID)
	}
}

func TestClickHouseConfig(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/clickhouse/config.d/meterline.xml"))
	if err != nil {
		t.Fatal(err)
	}
	var root struct {
		XMLName xml.Name
	}
	if err := xml.Unmarshal(b, &root); err != nil {
		t.Fatalf("deploy/clickhouse/config.d/meterline.xml: %v", err)
	}
	if root.XMLName.Local != "clickhouse" {
		t.Errorf("root element <%s>; want <clickhouse>", root.XMLName.Local)
	}
	env := stringEnv(loadCompose(t).Services["clickhouse"].Environment)
	if env["CLICKHOUSE_SKIP_USER_SETUP"] != "1" && env["CLICKHOUSE_PASSWORD"] == "" {
		t.Error("clickhouse: the image allows the passwordless default user (which meterline uses) from localhost only unless CLICKHOUSE_SKIP_USER_SETUP=1")
	}
}

// TestComposePublishesOnLoopbackOnly: the stack publishes every port on
// the host's 127.0.0.1 only (docs/operations.md, HTTP servers): Kafka and
// ClickHouse without passwords, the stages' status pages and Prometheus
// have no authentication, and none of them is for the network.
func TestComposePublishesOnLoopbackOnly(t *testing.T) {
	c := loadCompose(t)
	n := 0
	for name, svc := range c.Services {
		for _, p := range svc.Ports {
			n++
			parts := strings.Split(p, ":")
			if len(parts) != 3 || parts[0] != "127.0.0.1" {
				t.Errorf("%s: port %q is published on every interface of the host; want \"127.0.0.1:%s\"", name, p, strings.Join(parts[len(parts)-2:], ":"))
			}
		}
	}
	if n == 0 {
		t.Fatal("no published ports found")
	}
}

// TestComposeGrafanaHasNoDefaultPassword: Grafana's admin password comes
// from the environment of `docker compose` (or a file), never from the
// compose file, and compose refuses to start without it.
func TestComposeGrafanaHasNoDefaultPassword(t *testing.T) {
	env := stringEnv(loadCompose(t).Services["grafana"].Environment)
	pw, byValue := env["GF_SECURITY_ADMIN_PASSWORD"]
	_, byFile := env["GF_SECURITY_ADMIN_PASSWORD__FILE"]
	switch {
	case byValue && !regexp.MustCompile(`^\$\{[A-Z_]+:\?[^}]+\}$`).MatchString(pw):
		t.Errorf("GF_SECURITY_ADMIN_PASSWORD is %q; want ${VAR:?message}, a password compose requires from its environment", pw)
	case !byValue && !byFile:
		t.Error("Grafana's admin password is not set: Grafana would start with admin/admin")
	}
}
