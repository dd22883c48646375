package aggregator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsFreshGrantsRefused: a producer rewrites a customer's
// record scheduled far ahead (each replaces the last, so its versions
// stay within their bound) with 256 fresh grant ids of 1,024 bytes that
// never expire. Each record added a grant generation per grant to the
// customer's account, kept for good: the account, one state value,
// grew past what the changelog takes (MESSAGE_TOO_LARGE) and every
// transaction of the partition failed. The records past
// entitlements.MaxGrantBytes are rejected (invalid) and the partition
// goes on.
func TestEntitlementsFreshGrantsRefused(t *testing.T) {
	h := newEntHarness(t, nil, 1)
	scheduled := func(round int) *schemas.Entitlements {
		e := &schemas.Entitlements{CustomerID: "acme", Plan: "p", EffectiveFrom: 1 << 60,
			Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
		for i := range entitlements.MaxGrants {
			id := fmt.Sprintf("%d-%04d-", round, i)
			e.Grants = append(e.Grants, schemas.Grant{ID: id + strings.Repeat("g", entitlements.MaxNameBytes-len(id)), Amount: 1})
		}
		return e
	}
	t0 := time.Now().Add(-time.Minute).UnixMilli()
	const rounds = 5
	for i := range rounds {
		h.produce(h.entitlement(1, scheduled(i), t0+int64(i)*1000))
	}
	h.produce(h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, t0+rounds*1000)...)
	h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "e1", CustomerID: "acme", Meter: "m", Quantity: 1,
		EventTime: t0 + 1500, IngestTime: t0 + 1500}))
	run := h.start(h.entConfig("a", vfs.NewMem()))
	testenv.WaitCaughtUp(t, h.brokers, h.group, h.names.DedupedTopic(), 45*time.Second)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	rej := readRejected(t, h)
	if len(rej) != rounds-1 {
		t.Fatalf("%d rejected, want the %d records after the first", len(rej), rounds-1)
	}
	for _, r := range rej {
		if r.Reason != schemas.ReasonInvalid || !strings.Contains(r.Detail, "grants kept alive") {
			t.Errorf("rejected %s %q, want invalid for the grants kept alive", r.Reason, r.Detail)
		}
	}
}
