package cli

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap"

	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/ingest"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/producer"
)

// TestKeysCommands runs tenants and keys commands on kfake: a tenant, a
// key whose token is printed once on standard output, the list (no token
// in it), a revoke, and the refusals that name what is wrong. The
// command lines of docs/ingest.md's keys block parse.
func TestKeysCommands(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.SeedTopics(1, "meterline.keys"))
	b := "--brokers=" + strings.Join(brokers, ",")
	code, out, errOut := run(t, "", "tenants", "set", "acme", "--allow-customers", "acme-*", "--allow-customers", "acme", b)
	if code != 0 || !strings.Contains(out, "tenant acme: customers acme-*,acme") {
		t.Fatalf("tenants set: %d %s %s", code, out, errOut)
	}
	code, token, errOut := run(t, "", "keys", "create", "--tenant", "acme", "--allow-customers", "acme-eu-*", "--allow-meters", "tokens,prompts", "--rate", "500", "--note", "chat-api", b)
	token = strings.TrimSpace(token)
	if code != 0 || !regexp.MustCompile(`^mlk_[0-9a-f]{16}_[A-Za-z0-9_-]{43}$`).MatchString(token) {
		t.Fatalf("keys create: %d stdout %q stderr %s", code, token, errOut)
	}
	id := token[4:20]
	if !strings.Contains(errOut, "key "+id+" of tenant acme: customers acme-eu-*; meters tokens,prompts; rate 500 events/s per replica") {
		t.Errorf("keys create stderr: %s", errOut)
	}
	code, out, errOut = run(t, "", "keys", "create", "--tenant", "acme", "--allow-customers", "globex-*", b)
	if code == 0 || !strings.Contains(errOut, `customers "globex-*" is not within tenant acme's customers`) {
		t.Errorf("a key outside its tenant: %d %s %s", code, out, errOut)
	}
	code, out, errOut = run(t, "", "keys", "create", "--tenant", "globex", b)
	if code == 0 || !strings.Contains(errOut, `tenant "globex" does not exist`) {
		t.Errorf("key of an unknown tenant without customers: %d %s %s", code, out, errOut)
	}
	code, out, _ = run(t, "", "keys", "list", b)
	if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "chat-api") || strings.Contains(out, token[21:]) || !strings.Contains(out, "1 keys, 1 tenants") {
		t.Fatalf("keys list: %d\n%s", code, out)
	}
	code, out, _ = run(t, "", "keys", "list", "--json", b)
	if code != 0 || strings.Contains(out, token[21:]) || !strings.Contains(out, `"sha256"`) {
		t.Fatalf("keys list --json: %d\n%s", code, out)
	}
	code, out, errOut = run(t, "", "keys", "revoke", id, b)
	if code != 0 || !strings.HasPrefix(out, "revoked key "+id+" of tenant acme at ") {
		t.Fatalf("keys revoke: %d %s %s", code, out, errOut)
	}
	if code, out, _ = run(t, "", "keys", "list", b); !strings.Contains(out, "revoked ") {
		t.Errorf("list after revoke: %d %s", code, out)
	}
	if code, _, errOut = run(t, "", "keys", "revoke", "0000000000000000", b); code == 0 || !strings.Contains(errOut, `no such key: "0000000000000000" (meterline keys list shows every key's ID)`) {
		t.Errorf("revoke of an unknown key: %d %s", code, errOut)
	}
	if code, out, _ = run(t, "", "tenants", "list", b); code != 0 || !strings.Contains(out, "acme\tcustomers acme-*,acme\t0 active keys") {
		t.Errorf("tenants list: %d %s", code, out)
	}
	checkDocCommands(t, "TestKeysCommands")
}

