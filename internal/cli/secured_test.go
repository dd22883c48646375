package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
)

// The tests of this file run on the secured services of `make test`: a
// SASL_SSL broker with ACLs on (testenv.RealKafkaSASL) and a ClickHouse
// whose user needs a password, over native TLS
// (testenv.RealClickHouseSecure). Every command connects the way an
// operator would run it: SASL user and password file, CA, client
// certificate.

// aclSpec is one kafka-acls.sh --add command of docs/operations.md.
type aclSpec struct {
	principal string
	ops       []kadm.ACLOperation
	topics    []string
	groups    []string
	txnIDs    []string
	cluster   bool
	prefixed  bool
	line      string
}

// documentedACLs reads every `kafka-acls.sh ... --add` command of
// docs/operations.md, by principal name (User:<name>).
func documentedACLs(t *testing.T) map[string][]aclSpec {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]aclSpec{}
	var cur strings.Builder
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if cur.Len() == 0 && !strings.HasPrefix(l, "kafka-acls.sh ") {
			continue
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(l)
		spec := parseACL(t, cur.String())
		cur.Reset()
		out[spec.principal] = append(out[spec.principal], spec)
	}
	if len(out) == 0 {
		t.Fatal("docs/operations.md has no kafka-acls.sh commands")
	}
	return out
}

func parseACL(t *testing.T, line string) aclSpec {
	t.Helper()
	s := aclSpec{line: line}
	f := strings.Fields(line)
	for i := 1; i < len(f); i++ {
		arg := func() string {
			i++
			if i >= len(f) {
				t.Fatalf("docs: %s: %s needs a value", line, f[i-1])
			}
			return strings.Trim(f[i], `"'`)
		}
		switch f[i] {
		case "--bootstrap-server", "--command-config":
			arg()
		case "--add":
		case "--allow-principal":
			p, ok := strings.CutPrefix(arg(), "User:")
			if !ok {
				t.Fatalf("docs: %s: principal must be User:<name>", line)
			}
			s.principal = p
		case "--operation":
			op, err := kmsg.ParseACLOperation(arg())
			if err != nil {
				t.Fatalf("docs: %s: %v", line, err)
			}
			s.ops = append(s.ops, op)
		case "--topic":
			s.topics = append(s.topics, arg())
		case "--group":
			s.groups = append(s.groups, arg())
		case "--transactional-id":
			s.txnIDs = append(s.txnIDs, arg())
		case "--cluster":
			s.cluster = true
		case "--resource-pattern-type":
			switch v := arg(); v {
			case "prefixed":
				s.prefixed = true
			case "literal":
			default:
				t.Fatalf("docs: %s: pattern type %q", line, v)
			}
		default:
			t.Fatalf("docs: %s: unknown argument %q", line, f[i])
		}
	}
	if s.principal == "" || len(s.ops) == 0 {
		t.Fatalf("docs: %s: want a principal and operations", line)
	}
	return s
}

