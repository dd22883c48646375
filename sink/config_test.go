package sink

import (
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/topics"
)

// TestValidateNamesEveryInputTopic: an input topic whose name is empty
// (only the prefix) is refused, for each of the six topics the sink
// consumes, and named by its flag.
func TestValidateNamesEveryInputTopic(t *testing.T) {
	cfg := Config{Config: session.Config{Kafka: kafka.Config{Brokers: []string{"b:9092"}}, InstanceID: "i"},
		ClickHouse: "c:9000", Topics: topics.Names{Prefix: "p."}}
	cfg.EnsureDefaults()
	err := cfg.Validate()
	if err == nil {
		t.Fatal("no error for empty topic names")
	}
	for _, flag := range []string{"deduped", "aggregates", "adjustments", "duplicates", "rejected", "balances"} {
		if want := "sink: topic-" + flag + ": empty topic name"; !strings.Contains(err.Error(), want) {
			t.Errorf("Validate does not say %q:\n%v", want, err)
		}
	}
	cfg.Topics = topics.DefaultNames()
	if err := cfg.Validate(); err != nil {
		t.Errorf("default topics: %v", err)
	}
}
