package cli

import (
	"os"
	"path/filepath"
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

// TestRealSecuredPasswordWithLineBreakSaysSo: the right password with a
// line break after it in METERLINE_KAFKA_SASL_PASSWORD (a Kubernetes
// secret made from a file `echo` wrote), or with a second one in the
// password file, is refused by the SASL_SSL broker: the command exits 1
// with an error that says the password ends with a line break, and does
// not show it.
func TestRealSecuredPasswordWithLineBreakSaysSo(t *testing.T) {
	k := testenv.RealKafkaSASL(t)
	pw := k.Password(t, "operator")
	flags := k.Flags("operator", kafka.ScramSHA512)
	i := slices.Index(flags, "--kafka-sasl-password-file")
	envFlags := slices.Delete(slices.Clone(flags), i, i+2)
	file := filepath.Join(t.TempDir(), "operator.pw")
	if err := os.WriteFile(file, []byte(pw+"\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fileFlags := slices.Clone(flags)
	fileFlags[i+1] = file
	for name, c := range map[string]struct {
		env   string
		flags []string
	}{"environment": {pw + "\n", envFlags}, "file": {"", fileFlags}} {
		t.Run(name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv(EnvKafkaSASLPassword, c.env)
			}
			code, out, errOut := run(t, "", append([]string{"topics", "check"}, c.flags...)...)
			if code != 1 || !strings.Contains(errOut, "the password ends with a line break") || !strings.Contains(errOut, kafka.ErrAuthentication.Error()) {
				t.Fatalf("exit %d, want 1 and an authentication error saying the password ends with a line break\n%s%s", code, out, errOut)
			}
			if strings.Contains(out+errOut, pw) {
				t.Fatalf("the output shows the password:\n%s%s", out, errOut)
			}
		})
	}
}
