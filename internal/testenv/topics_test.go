package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/meterline/meterline/internal/topics"
)

// TestTopics: every topic of docs/design.md, Topics, under the test's own
// prefix, with the partitions asked for (usage.events and its changelog
// with Sources), the production cleanup policies, every record kept; the
// topics and the groups under the prefix deleted when the test ends, other
// groups left.
func TestTopics(t *testing.T) {
	_, brokers := KFake(t)
	adm := Admin(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	commit := func(group string) {
		t.Helper()
		var o kadm.Offsets
		o.AddOffset("other", 0, 1, -1)
		if err := adm.CommitAllOffsets(ctx, group, o); err != nil {
			t.Fatal(err)
		}
	}
	CreateTopic(t, brokers, "other", 1, nil)
	var names topics.Names
	t.Run("make", func(t *testing.T) {
		names = Topics(t, brokers, "x", TopicsOpts{Partitions: 3, Sources: 2, EventsTimestamp: "CreateTime"})
		if !strings.HasSuffix(names.Prefix, "-x.") {
			t.Errorf("prefix %q", names.Prefix)
		}
		specs := topics.Specs(names, topics.DefaultLayout())
		var ns []string
		for _, sp := range specs {
			ns = append(ns, sp.Name)
		}
		details, err := adm.ListTopics(ctx, ns...)
		if err != nil {
			t.Fatal(err)
		}
		cfgs, err := adm.DescribeTopicConfigs(ctx, ns...)
		if err != nil {
			t.Fatal(err)
		}
		for _, sp := range specs {
			want := sp.Partitions // a topic of fixed partitions (the keys topic)
			switch {
			case sp.Name == names.EventsTopic() || sp.Name == names.DedupChangelogTopic():
				want = 2
			case sp.Partitions == topics.DefaultLayout().Partitions:
				want = 3
			}
			if got := len(details[sp.Name].Partitions); int32(got) != want {
				t.Errorf("%s: %d partitions, want %d", sp.Name, got, want)
			}
			rc, err := cfgs.On(sp.Name, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, c := range rc.Configs {
				got[c.Key] = c.MaybeValue()
			}
			if got["cleanup.policy"] != sp.Configs["cleanup.policy"] {
				t.Errorf("%s: cleanup.policy %q, want %q", sp.Name, got["cleanup.policy"], sp.Configs["cleanup.policy"])
			}
			if sp.Name == names.EventsTopic() && got["message.timestamp.type"] != "CreateTime" {
				t.Errorf("%s: message.timestamp.type %q, want CreateTime", sp.Name, got["message.timestamp.type"])
			}
			if strings.Contains(sp.Configs["cleanup.policy"], "delete") && got["retention.ms"] != "-1" {
				t.Errorf("%s: retention.ms %q, want -1", sp.Name, got["retention.ms"])
			}
			if (sp.Name == names.EntitlementsTopic() || sp.Name == names.BalancesTopic()) && got["min.compaction.lag.ms"] != "9223372036854775807" {
				t.Errorf("%s: min.compaction.lag.ms %q, want the largest (records of CreateTime months in the past)", sp.Name, got["min.compaction.lag.ms"])
			}
		}
		commit(names.Prefix + "dedup")
		commit("not-ours")
	})
	left, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range left.Names() {
		if strings.HasPrefix(n, names.Prefix) {
			t.Errorf("topic %s left after the test", n)
		}
	}
	gs, err := adm.ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(gs.Groups(), " "); got != "not-ours" {
		t.Errorf("groups after the test: %q, want only not-ours", got)
	}
}
