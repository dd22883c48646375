package sink

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/schemas"
)

// newClientHook captures the sink's Kafka client.
type newClientHook struct{ cl atomic.Pointer[kgo.Client] }

func (h *newClientHook) OnNewClient(c *kgo.Client) { h.cl.Store(c) }

// monthEndBurst returns, per customer, a FINAL aggregate of the month
// (eight group values) and the balance of the next period, spread over
// the env's partitions: what a month end writes at once.
func (e *env) monthEndBurst(customers int) []*kgo.Record {
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	end := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	ts := time.Date(2026, 12, 1, 0, 5, 0, 0, time.UTC)
	recs := make([]*kgo.Record, 0, 2*customers)
	for i := range customers {
		cust := fmt.Sprintf("customer-%07d", i)
		p := int32(i) % e.parts
		var group []schemas.Property
		for g := range 8 {
			group = append(group, schemas.Property{Name: "dim" + strconv.Itoa(g), Value: strconv.FormatUint(rand.Uint64(), 36)})
		}
		a := &schemas.Aggregate{CustomerID: cust, Meter: "api_calls", Group: group, Aggregation: "SUM", PeriodStart: start, PeriodEnd: end,
			Revision: 5, Status: schemas.StatusFinal, Value: int64(i % 1000), EventCount: 7, UpdatedAt: end}
		b := &schemas.Balance{CustomerID: cust, Plan: "pro", Revision: 9, UpdatedAt: end, PeriodStart: end, PeriodEnd: end + 31*86400000,
			Meters:          []schemas.MeterBalance{{Meter: "api_calls", Limit: 1000, OnLimit: schemas.OnLimitReject}},
			Grants:          []schemas.GrantBalance{{ID: "g1", Amount: 100, Remaining: 100}},
			OverdraftPolicy: schemas.OverdraftDeny}
		recs = append(recs,
			&kgo.Record{Topic: e.names.AggregatesTopic(), Partition: p, Key: []byte(cust), Value: schemas.MustEncode(a), Timestamp: ts},
			&kgo.Record{Topic: e.names.BalancesTopic(), Partition: p, Key: []byte(cust), Value: schemas.MustEncode(b), Timestamp: ts})
	}
	return recs
}

// TestFetchBoundedByBatch: during a month-end burst (100,000 FINAL
// aggregates and balances on 2 × 16 partitions), the records the Kafka
// client holds fetched ahead of the sink's batches stay under one batch
// (MaxBatchBytes, 4 MiB here), and every row is written once.
func TestFetchBoundedByBatch(t *testing.T) {
	waitsMostly(t)
	const customers, batchBytes = 100_000, 4 << 20
	e := newEnv(t, 16)
	e.produce(e.monthEndBurst(customers)...)
	hook := &newClientHook{}
	r := e.start(func(c *Config) {
		c.Logger = zap.NewNop()
		c.MaxBatchBytes = batchBytes
		c.ClientOptions = append(c.ClientOptions, kgo.WithHooks(hook))
	})
	stop, peak := make(chan struct{}), make(chan int64)
	go func() {
		var most int64
		for {
			select {
			case <-stop:
				peak <- most
				return
			case <-time.After(10 * time.Millisecond):
			}
			if c := hook.cl.Load(); c != nil {
				most = max(most, c.BufferedFetchBytes())
			}
		}
	}()
	e.waitCaughtUp(5*time.Minute, e.names.AggregatesTopic(), e.names.BalancesTopic())
	close(stop)
	most := <-peak
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("most bytes buffered by the Kafka client: %d KiB (batch: %d KiB)", most>>10, batchBytes>>10)
	if most > batchBytes {
		t.Errorf("the Kafka client held %d KiB of records fetched ahead, more than a batch (%d KiB)", most>>10, batchBytes>>10)
	}
	e.exact(TableAggregates, customers)
	e.exact(TableBalances, customers)
}
