package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestProduceRefusedNamesTheACL: `meterline produce` whose principal may
// not write usage.events reports each refused event with the topic and
// the ACL it needs, as the stages name theirs (docs/operations.md,
// Security and ACLs), both when it may see the topic (Read: its
// idempotent producer is refused its ID, CLUSTER_AUTHORIZATION_FAILED)
// and when it may not (TOPIC_AUTHORIZATION_FAILED).
func TestProduceRefusedNamesTheACL(t *testing.T) {
	read := allow(kmsg.ACLResourceTypeTopic, "usage.events", kmsg.ACLOperationRead)
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.SeedTopics(2, "usage.events"),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "reader", "pw-reader", read),
		kfake.User(kafka.ScramSHA512, "nobody", "pw-nobody"))
	login := saslLogin(t, brokers)
	line := `{"event_id":"req-1","customer_id":"acme","meter":"api_calls","quantity":1,"event_time":"` +
		time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano) + `"}` + "\n"
	for _, user := range []string{"reader", "nobody"} {
		t.Run(user, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var out, errb bytes.Buffer
			code := Main(ctx, append([]string{"produce"}, login(user)...),
				IO{Stdin: strings.NewReader(line), Stdout: &out, Stderr: &errb})
			if code != 1 {
				t.Fatalf("exit %d, want 1\n%s%s", code, out.String(), errb.String())
			}
			for _, want := range []string{"line 1:", "AUTHORIZATION_FAILED", "Write on topic usage.events", "Security and ACLs"} {
				if !strings.Contains(errb.String(), want) {
					t.Errorf("error does not say %q:\n%s", want, errb.String())
				}
			}
		})
	}
}
