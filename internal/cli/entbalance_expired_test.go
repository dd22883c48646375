package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsBalanceExpiredGrant: a balance lists the grants that had
// not expired when it was written; one that expired since pays now only
// for late events (their event_time before its expiry), and `balance`
// says so on stderr rather than let its remaining credits read as
// spendable (support asked why an event was refused no_credit), nor as
// spent for good (a late event still draws from it).
func TestEntitlementsBalanceExpiredGrant(t *testing.T) {
	_, brokers := testenv.KFake(t)
	names := testenv.Topics(t, brokers, "balexp", testenv.TopicsOpts{})
	now := time.Now()
	key := schemas.CustomerKey("acme")
	b := &schemas.Balance{CustomerID: "acme", Plan: "free", Revision: 1, UpdatedAt: now.Add(-48 * time.Hour).UnixMilli(),
		PeriodStart: now.Add(-72 * time.Hour).UnixMilli(), PeriodEnd: now.Add(72 * time.Hour).UnixMilli(),
		Grants: []schemas.GrantBalance{
			{ID: "promo", Amount: 1000, Remaining: 700, ExpiresAt: now.Add(-24 * time.Hour).UnixMilli()},
			{ID: "annual", Amount: 5000, Remaining: 5000, ExpiresAt: now.Add(24 * time.Hour).UnixMilli()},
		},
		OverdraftPolicy: schemas.OverdraftDeny}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: names.BalancesTopic(), Key: key, Value: schemas.MustEncode(b)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "", "entitlements", "balance", "acme", "--brokers", strings.Join(brokers, ","), "--topic-prefix", names.Prefix)
	if code != 0 || !strings.Contains(out, "credits_remaining: 5700") {
		t.Fatalf("balance: %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "grant promo expired at ") || !strings.Contains(errOut, "700 of credits_remaining") || strings.Contains(errOut, "annual") {
		t.Errorf("stderr does not say that promo (only) expired since the balance:\n%s", errOut)
	}
	if strings.Contains(errOut, "pays for nothing") || !strings.Contains(errOut, "late events") {
		t.Errorf("stderr does not say that promo still pays for late events, whose event_time is before its expiry:\n%s", errOut)
	}
}