// grant creates, as admin, the documented ACLs of the principals docNames
// for principal user, every resource name with prefix prepended (the
// test's topic prefix, which its groups carry too). They are deleted when
// the test ends.
func grant(t *testing.T, adm *kadm.Client, specs map[string][]aclSpec, prefix, user string, docNames ...string) {
	t.Helper()
	pre := func(names []string) []string {
		out := make([]string, len(names))
		for i, n := range names {
			out[i] = prefix + n
		}
		return out
	}
	var made []*kadm.ACLBuilder
	for _, doc := range docNames {
		if len(specs[doc]) == 0 {
			t.Fatalf("docs/operations.md lists no ACLs for User:%s", doc)
		}
		for _, s := range specs[doc] {
			b := kadm.NewACLs().Allow("User:" + user).AllowHosts("*").Operations(s.ops...).
				MaybeTopics(pre(s.topics)...).MaybeGroups(pre(s.groups)...).MaybeTransactionalIDs(pre(s.txnIDs)...).MaybeClusters(s.cluster)
			if s.prefixed {
				b.ResourcePatternType(kadm.ACLPatternPrefixed)
			} else {
				b.ResourcePatternType(kadm.ACLPatternLiteral)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			res, err := adm.CreateACLs(ctx, b)
			cancel()
			if err != nil {
				t.Fatalf("create ACLs %s: %v", s.line, err)
			}
			for _, r := range res {
				if r.Err != nil {
					t.Fatalf("create ACL %s: %v", s.line, r.Err)
				}
			}
			made = append(made, b)
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_, _ = adm.DeleteACLs(ctx, b)
			})
		}
	}
	// ACLs reach the authorizer through the metadata log: wait until the
	// broker lists every one just made (each filter of each builder
	// matches), not merely some ACL of the user.
	deadline := time.Now().Add(30 * time.Second)
	for {
		missing, err := missingACLs(adm, made)
		if err == nil && missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ACLs of User:%s not visible after 30 s: %v%s", user, err, missing)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// missingACLs describes each builder's ACLs and names the first filter
// the broker matches with nothing.
func missingACLs(adm *kadm.Client, made []*kadm.ACLBuilder) (string, error) {
	for _, b := range made {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		res, err := adm.DescribeACLs(ctx, b)
		cancel()
		if err != nil {
			return "", err
		}
		for _, r := range res {
			if r.Err != nil {
				return "", r.Err
			}
			if len(r.Described) == 0 {
				return fmt.Sprintf(" (%v %s %v not listed)", r.Operation, r.Type, derefName(r.Name)), nil
			}
		}
	}
	return "", nil
}

func derefName(n *string) string {
	if n == nil {
		return ""
	}
	return *n
}

// command runs `meterline args...` in-process until it returns, with a
// deadline, and returns its exit status and everything it wrote.
func command(t *testing.T, d time.Duration, stdin string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out testenv.SyncBuffer
	code := Main(ctx, args, IO{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &out})
	if ctx.Err() != nil {
		t.Fatalf("meterline %s did not end within %s:\n%s", args[0], d, testenv.Tail(out.String(), 30))
	}
	return code, out.String()
}

// background runs a long-running command (a stage) until stop, which
// requires exit status 0.
type background struct {
	name   string
	cancel context.CancelFunc
	done   chan int
	logs   *testenv.SyncBuffer
}

func start(t *testing.T, name string, args ...string) *background {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b := &background{name: name, cancel: cancel, done: make(chan int, 1), logs: &testenv.SyncBuffer{}}
	go func() { b.done <- Main(ctx, args, IO{Stdin: strings.NewReader(""), Stdout: b.logs, Stderr: b.logs}) }()
	t.Cleanup(func() { b.stop(t) })
	return b
}

func (b *background) stop(t *testing.T) {
	t.Helper()
	if b.cancel == nil {
		return
	}
	b.cancel()
	b.cancel = nil
	select {
	case code := <-b.done:
		if code != 0 {
			t.Errorf("%s exited %d:\n%s", b.name, code, testenv.Tail(b.logs.String(), 40))
		}
	case <-time.After(90 * time.Second):
		t.Errorf("%s did not stop within 90 s", b.name)
	}
}

// securedTopics creates the topics with prefix as admin and deletes them
// when the test ends.
func securedTopics(t *testing.T, k testenv.SecuredKafka, prefix string, parts int32) topics.Names {
	t.Helper()
	names := topics.DefaultNames()
	names.Prefix = prefix
	adm := k.Admin(t)
	layout := topics.DefaultLayout()
	layout.Partitions = parts
	specs := topics.Specs(names, layout)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Cleanup(func() {
		var all []string
		for _, s := range specs {
			all = append(all, s.Name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, all...)
	})
	if _, err := topics.Create(ctx, adm, specs, -1); err != nil {
		t.Fatal(err)
	}
	return names
}

// securedEvents writes n unique events (and copies of every tenth) as an
// NDJSON file and returns it with the sum of the unique quantities.
func securedEvents(t *testing.T, n int) (string, int, int64) {
	t.Helper()
	var b strings.Builder
	var sum int64
	copies := 0
	now := time.Now().Add(-time.Minute).UTC()
	for i := 0; i < n; i++ {
		q := int64(1 + i%9)
		sum += q
		line := fmt.Sprintf(`{"event_id":"sec-%d","customer_id":"cust-%d","meter":"api_calls","quantity":%d,"event_time":"%s","source":"secured-test"}`,
			i, i%7, q, now.Add(time.Duration(i)*time.Millisecond).Format(time.RFC3339Nano))
		b.WriteString(line + "\n")
		if i%10 == 0 {
			b.WriteString(line + "\n")
			copies++
		}
	}
	p := filepath.Join(t.TempDir(), "events.ndjson")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p, copies, sum
}

// secrets are the passwords a secured test uses, the first line of each
// TLS key's body and the secrets of the dedup key ring keysFile, none of
// which may appear in any output.
func secrets(t *testing.T, k testenv.SecuredKafka, ch testenv.SecuredClickHouse, keysFile string) []string {
	t.Helper()
	var s []string
	ring, err := os.ReadFile(keysFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(ring)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 || len(f[1]) < 64 {
			t.Fatalf("%s: line %q is not <id> <secret hex>", keysFile, l)
		}
		s = append(s, f[1])
	}
	for _, u := range []string{"admin", "meterline", "producer", "dedup", "aggregate", "sink", "operator"} {
		s = append(s, k.Password(t, u))
	}
	s = append(s, ch.Password(t))
	for _, f := range []string{k.TLS().KeyFile, ch.TLS().KeyFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		if len(lines) < 2 || len(lines[1]) < 40 {
			t.Fatalf("%s: not a PEM key", f)
		}
		s = append(s, lines[1][:40])
	}
	return s
}

func requireNoSecrets(t *testing.T, secrets []string, what, text string) {
	t.Helper()
	if strings.TrimSpace(text) == "" {
		t.Fatalf("%s is empty: nothing was searched", what)
	}
	for _, s := range secrets {
		if strings.Contains(text, s) {
			i := strings.Index(text, s)
			t.Errorf("%s shows a secret at byte %d: ...%s...", what, i, text[max(0, i-80):i])
		}
	}
}

// TestRealSecuredRun is the pipeline on the secured cluster: `topics
// create` and `check` as the operator, `produce` as the producer (its
// password in METERLINE_KAFKA_SASL_PASSWORD), `meterline run` with the
// sink as one principal over SASL/PLAIN and TLS into the password-protected
// ClickHouse over native TLS, and `lag` as the operator; each principal
// holds only the ACLs docs/operations.md lists for it. ClickHouse must hold
// every event exactly once, lag must reach zero, and no log line (at debug
// level, the Kafka client's included), no output and neither the status
// page nor /status.json nor /metrics may show a password or a TLS key.
func TestRealSecuredRun(t *testing.T) {
	k := testenv.RealKafkaSASL(t)
	ch := testenv.RealClickHouseSecure(t)
	conn, db := ch.DB(t)
	keys := testenv.DedupKeysFile(t)
	secret := secrets(t, k, ch, keys)
	prefix := testenv.Name(t, "secrun") + "."
	adm := k.Admin(t)
	docs := documentedACLs(t)
	grant(t, adm, docs, prefix, "operator", "operator")
	grant(t, adm, docs, prefix, "producer", "producer")
	grant(t, adm, docs, prefix, "meterline", "dedup", "aggregate", "sink")
	var outputs strings.Builder

	// Topics, as the operator.
	topicFlags := append(k.Flags("operator", kafka.ScramSHA512), "--topic-prefix", prefix, "--partitions", "2")
	code, out := command(t, 2*time.Minute, "", append([]string{"topics", "create"}, topicFlags...)...)
	outputs.WriteString(out)
	t.Cleanup(func() {
		var all []string
		names := topics.DefaultNames()
		names.Prefix = prefix
		for _, s := range topics.Specs(names, topics.DefaultLayout()) {
			all = append(all, s.Name)
		}
		_, _ = adm.DeleteTopics(context.Background(), all...)
	})
	if code != 0 || !strings.Contains(out, "topics match") {
		t.Fatalf("topics create: exit %d\n%s", code, out)
	}
	code, out = command(t, time.Minute, "", append([]string{"topics", "check"}, topicFlags...)...)
	outputs.WriteString(out)
	if code != 0 || !strings.Contains(out, "topics match") {
		t.Fatalf("topics check: exit %d\n%s", code, out)
	}

	// Events, as the producer, the password from the environment.
	file, copies, sum := securedEvents(t, 300)
	prodFlags := k.Flags("producer", kafka.ScramSHA512)
	prodFlags = slicesWithout(prodFlags, "--kafka-sasl-password-file", k.PasswordFile("producer"))
	t.Setenv(EnvKafkaSASLPassword, k.Password(t, "producer"))
	code, out = command(t, time.Minute, "", append([]string{"produce", "--file", file, "--topic-prefix", prefix, "--log-level", "debug"}, prodFlags...)...)
	os.Unsetenv(EnvKafkaSASLPassword)
	outputs.WriteString(out)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("%d sent, 0 bad, 0 failed", 300+copies)) {
		t.Fatalf("produce: exit %d\n%s", code, out)
	}

	// The pipeline, as one principal, PLAIN over TLS.
	metrics := testenv.FreeAddr(t)
	groups := map[string]string{"dedup": prefix + "meterline-dedup", "aggregate": prefix + "meterline-aggregate-v2", "sink": prefix + "meterline-sink"}
	args := append([]string{"run", "--log-level", "debug", "--topic-prefix", prefix,
		"--instance-id", "node-1", "--state-dir", t.TempDir(), "--metrics-addr", metrics, "--dedup-tick-interval", "1h", "--session-timeout", "6s",
		"--dedup-group", groups["dedup"], "--aggregate-group", groups["aggregate"], "--sink-group", groups["sink"],
		"--sink-database", db, "--sink-migrate", "--sink-max-batch-wait", "200ms", "--sink-commit-interval", "300ms", "--dedup-keys-file", keys},
		append(k.Flags("meterline", kafka.Plain), ch.Flags()...)...)
	run := start(t, "meterline run", args...)
	waitHTTP(t, "http://"+metrics+"/readyz", 200, 2*time.Minute, run.done, run.logs)
	want := map[string]int64{"usage_events": 300, "usage_duplicates": int64(copies), "usage_rejected": 0, "usage_adjustments": 0}
	waitSecuredCounts(t, conn, want, 2*time.Minute)
	var got int64
	if err := conn.QueryRow(ctxT(t, 30*time.Second), "SELECT sum(quantity) FROM usage_events").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != sum {
		t.Fatalf("sum(quantity) = %d, want %d", got, sum)
	}

	// Lag, as the operator: every group caught up.
	lagArgs := append([]string{"lag", "--group", groups["dedup"], "--group", groups["aggregate"], "--group", groups["sink"]},
		k.Flags("operator", kafka.ScramSHA512)...)
	deadline := time.Now().Add(time.Minute)
	for {
		code, out = command(t, time.Minute, "", lagArgs...)
		if code != 0 {
			t.Fatalf("lag: exit %d\n%s", code, out)
		}
		// dedup's and the aggregator's partitions at least; the sink's
		// too once it has committed on them.
		if m := lagSummary.FindStringSubmatch(out); m != nil && m[2] == "0" {
			if n, _ := strconv.Atoi(m[1]); n >= 4 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("lag not zero for all three groups after a minute:\n%s", out)
		}
		time.Sleep(time.Second)
	}
	outputs.WriteString(out)

	// No secret anywhere.
	pages := scrape(t, "http://"+metrics+"/status.json") + scrape(t, "http://"+metrics+"/") + scrape(t, "http://"+metrics+"/metrics")
	run.stop(t)
	logs := run.logs.String()
	if !strings.Contains(logs, `"level":"debug"`) {
		t.Fatalf("run logged nothing at debug level: the search would prove little\n%s", testenv.Tail(logs, 10))
	}
	requireNoSecrets(t, secret, "meterline run's log", logs)
	requireNoSecrets(t, secret, "the other commands' output", outputs.String())
	requireNoSecrets(t, secret, "the status page, /status.json and /metrics", pages)
	t.Logf("searched %d log lines (%d bytes) of meterline run, %d bytes of other output, %d bytes of pages for %d secrets",
		strings.Count(logs, "\n"), len(logs), outputs.Len(), len(pages), len(secret))
}

// lagSummary is the last line of `meterline lag`.
var lagSummary = regexp.MustCompile(`(\d+) partitions, (\d+) behind`)

func slicesWithout(s []string, drop ...string) []string {
	var out []string
	for _, v := range s {
		keep := true
		for _, d := range drop {
			if v == d {
				keep = false
			}
		}
		if keep {
			out = append(out, v)
		}
	}
	return out
}

func waitSecuredCounts(t *testing.T, conn driver.Conn, want map[string]int64, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		have := map[string]int64{}
		for tbl := range want {
			var n uint64
			if err := conn.QueryRow(ctxT(t, 30*time.Second), "SELECT count() FROM "+tbl).Scan(&n); err != nil {
				t.Fatalf("count %s: %v", tbl, err)
			}
			have[tbl] = int64(n)
			if have[tbl] > want[tbl] {
				t.Fatalf("%s holds %d rows, more than %d", tbl, n, want[tbl])
			}
		}
		if equalMaps(have, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ClickHouse counts %v, want %v after %s", have, want, d)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestRealSecuredACLs runs each stage as its own principal with exactly
// the ACLs docs/operations.md lists for it (read from the file), on the
// broker with the authorizer on, and makes every stage use every ACL it
// is given: the producer writes usage.events and is refused
// usage.deduped, usage.aggregates and both changelogs; the operator
// creates an API key and the HTTP ingest reads the balances (its quota
// gate) and accepts an event with it; dedup appends
// ticks to usage.events and writes a first copy, a duplicate and a
// rejection; the aggregator writes revisions, an adjustment (an event
// whose month ended past the grace) and a rejection (an undeclared
// meter); the sink parks a row ClickHouse refuses in usage.rejected; and
// dedup and the aggregator, restarted without their state, restore it
// from their changelogs. Every count in ClickHouse must come out exact.
func TestRealSecuredACLs(t *testing.T) {
	k := testenv.RealKafkaSASL(t)
	ch := testenv.RealClickHouseSecure(t)
	parallelWaitingTest(t, &scriptBrokerLane)
	conn, db := ch.DB(t)
	prefix := testenv.Name(t, "secacl") + "."
	names := securedTopics(t, k, prefix, 2)
	adm := k.Admin(t)
	docs := documentedACLs(t)
	for _, p := range []string{"producer", "dedup", "aggregate", "sink"} {
		grant(t, adm, docs, prefix, p, p)
	}

	// The sink's tables, migrated over TLS with the password; then one
	// customer's rows are refused by the server, for the sink to park.
	code, out := command(t, time.Minute, "", append([]string{"migrate", "--database", db}, ch.Flags()...)...)
	if code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, out)
	}
	if err := conn.Exec(ctxT(t, time.Minute), "ALTER TABLE "+db+".usage_events ADD COLUMN poison UInt8 MATERIALIZED throwIf(customer_id = 'poison')"); err != nil {
		t.Fatal(err)
	}

	// The producer: usage.events, nothing else.
	pcfg := k.Config(t, "producer", kafka.ScramSHA512)
	tc, err := pcfg.TLS.Load()
	if err != nil {
		t.Fatal(err)
	}
	p, err := producer.New(producer.WithBrokers(pcfg.Brokers...), producer.WithTLS(tc), producer.WithSASL(pcfg.Mechanism()),
		producer.WithTopic(names.EventsTopic()), producer.WithSource("acl-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	send := func(e producer.Event) {
		t.Helper()
		if err := p.Send(ctxT(t, 30*time.Second), e); err != nil {
			t.Fatalf("the producer cannot write %s: %v", names.EventsTopic(), err)
		}
	}
	now := time.Now().Add(-time.Minute)
	const n = 120
	var sum int64
	for i := 0; i < n; i++ {
		e := producer.Event{EventID: fmt.Sprintf("acl-%d", i), CustomerID: fmt.Sprintf("c%d", i%5), Meter: "tokens",
			Quantity: int64(i%4 + 1), EventTime: now.Add(time.Duration(i) * time.Millisecond)}
		sum += e.Quantity
		send(e)
		if i == 7 {
			send(e) // a copy: dedup writes usage.duplicates
		}
	}
	// Its month ended more than a day ago: past the aggregator's grace of
	// an hour, an adjustment.
	send(producer.Event{EventID: "late", CustomerID: "c1", Meter: "tokens", Quantity: 5, EventTime: time.Now().Add(-32 * 24 * time.Hour)})
	// Not declared with --strict-meters: the aggregator rejects it.
	send(producer.Event{EventID: "undeclared", CustomerID: "c1", Meter: "undeclared", Quantity: 1, EventTime: now})
	// Counted, but refused by ClickHouse: the sink parks it.
	send(producer.Event{EventID: "poison", CustomerID: "poison", Meter: "tokens", Quantity: 1, EventTime: now})
	forged, err := kafka.NewClient(pcfg, kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RequestRetries(1), kgo.RecordDeliveryTimeout(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer forged.Close()
	// Not Avro: dedup rejects it (usage.rejected).
	if err := forged.ProduceSync(ctxT(t, 30*time.Second), &kgo.Record{Topic: names.EventsTopic(), Key: []byte("garbage"), Value: []byte("not avro")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{names.DedupedTopic(), names.AggregatesTopic(), names.DedupChangelogTopic(), names.AggregateChangelogTopic()} {
		err := forged.ProduceSync(ctxT(t, 30*time.Second), &kgo.Record{Topic: topic, Value: []byte("forged")}).FirstErr()
		if !errors.Is(err, kerr.TopicAuthorizationFailed) {
			t.Errorf("the producer writing %s: %v, want TOPIC_AUTHORIZATION_FAILED", topic, err)
		}
	}

	// The HTTP ingest, as its own principal, with a key the key
	// administrator made.
	grant(t, adm, docs, prefix, "keyadmin", "keyadmin")
	grant(t, adm, docs, prefix, "ingest", "ingest")
	code, token, errOut := run(t, "", append([]string{"keys", "create", "--tenant", "acme", "--allow-customers", "c*", "--topic-prefix", prefix},
		k.Flags("keyadmin", kafka.ScramSHA512)...)...)
	token = strings.TrimSpace(token)
	if code != 0 || !strings.HasPrefix(token, "mlk_") {
		t.Fatalf("keys create as the key administrator: exit %d, stdout %q\n%s", code, token, errOut)
	}
	ingestAddr, ingestMetrics := testenv.FreeAddr(t), testenv.FreeAddr(t)
	ing := start(t, "meterline ingest", append([]string{"ingest", "--log-level", "info", "--topic-prefix", prefix,
		"--addr", ingestAddr, "--metrics-addr", ingestMetrics}, k.Flags("ingest", kafka.ScramSHA512)...)...)
	waitHTTP(t, "http://"+ingestMetrics+"/readyz", 200, 2*time.Minute, ing.done, ing.logs)
	// The quota gate reads usage.balances as User:ingest.
	for deadline := time.Now().Add(time.Minute); !strings.Contains(scrape(t, "http://"+ingestMetrics+"/metrics"), "\nmeterline_ingest_balances_loaded 1\n"); {
		if time.Now().After(deadline) {
			t.Fatalf("the ingest did not load the balances topic as User:ingest in a minute\n%s", testenv.Tail(ing.logs.String(), 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	body := fmt.Sprintf(`{"event_id":"http-1","customer_id":"c2","meter":"tokens","quantity":3,"event_time":%q}`, now.UTC().Format(time.RFC3339Nano))
	req, err := http.NewRequest(http.MethodPost, "http://"+ingestAddr+"/v1/events", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /v1/events as User:ingest: %d %s\n%s", resp.StatusCode, answer, testenv.Tail(ing.logs.String(), 20))
	}
	ing.stop(t)
	sum += 3

	// The stages, each as its own principal.
	meters := filepath.Join(t.TempDir(), "meters.yaml")
	if err := os.WriteFile(meters, []byte("meters:\n  - {name: tokens, aggregation: SUM}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--log-level", "info", "--topic-prefix", prefix, "--instance-id", "node-1", "--session-timeout", "6s"}
	stage := func(name, user string, extra ...string) *background {
		args := append(append(append([]string{name}, base...), extra...), k.Flags(user, kafka.ScramSHA512)...)
		return start(t, "meterline "+name, args...)
	}
	metrics := map[string]string{"dedup": testenv.FreeAddr(t), "aggregate": testenv.FreeAddr(t), "sink": testenv.FreeAddr(t)}
	keys := testenv.DedupKeysFile(t)
	dedupArgs := func() []string {
		return []string{"--group", prefix + "meterline-dedup", "--state-dir", t.TempDir(), "--metrics-addr", metrics["dedup"], "--tick-interval", "1s",
			"--dedup-keys-file", keys}
	}
	aggArgs := func() []string {
		return []string{"--group", prefix + "meterline-aggregate-v2", "--state-dir", t.TempDir(), "--metrics-addr", metrics["aggregate"],
			"--meters", meters, "--strict-meters", "--grace", "1h"}
	}
	dedup := stage("dedup", "dedup", dedupArgs()...)
	agg := stage("aggregate", "aggregate", aggArgs()...)
	sink := stage("sink", "sink", append([]string{"--group", prefix + "meterline-sink", "--metrics-addr", metrics["sink"],
		"--database", db, "--max-batch-wait", "200ms", "--commit-interval", "300ms"}, ch.Flags()...)...)
	for s, b := range map[string]*background{"dedup": dedup, "aggregate": agg, "sink": sink} {
		waitHTTP(t, "http://"+metrics[s]+"/readyz", 200, 2*time.Minute, b.done, b.logs)
	}
	waitSecuredCounts(t, conn, map[string]int64{"usage_events": n + 3, "usage_duplicates": 1, "usage_rejected": 3, "usage_adjustments": 1}, 2*time.Minute)
	for _, c := range []struct{ where string }{
		{"stage = 'dedup' AND reason = 'undecodable'"}, {"stage = 'aggregator' AND reason = 'unknown_meter'"}, {"stage = 'sink' AND reason = 'uninsertable'"},
	} {
		var m uint64
		if err := conn.QueryRow(ctxT(t, 30*time.Second), "SELECT count() FROM usage_rejected WHERE "+c.where).Scan(&m); err != nil {
			t.Fatal(err)
		}
		if m != 1 {
			t.Errorf("usage_rejected has %d rows with %s, want 1", m, c.where)
		}
	}
	var total int64
	deadline := time.Now().Add(time.Minute)
	for {
		if err := conn.QueryRow(ctxT(t, 30*time.Second),
			"SELECT toInt64(sum(v)) FROM (SELECT argMax(value, revision) AS v FROM usage_aggregates GROUP BY customer_id, meter, group_key, period_start)").Scan(&total); err != nil {
			t.Fatal(err)
		}
		if total == sum+1 { // the main events and the parked one
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the latest aggregate revisions sum to %d, want %d", total, sum+1)
		}
		time.Sleep(250 * time.Millisecond)
	}

	// Without their state, dedup and the aggregator restore it from their
	// changelogs (Read).
	dedup.stop(t)
	agg.stop(t)
	dedup = stage("dedup", "dedup", dedupArgs()...)
	agg = stage("aggregate", "aggregate", aggArgs()...)
	for s, b := range map[string]*background{"dedup": dedup, "aggregate": agg} {
		waitHTTP(t, "http://"+metrics[s]+"/readyz", 200, 2*time.Minute, b.done, b.logs)
		deadline := time.Now().Add(time.Minute)
		for {
			m := scrape(t, "http://"+metrics[s]+"/metrics")
			owned, _ := sample(m, `meterline_stream_owned_partitions{stage="`+s+`"}`)
			replayed, _ := sample(m, `meterline_stream_restore_records_total{stage="`+s+`"}`)
			if owned == 2 && replayed > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v partitions owned, %v changelog records restored; want 2 and some", s, owned, replayed)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	for _, b := range []*background{dedup, agg, sink} {
		b.stop(t)
	}
}

// TestRealSecuredWrongPassword: a wrong password fails fast, with a clear
// error naming the user and never the password, and a non-zero exit,
// having done nothing: `meterline run` with a wrong Kafka password and
// with a wrong ClickHouse password commits no offset and creates no
// table; `produce` writes nothing; `lag` and `topics check` print no
// table.
func TestRealSecuredWrongPassword(t *testing.T) {
	k := testenv.RealKafkaSASL(t)
	ch := testenv.RealClickHouseSecure(t)
	conn, db := ch.DB(t)
	prefix := testenv.Name(t, "secbad") + "."
	names := securedTopics(t, k, prefix, 2)
	adm := k.Admin(t)
	// Input waiting: a stage that ran would consume and commit it.
	admin, err := kafka.NewClient(k.Config(t, "admin", kafka.ScramSHA512))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	p, err := producer.New(producer.WithClient(admin), producer.WithTopic(names.EventsTopic()))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if err := p.Send(ctxT(t, 30*time.Second), producer.Event{EventID: fmt.Sprint(i), CustomerID: "c", Meter: "m", Quantity: 1,
			EventTime: time.Now().Add(-time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	endOffsets := func() int64 {
		ends, err := adm.ListEndOffsets(ctxT(t, 30*time.Second), names.EventsTopic())
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
		return n
	}
	before := endOffsets()

	wrongFile := filepath.Join(t.TempDir(), "wrong")
	const wrong = "definitely-not-the-password"
	if err := os.WriteFile(wrongFile, []byte(wrong), 0o600); err != nil {
		t.Fatal(err)
	}
	keys := testenv.DedupKeysFile(t)
	secret := append(secrets(t, k, ch, keys), wrong)
	kafkaFlags := func(user string) []string {
		f := k.Flags(user, kafka.ScramSHA512)
		for i := range f {
			if f[i] == k.PasswordFile(user) {
				f[i] = wrongFile
			}
		}
		return f
	}
	groups := []string{prefix + "meterline-dedup", prefix + "meterline-aggregate-v2", prefix + "meterline-sink"}
	runArgs := []string{"run", "--topic-prefix", prefix, "--instance-id", "node-1", "--state-dir", t.TempDir(),
		"--metrics-addr", testenv.FreeAddr(t), "--dedup-group", groups[0], "--aggregate-group", groups[1], "--sink-group", groups[2],
		"--sink-database", db, "--sink-migrate", "--dedup-keys-file", keys}
	nothingDone := func(what string) {
		t.Helper()
		for _, g := range groups {
			var offs kadm.OffsetResponses
			var err error
			for try := 0; try < 60; try++ { // a fresh broker creates __consumer_offsets on first use
				offs, err = adm.FetchOffsets(ctxT(t, 30*time.Second), g)
				if !errors.Is(err, kerr.CoordinatorNotAvailable) && !errors.Is(err, kerr.CoordinatorLoadInProgress) {
					break
				}
				time.Sleep(500 * time.Millisecond)
			}
			if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
				t.Fatalf("%s: offsets of %s: %v", what, g, err)
			}
			if len(offs) > 0 {
				t.Errorf("%s: group %s committed offsets: %v", what, g, offs)
			}
		}
		var tables uint64
		if err := conn.QueryRow(ctxT(t, 30*time.Second), "SELECT count() FROM system.tables WHERE database = '"+db+"'").Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if tables != 0 {
			t.Errorf("%s: database %s has %d tables", what, db, tables)
		}
	}
	expectRefused := func(what string, d time.Duration, want []string, args ...string) {
		t.Helper()
		began := time.Now()
		code, out := command(t, d, "", args...)
		t.Logf("%s: exit %d after %s: %s", what, code, time.Since(began).Round(time.Millisecond), strings.TrimSpace(testenv.Tail(out, 2)))
		if code == 0 {
			t.Errorf("%s: exit 0, want non-zero:\n%s", what, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", what, w, out)
			}
		}
		requireNoSecrets(t, secret, what, out)
	}

	// With --sink-migrate: the check comes before the migrations too.
	expectRefused("run with a wrong Kafka password", 30*time.Second, []string{"authentication failed", `"meterline"`, "SCRAM-SHA-512"},
		append(append(runArgs, kafkaFlags("meterline")...), ch.Flags()...)...)
	nothingDone("run with a wrong Kafka password")

	t.Setenv(EnvClickHousePassword, wrong)
	chFlags := slicesWithout(ch.Flags(), "--clickhouse-password-file", ch.PasswordFile)
	// As a super user and without --sink-migrate: nothing but the check
	// would stop dedup and the aggregator before they commit.
	expectRefused("run with a wrong ClickHouse password", 30*time.Second, []string{"clickhouse authentication failed", `"default"`},
		append(append(slicesWithout(runArgs, "--sink-migrate"), k.Flags("admin", kafka.ScramSHA512)...), chFlags...)...)
	os.Unsetenv(EnvClickHousePassword)
	nothingDone("run with a wrong ClickHouse password")

	file, _, _ := securedEvents(t, 5)
	expectRefused("produce with a wrong password", 30*time.Second, []string{"authentication failed", `"producer"`},
		append([]string{"produce", "--file", file, "--topic-prefix", prefix}, kafkaFlags("producer")...)...)
	if after := endOffsets(); after != before {
		t.Errorf("produce with a wrong password: %s grew from %d to %d records", names.EventsTopic(), before, after)
	}
	expectRefused("lag with a wrong password", 30*time.Second, []string{"authentication failed", `"operator"`},
		append([]string{"lag", "--group", groups[0]}, kafkaFlags("operator")...)...)
	expectRefused("topics check with a wrong password", 30*time.Second, []string{"authentication failed", `"operator"`},
		append([]string{"topics", "check", "--topic-prefix", prefix, "--partitions", "2"}, kafkaFlags("operator")...)...)
}

// TestRealSecuredAggregatorEntitlements: `meterline aggregate
// --entitlements`, as User:aggregate with exactly the ACLs
// docs/operations.md lists for it, starts and gets ready: it reads the
// message.timestamp.type of usage.entitlements and usage.deduped at start
// (DescribeConfigs), and refuses a topic it cannot describe.
func TestRealSecuredAggregatorEntitlements(t *testing.T) {
	k := testenv.RealKafkaSASL(t)
	prefix := testenv.Name(t, "secent") + "."
	securedTopics(t, k, prefix, 1)
	grant(t, k.Admin(t), documentedACLs(t), prefix, "aggregate", "aggregate")
	meters := filepath.Join(t.TempDir(), "meters.yaml")
	if err := os.WriteFile(meters, []byte("meters:\n  - {name: tokens, aggregation: SUM}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	metrics := testenv.FreeAddr(t)
	args := append([]string{"aggregate", "--log-level", "info", "--topic-prefix", prefix, "--instance-id", "node-1",
		"--session-timeout", "6s", "--group", prefix + "meterline-aggregate-v2", "--state-dir", t.TempDir(),
		"--metrics-addr", metrics, "--meters", meters, "--entitlements"}, k.Flags("aggregate", kafka.ScramSHA512)...)
	agg := start(t, "meterline aggregate --entitlements", args...)
	waitHTTP(t, "http://"+metrics+"/readyz", 200, 2*time.Minute, agg.done, agg.logs)
}
