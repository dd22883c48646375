package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"sigs.k8s.io/yaml"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsCommands writes and reads entitlements, the default plan
// and the rate card with `meterline entitlements`, on kfake and, when
// METERLINE_TEST_KAFKA is set, on the real broker: each record lands on
// its canonical partition (or on every partition), reads back as written
// (what get prints, set accepts), a bad document is refused with every
// problem named by its field path and nothing written, and delete hides a
// customer from list and get.
func TestEntitlementsCommands(t *testing.T) {
	onKafkas(t, testEntitlementsCommands)
}

// onKafkas runs fn on kfake, then on the real broker (skipped, saying
// so, without METERLINE_TEST_KAFKA or with -short).
func onKafkas(t *testing.T, fn func(t *testing.T, brokers []string)) {
	t.Run("kfake", func(t *testing.T) {
		_, brokers := testenv.KFake(t)
		fn(t, brokers)
	})
	t.Run("real-kafka", func(t *testing.T) { fn(t, testenv.RealKafka(t)) })
}

func testEntitlementsCommands(t *testing.T, brokers []string) {
	names := testenv.Topics(t, brokers, "ent", testenv.TopicsOpts{})
	prefix := names.Prefix
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	file := tempFiles(t)
	ent := func(args ...string) (int, string, string) {
		t.Helper()
		return run(t, "", append(append([]string{"entitlements"}, args...), "--brokers", strings.Join(brokers, ","), "--topic-prefix", prefix,
			"--transactional-id", testenv.Name(t, "ent-writer"))...)
	}
	read := func(args ...string) (int, string, string) {
		t.Helper()
		return run(t, "", append(append([]string{"entitlements"}, args...), "--brokers", strings.Join(brokers, ","), "--topic-prefix", prefix)...)
	}
	topic := names.EntitlementsTopic()
	count := func() int { return len(testenv.ReadAll(t, brokers, topic)) }

	acme := file("acme.yaml", `
customer: acme
plan: free
caps:
  api_calls: {limit: 1000}
  tokens: {limit: 5000000, on_limit: allow}
grants:
  welcome: {amount: 5000000, expires_at: "2030-01-01T00:00:00Z"}
overdraft: {policy: deny}
`)
	code, out, errOut := ent("set", "-f", acme)
	if code != 0 || !strings.Contains(out, "wrote the entitlements record of acme to "+topic+" partition") {
		t.Fatalf("set: %d\n%s\n%s", code, out, errOut)
	}
	// Off by default in the aggregator: the writer says where it applies.
	if !strings.Contains(errOut, "only by an aggregator that runs with --entitlements") {
		t.Errorf("set says nothing of --entitlements on stderr:\n%s", errOut)
	}
	recs := testenv.ReadAll(t, brokers, topic)
	if len(recs) != 1 || string(recs[0].Key) != "4:acme" || recs[0].Partition != schemas.Partition([]byte("4:acme"), 4) {
		t.Fatalf("records after set: %+v", recs)
	}

	// What get prints, set reads back to the same record.
	code, out, errOut = read("get", "acme")
	if code != 0 {
		t.Fatalf("get: %d\n%s\n%s", code, out, errOut)
	}
	d, err := entitlements.ParseDocument([]byte(out))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if d.WrittenAt == "" || d.Caps["api_calls"].Limit.V != 1000 || d.Grants["welcome"].Amount.V != 5000000 || d.Overdraft.Policy != "deny" {
		t.Fatalf("get printed:\n%s", out)
	}
	again := file("again.yaml", out)
	if code, out, errOut = ent("set", "-f", again); code != 0 {
		t.Fatalf("set from get's output: %d\n%s\n%s", code, out, errOut)
	}
	recs = testenv.ReadAll(t, brokers, topic)
	if len(recs) != 2 || string(recs[0].Value) != string(recs[1].Value) {
		t.Fatalf("the record written from get's output differs from the first")
	}

	// Every problem at once, with its field path; nothing written.
	bad := file("bad.yaml", `
plan: free
caps:
  api_calls: {limit: 0}
  peak: {limit: 3}
grants:
  welcome: {amount: -5, expires_at: "soon"}
overdraft: {policy: sometimes}
`)
	meters := file("meters.yaml", "meters:\n  - name: api_calls\n  - name: peak\n    aggregation: MAX\n")
	before := count()
	code, out, errOut = ent("set", "globex", "-f", bad, "--meters", meters)
	if code != 1 {
		t.Fatalf("set of a bad document: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{
		"caps.api_calls.limit: must be positive (got 0)",
		"caps.peak: peak is a MAX meter: caps apply to SUM and COUNT meters only",
		"grants.welcome.amount: must be positive (got -5)",
		`grants.welcome.expires_at: not an RFC 3339 time`,
		`overdraft.policy: must be allow or deny (got "sometimes")`,
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if n := count(); n != before {
		t.Fatalf("a refused document wrote %d records", n-before)
	}
	globex := file("globex.yaml", "plan: payg\n")
	if code, out, _ = ent("set", "globex", "-f", globex, "--validate"); code != 0 || !strings.Contains(out, "valid") || count() != before {
		t.Fatalf("--validate: %d %s, %d records", code, out, count()-before)
	}
	if code, out, errOut = ent("set", "globex", "-f", globex); code != 0 {
		t.Fatalf("set globex: %d\n%s\n%s", code, out, errOut)
	}

	// The default plan and the rate card go to every partition.
	def := file("default.yaml", "plan: free\ncaps: {api_calls: {limit: 100}}\noverdraft: {policy: deny}\n")
	if code, out, errOut = ent("set-default", "-f", def); code != 0 || !strings.Contains(out, "to all 4 partitions") {
		t.Fatalf("set-default: %d\n%s\n%s", code, out, errOut)
	}
	rates := file("rates.yaml", `
versions:
  - effective_from: "2026-12-01T00:00:00Z"
    rates: {api_calls: 1000, tokens: 15/1000}
  - effective_from: "2026-12-15T00:00:00Z"
    rates: {api_calls: 1200, tokens: 15/1000}
`)
	if code, out, errOut = ent("set-rates", "-f", rates); code != 0 {
		t.Fatalf("set-rates: %d\n%s\n%s", code, out, errOut)
	}
	perPartition := map[string]map[int32]bool{}
	for _, r := range testenv.ReadAll(t, brokers, topic) {
		if perPartition[string(r.Key)] == nil {
			perPartition[string(r.Key)] = map[int32]bool{}
		}
		perPartition[string(r.Key)][r.Partition] = true
	}
	for _, k := range []string{schemas.DefaultPlanKey, schemas.RateCardKey} {
		if len(perPartition[k]) != 4 {
			t.Errorf("%s is on partitions %v, want all 4", k, perPartition[k])
		}
	}
	code, out, errOut = read("get", "--rates", "-o", "json")
	if code != 0 {
		t.Fatalf("get --rates: %d\n%s\n%s", code, out, errOut)
	}
	var rd entitlements.RatesDocument
	if err := json.Unmarshal([]byte(out), &rd); err != nil || len(rd.Versions) != 2 || rd.Versions[1].Rates["api_calls"] != "1200" ||
		rd.Versions[0].Rates["tokens"] != "15/1000" {
		t.Fatalf("get --rates -o json: %v\n%s", err, out)
	}
	if code, out, _ = read("get", "--default"); code != 0 || !strings.Contains(out, "limit: 100") {
		t.Fatalf("get --default: %d\n%s", code, out)
	}

	// list, delete.
	code, out, _ = read("list")
	if code != 0 || strings.Count(out, "customer: ") != 2 || !strings.Contains(out, "customer: acme") || !strings.Contains(out, "customer: globex") {
		t.Fatalf("list: %d\n%s", code, out)
	}
	if code, out, errOut = ent("delete", "globex"); code != 0 {
		t.Fatalf("delete: %d\n%s\n%s", code, out, errOut)
	}
	var ys []map[string]any
	code, out, _ = read("list", "-o", "json")
	if err := json.Unmarshal([]byte(out), &ys); code != 0 || err != nil || len(ys) != 1 || ys[0]["customer"] != "acme" {
		t.Fatalf("list after delete: %d %v\n%s", code, err, out)
	}
	if code, _, errOut = read("get", "globex"); code != 1 || !strings.Contains(errOut, "deleted") {
		t.Fatalf("get of a deleted customer: %d %s", code, errOut)
	}
	if code, _, errOut = read("get", "initech"); code != 1 || !strings.Contains(errOut, "initech has no entitlements: the default plan applies") {
		t.Fatalf("get of an unknown customer: %d %s", code, errOut)
	}

	// A default plan that did not reach every partition is reported.
	other, _ := schemas.Encode(&schemas.Entitlements{Plan: "other", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 2, Key: []byte(schemas.DefaultPlanKey), Value: other}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut = read("get", "--default"); code != 1 || !strings.Contains(errOut, "not the same on every partition (missing on [], different from partition 0 on [2])") {
		t.Fatalf("get --default with partition 2 different: %d %s", code, errOut)
	}
}

// TestEntitlementsBalance reads customers' balances back with `meterline
// entitlements balance`, on kfake and, when METERLINE_TEST_KAFKA is set,
// on the real broker: the customer's latest record of usage.balances on
// its partition is printed (usage against each cap with the share used,
// credits per grant and in all, the overdraft, the record it came from),
// another customer's records and records of other partitions are not, a
// customer without a balance exits 1 saying so, and a record that is not
// a balance is an error naming its offset, not a crash.
func TestEntitlementsBalance(t *testing.T) {
	onKafkas(t, testEntitlementsBalance)
}

func testEntitlementsBalance(t *testing.T, brokers []string) {
	names := testenv.Topics(t, brokers, "bal", testenv.TopicsOpts{})
	topic := names.BalancesTopic()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	balance := func(args ...string) (int, string, string) {
		t.Helper()
		return run(t, "", append(append([]string{"entitlements", "balance"}, args...),
			"--brokers", strings.Join(brokers, ","), "--topic-prefix", names.Prefix)...)
	}
	counts := testenv.Admin(t, brokers)
	td, err := counts.ListTopics(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	n := int32(len(td[topic].Partitions))
	if n < 2 {
		t.Fatalf("%s has %d partitions; the test needs 2 or more", topic, n)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	put := func(p int32, key []byte, m schemas.Message) int64 {
		t.Helper()
		var v []byte
		if m != nil {
			if v, err = schemas.Encode(m); err != nil {
				t.Fatal(err)
			}
		}
		r, err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Key: key, Value: v}).First()
		if err != nil {
			t.Fatal(err)
		}
		return r.Offset
	}
	day := func(d int) int64 { return time.Date(2026, 12, d, 0, 0, 0, 0, time.UTC).UnixMilli() }
	bal := func(customer string, rev, usage, consumed int64) *schemas.Balance {
		return &schemas.Balance{CustomerID: customer, Plan: "free", Revision: rev, UpdatedAt: day(2) + rev,
			PeriodStart: day(1), PeriodEnd: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli(),
			Meters: []schemas.MeterBalance{{Meter: "api_calls", Usage: usage, Limit: 1000, OnLimit: schemas.OnLimitReject}},
			Grants: []schemas.GrantBalance{
				{ID: "welcome", Amount: 5_000_000, Consumed: consumed, Remaining: 5_000_000 - consumed, ExpiresAt: day(31)},
				{ID: "promo", Priority: 1, EffectiveFrom: day(1), Amount: 1_000, Remaining: 1_000},
			},
			OverdraftPolicy: schemas.OverdraftDeny}
	}
	acme := schemas.CustomerKey("acme")
	pa := schemas.Partition(acme, n)
	other := (pa + 1) % n
	put(pa, acme, bal("acme", 1, 100, 100_000))
	latest := put(pa, acme, bal("acme", 2, 875, 875_000))
	// Not acme's latest: another customer's on acme's partition, and a
	// stray record under acme's key on another partition.
	put(pa, schemas.CustomerKey("zed"), bal("zed", 3, 999, 1))
	put(other, acme, bal("acme", 9, 1, 1))

	code, out, errOut := balance("acme")
	if code != 0 {
		t.Fatalf("balance acme: %d\n%s\n%s", code, out, errOut)
	}
	var doc entitlements.BalanceDocument
	if err := yaml.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("balance acme printed no YAML document: %v\n%s", err, out)
	}
	want := entitlements.BalanceDocument{Customer: "acme", Plan: "free", AsOf: "2026-12-02T00:00:00.002Z", Revision: 2,
		PeriodStart: "2026-12-01T00:00:00.000Z", PeriodEnd: "2027-01-01T00:00:00.000Z",
		Meters: []entitlements.MeterBalanceDoc{{Meter: "api_calls", Usage: 875, Limit: 1000, OnLimit: "reject", UsedPercent: 87}},
		Grants: []entitlements.GrantBalanceDoc{
			{ID: "welcome", ExpiresAt: "2026-12-31T00:00:00.000Z", Amount: 5_000_000, Consumed: 875_000, Remaining: 4_125_000},
			{ID: "promo", Priority: 1, EffectiveFrom: "2026-12-01T00:00:00.000Z", Amount: 1_000, Remaining: 1_000},
		},
		Remaining: 4_126_000, Overdraft: entitlements.OverdraftBalanceDoc{Policy: "deny"},
		Source: &entitlements.BalanceSourceDoc{Topic: topic, Partition: pa, Offset: latest}}
	got, _ := json.Marshal(doc)
	if w, _ := json.Marshal(want); string(got) != string(w) {
		t.Errorf("balance acme:\n got %s\nwant %s", got, w)
	}
	if code, out, _ := balance("acme", "-o", "json"); code != 0 || !json.Valid([]byte(out)) || !strings.Contains(out, `"credits_remaining": 4126000`) {
		t.Errorf("balance acme -o json: %d\n%s", code, out)
	}

	code, _, errOut = balance("nobody")
	if code != 1 || !strings.Contains(errOut, "nobody has no balance in "+topic) {
		t.Errorf("balance nobody: exit %d, want 1 with the reason\n%s", code, errOut)
	}

	// A record that is not a balance under a customer's key.
	bad := schemas.CustomerKey("bad")
	off := put(schemas.Partition(bad, n), bad, &schemas.Watermark{Watermark: 1, SourcePartitions: 1})
	code, _, errOut = balance("bad")
	if code != 1 || !strings.Contains(errOut, "not a balance") || !strings.Contains(errOut, fmt.Sprintf("offset %d:", off)) {
		t.Errorf("balance of a record that is no balance: exit %d, want an error naming the offset\n%s", code, errOut)
	}
}
