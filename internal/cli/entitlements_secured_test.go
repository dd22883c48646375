package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestRealSecuredEntitlements runs `meterline entitlements` over SASL_SSL
// on the broker with the authorizer on: as the billing system, with
// exactly the ACLs docs/operations.md lists for User:billing, set,
// set-default, set-rates, get, list, delete and balance work; as the
// producer (usage.events only), set is refused and writes nothing. The
// billing system may not make API keys (only User:keyadmin writes
// meterline.keys), and the key administrator may not write entitlements.
func TestRealSecuredEntitlements(t *testing.T) {
	k := testenv.RealKafkaSASL(t)
	parallelWaitingTest(t, &scriptBrokerLane)
	prefix := testenv.Name(t, "secent") + "."
	securedTopics(t, k, prefix, 2)
	adm := k.Admin(t)
	docs := documentedACLs(t)
	grant(t, adm, docs, prefix, "billing", "billing")
	grant(t, adm, docs, prefix, "keyadmin", "keyadmin")
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
		if code, out := as("billing", true, c...); code != 0 {
			t.Fatalf("%s as the billing system: exit %d\n%s", c, code, out)
		}
	}
	if code, out := as("billing", false, "get", "acme"); code != 0 || !strings.Contains(out, "limit: 1000") {
		t.Fatalf("get as the billing system: exit %d\n%s", code, out)
	}
	if code, out := as("billing", false, "list"); code != 0 || strings.Count(out, "customer:") != 1 {
		t.Fatalf("list as the billing system: exit %d\n%s", code, out)
	}
	if code, out := as("billing", false, "get", "--rates"); code != 0 || !strings.Contains(out, "api_calls: \"1000\"") {
		t.Fatalf("get --rates as the billing system: exit %d\n%s", code, out)
	}
	// It may read usage.balances: no aggregator ran, so there is none.
	if code, out := as("billing", false, "balance", "acme"); code != 1 || !strings.Contains(out, "acme has no balance in "+prefix+"usage.balances") {
		t.Fatalf("balance as the billing system: exit %d, want 1: no balance\n%s", code, out)
	}
	code, out := as("producer", true, "set", "initech", "-f", plan)
	if code == 0 || !strings.Contains(out, "AUTHORIZATION_FAILED") {
		t.Fatalf("set as the producer: exit %d, want a refusal\n%s", code, out)
	}
	if code, out := as("billing", false, "get", "initech"); code != 1 || !strings.Contains(out, "initech has no entitlements") {
		t.Fatalf("the producer's refused set wrote something: exit %d\n%s", code, out)
	}

	// API keys: only the key administrator makes them.
	keys := func(user string, args ...string) (int, string) {
		t.Helper()
		args = append(append([]string{"keys"}, args...), "--topic-prefix", prefix, "--timeout", "20s")
		return command(t, time.Minute, "", append(args, k.Flags(user, kafka.ScramSHA512)...)...)
	}
	if code, out := keys("billing", "create", "--tenant", "acme", "--allow-customers", "acme"); code == 0 || !strings.Contains(out, "AUTHORIZATION_FAILED") || strings.Contains(out, "mlk_") {
		t.Fatalf("keys create as the billing system: exit %d, want a refusal\n%s", code, out)
	}
	if code, out := keys("keyadmin", "list"); code != 0 || !strings.Contains(out, "0 keys, 0 tenants") {
		t.Fatalf("keys list as the key administrator after the billing system's refused create: exit %d, want no key\n%s", code, out)
	}
	if code, out := keys("keyadmin", "create", "--tenant", "acme", "--allow-customers", "acme"); code != 0 || !strings.Contains(out, "mlk_") {
		t.Fatalf("keys create as the key administrator: exit %d\n%s", code, out)
	}
	if code, out := keys("keyadmin", "list"); code != 0 || !strings.Contains(out, "1 keys, 1 tenants") {
		t.Fatalf("keys list as the key administrator: exit %d\n%s", code, out)
	}
	if code, out := as("keyadmin", true, "set", "initech", "-f", plan); code == 0 || !strings.Contains(out, "AUTHORIZATION_FAILED") {
		t.Fatalf("entitlements set as the key administrator: exit %d, want a refusal\n%s", code, out)
	}
}
