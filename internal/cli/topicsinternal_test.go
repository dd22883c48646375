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

// TestTopicsCheckSkipsInternalOnce: `topics check` by a principal that may
// describe the pipeline's topics but not Kafka's internal ones (the
// operator of docs/operations.md, Security and ACLs) checks the rest and
// says why it skipped them, in one line: the reason, without the
// package's prefix ("topics: ") after "internal topics: ".
func TestTopicsCheckSkipsInternalOnce(t *testing.T) {
	var acls []kfake.ACL
	for _, prefix := range []string{"usage.", "meterline"} {
		for _, op := range []kmsg.ACLOperation{kmsg.ACLOperationDescribe, kmsg.ACLOperationDescribeConfigs} {
			acls = append(acls, kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: prefix,
				Pattern: kmsg.ACLResourcePatternTypePrefixed, Operation: op, Allow: true})
		}
	}
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "operator", "pw-operator", acls...))
	dir := t.TempDir()
	login := func(user string) []string {
		pw := filepath.Join(dir, user+".pw")
		if err := os.WriteFile(pw, []byte("pw-"+user), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{"--brokers", strings.Join(brokers, ","), "--kafka-sasl-mechanism", kafka.ScramSHA512,
			"--kafka-sasl-user", user, "--kafka-sasl-password-file", pw}
	}
	if code, out, errOut := run(t, "", append([]string{"topics", "create", "--replication-factor", "1"}, login("admin")...)...); code != 0 {
		t.Fatalf("topics create: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut := run(t, "", append([]string{"topics", "check"}, login("operator")...)...)
	var skipped string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "skipped ") {
			skipped = l
		}
	}
	if code != 0 || skipped == "" {
		t.Fatalf("topics check: exit %d, want 0 and a line for the internal topics skipped\n%s%s", code, out, errOut)
	}
	if want := "skipped  Kafka's internal topics: not authorized to describe __consumer_offsets"; !strings.HasPrefix(skipped, want) {
		t.Errorf("skipped line %q, want it to start %q", skipped, want)
	}
}
