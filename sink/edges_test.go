package sink

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestDateTimeOutOfRange: a time outside ClickHouse's DateTime (seconds
// in [1970-01-01, 2106-02-07 06:28:15], an unsigned 32-bit number) is
// written at the nearest end of that range, never wrapped around to
// another date; its _ms column keeps it exactly. A grant that expires in
// 2200 is valid entitlements (expires_at is any later instant), and the
// driver turned it into 2063 without an error.
func TestDateTimeOutOfRange(t *testing.T) {
	e := newEnv(t, 1)
	far := time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	before := int64(-86_400_000) // 1969-12-31
	b := &schemas.Balance{CustomerID: "acme", Plan: "pro", Revision: 1, UpdatedAt: base.UnixMilli(),
		PeriodStart: base.UnixMilli(), PeriodEnd: base.Add(time.Hour).UnixMilli(), OverdraftPolicy: schemas.OverdraftDeny,
		Grants: []schemas.GrantBalance{{ID: "forever", Amount: 10, Remaining: 10, ExpiresAt: far}}}
	ev := &schemas.DedupedEvent{EventID: "e1", CustomerID: "acme", Meter: "api_calls", Quantity: 1,
		EventTime: before, IngestTime: far}
	e.produce(
		&kgo.Record{Topic: e.names.BalancesTopic(), Value: schemas.MustEncode(b), Timestamp: base},
		&kgo.Record{Topic: e.names.DedupedTopic(), Value: schemas.MustEncode(ev), Timestamp: base})
	r := e.start(nil)
	e.waitCaughtUp(time.Minute, e.names.BalancesTopic(), e.names.DedupedTopic())
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableBalances, 1)
	e.exact(TableEvents, 1)
	last := fmt.Sprint(uint32(math.MaxUint32))
	got := render(queryStrings(t, e.conn, "SELECT toUInt32(grant_expires_at[1]), grant_expires_at_ms[1] FROM "+e.db+"."+TableBalances))
	if want := last + " | " + fmt.Sprint(far) + "\n"; got != want {
		t.Errorf("usage_balances grant expiring in 2200: got %q, want %q", got, want)
	}
	got = render(queryStrings(t, e.conn, "SELECT toUInt32(event_time), event_time_ms, toUInt32(ingest_time), ingest_time_ms FROM "+e.db+"."+TableEvents))
	if want := fmt.Sprintf("0 | %d | %s | %d\n", before, last, far); got != want {
		t.Errorf("usage_events event of 1969 ingested in 2200: got %q, want %q", got, want)
	}
}
