package cli

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/sink"
)

// The tests of this file check what deploy/local/kafka.sh gives the users
// of a KAFKA_SECURITY=sasl_ssl broker: the documented ACLs
// (deploy/local/kafka/acls), on a fresh data dir and on one formatted
// before some of its users existed.

// scriptACLs are the ACLs of deploy/local/kafka/acls, expanded to one
// "principal op type name pattern" string each.
func scriptACLs(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "local", "kafka", "acls"))
	if err != nil {
		t.Fatal(err)
	}
	principal := regexp.MustCompile(`--allow-principal (\S+)\s*`)
	out := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		rest := principal.ReplaceAllString(l, "")
		for _, m := range principal.FindAllStringSubmatch(l, -1) {
			for _, a := range expandACL(parseACL(t, "kafka-acls.sh --allow-principal "+m[1]+" "+rest)) {
				out[a] = true
			}
		}
	}
	return out
}

// expandACL is one string for each operation on each resource of s.
func expandACL(s aclSpec) []string {
	pattern := "literal"
	if s.prefixed {
		pattern = "prefixed"
	}
	var out []string
	for _, op := range s.ops {
		add := func(typ string, names []string) {
			for _, n := range names {
				out = append(out, fmt.Sprintf("User:%s %v %s %s %s", s.principal, op, typ, n, pattern))
			}
		}
		add("topic", s.topics)
		add("group", s.groups)
		add("transactional-id", s.txnIDs)
		if s.cluster {
			add("cluster", []string{"kafka-cluster"})
		}
	}
	return out
}

// TestKafkaScriptACLsAreDocumented: the ACLs kafka.sh creates are exactly
// those docs/operations.md lists, and User:meterline (meterline run, with
// --ingest) holds those of ingest, dedup, aggregate and sink.
func TestKafkaScriptACLsAreDocumented(t *testing.T) {
	want := map[string]bool{}
	for principal, specs := range documentedACLs(t) {
		for _, s := range specs {
			for _, a := range expandACL(s) {
				want[a] = true
			}
			if slices.Contains([]string{"ingest", "dedup", "aggregate", "sink"}, principal) {
				s.principal = "meterline"
				for _, a := range expandACL(s) {
					want[a] = true
				}
			}
		}
	}
	sameACLs(t, want, scriptACLs(t), "deploy/local/kafka/acls lacks %s", "deploy/local/kafka/acls has %s, which docs/operations.md does not list")
}

// sameACLs reports, with the format lacks, each ACL of want that got
// lacks, and with extra each of got that want lacks.
func sameACLs(t *testing.T, want, got map[string]bool, lacks, extra string) {
	t.Helper()
	for a := range want {
		if !got[a] {
			t.Errorf(lacks, a)
		}
	}
	for a := range got {
		if !want[a] {
			t.Errorf(extra, a)
		}
	}
}

// TestRealSecuredKafkaScriptUsers: on the shared script broker
// (securedScriptBroker), which deploy/local/kafka.sh started first with the
// users of a data dir formatted before User:billing and User:keyadmin
// existed, then again on that data dir with the default users, creating
// those two: without a user added by the test, the billing system sets an
// entitlement, the key administrator creates an API key, the billing
// system may not write meterline.keys and the operator (who creates the
// topics) may write neither.
func TestRealSecuredKafkaScriptUsers(t *testing.T) {
	b := securedScriptBroker(t)
	if want := "created the SCRAM users billing keyadmin;"; !strings.Contains(b.restartOut, want) {
		t.Errorf("kafka.sh restart with the default users does not say %q", want)
	}
	k := b.k
	as := func(user string, args ...string) (int, string) {
		t.Helper()
		return command(t, time.Minute, "", append(args, k.Flags(user, kafka.ScramSHA512)...)...)
	}
	if code, out := as("operator", "topics", "create", "--partitions", "1"); code != 0 {
		t.Fatalf("topics create as the operator: exit %d\n%s", code, out)
	}
	plan := tempFiles(t)("acme.yaml", "plan: free\ncaps: {api_calls: {limit: 1000}}\n")
	if code, out := as("billing", "entitlements", "set", "acme", "-f", plan); code != 0 {
		t.Fatalf("entitlements set as the billing system: exit %d\n%s", code, out)
	}
	if code, out := as("keyadmin", "keys", "create", "--tenant", "acme", "--allow-customers", "acme"); code != 0 || !strings.Contains(out, "mlk_") {
		t.Fatalf("keys create as the key administrator: exit %d\n%s", code, out)
	}
	for _, user := range []string{"billing", "operator"} {
		if code, out := as(user, "keys", "create", "--tenant", "acme", "--allow-customers", "acme", "--timeout", "20s"); code == 0 || !strings.Contains(out, "AUTHORIZATION_FAILED") || strings.Contains(out, "mlk_") {
			t.Errorf("keys create as %s: exit %d, want a refusal\n%s", user, code, out)
		}
	}
	if code, out := as("operator", "entitlements", "set", "initech", "-f", plan); code == 0 || !strings.Contains(out, "AUTHORIZATION_FAILED") {
		t.Errorf("entitlements set as the operator: exit %d, want a refusal\n%s", code, out)
	}
}

