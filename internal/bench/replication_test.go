package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestDedupReplicationFactors runs bench dedup with two replication
// factors on a kfake cluster of three brokers: each round measures dedup
// once per factor, on topics created with it, and the report compares
// them in the same rounds.
func TestDedupReplicationFactors(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.NumBrokers(3))
	var out, progress testenv.SyncBuffer
	env := &Env{Kafka: kafka.Config{Brokers: brokers}, Out: &out, Progress: &progress}
	cfg := DedupConfig{Events: 400, DuplicateRate: 0.1, ReplicationFactors: []int16{3, 1}, StageConfig: smallStage(t.TempDir())}
	cfg.Rounds = 2
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := Dedup(ctx, env, cfg); err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	for _, want := range []string{
		"round 1 dedup, replication factor 3:", "round 1 dedup, replication factor 1:",
		"round 2 dedup, replication factor 3:", "round 2 dedup, replication factor 1:",
	} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}
	if !strings.Contains(out.String(), "of dedup, replication factor 3 in the same rounds") {
		t.Errorf("report does not compare the factors:\n%s", out.String())
	}
	bad := DedupConfig{Events: 1, ReplicationFactors: []int16{0, 3, 3}, StageConfig: smallStage("")}
	bad.Rounds = 1
	err := bad.Validate()
	if err == nil || !strings.Contains(err.Error(), "at least 1 (got 0)") || !strings.Contains(err.Error(), "3 given twice") {
		t.Errorf("Validate = %v", err)
	}
}
