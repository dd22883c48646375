package cli

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestRealSecuredDedupWithoutWriteNamesACL: dedup run as a principal
// holding every ACL docs/operations.md lists for it but Write on
// usage.events (where it appends its ticks) stops with exit status 1 and
// an error naming the principal, the ACL and the topic, as a refused read,
// group or transactional ID is named, on the real SASL_SSL broker with
// the authorizer on, which refuses the transaction's records there.
func TestRealSecuredDedupWithoutWriteNamesACL(t *testing.T) {
	k := testenv.RealKafkaSASL(t)
	parallelWaitingTest(t, &scriptBrokerLane)
	prefix := testenv.Name(t, "secnowrite") + "."
	names := securedTopics(t, k, prefix, 2)
	var specs []aclSpec
	for _, s := range documentedACLs(t)["dedup"] {
		if slices.Equal(s.topics, []string{"usage.events"}) {
			s.ops = slices.DeleteFunc(slices.Clone(s.ops), func(op kadm.ACLOperation) bool { return op == kadm.OpWrite })
		}
		specs = append(specs, s)
	}
	grant(t, k.Admin(t), map[string][]aclSpec{"dedup": specs}, prefix, "dedup", "dedup")
	events, _, _ := securedEvents(t, 20)
	if code, out := command(t, time.Minute, "", append([]string{"produce", "--topic-prefix", prefix, "--file", events},
		k.Flags("admin", kafka.ScramSHA512)...)...); code != 0 {
		t.Fatalf("produce as admin: exit %d\n%s", code, out)
	}
	code, out := command(t, 2*time.Minute, "", append([]string{"dedup", "--topic-prefix", prefix, "--group", prefix + "meterline-dedup",
		"--instance-id", "n1", "--state-dir", t.TempDir(), "--metrics-addr", testenv.FreeAddr(t), "--tick-interval", "1s",
		"--dedup-keys-file", testenv.DedupKeysFile(t)}, k.Flags("dedup", kafka.ScramSHA512)...)...)
	if code != 1 {
		t.Fatalf("dedup without Write on %s: exit %d, want 1\n%s", names.EventsTopic(), code, testenv.Tail(out, 20))
	}
	for _, want := range []string{"TOPIC_AUTHORIZATION_FAILED", "User:dedup needs Write on topic " + names.EventsTopic(), "Security and ACLs"} {
		if !strings.Contains(out, want) {
			t.Errorf("dedup's output does not say %q:\n%s", want, testenv.Tail(out, 20))
		}
	}
}
