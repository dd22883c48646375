package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestTopicsRefusedNamesTheACL: `topics create` and `topics check` run by
// a principal that lacks an ACL of the operator's (docs/operations.md,
// Security and ACLs) name the ACL and the topic it is needed on: Create
// to create, Describe to list, DescribeConfigs to check the configs.
func TestTopicsRefusedNamesTheACL(t *testing.T) {
	acl := func(op kmsg.ACLOperation) (a []kfake.ACL) {
		for _, prefix := range []string{"usage.", "meterline"} {
			a = append(a, kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: prefix,
				Pattern: kmsg.ACLResourcePatternTypePrefixed, Operation: op, Allow: true})
		}
		return a
	}
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "desc", "pw-desc", acl(kmsg.ACLOperationDescribe)...),
		kfake.User(kafka.ScramSHA512, "nobody", "pw-nobody"))
	dir := t.TempDir()
	login := func(user string) []string {
		pw := filepath.Join(dir, user+".pw")
		if err := os.WriteFile(pw, []byte("pw-"+user), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{"--brokers", strings.Join(brokers, ","), "--kafka-sasl-mechanism", kafka.ScramSHA512,
			"--kafka-sasl-user", user, "--kafka-sasl-password-file", pw}
	}
	expect := func(cmd, user string, want ...string) {
		t.Helper()
		code, out, errOut := run(t, "", append([]string{"topics", cmd, "--replication-factor", "1"}, login(user)...)...)
		if code != 1 {
			t.Fatalf("topics %s as %s: exit %d, want 1\n%s%s", cmd, user, code, out, errOut)
		}
		for _, w := range append(want, "AUTHORIZATION_FAILED", "Security and ACLs") {
			if !strings.Contains(out+errOut, w) {
				t.Errorf("topics %s as %s does not say %q:\n%s%s", cmd, user, w, out, errOut)
			}
		}
	}
	expect("create", "desc", "needs Create on topic usage.events", "needs Create on topic meterline.keys")
	if code, out, errOut := run(t, "", append([]string{"topics", "create", "--replication-factor", "1"}, login("admin")...)...); code != 0 {
		t.Fatalf("topics create: exit %d\n%s%s", code, out, errOut)
	}
	expect("check", "desc", "needs DescribeConfigs on topics usage.events,")
	expect("check", "nobody", "needs Describe on topics usage.events,")
}
