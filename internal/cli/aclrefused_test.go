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

// saslLogin returns the connection flags of a user of a kfake cluster at
// brokers whose password is "pw-" and its name, written to a file.
func saslLogin(t *testing.T, brokers []string) func(user string) []string {
	dir := t.TempDir()
	return func(user string) []string {
		pw := filepath.Join(dir, user+".pw")
		if err := os.WriteFile(pw, []byte("pw-"+user), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{"--brokers", strings.Join(brokers, ","), "--kafka-sasl-mechanism", kafka.ScramSHA512,
			"--kafka-sasl-user", user, "--kafka-sasl-password-file", pw}
	}
}

// allow is the ACL that allows op on the resource of type rt named name.
func allow(rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) kfake.ACL {
	return kfake.ACL{Resource: rt, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
}

// TestLagRefusedNamesTheACL: `meterline lag` run by a principal that
// lacks one of the ACLs docs/operations.md (Security and ACLs) gives the
// operator fails at once with an error naming the ACL and its resource:
// Describe on the group, Describe on the topic, or Read on a topic where
// the group is behind (lag reads the first record not consumed for its
// age), rather than wait out its read and report a timeout.
func TestLagRefusedNamesTheACL(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.SeedTopics(2, "usage.events"),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "nogroup", "pw-nogroup", allow(kmsg.ACLResourceTypeTopic, "usage.events", kmsg.ACLOperationDescribe)),
		kfake.User(kafka.ScramSHA512, "notopic", "pw-notopic", allow(kmsg.ACLResourceTypeGroup, "g1", kmsg.ACLOperationDescribe)),
		kfake.User(kafka.ScramSHA512, "noread", "pw-noread", allow(kmsg.ACLResourceTypeGroup, "g1", kmsg.ACLOperationDescribe),
			allow(kmsg.ACLResourceTypeTopic, "usage.events", kmsg.ACLOperationDescribe)),
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
	login := saslLogin(t, brokers)
	for user, want := range map[string]string{
		"nogroup": "Describe on group g1", "notopic": "Describe on topic usage.events",
		"noread": "Read on topic usage.events", "nobody": "Describe on group g1",
	} {
		t.Run(user, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var out, errb bytes.Buffer
			start := time.Now()
			code := Main(ctx, append([]string{"lag", "--all", "--group", "g1"}, login(user)...),
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
	login := saslLogin(t, brokers)
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

// TestEntitlementsRefusedNamesTheACL: `meterline entitlements` run by a
// principal that lacks one of the billing system's ACLs
// (docs/operations.md, Security and ACLs) names the ACL it lacks and its
// resource: Read on usage.entitlements to read, Write on it to write,
// Write on the transactional ID meterline-entitlements.
func TestEntitlementsRefusedNamesTheACL(t *testing.T) {
	topic, txn := kmsg.ACLResourceTypeTopic, kmsg.ACLResourceTypeTransactionalId
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.SeedTopics(2, "usage.entitlements"),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "notxn", "pw-notxn", allow(topic, "usage.entitlements", kmsg.ACLOperationRead),
			allow(topic, "usage.entitlements", kmsg.ACLOperationWrite)),
		kfake.User(kafka.ScramSHA512, "nowrite", "pw-nowrite", allow(topic, "usage.entitlements", kmsg.ACLOperationRead),
			allow(txn, "meterline-entitlements", kmsg.ACLOperationWrite)),
		kfake.User(kafka.ScramSHA512, "noread", "pw-noread", allow(topic, "usage.entitlements", kmsg.ACLOperationDescribe)))
	login := saslLogin(t, brokers)
	doc := filepath.Join(t.TempDir(), "acme.yaml")
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

// TestKeysWriteRefusedNamesTheACL: `keys create` and `tenants set` by a
// principal that may read meterline.keys but not write it name the ACL
// they lack, Write on meterline.keys, rather than only the
// CLUSTER_AUTHORIZATION_FAILED the brokers answer the idempotent
// producer's InitProducerID with; and so does `tenants set` by one that
// may not even describe it (TOPIC_AUTHORIZATION_FAILED).
func TestKeysWriteRefusedNamesTheACL(t *testing.T) {
	read := allow(kmsg.ACLResourceTypeTopic, "meterline.keys", kmsg.ACLOperationRead)
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.SeedTopics(1, "meterline.keys"),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "reader", "pw-reader", read),
		kfake.User(kafka.ScramSHA512, "nobody", "pw-nobody"))
	login := saslLogin(t, brokers)
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
