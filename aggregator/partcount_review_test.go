package aggregator

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/topics"
)

// TestPartitionAddedWhileRunning: partitions added to usage.deduped and
// usage.entitlements while the aggregator runs reach it at its next
// rebalance (the group sees them at its next metadata refresh), with
// new, empty state that records no counts. The counts it started with
// (the ones it routes entitlements records and checks state by) are then
// wrong: a customer whose events and records move to a new partition
// would get its caps and credits from zero there. Such a partition is
// refused like state built with other counts.
func TestPartitionAddedWhileRunning(t *testing.T) {
	ledger, err := entitlements.New(entitlements.Config{Prefix: []byte{pfxLedger}, Window: 35 * 24 * time.Hour, Period: Month.Bounds})
	if err != nil {
		t.Fatal(err)
	}
	names := topics.DefaultNames()
	for _, tc := range []struct {
		name string
		ent  bool
		p    int32
		want bool // refused
	}{
		{"last partition of the count", true, 3, false},
		{"a partition past the count", true, 4, true},
		{"a partition past the count, entitlements off", false, 6, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := &processor{counts: partitionCountsT{events: 1, deduped: 4, entitlements: 4}}
			pr.cfg.Topics = names
			if tc.ent {
				pr.ledger = ledger
			}
			pt := &partition{pr: pr, p: tc.p}
			err := pt.checkPartitionCounts(mapState{})
			t.Log(err)
			switch {
			case !tc.want && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want && !errors.Is(err, ErrPartitionCountChanged):
				t.Fatalf("checkPartitionCounts = %v, want ErrPartitionCountChanged", err)
			case tc.want && !strings.Contains(err.Error(), names.DedupedTopic()):
				t.Errorf("the error does not name %s", names.DedupedTopic())
			}
		})
	}
}