// scriptPorts are the ports of a script broker, above the secured test
// broker's: the client port above + n, its controller's above + n + 1.
// A test holds lane while its broker runs.
type scriptPorts struct {
	above int
	lane  *sync.Mutex
}

var (
	// securedScriptPorts (+ 2 and + 3) are the shared script broker's
	// (securedScriptBroker).
	securedScriptPorts = scriptPorts{above: 2, lane: &scriptBrokerLane}
	// startFreshPorts (+ 4 and + 5) are TestRealKafkaScriptStartFresh's.
	startFreshPorts = scriptPorts{above: 4, lane: &otherLane}
)

// scriptRunner runs deploy/local/kafka.sh for one secured broker: on
// ports (and its controller on the next port) in a data dir.
type scriptRunner struct{ env []string }

// newScriptRunner is the runner of a secured broker on the ports of ports
// in dir; k connects to it once started.
func newScriptRunner(t *testing.T, ports scriptPorts, dir string) (scriptRunner, testenv.SecuredKafka) {
	t.Helper()
	seed := testenv.RealKafkaSASL(t).Brokers[0]
	port := testenv.PortAbove(t, seed, ports.above)
	env := []string{"KAFKA_PORT=" + port, "KAFKA_CONTROLLER_PORT=" + testenv.PortAbove(t, seed, ports.above+1), "KAFKA_DATA_DIR=" + dir,
		"KAFKA_SECURITY=sasl_ssl", "KAFKA_HEAP_OPTS=-Xms128m -Xmx256m"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KAFKA_") { // make exports KAFKA_PORT
			env = append(env, kv)
		}
	}
	return scriptRunner{env: env}, testenv.SecuredKafka{Brokers: []string{"127.0.0.1:" + port}, Dir: filepath.Join(dir, "security")}
}

// run runs the script (start, restart) with extra environment, logs its
// output to t and returns it; t fails if the script does.
func (r scriptRunner) run(t *testing.T, extra []string, args ...string) string {
	t.Helper()
	start := time.Now()
	out, err := r.command(extra, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("kafka.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("kafka.sh %s (%s):\n%s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond), out)
	return string(out)
}

func (r scriptRunner) command(extra []string, args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join("..", "..", "deploy", "local", "kafka.sh"), args...)
	c.Env = append(slices.Clone(r.env), extra...)
	return c
}

// scriptBroker is a secured broker of the test's own, run by
// deploy/local/kafka.sh on ports in a data dir of the test's, and stopped
// when the test ends: script runs the script (start, restart) with extra
// environment and returns its output; k connects to the broker once
// started. The test runs on the lane of its ports (parallelWaitingTest).
func scriptBroker(t *testing.T, ports scriptPorts) (script func(extra []string, args ...string) string, k testenv.SecuredKafka) {
	t.Helper()
	testenv.RealKafkaSASL(t)
	parallelWaitingTest(t, ports.lane)
	r, k := newScriptRunner(t, ports, t.TempDir())
	script = func(extra []string, args ...string) string {
		t.Helper()
		return r.run(t, extra, args...)
	}
	t.Cleanup(func() { script(nil, "stop") })
	return script, k
}

