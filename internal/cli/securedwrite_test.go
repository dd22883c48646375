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

// TestRealSecuredDedupWithoutACLNamesIt: dedup run as a principal
// holding every ACL docs/operations.md lists for it but one stops with exit
// status 1 and an error naming the principal, the ACL and its resource, on
// the real SASL_SSL broker with the authorizer on: Write on usage.events
// (where it appends its ticks; the broker refuses the transaction's
// records there), Read on it, DescribeConfigs on it (read at start), Read
// on its group and Write on its transactional IDs.
func TestRealSecuredDedupWithoutACLNamesIt(t *testing.T) {
	k := testenv.RealKafkaSASL(t)
	parallelWaitingTest(t, &scriptBrokerLane)
	docs := documentedACLs(t)["dedup"]
	for _, c := range []struct {
		op       kadm.ACLOperation
		resource string // the resource of docs' line, as there
		want     string // what the error says, after the topic prefix
	}{
		{kadm.OpWrite, "usage.events", "User:dedup needs Write on topic {prefix}usage.events"},
		{kadm.OpRead, "usage.events", "User:dedup needs Read on topic {prefix}usage.events"},
		{kadm.OpDescribeConfigs, "usage.events", "User:dedup needs DescribeConfigs on the topic"},
		{kadm.OpRead, "meterline-dedup", "User:dedup needs Read on group {prefix}meterline-dedup"},
		{kadm.OpWrite, "meterline-dedup-", "User:dedup needs Write on transactional ID {prefix}meterline-dedup-n1"},
	} {
		t.Run(c.op.String()+" "+c.resource, func(t *testing.T) {
			prefix := testenv.Name(t, "secnoacl") + "."
			securedTopics(t, k, prefix, 2)
			var specs []aclSpec
			for _, s := range docs {
				if slices.Equal(slices.Concat(s.topics, s.groups, s.txnIDs), []string{c.resource}) {
					s.ops = slices.DeleteFunc(slices.Clone(s.ops), func(op kadm.ACLOperation) bool { return op == c.op })
				}
				if len(s.ops) > 0 {
					specs = append(specs, s)
				}
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
				t.Fatalf("exit %d, want 1\n%s", code, testenv.Tail(out, 20))
			}
			for _, want := range []string{"AUTHORIZATION_FAILED", strings.ReplaceAll(c.want, "{prefix}", prefix), "Security and ACLs"} {
				if !strings.Contains(out, want) {
					t.Errorf("dedup's output does not say %q:\n%s", want, testenv.Tail(out, 20))
				}
			}
		})
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
