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

// TestEntitlementsRefusedNamesTheACL: `meterline entitlements` run by a
// principal that lacks one of the billing system's ACLs
// (docs/operations.md, Security and ACLs) names the ACL it lacks and its
// resource: Read on usage.entitlements to read, Write on it to write,
// Write on the transactional ID meterline-entitlements.
func TestEntitlementsRefusedNamesTheACL(t *testing.T) {
	a := func(rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: rt, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	topic, txn := kmsg.ACLResourceTypeTopic, kmsg.ACLResourceTypeTransactionalId
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.SeedTopics(2, "usage.entitlements"),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "notxn", "pw-notxn", a(topic, "usage.entitlements", kmsg.ACLOperationRead),
			a(topic, "usage.entitlements", kmsg.ACLOperationWrite)),
		kfake.User(kafka.ScramSHA512, "nowrite", "pw-nowrite", a(topic, "usage.entitlements", kmsg.ACLOperationRead),
			a(txn, "meterline-entitlements", kmsg.ACLOperationWrite)),
		kfake.User(kafka.ScramSHA512, "noread", "pw-noread", a(topic, "usage.entitlements", kmsg.ACLOperationDescribe)))
	dir := t.TempDir()
	login := func(user string) []string {
		pw := filepath.Join(dir, user+".pw")
		if err := os.WriteFile(pw, []byte("pw-"+user), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{"--brokers", strings.Join(brokers, ","), "--kafka-sasl-mechanism", kafka.ScramSHA512,
			"--kafka-sasl-user", user, "--kafka-sasl-password-file", pw}
	}
	doc := filepath.Join(dir, "acme.yaml")
	if err := os.WriteFile(doc, []byte("plan: free\noverdraft: {policy: deny}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	set := []string{"entitlements", "set", "acme", "-f", doc}
	if code, out, errOut := run(t, "", append(set, login("admin")...)...); code != 0 {
		t.Fatalf("entitlements set as admin: exit %d\n%s%s", code, out, errOut)
	}
	for _, c := range []struct {
		user string
		args []string
		want string
	}{
		{"notxn", set, "User:notxn needs Write on transactional ID meterline-entitlements"},
		{"nowrite", set, "User:nowrite needs Write on topic usage.entitlements"},
		{"noread", []string{"entitlements", "get", "acme"}, "User:noread needs Read on topic usage.entitlements"},
		{"noread", []string{"entitlements", "list"}, "User:noread needs Read on topic usage.entitlements"},
	} {
		code, out, errOut := run(t, "", append(c.args, login(c.user)...)...)
		if code != 1 {
			t.Errorf("%v as %s: exit %d, want 1\n%s%s", c.args, c.user, code, out, errOut)
			continue
		}
		for _, w := range []string{c.want, "AUTHORIZATION_FAILED", "Security and ACLs"} {
			if !strings.Contains(errOut, w) {
				t.Errorf("%v as %s does not say %q:\n%s", c.args, c.user, w, errOut)
			}
		}
	}
}
