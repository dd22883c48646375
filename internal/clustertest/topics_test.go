package clustertest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// TestRealClusterTopics: on three brokers, `meterline topics create`
// chooses replication factor 3 and min.insync.replicas 2 by itself and
// every partition gets three replicas; topics created with another factor
// or min.insync.replicas (as asked) are reported by `topics check` with the
// defaults, and a min.insync.replicas above the replication factor is
// refused. (TestRealClusterBrokerFailures checks the report of
// under-replicated partitions, with a broker down.)
func TestRealClusterTopics(t *testing.T) {
	cluster := testenv.RealCluster(t)
	bin := testenv.Meterline(t)
	brokers := strings.Join(cluster.Brokers, ",")
	adm := testenv.Admin(t, cluster.Brokers)
	var made []string
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, made...)
	})
	create := func(prefix string, extra ...string) (int, string) {
		names := topics.DefaultNames()
		names.Prefix = prefix
		for _, sp := range topics.Specs(names, topics.DefaultLayout()) {
			made = append(made, sp.Name)
		}
		return meterline(t, bin, append([]string{"topics", "create", "--brokers", brokers, "--topic-prefix", prefix, "--partitions", "3"}, extra...)...)
	}
	check := func(prefix string) (int, string) {
		return meterline(t, bin, "topics", "check", "--brokers", brokers, "--topic-prefix", prefix, "--partitions", "3")
	}

	good := testenv.Name(t, "rf") + "."
	if code, out := create(good); code != 0 || !strings.Contains(out, "3 brokers: replication factor 3, min.insync.replicas 2") {
		t.Fatalf("topics create: exit %d\n%s", code, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	td, err := adm.ListTopics(ctx, good+"usage.events", good+topics.DefaultNames().DedupChangelog)
	if err != nil {
		t.Fatal(err)
	}
	td.EachPartition(func(p kadm.PartitionDetail) {
		if len(p.Replicas) != 3 {
			t.Errorf("%s/%d has replicas %v, want 3", p.Topic, p.Partition, p.Replicas)
		}
	})
	rcs, err := adm.DescribeTopicConfigs(ctx, good+"usage.events")
	if err != nil {
		t.Fatal(err)
	}
	if c, err := rcs.On(good+"usage.events", nil); err != nil || configValue(c, "min.insync.replicas") != "2" {
		t.Errorf("min.insync.replicas of %susage.events = %q (%v), want 2", good, configValue(c, "min.insync.replicas"), err)
	}
	if code, out := check(good); code != 0 {
		t.Errorf("topics check after create: exit %d\n%s", code, out)
	}

	// Topics made with one replica (as a single-broker setup would) and
	// with min.insync.replicas 3 are drift on this cluster.
	weak := testenv.Name(t, "rf1") + "."
	if code, out := create(weak, "--replication-factor", "1"); code != 0 || !strings.Contains(out, "replication factor 1, min.insync.replicas 1") {
		t.Fatalf("topics create --replication-factor 1: exit %d\n%s", code, out)
	}
	n := len(topics.Specs(topics.DefaultNames(), topics.DefaultLayout()))
	code, out := check(weak)
	if code != 1 || strings.Count(out, "replication factor is 1, want 3") != n || strings.Count(out, "min.insync.replicas is 1, want 2") != n {
		t.Errorf("topics check of topics with one replica: exit %d, want %d replication factor and %d min.insync.replicas drifts\n%s", code, n, n, out)
	}
	strict := testenv.Name(t, "isr3") + "."
	if code, out := create(strict, "--min-insync-replicas", "3"); code != 0 {
		t.Fatalf("topics create --min-insync-replicas 3: exit %d\n%s", code, out)
	}
	if code, out := check(strict); code != 1 || strings.Count(out, "min.insync.replicas is 3, want 2") != n {
		t.Errorf("topics check of topics with min.insync.replicas 3: exit %d\n%s", code, out)
	}
	if code, out := meterline(t, bin, "topics", "create", "--brokers", brokers, "--topic-prefix", strict,
		"--replication-factor", "2", "--min-insync-replicas", "3"); code != 2 || !strings.Contains(out, "exceeds the replication factor 2") {
		t.Errorf("min.insync.replicas above the replication factor: exit %d\n%s", code, out)
	}
}

func configValue(c kadm.ResourceConfig, key string) string {
	for _, kv := range c.Configs {
		if kv.Key == key && kv.Value != nil {
			return *kv.Value
		}
	}
	return ""
}

// TestRealClusterTopicsBrokerDown: with one broker of three killed, the
// cluster still has three brokers. `topics check` keeps choosing
// replication factor 3 and min.insync.replicas 2, so it reports the
// under-replicated partitions and no replication drift of topics made
// right, and `topics create` makes no topic with fewer replicas (Kafka
// places a replica on the broker that is down; it joins the ISR when the
// broker returns).
func TestRealClusterTopicsBrokerDown(t *testing.T) {
	cluster := testenv.RealCluster(t)
	bin := testenv.Meterline(t)
	brokers := strings.Join(cluster.Brokers, ",")
	adm := testenv.Admin(t, cluster.Brokers)
	good := testenv.Name(t, "down") + "."
	late := testenv.Name(t, "late") + "."
	var made []string
	for _, prefix := range []string{good, late} {
		names := topics.DefaultNames()
		names.Prefix = prefix
		for _, sp := range topics.Specs(names, topics.DefaultLayout()) {
			made = append(made, sp.Name)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, made...)
	})
	if code, out := meterline(t, bin, "topics", "create", "--brokers", brokers, "--topic-prefix", good, "--partitions", "3"); code != 0 {
		t.Fatalf("topics create: exit %d\n%s", code, out)
	}
	cluster.WaitHealthy(t, healthyTimeout)

	down := int32(len(cluster.Brokers))
	cluster.Kill(t, down)
	// The controller fences the broker and takes it out of the ISRs once
	// its session (9 s) expires.
	var code int
	var out string
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Second) {
		code, out = meterline(t, bin, "topics", "check", "--brokers", brokers, "--topic-prefix", good, "--partitions", "3")
		if code == 1 && strings.Contains(out, "under-replicated partitions is ") && strings.Contains(out, " down: broker ") {
			break
		}
	}
	if code != 1 || !strings.Contains(out, "under-replicated partitions is ") {
		t.Errorf("topics check with broker %d down: exit %d, want 1 and under-replicated partitions\n%s", down, code, out)
	}
	if !strings.Contains(out, "3 brokers (1 down: broker "+fmt.Sprint(down)+"): replication factor 3, min.insync.replicas 2") {
		t.Errorf("topics check with broker %d down: want the three brokers, the one down named, and replication factor 3\n%s", down, out)
	}
	if strings.Contains(out, "replication factor is 3, want") || strings.Contains(out, "min.insync.replicas is 2, want") {
		t.Errorf("topics check with broker %d down reports topics made with replication factor 3 as drift\n%s", down, out)
	}

	// A topic created with fewer replicas now would keep them for good.
	code, out = meterline(t, bin, "topics", "create", "--brokers", brokers, "--topic-prefix", late, "--partitions", "3")
	t.Logf("topics create with broker %d down: exit %d\n%s", down, code, out)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	td, err := adm.ListTopics(ctx, late+"usage.events")
	if err != nil {
		t.Error(err) // not Fatal: the broker is started again below
	}
	td.EachPartition(func(p kadm.PartitionDetail) {
		if len(p.Replicas) < 3 {
			t.Errorf("topics create with broker %d down made %s/%d with replicas %v (exit %d)\n%s", down, p.Topic, p.Partition, p.Replicas, code, out)
		}
	})
	if code != 1 || !strings.Contains(out, "cluster  3 brokers (1 down: broker "+fmt.Sprint(down)+"): replication factor 3") {
		t.Errorf("topics create with broker %d down: exit %d, want 1 (its partitions under-replicated) and replication factor 3\n%s", down, code, out)
	}

	cluster.Start(t, down)
	cluster.WaitHealthy(t, healthyTimeout)
}