// sharedScriptBroker is the secured broker of deploy/local/kafka.sh that
// the TestRealSecuredKafkaScript* tests share (securedScriptBroker): each
// checks on it what the script's starts left, and none of them undoes
// what another checks.
type sharedScriptBroker struct {
	r scriptRunner
	k testenv.SecuredKafka
	// javaArgs is the file where the JAVA_HOME the script is given
	// records the arguments of every JVM it starts, one a line, each
	// JVM's ended by "=====".
	javaArgs string
	// restartOut is what the restart with the default users said.
	restartOut string
}

// Hand-granted ACLs: the ACLs the shared script broker is given as admin
// between its start and its restart (TestRealSecuredKafkaScriptACLs).
var (
	// staleACLs are of principals deploy/local/kafka/acls names, which
	// the file does not list: the operator's Read on every
	// meterline.-prefixed topic (what an older file granted, so a data
	// dir made with it still holds it), a producer's Read on usage.events
	// and a deny of the sink's Write from one host.
	staleACLs = []*kadm.ACLBuilder{
		kadm.NewACLs().Allow("User:operator").AllowHosts("*").Operations(kadm.OpRead).
			Topics("meterline.").ResourcePatternType(kadm.ACLPatternPrefixed),
		kadm.NewACLs().Allow("User:producer").AllowHosts("*").Operations(kadm.OpRead).
			Topics("usage.events").ResourcePatternType(kadm.ACLPatternLiteral),
		kadm.NewACLs().Deny("User:sink").DenyHosts("127.0.0.1").Operations(kadm.OpWrite).
			Topics("usage.rejected").ResourcePatternType(kadm.ACLPatternLiteral),
	}
	// outsiderACL is a Read of meterline.keys to User:outsider, whom the
	// file does not name, as brokerACLs spells it.
	outsiderACL     = "User:outsider READ topic meterline.keys literal"
	outsiderBuilder = kadm.NewACLs().Allow("User:outsider").AllowHosts("*").Operations(kadm.OpRead).
			Topics("meterline.keys").ResourcePatternType(kadm.ACLPatternLiteral)
	// handGrantedACLs are staleACLs and outsiderACL as brokerACLs spells them.
	handGrantedACLs = []string{"User:operator READ topic meterline. prefixed", "User:producer READ topic usage.events literal",
		"User:sink WRITE topic usage.rejected literal DENY from 127.0.0.1", outsiderACL}
)

var securedScript struct {
	once sync.Once
	dir  string // the data dir and the JAVA_HOME, removed by TestMain
	by   string // the test that set it up
	b    *sharedScriptBroker
	ok   bool // the set-up ended
}

// securedScriptBroker is the shared script broker, on the secured test
// broker's port + 2 (its controller + 3); t runs on scriptBrokerLane
// (parallelWaitingTest). The first test to call it sets the broker up,
// in one go, for what each of the tests checks:
//   - JAVA_HOME is a directory whose java records its arguments (in
//     javaArgs) and then runs the real one, for every run of the script;
//   - kafka.sh start formats a new data dir with the users of a data dir
//     formatted before User:billing and User:keyadmin existed;
//   - admin grants staleACLs and outsiderACL;
//   - kafka.sh restart with the default users (restartOut).
//
// TestMain stops it (stopSecuredScriptBroker).
func securedScriptBroker(t *testing.T) *sharedScriptBroker {
	t.Helper()
	testenv.RealKafkaSASL(t)
	parallelWaitingTest(t, &scriptBrokerLane)
	securedScript.once.Do(func() {
		securedScript.by = t.Name()
		dir, err := os.MkdirTemp("", "meterline-kafka-script-")
		if err != nil {
			t.Fatal(err)
		}
		securedScript.dir = dir
		securedScript.b = &sharedScriptBroker{}
		setUpSecuredScriptBroker(t, securedScript.b, dir)
		securedScript.ok = true
	})
	if !securedScript.ok {
		t.Fatalf("the shared script broker's set-up failed in %s (see its log)", securedScript.by)
	}
	return securedScript.b
}

