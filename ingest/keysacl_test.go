package ingest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
)

// TestKeysStopWhenReadIsRevoked: an ingest whose Read on the keys topic is
// taken away while it runs stops with an error naming the topic and the
// ACL, instead of going on with the keys it holds, where a key revoked
// from then on would be accepted for ever (docs/operations.md, ACLs).
func TestKeysStopWhenReadIsRevoked(t *testing.T) {
	const topic = "meterline.keys"
	read := kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: topic, Pattern: kmsg.ACLResourcePatternTypeLiteral,
		Operation: kmsg.ACLOperationRead, Allow: true}
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.SeedTopics(1, topic),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "ingest", "pw-ingest", read))
	as := func(user string) kafka.Config {
		return kafka.Config{Brokers: brokers, SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: user, Password: secret.New("pw-" + user)}}
	}
	cl, err := kafka.NewClient(as("admin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, err := NewAdmin(cl, topic).CreateKey(ctx, KeySpec{Tenant: "acme", Customers: []string{"acme"}}); err != nil {
		t.Fatal(err)
	}
	opts, err := as("ingest").Opts()
	if err != nil {
		t.Fatal(err)
	}
	keys := NewKeys(topic, nil)
	done := make(chan error, 1)
	go func() { done <- keys.Follow(ctx, opts...) }()
	select {
	case <-keys.Loaded():
	case err := <-done:
		t.Fatalf("Follow ended before the keys were loaded: %v", err)
	case <-ctx.Done():
		t.Fatal("keys not loaded")
	}
	b := kadm.NewACLs().Topics(topic).ResourcePatternType(kadm.ACLPatternLiteral).Operations(kadm.OpRead).
		Allow("User:ingest").AllowHosts()
	res, err := kadm.NewClient(cl).DeleteACLs(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res) > 0 && len(res[0].Deleted) == 1; !n {
		t.Fatalf("deleting the Read ACL: %+v", res)
	}
	select {
	case err := <-done:
		if !errors.Is(err, kerr.TopicAuthorizationFailed) || !strings.Contains(err.Error(), topic) || !strings.Contains(err.Error(), "Read") {
			t.Fatalf("Follow ended with %v; want an error naming %s and the Read ACL", err, topic)
		}
	case <-ctx.Done():
		t.Fatal("Follow went on without Read on the keys topic")
	}
}
