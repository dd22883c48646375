package ingest

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
)

// TestWriteRevokedIsNamed: an ingest whose Write on the events topic is
// taken away while it runs answers 503 not-authorized, saying that Kafka
// refused the events (not that some may have been written) without naming
// a broker or a principal; it logs the topic and the ACL, counts the
// refusal apart, and serves again once the ACL is granted again
// (docs/ingest.md, Answers; docs/operations.md, Security and ACLs).
//
// A principal that never had Write (Read on the topic only) is refused
// its idempotent producer's ID (CLUSTER_AUTHORIZATION_FAILED), which the
// client keeps for good: Run stops at start, naming the ACL.
func TestWriteRevokedIsNamed(t *testing.T) {
	t.Run("revoked", func(t *testing.T) { testWriteRefused(t, true) })
	t.Run("never granted", func(t *testing.T) { testWriteRefused(t, false) })
}

func testWriteRefused(t *testing.T, revoke bool) {
	const events, keys, balances = "usage.events", "meterline.keys", "usage.balances"
	acl := func(topic string, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: topic, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	first := kmsg.ACLOperationWrite
	if !revoke {
		first = kmsg.ACLOperationRead
	}
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.SeedTopics(4, events), kfake.SeedTopics(1, keys, balances),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "ingest", "pw-ingest", acl(events, first), acl(keys, kmsg.ACLOperationRead),
			acl(balances, kmsg.ACLOperationRead)))
	as := func(user string) kafka.Config {
		return kafka.Config{Brokers: brokers, SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: user, Password: secret.New("pw-" + user)}}
	}
	cl, token := adminWithKey(t, as("admin"), keys)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	core, logs := observer.New(zap.DebugLevel)
	cfg := Config{Addr: "127.0.0.1:0", Kafka: as("ingest"), Meters: mustCatalog(t), ProduceTimeout: 2 * time.Second, MaxAge: -1,
		Logger: zap.New(core)}
	if !revoke {
		srv, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		err = srv.Run(ctx)
		if err == nil || !strings.Contains(err.Error(), "Write on topic "+events) || !strings.Contains(err.Error(), "Security and ACLs") {
			t.Fatalf("Run without Write: %v; want it to stop naming the ACL", err)
		}
		return
	}
	e := &env{t: t, brokers: brokers, topic: events, keys: keys, balances: balances, token: token}
	e.start(cfg)
	body := func(id string) []byte {
		return mustJSON(t, prompt(t, id, "acme-1", map[string]any{"tokens": map[string]any{"input": 1}, "model": "m1", "user": "u1"}))
	}
	write := kadm.NewACLs().Topics(events).ResourcePatternType(kadm.ACLPatternLiteral).Operations(kadm.OpWrite).Allow("User:ingest").AllowHosts()
	adm := kadm.NewClient(cl)
	if status, _, b := e.post("/api/v1/events", "application/cloudevents+json", token, body("w-1")); status != http.StatusNoContent {
		t.Fatalf("with Write: %d %s", status, b)
	}
	if res, err := adm.DeleteACLs(ctx, write); err != nil || len(res) == 0 || len(res[0].Deleted) != 1 {
		t.Fatalf("deleting the Write ACL: %+v %v", res, err)
	}
	status, h, b := e.post("/api/v1/events", "application/cloudevents+json", token, body("w-2"))
	p := problem(t, b)
	if status != http.StatusServiceUnavailable || p.Type != "urn:meterline:problem:not-authorized" || h.Get("Retry-After") == "" {
		t.Fatalf("without Write: %d %s (Retry-After %q); want 503 not-authorized with Retry-After", status, b, h.Get("Retry-After"))
	}
	if strings.Contains(p.Detail, "may have been written") || !strings.Contains(p.Detail, "not authorized") {
		t.Errorf("detail %q: want Kafka's refusal, not an unknown outcome", p.Detail)
	}
	for _, leak := range append([]string{"User:", "ingest:", events}, brokers...) {
		if strings.Contains(string(b), leak) {
			t.Errorf("the answer %s names %q", b, leak)
		}
	}
	warned := logs.FilterMessageSnippet("Kafka refused").All()
	if len(warned) == 0 {
		t.Fatalf("no warning of the refusal; logs: %v", logs.All())
	}
	if line := warned[0]; line.ContextMap()["topic"] != events || !strings.Contains(line.Message, "Write on topic "+events) ||
		!strings.Contains(line.Message, "Security and ACLs") {
		t.Errorf("warning %q %v: want the topic and the ACL named", line.Message, line.ContextMap())
	}
	if v := testutil.ToFloat64(e.srv.metrics.kafkaFailed.WithLabelValues(reasonNotAuthorized)); v != 1 {
		t.Errorf("meterline_ingest_kafka_failed_requests_total{reason=%q} = %v, want 1", reasonNotAuthorized, v)
	}
	if res, err := adm.CreateACLs(ctx, write); err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("granting Write again: %+v %v", res, err)
	}
	for {
		status, _, b = e.post("/api/v1/events", "application/cloudevents+json", token, body("w-3"))
		if status == http.StatusNoContent {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("Write granted again, still %d %s", status, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// adminWithKey returns a client connected as admin, closed when the test
// ends, and the token of a key it made in the keys topic for tenant acme
// (customers acme-*).
func adminWithKey(t *testing.T, admin kafka.Config, keys string) (*kgo.Client, string) {
	t.Helper()
	cl, err := kafka.NewClient(admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, token, err := NewAdmin(cl, keys).CreateKey(ctx, KeySpec{Tenant: "acme", Customers: []string{"acme-*"}})
	if err != nil {
		t.Fatal(err)
	}
	return cl, token
}
