package ingest

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
)

// TestProducerLoginRefusedStopsIngest: an ingest whose password the
// brokers refuse on its producer's connection stops with an
// authentication error, as when the keys topic's reader is refused,
// instead of answering every request 503 for ever. The producer and the
// reader of the keys topic are clients of their own, on connections of
// their own: a broker the producer connects to anew (a partition leader
// that restarted, a connection the broker closed as idle) asks for the
// password again, while the reader's connections, to other brokers or
// kept busy, may never be asked (docs/operations.md, Security and ACLs).
// kfake stands in for that: once the password "changed" (after the
// reader connected, before the producer's first produce connection) it
// answers every new login SASL_AUTHENTICATION_FAILED, as a broker does.
// The refused records themselves only time out.
func TestProducerLoginRefusedStopsIngest(t *testing.T) {
	const events, keys, balances = "usage.events", "meterline.keys", "usage.balances"
	acl := func(topic string, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: topic, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	cluster, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.SeedTopics(4, events), kfake.SeedTopics(1, keys, balances),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "ingest", "pw-ingest", acl(events, kmsg.ACLOperationWrite), acl(keys, kmsg.ACLOperationRead),
			acl(balances, kmsg.ACLOperationRead)))
	as := func(user, pw string) kafka.Config {
		return kafka.Config{Brokers: brokers, SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: user, Password: secret.New(pw)}}
	}
	_, token := adminWithKey(t, as("admin", "pw-admin"), keys)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := Config{Addr: "127.0.0.1:0", Kafka: as("ingest", "pw-ingest"), Meters: mustCatalog(t), ProduceTimeout: 2 * time.Second,
		MaxAge: -1, Logger: zaptest.NewLogger(t)}
	e := &env{t: t, brokers: brokers, topic: events, keys: keys, balances: balances, token: token}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	waitReady(t, srv)

	testenv.RefuseLogins(cluster)
	body := mustJSON(t, prompt(t, "l-1", "acme-1", map[string]any{"tokens": map[string]any{"input": 1}, "model": "m1", "user": "u1"}))
	if status, _, b := e.post("/api/v1/events", "application/cloudevents+json", token, body); status != http.StatusServiceUnavailable {
		t.Fatalf("with the password refused: %d %s; want 503", status, b)
	}
	select {
	case err := <-done:
		if !errors.Is(err, kafka.ErrAuthentication) || !strings.Contains(err.Error(), "read at start") || !strings.Contains(err.Error(), `"ingest"`) {
			t.Fatalf("Run ended with %v; want an authentication error naming the user and saying the password is read at start", err)
		}
	case <-time.After(15 * time.Second):
		cancel()
		<-done
		t.Fatal("the ingest went on serving with a password the brokers refuse its producer")
	}
}