// setUpSecuredScriptBroker is securedScriptBroker's set-up of b, in dir.
func setUpSecuredScriptBroker(t *testing.T, b *sharedScriptBroker, dir string) {
	t.Helper()
	java, err := exec.LookPath("java")
	if err != nil {
		t.Fatal("kafka.sh needs java on PATH")
	}
	if java, err = filepath.EvalSymlinks(java); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "java-home")
	b.javaArgs = filepath.Join(home, "args")
	if err := os.MkdirAll(filepath.Join(home, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	wrapper := "#!/bin/sh\n{ for a in \"$@\"; do printf '%s\\n' \"$a\"; done; echo =====; } >>'" + b.javaArgs + "'\nexec '" + java + "' \"$@\"\n"
	if err := os.WriteFile(filepath.Join(home, "bin", "java"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	b.r, b.k = newScriptRunner(t, securedScriptPorts, filepath.Join(dir, "data"))
	b.r.env = append(b.r.env, "JAVA_HOME="+home)

	b.r.run(t, []string{"KAFKA_SASL_USERS=meterline producer ingest dedup aggregate sink operator"}, "start")
	adm := b.k.Admin(t)
	for _, acl := range append(slices.Clone(staleACLs), outsiderBuilder) {
		res, err := adm.CreateACLs(ctxT(t, 30*time.Second), acl)
		if err == nil {
			err = res[0].Err
		}
		if err != nil {
			t.Fatalf("create ACL: %v", err)
		}
	}
	waitACLs(t, b.k, handGrantedACLs...)
	b.restartOut = b.r.run(t, nil, "restart")
}

// stopSecuredScriptBroker stops the shared script broker, if a test
// started it, and deletes its files.
func stopSecuredScriptBroker() {
	if securedScript.dir == "" {
		return
	}
	if b := securedScript.b; b.r.env != nil {
		if out, err := b.r.command(nil, "stop").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "stop the shared script broker: %v\n%s", err, out)
		}
	}
	if err := os.RemoveAll(securedScript.dir); err != nil {
		fmt.Fprintf(os.Stderr, "delete the shared script broker's files: %v\n", err)
	}
}

// TestRealSecuredKafkaScriptACLs: each start of a secured broker makes
// the ACLs of the principals deploy/local/kafka/acls names exactly the
// file's, and with them the operator does its documented work and reads
// no secret. The shared script broker (securedScriptBroker) was granted as
// admin, between its start and its restart, ACLs the file does not list
// to principals it names (staleACLs) and a Read of meterline.keys to
// User:outsider, whom the file does not name (outsiderACL). After the
// restart the broker lists every ACL of the file, the outsider's, and no
// other, and the script named the three it removed. Then the operator
// creates and checks the topics, shows the lag of every group on each of
// its input topics (reading a record of each) and describes the sink's
// group (what `verify` does before a rebuild); a fetch of meterline.keys
// or of either changelog is refused (TOPIC_AUTHORIZATION_FAILED), and so
// is `keys list`, at once.
func TestRealSecuredKafkaScriptACLs(t *testing.T) {
	b := securedScriptBroker(t)
	k, out := b.k, b.restartOut
	for _, removed := range []string{
		"removed the ACL --allow-principal User:operator --operation Read --topic meterline. --resource-pattern-type prefixed",
		"removed the ACL --allow-principal User:producer --operation Read --topic usage.events\n",
		"removed the ACL --deny-principal User:sink --deny-host 127.0.0.1 --operation Write --topic usage.rejected\n",
		"removed 3 ACLs",
	} {
		if !strings.Contains(out, removed) {
			t.Errorf("kafka.sh restart does not say %q", strings.TrimSpace(removed))
		}
	}
	want := scriptACLs(t)
	want[outsiderACL] = true
	sameACLs(t, want, brokerACLs(t, k), "after a restart the broker lacks %s",
		"after a restart the broker still lists %s, which deploy/local/kafka/acls does not")
	adm := k.Admin(t)

	// The operator's work.
	as := func(user string, args ...string) (int, string) {
		t.Helper()
		return command(t, time.Minute, "", append(args, k.Flags(user, kafka.ScramSHA512)...)...)
	}
	for _, cmd := range []string{"create", "check"} {
		if code, out := as("operator", "topics", cmd, "--partitions", "1"); code != 0 || !strings.Contains(out, "topics match") {
			t.Fatalf("topics %s as the operator: exit %d\n%s", cmd, code, out)
		}
	}
	names := topics.DefaultNames()
	inputs := map[string][]string{"meterline-dedup": {names.EventsTopic()},
		"meterline-aggregate-v2": {names.DedupedTopic(), names.EntitlementsTopic()}, "meterline-sink": sinkInputs(names)}
	cl, err := kafka.NewClient(k.Config(t, "admin", kafka.ScramSHA512))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// One record on each input, and each group's offset before it: every
	// group is one record behind on each, which lag reads to age it.
	n := 0
	for group, tps := range inputs {
		offs := kadm.Offsets{}
		for _, tp := range tps {
			if err := cl.ProduceSync(ctxT(t, 30*time.Second), &kgo.Record{Topic: tp, Key: []byte("k"), Value: []byte("v")}).FirstErr(); err != nil {
				t.Fatalf("produce to %s: %v", tp, err)
			}
			offs.Add(kadm.Offset{Topic: tp, Partition: 0, At: 0, LeaderEpoch: -1})
			n++
		}
		res, err := adm.CommitOffsets(ctxT(t, 30*time.Second), group, offs)
		if err == nil {
			err = res.Error()
		}
		if err != nil {
			t.Fatalf("commit offsets of %s: %v", group, err)
		}
	}
	code, out := as("operator", "lag")
	if m := lagSummary.FindStringSubmatch(out); code != 0 || m == nil || m[1] != strconv.Itoa(n) || m[2] != strconv.Itoa(n) {
		t.Fatalf("lag as the operator: exit %d, want every one of the %d partitions behind\n%s", code, n, out)
	}
	opcl, err := kafka.NewClient(k.Config(t, "operator", kafka.ScramSHA512))
	if err != nil {
		t.Fatal(err)
	}
	defer opcl.Close()
	if _, err := sink.GroupMembers(kadm.NewClient(opcl), "User:operator", "meterline-sink")(ctxT(t, 30*time.Second)); err != nil {
		t.Errorf("describe the sink's group as the operator (verify): %v", err)
	}

	// And no secret.
	if code, out := as("keyadmin", "keys", "create", "--tenant", "acme", "--allow-customers", "acme"); code != 0 || !strings.Contains(out, "mlk_") {
		t.Fatalf("keys create as the key administrator: exit %d\n%s", code, out)
	}
	if code, out := as("operator", "keys", "list", "--timeout", "20s"); code == 0 || !strings.Contains(out, "TOPIC_AUTHORIZATION_FAILED") || strings.Contains(out, "acme") {
		t.Errorf("keys list as the operator: exit %d, want a refusal\n%s", code, out)
	}
	if err := firstRecord(t, k, "operator", names.EventsTopic()); err != nil {
		t.Errorf("read %s as the operator: %v", names.EventsTopic(), err)
	}
	for _, tp := range []string{names.KeysTopic(), names.DedupChangelogTopic(), names.AggregateChangelogTopic()} {
		if tp != names.KeysTopic() {
			if err := cl.ProduceSync(ctxT(t, 30*time.Second), &kgo.Record{Topic: tp, Key: []byte("k"), Value: []byte("v")}).FirstErr(); err != nil {
				t.Fatalf("produce to %s: %v", tp, err)
			}
		}
		if err := firstRecord(t, k, "operator", tp); !errors.Is(err, kerr.TopicAuthorizationFailed) {
			t.Errorf("read %s as the operator: %v, want %v", tp, err, kerr.TopicAuthorizationFailed)
		}
	}
}

// firstRecord reads the first record of partition 0 of topic as user:
// nil once it has, or the first error a fetch returns.
func firstRecord(t *testing.T, k testenv.SecuredKafka, user, topic string) error {
	t.Helper()
	cl, err := kafka.NewClient(k.Config(t, user, kafka.ScramSHA512),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := ctxT(t, 30*time.Second)
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("no record and no error after 30 s: %w", ctx.Err())
		}
		if err := fs.Err0(); err != nil {
			return err
		}
		if fs.NumRecords() > 0 {
			return nil
		}
	}
}

