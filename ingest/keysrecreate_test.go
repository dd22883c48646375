package ingest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/testenv"
)

// TestKeysTopicRecreated: the keys topic deleted and made again (its
// partition back at offset 0). A running replica drops the keys it read
// from the old topic and reads the new one from its start, as a replica
// that starts then does: a key of the old topic is refused, a key made in
// the new one accepted. It logs an error naming the topic and counts it
// (meterline_ingest_keys_topic_restarts_total), so replicas never
// silently disagree.
func TestKeysTopicRecreated(t *testing.T) {
	core, logs := observer.New(zapcore.ErrorLevel)
	e := newEnv(t, func(c *Config) { c.NoGate = true; c.AuthMaxAge = 2 * time.Second; c.Logger = zap.New(core) })
	ctx := context.Background()
	keys := e.srv.Keys()
	if k, _ := keys.Authenticate(e.token); k == nil {
		t.Fatal("the key of the first topic is refused before the topic is made again")
	}
	adm := testenv.Admin(t, e.brokers)
	if _, err := adm.DeleteTopics(ctx, e.keys); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	compact := "compact"
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": &compact}, e.keys); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	_, token, err := NewAdmin(cl, e.keys).CreateKey(ctx, KeySpec{Tenant: "acme", Customers: []string{"acme-*"}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		oldKey, _ := keys.Authenticate(e.token)
		newKey, _ := keys.Authenticate(token)
		if oldKey == nil && newKey != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the keys topic was made again: key of the old topic accepted %v, key of the new one accepted %v; want refused, accepted",
				oldKey != nil, newKey != nil)
		}
		time.Sleep(50 * time.Millisecond)
	}
	keys.mu.RLock()
	n := keys.restarts
	keys.mu.RUnlock()
	if n != 1 {
		t.Errorf("restarts %d, want 1", n)
	}
	if logs.FilterMessageSnippet("keys topic").FilterField(zap.String("topic", e.keys)).Len() == 0 {
		t.Errorf("no error logged naming the topic: %v", logs.All())
	}
}
