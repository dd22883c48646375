// Package clustertest is the real-cluster suite (docs/operations.md,
// Replication): the whole pipeline (2 instances each of `meterline dedup`,
// `aggregate` and `sink`, the real binary as child processes) on a cluster
// of three brokers with replication factor 3 and min.insync.replicas 2,
// under a generator of usage with copies, conflicts, misrouted records,
// late events and bad records, while brokers are killed, paused and
// restarted, every broker at once too, and stage instances are killed, or
// come and go in a rebalance storm; and a stage is not ready while its
// transaction coordinator's broker is paused (readytxn_test.go). Afterwards every output reconciles exactly with the generator's
// truth, read back from what the brokers stamped: ClickHouse's plain
// count() and sums, FINAL plus adjustments, duplicates and rejections. The
// aggregators decide entitlements: caps and a credit grant that the load
// exhausts, reconciled per customer, meter and period with the refusals
// and the balances (entitlements_test.go).
//
// It needs the cluster (METERLINE_TEST_KAFKA_CLUSTER, started with
// KAFKA_CLUSTER=3 deploy/local/kafka.sh start) and ClickHouse
// (METERLINE_TEST_CLICKHOUSE); `make test` runs the short version and
// `make chaos` the long one (METERLINE_TEST_CHAOS=long).
package clustertest

import (
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestMain removes the meterline binary that the tests run as child
// processes.
func TestMain(m *testing.M) { testenv.Main(m) }
