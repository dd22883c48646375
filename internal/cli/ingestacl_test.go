package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestIngestWithoutWriteStops: an HTTP ingest whose principal may not
// write usage.events (an ACL missing) stops at start with an error naming
// the topic and the ACL, rather than serve and answer every event 503
// "Kafka unavailable, retry", which clients would retry for ever. With
// the documented ACLs it starts.
func TestIngestWithoutWriteStops(t *testing.T) {
	lit := kmsg.ACLResourcePatternTypeLiteral
	topicACL := func(name string, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: name, Pattern: lit, Operation: op, Allow: true}
	}
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.SeedTopics(2, "usage.events", "meterline.keys", "usage.balances"),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		// Read (and so Describe) on usage.events, not Write.
		kfake.User(kafka.ScramSHA512, "reader", "pw-reader", topicACL("usage.events", kmsg.ACLOperationRead),
			topicACL("meterline.keys", kmsg.ACLOperationRead), topicACL("usage.balances", kmsg.ACLOperationRead)),
		kfake.User(kafka.ScramSHA512, "ingest", "pw-ingest", topicACL("usage.events", kmsg.ACLOperationWrite),
			topicACL("meterline.keys", kmsg.ACLOperationRead), topicACL("usage.balances", kmsg.ACLOperationRead)))
	dir := t.TempDir()
	ingest := func(user string, d time.Duration) (int, string) {
		pw := filepath.Join(dir, user+".pw")
		if err := os.WriteFile(pw, []byte("pw-"+user), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		var out, errb bytes.Buffer
		code := Main(ctx, []string{"ingest", "--brokers", strings.Join(brokers, ","),
			"--kafka-sasl-mechanism", kafka.ScramSHA512, "--kafka-sasl-user", user, "--kafka-sasl-password-file", pw,
			"--addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"},
			IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
		return code, errb.String()
	}
	start := time.Now()
	code, errOut := ingest("reader", 20*time.Second)
	if code != 1 || time.Since(start) > 15*time.Second {
		t.Fatalf("ingest without Write on usage.events: exit %d after %s, want 1 at start\n%s", code, time.Since(start), errOut)
	}
	for _, want := range []string{"User:reader", "Write on topic usage.events", "Security and ACLs"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("error does not say %q:\n%s", want, errOut)
		}
	}
	if code, errOut := ingest("ingest", 3*time.Second); code != 0 {
		t.Errorf("ingest with the documented ACLs: exit %d\n%s", code, errOut)
	}
}
