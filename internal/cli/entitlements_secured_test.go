package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestRealSecuredEntitlements runs `meterline entitlements` over SASL_SSL
// on the broker with the authorizer on: as the operator, with exactly the
// ACLs docs/operations.md lists for it, set, set-default, set-rates, get,
// list, delete and balance work; as the producer (usage.events only), set is
// refused and writes nothing.
func TestRealSecuredEntitlements(t *testing.T) {
	k := testenv.RealKafkaSASL(t)
	prefix := testenv.Name(t, "secent") + "."
	securedTopics(t, k, prefix, 2)
	adm := k.Admin(t)
	docs := documentedACLs(t)
	grant(t, adm, docs, prefix, "operator", "operator")
	grant(t, adm, docs, prefix, "producer", "producer")
	file := tempFiles(t)
	plan := file("acme.yaml", "plan: free\ncaps: {api_calls: {limit: 1000}}\n")
	rates := file("rates.yaml", "versions: [{effective_from: \"2026-12-01T00:00:00Z\", rates: {api_calls: 1000}}]\n")
	as := func(user string, write bool, args ...string) (int, string) {
		t.Helper()
		args = append(append([]string{"entitlements"}, args...), "--topic-prefix", prefix)
		if write {
			args = append(args, "--transactional-id", prefix+"meterline-entitlements")
		}
		return command(t, time.Minute, "", append(args, k.Flags(user, kafka.ScramSHA512)...)...)
	}
	for _, c := range [][]string{{"set", "acme", "-f", plan}, {"set", "globex", "-f", plan}, {"set-default", "-f", plan},
		{"set-rates", "-f", rates}, {"delete", "globex"}} {
		if code, out := as("operator", true, c...); code != 0 {
			t.Fatalf("%s as the operator: exit %d\n%s", c, code, out)
		}
	}
	if code, out := as("operator", false, "get", "acme"); code != 0 || !strings.Contains(out, "limit: 1000") {
		t.Fatalf("get as the operator: exit %d\n%s", code, out)
	}
	if code, out := as("operator", false, "list"); code != 0 || strings.Count(out, "customer:") != 1 {
		t.Fatalf("list as the operator: exit %d\n%s", code, out)
	}
	if code, out := as("operator", false, "get", "--rates"); code != 0 || !strings.Contains(out, "api_calls: \"1000\"") {
		t.Fatalf("get --rates as the operator: exit %d\n%s", code, out)
	}
	// It may read usage.balances: no aggregator ran, so there is none.
	if code, out := as("operator", false, "balance", "acme"); code != 1 || !strings.Contains(out, "acme has no balance in "+prefix+"usage.balances") {
		t.Fatalf("balance as the operator: exit %d, want 1: no balance\n%s", code, out)
	}
	code, out := as("producer", true, "set", "initech", "-f", plan)
	if code == 0 || !strings.Contains(out, "AUTHORIZATION_FAILED") {
		t.Fatalf("set as the producer: exit %d, want a refusal\n%s", code, out)
	}
	if code, out := as("operator", false, "get", "initech"); code != 1 || !strings.Contains(out, "initech has no entitlements") {
		t.Fatalf("the producer's refused set wrote something: exit %d\n%s", code, out)
	}
}
