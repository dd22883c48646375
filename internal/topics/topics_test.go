package topics

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestEntitlementsCoPartitioned: usage.entitlements is created with as
// many partitions as usage.deduped, and check reports a count that
// differs (the aggregator reads partition p of both in one transaction).
func TestEntitlementsCoPartitioned(t *testing.T) {
	adm := adminOf(t, fakeCluster(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := DefaultLayout()
	l.Partitions = 3
	specs := Specs(DefaultNames(), l)
	if _, err := Create(ctx, adm, specs, 1); err != nil {
		t.Fatal(err)
	}
	var ent *Spec
	for i := range specs {
		if specs[i].Name == "usage.entitlements" {
			ent = &specs[i]
		}
	}
	if ent == nil || ent.PartitionsOf != "usage.deduped.v2" || ent.Configs["cleanup.policy"] != "compact" ||
		ent.Configs["message.timestamp.type"] != "LogAppendTime" {
		t.Fatalf("usage.entitlements spec: %+v", ent)
	}
	for i := range specs {
		if specs[i].Name == "usage.balances" && specs[i].Configs["message.timestamp.type"] != "LogAppendTime" {
			t.Fatalf("usage.balances spec: %+v (its timestamps date the quota gate's balances: broker time)", specs[i])
		}
		if specs[i].Name == "usage.deduped.v2" && specs[i].Configs["message.timestamp.type"] != "LogAppendTime" {
			t.Fatalf("usage.deduped.v2 spec: %+v (its timestamps bound the times of its records with entitlements: broker time)", specs[i])
		}
	}
	drifts, err := Check(ctx, adm, specs)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range drifts {
		if d.What == "partitions" {
			t.Fatalf("drift right after create: %s", d)
		}
	}
	if _, err := adm.CreatePartitions(ctx, 1, "usage.entitlements"); err != nil {
		t.Fatal(err)
	}
	drifts, err = Check(ctx, adm, specs)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range drifts {
		if d.What == "partitions" {
			got = append(got, d.String())
		}
	}
	want := "usage.entitlements: partitions is 4, want 3 (co-partitioned with usage.deduped.v2)"
	if len(got) != 1 || got[0] != want {
		t.Fatalf("partition drifts %q, want [%q]", got, want)
	}
}

// TestCreateRefusesUnnamedSpec: a spec without a name (a Names literal
// missing a newer topic) is an error at once, not a wait for metadata
// that never shows the topic.
func TestCreateRefusesUnnamedSpec(t *testing.T) {
	n := DefaultNames()
	n.Keys = ""
	_, err := Create(context.Background(), nil, Specs(n, Layout{Partitions: 1}), -1)
	if err == nil || !strings.Contains(err.Error(), "no topic name") {
		t.Fatalf("Create with an unnamed spec: %v, want an error naming it", err)
	}
}

// TestWaitVisibleAsksTheBroker: WaitVisible sees a topic as soon as the
// broker has it, even after the client was told it is missing. kadm's
// metadata answers from the client's cache for MetadataMinAge (5 s by
// default, a minute here), so a topic first seen missing (a broker slow to
// publish a new topic) stayed missing that long: 5 s per topic in a test
// that creates its topics one by one.
func TestWaitVisibleAsksTheBroker(t *testing.T) {
	c := fakeCluster(t)
	adm := adminOf(t, c, kgo.MetadataMinAge(time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The client learns that the topic is missing.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if err := WaitVisible(short, adm, "late"); err == nil {
		t.Fatal("WaitVisible found a topic nobody created")
	}
	if _, err := adminOf(t, c).CreateTopic(ctx, 2, 1, nil, "late"); err != nil {
		t.Fatal(err)
	}
	wait, cancelWait := context.WithTimeout(ctx, 10*time.Second)
	defer cancelWait()
	if err := WaitVisible(wait, adm, "late"); err != nil {
		t.Fatalf("the broker has the topic, but WaitVisible: %v", err)
	}
}

// fakeCluster is a kfake cluster of one broker, closed when the test ends.
func fakeCluster(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// adminOf is an admin client of c, with opts, closed when the test ends.
func adminOf(t *testing.T, c *kfake.Cluster, opts ...kgo.Opt) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// TestDeleteGoneTopic: Delete deletes the topics named, and one already
// gone is no error (a deleted topic is still listed a moment after its
// deletion, and a cleanup that read that list deletes it again).
func TestDeleteGoneTopic(t *testing.T) {
	adm := adminOf(t, fakeCluster(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "here"); err != nil {
		t.Fatal(err)
	}
	if err := Delete(ctx, adm, "here", "gone"); err != nil {
		t.Fatalf("Delete of a topic and of one already gone: %v", err)
	}
	td, err := adm.ListTopics(kadm.WithAuthorizedOps(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if td.Has("here") {
		t.Error("the topic was not deleted")
	}
}

// TestDedupChangelogKeepsBucket: dedup drops a key with its whole
// first-arrival bucket, once its watermark passes the bucket's end + W +
// S, so a key is needed up to W + S + B after its arrival. Create gives
// the dedup changelog that plus the margin, and Check reports a retention
// of W + S + B less a millisecond (W + S, what it once required, among
// them).
func TestDedupChangelogKeepsBucket(t *testing.T) {
	adm := adminOf(t, fakeCluster(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := DefaultLayout()
	l.Partitions = 1
	need := l.Window + l.Skew + l.Bucket
	names := DefaultNames()
	specs := Specs(names, l)
	var cl *Spec
	for i := range specs {
		if specs[i].Name == names.DedupChangelogTopic() {
			cl = &specs[i]
		}
	}
	if cl == nil {
		t.Fatal("no dedup changelog spec")
	}
	if want := strconv.FormatInt((need + l.RetentionMargin).Milliseconds(), 10); cl.Configs["retention.ms"] != want {
		t.Errorf("created with retention.ms %s, want W + S + B + margin = %s", cl.Configs["retention.ms"], want)
	}
	if _, err := Create(ctx, adm, specs, 1); err != nil {
		t.Fatal(err)
	}
	retentionDrift := func() string {
		t.Helper()
		drifts, err := Check(ctx, adm, specs)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range drifts {
			if d.Topic == cl.Name && d.What == "retention.ms" {
				return d.String()
			}
		}
		return ""
	}
	if d := retentionDrift(); d != "" {
		t.Fatalf("drift right after create: %s", d)
	}
	for _, short := range []time.Duration{l.Window + l.Skew, need - time.Millisecond} {
		v := strconv.FormatInt(short.Milliseconds(), 10)
		if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "retention.ms", Value: &v}}, cl.Name); err != nil {
			t.Fatal(err)
		}
		if d := retentionDrift(); !strings.Contains(d, "want at least "+strconv.FormatInt(need.Milliseconds(), 10)) {
			t.Errorf("retention.ms %s (%s): drift %q, want one asking for W + S + B", v, short, d)
		}
	}
	v := strconv.FormatInt(need.Milliseconds(), 10)
	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "retention.ms", Value: &v}}, cl.Name); err != nil {
		t.Fatal(err)
	}
	if d := retentionDrift(); d != "" {
		t.Errorf("retention.ms of exactly W + S + B: %s", d)
	}
}

// TestResolveRefusesZeroTimes: dedup refuses a zero W, S or B, so
// `topics create --skew 0` is refused too instead of creating retentions
// from it.
func TestResolveRefusesZeroTimes(t *testing.T) {
	for _, name := range []string{"window", "skew", "bucket"} {
		l := DefaultLayout()
		switch name {
		case "window":
			l.Window = 0
		case "skew":
			l.Skew = 0
		case "bucket":
			l.Bucket = 0
		}
		if _, err := l.Resolve(1); err == nil || !strings.Contains(err.Error(), "--"+name+" must be positive") {
			t.Errorf("--%s 0: %v, want it refused", name, err)
		}
	}
	if _, err := DefaultLayout().Resolve(1); err != nil {
		t.Errorf("the default layout: %v", err)
	}
}

// TestCheckNamesTheConfigFix: a topic config that drifted (a timestamp
// type, a retention shorter than the window) is reported with the
// kafka-configs.sh command that sets it, since topics create leaves
// existing topics as they are. A deduped topic created without a
// message.timestamp.type has the brokers' default, CreateTime: drift too.
func TestCheckNamesTheConfigFix(t *testing.T) {
	adm := adminOf(t, fakeCluster(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old := DefaultLayout()
	old.Partitions, old.EventsTimestamp, old.Window = 2, "CreateTime", time.Hour
	oldSpecs := Specs(DefaultNames(), old)
	for _, s := range oldSpecs {
		if s.Name == "usage.deduped.v2" {
			delete(s.Configs, "message.timestamp.type")
		}
	}
	if _, err := Create(ctx, adm, oldSpecs, 1); err != nil {
		t.Fatal(err)
	}
	l := DefaultLayout()
	l.Partitions = 2
	specs := Specs(DefaultNames(), l)
	drifts, err := Check(ctx, adm, specs)
	if err != nil {
		t.Fatal(err)
	}
	var events string
	for _, s := range specs {
		if s.Name == "usage.events" {
			events = s.Configs["retention.ms"]
		}
	}
	want := map[string]bool{
		"usage.events: message.timestamp.type is CreateTime, want LogAppendTime (set it: kafka-configs.sh --alter --entity-type topics --entity-name usage.events --add-config message.timestamp.type=LogAppendTime)":         false,
		"usage.deduped.v2: message.timestamp.type is CreateTime, want LogAppendTime (set it: kafka-configs.sh --alter --entity-type topics --entity-name usage.deduped.v2 --add-config message.timestamp.type=LogAppendTime)": false,
		"usage.events: retention.ms is 608400000 (169h0m0s), want at least 3628800000 (42d) (set it: kafka-configs.sh --alter --entity-type topics --entity-name usage.events --add-config retention.ms=" + events + ")":      false,
	}
	for _, d := range drifts {
		if _, ok := want[d.String()]; ok {
			want[d.String()] = true
		}
	}
	for w, seen := range want {
		if !seen {
			t.Errorf("no drift %q in:\n%v", w, drifts)
		}
	}
}
