package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
)

// TestLagRefusedNamesTheACL: `meterline lag` run by a principal that
// lacks one of the ACLs docs/operations.md (Security and ACLs) gives the
// operator fails at once with an error naming the ACL and its resource:
// Describe on the group, Describe on the topic, or Read on a topic where
// the group is behind (lag reads the first record not consumed for its
// age), rather than wait out its read and report a timeout.
func TestLagRefusedNamesTheACL(t *testing.T) {
	acl := func(rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: rt, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.SeedTopics(2, "usage.events"),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "nogroup", "pw-nogroup", acl(kmsg.ACLResourceTypeTopic, "usage.events", kmsg.ACLOperationDescribe)),
		kfake.User(kafka.ScramSHA512, "notopic", "pw-notopic", acl(kmsg.ACLResourceTypeGroup, "g1", kmsg.ACLOperationDescribe)),
		kfake.User(kafka.ScramSHA512, "noread", "pw-noread", acl(kmsg.ACLResourceTypeGroup, "g1", kmsg.ACLOperationDescribe),
			acl(kmsg.ACLResourceTypeTopic, "usage.events", kmsg.ACLOperationDescribe)),
		kfake.User(kafka.ScramSHA512, "nobody", "pw-nobody"))
	// g1 commits offsets on usage.events as admin.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.SASL(kafka.Config{SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: "admin", Password: secret.New("pw-admin")}}.Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx0, c0 := context.WithTimeout(context.Background(), 10*time.Second)
	defer c0()
	if err := cl.ProduceSync(ctx0, &kgo.Record{Topic: "usage.events", Partition: 0, Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var os0 kadm.Offsets
	os0.Add(kadm.Offset{Topic: "usage.events", Partition: 0, At: 0})
	if _, err := kadm.NewClient(cl).CommitOffsets(ctx0, "g1", os0); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for user, want := range map[string]string{
		"nogroup": "Describe on group g1", "notopic": "Describe on topic usage.events",
		"noread": "Read on topic usage.events", "nobody": "Describe on group g1",
	} {
		t.Run(user, func(t *testing.T) {
			pw := filepath.Join(dir, user+".pw")
			if err := os.WriteFile(pw, []byte("pw-"+user), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var out, errb bytes.Buffer
			start := time.Now()
			code := Main(ctx, []string{"lag", "--all", "--group", "g1", "--brokers", strings.Join(brokers, ","),
				"--kafka-sasl-mechanism", kafka.ScramSHA512, "--kafka-sasl-user", user, "--kafka-sasl-password-file", pw},
				IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
			if code != 1 {
				t.Fatalf("exit %d, want 1\n%s%s", code, out.String(), errb.String())
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("took %s to fail, want at once:\n%s", took, errb.String())
			}
			for _, w := range []string{"AUTHORIZATION_FAILED", "User:" + user + " needs " + want, "Security and ACLs"} {
				if !strings.Contains(errb.String(), w) {
					t.Errorf("error does not say %q:\n%s", w, errb.String())
				}
			}
		})
	}
}