// TestIngestCommands checks that every meterline command line of
// docs/ingest.md's blocks tied to it parses with the real flags, and that
// `ingest --validate` accepts the documented meters file.
func TestIngestCommands(t *testing.T) {
	checkDocCommands(t, "TestIngestCommands")
	dir := t.TempDir()
	meters := filepath.Join(dir, "meters.yaml")
	if err := os.WriteFile(meters, []byte(docBlock(t, "yaml", "event_type: prompt")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "", "ingest", "--meters", meters, "--validate")
	if code != 0 || out != "configuration ok\n" {
		t.Fatalf("ingest --validate: %d %s %s", code, out, errOut)
	}
	code, _, errOut = run(t, "", "ingest", "--meters", meters, "--validate", "--max-events=-1", "--produce-timeout", "10ms")
	if code != 2 || !strings.Contains(errOut, "max-events -1") || !strings.Contains(errOut, "produce-timeout 10ms") {
		t.Fatalf("bad flags: %d %s", code, errOut)
	}
	code, out, errOut = run(t, "", "run", "--meters", meters, "--ingest", "--no-sink", "--validate", "--dedup-keys-file", writeDedupKeys(t, dir), "--ingest-max-body-bytes", "10")
	if code != 2 || !strings.Contains(errOut, "--ingest-* flags: ingest: max-body-bytes 10") {
		t.Fatalf("run --ingest with a bad flag: %d %s %s", code, out, errOut)
	}
}

func writeDedupKeys(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "dedup.keys")
	if code, out, errOut := run(t, "", "dedup-key", "--out", path); code != 0 {
		t.Fatalf("dedup-key: %d %s %s", code, out, errOut)
	}
	return path
}

// docBlock returns the first code block of docs/ingest.md in lang that
// contains needle.
func docBlock(t *testing.T, lang, needle string) string {
	t.Helper()
	for _, b := range docBlocks(t) {
		if b.lang == lang && strings.Contains(b.text, needle) {
			return b.text
		}
	}
	t.Fatalf("docs/ingest.md has no %s block with %q", lang, needle)
	return ""
}

type docCodeBlock struct{ lang, annotation, text string }

func docBlocks(t *testing.T) []docCodeBlock {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "ingest.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []docCodeBlock
	lines := strings.Split(string(b), "\n")
	prev := ""
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if !strings.HasPrefix(l, "```") {
			if strings.TrimSpace(l) != "" {
				prev = strings.TrimSpace(l)
			}
			continue
		}
		blk := docCodeBlock{lang: strings.TrimPrefix(l, "```"), annotation: prev}
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			blk.text += lines[i] + "\n"
		}
		out = append(out, blk)
		prev = ""
	}
	return out
}

var innerCommand = regexp.MustCompile(`\$\((bin/meterline [^)]*)\)`)

// checkDocCommands parses every meterline command line of the
// docs/ingest.md blocks annotated "tested-by <test>" with the real flags.
func checkDocCommands(t *testing.T, test string) {
	t.Helper()
	n := 0
	for _, b := range docBlocks(t) {
		if !strings.Contains(b.annotation, "tested-by "+test) {
			continue
		}
		for _, l := range strings.Split(b.text, "\n") {
			if m := innerCommand.FindStringSubmatch(l); m != nil {
				l = m[1]
			}
			l = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(l), "&"))
			if !strings.HasPrefix(l, "bin/meterline ") {
				continue
			}
			args, err := shellWords(strings.TrimPrefix(l, "bin/meterline "))
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			var cli CLI
			p, err := Parser(&cli, IO{Stdout: io.Discard, Stderr: io.Discard}, func(int) {})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Parse(args); err != nil && !strings.Contains(err.Error(), "no such file or directory") {
				t.Errorf("docs/ingest.md: %s: %v", l, err)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no meterline command tied to %s in docs/ingest.md", test)
	}
}

// shellWords splits a command line at blanks, keeping quoted strings whole.
func shellWords(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	in, quote := false, rune(0)
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		out = append(out, cur.String())
	}
	return out, nil
}

// The in-flight bounds reach the ingest's config; -1 is no bound (it stays
// negative: 0 would take the default).
func TestIngestInFlightFlags(t *testing.T) {
	g := &Globals{Brokers: []string{"127.0.0.1:1"}}
	c := parseCLI(t, "ingest", "--max-in-flight", "40", "--max-in-flight-per-client=-1", "--max-connections", "300").Ingest
	cfg := c.IngestFlags.config(kafka.Config{Brokers: g.Brokers}, g, nil, false, dedup.DefaultWindow, zap.NewNop(), prometheus.NewRegistry())
	if cfg.MaxInFlight != 40 || cfg.MaxInFlightPerTenant != -1 || cfg.MaxConnections != 300 {
		t.Errorf("MaxInFlight %d, MaxInFlightPerTenant %d, MaxConnections %d; want 40, -1 and 300", cfg.MaxInFlight, cfg.MaxInFlightPerTenant, cfg.MaxConnections)
	}
	r := parseCLI(t, "run", "--ingest", "--ingest-max-connections=-1").Run
	if cfg := r.IngestFlags.config(kafka.Config{Brokers: g.Brokers}, g, nil, false, dedup.DefaultWindow, zap.NewNop(), prometheus.NewRegistry()); cfg.MaxConnections != -1 {
		t.Errorf("run --ingest-max-connections=-1: MaxConnections %d, want -1", cfg.MaxConnections)
	}
}

