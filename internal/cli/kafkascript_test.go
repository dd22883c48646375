package cli

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
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
	got := scriptACLs(t)
	for a := range want {
		if !got[a] {
			t.Errorf("deploy/local/kafka/acls lacks %s", a)
		}
	}
	for a := range got {
		if !want[a] {
			t.Errorf("deploy/local/kafka/acls has %s, which docs/operations.md does not list", a)
		}
	}
}

// TestRealSecuredKafkaScriptUsers starts a secured broker of its own with
// deploy/local/kafka.sh, on the secured test broker's port + 2 (its
// controller + 3), first with the users of a data dir formatted before
// User:billing and User:keyadmin existed, then again on that data dir with
// the default users. Without a user added by the test: the billing system
// sets an entitlement, the key administrator creates an API key, the
// billing system may not write meterline.keys and the operator (who
// creates the topics) may write neither.
func TestRealSecuredKafkaScriptUsers(t *testing.T) {
	_, p, err := net.SplitHostPort(testenv.RealKafkaSASL(t).Brokers[0])
	if err != nil {
		t.Fatal(err)
	}
	base, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(base + 2)
	dir := t.TempDir()
	env := []string{"KAFKA_PORT=" + port, "KAFKA_CONTROLLER_PORT=" + strconv.Itoa(base+3), "KAFKA_DATA_DIR=" + dir,
		"KAFKA_SECURITY=sasl_ssl", "KAFKA_HEAP_OPTS=-Xms128m -Xmx256m"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KAFKA_") { // make exports KAFKA_PORT
			env = append(env, kv)
		}
	}
	script := func(extra []string, args ...string) {
		t.Helper()
		start := time.Now()
		c := exec.Command(filepath.Join("..", "..", "deploy", "local", "kafka.sh"), args...)
		c.Env = append(slices.Clone(env), extra...)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("kafka.sh %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("kafka.sh %s (%s):\n%s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond), out)
	}
	script([]string{"KAFKA_SASL_USERS=meterline producer ingest dedup aggregate sink operator"}, "start")
	t.Cleanup(func() { script(nil, "stop") })
	script(nil, "restart")

	k := testenv.SecuredKafka{Brokers: []string{"127.0.0.1:" + port}, Dir: filepath.Join(dir, "security")}
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
	if code, out := as("keyadmin", "keys", "create", "--tenant", "acme", "--customers", "acme"); code != 0 || !strings.Contains(out, "mlk_") {
		t.Fatalf("keys create as the key administrator: exit %d\n%s", code, out)
	}
	for _, user := range []string{"billing", "operator"} {
		if code, out := as(user, "keys", "create", "--tenant", "acme", "--customers", "acme", "--timeout", "20s"); code == 0 || !strings.Contains(out, "AUTHORIZATION_FAILED") || strings.Contains(out, "mlk_") {
			t.Errorf("keys create as %s: exit %d, want a refusal\n%s", user, code, out)
		}
	}
	if code, out := as("operator", "entitlements", "set", "initech", "-f", plan); code == 0 || !strings.Contains(out, "AUTHORIZATION_FAILED") {
		t.Errorf("entitlements set as the operator: exit %d, want a refusal\n%s", code, out)
	}
}
