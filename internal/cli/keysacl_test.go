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

// TestKeysWriteRefusedNamesTheACL: `keys create` and `tenants set` by a
// principal that may read meterline.keys but not write it name the ACL
// they lack, Write on meterline.keys, rather than only the
// CLUSTER_AUTHORIZATION_FAILED the brokers answer the idempotent
// producer's InitProducerID with; and so does `tenants set` by one that
// may not even describe it (TOPIC_AUTHORIZATION_FAILED).
func TestKeysWriteRefusedNamesTheACL(t *testing.T) {
	read := kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "meterline.keys", Pattern: kmsg.ACLResourcePatternTypeLiteral,
		Operation: kmsg.ACLOperationRead, Allow: true}
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.SeedTopics(1, "meterline.keys"),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "reader", "pw-reader", read),
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
	if code, out, errOut := run(t, "", append([]string{"tenants", "set", "acme", "--allow-customers", "c1"}, login("admin")...)...); code != 0 {
		t.Fatalf("tenants set as admin: exit %d\n%s%s", code, out, errOut)
	}
	for _, c := range []struct {
		user string
		args []string
	}{
		{"reader", []string{"keys", "create", "--tenant", "acme"}},
		{"reader", []string{"tenants", "set", "acme2", "--allow-customers", "c2"}},
		{"nobody", []string{"tenants", "set", "acme2", "--allow-customers", "c2"}},
	} {
		code, out, errOut := run(t, "", append(c.args, login(c.user)...)...)
		if code != 1 {
			t.Errorf("%v as %s: exit %d, want 1\n%s%s", c.args, c.user, code, out, errOut)
			continue
		}
		for _, w := range []string{"AUTHORIZATION_FAILED", "needs Write on topic meterline.keys", "Security and ACLs"} {
			if !strings.Contains(errOut, w) {
				t.Errorf("%v as %s does not say %q:\n%s", c.args, c.user, w, errOut)
			}
		}
	}
}
