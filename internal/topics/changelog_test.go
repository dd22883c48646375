package topics

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/kafka"
)

// TestCheckChangelogKeeps: a changelog whose cleanup policy deletes records
// before a restore may need them refuses the stage's start, naming the
// topic, its settings and the fix; compaction alone, an infinite
// retention or a long enough one pass; a changelog the brokers do not
// describe is a warning.
func TestCheckChangelogKeeps(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn := kafka.Config{Brokers: c.ListenAddrs()}
	const need = 10 * time.Hour
	for _, tc := range []struct {
		name      string
		policy    string
		retention string
		need      time.Duration
		refused   bool
	}{
		{"compact", "compact", "1000", need, false},
		{"compact-delete-long", "compact,delete", "36000000", need, false},
		{"compact-delete-short", "compact,delete", "35999999", need, true},
		{"delete-short", "delete", "60000", need, true},
		{"delete-infinite", "delete", "-1", need, false},
		{"for-ever-compact", "compact", "60000", 0, false},
		{"for-ever-compact-delete", "compact,delete", "604800000", 0, true},
		{"for-ever-infinite", "compact,delete", "-1", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topic := "cl-" + tc.name
			policy, retention := tc.policy, tc.retention
			if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": &policy, "retention.ms": &retention}, topic); err != nil {
				t.Fatal(err)
			}
			err := CheckChangelogKeeps(ctx, conn, "dedup", zap.NewNop(), topic, tc.need)
			if !tc.refused {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ce *ChangelogRetentionError
			if !errors.As(err, &ce) || ce.Topic != topic || ce.Need != tc.need {
				t.Fatalf("error %v, want a *ChangelogRetentionError naming %s", err, topic)
			}
			for _, want := range []string{topic, "cleanup.policy=" + tc.policy, "retention.ms=" + tc.retention, "kafka-configs.sh", "meterline topics check"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}

	core, logs := observer.New(zap.WarnLevel)
	if err := CheckChangelogKeeps(ctx, conn, "dedup", zap.New(core), "cl-nonesuch", need); err != nil {
		t.Fatalf("a changelog the brokers do not describe: %v, want a warning", err)
	}
	if logs.FilterField(zap.String("changelog", "cl-nonesuch")).Len() != 1 {
		t.Errorf("warnings %v, want one naming the changelog", logs.All())
	}
}