// The bound on an event's age is, by default, dedup's window plus the max
// skew: in meterline run, --dedup-window, so that a wider window never
// has the ingest refuse events dedup accepts; alone, the default window.
// -1s is no bound.
func TestIngestMaxAgeFlag(t *testing.T) {
	g := &Globals{Brokers: []string{"127.0.0.1:1"}}
	kc := kafka.Config{Brokers: g.Brokers}
	cfg := func(f IngestFlags, window time.Duration) ingest.Config {
		return f.config(kc, g, nil, false, window, zap.NewNop(), prometheus.NewRegistry())
	}
	for _, c := range []struct {
		name string
		got  ingest.Config
		want time.Duration
	}{
		{"ingest", cfg(parseCLI(t, "ingest").Ingest.IngestFlags, dedup.DefaultWindow), dedup.DefaultWindow + producer.DefaultMaxSkew},
		{"ingest --max-skew 2h", cfg(parseCLI(t, "ingest", "--max-skew", "2h").Ingest.IngestFlags, dedup.DefaultWindow), dedup.DefaultWindow + 2*time.Hour},
		{"ingest --max-age 100h", cfg(parseCLI(t, "ingest", "--max-age", "100h").Ingest.IngestFlags, dedup.DefaultWindow), 100 * time.Hour},
		{"ingest --max-age -1s", cfg(parseCLI(t, "ingest", "--max-age=-1s").Ingest.IngestFlags, dedup.DefaultWindow), -time.Second},
	} {
		if c.got.MaxAge != c.want {
			t.Errorf("%s: MaxAge %s, want %s", c.name, c.got.MaxAge, c.want)
		}
	}
	r := parseCLI(t, "run", "--ingest", "--dedup-window", "1440h", "--dedup-keys-file", writeDedupKeys(t, t.TempDir())).Run
	dcfg, _, err := r.stageConfigs(g, zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg(r.IngestFlags, dcfg.Window).MaxAge; got != 1441*time.Hour {
		t.Errorf("run --dedup-window 1440h: MaxAge %s, want 1441h", got)
	}
}

// TestIngestBoundsRefuseZero: ingest.Config takes a zero bound as "the
// default", so --max-in-flight 0 would silently serve 256 requests at
// once, --max-in-flight-per-client 0 64 per tenant, and --read-timeout 0
// (read as "no timeout" by net/http) 30s. Ingest and run refuse 0 for each
// such bound, naming the flag (refuseZeroFlags; --max-age, which has no
// default of its own, refuseZeroMaxAge), and still take -1 where it means
// no bound.
func TestIngestBoundsRefuseZero(t *testing.T) {
	dir := t.TempDir()
	meters := filepath.Join(dir, "meters.yaml")
	if err := os.WriteFile(meters, []byte(docBlock(t, "yaml", "event_type: prompt")), 0o600); err != nil {
		t.Fatal(err)
	}
	keys := writeDedupKeys(t, dir)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ingest", "--max-in-flight", "0"}, "--max-in-flight must not be 0"},
		{[]string{"ingest", "--max-in-flight-per-client", "0"}, "--max-in-flight-per-client must not be 0"},
		{[]string{"ingest", "--max-connections", "0"}, "--max-connections must not be 0"},
		{[]string{"run", "--ingest", "--no-sink", "--dedup-keys-file", keys, "--ingest-max-connections", "0"}, "--ingest-max-connections must not be 0"},
		{[]string{"ingest", "--max-events", "0"}, "--max-events must not be 0"},
		{[]string{"ingest", "--max-body-bytes", "0"}, "--max-body-bytes must not be 0"},
		{[]string{"ingest", "--refusal-rate", "0"}, "--refusal-rate must not be 0"},
		{[]string{"ingest", "--read-timeout", "0s"}, "--read-timeout must not be 0"},
		{[]string{"ingest", "--read-header-timeout", "0"}, "--read-header-timeout must not be 0"},
		{[]string{"ingest", "--idle-timeout", "0s"}, "--idle-timeout must not be 0"},
		{[]string{"ingest", "--produce-timeout", "0s"}, "--produce-timeout must not be 0"},
		{[]string{"ingest", "--max-skew", "0s"}, "--max-skew must not be 0"},
		{[]string{"ingest", "--gate-max-age", "0s"}, "--gate-max-age must not be 0"},
		{[]string{"ingest", "--auth-max-age", "0s"}, "--auth-max-age must not be 0"},
		{[]string{"run", "--ingest", "--no-sink", "--dedup-keys-file", keys, "--ingest-auth-max-age", "0s"}, "--ingest-auth-max-age must not be 0"},
		{[]string{"ingest", "--max-age", "0s"}, "ingest: max-age must not be 0"},
		{[]string{"run", "--ingest", "--no-sink", "--dedup-keys-file", keys, "--ingest-max-age", "0s"}, "--ingest-* flags: ingest: max-age must not be 0"},
		{[]string{"run", "--ingest", "--no-sink", "--dedup-keys-file", keys, "--ingest-read-timeout", "0s"}, "--ingest-read-timeout must not be 0"},
		{[]string{"run", "--ingest", "--no-sink", "--dedup-keys-file", keys, "--ingest-max-in-flight", "0"}, "--ingest-max-in-flight must not be 0"},
		{[]string{"run", "--ingest", "--no-sink", "--dedup-keys-file", keys, "--ingest-max-in-flight-per-client", "0"}, "--ingest-max-in-flight-per-client must not be 0"},
	} {
		code, out, errOut := run(t, "", append(c.args, "--meters", meters, "--validate")...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, want 2 saying %q\n%s%s", c.args, code, c.want, out, errOut)
		}
	}
	if code, out, errOut := run(t, "", "ingest", "--meters", meters, "--validate", "--max-in-flight=-1", "--max-in-flight-per-client=-1", "--refusal-rate=-1"); code != 0 {
		t.Errorf("ingest with -1 bounds: exit %d\n%s%s", code, out, errOut)
	}
}

