package topics

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
)

// TestPartitionCountsNamesTopicsNotAuthorized: a principal that may not
// describe some of the topics a stage reads or writes (Read and Write
// imply Describe) gets an error that names those topics, and only those,
// instead of the broker's TOPIC_AUTHORIZATION_FAILED alone: the stage's
// ACLs are missing one, and the operator must know which.
func TestPartitionCountsNamesTopicsNotAuthorized(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.SeedTopics(2, "usage.events", "usage.deduped.v2", "usage.duplicates"),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "dedup", "pw-dedup",
			kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "usage.events",
				Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationRead, Allow: true}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	conn := func(user string) kafka.Config {
		return kafka.Config{Brokers: c.ListenAddrs(),
			SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: user, Password: secret.New("pw-" + user)}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	_, err = PartitionCounts(ctx, conn("dedup"), "usage.events", "usage.deduped.v2", "usage.duplicates")
	if err == nil {
		t.Fatal("PartitionCounts: no error for topics the principal may not describe")
	}
	msg := err.Error()
	for _, want := range []string{"usage.deduped.v2", "usage.duplicates", "User:dedup", "Security and ACLs"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not name %q", msg, want)
		}
	}
	if strings.Contains(msg, "usage.events") {
		t.Errorf("error %q names usage.events, which the principal may describe", msg)
	}

	n, err := PartitionCounts(ctx, conn("admin"), "usage.events", "usage.deduped.v2")
	if err != nil {
		t.Fatal(err)
	}
	if n["usage.events"] != 2 || n["usage.deduped.v2"] != 2 {
		t.Errorf("partition counts %v, want 2 each", n)
	}
	_, err = PartitionCounts(ctx, conn("admin"), "usage.events", "usage.nonesuch")
	if err == nil || !strings.Contains(err.Error(), "topic usage.nonesuch is missing") {
		t.Errorf("a missing topic: error %v, want one naming it missing", err)
	}
}

// TestMayWrite: on brokers without an authorizer every topic may be
// written; with ACLs, a principal that may read a topic but not write it
// is refused, named with the topic; a missing topic passes.
func TestMayWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := fakeCluster(t)
	if _, err := adminOf(t, open).CreateTopics(ctx, 1, 1, nil, "usage.events"); err != nil {
		t.Fatal(err)
	}
	if err := MayWrite(ctx, kafka.Config{Brokers: open.ListenAddrs()}, "usage.events", "usage.nonesuch"); err != nil {
		t.Errorf("no authorizer: %v", err)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.SeedTopics(1, "usage.events", "usage.rejected"),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "sink", "pw-sink",
			kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "usage.rejected",
				Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationRead, Allow: true},
			kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "usage.events",
				Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationWrite, Allow: true}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	sink := kafka.Config{Brokers: c.ListenAddrs(), SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: "sink", Password: secret.New("pw-sink")}}
	err = MayWrite(ctx, sink, "usage.events", "usage.rejected")
	if err == nil || !strings.Contains(err.Error(), "User:sink may not write usage.rejected") || strings.Contains(err.Error(), "usage.events") {
		t.Errorf("Read without Write: %v, want usage.rejected refused, and only it", err)
	}
}