// brokerACLs are the ACLs the broker lists, as scriptACLs spells them;
// a deny, or a host other than *, follows as "DENY from <host>".
func brokerACLs(t *testing.T, k testenv.SecuredKafka) map[string]bool {
	t.Helper()
	cl, err := kafka.NewClient(k.Config(t, "admin", kafka.ScramSHA512))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDescribeACLsRequest()
	req.ResourceType = kmsg.ACLResourceTypeAny
	req.ResourcePatternType = kmsg.ACLResourcePatternTypeAny
	req.Operation = kmsg.ACLOperationAny
	req.PermissionType = kmsg.ACLPermissionTypeAny
	resp, err := req.RequestWith(ctxT(t, 30*time.Second), cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("describe ACLs: %v", err)
	}
	out := map[string]bool{}
	for _, r := range resp.Resources {
		typ := strings.ReplaceAll(strings.ToLower(r.ResourceType.String()), "_", "-")
		for _, a := range r.ACLs {
			s := fmt.Sprintf("%s %v %s %s %s", a.Principal, a.Operation, typ, r.ResourceName, strings.ToLower(r.ResourcePatternType.String()))
			if a.PermissionType != kmsg.ACLPermissionTypeAllow || a.Host != "*" {
				s += fmt.Sprintf(" %v from %s", a.PermissionType, a.Host)
			}
			out[s] = true
		}
	}
	return out
}