// TestIngestNoBoundAsTold: the value an ingest flag's help, and its error
// for 0, give for "no bound" is one the flag takes. --max-age's said
// "-1", which a duration flag refuses ("missing unit in duration").
func TestIngestNoBoundAsTold(t *testing.T) {
	dir := t.TempDir()
	meters := filepath.Join(dir, "meters.yaml")
	if err := os.WriteFile(meters, []byte(docBlock(t, "yaml", "event_type: prompt")), 0o600); err != nil {
		t.Fatal(err)
	}
	_, help, _ := run(t, "", "ingest", "--help")
	help = strings.Join(strings.Fields(help), " ")
	told := regexp.MustCompile(`(-1s?): no (?:bound|budget)`)
	for _, c := range []struct{ flag, zero string }{
		{"max-age", "0s"}, {"auth-max-age", "0s"}, {"max-in-flight", "0"}, {"max-in-flight-per-client", "0"}, {"max-connections", "0"}, {"refusal-rate", "0"},
	} {
		_, _, errOut := run(t, "", "ingest", "--meters", meters, "--validate", "--"+c.flag, c.zero)
		i := strings.Index(help, "--"+c.flag+"=")
		if i < 0 {
			t.Fatalf("--%s is not in the help", c.flag)
		}
		for where, text := range map[string]string{"its error for 0": errOut, "its help": help[i:]} {
			m := told.FindStringSubmatch(text)
			if m == nil {
				t.Errorf("--%s: %s names no value for no bound: %s", c.flag, where, text)
				continue
			}
			if code, out, errOut := run(t, "", "ingest", "--meters", meters, "--validate", "--"+c.flag+"="+m[1]); code != 0 {
				t.Errorf("--%s=%s, as %s says: exit %d\n%s%s", c.flag, m[1], where, code, out, errOut)
			}
		}
	}
}
