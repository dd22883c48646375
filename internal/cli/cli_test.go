package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

func run(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Main(context.Background(), args, IO{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb})
	return code, out.String(), errb.String()
}

// TestProduceBadLines is the acceptance case of `meterline produce`: one
// valid line, one malformed JSON line, one negative quantity and one missing
// customer_id. The valid event is sent, three errors name their line and
// field, and the exit status is non-zero. It runs on kfake and, when
// METERLINE_TEST_KAFKA is set, on the real broker.
func TestProduceBadLines(t *testing.T) {
	t.Run("kfake", func(t *testing.T) {
		_, brokers := testenv.KFake(t, kfake.SeedTopics(4, "usage.events"))
		testProduceBadLines(t, brokers, "usage.events")
	})
	t.Run("real-kafka", func(t *testing.T) {
		brokers := testenv.RealKafka(t)
		topic := testenv.Name(t, "usage.events")
		testenv.CreateTopic(t, brokers, topic, 4, nil)
		testProduceBadLines(t, brokers, topic)
	})
}

func testProduceBadLines(t *testing.T, brokers []string, topic string) {
	ts := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	commaTS := time.Now().Add(-time.Minute).UTC().Format("2006-01-02T15:04:05,000Z07:00")
	file := filepath.Join(t.TempDir(), "events.ndjson")
	lines := strings.Join([]string{
		`{"event_id":"req-1","customer_id":"acme","meter":"api_calls","quantity":3,"event_time":"` + ts + `","source":"api-gateway","properties":{"model":"m1"}}`,
		`{"event_id":"req-2","customer_id":"acme","meter":"api_calls","quantity":3,`,
		`{"event_id":"req-3","customer_id":"acme","meter":"api_calls","quantity":-4,"event_time":"` + ts + `"}`,
		`{"event_id":"req-4","meter":"api_calls","quantity":1,"event_time":"` + ts + `"}`,
		// RFC 3339 has a full stop before a fraction of a second, never
		// the comma time.Parse takes (docs/producing.md).
		`{"event_id":"req-5","customer_id":"acme","meter":"api_calls","quantity":1,"event_time":"` + commaTS + `"}`,
		// An ID of white space only is as good as none (docs/design.md).
		`{"event_id":"   ","customer_id":"acme","meter":"api_calls","quantity":1,"event_time":"` + ts + `"}`,
	}, "\n") + "\n"
	if err := os.WriteFile(file, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := run(t, "", "produce", "--brokers", strings.Join(brokers, ","), "--topic-events", topic, "--file", file)
	if code == 0 {
		t.Fatalf("exit 0; want non-zero\nstdout: %s\nstderr: %s", stdout, stderr)
	}
	wantErrs := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^line 2: malformed JSON`),
		regexp.MustCompile(`(?m)^line 3: quantity: must not be negative`),
		regexp.MustCompile(`(?m)^line 4: customer_id: is missing`),
		regexp.MustCompile(`(?m)^line 5: event_time: "` + regexp.QuoteMeta(commaTS) + `" is not RFC 3339`),
		regexp.MustCompile(`(?m)^line 6: event_id: must not be blank`),
	}
	for _, re := range wantErrs {
		if !re.MatchString(stderr) {
			t.Errorf("stderr lacks %s:\n%s", re, stderr)
		}
	}
	if n := strings.Count(stderr, "line "); n != 5 {
		t.Errorf("stderr has %d error lines, want 5:\n%s", n, stderr)
	}
	if !strings.Contains(stdout, "6 lines, 1 sent, 5 bad, 0 failed") {
		t.Errorf("summary: %s", stdout)
	}
	recs := testenv.ReadAll(t, brokers, topic)
	if len(recs) != 1 {
		t.Fatalf("topic has %d records, want the 1 valid event", len(recs))
	}
	var ue schemas.UsageEvent
	if err := schemas.DecodeInto(recs[0].Value, &ue); err != nil {
		t.Fatal(err)
	}
	if ue.EventID != "req-1" || ue.Quantity != 3 || string(recs[0].Key) != "4:acme9:api_calls5:req-1" {
		t.Fatalf("sent %+v with key %q", ue, recs[0].Key)
	}
}

func TestProduceStrictStops(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.SeedTopics(1, "usage.events"))
	ts := time.Now().UTC().Format(time.RFC3339)
	ok := func(id string) string {
		return `{"event_id":"` + id + `","customer_id":"c","meter":"m","quantity":1,"event_time":"` + ts + `"}`
	}
	in := ok("a") + "\n" + `{"bad"` + "\n" + ok("b") + "\n"
	code, stdout, stderr := run(t, in, "produce", "--brokers", brokers[0], "--strict")
	if code == 0 || !strings.Contains(stderr, "line 2:") {
		t.Fatalf("code %d stderr %s", code, stderr)
	}
	if !strings.Contains(stdout, "1 sent, 1 bad") {
		t.Fatalf("summary: %s", stdout)
	}
	if recs := testenv.ReadAll(t, brokers, "usage.events"); len(recs) != 1 {
		t.Fatalf("%d records; strict mode must not send lines after the bad one", len(recs))
	}
}

func TestProduceAllGoodExitsZero(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.SeedTopics(2, "usage.events"))
	var in strings.Builder
	for i := 0; i < 2000; i++ {
		in.WriteString(`{"event_id":"e`)
		in.WriteString(string(rune('a' + i%26)))
		in.WriteString(strings.Repeat("x", i%7))
		in.WriteString(`-` + time.Duration(i).String() + `","customer_id":"c","meter":"m","quantity":1,"event_time":1795953600250}` + "\n\n")
	}
	code, stdout, stderr := run(t, in.String(), "produce", "--brokers", brokers[0], "--max-skew", "87600h")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "2000 lines, 2000 sent, 0 bad, 0 failed") {
		t.Fatalf("summary: %s", stdout)
	}
	recs := testenv.ReadAll(t, brokers, "usage.events")
	if len(recs) != 2000 {
		t.Fatalf("%d records", len(recs))
	}
}

// parseCLI parses args as the command line does, without running the
// command.
func parseCLI(t *testing.T, args ...string) *CLI {
	t.Helper()
	var c CLI
	k, err := Parser(&c, IO{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Parse(args); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return &c
}

// TestFlagSources checks the precedence: flag > METERLINE_* env > YAML
// --config > default.
func TestFlagSources(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "meterline.yaml")
	if err := os.WriteFile(cfg, []byte("brokers: [yaml-1:9092, yaml-2:9092]\nlog_level: warn\ntopic_events: from-yaml\nclickhouse: yaml:9000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	parse := func(args ...string) *CLI { return parseCLI(t, args...) }
	c := parse("version")
	if c.Brokers[0] != "127.0.0.1:9092" || c.ClickHouse != "127.0.0.1:9000" || c.Topic.EventsTopic() != "usage.events" || c.LogLevel != "info" {
		t.Fatalf("defaults: %+v", c.Globals)
	}
	c = parse("--config", cfg, "version")
	if strings.Join(c.Brokers, ",") != "yaml-1:9092,yaml-2:9092" || c.LogLevel != "warn" || c.Topic.Events != "from-yaml" || c.ClickHouse != "yaml:9000" {
		t.Fatalf("yaml: %+v", c.Globals)
	}
	t.Setenv("METERLINE_LOG_LEVEL", "debug")
	t.Setenv("METERLINE_TOPIC_EVENTS", "from-env")
	c = parse("--config", cfg, "version")
	if c.LogLevel != "debug" || c.Topic.Events != "from-env" || c.ClickHouse != "yaml:9000" {
		t.Fatalf("env over yaml: %+v", c.Globals)
	}
	c = parse("--config", cfg, "--log-level", "error", "--topic-prefix", "x.", "version")
	if c.LogLevel != "error" || c.Topic.EventsTopic() != "x.from-env" {
		t.Fatalf("flag over env: %+v", c.Globals)
	}
	t.Setenv("METERLINE_CONFIG", cfg)
	if c = parse("version"); c.ClickHouse != "yaml:9000" {
		t.Fatalf("METERLINE_CONFIG not honoured: %+v", c.Globals)
	}
}

func TestHelpListsDefaults(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"produce", "--help"}, {"topics", "create", "--help"}, {"topics", "check", "--help"}, {"bench", "produce", "--help"}} {
		code, out, _ := run(t, "", args...)
		if code != 0 {
			t.Fatalf("%v: exit %d", args, code)
		}
		wants := []string{"--brokers=127.0.0.1:9092", `--log-level="info"`, `--topic-events="usage.events"`}
		if args[0] == "--help" || args[0] == "bench" { // the commands that read the ClickHouse flags
			wants = append(wants, `--clickhouse="127.0.0.1:9000"`)
		}
		for _, want := range wants {
			if !strings.Contains(out, want) {
				t.Errorf("%v help lacks %s:\n%s", args, want, out)
			}
		}
	}
	code, _, errOut := run(t, "", "produce", "--no-such-flag")
	if code != 2 || !strings.Contains(errOut, "no-such-flag") {
		t.Fatalf("unknown flag: code %d, %s", code, errOut)
	}
}

// TestTopicsCreateAndCheck runs on the real broker: kfake accepts invalid
// configs and does not report them as Kafka does.
func TestTopicsCreateAndCheck(t *testing.T) {
	brokers := testenv.RealKafka(t)
	prefix := testenv.Name(t, "") + "."
	args := func(cmd ...string) []string {
		return append(cmd, "--brokers", strings.Join(brokers, ","), "--topic-prefix", prefix, "--partitions", "4")
	}
	t.Cleanup(func() {
		adm := testenv.Admin(t, brokers)
		var ns []string
		names := topics.DefaultNames()
		names.Prefix = prefix
		for _, s := range topics.Specs(names, topics.DefaultLayout()) {
			ns = append(ns, s.Name)
		}
		_, _ = adm.DeleteTopics(context.Background(), ns...)
	})
	code, out, errOut := run(t, "", args("topics", "create")...)
	if code != 0 || strings.Count(out, "created") != 11 || !strings.Contains(out, "all 11 topics match") {
		t.Fatalf("create: %d\n%s\n%s", code, out, errOut)
	}
	// One broker: replication factor 1 and min.insync.replicas 1 by
	// default; a factor the cluster cannot hold is refused.
	if !strings.Contains(out, "1 brokers: replication factor 1, min.insync.replicas 1") {
		t.Errorf("create does not say the replication it chose:\n%s", out)
	}
	if code, out, errOut := run(t, "", args("topics", "create", "--replication-factor", "3")...); code != 2 ||
		!strings.Contains(errOut, "--replication-factor 3 needs 3 brokers, the cluster has 1") {
		t.Errorf("create --replication-factor 3 on one broker: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, _ = run(t, "", args("topics", "create")...)
	if code != 0 || strings.Count(out, "exists") != 11 {
		t.Fatalf("second create is not idempotent: %d\n%s", code, out)
	}
	code, out, _ = run(t, "", args("topics", "check")...)
	if code != 0 {
		t.Fatalf("check after create: %d\n%s", code, out)
	}

	// Drift: timestamp type, cleanup policy, retention, and a changelog
	// whose partition count no longer matches its input topic.
	adm := testenv.Admin(t, brokers)
	ctx := context.Background()
	set := func(topic, k, v string) {
		t.Helper()
		rs, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: k, Value: &v}}, topic)
		if err == nil {
			for _, r := range rs {
				err = r.Err
			}
		}
		if err != nil {
			t.Fatalf("alter %s %s: %v", topic, k, err)
		}
	}
	set(prefix+"usage.events", "message.timestamp.type", "CreateTime")
	set(prefix+"usage.aggregates", "cleanup.policy", "delete")
	set(prefix+"usage.rejected", "retention.ms", "3600000")
	set(prefix+"usage.deduped.v2", "min.insync.replicas", "2")
	set(prefix+"usage.deduped.v2", "message.timestamp.type", "CreateTime")
	set(prefix+"meterline.keys", "cleanup.policy", "delete")
	if _, err := adm.CreatePartitions(ctx, 2, prefix+"usage.events"); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.CreatePartitions(ctx, 1, prefix+"usage.entitlements"); err != nil {
		t.Fatal(err)
	}
	code, out, _ = run(t, "", args("topics", "check")...)
	if code != 1 {
		t.Fatalf("check with drift: exit %d\n%s", code, out)
	}
	for _, want := range []string{
		prefix + "usage.events: message.timestamp.type is CreateTime, want LogAppendTime",
		prefix + "usage.events: partitions is 6, want 4",
		prefix + "usage.aggregates: cleanup.policy is delete, want compact",
		prefix + "usage.rejected: retention.ms is 3600000 (1h0m0s), want at least",
		prefix + "meterline.keys: cleanup.policy is delete, want compact",
		prefix + "meterline-dedup-changelog-v2: partitions is 4, want 6 (as many as its input " + prefix + "usage.events)",
		prefix + "usage.deduped.v2: min.insync.replicas is 2, want 1",
		prefix + "usage.deduped.v2: message.timestamp.type is CreateTime, want LogAppendTime",
		prefix + "usage.entitlements: partitions is 5, want 4 (co-partitioned with " + prefix + "usage.deduped.v2)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "drift"); n != 9 {
		t.Errorf("%d drifts reported, want 9:\n%s", n, out)
	}
}