// waitACLs waits until the broker lists every ACL of want (brokerACLs's
// spelling): ACLs reach it through the metadata log.
func waitACLs(t *testing.T, k testenv.SecuredKafka, want ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := brokerACLs(t, k)
		missing := slices.DeleteFunc(slices.Clone(want), func(a string) bool { return got[a] })
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the broker does not list %v after 30 s", missing)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestRealKafkaScriptStartFresh: `kafka.sh start-fresh` (what make test
// starts its brokers with) leaves a running broker and its topics alone,
// and starts a stopped one on a new data dir, without the topics an
// earlier run left there.
func TestRealKafkaScriptStartFresh(t *testing.T) {
	script, k := scriptBroker(t, startFreshPorts)
	script(nil, "start-fresh")
	const stale = "left-by-an-earlier-run"
	topicsNow := func() kadm.TopicDetails {
		t.Helper()
		adm := k.Admin(t)
		defer adm.Close()
		td, err := adm.ListTopics(ctxT(t, 30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return td
	}
	adm := k.Admin(t)
	if _, err := adm.CreateTopic(ctxT(t, 30*time.Second), 1, 1, nil, stale); err != nil {
		t.Fatal(err)
	}
	adm.Close()
	if out := script(nil, "start-fresh"); !topicsNow().Has(stale) {
		t.Fatalf("start-fresh of a running broker lost its topic %s:\n%s", stale, out)
	}
	script(nil, "stop")
	out := script(nil, "start-fresh")
	if td := topicsNow(); td.Has(stale) {
		t.Errorf("start-fresh of a stopped broker kept the topic %s of its old data dir:\n%s", stale, out)
	}
}

// TestRealSecuredKafkaScriptPasswordsOffCommandLine: no JVM that
// kafka.sh starts for a secured broker carries a password in its
// arguments, which every user of the machine can read (ps,
// /proc/<pid>/cmdline): the script, given for the shared script broker
// (securedScriptBroker) a JAVA_HOME whose java records its arguments and
// then runs the real one, formatted a new data dir with its SCRAM users,
// started the broker and created the users and ACLs, and then on a
// restart created the users the data dir lacked; no password of
// passwords/ is among the arguments. (The script's other children are
// openssl, which makes the passwords on its output, and text tools given
// none.) Then admin and every user log in with SCRAM-SHA-512 and PLAIN.
func TestRealSecuredKafkaScriptPasswordsOffCommandLine(t *testing.T) {
	b := securedScriptBroker(t)
	k := b.k
	raw, err := os.ReadFile(b.javaArgs)
	if err != nil {
		t.Fatal(err)
	}
	args := string(raw)
	for _, main := range []string{"kafka.tools.StorageTool\nformat\n", "kafka.Kafka\n", "SecuritySetup.java\n"} {
		if !strings.Contains(args, main) {
			t.Fatalf("the script ran no %s through JAVA_HOME's java; its arguments:\n%s", strings.TrimSpace(main), args)
		}
	}
	entries, err := os.ReadDir(filepath.Join(k.Dir, "passwords"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 10 {
		t.Fatalf("%d password files, want admin and the 9 default users", len(entries))
	}
	for _, e := range entries {
		user := e.Name()
		if strings.Contains(args, k.Password(t, user)) {
			t.Errorf("the password of %s is on the command line of a JVM the script started", user)
		}
		for _, mech := range []string{kafka.ScramSHA512, kafka.Plain} {
			if err := kafka.CheckCredentials(ctxT(t, 30*time.Second), k.Config(t, user, mech)); err != nil {
				t.Errorf("%s with %s: %v", user, mech, err)
			}
		}
	}
}

// TestRealSecuredKafkaScriptPasswordChangedByHand: a password changed on
// the broker by hand (docs/operations.md, Kafka: SASL and TLS) leaves the
// file `kafka.sh credentials` names stale only until the next start, which
// sets every user's SCRAM password back to its file's and says so; and
// `credentials` says what the files hold. On the shared script broker
// (securedScriptBroker): billing's password changed as admin, the file's
// refused, then accepted after a start of the running broker (and, should
// the test end before, after the start of its cleanup: the other tests log
// in as billing).
func TestRealSecuredKafkaScriptPasswordChangedByHand(t *testing.T) {
	b := securedScriptBroker(t)
	k := b.k
	restored := false
	t.Cleanup(func() {
		if !restored {
			b.r.run(t, nil, "start")
		}
	})
	res, err := k.Admin(t).AlterUserSCRAMs(ctxT(t, 30*time.Second), nil,
		[]kadm.UpsertSCRAM{{User: "billing", Mechanism: kadm.ScramSha512, Iterations: 4096, Password: "changed-by-hand"}})
	if err == nil {
		for _, r := range res {
			err = errors.Join(err, r.Err)
		}
	}
	if err != nil {
		t.Fatalf("change billing's password as admin: %v", err)
	}
	check := func() error {
		return kafka.CheckCredentials(ctxT(t, 30*time.Second), k.Config(t, "billing", kafka.ScramSHA512))
	}
	deadline := time.Now().Add(30 * time.Second)
	for check() == nil { // the change reaches the broker through the metadata log
		if time.Now().After(deadline) {
			t.Fatal("billing's old password still logs in 30 s after the change")
		}
		time.Sleep(200 * time.Millisecond)
	}
	out := b.r.run(t, nil, "credentials")
	if want := "passwords/<user> hold the SCRAM passwords each start sets"; !strings.Contains(out, want) {
		t.Errorf("kafka.sh credentials does not say %q:\n%s", want, out)
	}
	out = b.r.run(t, nil, "start")
	restored = true
	if want := regexp.MustCompile(`set the SCRAM passwords of the [1-9][0-9]* users from ` + regexp.QuoteMeta(filepath.Join(k.Dir, "passwords"))); !want.MatchString(out) {
		t.Errorf("kafka.sh start does not say %q:\n%s", want, out)
	}
	if err := check(); err != nil {
		t.Fatalf("billing with its file's password after a start: %v", err)
	}
}
